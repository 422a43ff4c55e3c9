"""The recipe: its schema and its validation.

A recipe YAML validates into `Recipe`: the run-wide sections (model, storage, tracking, engine, domains, eval,
gate) and an ordered list of stages. Each stage's `kind` picks its config class from the stage-kind registry
(`stages/kinds/registry.py`), so a new kind needs no edit here. Validation checks, before any work starts, that every
domain is known, stage names are unique, every stage reads only earlier stages that make what it needs, and
what each kind's own check adds. Overrides (`key=value`, the Prefect run form) are applied by `flows/recipes.py`
to the raw mapping before it comes here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import SerializeAsAny, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cascade.artifacts.config import StorageConfig, Strict, TrackingConfig
from cascade.artifacts.score_columns import ScoreColumn
from cascade.artifacts.urls import credential_error
from cascade.stages.errors import RecipeError
from cascade.stages.kinds import KINDS, chooses_teachers, kind_of, recovery_kinds
from cascade.stages.recipe.config_base import (
    SOURCE_EVAL,
    STORED,
    ComputeConfig,
    RecipeName,
    Seed,
    StageConfig,
    TrainingConfig,
)
from cascade.stages.recipe.data_sources import FileSource, ReadsDataFiles, SharedSource, SyntheticSource
from cascade.stages.recipe.recipe_file import load_bounded_yaml, read_recipe_file, resolve_recipe_path
from cascade.stages.recipe.sections import (
    DEFAULT_EVAL_SAMPLES,
    RECOVERY_PREFIX,
    DomainSpec,
    EngineConfig,
    EvalConfig,
    GateConfig,
    ModelConfig,
)
from cascade.stages.recipe.validation_errors import first_error
from cascade.stages.scoring.reward_sources import make_importable


class Recipe(Strict):
    name: RecipeName = "recipe"
    seed: Seed = 0
    model: ModelConfig = ModelConfig()
    storage: StorageConfig = StorageConfig()
    tracking: TrackingConfig = TrackingConfig()
    engine: EngineConfig = EngineConfig()
    compute: ComputeConfig = ComputeConfig()
    domains: dict[str, DomainSpec]
    stages: list[SerializeAsAny[StageConfig]]
    eval: EvalConfig = EvalConfig()
    gate: GateConfig = GateConfig()

    @model_validator(mode="before")
    @classmethod
    def _no_url_credentials(cls, raw: Any) -> Any:
        return refuse_url_credentials(raw)

    @field_validator("stages", mode="before")
    @classmethod
    def _stage_configs(cls, raw: Any, info: ValidationInfo) -> Any:
        """Each stage validates into its kind's config class; errors keep the path `<index>.<kind>.<field>`."""
        if not isinstance(raw, list):
            return raw  # pydantic's own "Input should be a valid list"
        return [_stage_config(f"stages.{i}", entry, info.context) for i, entry in enumerate(raw)]

    @field_validator("gate", mode="before")
    @classmethod
    def _recovery_config(cls, raw: Any, info: ValidationInfo) -> Any:
        """The gate's recovery validates into its kind's config class, as a stage does; one that names no kind is
        of the default recovery's kind."""
        if not isinstance(raw, dict) or not isinstance(raw.get("recovery"), dict):
            return raw
        default_kind = GateConfig.model_fields["recovery"].default.kind
        recovery = {"kind": default_kind, **raw["recovery"]}
        return {**raw, "recovery": _stage_config("gate.recovery", recovery, info.context)}

    @model_validator(mode="after")
    def _check_references(self, info: ValidationInfo) -> Recipe:
        from cascade.stages.domains import domain_names

        unknown = sorted(set(self.domains) - set(domain_names()))
        if unknown:
            raise ValueError(f"unknown domain(s) {unknown}; known: {domain_names()}")
        for name in self.domains:
            self.domain(name)  # bad options are refused here, before anything runs
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        if taken := [n for n in names if n.startswith(RECOVERY_PREFIX)]:
            raise ValueError(f"stage name(s) {taken}: {RECOVERY_PREFIX}<stage> names the gate's recovery stages")
        if self.eval.source and SOURCE_EVAL in names:
            raise ValueError(f"eval.source names the model source's eval row {SOURCE_EVAL!r}: rename that stage")
        for i, stage in enumerate(self.stages):
            _check_stage(stage, self.stages[:i], set(self.domains))
            _check_lora_targets(f"stage {stage.name!r}", stage, self.model, info)
        _check_lora_targets("gate.recovery", self.gate.recovery, self.model, info)
        if not kind_of(self.gate.recovery.kind).recovers:
            raise ValueError(
                f"gate.recovery: a {self.gate.recovery.kind} stage cannot recover; kinds that can: "
                f"{', '.join(recovery_kinds())}"
            )
        if not self.eval.enabled and any(chooses_teachers(s) for s in self.stages):
            raise ValueError("teachers: auto chooses from the evals, but eval.enabled is false")
        if self.eval.benchmarks:
            _check_benchmarks(self.eval)
        return self

    def domain(self, name: str):
        """The recipe's domain `name`, built with its `options`."""
        from cascade.stages.domains import get_domain

        return get_domain(name, self.domains[name].options)

    def tolerances(self) -> dict[str, float]:
        """Every score column the gate watches -> its tolerance: each domain (on its dev split where the eval scores
        one), and each benchmark ("bench/<name>") the recipe marks `gates: true`."""
        return {
            **{d: spec.tolerance for d, spec in self.domains.items()},
            **{ScoreColumn.benchmark(b).key: spec.tolerance for b, spec in self.eval.benchmarks.items() if spec.gates},
        }

    def eval_sampling(self, domain: str) -> tuple[float, int]:
        """(temperature, samples per item) of the domain's primary eval metric (DomainSpec.eval_temperature):
        unset, the temperature of the first stage that trains the domain on its own samples, else 1.0; greedy
        takes one sample."""
        from cascade.stages.kinds import gain_targets

        spec = self.domains[domain]
        temperature = spec.eval_temperature
        if temperature is None:
            trained = [s for s in self.stages if domain in gain_targets([s]).get(s.name, [])]
            temperature = next((t for s in trained if (t := s.sampling_temperature()) is not None), 1.0)
        return temperature, (1 if temperature == 0 else spec.eval_samples or DEFAULT_EVAL_SAMPLES)

    def stage(self, name: str) -> StageConfig:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def compute_for(self, stage: StageConfig) -> ComputeConfig:
        """The recipe's compute settings with the stage's own `compute:` keys in place of the recipe's."""
        override = stage.compute_override()
        return self.compute if override is None else override.over(self.compute)

    def model_stages(self) -> list[StageConfig]:
        """The stages that make a policy: each is evaluated and gated."""
        return [s for s in self.stages if kind_of(s.kind).makes == "policy"]


def refuse_url_credentials(raw: Any) -> Any:
    """Refuse user:password@ in any URL: it would be stored in recipe.json and Prefect's parameters."""
    if message := credential_error(raw):
        raise ValueError(message)
    return raw


def _stage_config(path: str, entry: Any, context: dict | None = None) -> StageConfig:
    """A stage mapping as its kind's config; `path` (e.g. `stages.3`) begins every error's location."""
    if isinstance(entry, StageConfig):
        return entry
    if not isinstance(entry, dict):
        raise _stage_error(f"{path}: a stage is a mapping with a `kind`")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise _stage_error(f"{path}.kind: unknown stage kind {kind!r}; known: {', '.join(sorted(KINDS))}")
    try:
        return KINDS[kind].config.model_validate(entry, context=context)
    except ValidationError as e:
        raise _stage_error(first_error(e, path, kind, model=KINDS[kind].config)) from None


def _stage_error(message: str) -> PydanticCustomError:
    """An error whose message carries its own path (validate_recipe prints it as is)."""
    return PydanticCustomError("stage", "{message}", {"message": message})


def _check_stage(stage: StageConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    missing = sorted(set(stage.named_domains()) - domains)
    if missing:
        raise ValueError(f"stage {stage.name!r} names domain(s) {missing} not declared in `domains`")
    for read in stage.reads():
        if not any(s.name == read.stage and kind_of(s.kind).makes == read.product for s in earlier):
            makers = "/".join(sorted(k for k, row in KINDS.items() if row.makes == read.product))
            raise ValueError(
                f"stage {stage.name!r} reads {read.field} {read.stage!r}, which no earlier {makers} "
                f"stage writes{read.hint}"
            )
    row = kind_of(stage.kind)
    if row.check is not None:
        row.check(stage, earlier, domains)
    if isinstance(stage, ReadsDataFiles):
        _check_sources(stage)


def _check_lora_targets(where: str, stage: StageConfig, model: ModelConfig, info: ValidationInfo) -> None:
    """Each name of a `lora.target_modules` list matches a layer of the model the stage trains, whose architecture
    is built from its config on the meta device (no weights read). A run's stored recipe is not checked again."""
    if not isinstance(stage, TrainingConfig) or stage.lora is None or stage.lora.target_modules == "all-linear":
        return
    if (info.context or {}).get(STORED):
        return
    from cascade.stages.train.lora import unknown_targets
    from cascade.stages.train.model import meta_model

    try:
        architecture = meta_model(model, stage.backbone(model.source), classifier=stage.trains_classifier)
    except OSError as e:  # a model that is not on this machine (smollm2-135m without its wheel)
        raise ValueError(f"{where}: lora.target_modules cannot be checked: {e}") from None
    unknown, names = unknown_targets(architecture, stage.lora.target_modules)
    if unknown:
        raise ValueError(
            f"{where}: lora.target_modules {unknown} match no layer of the model; the names that would: "
            f"{', '.join(names)}"
        )


def _check_benchmarks(cfg: EvalConfig) -> None:
    """Every benchmark column loads: a registered benchmark's file is under the data root, a user's file (when
    local: a path or file:// URL) is in a known format and every row of it parses. Here, not at the first eval: a
    missing file or a bad row found there had cost the run its SFT stage."""
    from cascade.artifacts.user_files import local_path
    from cascade.stages.domains import domain_names
    from cascade.stages.domains.benchdata import benchmark_registry, missing_data

    known = benchmark_registry()
    for name, spec in cfg.benchmarks.items():
        where = f"eval.benchmarks.{name}"
        if spec.file is None:
            if name not in known:
                raise ValueError(
                    f"{where}: unknown benchmark {name!r}; known: {', '.join(sorted(known))} (or give `file` and "
                    "`format` for a file of your own)"
                )
            if spec.format is not None:
                raise ValueError(f"{where}: `format` names the format of a `file`; this entry has no file")
            if missing := missing_data(known[name], cfg.resolved_data_root()):
                raise ValueError(f"{where}: {missing} (eval.data_root sets where they are)")
            continue
        if spec.source(name) not in known and spec.source(name) not in domain_names():
            raise ValueError(
                f"{where}: format {spec.source(name)!r} is neither a benchmark ({', '.join(sorted(known))}) nor a "
                f"domain ({', '.join(domain_names())})"
            )
        if local_path(spec.file) is not None:  # a remote file's rows are read when the eval runs
            _check_benchmark_rows(where, spec.source(name), spec.file)


def _check_benchmark_rows(where: str, source: str, file: str) -> None:
    from cascade.stages.domains.benchdata import BenchmarkError, load_items, resolve_benchmarks

    try:
        if not load_items(resolve_benchmarks([source], file)[0], data_file=file):
            raise BenchmarkError(f"{file} holds no items")
    except BenchmarkError as e:
        raise ValueError(f"{where}: {e}") from None


def _check_sources(cfg: ReadsDataFiles) -> None:
    """Local files must exist and shared formats must be known before any work starts."""
    from cascade.stages.domains.benchdata import benchmark_registry

    known = {name: spec.domain for name, spec in benchmark_registry().items()}
    data_root = cfg.resolved_data_root()
    for domain, sources in cfg.file_sources().items():
        for i, src in enumerate(sources):
            where = f"stage {cfg.name!r}: {cfg.sources_field}.{domain}.{i}"
            _check_conversations(cfg, domain, src, where)
            if isinstance(src, SharedSource):
                if not (data_root / src.file).is_file():
                    raise ValueError(f"{where}: data file not found: {data_root / src.file}")
                if src.format not in known:
                    raise ValueError(f"{where}: unknown format {src.format!r}; known: {', '.join(sorted(known))}")
                if known[src.format] != domain:
                    raise ValueError(f"{where}: format {src.format!r} is a {known[src.format]} benchmark, not {domain}")
            if isinstance(src, FileSource):
                local = src.path.removeprefix("file://")
                if "://" not in local and not Path(local).is_file():
                    raise ValueError(f"{where}: file not found: {src.path}")
                if src.format is None and not src.path.endswith((".jsonl", ".jsonl.gz", ".parquet")):
                    raise ValueError(f"{where}: cannot tell the format of {src.path}: set format: jsonl or parquet")
                if "://" not in local:  # a remote file's rows are read when the stage runs
                    _check_file_rows(cfg, domain, src, where)


def _check_conversations(cfg: ReadsDataFiles, domain: str, src: Any, where: str) -> None:
    from cascade.stages.domains import domain_names, get_domain
    from cascade.stages.domains.base import Domain

    if not src.gives_conversations():
        return
    if not cfg.reads_conversations:
        raise ValueError(f"{where}: conversations are SFT data (an sft_data source); an RL stage reads prompts")
    multi_turn = [d for d in domain_names() if type(get_domain(d)).conversation is not Domain.conversation]
    if isinstance(src, SyntheticSource) and domain not in multi_turn:
        raise ValueError(
            f"{where}: the {domain} generator has no multi-turn conversations; those that do: {', '.join(multi_turn)}"
        )


def _check_file_rows(cfg: ReadsDataFiles, domain: str, src: FileSource, where: str) -> None:
    from cascade.stages.datasets.sources import SourceError, check_file_source

    needs_reference, graded = cfg.reads_rows(domain)
    try:
        check_file_source(src, domain, needs_reference=needs_reference, graded=graded)
    except SourceError as e:
        raise ValueError(f"{where}: {e}") from None


def validate_recipe(raw: dict[str, Any], source: str = "recipe", stored: bool = False) -> Recipe:
    """stored: the recipe a run stored when it began (a resume): rules added since then that would refuse a
    setting it ran with are not applied again (config_base.STORED)."""
    try:
        return Recipe.model_validate(raw, context={STORED: True} if stored else None)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "stage":  # a stage's own error carries its full path
            raise RecipeError(f"{source}: {err['msg']}") from None
        raise RecipeError(f"{source}: {first_error(e, model=Recipe)}") from None


def load_recipe(name_or_path: str = "tiny", overrides: list[str] | None = None) -> Recipe:
    """A shipped recipe by name, or a YAML file, with `a.b.c=value` overrides applied, validated."""
    path = resolve_recipe_path(name_or_path)
    raw = read_recipe_file(path)
    make_importable(path.parent)  # a reward function's module beside the recipe file
    for item in overrides or []:
        apply_override(raw, item)
    try:
        return validate_recipe(raw, source=str(path))
    except RecipeError as e:
        raise blamed_override(path, overrides or [], str(e)) or e from None


def blamed_override(path: Path, overrides: list[str], error: str) -> RecipeError | None:
    """The error again, naming the key of the override that brought it (`bad override of 'k': ...`), where the file
    alone validates and applying the overrides one by one first gives this very error after that one; else None."""
    reason = error.removeprefix(f"{path}: ")
    raw = read_recipe_file(path)
    for item in overrides:
        apply_override(raw, item)
        try:
            validate_recipe(raw)
        except RecipeError as e:
            if str(e).removeprefix("recipe: ") == reason:  # the key, not the value: it may hold a credential
                return RecipeError(f"bad override of {item.partition('=')[0].strip()!r}: {reason}")
    return None


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply `a.b.c=value` in place. Stages are addressed by name: `stages.sft.steps=10`."""
    if "=" not in item:
        raise RecipeError(f"bad override {item!r}: expected key=value")
    key, _, text = item.partition("=")
    try:
        value = load_bounded_yaml(text, f"bad override {item!r}")
    except yaml.YAMLError:
        raise RecipeError(f"bad override {item!r}: value is not valid YAML") from None
    parts = key.strip().split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        node = _descend(node, part, ".".join(parts[: i + 1]), item)
    if not isinstance(node, dict):
        where = ".".join(parts[:-1])
        what = "a stage by name" if isinstance(node, list) else "a mapping"
        raise RecipeError(f"bad override {item!r}: {where} is not a mapping (address {what}, then a field)")
    node[parts[-1]] = value


def _descend(node: Any, part: str, path: str, item: str) -> Any:
    if isinstance(node, list):
        for entry in node:
            if isinstance(entry, dict) and entry.get("name", entry.get("kind")) == part:
                return entry
        names = [e.get("name", e.get("kind")) for e in node if isinstance(e, dict)]
        raise RecipeError(f"bad override {item!r}: no stage named {part!r} (stages: {names})")
    if not isinstance(node, dict):
        raise RecipeError(f"bad override {item!r}: {path} is not a mapping")
    return node.setdefault(part, {})
