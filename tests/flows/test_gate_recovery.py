"""The regression gate branches into MOPD recovery, in seconds, on two conflicting toy domains.

`vowels` rewards vowel-heavy answers and `consonants` consonant-heavy ones, each on its own prompts. GRPO on
consonants after GRPO on vowels makes the vowel score regress; the gate must fire on vowels, the recovery MOPD
(teachers: the vowel stage for vowel prompts, the consonant stage for consonant prompts) must bring it back up,
and the flow must continue from the recovered checkpoint.
"""

import pytest

import cascade.stages.domains
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.stages.domains.base import Domain, Item
from cascade.stages.recipe.schema import validate_recipe

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
LETTERS = "bcdfghklmnprstvwz"


class LetterDomain(Domain):
    def __init__(self, name: str, wanted: str):
        self.name, self.wanted = name, wanted

    def sample(self, rng):
        word = "".join(rng.choice(LETTERS) for _ in range(5))
        return Item(self.name, "", f"{self.name}: {word}", self.wanted * 3, {})

    def grade(self, item, completion):
        letters = [c for c in completion.lower() if c.isalpha()]
        return sum(c in self.wanted for c in letters) / max(1, len(letters))


@pytest.fixture
def toy_domains(monkeypatch):
    monkeypatch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
    cascade.stages.domains.register_domain(LetterDomain("vowels", "aeiou"))
    cascade.stages.domains.register_domain(LetterDomain("consonants", LETTERS))


def toy_recipe(tmp_path, policy="recover", max_recoveries=1):
    rl = {"steps": 12, "prompts_per_step": 8, "group_size": 8, "lr": 1e-2, "checkpoint_every": 0}
    return validate_recipe(
        {
            "name": "toy-regression",
            "seed": 0,
            "storage": {"root": f"file://{tmp_path}/store"},
            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
            "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128},
            "compute": {"dtype": "fp32"},
            # sampled evals: greedy answers of this toy are one string for every prompt (scores in steps of 1/6),
            # so a rounding change could flip a greedy score; the mean of 4 samples is the policy's expected reward
            "domains": {
                d: {
                    "train_size": 200,
                    "heldout_size": 64,
                    "max_new_tokens": 8,
                    "tolerance": 0.05,
                    "eval_temperature": 1.0,
                    "eval_samples": 4,
                }
                for d in ("vowels", "consonants")
            },
            "stages": [
                {"kind": "grpo", "name": "vowel_rl", "domains": ["vowels"], **rl},
                {"kind": "grpo", "name": "consonant_rl", "domains": ["consonants"], **rl},
                {"kind": "grpo", "name": "consonant_rl_2", "domains": ["consonants"], **rl},
            ],
            "gate": {
                "policy": policy,
                "max_recoveries": max_recoveries,
                "recovery": {"steps": 12, "prompts_per_step": 8, "group_size": 4, "lr": 1e-2, "checkpoint_every": 0},
            },
        }
    )


def test_gate_fires_and_mopd_recovers_the_regressed_domain(tmp_path, toy_domains):
    recipe = toy_recipe(tmp_path)
    report = cascade_flow(recipe, "toy")
    on_disk = RunReport.load(Store.from_config(recipe.storage), "toy")
    assert on_disk == report
    scores = {e.after_stage: e.scores for e in report.evals}
    fired = [g for g in report.gate if g.stage == "consonant_rl"]
    assert [g.domain for g in fired] == ["vowels"]
    decision = fired[0]
    assert decision.action == "recover" and decision.best_stage == "vowel_rl"
    # the gate read the dev split (the held-out column only records)
    assert decision.column == "dev/vowels"
    dev = {stage: s["dev/vowels"] for stage, s in scores.items()}
    assert decision.drop == pytest.approx(dev["vowel_rl"] - dev["consonant_rl"], abs=1e-4)
    assert decision.drop > decision.tolerance
    # the recovery is its own stage, evaluated, and it brought vowels back up
    recovery = next(s for s in report.stages if s.name == "recover-consonant_rl")
    assert recovery.kind == "mopd" and recovery.status == "completed" and recovery.recovers == "consonant_rl"
    assert recovery.metrics["teachers"] == {"consonants": "consonant_rl", "vowels": "vowel_rl"}
    assert decision.after_recovery == dev["recover-consonant_rl"] > dev["consonant_rl"]
    assert scores["recover-consonant_rl"]["vowels"] > scores["consonant_rl"]["vowels"]  # held-out agrees
    # the cascade continued from the recovered checkpoint, and max_recoveries=1 left later fires as warnings
    stage_names = [s.name for s in report.stages]
    assert stage_names.index("recover-consonant_rl") < stage_names.index("consonant_rl_2")
    from cascade.artifacts.checkpoint import read_manifest

    store = Store.from_config(recipe.storage)
    assert read_manifest(store, "runs/toy/02-consonant_rl_2")["parent"]["stage"] == "recover-consonant_rl"
    assert all(g.action == "warn" for g in report.gate if g.stage == "consonant_rl_2")
    assert [e.after_stage for e in report.evals] == [
        "vowel_rl",
        "consonant_rl",
        "recover-consonant_rl",
        "consonant_rl_2",
    ]
    # a resume adopts every stage, consonant_rl_2 with the recovered checkpoint as its parent, and status says so
    from cascade.flows.cli.inspection import stage_positions

    assert [where for _, where, _ in stage_positions(store, "toy", recipe)] == ["committed, skipped"] * 3


def test_policy_fail_stops_the_run_with_the_reason(tmp_path, toy_domains):
    recipe = toy_recipe(tmp_path, policy="fail")
    from cascade.stages.errors import GateFailed

    with pytest.raises(
        GateFailed, match=r"regression gate: vowels dropped \d\.\d{3} after consonant_rl \(tolerance 0\.05\)"
    ):
        cascade_flow(recipe, "toy-fail")
    report = RunReport.load(Store.from_config(recipe.storage), "toy-fail")
    assert [s.name for s in report.stages] == ["vowel_rl", "consonant_rl"]
    assert report.gate[0].action == "fail"
