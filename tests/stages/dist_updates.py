"""One GRPO and one MOPD update on fixed rollouts, in whatever world this process is in.

`python -m torch.distributed.run --nproc-per-node=2 -m tests.stages.dist_updates OUT` writes rank 0's results
to OUT/updates.pt; tests/stages/test_distributed.py compares them with `updates()` in one process."""

import random
import sys
from dataclasses import replace
from types import SimpleNamespace

import torch

from cascade.stages.engines.interface import Completion
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.grpo.run_grpo import policy_update
from cascade.stages.kinds.mopd import MOPDConfig
from cascade.stages.kinds.mopd.run_mopd import distill_update
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.scale.distributed import World, full_state_dict, prepare_model, world_for
from cascade.stages.train.completions import completion_batch, completion_logprobs
from cascade.stages.train.losses import groups_with_signal, grpo_advantages
from cascade.stages.train.model import build_tiny_model
from cascade.stages.train.on_policy_losses import GRPOLoss, MOPDLoss
from cascade.stages.train.tokenizer import load_tokenizer

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
PROMPTS, GROUP = 4, 3


def rollouts(vocab: int):
    """Seeded ragged prompts and completions; prompt 1's group has equal rewards (dropped), the rest do not."""
    rng = random.Random(7)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 7))] for _ in range(PROMPTS)]
    groups = []
    for _ in range(PROMPTS):
        group = []
        for _ in range(GROUP):
            tokens = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))]
            group.append(Completion(tokens, [rng.uniform(-6, -1) for _ in tokens], "", "length"))
        groups.append(group)
    rewards = torch.tensor([[1.0, 0.0, 0.5], [1.0, 1.0, 1.0], [0.0, 0.2, 1.0], [0.3, 0.0, 0.0]])
    return prompts, groups, rewards


def trained_weights(model: torch.nn.Module, world: World) -> dict[str, torch.Tensor]:
    full = full_state_dict(model, world)
    return {k: v.detach().clone() for k, v in (model.state_dict() if full is None else full).items()}


def fresh_run(world: World, tok):
    """SGD with lr 1: the update is the (clipped) gradient itself, so comparing updates compares gradients
    (AdamW would turn float noise on near-zero gradients into +-lr steps)."""
    model = prepare_model(build_tiny_model(SMALL, len(tok), seed=0), world)
    return SimpleNamespace(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), tokenizer=tok, world=world, step=0
    )


def updates(world: World) -> dict:
    tok = load_tokenizer()
    prompts, groups, rewards = rollouts(len(tok))
    out = {}

    run = fresh_run(world, tok)
    grpo = GRPOConfig(name="rl", domains=["math"], steps=1, lr=1.0, micro_batch_size=2)
    metrics = policy_update(
        run, grpo, GRPOLoss(None, 0.0), prompts, groups, grpo_advantages(rewards, 1e-6), groups_with_signal(rewards)
    )
    out["grpo"] = {"metrics": metrics, "weights": trained_weights(run.model, world)}

    run = fresh_run(world, tok)
    mopd = MOPDConfig(name="mopd", steps=1, lr=1.0, micro_batch_size=2)
    pairs = [(prompts[p], c) for p in range(PROMPTS) for c in groups[p]]
    domains = ["math" if i % 2 else "instruct" for i in range(len(pairs))]
    teacher = build_tiny_model(SMALL, len(tok), seed=1).eval()
    mine = world.shard(len(pairs))
    batch = completion_batch(pairs[mine.start : mine.stop], tok.pad_token_id)
    every_row = slice(0, len(batch))
    with torch.no_grad():  # pi_inf: the student before the step (ratios near 1, inside the band)
        teacher_logp = completion_logprobs(teacher, batch, every_row, tok.pad_token_id)[0]
        student = build_tiny_model(SMALL, len(tok), seed=0)
        inf_logp = completion_logprobs(student, batch, every_row, tok.pad_token_id)[0] + 0.01
    metrics = distill_update(
        run,
        mopd,
        MOPDLoss(mopd.eps_low, mopd.eps_high),
        replace(batch, inf_logp=inf_logp),
        teacher_logp,
        domains[mine.start : mine.stop],
        sorted(set(domains)),
    )
    out["mopd"] = {"metrics": metrics, "weights": trained_weights(run.model, world)}
    return out


if __name__ == "__main__":
    world = world_for(ComputeConfig(device="cpu", dtype="fp32"))
    result = updates(world)
    if world.is_main:
        torch.save(result, f"{sys.argv[1]}/updates.pt")
