"""A Bradley-Terry reward model, trained in the pipeline (Nemotron-Cascade 1's RLHF reward; InstructGPT sec. 3.5).

For preference pairs (x, y_c, y_r), a scalar head r_phi on a language-model backbone is trained by

    L(phi) = -(1 / K) * sum_k log sigmoid(r_phi(x_k, y_c,k) - r_phi(x_k, y_r,k) - margin)

(stages.train.losses.bradley_terry_loss), K the pairs of the optimizer batch. r_phi is read at the last token of the
chat-formatted prompt + answer (the end-of-turn token); a pair's two sequences share one row, the prompt run once
(`pair_scores`). The checkpoint is an ordinary one-label `AutoModelForSequenceClassification` that `transformers`
loads, with a manifest like every checkpoint.
Pairs come from a domain (`chat`: the oracle's answer over a near-miss of it), from the init policy's own
samples labelled by a domain's grader (`on_policy`: the best of k answers over the worst, as labellers compare
the policy's samples in InstructGPT), or from a file of real pairs in the ecosystem's `prompt`/`chosen`/`rejected`
format. Metrics: pairwise accuracy (share of held-out pairs with
r(chosen) > r(rejected)) and the mean reward margin on them.

Model selection (`select_every`, off by default): a reward model trained too long overfits its pairs, and RLHF
then climbs a score that the rubric does not share. So the stage can hold back `select_pairs` of the train pairs,
score them every `select_every` steps, stop after `patience` checks without a better score, and commit the best
step's weights. The held-out pairs stay out of the choice: they report the result.

It trains as SFT does (`TrainRun`, stages/train/training.py): in one process, or under torchrun (FSDP2) with each rank
taking a contiguous share of every batch's pairs, the loss normalized by the whole batch's pair count, and the
checkpoint committed by rank 0. Deviations: the score head starts at zero (transformers initializes it randomly),
so every pair starts at loss log 2 and the first steps are not spent undoing a random head; no step checkpoints
by default (the stage is minutes long on CPU, so a cut-off run repeats it; `checkpoint_every` sets them);
with `on_policy` pairs every rank samples all the pairs itself (the same seeded draws, so the same pairs on every
rank), where one rank could sample them and broadcast them;
Cascade 2's generative pairwise reward model is the `judge` reward instead.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from cascade.artifacts.checkpoint import materialize
from cascade.stages.datasets.preferences import PreferencePair, pair_of
from cascade.stages.datasets.sources import _file_records
from cascade.stages.domains import Domain, Item, get_domain
from cascade.stages.engines import RolloutEngine, SamplingParams, make_engine
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.reward_model import DomainPairs, OnPolicyPairs, PreferenceFile, RewardModelConfig
from cascade.stages.products import load_reward_model
from cascade.stages.scale.distributed import World, rank_micro_batches
from cascade.stages.train.context import StageContext, StageResult
from cascade.stages.train.losses import bradley_terry_loss
from cascade.stages.train.model import completion_ids, load_hf, prompt_ids
from cascade.stages.train.model_source import resolve_model_dir
from cascade.stages.train.rollout import step_seed
from cascade.stages.train.training import (
    TrainRun,
    backward_micro_batches,
    batch_for_step,
    clip_and_step,
    idle_loss,
    warmup_cosine,
)

Pair = tuple[list[int], list[int]]  # token ids of prompt + chosen, of prompt + rejected


def run_reward_model(cfg: RewardModelConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    """Trains a scalar head (and the backbone) from cfg.init on cfg.pairs; the checkpoint is the reward model."""
    started = time.time()
    run = TrainRun(
        ctx,
        cfg,
        inputs.stages.get(cfg.init),
        fresh=lambda: load_backbone(ctx, cfg, inputs),
        load=load_reward_model,
        heads=("score",),  # made fresh by load_backbone: with LoRA it trains whole
    )
    world = run.world
    train, heldout = load_pairs(cfg, ctx, inputs)
    train_ids, heldout_ids = encode_pairs(run.tokenizer, train), encode_pairs(run.tokenizer, heldout)
    train_ids, selection = split_selection(train_ids, cfg)
    pad = run.tokenizer.pad_token_id
    best = BestStep()
    while run.step < cfg.steps and not best.stalled(cfg.patience):
        # batch: this step's slice of the epoch permutation of the train pairs; this rank's share of its pairs
        batch = batch_for_step(train_ids, run.step, cfg.batch_size, ctx.recipe.seed)
        pairs = [batch[i] for i in world.shard(len(batch))]
        stats = {"correct": 0.0}

        # update: Bradley-Terry loss normalized by the whole batch's pair count (N ranks equal one process),
        # accumulated over micro-batches
        def micro_loss(part: slice) -> torch.Tensor:
            with world.autocast():
                chosen, rejected = pair_scores(run.model, pairs[part], pad)
            stats["correct"] += float((chosen > rejected).sum())
            return bradley_terry_loss(chosen, rejected, len(batch), cfg.margin)

        loss = backward_micro_batches(len(pairs), cfg.micro_batch_size, micro_loss, run)
        lr = cfg.lr * warmup_cosine(run.step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
        grad_norm = clip_and_step(run.model, run.optimizer, lr, cfg.grad_clip, loss)
        run.step += 1

        # log
        run.record_step(
            {
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "train_accuracy": world.all_sum(stats["correct"]) / len(batch),
            }
        )

        # select: accuracy on the pairs held back from training; the best step's weights are kept
        if cfg.select_every and (run.step % cfg.select_every == 0 or run.step == cfg.steps):
            scored = pairwise_metrics(run.model, world, selection, pad, cfg.micro_batch_size)
            best.offer(run.step, scored["heldout_accuracy"], run.model)
            ctx.log.log(run.step, {"select_" + k.removeprefix("heldout_"): v for k, v in scored.items()})
    selected = best.restore(run.model) if cfg.select_every else {}

    # evaluate: pairwise accuracy and reward margin on the held-out pairs
    metrics = {
        **pairwise_metrics(run.model, world, heldout_ids, pad, cfg.micro_batch_size),
        "steps": run.step,
        **selected,
        "train_pairs": len(train_ids),
        "heldout_pairs": len(heldout),
        "seconds": round(time.time() - started, 1),
    }
    ctx.log.log(run.step, {k: metrics[k] for k in ("heldout_accuracy", "heldout_margin")})
    return run.finish(metrics)


def split_selection(train: list[Pair], cfg: RewardModelConfig) -> tuple[list[Pair], list[Pair]]:
    """(train pairs, model-selection pairs): the last select_pairs of the train pairs are held back when the
    stage selects a step, so that neither training nor the held-out result sees them."""
    if not cfg.select_every:
        return train, []
    if len(train) <= cfg.select_pairs:
        raise ValueError(f"{len(train)} train pair(s), too few to hold back select_pairs {cfg.select_pairs}")
    return train[: -cfg.select_pairs], train[-cfg.select_pairs :]


class BestStep:
    """The best-scoring step's weights (a copy of each rank's own shards, in memory) and how many checks since."""

    def __init__(self) -> None:
        self.step, self.accuracy, self.weights, self.checks_since = 0, -1.0, None, 0

    def offer(self, step: int, accuracy: float, model: torch.nn.Module) -> None:
        if accuracy > self.accuracy:
            self.step, self.accuracy, self.checks_since = step, accuracy, 0
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.checks_since += 1

    def stalled(self, patience: int) -> bool:
        return patience > 0 and self.checks_since >= patience

    def restore(self, model: torch.nn.Module) -> dict[str, float]:
        model.load_state_dict(self.weights)
        return {"selected_step": self.step, "select_accuracy": self.accuracy}


def load_backbone(ctx: StageContext, cfg: RewardModelConfig, inputs: StageInputs):
    """A one-label sequence classifier on cfg.init's weights."""
    return load_reward_model(init_model_dir(ctx, cfg, inputs))


def init_model_dir(ctx: StageContext, cfg: RewardModelConfig, inputs: StageInputs) -> Path:
    """cfg.init's HF model dir: an earlier stage's checkpoint (downloaded and verified), or a model source."""
    if cfg.init in inputs.stages:
        local = materialize(ctx.store, inputs.stages[cfg.init], Path(tempfile.mkdtemp(dir=ctx.workdir)))
        return local / "model"
    return resolve_model_dir(cfg.init, ctx.workdir)


def load_pairs(
    cfg: RewardModelConfig, ctx: StageContext, inputs: StageInputs
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held-out) pairs: a domain's two splits, the init policy's labelled samples, or a file's rows with
    the last heldout_share held out."""
    seed = ctx.recipe.seed
    if isinstance(cfg.pairs, DomainPairs):
        domain = get_domain(cfg.pairs.domain)
        return domain.pairs("train", cfg.pairs.train, seed), domain.pairs("heldout", cfg.pairs.heldout, seed)
    if isinstance(cfg.pairs, OnPolicyPairs):
        return on_policy_pairs(cfg, ctx, inputs)
    return file_pairs(cfg.pairs)


def file_pairs(src: PreferenceFile) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """A file's rows, the last heldout_share of them held out."""
    rows = read_preference_file(src)
    cut = len(rows) - max(1, round(src.heldout_share * len(rows)))
    if cut < 1:
        raise ValueError(f"{src.path}: {len(rows)} pair(s), too few to hold out {src.heldout_share:g}")
    return rows[:cut], rows[cut:]


def on_policy_pairs(
    cfg: RewardModelConfig, ctx: StageContext, inputs: StageInputs
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """The init policy's samples on the domain's train and held-out prompts, labelled by its grader."""
    src = cfg.pairs
    model, tokenizer = load_hf(init_model_dir(ctx, cfg, inputs))
    engine = make_engine(ctx.recipe.engine, model, tokenizer, seed=ctx.recipe.seed)
    domain, seed = get_domain(src.domain), ctx.recipe.seed
    max_new_tokens = ctx.recipe.domains[src.domain].max_new_tokens

    def split_pairs(split: str, prompts: int) -> list[PreferencePair]:
        sampling = SamplingParams(max_new_tokens=max_new_tokens, seed=step_seed(seed, f"rm-pairs:{split}", 0))
        return labelled_pairs(domain, engine, tokenizer, domain.generate(split, prompts, seed), src.samples, sampling)

    try:
        return split_pairs("train", src.train), split_pairs("heldout", src.heldout)
    finally:
        engine.close()


def labelled_pairs(
    domain: Domain, engine: RolloutEngine, tokenizer, items: list[Item], samples: int, sampling: SamplingParams
) -> list[PreferencePair]:
    """Per item: `samples` answers; the best-graded over the worst, none when all grade the same."""
    groups = engine.generate([prompt_ids(tokenizer, item.prompt) for item in items], samples, sampling)
    pairs = []
    for item, group in zip(items, groups):
        graded = sorted(((domain.grade(item, c.text), c.text) for c in group), key=lambda g: g[0])
        (worst, rejected), (best, chosen) = graded[0], graded[-1]
        if best > worst:
            pairs.append(PreferencePair(item.prompt, chosen, rejected))
    return pairs


def read_preference_file(src: PreferenceFile) -> list[PreferencePair]:
    """Every row of a JSONL or Parquet pair file, local or remote (read as the SFT data build reads files)."""
    return [pair_of(src, row, index) for index, row in enumerate(_file_records(src))]


def encode_pairs(tokenizer, pairs: list[PreferencePair]) -> list[Pair]:
    def ids(prompt: str, answer: str) -> list[int]:
        return prompt_ids(tokenizer, prompt) + completion_ids(tokenizer, answer)

    return [(ids(p.prompt, p.chosen), ids(p.prompt, p.rejected)) for p in pairs]


def pair_scores(model: torch.nn.Module, pairs: list[Pair], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r(chosen) [K], r(rejected) [K]) in one forward of K rows, each pair's common prefix (its prompt) run once.

    Row k is [prefix | chosen's rest | rejected's rest]: each rest's positions continue the prefix, and the
    rejected rest attends to the prefix and itself, not to the chosen rest (`shared_prefix_rows`). Attention is
    causal, so every token sees what it would see in its own sequence and its hidden state is the same; the
    prompt, most of a pair's tokens in chat, is computed once instead of twice. The score head runs on every
    position inside the model's own forward (as FSDP2's root hooks require); a hook on it keeps those scores,
    and each sequence's is read at its last token."""
    ids, positions, allowed, ends = shared_prefix_rows(pairs, pad)  # [K, T], [K, T], [K, T, T], [K, 2]
    per_position = []
    hook = model.score.register_forward_hook(lambda module, args, out: per_position.append(out))
    try:
        model(
            input_ids=ids.to(model.device),
            position_ids=positions.to(model.device),
            attention_mask=allowed[:, None].to(model.device),
        )
    finally:
        hook.remove()
    scores = per_position[0][torch.arange(len(pairs), device=model.device)[:, None], ends.to(model.device), 0]
    return scores[:, 0].float(), scores[:, 1].float()  # [K, 2] -> chosen, rejected


def shared_prefix_rows(pairs: list[Pair], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, positions [K, T]; allowed [K, T, T] (query row, key column: True where it may attend); ends [K, 2] the
    columns of chosen's and rejected's last tokens. The shared prefix stops one token short of the shorter
    sequence, so each sequence keeps a token of its own; right padding attends causally to the row (its outputs
    are never read, but a fully masked row would make NaNs)."""
    width = max(len(c) + len(r) - shared_length(c, r) for c, r in pairs)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    positions = torch.zeros((len(pairs), width), dtype=torch.long)
    segment = torch.full((len(pairs), width), 3)  # 0 prefix, 1 chosen's rest, 2 rejected's rest, 3 padding
    ends = torch.zeros((len(pairs), 2), dtype=torch.long)
    for row, (chosen, rejected) in enumerate(pairs):
        shared = shared_length(chosen, rejected)
        both = len(chosen) + len(rejected) - shared
        ids[row, :both] = torch.tensor(chosen + rejected[shared:])
        positions[row, :both] = torch.tensor(list(range(len(chosen))) + list(range(shared, len(rejected))))
        segment[row, :shared], segment[row, shared : len(chosen)], segment[row, len(chosen) : both] = 0, 1, 2
        ends[row] = torch.tensor([len(chosen) - 1, both - 1])
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same = (segment[:, :, None] == segment[:, None, :]) | (segment[:, None, :] == 0) | (segment[:, :, None] == 3)
    return ids, positions, causal & same, ends


def shared_length(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of a and b, at most one less than the shorter."""
    limit = min(len(a), len(b)) - 1
    return next((i for i in range(limit) if a[i] != b[i]), limit)


@torch.no_grad()
def pairwise_metrics(
    model: torch.nn.Module, world: World, pairs: list[Pair], pad: int, batch_size: int
) -> dict[str, float]:
    """Share of pairs with r(chosen) > r(rejected), and the mean r(chosen) - r(rejected). Each rank scores its
    share of the pairs; a rank with fewer batches forwards idle ones (FSDP2 forwards are collectives)."""
    was_training = model.training
    model.eval()
    mine = [pairs[i] for i in world.shard(len(pairs))]
    margins = []
    for part in rank_micro_batches(world, len(mine), batch_size):
        if part.start == part.stop:
            idle_loss(model, world)
            continue
        chosen, rejected = pair_scores(model, mine[part], pad)
        margins += (chosen - rejected).tolist()
    model.train(was_training)
    margins = [m for rank in world.all_gather(margins) for m in rank]
    return {
        "heldout_accuracy": round(sum(m > 0 for m in margins) / len(margins), 4),
        "heldout_margin": round(sum(margins) / len(margins), 4),
    }
