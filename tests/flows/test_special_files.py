"""A user's file that is a FIFO or a device, or that holds a bad row, named where a recipe, eval data or a benchmark
goes: one line on stderr, exit code 2, nothing written, and nothing waits on it. Before, a FIFO given as `file://`
hung the command on its first read, `file:///dev/zero` was read until memory ran out, and an `eval.benchmarks` file
with a bad row, or a `file://` one that was not there, failed the run at its first eval, after SFT.
"""

import json
import os
from pathlib import Path

import pytest

from tests.flows.test_bad_input import assert_one_line, cascade, files_under

# a FIFO with no writer: opening it for reading waits forever, so a test that reaches such a read ends at its timeout
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "named.jsonl"
    os.mkfifo(path)
    return path


def gsm8k_rows(n: int, bad: int | None = None) -> str:
    row = {"question": "Two plus two?", "answer": "2 + 2 = 4\n#### 4"}
    return "".join(json.dumps({"question": "No answer?"} if i == bad else row) + "\n" for i in range(1, n + 1))


@pytest.mark.parametrize("command", ["eval", "grade"])
@pytest.mark.parametrize(
    "location, kind",
    [("file://{fifo}", "a FIFO"), ("{fifo}", "a FIFO"), ("file:///dev/zero", "a character device")],
    ids=["fifo-url", "fifo-path", "dev-zero"],
)
def test_eval_data_that_is_not_a_regular_file_is_one_line(cascade_home, fifo, command, location, kind):
    data = location.format(fifo=fifo)
    args = ["eval", "tiny"] if command == "eval" else ["grade"]
    code, out, err = cascade(*args, "--benchmark", "gsm8k", "--data", data)
    assert_one_line(code, out, err, f"data file {data} is not a regular file ({kind})")
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "location, message",
    [
        ("file://{fifo}", "recipe file://{fifo} is not a regular file (a FIFO)"),
        ("file:///dev/zero", "recipe file:///dev/zero is not a regular file (a character device)"),
        ("file://{big}", "recipe file://{big} is larger than 1048576 bytes"),
        ("file://{binary}", "recipe file://{binary} is not UTF-8 text"),
    ],
    ids=["fifo", "dev-zero", "over-1mb", "binary"],
)
def test_a_recipe_uri_that_is_not_a_recipe_file_is_one_line(cascade_home, tmp_path, fifo, location, message):
    big, binary = tmp_path / "big.yaml", tmp_path / "binary.yaml"
    big.write_text("# padding\n" * 110_000)
    binary.write_bytes(bytes(range(128, 256)) * 8)
    names = {"fifo": fifo, "big": big, "binary": binary}
    code, out, err = cascade("regression-eval", "--recipe", location.format(**names))
    assert_one_line(code, out, err, message.format(**names))
    assert files_under(cascade_home) == []


def test_the_run_forms_recipe_uri_reads_no_fifo(fifo):
    """The `cascade` deployment's form reads its recipe URI with read_store_uri, as the flow does."""
    from cascade.flows.recipes import RunRequest, read_store_uri, request_recipe
    from cascade.stages.errors import RecipeError

    with pytest.raises(RecipeError) as e:
        request_recipe(RunRequest(recipe_uri=f"file://{fifo}"), read_uri=read_store_uri)
    assert str(e.value) == f"recipe file://{fifo} is not a regular file (a FIFO)"


def test_a_recipe_uri_that_is_a_recipe_still_loads(tmp_path):
    from cascade.flows.recipes import load_any_recipe
    from cascade.stages.recipe.recipe_file import RECIPES_DIR

    recipe = tmp_path / "mine.yaml"
    recipe.write_bytes((RECIPES_DIR / "micro.yaml").read_bytes())
    loaded = load_any_recipe(f"file://{recipe}")
    assert (loaded.name, [s.name for s in loaded.stages][:2]) == ("mine", ["sft_data", "sft"])


@pytest.mark.parametrize(
    "entry, message",
    [
        ("{{file: 'file://{fifo}', format: gsm8k}}", "data file file://{fifo} is not a regular file (a FIFO)"),
        ("{{file: 'file://{missing}', format: gsm8k}}", "data file not found: file://{missing}"),
        ("{{file: '{bad}', format: gsm8k}}", "{bad}: row 51: missing field 'answer'"),
        ("{{file: 'file://{bad}', format: gsm8k}}", "file://{bad}: row 51: missing field 'answer'"),
        ("{{file: '{empty}', format: gsm8k}}", "{empty} holds no items"),
    ],
    ids=["fifo", "missing-url", "row-51", "row-51-url", "empty"],
)
def test_an_eval_benchmark_file_that_cannot_be_evaluated_is_refused_before_any_stage(
    cascade_home, tmp_path, fifo, entry, message
):
    names = {"fifo": fifo, "missing": tmp_path / "no-such.jsonl", "bad": tmp_path / "bad.jsonl"}
    names["empty"] = tmp_path / "empty.jsonl"
    names["bad"].write_text(gsm8k_rows(60, bad=51))
    names["empty"].write_text("\n")
    override = "eval.benchmarks={mine: " + entry.format(**names) + "}"
    assert_one_line(*cascade("run", "micro", override), "eval.benchmarks.mine: " + message.format(**names))
    assert files_under(cascade_home) == []


def test_an_eval_benchmark_file_whose_rows_parse_validates(tmp_path):
    from cascade.flows.recipes import load_recipe

    data = tmp_path / "mine.jsonl"
    data.write_text(gsm8k_rows(60))
    recipe = load_recipe("micro", [f"eval.benchmarks={{mine: {{file: 'file://{data}', format: gsm8k, limit: 3}}}}"])
    assert recipe.eval.benchmarks["mine"].file == f"file://{data}"
