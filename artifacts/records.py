"""The eval record: one model's held-out scores, as the cascade, the regression eval and a baseline read them.

Written to `runs/<run_id>/evals/<NN>-<stage>.json` after a cascade stage and to
`regression/<eval_id>/<checkpoint>.json` by a regression eval; `cascade baseline set` takes either.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class EvalRecordError(ValueError):
    """Bytes that are not an eval record; one line for the user."""


class EvalRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None  # the store URI of the checkpoint scored; None: the recipe's initial model
    digest: str | None = None  # that checkpoint's digest: a re-trained stage must be re-evaluated
    scores: dict[str, float]  # domain -> held-out score in [0, 1]
    checkpoint: str | None = None  # the name it was asked by (a registry alias or a URI), when not the URI
    items: list[dict[str, Any]] = []  # per item: domain, id, prompt, completion, score

    @classmethod
    def parse(cls, blob: bytes, where: str) -> EvalRecord:
        try:
            return cls.model_validate_json(blob)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise EvalRecordError(f"{where} is not an eval record ({field}: {err['msg']})") from None

    def summary(self) -> dict[str, Any]:
        """The record without its per-item rows."""
        return self.model_dump(exclude={"items"})

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()
