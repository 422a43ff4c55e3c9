"""bench/bench_importance.py: each variant's paired gain over its start and the variants' difference, by hand."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_importance import across, render, seed_row  # noqa: E402


def model(primary: list[float], greedy: list[float], **logged) -> dict:
    ids = [f"i{n}" for n in range(len(primary))]
    return {"scores": {"math": dict(zip(ids, primary)), "greedy/math": dict(zip(ids, greedy))}, **logged}


def test_gains_over_the_start_and_between_variants_are_paired_over_the_same_items():
    models = {
        "start": model([0.0, 0.5, 1.0, 0.5], [0, 1, 1, 0]),
        "none": model([0.5, 0.5, 1.0, 0.5], [0, 1, 1, 0]),  # +0.5 on one item of four
        "tis": model([0.5, 1.0, 1.0, 1.0], [1, 1, 1, 0]),
    }
    row = seed_row(models, "math", ["none", "tis"])
    gain, se = row["none - start, math"]
    assert gain == pytest.approx(0.125) and se == pytest.approx(0.125)  # diffs 0.5,0,0,0: sd 0.25, / sqrt 4
    assert row["tis - none, math"][0] == pytest.approx(0.25)  # diffs 0, 0.5, 0, 0.5
    assert row["tis - start, greedy/math"][0] == pytest.approx(0.25) and row["none - start, greedy/math"] == (0.0, 0.0)


def test_the_mean_over_seeds_and_its_standard_error():
    assert across([0.01, 0.03, 0.05]) == "+0.030 ± 0.012 (+2.6 SE)"  # sd 0.02 / sqrt(3)
    assert across([0.02]) == "+0.020"
    logged = {"mismatch": 1.5e-3, "corrected": 0.25, "seconds": 90.0}
    models = {v: model([0.0, 1.0], [0, 1], **logged) for v in ("none", "tis")} | {"start": model([0.0, 0.0], [0, 0])}
    args = argparse.Namespace(domain="math", variants=["none", "tis"])
    printed = render({"r1": models, "r2": models}, args).splitlines()
    assert printed[0] == "| comparison | r1 | r2 | mean ± SE across seeds |"
    assert printed[2] == "| none - start, math | +0.500 ± 0.500 (+1.0 SE) | +0.500 ± 0.500 (+1.0 SE) | +0.500 ± 0 |"
    logged_cells = "| 1.50e-03 / 0.250 / 90 | 1.50e-03 / 0.250 / 90 | |"
    assert printed[-1] == "| tis: mean logprob mismatch / corrected tokens / stage seconds " + logged_cells
