"""The peer side of bench/bench_grpo.py: TRL 1.16's GRPOTrainer on one bench setting, in .venv-trl.

Run by bench_grpo.py as `.venv-trl/bin/python bench/grpo_trl_peer.py '<setting JSON>'` with the checkout on
PYTHONPATH (only `stages.domains` is imported: the math prompts and their grader, which need math-verify alone).
Prints one JSON line: the time of every optimizer step (the interval between consecutive `on_step_end`s, so
step k's figure covers its generation, rewards, forward/backward and optimizer step; step 1 has no interval)
and the completion tokens each step sampled.

TRL is configured as the same work as our stage: P prompts x G samples, generation batch = train batch (one
generation per optimizer step, so the old logprobs are the detached current ones, as in ours), no KL (beta=0),
no reference model, HF `generate` (use_vllm=False), our math grader as the only reward, fp32 or bf16 autocast,
and no gradient checkpointing (TRL's default turns it on; our stage's default has it off).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
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


def main() -> None:
    setting = json.loads(sys.argv[1])
    prompts, group, steps = setting["prompts"], setting["group"], setting["warmup"] + setting["steps"]
    torch.set_num_threads(setting["threads"])
    math = get_domain("math")
    pool = math.generate("train", setting["pool"], setting["seed"])

    def math_reward(prompts, completions, item_index, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return math.grade_batch([pool[i] for i in item_index], texts)

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": it.prompt}], "item_index": i}
                                 for i, it in enumerate(pool)])
    tokenizer = AutoTokenizer.from_pretrained(setting["model_dir"])
    if tokenizer.pad_token is None:  # as stages.model.chat_ready: pad with eos (masked out everywhere)
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(setting["model_dir"], dtype=torch.float32)
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="bench-grpo-trl-") as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
            logging_steps=1, max_steps=steps, seed=setting["seed"], learning_rate=setting["lr"],
            per_device_train_batch_size=prompts * group, gradient_accumulation_steps=1,
            num_generations=group, steps_per_generation=1, max_completion_length=setting["tokens"],
            temperature=1.0, top_p=1.0, beta=0.0, use_vllm=False, log_completions=False,
            bf16=setting["dtype"] == "bf16", dataloader_num_workers=0,
            # TRL defaults to True (a second forward in the backward); ours keeps activations unless
            # compute.activation_checkpointing is set, so the same work is without it
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[clock])
        trainer.train()
    step_seconds = [b - a for a, b in zip(clock.ends, clock.ends[1:])]  # steps 2..S
    print(json.dumps({
        "step_seconds": step_seconds[setting["warmup"] - 1:],
        "tokens_sampled": [m * prompts * group for m in clock.mean_lengths][setting["warmup"]:],
        "kept_groups": 1.0,  # TRL backpropagates every group
    }))


if __name__ == "__main__":
    main()
