"""The registry of on-policy losses: one row per loss an on-policy stage's `loss:` may name, as reward sources and
stage kinds are registered.

A loss is an object with one signature (stages/train/on_policy_losses.py: `OnPolicyLoss`): a micro-batch's
`TokenBatch` (the trainer's logprobs of the sampled tokens, the engine's, the mask, the step's global token count,
and the advantages or the teachers' logprobs) -> the loss and its metrics. A row says what a loss reads beside
the logprobs (`advantages`: a GRPO stage gives them; `teacher`: a MOPD stage's teachers' logprobs) and how it is
built from the stage's config and where the stage samples and trains (`build(cfg, LossSetting)`, imported on
first use, so validating a recipe loads no torch). Adding a loss is one row:
`register_loss(LossRow("mine", "advantages", build))` and `loss: mine` on the stage (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import field_validator, model_validator

from cascade.artifacts.config import Strict
from cascade.stages.recipe.config_base import imported_on_call

LossReads = Literal["advantages", "teacher"]


@dataclass(frozen=True)
class LossSetting:
    """Where a stage samples and trains, which a loss's importance correction may depend on."""

    engine: str  # the recipe's engine kind: hf or vllm
    dtype: str  # the stage's training dtype: bf16 or fp32


@dataclass(frozen=True)
class LossRow:
    name: str  # the stage's `loss:`
    reads: LossReads
    build: Callable[[Any, LossSetting], Any]  # (stage config, setting) -> OnPolicyLoss


LOSSES: dict[str, LossRow] = {}


def register_loss(row: LossRow) -> None:
    """Add (or replace) a loss: the built-in ones below, a user's own, or a test's."""
    LOSSES[row.name] = row


def unregister_loss(name: str) -> None:
    LOSSES.pop(name, None)


class ChoosesLoss(Strict):
    """An on-policy stage's `loss:`, a registered loss's name; None: the kind's own (`default_loss`). A kind
    takes the losses that read what it gives (`loss_reads`). A mixin of a stage config (StageConfig)."""

    loss: str | None = None
    default_loss: ClassVar[str]
    loss_reads: ClassVar[LossReads]
    if TYPE_CHECKING:  # the StageConfig it is mixed into has them; not fields of their own (the field order stays)
        kind: str
        name: str

    @field_validator("loss")
    @classmethod
    def _registered(cls, name: str | None) -> str | None:
        if name is not None and name not in LOSSES:
            raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}")
        return name

    @model_validator(mode="after")
    def _reads_what_the_kind_gives(self) -> ChoosesLoss:
        row = self.loss_row()
        if row.reads != self.loss_reads:
            raise ValueError(
                f"stage {self.name!r}: loss {row.name!r} reads {row.reads}, which a "
                f"{self.kind} stage does not give (it gives {self.loss_reads})"
            )
        return self

    def loss_row(self) -> LossRow:
        return LOSSES[self.loss or self.default_loss]


for _row in (
    LossRow("grpo", "advantages", imported_on_call("cascade.stages.train.on_policy_losses", "grpo_loss_of")),
    LossRow("mopd", "teacher", imported_on_call("cascade.stages.train.on_policy_losses", "mopd_loss_of")),
):
    register_loss(_row)
