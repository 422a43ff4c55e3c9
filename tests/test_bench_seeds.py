"""bench/bench_seeds.py: gains across seeds, against hand-computed means and standard errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_seeds import across_seeds, named_in_repository, table, unused_first_seed  # noqa: E402

from cascade.artifacts.html_report import Gain  # noqa: E402


def gains(if_rl: float, greedy: float, math_rl: float | None = None) -> list[Gain]:
    rows = [
        Gain("if_rl", "instruct", 0.2, 0.2 + if_rl, if_rl, 0.01),
        Gain("if_rl", "greedy/instruct", 0, 0, greedy, 0.02),
    ]
    return rows + ([Gain("math_rl", "math", 0.3, 0.3 + math_rl, math_rl, 0.01)] if math_rl is not None else [])


def test_the_mean_gain_and_its_standard_error_across_seeds_by_hand():
    """IF-RL gains 0.04, 0.02, 0.06: mean 0.04, sd 0.02, SE 0.02 / sqrt(3); a column a seed lacks is left out."""
    rows = across_seeds([gains(0.04, -0.01, 0.05), gains(0.02, 0.01), gains(0.06, 0.0, 0.03)])
    assert [(r.stage, r.domain) for r in rows] == [("if_rl", "instruct"), ("if_rl", "greedy/instruct")]
    instruct, greedy = rows
    assert instruct.gains == (0.04, 0.02, 0.06) and instruct.mean == pytest.approx(0.04)
    assert instruct.se == pytest.approx(0.02 / math.sqrt(3)) and instruct.in_se == pytest.approx(2 * math.sqrt(3))
    assert greedy.mean == pytest.approx(0.0, abs=1e-12) and greedy.se == pytest.approx(0.01 / math.sqrt(3))
    assert across_seeds([gains(0.04, 0.0)])[0].se is None  # one seed: no spread to measure
    printed = table(rows, [7, 8, 9]).splitlines()
    head = "| stage | domain | seed 7 | seed 8 | seed 9 | mean ± SE across seeds | in SE | t bar | clears it |"
    assert printed[0] == head
    # 3.5 SE is past 2 but short of t(0.975, 2 df) = 4.303: three seeds do not show this gain
    assert instruct.t_bar == pytest.approx(4.3027, abs=1e-4) and instruct.clears_bar is False
    assert printed[2] == "| if_rl | instruct | +0.040 | +0.020 | +0.060 | +0.040 ± 0.012 | +3.5 | 4.30 | no |"
    five = across_seeds([gains(g, 0.0) for g in (0.05, 0.04, 0.06, 0.05, 0.05)])[0]
    assert five.t_bar == pytest.approx(2.7764, abs=1e-4) and five.clears_bar is True  # 15.8 SE, 4 df


def test_entropy_at_each_end_of_an_rl_stage_from_its_step_log(tmp_path):
    """Steps 1-25 of if_rl at entropy 2.0 - 0.05 * step: the first ten average 1.725, the last ten 0.975."""
    import json

    from bench_seeds import entropy_ends, entropy_table

    from cascade.artifacts.layout import metrics_key
    from cascade.artifacts.store import Store

    store = Store(f"file://{tmp_path}")
    rows = [{"step": n, "metrics": {"entropy": 2.0 - 0.05 * n, "loss": 0.1}} for n in range(1, 26)]
    store.write_bytes(metrics_key("r", 3, "if_rl"), "".join(json.dumps(r) + "\n" for r in rows).encode())
    store.write_bytes(metrics_key("r", 1, "sft"), b'{"step": 1, "metrics": {"loss": 3.0}}\n')
    ends = entropy_ends(store, "r", ["if_rl", "math_rl"])
    assert list(ends) == ["if_rl"] and ends["if_rl"] == (pytest.approx(1.725), pytest.approx(0.975))
    assert entropy_table([ends, {}], [0, 1]).splitlines()[2] == "| if_rl | 1.73 -> 0.97 | - |"


def test_default_seeds_are_ones_no_tracked_file_names():
    import random

    taken = set(range(10**6, 10**9, 7))  # every seventh seed is "named somewhere"
    first = unused_first_seed(5, taken.__contains__, random.Random(0))
    assert 10**6 <= first < 10**9 and not taken & set(range(first, first + 5))
    with pytest.raises(RuntimeError, match="pass --first-seed"):
        unused_first_seed(5, lambda seed: True, random.Random(0))
    # the repository's own check: a seed a file names is found, a 9-digit one written nowhere (computed here, so
    # that this file does not name it) is not
    assert named_in_repository(2026) and not named_in_repository(10**9 - 4321)
