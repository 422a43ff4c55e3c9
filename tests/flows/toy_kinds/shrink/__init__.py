"""The toy `shrink` kind: its config and its registry row (here) and, in `run_shrink.py`, its run function: it reads an
earlier policy stage's checkpoint, scales every weight by `factor` and commits the result as the next policy."""

from __future__ import annotations

from typing import Literal

from cascade.stages.kinds.registry import StageKind, register_kind
from cascade.stages.recipe.config_base import Read, StageConfig, imported_on_call


class ShrinkConfig(StageConfig):
    kind: Literal["shrink"] = "shrink"
    name: str = "shrink"
    source: str = "sft"  # the policy stage whose checkpoint is shrunk
    factor: float = 0.5

    def reads(self) -> list[Read]:
        return [Read("source", self.source, "policy")]


register_kind(
    StageKind(
        "shrink",
        ShrinkConfig,
        imported_on_call("tests.flows.toy_kinds.shrink.run_shrink", "run_shrink"),
        makes="policy",
        takes_policy=False,
        holds_compute=True,
    )
)
