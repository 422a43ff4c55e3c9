"""The sft_data stage kind: its config (here: sources, teachers, filters) and, in `run.py`, its run function,
which builds the SFT dataset as Parquet shards.

The registry (stages/kinds/__init__.py) imports the config, and `run.py` only on the row's first call:
validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from cascade.artifacts.config import Strict
from cascade.stages.config_base import (
    Count,
    DataSource,
    Fraction,
    Name,
    OracleTeacher,
    ReadsDataFiles,
    StageConfig,
    TeacherConfig,
)


class DedupConfig(Strict):
    exact: bool = True  # hash of the normalized prompt + response
    near: bool = True  # MinHash LSH over word shingles of prompt + response
    threshold: Fraction = 0.9  # estimated Jaccard at which a row is a near-duplicate
    num_perm: Count = 64
    shingle: Count = 3  # words per shingle


class DecontaminationConfig(Strict):
    enabled: bool = True
    ngram: Count = 13  # eval prompts shorter than this must appear whole (see stages/datasets/filters.py)
    benchmarks: list[str] = []  # benchmark files evaluated besides every recipe domain's held-out split


class SFTDataConfig(StageConfig, ReadsDataFiles):
    kind: Literal["sft_data"] = "sft_data"
    name: Name = "sft_data"
    domains: list[str] | None = None  # None: every recipe domain
    sources: dict[str, list[DataSource]] = {}  # domain -> sources; a domain not listed: its synthetic generator
    teacher: TeacherConfig = OracleTeacher()
    teachers: dict[str, TeacherConfig] = {}  # per-domain override of `teacher`
    verify: bool = True  # rejection sampling: keep a generated answer only if the domain's grader passes it
    dedup: DedupConfig = DedupConfig()
    decontamination: DecontaminationConfig = DecontaminationConfig()
    max_tokens: Count = 1024  # prompt + response tokens as SFT sees them; the tiny model's context
    shard_rows: Count = 4096  # source rows per shard: the unit of commit and of resume

    def file_sources(self) -> dict[str, list[BaseModel]]:
        return dict(self.sources)

    def domain_teacher(self, domain: str) -> BaseModel:
        return self.teachers.get(domain, self.teacher)
