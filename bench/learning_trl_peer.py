"""The peer side of bench/bench_learning.py: TRL 1.16's GRPOTrainer trained from an HF model directory, in .venv-trl.

Run by bench_learning.py as `.venv-trl/bin/python bench/learning_trl_peer.py JOB.json` with the checkout on
PYTHONPATH. The job holds the model directory, the GRPOConfig keyword arguments (bench_learning.trl_config_kwargs),
the domain, and the prompts of every step in our stage's order: the dataset is those prompts step after step, and
with `shuffle_dataset: false` TRL's sampler takes them in that order, P per step, each G times. The peer writes
<out_dir>/model (the trained policy as an HF directory) and <out_dir>/trl.json: the mean reward of every step
(TRL's logged `reward`) and the seconds of `train()`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from grpo_trl_peer import grader_reward, load_policy, prompt_dataset  # bench/ is the script's own dir
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from cascade.stages.domains import Item, get_domain


class RewardLog(TrainerCallback):
    """The mean reward TRL logs for every step (logging_steps=1)."""

    def __init__(self):
        self.rewards: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.rewards.append(float(logs["reward"]))


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(job["out_dir"])
    torch.set_num_threads(job["threads"])
    domain = get_domain(job["domain"], job["options"])
    items = [Item(**row) for step in job["schedule"] for row in step]
    model, tokenizer = load_policy(job["model_dir"])
    log = RewardLog()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=grader_reward(domain, items),
        args=GRPOConfig(output_dir=str(out / "trainer"), **job["config"]),
        train_dataset=prompt_dataset(items),
        processing_class=tokenizer,
        callbacks=[log],
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    trainer.save_model(str(out / "model"))  # the model and its tokenizer, as an HF directory
    (out / "trl.json").write_text(json.dumps({"reward": log.rewards, "seconds": seconds}))


if __name__ == "__main__":
    main()
