"""The peer side of bench/bench_grpo.py: TRL 1.16's GRPOTrainer on one bench setting, in .venv-trl.

Run by bench_grpo.py as `.venv-trl/bin/python bench/grpo_trl_peer.py '<setting JSON>'` with the checkout on
PYTHONPATH (only `stages.domains` is imported: the prompts and their grader, which need math-verify alone).
Prints one JSON line: the time of every optimizer step (the interval between consecutive `on_step_end`s, so
step k's figure covers its generation, rewards, forward/backward and optimizer step; step 1 has no interval)
and the completion tokens each step sampled.

TRL is configured as the same work as our stage (bench_grpo.trl_same_work_kwargs): P prompts x G samples,
generation batch = train batch, beta=0, HF `generate`, our grader as the only reward, no gradient checkpointing.
The pieces bench/learning_trl_peer.py shares (the prompt dataset, the grader as a reward function, the policy
load) are here.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench_grpo import trl_same_work_kwargs  # noqa: E402  (bench/ is the script's own dir; stdlib imports only)
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from cascade.stages.domains import get_domain  # noqa: E402


class StepClock(TrainerCallback):
    """Wall time at the end of every optimizer step, and the mean completion length TRL logs for it."""

    def __init__(self):
        self.ends: list[float] = []
        self.mean_lengths: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.mean_lengths.append(float(logs["completions/mean_length"]))


def prompt_dataset(items) -> Dataset:
    """One row per item, in order: its user message as a conversation (TRL applies the model's chat template with
    the generation prompt, as stages.train.model.prompt_ids does) and its index, which the reward reads."""
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": it.prompt}], "item_index": i} for i, it in enumerate(items)]
    )


def grader_reward(domain, items):
    """The domain's grader as a TRL reward function over prompt_dataset(items)'s rows: the reward our stage uses."""

    def reward(prompts, completions, item_index, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return domain.grade_batch([items[i] for i in item_index], texts)

    return reward


def load_policy(model_dir: str):
    """(model in fp32, tokenizer) from an HF directory, padded with eos where the tokenizer has no pad token, as
    stages.train.model.chat_ready does (padding is masked out everywhere)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer


def lora_config(rank: int):
    """peft's LoraConfig as our stage's `lora: {rank, alpha: 2 x rank}` makes it (every linear layer but the head, no
    dropout); None for rank 0: full fine-tuning."""
    if not rank:
        return None
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def main() -> None:
    setting = json.loads(sys.argv[1])
    prompts, group, steps = setting["prompts"], setting["group"], setting["warmup"] + setting["steps"]
    torch.set_num_threads(setting["threads"])
    math = get_domain("math")
    pool = math.generate("train", setting["pool"], setting["seed"])
    model, tokenizer = load_policy(setting["model_dir"])
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="bench-grpo-trl-") as out:
        config = GRPOConfig(
            output_dir=out,
            **trl_same_work_kwargs(
                prompts, group, setting["tokens"], steps, setting["lr"], setting["seed"], setting["dtype"]
            ),
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=grader_reward(math, pool),
            args=config,
            train_dataset=prompt_dataset(pool),
            processing_class=tokenizer,
            callbacks=[clock],
            peft_config=lora_config(setting.get("lora_rank", 0)),
        )
        trainer.train()
    step_seconds = [b - a for a, b in zip(clock.ends, clock.ends[1:])]  # steps 2..S
    print(
        json.dumps(
            {
                "step_seconds": step_seconds[setting["warmup"] - 1 :],
                "tokens_sampled": [m * prompts * group for m in clock.mean_lengths][setting["warmup"] :],
                "kept_groups": 1.0,  # TRL backpropagates every group
            }
        )
    )


if __name__ == "__main__":
    main()
