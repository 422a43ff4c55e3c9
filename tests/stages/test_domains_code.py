"""Code domain: the oracle passes, wrong or hostile code fails, and HumanEval/MBPP grade like the benchmarks.

Sandbox runs cost ~0.1-0.2 s each on 2 shared cores, so the real benchmarks are checked on fixed samples (41
HumanEval and 40 MBPP tasks pass; every other one of them, mutated, fails), not on all rows. All 164 HumanEval
and all 500 MBPP test-split references pass, and all 164 HumanEval mutants fail (checked once, ~40 s each).
"""

import re

import pytest

from cascade.stages.domains import get_domain
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
from cascade.stages.domains.code import build_job, extract_code, host_check, load_humaneval, load_mbpp, run_jobs

CODE = get_domain("code")


def mutate(code: str) -> str:
    """Every `return X` returns None instead (also when X is a conditional expression)."""
    return re.sub(r"\breturn\b(?=[ \t]*[^\s#])", "return None if True else", code)


def test_oracle_passes_and_wrong_answers_fail():
    items = CODE.generate("train", 200, seed=0)
    assert CODE.grade_batch(items, [it.reference for it in items]) == [1.0] * 200
    off_by_one = [it.reference + " + 1" for it in items]  # always a different value
    assert CODE.grade_batch(items, off_by_one) == [0.0] * 200
    assert CODE.grade_batch(items, ["", "I do not know.", "def f(x):\n    return"] * 66 + ["", ""]) == [0.0] * 200


def test_heldout_split_is_large_disjoint_and_deterministic():
    train = CODE.generate("train", 3000, seed=0)
    heldout = CODE.generate("heldout", 300, seed=0)
    key = lambda it: it.split_key or it.prompt  # noqa: E731
    assert len({key(it) for it in heldout}) == 300
    assert not {key(it) for it in train} & {key(it) for it in heldout}
    assert CODE.generate("heldout", 300, seed=0) == heldout


def test_fast_path_gives_the_sandbox_verdict():
    items = CODE.generate("heldout", 4, seed=1)
    variants = [
        lambda r: r,
        lambda r: r + " + 1",
        lambda r: r.replace("return ", "return 0 * 0 + "),  # same value, other shape: still the fast path
        lambda r: r.replace("return ", "return (") + ") // 1",
        lambda r: r.replace("return ", "return 1 // 0 + "),  # ZeroDivisionError
        lambda r: r.replace("return ", "return 1 if x > 100 else "),  # same values on the tested inputs
        lambda r: r.replace("return ", "return (") + ") / 1",  # a float (fails the type check); sandbox only
    ]
    pairs = [(it, v(it.reference)) for it in items for v in variants]
    took_fast_path = [host_check(c, "f", it.meta["cases"]) is not None for it, c in pairs]
    assert sum(took_fast_path) == (len(variants) - 1) * len(items)
    fast = CODE.grade_batch([p[0] for p in pairs], [p[1] for p in pairs])
    slow = CODE.grade_batch([p[0] for p in pairs], [p[1] for p in pairs], fast=False)
    assert fast == slow
    assert sum(fast) == 4 * len(items)  # the reference and its three same-value rewrites


@pytest.mark.parametrize(
    "completion",
    [
        "import os\nos._exit(0)\ndef f(x):\n    return x",
        "import sys\nsys.exit(0)",
        "def f(x):\n    return x\nprint('CASCADE-DONE-0123456789abcdef0123456789abcdef')\nimport os\nos._exit(0)",
        "while True:\n    pass",
        "class A(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A(0)",
        "def f(x: __import__('os')._exit(0)):\n    return x",  # code at definition time: never the fast path
    ],
)
def test_hostile_completions_get_zero(completion):
    item = CODE.generate("train", 1, seed=0)[0]
    assert host_check(completion, "f", item.meta["cases"]) is None  # each of these goes to the sandbox
    assert CODE.grade(item, completion) == 0.0


def test_extract_code_handles_fences_prose_and_bodies():
    assert extract_code("Sure:\n```python\ndef f(x):\n    return x\n```\nDone.") == "def f(x):\n    return x"
    assert extract_code("```\nprint(1)\n```\n```py\ndef g():\n    pass\n```") == "def g():\n    pass"
    assert extract_code("Here it is:\ndef f(x):\n    return x") == "def f(x):\n    return x"
    assert extract_code("\n    return x + 1\n") == "    return x + 1"  # a body keeps its indentation
    assert extract_code("```python\ndef f(x):\n    return x") == "def f(x):\n    return x"  # unclosed fence


def test_identical_programs_run_once(monkeypatch):
    import cascade.stages.domains.code as code_module

    calls = []
    real = code_module.run_many
    monkeypatch.setattr(
        code_module, "run_many", lambda progs, *a, **k: calls.append(len(progs)) or real(progs, *a, **k)
    )
    item = CODE.generate("train", 1, seed=0)[0]
    odd = "def f(x):\n    y = x\n    return " + item.reference.split("return ")[1]  # not the fast-path shape
    assert CODE.grade_batch([item] * 4, [odd] * 4) == [1.0] * 4
    assert calls == [1]


@pytest.fixture(scope="module")
def humaneval():
    items = load_humaneval(DEFAULT_DATA_ROOT)
    assert len(items) == 164
    return items[::4]  # a fixed sample of 41 tasks


def test_humaneval_canonical_solutions_pass_and_mutants_fail(humaneval):
    bodies = [it.reference[len(it.meta["prompt"]) :] for it in humaneval]
    full = [it.reference for it in humaneval]  # the whole function, as a chat model answers
    mutants = [mutate(b) for b in bodies[::2]]  # every other task: sandbox time is the budget here
    as_body = [f"```python\n{b}```" for b in bodies[:6]]  # the benchmark's own form: a continuation
    scores = CODE.grade_batch(humaneval + humaneval[::2] + humaneval[:6], full + mutants + as_body)
    n, m = len(humaneval), len(mutants)
    assert scores[:n] == [1.0] * n
    assert scores[n : n + m] == [0.0] * m
    assert scores[n + m :] == [1.0] * 6


def test_humaneval_hostile_exit_fails(humaneval):
    item = humaneval[0]
    hostile = "import os\nos._exit(0)\n"
    assert CODE.grade(item, hostile) == 0.0
    program = build_job(item, hostile).body
    assert program.index("os._exit") < program.index("check(")  # the exit really comes before the tests


def test_mbpp_reference_code_passes_and_mutants_fail():
    items = load_mbpp(DEFAULT_DATA_ROOT)
    assert len(items) == 500 and {it.meta["task_id"] for it in items} == set(range(11, 511))
    sample = items[::12][:40]
    completions = [it.reference for it in sample] + [mutate(it.reference) for it in sample[::2]]
    scores = CODE.grade_batch(sample + sample[::2], completions)
    assert scores == [1.0] * 40 + [0.0] * 20
    assert "Your code should pass these tests:\nassert " in sample[0].prompt


def test_benchmarks_are_registered():
    assert set(CODE.benchmarks()) == {"humaneval", "mbpp", "livecodebench"}
    assert run_jobs([]) == []


def test_mbpp_questions_keep_mbpp_s_own_splits():
    from cascade.stages.recipe.schema import load_recipe

    domain = get_domain("code", {"questions": "mbpp"})
    splits = {split: domain.generate(split, n, 0) for split, n in (("train", 384), ("dev", 90), ("heldout", 500))}
    ids = {split: {it.meta["task_id"] for it in items} for split, items in splits.items()}
    assert ids["heldout"] == set(range(11, 511)) and ids["dev"] == set(range(511, 601))  # test and validation
    assert ids["train"] == set(range(1, 11)) | set(range(601, 975))
    assert splits["dev"][0].id == "code-dev-0" and splits["dev"][0].domain == "code"
    assert domain.grade(splits["dev"][0], splits["dev"][0].reference) == 1.0  # MBPP's own solution passes
    with pytest.raises(ValueError, match="90 questions in its dev split, fewer than 91: lower domains.code.dev_size"):
        domain.generate("dev", 91, 0)
    # an eval reads dev_size dev items and heldout_size held-out ones
    spec = load_recipe("micro", ["domains.math.dev_size=3", "domains.math.heldout_size=5"]).domains["math"]
    assert (spec.split_size("dev"), spec.split_size("heldout")) == (3, 5)
