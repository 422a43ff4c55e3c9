"""What every config module builds on: the bounds shared by fields of the same meaning, an earlier stage a
stage reads (`Read`), an OpenAI-compatible endpoint, and how a registry row names its function without importing
it (`imported_on_call`). Apart from `stages/config.py` so that the reward-source
registry (`stages/reward_sources.py`), which `config.py` reads, can use them without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Callable, Literal, NamedTuple

from pydantic import BeforeValidator, Field

from cascade.artifacts.config import Strict


def imported_on_call(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported on its first call: a registry row (a stage kind's run function, a reward source's
    builder) names it this way so that validating a recipe loads neither torch nor a model."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = f"{module}.{name}"
    return call


def _no_bool(value: object) -> object:
    """YAML reads `true` as a bool, and pydantic would take it as 1 or 1.0."""
    if isinstance(value, bool):
        raise ValueError("Input should be a number, not a boolean")
    return value


# Bounds shared by every field of the same meaning. Integers are strict (`true` is not a step count); rates
# are lax about strings because PyYAML reads `1e-4` (no dot) as the string "1e-4", but refuse booleans.
Steps = Annotated[int, Field(strict=True, ge=1, le=1_000_000)]
Count = Annotated[int, Field(strict=True, ge=1, le=100_000_000)]  # sizes, batch sizes, samples per prompt
Every = Annotated[int, Field(strict=True, ge=0, le=1_000_000)]  # a period in steps; 0: never
# Sequences held in memory at once (a step's batch, a forward, a generate call): far above a real recipe's few
# thousand, far below 1e8, whose rows alone would fill a host's memory before the first step.
BATCH_LIMIT = 65_536
BatchSize = Annotated[int, Field(strict=True, ge=1, le=BATCH_LIMIT)]
Seed = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)]
LearningRate = Annotated[float, BeforeValidator(_no_bool), Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Fraction = Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, le=1.0, allow_inf_nan=False)]
NonNegative = Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, le=1e6, allow_inf_nan=False)]
Positive = Annotated[float, BeforeValidator(_no_bool), Field(gt=0.0, le=1e6, allow_inf_nan=False)]
AdamBeta = Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
Temperature = Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, le=10.0, allow_inf_nan=False)]
TopP = Annotated[float, BeforeValidator(_no_bool), Field(gt=0.0, le=1.0, allow_inf_nan=False)]
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class OpenAIEndpoint(Strict):
    """An OpenAI-compatible chat-completions endpoint: the openai teacher's and the judge's."""

    url: str = Field(pattern=r"^https?://")  # the API base, e.g. http://127.0.0.1:8000/v1
    model: str
    api_key_env: str | None = Field(None, pattern=ENV_NAME)  # the NAME of the variable holding the key
    timeout_s: Positive = 60.0
    max_retries: int = Field(4, strict=True, ge=0, le=100)  # per request, on 5xx, connection errors and timeouts
    backoff_s: NonNegative = 0.5  # doubled per retry ...
    max_backoff_s: NonNegative = 8.0  # ... up to this


Product = Literal["policy", "dataset", "prompts", "reward_model"]


class Read(NamedTuple):
    """An earlier stage a stage reads: through which field, which stage, and what that stage must make."""

    field: str
    stage: str
    product: Product
    hint: str = ""  # appended to the error when no such stage exists
