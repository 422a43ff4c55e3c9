"""`teachers: auto`: a planned MOPD stage takes, per domain, the checkpoint with the best held-out score so far,
chosen from the run's evals when the stage starts (the rule the gate's recovery uses)."""

import pytest

from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe
from cascade.stages.evals.gate import best_stages
from cascade.stages.recipe.schema import RecipeError, validate_recipe

MICRO = ["stages.sft.steps=3", "stages.if_rl.steps=1", "stages.math_rl.steps=1", "tracking.enabled=false"]


def auto_recipe(tmp_path, **mopd):
    raw = load_recipe("micro", [f"storage.root=file://{tmp_path}/store", *MICRO]).model_dump(mode="json")
    raw["stages"].append(
        {
            "kind": "mopd",
            "name": "mopd",
            "teachers": "auto",
            "steps": 1,
            "prompts_per_step": 4,
            "group_size": 2,
            "checkpoint_every": 0,
            **mopd,
        }
    )
    return validate_recipe(raw)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_auto_teachers_are_the_best_checkpoint_per_domain_so_far(tmp_path):
    report = cascade_flow(auto_recipe(tmp_path), "auto")
    before = [e for e in report.evals if e.after_stage != "mopd"]
    assert [e.after_stage for e in before] == ["sft", "if_rl", "math_rl"]
    expected = best_stages(before, ["instruct", "math"])
    assert set(expected) == {"instruct", "math"}
    mopd = next(s for s in report.stages if s.name == "mopd")
    assert mopd.status == "completed" and mopd.metrics["teachers"] == expected
    for domain, stage in expected.items():  # the chosen one really holds the best score
        assert max(e.scores[domain] for e in before) == next(e.scores[domain] for e in before if e.after_stage == stage)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"stages": "only-mopd"}, "teachers: auto needs an earlier model stage"),
        ({"eval": {"enabled": False}}, "teachers: auto chooses from the evals, but eval.enabled is false"),
        ({"mopd_domains": ["code"]}, "names domain(s) ['code'] not declared"),
    ],
)
def test_auto_teachers_bad_input(tmp_path, change, message):
    raw = auto_recipe(tmp_path).model_dump(mode="json")
    if change.get("stages") == "only-mopd":
        raw["stages"] = [raw["stages"][-1]]
    if "eval" in change:
        raw["eval"] = change["eval"]
    if "mopd_domains" in change:
        raw["stages"][-1]["domains"] = change["mopd_domains"]
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        validate_recipe(raw)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_the_model_source_can_teach_a_domain(tmp_path):
    """`source` as a teacher is the model the recipe starts from (what `teachers: auto` picks where the source's
    own eval holds a domain's best score): no stage's checkpoint, and nothing for the walk to hand over."""
    recipe = auto_recipe(tmp_path, teachers={"math": "source", "instruct": "sft"})
    assert [r.stage for r in recipe.stage("mopd").reads()] == ["sft"]
    report = cascade_flow(recipe, "src")
    mopd = next(s for s in report.stages if s.name == "mopd")
    assert mopd.status == "completed" and mopd.metrics["teachers"] == {"instruct": "sft", "math": "source"}
