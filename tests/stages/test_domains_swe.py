"""SWE domain: the fix passes, the bug (and other wrong fixes) fail, the shown test really fails, and hostile
completions get nothing."""

import pytest

from stages.domains import get_domain
from stages.domains.code import host_check

SWE = get_domain("swe")


def test_oracle_fix_passes_and_the_bug_fails():
    items = SWE.generate("train", 200, seed=0)
    assert {it.meta["family"] for it in items} == {"boundary", "sign"}
    assert SWE.grade_batch(items, [it.reference for it in items]) == [1.0] * 200
    assert SWE.grade_batch(items, [it.meta["buggy"] for it in items]) == [0.0] * 200
    assert SWE.grade_batch(items, [it.reference + " + 1" for it in items]) == [0.0] * 200


def test_the_shown_test_fails_on_the_bug_and_passes_on_the_fix():
    for item in SWE.generate("heldout", 100, seed=3):
        code, test = item.prompt.rsplit("\n", 1)
        assert code == item.meta["buggy"] and test.startswith("assert f(")
        x, want = (int(v) for v in test.removeprefix("assert f(").split(") == "))
        assert [x, want] in item.meta["cases"]
        assert host_check(item.meta["buggy"], "f", [[x, want]]) == 0.0
        assert host_check(item.reference, "f", [[x, want]]) == 1.0


def test_heldout_split_is_large_disjoint_and_deterministic():
    train = SWE.generate("train", 3000, seed=0)
    heldout = SWE.generate("heldout", 300, seed=0)
    key = lambda it: it.split_key or it.prompt  # noqa: E731
    assert len({key(it) for it in heldout}) == 300
    assert not {key(it) for it in train} & {key(it) for it in heldout}
    assert SWE.generate("heldout", 300, seed=0) == heldout


def test_fast_path_gives_the_sandbox_verdict():
    items = SWE.generate("heldout", 10, seed=1)
    completions = [it.reference for it in items] + [it.meta["buggy"] for it in items]
    fenced = [f"Fixed:\n```python\n{it.reference}\n```" for it in items]
    fast = SWE.grade_batch(items * 3, completions + fenced)
    assert fast == SWE.grade_batch(items * 3, completions + fenced, fast=False)
    assert SWE.grade_batch(items, fenced) == [1.0] * 10


@pytest.mark.parametrize(
    "completion",
    [
        "import os\nos._exit(0)",
        "def f(x):\n    import os\n    os._exit(0)",
        "while True:\n    pass",
        "class A(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A(0)",
    ],
)
def test_hostile_completions_get_zero(completion):
    item = SWE.generate("train", 1, seed=0)[0]
    assert SWE.grade(item, completion) == 0.0
