"""A recipe's dry run: the DAG the flow will walk, and per stage what it will sample, train, store and take.

Nothing is loaded but configs: the parameter count comes from the model's config built on torch's `meta`
device (no weights), so a 30B recipe plans on a laptop. Token counts and storage are upper bounds, and times are
estimates, under stated assumptions: what a run really costs depends on how long the model's answers turn out.

- a sampled answer runs to its domain's `max_new_tokens`; a prompt is `prompt_tokens` long (an option);
- training costs 6 N FLOPs per token and sampling 2 N, with N the (active) parameter count (Kaplan et al.);
- a throughput profile turns FLOPs into seconds: its effective FLOP/s for training and for sampling. The `cpu`
  profile is this project's measured 2-core figures on the tiny model and on smollm2-135m (bench/RESULTS.md),
  interpolated in log size between them: a CPU's matmuls are used better by a larger model, so one figure from
  the tiny model made a 135M model's plan ~2-3x too slow. The tiny model's token rates are also ceilings (a smaller
  model is not faster per token on a CPU, where per-token overhead dominates); the GPU profiles are the card's
  dense bf16 peak times an assumed utilization;
- storage: a policy checkpoint holds fp32 weights; a step checkpoint adds AdamW's two moments; a stage keeps
  `keep_step_checkpoints` of them while it runs.

Evals run after every policy-making stage (each domain's eval split at its own size, and its dev split beside a
held-out one); the gate may branch into one
MOPD recovery per fired stage, up to `gate.max_recoveries`, which the plan counts as possible, not certain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cascade.stages.kinds import kind_of
from cascade.stages.recipe.config_base import SOURCE_EVAL, ComputeConfig, OnPolicyConfig, StageConfig, TrainingConfig
from cascade.stages.recipe.estimate import StageEstimate
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.sections import EngineConfig, GateConfig
from cascade.stages.recipe.throughput import Throughput, seconds
from cascade.stages.recipe.walk import GateStep, SourceEval, StageStep, stage_steps, walk


@dataclass(frozen=True)
class ModelSize:
    total: int  # parameters stored
    active: int  # parameters each token passes through (MoE: fewer than total)
    from_config: bool  # counted from the recipe's model config, not given by the user


def model_size(recipe: Recipe, params: float | None = None, active: float | None = None) -> ModelSize:
    """Parameter counts from the model's config on the meta device; `params`/`active` override (a model that
    is not on this machine)."""
    if params is not None:
        return ModelSize(int(params), int(active or params), from_config=False)
    from cascade.stages.train.model import meta_model
    from cascade.stages.train.model_source import ModelSourceError

    try:
        model = meta_model(recipe.model)
    except ModelSourceError as e:
        raise ModelSourceError(
            f"{e}; to plan for a model that is not on this machine, give its size: --params N "
            "(and --active-params N for a mixture of experts)"
        ) from None
    total = sum(p.numel() for p in model.parameters())
    return ModelSize(total, int(active or total), from_config=True)


def estimate_stage(cfg: StageConfig, recipe: Recipe, size: ModelSize, prompt_tokens: int) -> StageEstimate:
    """Token, storage and note figures of one stage, by its kind's `estimate`; seconds are filled in by `plan`."""
    estimate = kind_of(cfg.kind).estimate
    if estimate is None:
        return StageEstimate(cfg.name, cfg.kind, notes=[f"no estimate for kind {cfg.kind!r}"])
    return estimate(cfg, recipe, size.total, prompt_tokens)


def eval_estimate(name: str, recipe: Recipe) -> StageEstimate:
    est = StageEstimate(f"eval after {name}", "eval")
    items = 0
    for domain, spec in recipe.domains.items():
        for split, answers in split_answers(recipe, domain):
            items += spec.split_size(split)
            est.tokens_sampled += spec.split_size(split) * answers * spec.max_new_tokens
    for bench, spec in recipe.eval.benchmarks.items():
        count = spec.limit or benchmark_size(bench, recipe)
        if count is None:
            est.notes.append(f"benchmark {bench}: no file under the data root and no limit, not counted")
            continue
        items += count
        est.tokens_sampled += count * spec.max_new_tokens
    est.storage_bytes = items * 256  # a stored row per item
    return est


def split_answers(recipe: Recipe, domain: str) -> list[tuple[str, int]]:
    """(split, answers per item) of each split an eval scores of a domain: the eval's split with its k samples and
    one greedy beside a sampled metric, and the dev split's k when the eval split is held-out (the dev/<domain>
    column that selects)."""
    temperature, k = recipe.eval_sampling(domain)
    scored = [(recipe.eval.split, k + (1 if temperature > 0 else 0))]
    return scored + ([("dev", k)] if recipe.eval.split == "heldout" else [])


def benchmark_size(name: str, recipe: Recipe) -> int | None:
    """How many items the benchmark holds: a shipped file's rows (counted, not parsed: parsing some benchmarks
    sets up their checkers), or what a loader of its own (a subset of a file, several files) loads; None: it has
    no file here."""
    from cascade.stages.domains.benchdata import (
        BenchmarkError,
        JsonlBenchmark,
        NativeBenchmark,
        benchmark_registry,
        is_url,
        read_rows,
    )

    user_file = recipe.eval.benchmarks[name].file
    if user_file is not None:
        return None if is_url(user_file) else len(read_rows(Path(user_file)))
    loader, root = benchmark_registry()[name].loader, recipe.eval.resolved_data_root()
    if isinstance(loader, NativeBenchmark):
        try:
            return len(loader(root))
        except (OSError, BenchmarkError):
            return None
    relpath = loader.relpath if isinstance(loader, JsonlBenchmark) else None  # another loader: no one file
    path = root / relpath if relpath else None
    return len(read_rows(path)) if path is not None and path.is_file() else None


@dataclass
class Plan:
    recipe: Recipe
    size: ModelSize
    profile: Throughput
    devices: int
    prompt_tokens: int
    rows: list[StageEstimate]  # stages and evals, in the order the flow runs them
    recovery: StageEstimate | None  # one MOPD recovery, if the gate may branch into it

    def total(self) -> StageEstimate:
        """Every row's figures summed (a recovery, which may not run, is not a row)."""
        rows = self.rows
        return StageEstimate(
            "total",
            "",
            tokens_sampled=sum(r.tokens_sampled for r in rows),
            tokens_trained=sum(r.tokens_trained for r in rows),
            teacher_tokens=sum(r.teacher_tokens for r in rows),
            storage_bytes=sum(r.storage_bytes for r in rows),
            seconds=sum(r.seconds for r in rows),
        )


def recovery_label(gate: GateConfig) -> str:
    """How the plan names the gate's recovery stage: by its kind, e.g. "MOPD recovery"."""
    return f"{gate.recovery.kind.upper()} recovery"


def make_plan(recipe: Recipe, size: ModelSize, profile: Throughput, devices: int = 1, prompt_tokens: int = 128) -> Plan:
    """The walk's steps as estimates; the first recovery the gate may insert is its own row."""
    rows, recovery = [], None
    for step in walk(recipe):
        if isinstance(step, StageStep):
            rows.append(estimate_stage(step.stage, recipe, size, prompt_tokens))
            continue
        rows.append(eval_estimate(SOURCE_EVAL if isinstance(step, SourceEval) else step.after, recipe))
        if isinstance(step, GateStep) and step.recovery is not None and recovery is None:
            label = recovery_label(recipe.gate)
            recovery = estimate_stage(
                step.recovery.stage.model_copy(update={"name": label}), recipe, size, prompt_tokens
            )
            recovery.notes.append(f"only if the gate fires; at most {recipe.gate.max_recoveries} per run")
    for est in rows + ([recovery] if recovery else []):
        est.seconds = seconds(est, size, profile, devices)
    return Plan(recipe, size, profile, devices, prompt_tokens, rows, recovery)


def placement(compute: ComputeConfig) -> str:
    """Where a training stage's ranks go, in words."""
    unit = {"cuda": "GPU", "cpu": "CPU"}.get(compute.device, "GPU (CPU on a cluster without GPUs)")
    if compute.runs_as == "ray":
        cluster = compute.ray_address or "RAY_ADDRESS, else a local Ray"
        return (
            f"{compute.world_size} Ray actor(s) on {compute.nnodes} node(s) x {compute.nproc_per_node} per node, "
            f"one {unit} each; cluster: {cluster}"
        )
    if compute.runs_as == "process":
        return "in the stage task's process"
    nodes = f", {compute.nnodes} nodes from {compute.rdzv_endpoint}" if compute.nnodes > 1 else " on this node"
    return f"torchrun, {compute.world_size} rank(s){nodes}"


def rollout_placement(engine: EngineConfig, compute: ComputeConfig) -> str:
    if engine.kind == "hf":
        return "HF engine in each rank, on its share of the prompts"
    if engine.url:
        server = f"vLLM server at {engine.url}"
    elif compute.runs_as == "ray":
        wants = ", ".join(f"{k}: {v:g}" for k, v in engine.ray_resources.items())
        server = f"managed vLLM server, a Ray actor on resources of its own ({wants})"
    elif compute.world_size == 1:
        server = "managed vLLM server on the stage task's host"
    else:
        server = "managed vLLM server on rank 0's node"
    return server if compute.world_size == 1 else f"{server}, shared by the {compute.world_size} ranks (each its share)"


def dag_lines(recipe: Recipe) -> list[str]:
    """The flow's walk as text: each stage, what it reads and makes, and after each policy the eval and gate."""
    lines = []
    gate = recipe.gate
    for step in walk(recipe):
        if isinstance(step, SourceEval):
            lines.append(f" 0. eval of the source model ({recipe.model.source})")
        elif isinstance(step, StageStep):
            cfg = step.stage
            reads = ", ".join(sorted({r.stage for r in cfg.reads()}))
            makes = kind_of(cfg.kind).makes
            lines.append(
                f"{step.index + 1:>2}. {cfg.name} [{cfg.kind}] -> {makes}" + (f"  (reads {reads})" if reads else "")
            )
            if kind_of(cfg.kind).distributable:
                lines.append(f"    |- ranks: {placement(recipe.compute_for(cfg))}")
                if isinstance(cfg, OnPolicyConfig):  # it samples from its own policy as it trains
                    lines.append(f"    |- rollouts: {rollout_placement(recipe.engine, recipe.compute_for(cfg))}")
                if isinstance(cfg, TrainingConfig) and cfg.lora is not None:
                    lora = cfg.lora
                    lines.append(
                        f"    |- lora: rank {lora.rank}, alpha {lora.alpha:g} on {lora.target_modules}; the checkpoint "
                        "holds the merged model and the adapter"
                    )
        else:
            benches = "".join(f", {b}" for b in recipe.eval.benchmarks)
            splits = "held-out and dev" if recipe.eval.split == "heldout" else recipe.eval.split
            lines.append(f"    |- eval: {', '.join(recipe.domains)} {splits}{benches}")
            branch = (
                f"fired -> {recovery_label(gate)} ({gate.recovery.steps} steps, teachers: the best checkpoint per "
                "domain so far) -> eval -> go on from it"
                if step.recovery is not None
                else f"fired -> {'warn' if gate.policy == 'recover' else gate.policy}"  # no recovery left to run
            )
            lines.append(f"    `- gate ({gate.policy}): {branch}")
    return lines


def _human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{suffix}{unit}"
    return f"{n:.0f}{unit}"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def render_table(plan: Plan) -> str:
    """The estimate as a Markdown table (the CLI prints it; the README quotes it), assumptions underneath."""
    head = (
        "| stage | kind | tokens sampled | tokens trained | storage | time |\n| --- | --- | ---: | ---: | ---: | ---: |"
    )
    body = [
        f"| {r.stage} | {r.kind} | {_human(r.tokens_sampled)} | {_human(r.tokens_trained)} | "
        f"{_human(r.storage_bytes, 'B')} | {_duration(r.seconds)} |"
        for r in plan.rows
    ]
    total = plan.total()
    body.append(
        f"| **total** | | {_human(total.tokens_sampled)} | {_human(total.tokens_trained)} | "
        f"{_human(total.storage_bytes, 'B')} | {_duration(total.seconds)} |"
    )
    if plan.recovery:
        r = plan.recovery
        body.append(
            f"| {r.stage} (if the gate fires) | {r.kind} | {_human(r.tokens_sampled)} | "
            f"{_human(r.tokens_trained)} | {_human(r.storage_bytes, 'B')} | {_duration(r.seconds)} |"
        )
    size = plan.size
    params = _human(size.total) + (f" ({_human(size.active)} active)" if size.active != size.total else "")
    model = plan.recipe.model.source if size.from_config else "as given"
    notes = [
        f"model: {model}, {params} parameters; prompts ~{plan.prompt_tokens} tokens; answers at their domain's "
        "max_new_tokens (upper bounds)",
        f"throughput: {plan.profile.basis}; {plan.devices} device(s)",
    ]
    for r in plan.rows + ([plan.recovery] if plan.recovery else []):
        label = "evals" if r.kind == "eval" else r.stage  # every eval has the same notes: say them once
        notes += [f"{label}: {n}" for n in r.notes if f"{label}: {n}" not in notes]
    return "\n".join([head, *body, "", *notes])


def draw_dag(recipe: Recipe, path: Path) -> None:
    """The DAG as a PNG: stages top to bottom, each policy stage's eval and gate beside it, the gate's branch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(recipe.stages)
    gates = {step.after: step for step in walk(recipe) if isinstance(step, GateStep)}
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.8 * n))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.8 * n - 0.2, 0.8)
    ax.axis("off")
    box = dict(boxstyle="round,pad=0.3", fc="#e8f0fe", ec="#3367d6")
    for i, cfg in ((step.index, step.stage) for step in stage_steps(recipe)):  # the walk's positions
        y = -0.8 * i
        ax.text(1.8, y, f"{cfg.name}\n[{cfg.kind}]", ha="center", va="center", fontsize=9, bbox=box)
        if i:
            ax.annotate("", (1.8, y + 0.25), (1.8, y + 0.55), arrowprops=dict(arrowstyle="->"))
        if cfg.name in gates:
            ax.annotate("", (4.2, y), (2.9, y), arrowprops=dict(arrowstyle="->", color="#777"))
            ax.text(
                5.0,
                y,
                "eval + gate",
                ha="center",
                va="center",
                fontsize=8,
                bbox=dict(boxstyle="round,pad=0.3", fc="#fef7e0", ec="#f9ab00"),
            )
            if gates[cfg.name].recovery is not None:
                ax.annotate("", (7.2, y), (5.9, y), arrowprops=dict(arrowstyle="->", ls="--", color="#d93025"))
                ax.text(
                    8.3,
                    y,
                    f"fired:\n{recovery_label(recipe.gate)}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    bbox=dict(boxstyle="round,pad=0.3", fc="#fce8e6", ec="#d93025"),
                )
    ax.set_title(f"recipe {recipe.name}: {n} stages, gate policy {recipe.gate.policy}", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plan_json(plan: Plan) -> str:
    rows = [r.__dict__ for r in plan.rows + ([plan.recovery] if plan.recovery else [])]
    return json.dumps(
        {
            "recipe": plan.recipe.name,
            "params": plan.size.total,
            "active_params": plan.size.active,
            "profile": plan.profile.name,
            "devices": plan.devices,
            "rows": rows,
        },
        indent=1,
    )
