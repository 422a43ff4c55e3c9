"""The mopd stage kind: its config, checks, estimate and row (here) and, in `run_mopd.py`, its run function:
multi-domain on-policy distillation from per-domain teachers.

This folder owns the kind's whole registry row (registered below, with the checks, plan estimate and report card
it names); the row imports `run_mopd.py` only on its first call: validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field

from cascade.stages.kinds.registry import StageKind, check_domain_weights, kind_of, register_kind
from cascade.stages.recipe.config_base import (
    SOURCE_EVAL,
    Count,
    Fraction,
    Name,
    OnPolicyConfig,
    Read,
    StageConfig,
    Steps,
    _no_bool,
    imported_on_call,
)
from cascade.stages.recipe.estimate import StageEstimate, on_policy_estimate
from cascade.stages.train.loss_registry import ChoosesLoss, LossReads


class MOPDConfig(OnPolicyConfig, ChoosesLoss):
    kind: Literal["mopd"] = "mopd"
    default_loss: ClassVar[str] = "mopd"
    loss_reads: ClassVar[LossReads] = "teacher"
    hashed_when_set: ClassVar[frozenset[str]] = OnPolicyConfig.hashed_when_set | {"loss"}
    name: Name = "mopd"
    domains: list[str] | None = None  # None: every domain that has a teacher
    # domain -> earlier stage whose checkpoint teaches it, or "source": the recipe's model source; "auto": per domain,
    # the stage (or the source, where eval.source scores it) with the best dev score in the evals before this stage
    # (chosen when the stage starts, as the gate's recovery chooses them)
    teachers: dict[str, str] | Literal["auto"] = {}
    steps: Steps = 40  # the paper converges in ~30-50 steps
    group_size: Count = 4  # token-level teacher signal needs fewer samples per prompt than a group baseline
    eps_low: Fraction = 0.5
    eps_high: Annotated[float, BeforeValidator(_no_bool), Field(ge=1.0, le=1e3)] = 2.0
    teacher_residency: Literal["resident", "one_at_a_time"] = "resident"

    def named_domains(self) -> list[str]:
        return list(self.domains or [])

    def reads(self) -> list[Read]:
        if self.teachers == "auto":
            return []  # not known before the run: the flow chooses them, then hands their checkpoints over
        return [
            Read(f"teachers.{domain}", stage, "policy")
            for domain, stage in self.teachers.items()
            if stage != SOURCE_EVAL  # the model source: no stage's checkpoint
        ]

    def teacher_stages(self) -> dict[str, str]:
        return {} if self.teachers == "auto" else dict(self.teachers)


# Its registry row, and what the row names: the checks only this kind knows, its plan estimate.


def _check_mopd(cfg: MOPDConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    if cfg.teachers == "auto":
        if not any(kind_of(s.kind).makes == "policy" for s in earlier):
            raise ValueError(f"stage {cfg.name!r}: teachers: auto needs an earlier model stage to choose from")
        unknown = sorted(set(cfg.domains or []) - domains)
        if unknown:
            raise ValueError(f"stage {cfg.name!r} names domain(s) {unknown} not declared in `domains`")
        return
    if not cfg.teachers:
        raise ValueError(f"stage {cfg.name!r}: a mopd stage needs `teachers` (domain: earlier model stage)")
    missing = sorted(set(cfg.teachers) - domains)
    if missing:
        raise ValueError(f"stage {cfg.name!r} names teacher domain(s) {missing} not declared in `domains`")
    check_domain_weights(cfg, cfg.domains or list(cfg.teachers))
    untaught = sorted(set(cfg.domains or []) - set(cfg.teachers))
    if untaught:
        raise ValueError(f"stage {cfg.name!r} has no teacher for domain(s) {untaught}")


def _estimate_mopd(cfg: MOPDConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    domains = cfg.domains or (None if cfg.teachers == "auto" else list(cfg.teachers))
    return on_policy_estimate(cfg, recipe, params, domains, 1)  # the domain's teacher


register_kind(
    StageKind(
        "mopd",
        MOPDConfig,
        imported_on_call("cascade.stages.kinds.mopd.run_mopd", "run_mopd"),
        makes="policy",
        takes_policy=True,
        holds_compute=True,
        check=_check_mopd,
        estimate=_estimate_mopd,
        distributable=True,
        recovers=True,
        chooses_teachers=lambda cfg: cfg.teachers == "auto",
    )
)
