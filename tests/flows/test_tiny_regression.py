"""`recipes/tiny-regression.yaml` through the flow, scaled down to fit the suite: the high-LR IF-RL stage knocks
math down, the gate fires on math, and the MOPD recovery raises math above where the regression left it.

Only sizes and the hot stage's learning rate change: the model is 2 layers of hidden 128 (MLP 344; the recipe: 4
of 256), SFT runs 1000 steps of 16 rows (the recipe: 1500 of 32), math RL, the hot stage and the recovery 20 steps
each (the recipe: 40), the held-out sets are 60 items per domain (the recipe: 800), and the hot stage's lr is 6e-4
(the recipe: 3e-4), since the smaller model's SFT leaves math lower. The stage list and the gate's tolerance are
the shipped recipe's.
Measured 2026-11-27 through the CLI at one thread (docs/LOG.md): ~105 CPU-s a run (SFT ~65 s),
against 172 (SFT 105) at 4 layers with the hot stage at 3e-4. Seed 0: math 0.217 after SFT, 0.208 after math RL,
0.025 after the hot stage (the gate fires on math, drop 0.19, and on instruct, 0.20), 0.163 after MOPD. Seed 1:
0.271, 0.233, 0.10 (drop 0.17), 0.263. Not taken: 2 layers with the hot stage at 3e-4 (drops 0.06 and 0.065, too
close to the 0.05 tolerance); 500 SFT steps at lr 2e-3 or 3e-3, or of 32 rows (math 0.05-0.13 after SFT). The
earlier sizes and their figures are in docs/LOG.md.
"""

import pytest

from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
SCALED = [
    "model.hidden_size=128",
    "model.num_layers=2",
    "model.intermediate_size=344",
    "stages.sft.steps=1000",
    "stages.sft.batch_size=16",
    "stages.sft.micro_batch_size=16",
    "stages.math_rl.steps=20",
    "stages.if_rl_hot.lr=6e-4",
    "stages.if_rl_hot.steps=20",
    "gate.recovery.steps=20",
    "domains.math.heldout_size=60",
    "domains.instruct.heldout_size=60",
    "tracking.enabled=false",
]


def test_gate_fires_on_the_regressed_domain_and_mopd_raises_it(tmp_path):
    recipe = load_recipe("tiny-regression", [f"storage.root=file://{tmp_path}/store", *SCALED])
    report = cascade_flow(recipe, "regression")
    fired = {g.domain: g for g in report.gate if g.stage == "if_rl_hot"}
    assert "math" in fired, f"the gate did not fire on math: {report.gate}"
    math = fired["math"]
    assert math.action == "recover" and math.drop > math.tolerance
    assert math.after_recovery > math.now, math
    after = [e.after_stage for e in report.evals]
    assert after[-1] == "recover-if_rl_hot", after  # the recovered checkpoint was evaluated last
