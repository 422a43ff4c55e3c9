"""`recipes/smollm2-cascade.yaml` through the flow with tiny sizes: smollm2-135m is evaluated (source), trained by
IF-RL, then by GRPO on the MBPP train problems its difficulty filter keeps, then distilled by MOPD from the
teachers the dev scores chose, with the gate reading dev scores after every stage.

Only sizes, the eval engine (the HF one), the recovery's length and what the filter does with problems never
solved are overridden (at 6 new tokens none is solved; the shipped recipe drops those); the model, the domains
and their splits, the stage list, the eval columns and the gate's policy are the shipped recipe's.
"""

import json

import pytest

from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
TINY = [
    *[
        f"stages.{s}.{k}={v}"
        for s in ("if_rl", "code_rl", "mopd")
        for k, v in (("steps", 1), ("prompts_per_step", 2), ("group_size", 2), ("checkpoint_every", 0))
    ],
    "stages.code_filter.prompts_per_domain=4",
    "stages.code_filter.k=2",
    "stages.code_filter.unsolved=keep",
    "domains.instruct.train_size=64",  # the generator draws the whole train split for a prompt pool
    "domains.instruct.heldout_size=2",
    "domains.instruct.max_new_tokens=6",
    "domains.code.heldout_size=3",
    "domains.code.dev_size=2",
    "domains.code.train_size=20",
    "domains.code.max_new_tokens=6",
    "eval.engine=hf",
    "eval.dtype=fp32",
    "eval.benchmarks.ifeval.limit=2",
    "eval.benchmarks.ifeval.max_new_tokens=6",
    "eval.benchmarks.humaneval.limit=1",
    "eval.benchmarks.humaneval.max_new_tokens=6",
    "gate.recovery={steps: 1, prompts_per_step: 2, group_size: 2}",
    "tracking.enabled=false",
]
COLUMNS = {"instruct", "dev/instruct", "code", "dev/code", "bench/ifeval", "bench/humaneval"}


def test_smollm2_cascade_runs_if_rl_code_rl_and_mopd_gated_on_dev(tmp_path, monkeypatch, smollm2_home):
    monkeypatch.setenv("CASCADE_HOME", str(smollm2_home))  # the test session's converted smollm2-135m
    recipe = load_recipe("smollm2-cascade", [f"storage.root=file://{tmp_path}/store", *TINY])
    # the control is one override of the same recipe (its effect on an update: tests/stages/test_training.py)
    control = load_recipe("smollm2-cascade", [*TINY, "stages.if_rl.reward_control=shuffled"])
    assert [s.model_dump() for s in control.stages] == [
        s.model_dump() | ({"reward_control": "shuffled"} if s.name == "if_rl" else {}) for s in recipe.stages
    ]
    assert recipe.gate.policy == "recover" and not any(b.gates for b in recipe.eval.benchmarks.values())
    report = cascade_flow(recipe, "casc")
    stages = {s.name: s for s in report.stages}
    assert [s for s in stages if not s.startswith("recover-")] == ["if_rl", "code_filter", "code_rl", "mopd"]
    assert stages["code_filter"].metrics["kept/code"] == 4  # unsolved kept here; the recipe trains on what it solves
    evaluated = [e.after_stage for e in report.evals]
    assert evaluated[0] == "source" and evaluated[-1] == "mopd" and "code_rl" in evaluated
    assert all(COLUMNS <= set(e.scores) for e in report.evals), [sorted(e.scores) for e in report.evals]
    # the gate and the teachers read dev columns; IFEval, a test column, never gates
    assert all(d.column.startswith("dev/") for d in report.gate), report.gate
    teachers = stages["mopd"].metrics["teachers"]
    assert set(teachers) == {"instruct", "code"} and set(teachers.values()) <= {"source", *stages}
    # per-item records of every column, the benchmark rows with why each answer ended
    evals = tmp_path / "store" / "runs" / "casc" / "evals"
    record = json.loads(next(evals.glob("*-mopd.json")).read_text())
    assert {r["domain"] for r in record["items"]} == COLUMNS
    bench = [r for r in record["items"] if r["domain"].startswith("bench/")]
    assert len(bench) == 3 and {r["finish_reason"] for r in bench} <= {"stop", "length"}
    code = [r for r in record["items"] if r["domain"] in ("code", "dev/code")]
    assert [r["id"] for r in code] == [f"code-heldout-{i}" for i in range(3)] + ["code-dev-0", "code-dev-1"]
