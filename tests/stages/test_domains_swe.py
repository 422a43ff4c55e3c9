"""SWE, agentless: the oracle edit passes, the unedited repository and wrong edits fail, malformed edits score 0
and say why, an edit that breaks a correct function fails, the fast path gives the sandbox's verdict, and hostile
edits get nothing."""

import hashlib

import pytest

from cascade.stages.domains import get_domain
from cascade.stages.domains.swe import render_edit

SWE = get_domain("swe")


def test_the_oracle_edit_passes_and_the_bug_fails():
    items = SWE.generate("train", 60, seed=0)
    assert {it.meta["family"] for it in items} == {"boundary", "sign"}
    assert SWE.grade_batch(items, [it.reference for it in items]) == [1.0] * 60
    no_op = [render_edit(it.meta["bug_file"], *[it.reference.split("\n")[2]] * 2) for it in items]
    assert SWE.grade_batch(items, no_op) == [0.0] * 60  # applies, changes nothing: the bug stays
    assert SWE.grade_batch(items, [it.reference.replace("\n>>>>>>>", " + 1\n>>>>>>>") for it in items]) == [0.0] * 60


def test_the_shown_test_names_the_buggy_module_and_fails_on_it():
    for item in SWE.generate("heldout", 30, seed=3):
        files = item.meta["files"]
        test = files["tests/test_shop.py"]
        module = item.meta["bug_file"].removesuffix(".py").replace("/", ".")
        assert f"from {module} import {item.meta['bug_function']}\n" in test
        assert f"FAILED tests/test_shop.py::test_{item.meta['bug_function']}\n" in item.prompt
        assert all(f"--- {path}\n" in item.prompt for path in files)
        decoys = [n for m, fns in item.meta["hidden"].items() for n, _ in fns if n != item.meta["bug_function"]]
        assert len(decoys) == 4  # localization is part of the task


def test_malformed_edits_score_zero_and_say_why():
    item = SWE.generate("train", 1, seed=1)[0]
    path, search = item.meta["bug_file"], item.reference.split("\n")[2]
    cases = {
        "the whole fixed function, no edit": "def f(x):\n    return 1",
        "an edit of a file that does not exist": render_edit("shop/nope.py", search, search),
        "a SEARCH text that is not in the file": render_edit(path, "    return 12345", "    return 0"),
        "an unterminated block": item.reference.rsplit("\n", 1)[0],
    }
    reasons = {"no SEARCH/REPLACE block", "no file shop/nope.py in the repository", "SEARCH text not found"}
    for why, completion in cases.items():
        details = SWE.grade_details(item, completion)
        assert details["score"] == 0.0 and details["malformed"] in reasons, why
    assert SWE.grade_details(item, item.reference) == {"score": 1.0, "malformed": None}
    assert SWE.summarize_details(
        [{"malformed": None}, {"malformed": "x"}, {"malformed": "y"}, {"malformed": None}]
    ) == {"malformed_rate": 0.5}


def test_the_fix_fails_when_a_correct_function_is_broken():
    """The hidden tests cover every function (SWE-bench's PASS_TO_PASS): with a decoy broken in the repository,
    the right fix no longer passes, on the fast path and in the sandbox."""
    from dataclasses import replace

    item = SWE.generate("train", 1, seed=2)[0]
    module, (name, _) = next(
        (m, fn) for m, fns in item.meta["hidden"].items() for fn in fns if fn[0] != item.meta["bug_function"]
    )
    files = dict(item.meta["files"])
    head = f"def {name}(x):\n    return "
    at = files[module].index(head) + len(head)
    files[module] = files[module][:at] + "12345 + " + files[module][at:]
    broken = replace(item, meta={**item.meta, "files": files})
    assert SWE.grade(item, item.reference) == 1.0
    assert SWE.grade_batch([broken], [item.reference]) == [0.0]
    assert SWE.grade_batch([broken], [item.reference], fast=False) == [0.0]
    second_hunk = item.reference + "\n\n" + render_edit(module, "12345", "0")
    assert SWE.grade(item, second_hunk) == 1.0  # one hunk per answer: the first block is the one applied


def test_fast_path_gives_the_sandbox_verdict():
    items = SWE.generate("heldout", 8, seed=1)
    edits = [it.reference for it in items] + [it.reference.replace("\n>>>>>>>", " + 1\n>>>>>>>") for it in items]
    fenced = [f"Here is the fix:\n```\n{it.reference}\n```" for it in items]
    fast = SWE.grade_batch(items * 3, edits + fenced)
    assert fast == SWE.grade_batch(items * 3, edits + fenced, fast=False)
    assert fast == [1.0] * 8 + [0.0] * 8 + [1.0] * 8


@pytest.mark.parametrize(
    "replace",
    [
        "    import os; os._exit(0)",
        "    while True: pass",
        "    class A(int):\n        def __eq__(self, o): return True\n    return A(0)",
    ],
)
def test_hostile_edits_get_zero(replace):
    item = SWE.generate("train", 1, seed=0)[0]
    search = item.reference.split("\n")[2]
    assert SWE.grade(item, render_edit(item.meta["bug_file"], search, replace)) == 0.0


def test_heldout_split_is_disjoint_and_deterministic():
    train = SWE.generate("train", 2000, seed=0)
    heldout = SWE.generate("heldout", 300, seed=0)
    key = lambda it: it.split_key or it.prompt  # noqa: E731
    assert len({key(it) for it in heldout}) == 300
    assert not {key(it) for it in train} & {key(it) for it in heldout}
    assert SWE.generate("heldout", 300, seed=0) == heldout


def test_a_smaller_repository_keeps_the_task_and_the_default_items_stay_as_they_were():
    """`num_modules`/`num_functions` shrink the repository for a smaller model (tiny-paper: one module, two
    functions); the defaults draw the very items of the fixed five-function, two-module repositories."""
    from cascade.stages.domains.swe import SWEDomain

    small = SWEDomain(num_modules=1, num_functions=2).generate("train", 40, seed=0)
    assert all(sorted(it.meta["files"]) == ["shop/rules.py", "tests/test_shop.py"] for it in small)
    assert all(sum(len(fns) for fns in it.meta["hidden"].values()) == 2 for it in small)
    assert SWE.grade_batch(small, [it.reference for it in small]) == [1.0] * 40
    assert SWE.grade_batch(small, ["shop/rules.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE"] * 40) == [0.0] * 40
    default = SWEDomain().generate("heldout", 5, seed=3)
    drawn = "|".join(it.prompt + it.reference for it in default)
    assert hashlib.sha256(drawn.encode()).hexdigest()[:16] == "b336a055f7b3c982"  # as drawn before the options
    assert all(len(it.meta["files"]) == 3 for it in default)
    with pytest.raises(ValueError, match="num_functions"):
        SWEDomain(num_modules=2, num_functions=1)
