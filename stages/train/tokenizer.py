"""The tiny model's tokenizer: byte-level BPE with one token per digit and a ChatML template.

It is trained once on the synthetic domains' text (plus a little code and JSON, so later domains compress
too) and committed as `stages/assets/tokenizer/`. Byte-level means any string encodes, so real benchmark text
still round-trips; it is just longer. `python -m cascade.stages.train.tokenizer` rebuilds the assets.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "tokenizer"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EXTRA_CORPUS = """def add(a, b):
    return a + b
assert add(2, 3) == 5
for i in range(10):
    if x is None or not items:
        print(f"{name}: {value}")
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
Answer: (A) (B) (C) (D) The answer is B. true false null [1, 2, 3]
"""


def corpus_lines() -> list[str]:
    from cascade.stages.domains import get_domain

    lines = EXTRA_CORPUS.splitlines() * 50
    for name in ("math", "instruct"):  # the tokenizer was trained before later domains existed; keep it stable
        for item in get_domain(name).generate("train", 2000, seed=12345):
            lines += [item.prompt, item.reference]
    return lines


def train_tokenizer(lines: list[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path = ASSET_DIR) -> PreTrainedTokenizerFast:
    """Always the fast class: AutoTokenizer may pick a model-specific class that re-tokenizes differently."""
    return PreTrainedTokenizerFast.from_pretrained(str(path))


if __name__ == "__main__":
    hf = wrap(train_tokenizer(corpus_lines()))
    hf.save_pretrained(str(ASSET_DIR))
    print(f"wrote {ASSET_DIR} (vocab {len(hf)})")
