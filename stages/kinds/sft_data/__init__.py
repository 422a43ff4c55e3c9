"""The sft_data stage kind: its config (here: sources, teachers, filters) and, in `run_sft_data.py`, its run function,
which builds the SFT dataset as Parquet shards.

This folder owns the kind's whole registry row (registered below, with the checks, plan estimate and report card
it names); the row imports `run_sft_data.py` only on its first call: validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from cascade.artifacts.config import Strict
from cascade.artifacts.report import Breakdown, ReportCard
from cascade.stages.kinds.registry import StageKind, register_kind
from cascade.stages.recipe.config_base import Count, Fraction, Name, StageConfig, imported_on_call
from cascade.stages.recipe.data_sources import DataSource, OracleTeacher, ReadsDataFiles, SyntheticSource, TeacherConfig
from cascade.stages.recipe.estimate import DATA_BYTES_PER_TOKEN, StageEstimate, mean_new_tokens


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

    sources_field: ClassVar[str] = "sources"
    reads_conversations: ClassVar[bool] = True

    def file_sources(self) -> dict[str, list[BaseModel]]:
        return dict(self.sources)

    def named_domains(self) -> list[str]:
        return list(self.domains or [])

    def domain_teacher(self, domain: str) -> TeacherConfig:
        return self.teachers.get(domain, self.teacher)

    def reads_rows(self, domain: str) -> tuple[bool, bool]:
        """The oracle teacher answers with the row's reference; only generated answers are graded."""
        oracle = isinstance(self.domain_teacher(domain), OracleTeacher)
        return oracle, self.verify and not oracle


# Its registry row, and what the row names: the checks only this kind knows, its plan estimate, its report card.


def _check_sft_data(cfg: SFTDataConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    from cascade.stages.domains.benchdata import benchmark_registry

    extra = sorted((set(cfg.sources) | set(cfg.teachers)) - set(cfg.domains or domains))
    if extra:
        raise ValueError(f"stage {cfg.name!r} gives sources or teachers for domain(s) {extra} it does not build")
    if unknown := sorted(set(cfg.decontamination.benchmarks) - set(benchmark_registry())):
        raise ValueError(f"decontamination.benchmarks: unknown benchmark(s) {unknown}")


def _estimate_sft_data(cfg: SFTDataConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    names = cfg.domains or list(recipe.domains)
    rows, note = source_rows(cfg, recipe, names)
    generated = [d for d in names if cfg.domain_teacher(d).kind != "oracle"]
    return StageEstimate(
        cfg.name,
        cfg.kind,
        tokens_sampled=sum(rows[d] * recipe.domains[d].max_new_tokens for d in generated),
        storage_bytes=sum(rows.values()) * (prompt_tokens + int(mean_new_tokens(recipe, names))) * DATA_BYTES_PER_TOKEN,
        notes=[note],
    )


def source_rows(cfg: SFTDataConfig, recipe: Any, names: list[str]) -> tuple[dict[str, int], str]:
    """(domain -> rows the estimate counts, the plan's note on them): synthetic rows and counted file rows; a file
    read whole is named, its rows unknown until it is read."""
    from cascade.stages.datasets.sources import draw_count, source_label

    rows = dict.fromkeys(names, 0)
    synthetic = counted = 0
    whole: list[str] = []
    for d in names:
        for src in cfg.domain_sources(d):
            n = draw_count(src, recipe.domains[d].train_size)
            if n is None:
                whole.append(source_label(d, src).split(":", 1)[1])
                continue
            rows[d] += n
            if isinstance(src, SyntheticSource):
                synthetic += n
            else:
                counted += n
    parts = [f"{synthetic:,} synthetic rows"] if synthetic or not (counted or whole) else []
    parts += [f"{counted:,} counted file rows"] if counted else []
    parts += [f"every row of {', '.join(whole)}"] if whole else []
    return rows, "; ".join(parts)


# The data card of the report (stages/datasets/card.py writes these metrics).
SFT_DATA_CARD = ReportCard(
    title="SFT data card",
    totals=(("rows kept", "rows"), ("tokens", "tokens"), ("input rows", "input_rows"), ("shards", "shards")),
    breakdowns=(
        Breakdown(label="domain", columns=(("rows", "rows/"), ("tokens", "tokens/"))),
        Breakdown(label="dropped because", columns=(("rows", "dropped/"),)),
    ),
)


register_kind(
    StageKind(
        "sft_data",
        SFTDataConfig,
        imported_on_call("cascade.stages.kinds.sft_data.run_sft_data", "run_sft_data"),
        makes="dataset",
        takes_policy=False,
        holds_compute=False,
        check=_check_sft_data,
        estimate=_estimate_sft_data,
        report_card=SFT_DATA_CARD,
    )
)
