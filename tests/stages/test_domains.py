"""Synthetic domains: oracle answers pass their grader, wrong answers fail, splits never overlap."""

import pytest

from cascade.stages.domains import Item, get_domain
from cascade.stages.domains.instruct import check
from cascade.stages.domains.math import boxed_answer


@pytest.mark.parametrize("name", ["math", "instruct", "chat"])
def test_oracle_passes_and_splits_are_disjoint(name):
    """Train, dev and held-out never share a problem, and each eval split has the 800 items the recipes read."""
    domain = get_domain(name)
    train = domain.generate("train", 1000, seed=0)
    dev = domain.generate("dev", 800, seed=0)
    heldout = domain.generate("heldout", 800, seed=0)
    assert all(domain.grade(it, it.reference) == 1.0 for it in train + dev + heldout)
    key = lambda it: it.split_key or it.prompt  # noqa: E731
    keys = {split: {key(i) for i in items} for split, items in (("train", train), ("dev", dev), ("heldout", heldout))}
    assert not keys["train"] & keys["heldout"] and not keys["train"] & keys["dev"] and not keys["dev"] & keys["heldout"]
    assert len(keys["heldout"]) == len(keys["dev"]) == 800
    assert domain.generate("heldout", 800, seed=0) == heldout  # deterministic
    assert {it.id.split("-")[1] for it in dev} == {"dev"}


def test_an_item_split_is_a_fixed_hash_bucket_of_its_key():
    from cascade.stages.domains.base import split_of

    buckets = [split_of(f"problem {i}") for i in range(20_000)]
    shares = {s: buckets.count(s) / len(buckets) for s in ("train", "dev", "heldout")}
    assert shares["dev"] == pytest.approx(0.1, abs=0.01) and shares["heldout"] == pytest.approx(0.1, abs=0.01)
    assert split_of("problem 7") == split_of("problem 7")


def test_math_grader_rejects_wrong_and_unboxed_answers():
    item = get_domain("math").generate("heldout", 1, seed=0)[0]
    right = int(item.meta["answer"])
    grade = get_domain("math").grade
    assert grade(item, f"\\boxed{{{right}}}") == 1.0
    assert grade(item, f"\\boxed{{{right + 1}}}") == 0.0
    assert grade(item, str(right)) == 0.0
    assert boxed_answer("\\boxed{1} then \\boxed{-7}") == "-7"


def test_math_grades_parse_the_gold_once_and_give_uncached_verdicts(monkeypatch):
    """A group's grades parse its gold answer once (parsed_gold) and each completion once; every verdict equals
    math-verify's on a fresh parse of both."""
    import math_verify

    from cascade.stages.domains import math as math_domain

    item = get_domain("math").generate("train", 1, seed=3)[0]
    gold = item.meta["answer"]
    answers = [f"{int(gold) + d}" for d in (0, 1, -1)] + [f"\\frac{{{2 * int(gold)}}}{{2}}", f"{gold}.0", "x"]
    completions = [f"so \\boxed{{{a}}}" for a in answers] * 4
    expected = [
        float(bool(math_verify.verify(math_verify.parse(f"\\boxed{{{gold}}}"), math_verify.parse(c))))
        for c in completions
    ]
    assert expected[:6] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    math_domain.parsed_gold.cache_clear()
    parsed = []
    real_parse = math_verify.parse
    monkeypatch.setattr(math_verify, "parse", lambda text, **kw: parsed.append(text) or real_parse(text, **kw))
    assert [get_domain("math").grade(item, c) for c in completions] == expected
    assert parsed.count(f"\\boxed{{{gold}}}") == 1  # the gold once; "\\boxed{gold}" completions skip parsing
    assert len(parsed) == 1 + sum(a != gold for a in answers) * 4


@pytest.mark.parametrize(
    "kind, n, word, text, ok",
    [
        ("lowercase", 3, "", "one two three", True),
        ("lowercase", 3, "", "one Two three", False),
        ("lowercase", 3, "", "one two", False),
        ("capitals", 2, "", "SUN LIGHT", True),
        ("capitals", 2, "", "SUN light", False),
        ("end_with", 4, "rain", "cold wet grey rain.", True),
        ("end_with", 4, "rain", "rain cold wet grey", False),
        ("start_with", 2, "sea", "sea blue", True),
        ("include", 3, "salt", "blue salt sea", True),
        ("include", 3, "salt", "blue salty sea", False),
        ("bullets", 2, "", "- a\n- b", True),
        ("bullets", 2, "", "- a\n* b", False),
        ("bullets", 2, "", "- a\n- b\n- c", False),
    ],
)
def test_instruct_checks(kind, n, word, text, ok):
    assert check(kind, n, word, text) is ok


@pytest.mark.parametrize(
    "kind, n, word, text, credit",
    [
        ("lowercase", 3, "", "one two three", 1.0),  # what `check` passes scores 1
        ("lowercase", 4, "", "one two", (0.5 + 1) / 2),  # half the count, the case right
        ("lowercase", 2, "", "One two", (1 + 0) / 2),
        ("end_with", 4, "rain", "rain cold wet grey grey grey", (0.5 + 0) / 2),  # 6 words for 4: 1 - 2/4
        ("bullets", 2, "", "- a\n* b\n- c", (0.5 + 0) / 2),
        ("capitals", 2, "", "a b c d e f", 0.0),  # 3x the count: nearness floored at 0
    ],
)
def test_instruct_partial_credit_by_hand(kind, n, word, text, credit):
    domain = get_domain("instruct", {"credit": "partial"})
    assert domain.grade(Item("instruct", "", "", "", {"kind": kind, "n": n, "word": word}), text) == credit


def test_partial_credit_is_refused_for_ifeval_items():
    with pytest.raises(ValueError, match="credit: partial grades the templated"):
        get_domain("instruct", {"credit": "partial", "generator": "ifeval"})


def test_unknown_domain_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown domain 'chess'"):
        get_domain("chess")


def test_a_split_that_runs_out_fails_at_once_whatever_size_was_asked():
    """A train_size beyond what a generator has (1e8 math items: 7,027 exist) once drew 50 n times, for hours."""
    import time

    started = time.monotonic()
    with pytest.raises(ValueError, match=r"cannot produce 10,000,000 distinct dev items \(found 8"):
        get_domain("math").generate("dev", 10_000_000, seed=0)
    assert time.monotonic() - started < 60
