"""Score columns are typed (domain, split, metric); their stored keys are rendered and read back in one place, so
report.json, eval records and baselines keep the keys they always had."""

import pytest

from cascade.artifacts.report import EvalScores, RunReport
from cascade.artifacts.score_columns import GREEDY, PRIMARY, ScoreColumn

KEYS = {
    "math": ScoreColumn("math", "eval", PRIMARY),
    "greedy/math": ScoreColumn("math", "eval", GREEDY),
    "pass@8/math": ScoreColumn("math", "eval", "pass@8"),
    "dev/math": ScoreColumn("math", "dev", PRIMARY),
    "bench/gsm8k": ScoreColumn("gsm8k", "bench", PRIMARY),
    "bench/ifeval:prompt_loose": ScoreColumn("ifeval", "bench", "prompt_loose"),
}


@pytest.mark.parametrize("key", sorted(KEYS))
def test_a_key_reads_as_its_column_and_renders_back(key):
    assert ScoreColumn.parse(key) == KEYS[key]
    assert KEYS[key].key == key


def test_side_columns_are_every_column_but_a_primary_metric():
    assert {k for k, c in KEYS.items() if c.is_side} == {
        "greedy/math",
        "pass@8/math",
        "dev/math",
        "bench/ifeval:prompt_loose",
    }
    assert ScoreColumn.pass_at("code", 4).key == "pass@4/code" and ScoreColumn.dev("code").key == "dev/code"


def test_a_domain_selects_on_dev_where_scored_and_a_benchmark_on_its_own_column():
    scored = {"math": 0.6, "dev/math": 0.4, "code": 0.2, "bench/gsm8k": 0.3, "greedy/math": 0.5}
    assert ScoreColumn("math").selection(scored) == ScoreColumn.dev("math")
    assert ScoreColumn("code").selection(scored) == ScoreColumn("code")
    assert ScoreColumn.benchmark("gsm8k").selection(scored) == ScoreColumn.benchmark("gsm8k")
    assert ScoreColumn("math", metric=GREEDY).selection(scored).key == "greedy/math"  # only a primary selects on dev
    assert EvalScores(after_stage="sft", scores=scored).selected(ScoreColumn("math")) == (ScoreColumn.dev("math"), 0.4)
    assert EvalScores(after_stage="sft", scores=scored).selected(ScoreColumn("chat")) is None


def test_the_forgetting_matrix_orders_a_domains_columns_after_it():
    report = RunReport(run_id="r", recipe="micro")
    report.record_eval("source", {k: 0.5 for k in reversed(list(KEYS))} | {"code": 0.1, "pass@2/code": 0.2})
    columns, _ = report.forgetting_matrix()
    assert columns == [
        "bench/gsm8k",
        "bench/ifeval:prompt_loose",
        "code",
        "pass@2/code",
        "math",
        "greedy/math",
        "pass@8/math",
        "dev/math",
    ]
