"""`recipes/smollm2-if.yaml` through the flow with tiny sizes: smollm2-135m is evaluated before the RL stage (the
`source` row) and after it, on the generator's dev split, IFEval and HumanEval, and trained with GRPO on generated
constrained instructions.

Only sizes are overridden (steps, batch, train and dev items, new tokens, benchmark items); the model, the
generator, the eval columns and the stage list are the shipped recipe's. Full-size figures: docs/RESULTS.md.
"""

import json

import pytest

from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
TINY = [
    "stages.if_rl.steps=1",
    "stages.if_rl.prompts_per_step=2",
    "stages.if_rl.group_size=2",
    "stages.if_rl.checkpoint_every=0",
    "domains.instruct.train_size=64",  # the generator draws the whole train split for a prompt pool
    "domains.instruct.heldout_size=2",
    "domains.instruct.max_new_tokens=8",
    "eval.benchmarks.ifeval.limit=2",
    "eval.benchmarks.ifeval.max_new_tokens=8",
    "eval.benchmarks.humaneval.limit=2",
    "eval.benchmarks.humaneval.max_new_tokens=8",
    "tracking.enabled=false",
]


def test_smollm2_if_evaluates_source_and_rl_stage_on_dev_ifeval_and_humaneval(tmp_path, monkeypatch, smollm2_home):
    monkeypatch.setenv("CASCADE_HOME", str(smollm2_home))  # the test session's converted smollm2-135m
    recipe = load_recipe("smollm2-if", [f"storage.root=file://{tmp_path}/store", *TINY])
    assert recipe.eval.split == "dev" and recipe.domains["instruct"].options == {"generator": "ifeval"}
    report = cascade_flow(recipe, "ifrl")
    assert [e.after_stage for e in report.evals] == ["source", "if_rl"]
    assert report.stages[0].metrics["steps"] == 1
    columns = {"instruct", "bench/ifeval", "bench/humaneval"}
    assert all(columns <= set(e.scores) for e in report.evals), report.evals
    # IFEval's four numbers: prompt-level strict is the gated column, the other three are shown beside it
    ifeval_sides = {"bench/ifeval:prompt_loose", "bench/ifeval:instruction_strict", "bench/ifeval:instruction_loose"}
    assert all(ifeval_sides <= set(e.scores) for e in report.evals)
    # the records hold every item of both models, so the paired gain can be recomputed from them
    evals = tmp_path / "store" / "runs" / "ifrl" / "evals"
    records = {p.name: json.loads(p.read_text()) for p in evals.glob("*.json")}
    assert set(records) == {"00-source.json", "00-if_rl.json"}
    for record in records.values():
        ids = {(r["domain"], r["id"]) for r in record["items"]}
        assert {d for d, _ in ids} == columns and len(ids) == 6
    ifeval_rows = [r for r in records["00-if_rl.json"]["items"] if r["domain"] == "bench/ifeval"]
    assert all(
        len(r["details"]["instructions"]) >= 1 for r in ifeval_rows
    )  # per-instruction verdicts, strict and loose
    # the dev items carry IFEval's own instruction ids, so the IFEval checkers grade them
    dev = [r for r in records["00-source.json"]["items"] if r["domain"] == "instruct"]
    assert all(r["id"].startswith("instruct-dev-") for r in dev)
