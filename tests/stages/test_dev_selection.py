"""What selects reads the dev split: the gate, the teachers of `teachers: auto` and of a recovery, and baselines
compare each domain on its `dev/<domain>` column where the eval scored one; the held-out column only records."""

from cascade.artifacts.records import EvalRecord
from cascade.artifacts.report import EvalScores
from cascade.stages.evals.gate import best_stages, decide
from cascade.stages.evals.regression import compare, raise_to, replace

# held-out and dev disagree on purpose: held-out says sft is best on math and rl improved it; dev says the opposite
EVALS = [
    EvalScores(after_stage="sft", scores={"math": 0.60, "dev/math": 0.40, "bench/gsm8k": 0.30}),
    EvalScores(after_stage="rl", scores={"math": 0.50, "dev/math": 0.55, "bench/gsm8k": 0.31}),
]
TOLERANCES = {"math": 0.05, "bench/gsm8k": 0.05}


def test_the_gate_compares_dev_scores_where_a_domain_has_them():
    # held-out math fell 0.10 (past the tolerance) but dev rose: no decision
    assert decide("rl", EVALS[:1], EVALS[1], TOLERANCES, "warn") == []
    # dev fell 0.15 while held-out rose: the gate fires, on the dev column, with dev's numbers
    now = EvalScores(after_stage="next", scores={"math": 0.70, "dev/math": 0.40, "bench/gsm8k": 0.31})
    (decision,) = decide("next", EVALS, now, TOLERANCES, "warn")
    assert (decision.domain, decision.column, decision.best, decision.best_stage, decision.now) == (
        "math",
        "dev/math",
        0.55,
        "rl",
        0.40,
    )
    # a benchmark has no dev split: it is gated on its own column
    dropped = EvalScores(after_stage="next", scores={**EVALS[1].scores, "bench/gsm8k": 0.2})
    (bench,) = decide("next", EVALS, dropped, TOLERANCES, "warn")
    assert (bench.column, bench.best) == ("bench/gsm8k", 0.31)


def test_teachers_are_the_stages_best_on_dev():
    assert best_stages(EVALS, ["math"]) == {"math": "rl"}  # held-out would have chosen sft
    held_out_only = [EvalScores(after_stage=e.after_stage, scores={"math": e.scores["math"]}) for e in EVALS]
    assert best_stages(held_out_only, ["math"]) == {"math": "sft"}  # a domain without dev: its own column


def test_baselines_hold_and_compare_dev_scores():
    record = EvalRecord(model="file:///ckpt/sft", digest="d1", scores=EVALS[0].scores, items=[])
    baseline = replace("nightly", record)
    assert {d: e.score for d, e in baseline.domains.items()} == {"math": 0.40, "bench/gsm8k": 0.30}
    rows = {r["domain"]: r for r in compare("rl", EVALS[1].scores, baseline, TOLERANCES)}
    assert (rows["math"]["column"], rows["math"]["score"], rows["math"]["verdict"]) == ("dev/math", 0.55, "ok")
    better = EvalRecord(model="file:///ckpt/rl", digest="d2", scores=EVALS[1].scores, items=[])
    assert raise_to(baseline, "nightly", better).domains["math"].score == 0.55
