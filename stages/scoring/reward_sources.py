"""The registry of reward sources: one row per source an RL stage's `reward:` may name, as stage kinds are
registered in their folders (stages/kinds/<kind>/).

A row says what a source is: its config class (a `RewardSourceConfig` whose `kind:` is the row's name), how it is
built (`build(cfg, ctx, stages) -> stages.scoring.rewards.RewardSource`, with `stages` the checkpoints of the stages its
config `reads`; imported on first use, so validating a recipe loads no model), and whether its scoring forwards a
frozen model over every sampled token (the plan counts those tokens).

A stage's `reward:` is one source (`{kind: grader}`) or a weighted sum of them, a list of `{source, weight}`: each
rollout's reward is the sum of weight x that source's reward. Adding a source is one row:
`register_reward_source(RewardSourceRow(...))` (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    SerializeAsAny,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from cascade.artifacts.config import Strict
from cascade.stages.recipe.config_base import (
    BatchSize,
    Count,
    NonNegative,
    OpenAIEndpoint,
    Positive,
    Read,
    _no_bool,
    imported_on_call,
)
from cascade.stages.recipe.validation_errors import first_error


class RewardSourceConfig(Strict):
    """What every reward source's config has: the `kind:` that picks its row."""

    kind: str

    def reads(self, field: str) -> list[Read]:
        """The earlier stages this source scores with, found through `field` (its place in the stage config)."""
        return []


class GraderReward(RewardSourceConfig):
    """The domain's own grader scores each rollout: the same function the eval uses."""

    kind: Literal["grader"] = "grader"


class RewardModelReward(RewardSourceConfig):
    """An earlier reward_model stage's scalar score, with the group's length trend taken out
    (stages.train.losses.length_normalized_rewards; 0: the raw score)."""

    kind: Literal["reward_model"] = "reward_model"
    stage: str  # the reward_model stage whose checkpoint scores
    length_coef: NonNegative = 0.5
    batch_size: BatchSize = 64  # sequences per reward-model forward

    def reads(self, field: str) -> list[Read]:
        return [Read(f"{field}.stage", self.stage, "reward_model")]


class JudgeReward(RewardSourceConfig, OpenAIEndpoint):
    """A generative judge compares each rollout with the item's reference answer (stages/scoring/judge.py)."""

    kind: Literal["judge"] = "judge"
    max_tokens: Count = 8  # the verdict is one letter
    concurrency: Count = 16  # requests in flight


FUNCTION_PATH = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"  # "package.module:function"


class CallableReward(RewardSourceConfig):
    """A Python function with TRL's reward-function signature, f(prompts, completions, **fields) -> list[float]:
    one prompt and one completion per rollout, and each of the item's fields as a list aligned with them
    (stages/scoring/rewards.py: CallableRewards). Checked when the recipe validates: it must import and be callable.
    Each call runs in a worker thread and fails the stage when it takes longer than `timeout_s`."""

    kind: Literal["callable"] = "callable"
    function: str = Field(pattern=FUNCTION_PATH)
    timeout_s: Positive = 300.0  # seconds per call; a call scores a step's rollouts (or a refill round's)

    @model_validator(mode="after")
    def _importable(self) -> CallableReward:
        import_function(self.function)
        return self


def import_function(path: str) -> Callable[..., Any]:
    """The function named "package.module:function"; a ValueError of one line when it is not one. Its module is
    found on the import path, which ends with the working directory and the folder of each recipe file loaded
    (`make_importable`): a rewards module beside the recipe imports without PYTHONPATH."""
    module_name, _, name = path.partition(":")
    make_importable(Path.cwd())
    try:
        module = importlib.import_module(module_name)
    # the user's module may fail in any way while it is imported; a sys.exit() there would end `cascade run` with
    # exit 0 and no run (KeyboardInterrupt stays the user's)
    except (Exception, SystemExit) as e:
        first = (str(e).splitlines() or [""])[0]
        raise ValueError(
            f"reward function {path!r}: cannot import {module_name}: {type(e).__name__}: {first}"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"reward function {path!r}: {module_name} has no callable {name!r}")
    return function


def make_importable(folder: Path) -> None:
    """Put `folder` at the end of the import path (once), as Python puts a script's folder at its start: modules
    there import, and never shadow an installed package of the same name."""
    entry = str(folder.resolve())
    if entry not in sys.path:
        sys.path.append(entry)


# build(cfg, ctx: stages.train.context.StageContext, stages: read stage name -> CheckpointRef)
#   -> stages.scoring.rewards.RewardSource
RewardBuild = Callable[[Any, Any, dict], Any]


@dataclass(frozen=True)
class RewardSourceRow:
    kind: str  # the `reward:` config's `kind:`
    config: type[RewardSourceConfig]
    build: RewardBuild
    frozen_forward: bool = False  # scoring forwards a frozen model over every sampled token (the plan's cost)
    # its scoring, or a metric it logs beside it, calls the domain's grader: each prompt row must carry the meta that
    # grader reads (checked when the recipe validates)
    uses_grader: bool = True


REWARD_SOURCES: dict[str, RewardSourceRow] = {}


def register_reward_source(row: RewardSourceRow) -> None:
    """Add (or replace) a reward source: the built-in ones below, a user's own, or a test's."""
    REWARD_SOURCES[row.kind] = row


def unregister_reward_source(kind: str) -> None:
    REWARD_SOURCES.pop(kind, None)


def source_config(raw: Any) -> Any:
    """One `reward:` mapping as its source's config (its row picked by `kind`); configs pass through."""
    if not isinstance(raw, dict):
        return raw  # a config already, or pydantic's own error for what is neither
    kind = raw.get("kind")
    if kind not in REWARD_SOURCES:
        raise ValueError(f"unknown reward source {kind!r}; known: {', '.join(sorted(REWARD_SOURCES))}")
    try:
        return REWARD_SOURCES[kind].config.model_validate(raw)
    except ValidationError as e:
        raise ValueError(first_error(e)) from None


# The most a reward, or a term's weight, may be in magnitude: a weighted sum stays far inside float32 (where 1e39 is
# already inf), and so do the advantages GRPO computes from it. A callable's rewards are held to it as it returns them.
MAX_REWARD = 1e6
Weight = Annotated[float, BeforeValidator(_no_bool), Field(ge=-MAX_REWARD, le=MAX_REWARD, allow_inf_nan=False)]


class WeightedReward(Strict):
    """One term of a summed reward: a source and its weight (negative: a penalty)."""

    source: SerializeAsAny[RewardSourceConfig]
    weight: Weight = 1.0

    _source = field_validator("source", mode="before")(source_config)


# A stage's `reward:`: one source (a mapping with `kind`), or a list of weighted sources whose rewards are summed.
RewardSpec = Annotated[
    Annotated[SerializeAsAny[RewardSourceConfig], Tag("source")]
    | Annotated[list[WeightedReward], Field(min_length=1), Tag("sum")],
    Discriminator(lambda value: "sum" if isinstance(value, list) else "source"),
    BeforeValidator(source_config),
]


def reward_terms(reward: Any) -> list[WeightedReward]:
    """A stage's reward as its weighted terms: one source is one term of weight 1."""
    return list(reward) if isinstance(reward, list) else [WeightedReward(source=reward)]


def reward_uses_grader(reward: Any) -> bool:
    """Whether any term of a stage's reward calls the domain's grader (a reward of one's own reads a row as it is)."""
    return any(REWARD_SOURCES[term.source.kind].uses_grader for term in reward_terms(reward))


def reward_reads(reward: Any, field: str) -> list[Read]:
    """The earlier stages a stage's reward scores with (`field`: where the reward sits in the stage config)."""
    if not isinstance(reward, list):
        return reward.reads(field)
    return [read for i, term in enumerate(reward) for read in term.source.reads(f"{field}.{i}.source")]


for _row in (
    RewardSourceRow("grader", GraderReward, imported_on_call("cascade.stages.scoring.rewards", "GraderRewards")),
    RewardSourceRow(
        "reward_model",
        RewardModelReward,
        imported_on_call("cascade.stages.scoring.rewards", "RewardModelRewards"),
        frozen_forward=True,
    ),
    RewardSourceRow("judge", JudgeReward, imported_on_call("cascade.stages.scoring.judge", "JudgeRewards")),
    RewardSourceRow(
        "callable",
        CallableReward,
        imported_on_call("cascade.stages.scoring.rewards", "CallableRewards"),
        uses_grader=False,
    ),
):
    register_reward_source(_row)
