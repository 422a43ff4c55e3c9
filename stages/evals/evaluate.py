"""Evaluate a policy on every recipe domain's eval split (`eval.split`: held-out, or dev while tuning) with the
domain's own grader, or with the reward of one's own its `eval_reward` names.

The primary metric of a domain is each item's mean grade over k answers sampled at the temperature RL trains at
(`Recipe.eval_sampling`), averaged over items: RL moves the sampled distribution, and a sampled mean over k answers
churns less between checkpoints than one greedy answer. Greedy pass@1 is scored beside it, in column
`greedy/<domain>`; a domain set to eval_temperature 0 is greedy only. The grader is the same function that gives
the RL reward, so a training gain and an eval gain measure one thing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.records import EvalRecord
from cascade.artifacts.score_columns import GREEDY, ScoreColumn
from cascade.artifacts.scratch import owned_tempdir
from cascade.artifacts.store import Store
from cascade.stages.engines import make_engine
from cascade.stages.engines.interface import RolloutEngine, SamplingParams
from cascade.stages.recipe.schema import Recipe
from cascade.stages.scoring.rewards import CallableRewards
from cascade.stages.train.context import load_checkpoint
from cascade.stages.train.model import prompt_ids

ProgressFactory = Callable[[str], Callable[[int, int], None]]  # a part's name -> its (done, total) callback


def evaluate_domains(
    engine: RolloutEngine,
    tokenizer,
    recipe: Recipe,
    domains: list[str] | None = None,
    progress: ProgressFactory | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Scores per column in [0, 1] (each domain's primary metric, and `greedy/<domain>` beside a sampled one) and
    one row per item and column (prompt, first completion, score). Where the eval split is held-out, each domain's
    primary metric is also scored on its dev split (`dev/<domain>`): that column selects, the held-out one records.
    `progress(column)` gives each column's (done, total) callback, items answered so far."""
    scores: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for name in domains or list(recipe.domains):
        temperature, k = recipe.eval_sampling(name)
        columns = [(recipe.eval.split, ScoreColumn(name), temperature, k)]
        if temperature > 0:
            columns.append((recipe.eval.split, ScoreColumn(name, metric=GREEDY), 0.0, 1))
        if recipe.eval.split == "heldout":
            columns.append(("dev", ScoreColumn.dev(name), temperature, k))
        prepared: dict[str, tuple] = {}  # split -> (items, prompts, seeds): the greedy column reuses the primary's
        for split, column, t, samples in columns:
            if split not in prepared:
                prepared[split] = eval_items(tokenizer, recipe, name, split)
            column_scores, column_rows = score_column(
                engine, recipe, name, *prepared[split], column, t, samples, progress(column.key) if progress else None
            )
            scores.update(column_scores)
            rows += column_rows
    return scores, rows


def eval_items(tokenizer, recipe: Recipe, name: str, split: str) -> tuple[list, list[list[int]], list[int]]:
    """A domain's eval items of one split, their prompt ids, and each item's seed."""
    items = recipe.domain(name).generate(split, recipe.domains[name].split_size(split), recipe.seed)
    prompts = [prompt_ids(tokenizer, item.prompt) for item in items]
    # Each item draws from its own seeded stream: a sampled eval is a function of the checkpoint alone, and two
    # checkpoints answer each item with the same random numbers (common random numbers), whatever the batch,
    # so their paired difference is not sampling noise of the eval itself.
    return items, prompts, item_seeds(recipe.seed, name, items)


def score_column(
    engine: RolloutEngine,
    recipe: Recipe,
    name: str,
    items: list,
    prompts: list[list[int]],
    seeds: list[int],
    column: ScoreColumn,
    t: float,
    samples: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One column of a domain: each item's mean grade over `samples` answers at temperature t, and beside a sampled
    column its pass@k over the same answers."""
    spec = recipe.domains[name]
    sampling = SamplingParams(temperature=t, max_new_tokens=spec.max_new_tokens)
    answers = engine.generate(prompts, samples, sampling, seeds=seeds, progress=progress)
    groups = [[c.text for c in group] for group in answers]
    grades = answer_grades(recipe, name, items, groups)  # [item][answer]
    per_item = {column.key: [sum(g) / len(g) for g in grades]}
    if samples > 1 and column.split != "dev":  # the same answers: is any of them fully right
        per_item[ScoreColumn.pass_at(name, samples).key] = [float(max(g) >= 1.0) for g in grades]
    scores: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for col, item_scores in per_item.items():
        scores[col] = sum(item_scores) / len(item_scores)
        rows += [
            {"domain": col, "id": it.id, "prompt": it.prompt, "completion": g[0], "score": s}
            for it, g, s in zip(items, groups, item_scores)
        ]
    return scores, rows


def answer_grades(recipe: Recipe, name: str, items, groups: list[list[str]]) -> list[list[float]]:
    """Each item's grades of its answers (groups[i]: item i's k answers): by the domain's grader, or by the reward
    of one's own that the domain's `eval_reward` names."""
    k = len(groups[0]) if groups else 1
    answered, texts = [it for it in items for _ in range(k)], [t for g in groups for t in g]
    reward = recipe.domains[name].eval_reward
    if reward is None:
        flat = recipe.domain(name).grade_batch(answered, texts)
    else:
        flat = CallableRewards(reward, None, {}).grades(list(zip(answered, texts)))
    return [flat[i * k : (i + 1) * k] for i in range(len(items))]


def item_seeds(seed: int, domain: str, items) -> list[int]:
    """One 63-bit seed per item, a hash of (recipe seed, domain, item id): stable across runs and processes."""
    return [
        int.from_bytes(hashlib.sha256(f"{seed}:{domain}:{it.id}".encode()).digest()[:8], "big") >> 1 for it in items
    ]


BENCHMARK_SIDE_METRICS = ("prompt_loose", "instruction_strict", "instruction_loose")


def evaluate_benchmarks(
    engine: RolloutEngine, tokenizer, recipe: Recipe, progress: ProgressFactory | None = None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """pass@1 (greedy) of every benchmark in `eval.benchmarks`, as score columns "bench/<name>"; `progress(name)`
    gives each benchmark's (done, total) callback, items answered so far."""
    from cascade.stages.evals.benchmarks import evaluate_benchmark

    scores: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for name, spec in recipe.eval.benchmarks.items():
        result = evaluate_benchmark(
            engine,
            tokenizer,
            spec.source(name),
            spec.limit,
            data_root=recipe.eval.resolved_data_root(),
            data_file=spec.file,
            max_new_tokens=spec.max_new_tokens,
            seed=recipe.seed,
            progress=progress(name) if progress else None,
        )
        column = ScoreColumn.benchmark(name).key
        scores[column] = result.metrics["pass@1"]
        # IFEval's other three numbers beside its prompt-level strict pass@1: shown, never gated
        scores |= {
            ScoreColumn.benchmark(name, m).key: result.metrics[m] for m in BENCHMARK_SIDE_METRICS if m in result.metrics
        }
        rows += [
            {"domain": column, "id": r["id"], "prompt": r["prompt"], "completion": r["completion"], "score": r["score"]}
            # why the answer ended ("length": it hit max_new_tokens), and e.g. IFEval's per-instruction verdicts
            | {"finish_reason": r["finish_reason"]}
            | ({"details": r["details"]} if r.get("details") else {})
            for r in result.rows
        ]
    return scores, rows


def open_policy(
    recipe: Recipe,
    checkpoint: CheckpointRef | None = None,
    store: Store | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[Any, RolloutEngine]:
    """(tokenizer, engine) on a checkpoint of the recipe's store, or on the recipe's model source for None
    (any source `stages.train.model_source.resolve_model_dir` takes): the engine `eval.engine` names (None: the
    recipe's `engine.kind`) with the recipe's engine settings, decoding in `eval.dtype` (compute: the dtype the
    stages train in; bf16 halves what a decode step reads): the HF engine on the model cast to it, a vLLM server left
    at `engine.dtype: auto` started in it. announce: see make_engine."""
    store = store or Store.from_config(recipe.storage)
    from cascade.stages.scale.distributed import resolve_device
    from cascade.stages.train.precision import resolve_dtype

    with owned_tempdir(prefix="cascade-eval-") as download:
        model, tokenizer = load_checkpoint(recipe, store, checkpoint, download)  # in memory: the copy goes
    device = resolve_device(recipe.compute.device)  # where the stages train: a GPU's evals run on it
    wanted = recipe.eval.dtype
    bf16 = wanted == "bf16" or (wanted == "compute" and resolve_dtype(recipe.compute, device) == "bf16")
    engine = recipe.engine.model_copy(update={"kind": recipe.eval.engine or recipe.engine.kind})
    if engine.kind == "vllm" and engine.dtype == "auto":
        engine = engine.model_copy(update={"dtype": "bfloat16" if bf16 else "float32"})
    model = model.to(device)
    if engine.kind == "hf" and bf16:
        model = model.to(torch.bfloat16)
    return tokenizer, make_engine(engine, model, tokenizer, seed=recipe.seed, announce=announce)


def evaluate_model(
    recipe: Recipe,
    checkpoint: CheckpointRef | None = None,
    store: Store | None = None,
    progress: ProgressFactory | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Every recipe domain's scores on its eval split (and dev, see evaluate_domains) of a checkpoint (None: the
    recipe's model source), and every benchmark column of `eval.benchmarks`."""
    tokenizer, engine = open_policy(recipe, checkpoint, store, announce)
    try:
        scores, rows = evaluate_domains(engine, tokenizer, recipe, progress=progress)
        bench_scores, bench_rows = evaluate_benchmarks(engine, tokenizer, recipe, progress)
        return {**scores, **bench_scores}, rows + bench_rows
    finally:
        engine.close()


def stored_or_evaluated(
    recipe: Recipe,
    store: Store,
    key: str,
    model: CheckpointRef | None,
    progress: ProgressFactory | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[EvalRecord, bool]:
    """The eval record at `key` when it scored this checkpoint (the same digest: a re-trained stage is evaluated
    again), else a new eval of `model` (None: the recipe's model source), written there; and whether it is new."""
    digest = model.digest if model else None
    stored = EvalRecord.parse(store.read_bytes(key), store.uri(key)) if store.exists(key) else None
    if stored is not None and stored.digest == digest:
        return stored, False
    scores, rows = evaluate_model(recipe, model, store, progress, announce)
    record = EvalRecord(model=model.uri if model else None, digest=digest, scores=scores, items=rows)
    store.write_bytes(key, record.to_json())
    return record, True
