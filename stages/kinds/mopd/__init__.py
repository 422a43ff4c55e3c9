"""The mopd stage kind: its config (here) and, in `run.py`, its run function: multi-domain on-policy distillation
from per-domain teachers.

The registry (stages/kinds/__init__.py) imports the config, and `run.py` only on the row's first call:
validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from cascade.stages.config_base import Count, Fraction, Name, OnPolicyConfig, Read, Steps, _no_bool


class MOPDConfig(OnPolicyConfig):
    kind: Literal["mopd"] = "mopd"
    name: Name = "mopd"
    domains: list[str] | None = None  # None: every domain that has a teacher
    # domain -> earlier stage whose checkpoint teaches it; "auto": per domain, the stage with the best held-out score
    # in the evals before this stage (chosen when the stage starts, as the gate's recovery chooses them)
    teachers: dict[str, str] | Literal["auto"] = {}
    steps: Steps = 40  # the paper converges in ~30-50 steps
    group_size: Count = 4  # token-level teacher signal needs fewer samples per prompt than a group baseline
    eps_low: Fraction = 0.5
    eps_high: Annotated[float, BeforeValidator(_no_bool), Field(ge=1.0, le=1e3)] = 2.0
    teacher_residency: Literal["resident", "one_at_a_time"] = "resident"

    def reads(self) -> list[Read]:
        if self.teachers == "auto":
            return []  # not known before the run: the flow chooses them, then hands their checkpoints over
        return [Read(f"teachers.{domain}", stage, "policy") for domain, stage in self.teachers.items()]
