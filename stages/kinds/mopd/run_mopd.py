"""Multi-domain on-policy distillation (MOPD), Nemotron-Cascade 2 (arXiv 2603.19220 sec. 4).

The student samples its own responses; for each prompt the teacher of that prompt's domain (the checkpoint
that scored best on that domain's held-out set) scores the sampled tokens with one forward pass. Per token,

    a_t = sg[log pi_teacher(y_t) - log pi_train(y_t)],   r_t = pi_train(y_t) / pi_inf(y_t)
    w_t = sg[r_t] * 1[eps_low <= r_t <= eps_high]
    L   = -(1 / N_tokens) * sum_t w_t * a_t * log pi_train(y_t)

Tokens whose ratio leaves the band are zeroed, not clipped. Teachers are frozen. Deviations: teachers are
whole earlier checkpoints of this run (as in the paper) but loaded on CPU, either all resident (default; a
tiny model costs ~14 MB each) or one at a time (`teacher_residency: one_at_a_time`), trading a reload per
domain per step for memory; the step's peak RSS is logged either way. Rewards are computed only as metrics.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.mopd import MOPDConfig
from cascade.stages.recipe.config_base import SOURCE_EVAL
from cascade.stages.train.completions import CompletionBatch, completion_batch, completion_logprobs
from cascade.stages.train.context import StageContext, StageResult, load_policy
from cascade.stages.train.loss_registry import LossSetting
from cascade.stages.train.losses import truncated_fraction
from cascade.stages.train.on_policy_losses import OnPolicyLoss, TokenBatch, stage_loss
from cascade.stages.train.rollout import (
    make_rollout_engine,
    prompt_pool,
    reward_metrics,
    sample_groups,
    score_groups,
    step_request,
    sync_metrics,
)
from cascade.stages.train.training import (
    TrainRun,
    backward_micro_batches,
    clip_and_step,
    micro_batches,
    warmup_constant,
)


def run_mopd(cfg: MOPDConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    """Distills into inputs.policy; inputs.teachers holds, per domain, the checkpoint that teaches it (None: the
    model source)."""
    started = time.time()
    teachers = dict(inputs.teachers)
    if not teachers:
        raise ValueError(f"MOPD stage {cfg.name!r}: no teachers among its inputs (Made.inputs hands them over)")
    domains = cfg.domains or sorted(teachers)
    missing = sorted(set(domains) - set(teachers))
    if missing:
        raise ValueError(f"MOPD stage {cfg.name!r} has no teacher for domain(s) {missing}")
    run = TrainRun(ctx, cfg, inputs.policy)
    loss = stage_loss(cfg, LossSetting(ctx.recipe.engine.kind, run.world.dtype))
    if loss.needs_reference:
        raise ValueError(f"MOPD stage {cfg.name!r}: its loss wants a frozen reference, which MOPD does not load")
    engine = make_rollout_engine(ctx.recipe.engine, run, seed=ctx.recipe.seed)
    pool = prompt_pool(ctx.recipe, domains)
    teacher_pool = TeacherPool(ctx, teachers, resident=cfg.teacher_residency == "resident", device=run.world.device)
    try:
        while run.step < cfg.steps:
            # rollout: the student samples; the engine reports pi_inf per token
            request = step_request(run.tokenizer, pool, cfg, ctx.recipe, domains, run.step)
            items, prompts, groups = request.items, request.prompts, sample_groups(engine, request)
            pairs = [(prompts[p], c) for p, group in enumerate(groups) for c in group]
            row_domains = [items[p].domain for p, group in enumerate(groups) for _ in group]
            mine = run.world.shard(len(pairs))  # this rank's rows (all of them in one process)
            batch = completion_batch(
                pairs[mine.start : mine.stop], run.tokenizer.pad_token_id, cfg.temperature, cfg.top_p
            ).to(run.world.device)

            # teachers: log pi_teacher of the sampled tokens, each row scored by its domain's teacher
            teacher_logp = teacher_pool.logprobs(
                batch, row_domains[mine.start : mine.stop], cfg.micro_batch_size, run.tokenizer.pad_token_id
            )

            # update: truncated-importance-weighted reverse-KL policy gradient
            update = distill_update(
                run, cfg, loss, batch, teacher_logp, row_domains[mine.start : mine.stop], sorted(set(row_domains))
            )
            run.step += 1
            engine.sync_weights(run.policy_for_sampling())

            # log: per-domain reverse KL and reward, truncation, memory
            rewards = score_groups(ctx.recipe, items, groups)
            run.record_step(
                {**update, "peak_rss_mb": peak_rss_mb(), **reward_metrics(items, rewards), **sync_metrics(engine)}
            )
    finally:
        engine.close()
    summary = summarize(run.history, engine.name, teachers, time.time() - started)
    return run.finish(summary)


def distill_update(
    run: TrainRun,
    cfg: MOPDConfig,
    loss: OnPolicyLoss,
    batch: CompletionBatch,
    teacher_logp,
    row_domains: list[str],
    domains: list[str],
) -> dict[str, float]:
    """One optimizer step of `loss` (by default the MOPD loss) over this rank's rows (row_domains: theirs;
    domains: every domain of the step, on every rank); returns loss, grad norm, the loss's own metrics,
    truncation, mismatch and KL per domain, all-reduced. teacher_logp: [n, C], in the batch's completion columns."""
    world = run.world
    mask, inf_logp = batch.mask, batch.inf_logp  # [n, C]
    local_tokens = float(mask.sum())
    num_tokens = int(world.all_sum(local_tokens))
    student_logp = torch.zeros_like(mask)
    terms = dict.fromkeys(loss.metric_names, 0.0)

    def micro_loss(part: slice) -> torch.Tensor:
        with world.autocast():
            logp, _ = completion_logprobs(run.model, batch, part, run.tokenizer.pad_token_id)
        student_logp[part] = logp.detach()
        tokens = TokenBatch(logp, inf_logp[part], mask[part], num_tokens, teacher_logp=teacher_logp[part])
        value, metrics = loss(tokens)
        for name in terms:
            terms[name] += metrics[name]
        return value

    loss_value = backward_micro_batches(len(row_domains), cfg.micro_batch_size, micro_loss, run)
    lr = cfg.lr * warmup_constant(run.step, cfg.warmup_steps)
    grad_norm = clip_and_step(run.model, run.optimizer, lr, cfg.grad_clip, loss_value)
    outside = float(truncated_fraction(student_logp, inf_logp, mask, cfg.eps_low, cfg.eps_high)) * local_tokens
    metrics = {
        "loss": loss_value,
        "grad_norm": grad_norm,
        "lr": lr,
        **{name: world.all_sum(total) for name, total in terms.items()},
        "truncated_fraction": world.all_sum(outside) / max(num_tokens, 1),
        "logprob_mismatch": world.all_sum(float(((student_logp - inf_logp).abs() * mask).sum())) / num_tokens,
        "tokens_sampled": float(num_tokens),
        "tokens_trained": float(num_tokens),
    }
    for domain in domains:
        rows = [i for i, d in enumerate(row_domains) if d == domain]
        gap = world.all_sum(float(((student_logp[rows] - teacher_logp[rows]) * mask[rows]).sum()))
        metrics[f"reverse_kl/{domain}"] = gap / max(world.all_sum(float(mask[rows].sum())), 1.0)
    return metrics


class TeacherPool:
    """Frozen teachers by domain (a checkpoint, or the model source). Domains sharing one share one loaded model."""

    def __init__(
        self,
        ctx: StageContext,
        refs: dict[str, CheckpointRef | None],  # None: the recipe's model source
        resident: bool,
        device: torch.device = torch.device("cpu"),
    ):
        self.ctx, self.refs, self.resident, self.device = ctx, refs, resident, device
        self.loaded: dict[str, torch.nn.Module] = {}  # by checkpoint digest (the source: SOURCE_EVAL)

    @torch.no_grad()
    def logprobs(self, batch: CompletionBatch, row_domains: list[str], micro_batch_size: int, pad: int) -> torch.Tensor:
        """-> [N, C] log pi_teacher of each sampled token of batch, with each row's own domain teacher.

        Forwards micro_batch_size rows at a time, as the student does: logits are [n, C, V], never [N, C, V]."""
        out = torch.zeros_like(batch.mask)
        by_digest: dict[str, list[int]] = {}
        for row, domain in enumerate(row_domains):
            by_digest.setdefault(teacher_key(self.refs[domain]), []).append(row)
        for digest, rows in by_digest.items():
            model = self._model(digest)
            taught = batch.select(torch.tensor(rows, device=batch.owner.device))  # a prompt's rows share a domain
            for part in micro_batches(len(rows), micro_batch_size):
                out[rows[part]] = completion_logprobs(model, taught, part, pad)[0]
            if not self.resident:
                self.loaded.pop(digest)
        return out

    def _model(self, digest: str) -> torch.nn.Module:
        if digest not in self.loaded:
            ref = next(r for r in self.refs.values() if teacher_key(r) == digest)
            model, _ = load_policy(self.ctx, ref)
            self.loaded[digest] = model.to(self.device).eval().requires_grad_(False)
        return self.loaded[digest]


def teacher_key(ref: CheckpointRef | None) -> str:
    return ref.digest if ref is not None else SOURCE_EVAL


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def summarize(
    history: list[dict[str, float]], engine: str, teachers: dict[str, CheckpointRef | None], seconds: float
) -> dict[str, Any]:
    last = history[-1] if history else {}
    return {
        "engine": engine,
        "steps": len(history),
        "seconds": round(seconds, 1),
        "teachers": {d: r.stage if r else SOURCE_EVAL for d, r in sorted(teachers.items())},
        "truncated_fraction": last.get("truncated_fraction"),
        "peak_rss_mb": last.get("peak_rss_mb"),
        **{k: round(v, 4) for k, v in last.items() if k.startswith("reverse_kl/")},
    }
