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
