"""`recipes/tiny-regression.yaml` through the flow, scaled down to fit the suite: the high-LR IF-RL stage knocks
math down, the gate fires on math, and the MOPD recovery raises math above where the regression left it.

Only sizes are scaled: SFT and the first RL stage run fewer steps and the held-out sets are halved. The stage
list, the learning rates, the hot stage, the gate's tolerance and the recovery are the shipped recipe's.
Measured 2026-11-26 with these sizes through the CLI (one thread): math 0.925 after SFT, 0.919 after math RL, 0.75
after the hot stage at lr 3e-4 (the gate fires), 0.871 after MOPD. At the hot stage's former lr 1e-3 both domains
collapsed to ~0 and MOPD recovered nothing (0.0 -> 0.021). The full-size run is in docs/LOG.md and bench/RESULTS.md.
"""

import pytest

from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
SCALED = [
    "stages.sft.steps=1000",
    "stages.math_rl.steps=20",
    "domains.math.heldout_size=200",
    "domains.instruct.heldout_size=200",
    "tracking.enabled=false",
]


def test_gate_fires_on_the_regressed_domain_and_mopd_raises_it(tmp_path):
    recipe = load_recipe("tiny-regression", [f"storage.root=file://{tmp_path}/store", *SCALED])
    report = cascade_flow(recipe, "regression")
    fired = {g["domain"]: g for g in report.gate if g["stage"] == "if_rl_hot"}
    assert "math" in fired, f"the gate did not fire on math: {report.gate}"
    math = fired["math"]
    assert math["action"] == "recover" and math["drop"] > math["tolerance"]
    assert math["after_recovery"] > math["now"], math
    after = [e["after_stage"] for e in report.evals]
    assert after[-1] == "recover-if_rl_hot", after  # the recovered checkpoint was evaluated last
