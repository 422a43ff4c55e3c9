"""The run's record, `<store>/runs/<run_id>/report.json`: stages, evals after each stage, gate decisions.

Rewritten after every change, so a run cut off anywhere still has an accurate record of what finished.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from artifacts.store import Store


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}"


class RunReport(BaseModel):
    run_id: str
    recipe: str
    stages: list[dict[str, Any]] = Field(default_factory=list)
    evals: list[dict[str, Any]] = Field(default_factory=list)
    gate: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def load(cls, store: Store, run_id: str) -> RunReport | None:
        key = f"{run_prefix(run_id)}/report.json"
        return cls.model_validate_json(store.read_bytes(key)) if store.exists(key) else None

    def save(self, store: Store) -> None:
        store.write_bytes(f"{run_prefix(self.run_id)}/report.json", json.dumps(self.model_dump(), indent=1).encode())

    def record_stage(self, entry: dict[str, Any]) -> None:
        self.stages = [s for s in self.stages if s["name"] != entry["name"]] + [entry]

    def record_eval(self, after_stage: str, scores: dict[str, float]) -> None:
        self.evals = [e for e in self.evals if e["after_stage"] != after_stage] + [
            {"after_stage": after_stage, "scores": scores}
        ]

    def forgetting_matrix(self) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
        """Domains, and one row per eval: (after_stage, score per domain)."""
        domains = sorted({d for e in self.evals for d in e["scores"]})
        return domains, [(e["after_stage"], [e["scores"].get(d) for d in domains]) for e in self.evals]
