"""Multi-domain on-policy steps blend domains by `domain_weights`, as the paper's multi-domain RL does (MCQA 55%,
tool calling 30%, structured output 15%)."""

import re
from collections import Counter

import pytest

from cascade.stages.domains import Item, get_domain
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.train.context import ListSink
from cascade.stages.train.rollout import sample_prompts, weighted_counts
from tests.stages.test_training import SMALL, stage_ctx

BLEND = {"mcqa": 0.55, "tool": 0.30, "structured": 0.15}


def test_counts_split_by_largest_remainder():
    # 16 x (.55, .30, .15) = 8.8, 4.8, 2.4: floors 8, 4, 2 leave 2, given to the two largest remainders
    assert weighted_counts(16, BLEND) == {"mcqa": 9, "tool": 5, "structured": 2}
    # 70.4, 38.4, 19.2: floors 70, 38, 19 leave 1; mcqa and tool tie at .4, and the tie goes by name
    assert weighted_counts(128, BLEND) == {"mcqa": 71, "tool": 38, "structured": 19}
    assert weighted_counts(3, {"a": 1, "b": 1, "c": 1}) == {"a": 1, "b": 1, "c": 1}
    assert weighted_counts(5, {"a": 2, "b": 0}) == {"a": 5, "b": 0}


def test_weighted_draw_takes_each_domains_share_without_replacement():
    pool = [it for d in BLEND for it in get_domain(d).generate("train", 40, 0)]
    drawn = sample_prompts(pool, 16, 0, "multi", 3, BLEND)
    assert Counter(it.domain for it in drawn) == {"mcqa": 9, "tool": 5, "structured": 2}
    assert len({(it.domain, it.id, it.prompt) for it in drawn}) == 16
    assert drawn == sample_prompts(pool, 16, 0, "multi", 3, BLEND)  # a resumed step draws the same prompts
    assert drawn != sample_prompts(pool, 16, 0, "multi", 4, BLEND)
    with pytest.raises(ValueError, match="domain 'structured' has 40 prompts, fewer than its 41"):
        sample_prompts(pool, 41, 0, "multi", 0, {"structured": 1.0})


def multi_recipe(tmp_path, **grpo):
    return validate_recipe(
        {
            "seed": 0,
            "storage": {"root": f"file://{tmp_path}/store"},
            "model": SMALL.model_dump(),
            "compute": {"dtype": "fp32"},
            "domains": {d: {"train_size": 64, "heldout_size": 8, "max_new_tokens": 8} for d in BLEND},
            "stages": [
                {
                    "kind": "grpo",
                    "name": "multi",
                    "domains": list(BLEND),
                    "steps": 2,
                    "prompts_per_step": 16,
                    "group_size": 2,
                    "checkpoint_every": 0,
                    "domain_weights": BLEND,
                    **grpo,
                }
            ],
        }
    )


def test_a_multi_domain_stage_trains_on_the_blend(tmp_path):
    recipe = multi_recipe(tmp_path)
    sink = ListSink()
    run_grpo(recipe.stage("multi"), stage_ctx(recipe, tmp_path, "multi", sink), StageInputs())
    assert len(sink.series("reward")) == 2
    for domain in BLEND:  # every domain of the blend was sampled and scored by its own grader every step
        assert len(sink.series(f"reward/{domain}")) == 2


@pytest.mark.parametrize(
    "weights, message",
    [
        ({"mcqa": 0.5, "math": 0.5}, "weighs domain(s) ['math'] it does not train on"),
        ({"mcqa": 0.0, "tool": 0.0}, "domain_weights must not all be 0"),
        ({"mcqa": -0.1}, "greater than or equal to 0"),
    ],
)
def test_bad_weights_are_refused(tmp_path, weights, message):
    with pytest.raises((RecipeError, ValueError), match=re.escape(message)):
        multi_recipe(tmp_path, domain_weights=weights)


def test_weights_default_to_none():
    assert GRPOConfig(name="x", domains=["math"]).domain_weights is None


def test_a_floor_gives_every_domain_its_minimum_and_shares_the_rest_by_weight():
    # 16 x (0.55, 0.30, 0.15) = 8.8, 4.8, 2.4: structured is raised to 4, the other 12 split 0.55:0.30 =
    # 7.76, 4.24 -> 8, 4 (largest remainder)
    assert weighted_counts(16, BLEND, floor=4) == {"mcqa": 8, "structured": 4, "tool": 4}
    # tool's share of the remaining 12 (4.24) clears the floor; with floor 5 both small domains are raised
    assert weighted_counts(16, BLEND, floor=5) == {"mcqa": 6, "structured": 5, "tool": 5}
    assert weighted_counts(16, BLEND, floor=0) == weighted_counts(16, BLEND)
    assert weighted_counts(5, {"a": 2, "b": 0}, floor=2) == {"a": 5, "b": 0}  # weight 0 stays 0
    with pytest.raises(ValueError, match="cannot give 3 domains 6 each"):
        weighted_counts(16, BLEND, floor=6)


def test_a_floor_without_weights_shares_by_pool_size():
    pool = [Item(d, f"{d}{i}", f"{d} prompt {i}", "") for d, n in (("big", 90), ("small", 10)) for i in range(n)]
    drawn = sample_prompts(pool, 10, 0, "multi", 0, None, floor=3)
    assert Counter(it.domain for it in drawn) == {"big": 7, "small": 3}  # 9 : 1 by pool, small raised to 3


def test_a_floor_too_large_for_the_step_is_refused_by_the_recipe():
    from cascade.flows.recipes import load_recipe
    from cascade.stages.recipe.schema import RecipeError

    with pytest.raises(RecipeError, match="min_prompts_per_domain 3 x 2 domains is more than prompts_per_step 4"):
        load_recipe("micro", ["stages.math_rl.domains=[math, instruct]", "stages.math_rl.min_prompts_per_domain=3"])
