"""Where a stage reads rows and answers: the data source configs (a domain's synthetic generator, a shipped
benchmark file, a user's file), the teacher configs that answer a source's prompts, and `ReadsDataFiles`, what a
stage that reads them shares (the sft_data stage, and a GRPO stage's prompts). Configs only: reading them is
stages/datasets/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from cascade.artifacts.config import Strict
from cascade.stages.recipe.config_base import BatchSize, Count, OpenAIEndpoint, Positive, Temperature, resolve_data_root


class SourceDraw(Strict):
    """How many rows a source contributes, counted before filtering: a count, or a share of train_size."""

    count: int | None = Field(None, strict=True, ge=0, le=100_000_000)
    share: Positive | None = None  # of the domain's train_size
    # Neither: a synthetic source draws train_size rows, a file source all of its rows.

    @model_validator(mode="after")
    def _count_or_share(self) -> SourceDraw:
        if self.count is not None and self.share is not None:
            raise ValueError("give a source `count` or a `share`, not both")
        return self

    def gives_conversations(self) -> bool:
        """Whole conversations (answered: no teacher), not prompts."""
        return False

    def rows(self, train_size: int) -> int | None:
        """Rows to draw; None: every row the source has."""
        if self.count is not None:
            return self.count
        if self.share is not None:
            return round(self.share * train_size)
        return None


class SyntheticSource(SourceDraw):
    kind: Literal["synthetic"] = "synthetic"  # the domain's own generator, train split
    # sft_data only: the domain's items as multi-turn conversations (tool: request, call, the tool's result,
    # answer), trained on every assistant turn; no teacher is asked
    conversations: bool = False

    def gives_conversations(self) -> bool:
        return self.conversations


class SharedSource(SourceDraw):
    kind: Literal["shared"] = "shared"
    file: str  # relative to the stage's data_root, e.g. math/gsm8k_train.jsonl
    format: str  # a benchmark whose native row format the file has (gsm8k: question, answer "... #### 72")


class FileSource(SourceDraw):
    kind: Literal["file"] = "file"
    path: str  # a local path or any fsspec URL (s3://bucket/key); .jsonl, .jsonl.gz or .parquet
    format: Literal["jsonl", "parquet"] | None = None  # None: from the suffix
    prompt_field: str = "prompt"
    reference_field: str = "reference"  # the oracle teacher's answer; other teachers do not need it
    meta_field: str = "meta"  # what the domain's grader reads (math: {"answer": "72"}); optional
    # sft_data only: rows are whole conversations in this field (a list of {role, content}; roles system, user,
    # assistant, tool), trained on every assistant turn; no teacher is asked. None: rows are prompts.
    messages_field: str | None = None

    def gives_conversations(self) -> bool:
        return self.messages_field is not None


DataSource = Annotated[SyntheticSource | SharedSource | FileSource, Field(discriminator="kind")]


class OracleTeacher(Strict):
    kind: Literal["oracle"] = "oracle"  # the source's reference answer


class GenerationTeacher(Strict):
    temperature: Temperature = 0.0
    max_new_tokens: Count | None = None  # None: the domain's max_new_tokens
    batch_size: BatchSize = 64  # prompts per generate call (openai: requests in flight)


class ModelTeacher(GenerationTeacher):
    kind: Literal["model"] = "model"
    source: str  # "tiny", "smollm2-135m", an HF model dir, or a checkpoint (URI or dir with MANIFEST.json)


class OpenAITeacher(GenerationTeacher, OpenAIEndpoint):
    kind: Literal["openai"] = "openai"


TeacherConfig = Annotated[OracleTeacher | ModelTeacher | OpenAITeacher, Field(discriminator="kind")]


class ReadsDataFiles(Strict):
    """A stage that reads prompts from data files: `shared` sources resolve against its data root. By default
    an RL stage's: prompts (its `prompts:` field), graded, a reference answer not needed, no conversations; the
    SFT data build says otherwise of itself."""

    sources_field: ClassVar[str] = "prompts"  # the config field that lists its sources, for error lines
    reads_conversations: ClassVar[bool] = False  # whether a source may give multi-turn conversations

    data_root: str | None = None  # the real data files; None: <repo>/../shared/data; relative: to the repo

    def reads_rows(self, domain: str) -> tuple[bool, bool]:
        """What a file row of `domain` must carry: (a reference answer, a gradable prompt)."""
        return False, True

    def resolved_data_root(self) -> Path:
        return resolve_data_root(self.data_root)

    def file_sources(self) -> dict[str, list[BaseModel]]:
        """domain -> the sources the recipe gives it (checked for existence before any work)."""
        raise NotImplementedError

    def domain_sources(self, domain: str) -> list[BaseModel]:
        """A domain's sources; one the recipe gives none reads its synthetic generator's train split."""
        return self.file_sources().get(domain) or [SyntheticSource()]
