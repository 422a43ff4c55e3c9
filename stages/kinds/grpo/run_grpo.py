"""GRPO, strictly on-policy, as in every Nemotron-Cascade RL stage (arXiv 2512.13607 sec. 4, 2603.19220 sec. 3).

For each prompt q, sample G responses o_1..o_G from pi_theta, score them r_i with the stage's reward source
(stages/scoring/rewards.py; by default the domain's grader), and

    A_i = (r_i - mean(r)) / (std(r) + eps)
    L(theta) = -(1 / sum_i |o_i|) * sum_i sum_t A_i * pi_theta(o_it) / sg[pi_theta(o_it)]

One gradient step per rollout batch, so the importance ratio is exactly 1 and PPO clipping never engages.
Deviation, as the peers ship it: the engine's logprob pi_inf of each sampled token is the behaviour policy, and
`importance_correction` weights the token's term by w_t = min(pi_train / pi_inf, is_cap) (tis) or by the ratio
zeroed outside mis_band (mis, IcePop); none (w = 1) is the paper's loss, and auto picks tis where a mismatch is
real (vLLM rollouts, bf16 training, a batch sampled ahead). Deviation, off by default: `max_staleness: 1`
samples step t+1's batch while step t trains, from theta_t (stages/train/rollout_ahead.py); the correction then also
covers that step of staleness, and the step logs it (`staleness`). The step logs the mismatch's mean and max
and the share of tokens corrected (`is_corrected`). With `kl_coef` > 0 (the paper's RLHF stage only; 0 everywhere
else), L gains kl_coef * KL(pi_theta || pi_ref), the k3 estimator on the sampled tokens (stages.train.losses.kl_k3),
pi_ref a frozen checkpoint (`reference`, default the stage's start). Groups whose G rewards are all equal carry no
signal and are dropped (dynamic filtering; `drop_flat_groups: false` keeps them, as TRL does: no gradient of their
own, more compute). The paper refills dropped groups by over-sampling prompts; `refill_rounds` does so, each round
sampling only as many fresh prompts as groups lack signal (a step costs at most 1 + refill_rounds rollout
phases). Deviation: its default is 0, a smaller step instead, so a step's cost stays bounded on CPU. The sampling
seed is a function of (recipe seed, stage, step), so a resumed stage replays exactly the rollouts it would have
drawn (and a step checkpoint carries a batch sampled ahead). A control, off by default: `reward_control: shuffled`
computes the advantages from the step's rewards permuted across the batch (the logged rewards stay the graded
ones), to show what an update gains without the reward's preferences. `prompts:` picks the pool: the ones an earlier
difficulty stage kept (stages/kinds/difficulty/), or real data files per domain (GSM8K train, a user's JSONL or
Parquet, local or any fsspec URL) read as the SFT data build reads them; by default the synthetic train split.

Each phase of a step runs in a `torch.profiler.record_function` range named `grpo.<phase>` (bench/bench_grpo.py
--profile reads them; outside a profiler a range cost ~35 us on a loaded core, under 0.05% of a 1 s step).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.profiler import record_function

from cascade.stages.datasets.sources import iter_rows
from cascade.stages.domains import Item
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.products import load_kept_prompts
from cascade.stages.scale.distributed import rank_micro_batches
from cascade.stages.scoring.rewards import make_reward_source
from cascade.stages.train.completions import (
    CompletionBatch,
    RowLayout,
    check_head_reads_decoder,
    completion_batch,
    completion_logprobs,
    runs_full_rows,
)
from cascade.stages.train.context import StageContext, StageResult, load_policy
from cascade.stages.train.loss_registry import LossSetting
from cascade.stages.train.losses import groups_with_signal, grpo_advantages, shuffled_rewards, token_entropy
from cascade.stages.train.on_policy_losses import OnPolicyLoss, TokenBatch, stage_loss
from cascade.stages.train.packing import check_forward_options, check_packing_isolates_rows, compile_layers
from cascade.stages.train.rollout import (
    StepRequest,
    make_rollout_engine,
    reward_metrics,
    sample_groups,
    step_request,
    step_seed,
    sync_metrics,
)
from cascade.stages.train.rollout_ahead import CARRY_KEY, Rollout, RolloutPipeline
from cascade.stages.train.training import TrainRun, backward_micro_batches, clip_and_step, idle_loss, warmup_constant


def run_grpo(cfg: GRPOConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    """Trains inputs.policy on the prompt pool cfg.prompts picks (train_prompts)."""
    started = time.time()
    pool = train_prompts(cfg, ctx, inputs)
    if len(pool) < cfg.prompts_per_step:
        where = cfg.prompts if isinstance(cfg.prompts, str) else "train split" if cfg.prompts is None else "files"
        raise ValueError(
            f"stage {cfg.name!r}: {len(pool)} prompts to train on ({where}), "
            f"fewer than prompts_per_step={cfg.prompts_per_step}"
        )
    run = TrainRun(ctx, cfg, inputs.policy)
    ahead = cfg.max_staleness > 0
    engine = make_rollout_engine(ctx.recipe.engine, run, seed=ctx.recipe.seed, separate=ahead)
    sampling_attention = prepare_update(run, cfg)  # after the engine: a sampling copy keeps the loaded attention
    reward_source = make_reward_source(cfg.reward, ctx, inputs.stages)
    loss = stage_loss(cfg, LossSetting(ctx.recipe.engine.kind, run.world.dtype))
    reference = load_reference(run, cfg, inputs) if loss.needs_reference else None
    rollouts = rollout_pipeline(engine, run, pool, cfg, reward_source, sampling_attention)
    try:
        while run.step < cfg.steps:
            # rollout and score: P prompts x G samples, scored by the stage's reward source (by default the
            # domain's grader, the one the eval uses), from the current policy; with max_staleness 1, drawn
            # during the previous step's update from the weights that update started from, and the next step's
            # batch starts now
            step_started = time.perf_counter()
            batch = rollouts.take(run.step)
            if run.step + 1 < cfg.steps:
                rollouts.draw_ahead(run.step + 1)
            rollout_seconds = time.perf_counter() - step_started  # rewards are on the host: the device is done

            # advantages: group-normalized; zero-variance groups dropped (under the shuffled-reward control, from
            # the batch's rewards permuted: the logged rewards stay the graded ones)
            rewards, groups = batch.rewards, batch.groups
            if cfg.reward_control == "shuffled":
                rewards = shuffled_rewards(rewards, control_generator(ctx.recipe.seed, cfg.name, run.step))
            keep = groups_with_signal(rewards) if cfg.drop_flat_groups else torch.ones(len(groups), dtype=torch.bool)
            advantages = grpo_advantages(rewards, cfg.std_eps)

            # update: one step, token-level loss over the kept groups
            update = policy_update(run, cfg, loss, batch.prompts, groups, advantages, keep, reference)
            update_seconds = time.perf_counter() - step_started - rollout_seconds  # its grad norm synced the device
            run.step += 1
            with record_function("grpo.weight_sync"):  # a batch in flight finishes first: it is scored here
                waited = rollouts.sync(partial(run.policy_for_sampling, separate=ahead))

            # log
            with record_function("grpo.logging"):
                run.record_step(
                    {
                        **step_metrics(batch, keep, update),
                        **batch.reward_metrics,
                        **sync_metrics(engine),
                        "rollout_seconds": rollout_seconds + waited,
                        "update_seconds": update_seconds,
                        **({"staleness": float(run.step - 1 - batch.version)} if ahead else {}),
                        **({"refill_prompts": float(batch.refilled)} if cfg.refill_rounds else {}),
                    },
                    carried=(lambda: {CARRY_KEY: rollouts.carried()}) if ahead else None,
                )
    finally:
        rollouts.close()
        engine.close()
        reward_source.close()
    summary = summarize(run.history, engine.name, time.time() - started)
    return run.finish(summary)


def rollout_pipeline(
    engine, run: TrainRun, pool: list[Item], cfg: GRPOConfig, reward_source, sampling_attention: str
) -> RolloutPipeline:
    """The stage's batches: drawn at their step on the trained module (sampling_forward), or with max_staleness 1
    one step ahead on the engine's separate copy; a resumed stage takes the batch its checkpoint carried."""
    recipe = run.ctx.recipe

    def draw_now(step: int) -> Rollout:
        with sampling_forward(run.model, cfg, sampling_attention):
            return rollout_and_score(engine, run, pool, cfg, reward_source, step)

    def score(request: StepRequest, groups) -> tuple[Tensor, dict[str, float]]:
        with record_function("grpo.scoring"):
            return reward_source.rewards(request.items, groups), reward_source.metrics()

    return RolloutPipeline(
        engine,
        draw_now,
        lambda step: step_request(run.tokenizer, pool, cfg, recipe, cfg.domains, step),
        score,
        cfg.max_staleness,
        version=run.step,
        carried=run.carried.get(CARRY_KEY),
    )


def prepare_update(run: TrainRun, cfg: GRPOConfig) -> str:
    """The model set up for the update's forward (cfg.update_layout, attention, compile), the world's refusals
    first; returns the attention the model was loaded with, which sampling keeps (sampling_forward). Packed: the
    packing probe and the head probe (the update reads the decoder and the head apart), then the compile, after
    the probes, whose 6-token shapes would be compiles of their own."""
    check_forward_options(cfg, run.world)
    loaded = run.model.config._attn_implementation
    if cfg.attention == "flex_attention":  # sdpa: the model keeps the attention it was loaded with
        run.model.set_attn_implementation(cfg.attention)
    if cfg.update_layout == "packed" and not runs_full_rows(run.model):
        check_packing_isolates_rows(run.model, run.world.device, "set update_layout: shared_prefix for this stage")
        check_head_reads_decoder(run.model, run.world.device)
    if cfg.compile:
        compile_layers(run.model)
    return loaded


@contextmanager
def sampling_forward(model: torch.nn.Module, cfg: GRPOConfig, attention: str) -> Iterator[None]:
    """The rollout's forwards of the trained module (the HF engine's prefill, on a KV cache) run as without the
    update's forward options: the attention the model was loaded with, its layers eager. Flex attention and the
    compiled layers are for the packed update's shapes: a prefill would be compiles of its own."""
    flex = cfg.attention == "flex_attention"
    if not flex and not cfg.compile:
        yield
        return
    if flex:
        model.set_attn_implementation(attention)
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        if flex:
            model.set_attn_implementation(cfg.attention)


def rollout_and_score(engine, run: TrainRun, pool: list[Item], cfg: GRPOConfig, reward_source, step: int) -> Rollout:
    """The step's batch, drawn now from the engine's weights. Each refill round (at most cfg.refill_rounds)
    samples as many unused prompts as groups lack signal and puts their groups in place of those, as the paper's
    dynamic sampling over-samples; a step costs at most 1 + refill_rounds rollout phases."""
    recipe = run.ctx.recipe
    with record_function("grpo.rollout"):
        request = step_request(run.tokenizer, pool, cfg, recipe, cfg.domains, step)
        items, prompts, groups = request.items, request.prompts, sample_groups(engine, request)
    with record_function("grpo.scoring"):
        rewards = reward_source.rewards(items, groups)
    refilled = 0
    for refill in range(1, cfg.refill_rounds + 1):
        keep = groups_with_signal(rewards)
        missing = len(items) - int(keep.sum())
        drawn = {(it.domain, it.id, it.prompt) for it in items}
        unused = [it for it in pool if (it.domain, it.id, it.prompt) not in drawn]
        if missing == 0 or len(unused) < missing or missing < run.world.size:  # every rank samples a share
            break
        request = step_request(run.tokenizer, unused, cfg, recipe, cfg.domains, step, refill, missing)
        more = request.items, request.prompts, sample_groups(engine, request)
        kept = [p for p in range(len(items)) if keep[p]]
        items, prompts, groups = ([seq[p] for p in kept] + new for seq, new in zip((items, prompts, groups), more))
        rewards = torch.cat([rewards[keep], reward_source.rewards(more[0], more[2])])
        refilled += missing
    return Rollout(items, prompts, groups, rewards, step, refilled, reward_source.metrics())


def train_prompts(cfg: GRPOConfig, ctx: StageContext, inputs: StageInputs) -> list[Item]:
    """The prompt pool: a difficulty stage's kept prompts, the domains' files (parsed as sft_data parses them:
    a benchmark's own row parser, or a user's JSONL/Parquet fields); a domain without files: its synthetic
    train split (the same items as stages.train.rollout.prompt_pool)."""
    if isinstance(cfg.prompts, str):
        return load_kept_prompts(ctx, inputs.stages[cfg.prompts], cfg.domains)
    return [row.item for row in iter_rows(cfg, ctx.recipe, cfg.domains, oracle_domains=set())]


def control_generator(seed: int, stage: str, step: int) -> torch.Generator:
    """The shuffled-reward control's permutation stream: a function of (recipe seed, stage, step), so a resumed
    stage shuffles as the straight run did."""
    return torch.Generator().manual_seed(step_seed(seed, f"shuffle:{stage}", step))


def load_reference(run: TrainRun, cfg: GRPOConfig, inputs: StageInputs) -> torch.nn.Module:
    """The frozen KL reference, on the rank's device: the `reference` stage's checkpoint, else the policy this
    stage started from."""
    model, _ = load_policy(run.ctx, inputs.stages[cfg.reference] if cfg.reference else inputs.policy)
    return model.to(run.world.device).eval().requires_grad_(False)


def policy_update(
    run: TrainRun,
    cfg: GRPOConfig,
    loss: OnPolicyLoss,
    prompts,
    groups,
    advantages,
    keep,
    reference: torch.nn.Module | None = None,
) -> dict[str, float]:
    """One optimizer step of `loss` on the kept groups (with the frozen `reference`'s logprobs where the loss
    needs them). Returns loss, grad norm, entropy, the loss's own metrics, and the train/inference logprob
    mismatch over the kept groups' tokens, read off the update's own forward (by default), or over every sampled
    token with cfg.mismatch_over_dropped (dropped groups then get a no-grad forward for it). Each rank takes its
    share of the prompts; counts and sums are all-reduced, so N ranks make the update of one process. Each prompt
    goes through the model once for its group (stages/train/completions.py)."""
    world, pad, layout = run.world, run.tokenizer.pad_token_id, row_layout(cfg)
    rows = [(p, j) for p in world.shard(len(prompts)) for j in range(len(groups[p]))]
    batch = completion_batch([(prompts[p], groups[p][j]) for p, j in rows], pad, cfg.temperature, cfg.top_p).to(
        world.device
    )
    kept = torch.tensor([bool(keep[p]) for p, _ in rows], device=world.device)
    measured = batch.mask if cfg.mismatch_over_dropped else batch.mask[kept]
    all_tokens = max(world.all_sum(float(measured.sum())), 1.0)
    gap = mismatch_sum(run, cfg, batch.select(~kept)) if cfg.mismatch_over_dropped else 0.0
    stats = {"entropy": 0.0, "gap": gap, "gap_max": 0.0}
    terms = dict.fromkeys(loss.metric_names, 0.0)
    if world.all_sum(float(kept.sum())) == 0:
        return {"logprob_mismatch": world.all_sum(stats["gap"]) / all_tokens}
    batch = batch.select(kept)
    adv = torch.tensor([float(advantages[p, j]) for p, j in rows], device=world.device)[kept]
    num_tokens = int(world.all_sum(float(batch.mask.sum())))

    def micro_loss(part: slice) -> torch.Tensor:
        with record_function("grpo.logprob_forward"), world.autocast():
            logp, logits = completion_logprobs(run.model, batch, part, pad, layout)  # [n, C], [n, C, V]
        m, inf_logp = batch.mask[part], batch.inf_logp[part]
        with torch.no_grad():
            stats["entropy"] += float((token_entropy(logits) * m).sum()) / num_tokens
            gap = (logp - inf_logp).abs() * m
            stats["gap"] += float(gap.sum())
            stats["gap_max"] = max(stats["gap_max"], float(gap.max()))
        ref_logp = None
        if reference is not None:
            with torch.no_grad(), world.autocast():
                ref_logp, _ = completion_logprobs(reference, batch, part, pad)
        value, metrics = loss(TokenBatch(logp, inf_logp, m, num_tokens, advantages=adv[part], ref_logp=ref_logp))
        for name in terms:
            terms[name] += metrics[name]
        return value

    with record_function("grpo.forward_backward"):  # backward: this range less its logprob_forward ranges
        loss_value = backward_micro_batches(len(adv), cfg.micro_batch_size, micro_loss, run)
    with record_function("grpo.optimizer"):
        lr = cfg.lr * warmup_constant(run.step, cfg.warmup_steps)
        grad_norm = clip_and_step(run.model, run.optimizer, lr, cfg.grad_clip, loss_value)
    return {
        "loss": loss_value,
        "grad_norm": grad_norm,
        "lr": lr,
        "entropy": world.all_sum(stats["entropy"]),
        "logprob_mismatch": world.all_sum(stats["gap"]) / all_tokens,
        "logprob_mismatch_max": max(world.all_gather(stats["gap_max"])),
        **{name: world.all_sum(total) for name, total in terms.items()},
        "tokens_trained": float(num_tokens),  # sampled tokens the loss covers
    }


def row_layout(cfg: GRPOConfig) -> RowLayout:
    """How the update's forwards lay out their rows (stages/train/completions.py); the reference keeps the shared
    prefix."""
    return RowLayout(cfg.update_layout, cfg.pack_length, cfg.compile)


@torch.no_grad()
def mismatch_sum(run: TrainRun, cfg: GRPOConfig, batch: CompletionBatch) -> float:
    """sum |log pi_train - log pi_inf| over this rank's sampled tokens of rows that take no gradient."""
    total = 0.0
    for part in rank_micro_batches(run.world, len(batch), cfg.micro_batch_size):
        if part.start == part.stop:
            idle_loss(run.model, run.world)
            continue
        with record_function("grpo.mismatch_forward"), run.world.autocast():
            logp, _ = completion_logprobs(run.model, batch, part, run.tokenizer.pad_token_id, row_layout(cfg))
        total += float(((logp - batch.inf_logp[part]).abs() * batch.mask[part]).sum())
    return total


def step_metrics(batch: Rollout, keep, update) -> dict[str, float]:
    groups = batch.groups
    return {
        "kept_groups": float(keep.float().mean()),
        "response_length": sum(len(c.token_ids) for g in groups for c in g) / sum(len(g) for g in groups),
        "tokens_sampled": float(sum(len(c.token_ids) for g in groups for c in g)),
        **update,
        **reward_metrics(batch.items, batch.rewards),
    }


def summarize(history: list[dict[str, float]], engine: str, seconds: float) -> dict[str, Any]:
    def mean(key: str, rows: list[dict[str, float]]) -> float | None:
        vals = [h[key] for h in rows if key in h]
        return round(sum(vals) / len(vals), 4) if vals else None

    k = max(1, len(history) // 4)
    return {
        "engine": engine,
        "steps": len(history),
        "seconds": round(seconds, 1),
        "reward_first": mean("reward", history[:k]),
        "reward_last": mean("reward", history[-k:]),
        "logprob_mismatch": mean("logprob_mismatch", history),
        "kept_groups": mean("kept_groups", history),
    }
