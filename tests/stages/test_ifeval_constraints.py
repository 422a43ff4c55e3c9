"""The IF-RL generator: IFEval's instruction types with arguments its checkers take, families that never clash,
and no 13-token window shared with any of the 541 IFEval prompts."""

import json
import random

import pytest

from cascade.stages.domains import get_domain
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
from cascade.stages.domains.ifeval_constraints import (
    CONSTRAINTS,
    IFEVAL_FILE,
    draw_constraints,
    overlaps_ifeval,
    token_windows,
)
from cascade.stages.domains.instruction_checkers import build_checker, checker_classes

IFEVAL_PROMPTS = [json.loads(line)["prompt"] for line in (DEFAULT_DATA_ROOT / IFEVAL_FILE).open()]


@pytest.fixture(scope="module")
def constrained():
    return get_domain("instruct", {"generator": "ifeval"})


def test_every_type_is_an_ifeval_checker_and_every_drawn_argument_builds_it():
    assert set(CONSTRAINTS) <= set(checker_classes("ifeval"))
    rng = random.Random(3)
    seen = set()
    for _ in range(400):
        prompt, ids, kwargs = draw_constraints(rng)
        assert 1 <= len(ids) <= 3 and len(ids) == len(kwargs) == len(set(ids))
        for instruction_id, args in zip(ids, kwargs):
            checker = build_checker(instruction_id, args, prompt)
            # the checker kept our arguments, not random ones of its own
            assert {k: v for k, v in (checker.get_instruction_args() or {}).items() if k in args} == args
            seen.add(instruction_id)
    assert seen == set(CONSTRAINTS)  # 400 draws reach every type


def test_an_item_never_holds_two_types_of_one_family():
    rng = random.Random(5)
    for _ in range(500):
        _, ids, _ = draw_constraints(rng)
        families = [CONSTRAINTS[i][0] for i in ids]
        for a in range(len(families)):
            for b in range(a + 1, len(families)):
                assert not families[a] & families[b], ids


def test_no_generated_prompt_shares_a_13_token_window_with_ifeval(constrained):
    ifeval = set().union(*(token_windows(p) for p in IFEVAL_PROMPTS))
    items = constrained.generate("train", 1500, 0) + constrained.generate("dev", 300, 0)
    assert len({it.prompt for it in items}) == 1800
    assert all(token_windows(it.prompt).isdisjoint(ifeval) for it in items)
    # and the check does find overlap: an IFEval prompt, and 13 of its words inside another request
    assert overlaps_ifeval(IFEVAL_PROMPTS[7], DEFAULT_DATA_ROOT)
    words = IFEVAL_PROMPTS[0].split()[:13]
    assert overlaps_ifeval("Write a short story. " + " ".join(words) + " Thanks.", DEFAULT_DATA_ROOT)


def test_a_draw_that_overlaps_ifeval_is_drawn_again(constrained, monkeypatch):
    from cascade.stages.domains import ifeval_constraints

    draws = iter(
        [
            (IFEVAL_PROMPTS[3], ["punctuation:no_comma"], [{}]),
            ("Write a poem. Use no commas.", ["punctuation:no_comma"], [{}]),
        ]
    )
    monkeypatch.setattr(ifeval_constraints, "draw_constraints", lambda rng: next(draws))
    item = constrained.sample(random.Random(0))
    assert item.prompt == "Write a poem. Use no commas."


def test_items_are_graded_by_the_ifeval_checkers(constrained):
    item = next(
        it for it in constrained.generate("train", 200, 1) if it.meta["instruction_id_list"] == ["punctuation:no_comma"]
    )
    assert item.meta["benchmark"] == "ifeval" and item.meta["kwargs"] == [{}]
    assert constrained.grade(item, "A calm day by the sea. Nothing more.") == 1.0
    assert constrained.grade(item, "A calm day, by the sea.") == 0.0


def test_an_unknown_generator_and_a_missing_ifeval_file_are_one_line_each(tmp_path):
    with pytest.raises(ValueError, match="unknown instruct generator 'ifevall'; known: templated, ifeval"):
        get_domain("instruct", {"generator": "ifevall"})
    domain = get_domain("instruct", {"generator": "ifeval", "data_root": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="ifeval_input_data.jsonl: the IFEval prompts that generated"):
        domain.sample(random.Random(0))
