"""The run record's API: typed rows, replaced in place on a resume, the gate's decisions with their recovery."""

import json

import pytest
from pydantic import ValidationError

from cascade.artifacts.report import EvalScores, GateDecision, RunReport, StageRecord
from cascade.artifacts.store import Store


def decision(stage: str, domain: str, **fields) -> GateDecision:
    values = dict(best=0.5, best_stage="sft", now=0.3, drop=0.2, tolerance=0.05, action="recover")
    return GateDecision(stage=stage, domain=domain, column=f"dev/{domain}", **(values | fields))


def test_a_stage_recorded_again_keeps_its_place_and_a_new_one_goes_last():
    report = RunReport(run_id="r", recipe="micro")
    report.record_stage(StageRecord(name="sft", kind="sft", status="failed"))
    report.record_stage(StageRecord(name="rl", kind="grpo", status="completed", checkpoint="file:///s/01-rl"))
    report.record_stage(StageRecord(name="sft", kind="sft", status="completed", checkpoint="file:///s/00-sft"))
    assert [(s.name, s.status) for s in report.stages] == [("sft", "completed"), ("rl", "completed")]
    assert report.stage("sft").checkpoint == "file:///s/00-sft" and report.stage("nope") is None


def test_evals_through_a_stage_leave_out_later_ones():
    report = RunReport(run_id="r", recipe="micro")
    for stage, score in (("sft", 0.2), ("if_rl", 0.4), ("math_rl", 0.3)):
        report.record_eval(stage, {"math": score})
    report.record_eval("if_rl", {"math": 0.45})  # evaluated again on a resume: replaced in place
    assert [(e.after_stage, e.scores["math"]) for e in report.evals_through("if_rl")] == [
        ("sft", 0.2),
        ("if_rl", 0.45),
    ]
    assert len(report.evals_through("never")) == 3


def test_a_recovery_fills_in_the_decisions_after_its_stage_only():
    report = RunReport(run_id="r", recipe="micro")
    report.record_gate("if_rl", [decision("if_rl", "math"), decision("if_rl", "code")])
    report.record_gate("math_rl", [decision("math_rl", "math", action="warn")])
    report.record_gate("if_rl", [decision("if_rl", "math")])  # the gate again after a resumed if_rl
    recovered = EvalScores(after_stage="recover-if_rl", scores={"dev/math": 0.48, "math": 0.1})
    fired = [d.recovered(recovered) for d in report.decisions_after("if_rl")]
    report.record_gate("if_rl", fired)
    assert [(d.stage, d.domain, d.after_recovery) for d in fired] == [("if_rl", "math", 0.48)]
    assert [(d.stage, d.after_recovery) for d in report.gate] == [("math_rl", None), ("if_rl", 0.48)]


def test_the_record_round_trips_through_the_store_and_reads_older_gate_rows(tmp_path):
    store = Store(f"file://{tmp_path}")
    report = RunReport(run_id="r", recipe="micro")
    report.record_stage(StageRecord(name="recover-sft", kind="mopd", status="completed", recovers="sft"))
    report.record_gate("sft", [decision("sft", "math")])
    report.save(store)
    assert RunReport.load(store, "r") == report
    older = json.loads(store.read_bytes("runs/r/report.json"))
    del older["gate"][0]["column"]  # written before decisions named their column: the domain's own
    store.write_bytes("runs/r/report.json", json.dumps(older).encode())
    assert RunReport.load(store, "r").gate[0].column == "math"


def test_a_row_with_an_unknown_field_or_status_is_refused():
    with pytest.raises(ValidationError, match="status"):
        StageRecord(name="sft", kind="sft", status="half-done")
    with pytest.raises(ValidationError, match="extra"):
        StageRecord.model_validate({"name": "sft", "kind": "sft", "status": "completed", "colour": "red"})
