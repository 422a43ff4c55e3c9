"""`eval.benchmarks` takes a user's file beside the registered names: the key names the column, `format` the row
format and grader (a registered benchmark or a domain), and the recipe refuses what cannot load before any stage."""

import json

import pytest

from cascade.flows.recipes import load_recipe
from cascade.stages.engines.interface import Completion
from cascade.stages.evals.evaluate import evaluate_benchmarks
from cascade.stages.recipe.schema import RecipeError
from cascade.stages.train.tokenizer import load_tokenizer


class Answers:
    """Answers every prompt with a fixed text."""

    batch_size = 64

    def __init__(self, text: str):
        self.text = text

    def generate(self, prompts, n, sampling, seeds=None, progress=None):
        if progress is not None:
            progress(len(prompts), len(prompts))
        return [[Completion([], [], self.text, "stop") for _ in range(n)] for _ in prompts]


def test_a_users_item_file_is_a_benchmark_column_graded_by_its_domain(tmp_path):
    rows = [{"prompt": f"Compute {a}+{a}.", "meta": {"answer": str(2 * a)}, "id": f"q{a}"} for a in (1, 2, 3)]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = load_recipe("micro", [f"eval.benchmarks={{mine: {{file: {data}, format: math, tolerance: 0.02}}}}"])
    assert "bench/mine" not in recipe.tolerances()  # a test column gates only where the recipe says so
    gated = load_recipe("micro", [f"eval.benchmarks={{mine: {{file: {data}, format: math, gates: true}}}}"])
    assert gated.tolerances()["bench/mine"] == 0.05
    seen = []
    progress = lambda part: lambda done, total: seen.append((part, done, total))  # noqa: E731
    scores, items = evaluate_benchmarks(Answers("so \\boxed{4}"), load_tokenizer(), recipe, progress)
    assert seen[-1] == ("mine", 3, 3)  # the eval's progress, per benchmark, in items
    assert scores == {"bench/mine": pytest.approx(1 / 3)}  # only 2+2 is 4
    assert [(r["domain"], r["id"], r["score"]) for r in items] == [
        ("bench/mine", "q1", 0.0),
        ("bench/mine", "q2", 1.0),
        ("bench/mine", "q3", 0.0),
    ]


def test_a_file_in_a_registered_benchmarks_own_format(tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text(
        json.dumps({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\n#### 5"}) + "\n"
    )
    recipe = load_recipe("micro", [f"eval.benchmarks={{my_gsm: {{file: {data}, format: gsm8k}}}}"])
    scores, _ = evaluate_benchmarks(Answers("\\boxed{5}"), load_tokenizer(), recipe)
    assert scores == {"bench/my_gsm": 1.0}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("mine: {limit: 3}", "eval.benchmarks.mine: unknown benchmark 'mine'; known: "),
        ("gsm8k: {format: math}", "eval.benchmarks.gsm8k: `format` names the format of a `file`; this entry has no"),
        ("mine: {file: FILE, format: chess}", "eval.benchmarks.mine: format 'chess' is neither a benchmark ("),
        ("mine: {file: FILE}", "eval.benchmarks.mine: format 'mine' is neither a benchmark ("),
        ("mine: {file: /no/such.jsonl, format: math}", "eval.benchmarks.mine: data file not found: /no/such.jsonl"),
    ],
)
def test_a_benchmark_column_that_cannot_load_is_one_line(tmp_path, entry, message):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"prompt": "x", "meta": {"answer": "1"}}\n')
    with pytest.raises(RecipeError) as err:
        load_recipe("micro", [f"eval.benchmarks={{{entry.replace('FILE', str(data))}}}"])
    assert message in str(err.value) and "\n" not in str(err.value)
