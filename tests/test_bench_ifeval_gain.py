"""bench/ifeval_gain.py: IFEval's four numbers and their paired SEs over prompts, against hand-computed values."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ifeval(pid: str, strict: list[bool], loose: list[bool]) -> dict:
    details = {
        "prompt_strict": all(strict),
        "prompt_loose": all(loose),
        "instructions": [{"id": "x", "strict": s, "loose": lo} for s, lo in zip(strict, loose)],
    }
    return {"domain": "bench/ifeval", "id": pid, "score": float(all(strict)), "details": details}


def test_four_numbers_with_prompt_clustered_standard_errors(tmp_path):
    before = [
        _ifeval("a", [False, False], [False, True]),
        _ifeval("b", [True], [True]),
        _ifeval("c", [False], [False]),
    ]
    after = [
        _ifeval("a", [True, True], [True, True]),
        _ifeval("b", [True], [True]),
        _ifeval("c", [True], [True]),
    ]
    gsm = [{"domain": "bench/gsm8k", "id": "g", "score": 0.0}]
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "00-source.json").write_text(json.dumps({"items": before + gsm}))
    (tmp_path / "evals" / "00-if_rl.json").write_text(json.dumps({"items": after + gsm}))
    out = subprocess.run(
        [sys.executable, "bench/ifeval_gain.py", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.splitlines()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out[2:]}
    # prompt strict: 1/3 -> 3/3, per-prompt differences (1, 0, 1): mean 2/3, sd sqrt(1/3), SE sqrt(1/3)/sqrt(3) = 1/3
    assert rows["prompt-level strict"] == "| prompt-level strict | 0.333 | 1.000 | +0.667 ± 0.333 | +2.0 |"
    # instruction strict: 1/4 -> 4/4; per-prompt count differences (2, 0, 1), I = 4: gain 3/4, SE sqrt(3) * 1 / 4
    se = math.sqrt(3) * 1.0 / 4
    assert (
        rows["instruction-level strict"] == f"| instruction-level strict | 0.250 | 1.000 | +0.750 ± {se:.3f} | +1.7 |"
    )
    assert rows["bench/gsm8k"] == "| bench/gsm8k | 0.000 | 0.000 | +0.000 ± 0.000 | +0.0 |"


def _typed(pid: str, verdicts: list[tuple[str, bool]], finish: str) -> dict:
    details = {
        "prompt_strict": all(v for _, v in verdicts),
        "prompt_loose": all(v for _, v in verdicts),
        "instructions": [{"id": kind, "strict": v, "loose": v} for kind, v in verdicts],
    }
    return {
        "domain": "bench/ifeval",
        "id": pid,
        "score": float(details["prompt_strict"]),
        "details": details,
        "finish_reason": finish,
    }


def run_gain(tmp_path, before, after) -> list[str]:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "00-source.json").write_text(json.dumps({"items": before}))
    (tmp_path / "evals" / "00-if_rl.json").write_text(json.dumps({"items": after}))
    return subprocess.run(
        [sys.executable, "bench/ifeval_gain.py", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.splitlines()


def test_gains_per_instruction_type_and_on_answers_within_the_token_cap(tmp_path):
    before = [
        _typed("a", [("kw:x", False), ("len:y", False)], "length"),
        _typed("b", [("kw:x", True)], "stop"),
        _typed("c", [("kw:x", False)], "stop"),
        _typed("d", [("len:y", True)], "length"),
    ]
    after = [
        _typed("a", [("kw:x", True), ("len:y", True)], "stop"),
        _typed("b", [("kw:x", True)], "stop"),
        _typed("c", [("kw:x", True)], "stop"),
        _typed("d", [("len:y", True)], "stop"),
    ]
    out = run_gain(tmp_path, before, after)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out}
    # kw:x, three instructions: 1/3 -> 3/3, differences (1, 0, 1): gain 2/3, SE sqrt(1/3)/sqrt(3) = 1/3
    assert rows["kw:x"] == "| kw:x | 3 | 0.333 | 1.000 | +0.667 ± 0.333 | +2.0 |"
    # len:y, two: 1/2 -> 2/2, differences (1, 0): gain 1/2, sd sqrt(1/2), SE 1/2
    assert rows["len:y"] == "| len:y | 2 | 0.500 | 1.000 | +0.500 ± 0.500 | +1.0 |"
    # b and c stopped both times: strict 1/2 -> 2/2, differences (0, 1): +0.5 ± 0.5
    assert rows["stopped both times"] == "| stopped both times | 2 | 0.500 | 1.000 | +0.500 ± 0.500 | +1.0 |"
    # a and d ran to the cap before: strict 1/2 -> 2/2
    assert rows["capped before or after"] == "| capped before or after | 2 | 0.500 | 1.000 | +0.500 ± 0.500 | +1.0 |"
    # capped share 2/4 -> 0/4, differences (-1, 0, 0, -1): mean -1/2, sd sqrt(1/3), SE sqrt(1/3)/2
    se = math.sqrt(1 / 3) / 2
    assert rows["share capped (not a score)"] == (
        f"| share capped (not a score) | 4 | 0.500 | 0.000 | -0.500 ± {se:.3f} | {-0.5 / se:+.1f} |"
    )


def test_records_without_finish_reasons_say_so_instead_of_a_cap_table(tmp_path):
    before = [_typed("a", [("kw:x", False)], "stop")]
    after = [_typed("a", [("kw:x", True)], "stop")]
    for row in before + after:
        del row["finish_reason"]
    out = run_gain(tmp_path, before, after)
    assert any("no finish reasons" in line for line in out)
    assert not any(line.startswith("| stopped both times") for line in out)
