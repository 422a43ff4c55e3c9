"""Benchmark evals feed the gate: `eval.benchmarks` runs after every model stage beside the held-out splits, shows
as a "bench/<name>" column of the forgetting matrix, and where the recipe marks it `gates: true`, the gate fires on
it with its own tolerance.

Two toy stages make policies with known greedy answers (tests/stages/rigged.py): "A", then "B". On an
MMLU-format file whose every gold answer is A, pass@1 goes 1.0 -> 0.0, so the gate must fire on bench/mmlu_stem and
only there (the domains' tolerance is 1.0: a score in [0, 1] cannot drop by more).
"""

import json
from typing import Literal

import pytest

from cascade.artifacts.layout import eval_key
from cascade.artifacts.records import EvalRecord
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe
from cascade.stages.kinds import StageInputs, StageKind, register_kind, unregister_kind
from cascade.stages.recipe.config_base import StageConfig
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.train.context import StageContext, StageResult, load_policy, save_model_checkpoint
from tests.stages.rigged import rig_short_answers


class AnswerConfig(StageConfig):
    kind: Literal["answer"] = "answer"
    answer: str


def run_answer(cfg: AnswerConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    model, tokenizer = load_policy(ctx, None)
    rig_short_answers(model, tokenizer, cfg.answer)
    ref = save_model_checkpoint(ctx, ctx.key, model, tokenizer, cfg=cfg, step=None, parent=None, metrics={})
    return StageResult(ref, {})


@pytest.fixture
def answer_kind():
    register_kind(
        StageKind("answer", AnswerConfig, run_answer, makes="policy", takes_policy=False, holds_compute=False)
    )
    yield
    unregister_kind("answer")


def mmlu_root(tmp_path):
    root = tmp_path / "data"
    (root / "mcqa").mkdir(parents=True)
    rows = [
        {
            "question": f"Which is {n}?",
            "choices": [str(n), str(n + 1), str(n + 2), str(n + 3)],
            "answer": 0,
            "type": "arithmetic",
        }
        for n in range(1, 6)
    ]
    (root / "mcqa" / "mmlu_stem_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def bench_recipe(tmp_path, **gate):
    raw = load_recipe("micro", [f"storage.root=file://{tmp_path}/store", "tracking.enabled=false"]).model_dump(
        mode="json"
    )
    raw["stages"] = [
        {"kind": "answer", "name": "answers_a", "answer": "A"},
        {"kind": "answer", "name": "answers_b", "answer": "B"},
    ]
    for spec in raw["domains"].values():
        spec["tolerance"] = 1.0
    raw["eval"] = {
        "benchmarks": {"mmlu_stem": {"limit": 4, "max_new_tokens": 8, "gates": True, "tolerance": 0.25}},
        "data_root": str(mmlu_root(tmp_path)),
    }
    raw["gate"] = {"policy": "warn", **gate}
    return validate_recipe(raw)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness", "answer_kind")
def test_the_gate_fires_on_a_benchmark_column(tmp_path):
    recipe = bench_recipe(tmp_path)
    report = cascade_flow(recipe, "bench")

    columns, rows = report.forgetting_matrix()
    assert "bench/mmlu_stem" in columns and {"math", "instruct"} <= set(columns)
    by_stage = {stage: dict(zip(columns, scores)) for stage, scores in rows}
    assert by_stage["answers_a"]["bench/mmlu_stem"] == 1.0 and by_stage["answers_b"]["bench/mmlu_stem"] == 0.0
    assert [(g.stage, g.domain, g.best, g.now, g.tolerance, g.action) for g in report.gate] == [
        ("answers_b", "bench/mmlu_stem", 1.0, 0.0, 0.25, "warn")
    ]
    store = Store.from_config(recipe.storage)
    record = EvalRecord.parse(store.read_bytes(eval_key("bench", 1, "answers_b")), "answers_b")
    items = [r for r in record.items if r["domain"] == "bench/mmlu_stem"]
    assert [r["completion"] for r in items] == ["B"] * 4 and [r["score"] for r in items] == [0.0] * 4


@pytest.mark.usefixtures("answer_kind")
def test_an_unknown_benchmark_in_the_recipe_is_refused(tmp_path):
    raw = bench_recipe(tmp_path).model_dump(mode="json")
    raw["eval"]["benchmarks"] = {"gsm9k": {}}
    with pytest.raises(RecipeError, match=r"eval.benchmarks.gsm9k: unknown benchmark 'gsm9k'; known: "):
        validate_recipe(raw)
