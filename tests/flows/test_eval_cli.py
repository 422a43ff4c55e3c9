"""`cascade eval --benchmark` and `cascade grade`, through the real console entry point."""

import json

from tests.flows.test_cli import cascade, files_under


def test_grade_reports_the_bad_row_and_grades_the_others(tmp_path):
    rows = [
        {"question": "Two plus two?", "answer": "2+2=4\n#### 4", "completion": "It is \\boxed{4}."},
        {"question": "Three plus three?", "completion": "\\boxed{6}"},  # bad: no gold answer
        {"question": "Ten minus one?", "answer": "#### 9", "completion": "\\boxed{8}"},
    ]
    data = tmp_path / "completions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = cascade("grade", "--benchmark", "gsm8k", "--data", str(data), "--json", home=tmp_path / "home")
    assert result.returncode == 1, result.stderr  # 1: some rows could not be graded
    out = json.loads(result.stdout)
    assert out["errors"] == [{"row": 2, "error": "missing field 'answer'"}]
    assert [(r["row"], r["verdict"]) for r in out["rows"]] == [(1, "pass"), (3, "fail")]
    assert out["scores"]["pass@1"] == 0.5 and out["scores"]["items"] == 2

    plain = cascade("grade", "--benchmark", "gsm8k", "--data", str(data), home=tmp_path / "home")
    assert "cascade: row 2: missing field 'answer'" in plain.stderr and "pass@1" in plain.stdout


def test_eval_tiny_on_gsm8k_writes_scores_and_per_item_rows(tmp_path):
    out_dir = tmp_path / "eval-out"
    result = cascade(
        "eval",
        "tiny",
        "--benchmark",
        "gsm8k",
        "--limit",
        "5",
        "--json",
        "--max-new-tokens",
        "8",
        "--out",
        str(out_dir),
        home=tmp_path / "home",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    scores = report["scores"]["gsm8k"]
    assert scores["items"] == 5 and 0.0 <= scores["pass@1"] <= 1.0
    rows = [json.loads(line) for line in (out_dir / "gsm8k.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all({"prompt", "completion", "verdict"} <= set(r) for r in rows)
    assert "Janet" in rows[0]["prompt"]
    saved = json.loads((out_dir / "scores.json").read_text())
    assert saved["benchmarks"]["gsm8k"]["items"] == 5 and saved["settings"]["limit"] == 5

    # 2 rows at a time: the engine refills freed rows, says its plan first, and answers as one batch of 5 did
    slots_dir = tmp_path / "eval-2"
    args = ("eval", "tiny", "--benchmark", "gsm8k", "--limit", "5", "--max-new-tokens", "8", "--batch-size", "2")
    slotted = cascade(*args, "--out", str(slots_dir), home=tmp_path / "home")
    assert slotted.returncode == 0, slotted.stderr
    assert "engine: 5 prompts x 1: KV cache" in slotted.stderr and ": 2 rows x " in slotted.stderr
    again = [json.loads(line) for line in (slots_dir / "gsm8k.jsonl").read_text().splitlines()]
    assert [r["completion"] for r in again] == [r["completion"] for r in rows]


def test_unknown_benchmark_is_one_line_exit_2_nothing_written(tmp_path):
    home = tmp_path / "home"
    bad_items = tmp_path / "mine.jsonl"
    bad_items.write_text('{"question": "q?", "choices": ["a", "b"], "answer": 1}\n{"question": "q?", "choices": []}\n')
    for args in (
        ["eval", "tiny", "--benchmark", "gsm8k,nope"],
        ["grade", "--benchmark", "nope", "--data", __file__],
        ["eval", "tiny", "--benchmark", "gsm8k", "--samples", "0"],
        ["eval", "tiny", "--benchmark", "gsm8k", "--engine", "tgi"],
        ["grade", "--benchmark", "gsm8k", "--data", "/no/such/file.jsonl"],
        ["eval", "tiny", "--benchmark", "mmlu_stem", "--data", str(bad_items)],
    ):
        result = cascade(*args, home=home)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cascade: error: "), (args, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout
    assert "unknown benchmark 'nope'; known: " in cascade("eval", "tiny", "--benchmark", "nope", home=home).stderr
    assert f"{bad_items}: row 2: missing field 'answer'" in result.stderr  # the last case: a bad row of --data
    assert files_under(home) == []


def test_eval_of_the_splits_shows_a_bar_per_column_and_the_scores(tmp_path):
    result = cascade("eval", "tiny", "--recipe", "micro", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    bars = [line.split()[0] for line in result.stderr.splitlines() if "/" in line and "━" in line]
    assert {"math", "instruct"} <= set(bars), result.stderr  # the held-out columns, each with its bar
    assert "heldout split: tiny" in result.stdout
