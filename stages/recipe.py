"""Typed recipe: the one place every default lives.

A recipe YAML validates into `Recipe`. Every model forbids unknown keys, so a typo is an error, not a silently
ignored setting. Stage configs are a discriminated union on `kind`; the Prefect run form and the CLI's
`key=value` overrides both go through these models.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from artifacts.urls import credential_error
from stages.domains import DOMAIN_CLASSES

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
SMOLLM2 = "smollm2-135m"  # a model source name: SmolLM2-135M-Instruct from a PyPI wheel (stages.model)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)  # a value may be a secret


def _no_url_credentials(raw: Any) -> Any:
    """Refuse user:password@ in any URL: it would be stored in recipe.json and Prefect's parameters."""
    if message := credential_error(raw):
        raise ValueError(message)
    return raw


def config_hash(cfg: BaseModel) -> str:
    """Stable short hash of a config: part of every checkpoint's provenance and cache key."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cascade_home() -> Path:
    return Path(os.environ.get("CASCADE_HOME", "~/.cascade")).expanduser()


class ModelConfig(Strict):
    source: str = "tiny"  # "tiny" | an HF model dir | a checkpoint URI
    hidden_size: int = 256  # the tiny architecture; ignored for other sources
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 688
    bf16_autocast: bool = True  # measured 1.6x faster training on avx512_bf16 CPUs, same accuracy or better


class StorageConfig(Strict):
    root: str | None = None  # None: $CASCADE_STORE, else file://$CASCADE_HOME; or s3://bucket/prefix
    endpoint_url: str | None = None  # None: AWS_ENDPOINT_URL or the AWS default
    region: str | None = None
    profile: str | None = None

    def resolved_root(self) -> str:
        return self.root or os.environ.get("CASCADE_STORE") or f"file://{cascade_home()}"


class TrackingConfig(Strict):
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else a sqlite file under $CASCADE_HOME
    experiment: str = "cascade"
    enabled: bool = True

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{cascade_home() / 'mlflow.db'}"


class EngineConfig(Strict):
    kind: Literal["hf", "vllm"] = "hf"
    url: str | None = None  # an external OpenAI-compatible vLLM server instead of a managed one
    batch_size: int = 128  # sequences per generate call of the HF engine


class DomainSpec(Strict):
    train_size: int = 4000
    heldout_size: int = 500  # 500+ items resolve a ~4-point gain (MEASURED.md)
    max_new_tokens: int = 64
    tolerance: float = 0.05  # the gate fires when the score drops more than this below its best


class SourceDraw(Strict):
    """How many rows a source contributes, counted before filtering: a count, or a share of train_size."""

    count: int | None = Field(None, ge=0)
    share: float | None = Field(None, gt=0.0)  # of the domain's train_size
    # Neither: a synthetic source draws train_size rows, a file source all of its rows.

    @model_validator(mode="after")
    def _count_or_share(self) -> SourceDraw:
        if self.count is not None and self.share is not None:
            raise ValueError("give a source `count` or a `share`, not both")
        return self

    def rows(self, train_size: int) -> int | None:
        """Rows to draw; None: every row the source has."""
        if self.count is not None:
            return self.count
        if self.share is not None:
            return round(self.share * train_size)
        return None


class SyntheticSource(SourceDraw):
    kind: Literal["synthetic"] = "synthetic"  # the domain's own generator, train split


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


DataSource = Annotated[Union[SyntheticSource, SharedSource, FileSource], Field(discriminator="kind")]
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class OracleTeacher(Strict):
    kind: Literal["oracle"] = "oracle"  # the source's reference answer


class GenerationTeacher(Strict):
    temperature: float = 0.0
    max_new_tokens: int | None = Field(None, gt=0)  # None: the domain's max_new_tokens
    batch_size: int = Field(64, gt=0)  # prompts per generate call (openai: requests in flight)


class ModelTeacher(GenerationTeacher):
    kind: Literal["model"] = "model"
    source: str  # "tiny", "smollm2-135m", an HF model dir, or a checkpoint (URI or dir with MANIFEST.json)


class OpenAITeacher(GenerationTeacher):
    kind: Literal["openai"] = "openai"
    url: str = Field(pattern=r"^https?://")  # the API base, e.g. http://127.0.0.1:8000/v1
    model: str
    api_key_env: str | None = Field(None, pattern=ENV_NAME)  # the NAME of the variable holding the key
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(4, ge=0)  # per request, on 5xx, connection errors and timeouts
    backoff_s: float = Field(0.5, ge=0)  # doubled per retry ...
    max_backoff_s: float = Field(8.0, ge=0)  # ... up to this


TeacherConfig = Annotated[Union[OracleTeacher, ModelTeacher, OpenAITeacher], Field(discriminator="kind")]


class DedupConfig(Strict):
    exact: bool = True  # hash of the normalized prompt + response
    near: bool = True  # MinHash LSH over word shingles of prompt + response
    threshold: float = Field(0.9, gt=0.0, le=1.0)  # estimated Jaccard at which a row is a near-duplicate
    num_perm: int = Field(64, gt=0)
    shingle: int = Field(3, gt=0)  # words per shingle


class DecontaminationConfig(Strict):
    enabled: bool = True
    ngram: int = Field(13, gt=0)  # eval prompts shorter than this must appear whole (see stages/datasets/filters.py)
    benchmarks: list[str] = []  # benchmark files evaluated besides every recipe domain's held-out split


class SFTDataConfig(Strict):
    kind: Literal["sft_data"] = "sft_data"
    name: str = "sft_data"
    domains: list[str] | None = None  # None: every recipe domain
    sources: dict[str, list[DataSource]] = {}  # domain -> sources; a domain not listed: its synthetic generator
    teacher: TeacherConfig = OracleTeacher()
    teachers: dict[str, TeacherConfig] = {}  # per-domain override of `teacher`
    verify: bool = True  # rejection sampling: keep a generated answer only if the domain's grader passes it
    dedup: DedupConfig = DedupConfig()
    decontamination: DecontaminationConfig = DecontaminationConfig()
    max_tokens: int = Field(1024, gt=0)  # prompt + response tokens as SFT sees them; the tiny model's context
    shard_rows: int = Field(4096, gt=0)  # source rows per shard: the unit of commit and of resume
    data_root: str | None = None  # the real data files; None: <repo>/../shared/data; relative: to the repo

    def resolved_data_root(self) -> Path:
        from stages.domains.benchdata import DEFAULT_DATA_ROOT

        if self.data_root is None:
            return DEFAULT_DATA_ROOT
        return (RECIPES_DIR.parent / self.data_root).resolve()

    def domain_sources(self, domain: str) -> list[BaseModel]:
        return self.sources.get(domain) or [SyntheticSource()]

    def domain_teacher(self, domain: str) -> BaseModel:
        return self.teachers.get(domain, self.teacher)

    @model_validator(mode="after")
    def _check_sources(self) -> SFTDataConfig:
        for domain, sources in self.sources.items():
            for i, src in enumerate(sources):
                _check_source(src, domain, f"sources.{domain}.{i}", self.resolved_data_root())
        if self.decontamination.benchmarks:
            from stages.benchmarks import benchmark_registry

            unknown = sorted(set(self.decontamination.benchmarks) - set(benchmark_registry()))
            if unknown:
                raise ValueError(f"decontamination.benchmarks: unknown benchmark(s) {unknown}")
        return self


def _check_source(src: BaseModel, domain: str, where: str, data_root: Path) -> None:
    """Local files must exist and shared formats must be known before any work starts."""
    if isinstance(src, SharedSource):
        if not (data_root / src.file).is_file():
            raise ValueError(f"{where}: data file not found: {data_root / src.file}")
        from stages.benchmarks import benchmark_registry

        known = benchmark_registry()
        if src.format not in known:
            raise ValueError(f"{where}: unknown format {src.format!r}; known: {', '.join(sorted(known))}")
        if known[src.format].domain != domain:
            raise ValueError(f"{where}: format {src.format!r} is a {known[src.format].domain} benchmark, not {domain}")
    if isinstance(src, FileSource):
        local = src.path.removeprefix("file://")
        if "://" not in local and not Path(local).is_file():
            raise ValueError(f"{where}: file not found: {src.path}")
        if src.format is None and not src.path.endswith((".jsonl", ".jsonl.gz", ".parquet")):
            raise ValueError(f"{where}: cannot tell the format of {src.path}: set format: jsonl or parquet")


class SFTConfig(Strict):
    kind: Literal["sft"] = "sft"
    name: str = "sft"
    data: str = "sft_data"  # the sft_data stage whose dataset this trains on
    steps: int = 600
    batch_size: int = 32
    micro_batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    checkpoint_every: int = 200


class DifficultyConfig(Strict):
    """k rollouts of a reference model per train prompt; prompts it solves too often are dropped."""

    kind: Literal["difficulty"] = "difficulty"
    name: str = "difficulty"
    domains: list[str]
    # an earlier model stage | an HF model dir | "smollm2-135m" | http(s)://host:port of an OpenAI-compatible server
    reference: str = "sft"
    reference_tokenizer: str | None = None  # endpoint only: HF dir or "smollm2-135m" it serves; None: the tiny one
    prompts_per_domain: int | None = None  # the first N of each domain's train split; None: all train_size of them
    k: int = 8  # rollouts per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    drop_solved_at: int | None = None  # drop prompts solved in >= this many of k rollouts; None: k (solved every time)
    unsolved: Literal["keep", "drop", "keep_fraction"] = "keep"  # prompts solved 0/k times
    unsolved_fraction: float | None = None  # with unsolved=keep_fraction: the share of them kept (seeded draw)

    @model_validator(mode="after")
    def _check_thresholds(self) -> DifficultyConfig:
        if self.k < 1:
            raise ValueError(f"stage {self.name!r}: k must be at least 1, got {self.k}")
        if self.drop_solved_at is not None and not 1 <= self.drop_solved_at <= self.k:
            raise ValueError(f"stage {self.name!r}: drop_solved_at must be between 1 and k={self.k}, "
                             f"got {self.drop_solved_at}")
        if (self.unsolved == "keep_fraction") != (self.unsolved_fraction is not None):
            raise ValueError(f"stage {self.name!r}: unsolved_fraction is required with unsolved=keep_fraction, "
                             "and only then")
        if self.unsolved_fraction is not None and not 0.0 <= self.unsolved_fraction <= 1.0:
            raise ValueError(f"stage {self.name!r}: unsolved_fraction must be in [0, 1], got {self.unsolved_fraction}")
        return self

    @property
    def solved_threshold(self) -> int:
        return self.k if self.drop_solved_at is None else self.drop_solved_at


def reference_kind(reference: str) -> Literal["endpoint", "model", "stage"]:
    """How a difficulty reference is read: a URL, a model source (path or named model), else a stage name."""
    if reference.startswith(("http://", "https://")):
        return "endpoint"
    if reference == SMOLLM2 or "/" in reference or reference.startswith((".", "~")):
        return "model"
    return "stage"


class OnPolicyConfig(Strict):
    """What every on-policy stage (GRPO, MOPD) shares: sample from the current policy, one update per batch."""

    steps: int = 60
    prompts_per_step: int = 16
    group_size: int = 8  # samples per prompt
    micro_batch_size: int = 64  # sequences per forward/backward; the loss is normalized globally
    lr: float = 5e-5
    temperature: float = 1.0
    top_p: float = 1.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    checkpoint_every: int = 20


class GRPOConfig(OnPolicyConfig):
    kind: Literal["grpo"] = "grpo"
    name: str
    domains: list[str]
    std_eps: float = 1e-6
    prompts: str | None = None  # an earlier difficulty stage whose kept prompts to train on; None: the train split


class MOPDConfig(OnPolicyConfig):
    kind: Literal["mopd"] = "mopd"
    name: str = "mopd"
    domains: list[str] | None = None  # None: every domain that has a teacher
    teachers: dict[str, str] = {}  # domain -> earlier stage whose checkpoint teaches it; the gate fills it on recovery
    steps: int = 40  # the paper converges in ~30-50 steps
    group_size: int = 4  # token-level teacher signal needs fewer samples per prompt than a group baseline
    eps_low: float = 0.5
    eps_high: float = 2.0
    teacher_residency: Literal["resident", "one_at_a_time"] = "resident"


StageConfig = Annotated[
    Union[SFTDataConfig, SFTConfig, DifficultyConfig, GRPOConfig, MOPDConfig], Field(discriminator="kind")
]
MODEL_STAGE_KINDS = ("sft", "grpo", "mopd")


class EvalConfig(Strict):
    enabled: bool = True
    batch_size: int = 256


class GateConfig(Strict):
    policy: Literal["recover", "warn", "fail"] = "warn"
    max_recoveries: int = 1  # MOPD recoveries per run; past it the gate only warns
    recovery: MOPDConfig = MOPDConfig(name="recovery")  # teachers come from the eval history


class Recipe(Strict):
    name: str = "recipe"
    seed: int = 0
    model: ModelConfig = ModelConfig()
    storage: StorageConfig = StorageConfig()
    tracking: TrackingConfig = TrackingConfig()
    engine: EngineConfig = EngineConfig()
    domains: dict[str, DomainSpec]
    stages: list[StageConfig]
    eval: EvalConfig = EvalConfig()
    gate: GateConfig = GateConfig()

    _credentials = model_validator(mode="before")(_no_url_credentials)

    @model_validator(mode="after")
    def _check_references(self) -> Recipe:
        from stages.domains import domain_names

        unknown = sorted(set(self.domains) - set(domain_names()))
        if unknown:
            raise ValueError(f"unknown domain(s) {unknown}; known: {domain_names()}")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        for i, stage in enumerate(self.stages):
            _check_stage(stage, self.stages[:i], set(self.domains))
        return self

    def stage(self, name: str) -> StageConfig:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


def _check_stage(stage: BaseModel, earlier: list[BaseModel], domains: set[str]) -> None:
    listed = getattr(stage, "domains", None) or []
    missing = sorted(set(listed) - domains)
    if missing:
        raise ValueError(f"stage {stage.name!r} names domain(s) {missing} not declared in `domains`")
    if isinstance(stage, SFTDataConfig):
        extra = sorted((set(stage.sources) | set(stage.teachers)) - set(stage.domains or domains))
        if extra:
            raise ValueError(f"stage {stage.name!r} gives sources or teachers for domain(s) {extra} it does not build")
    if isinstance(stage, SFTConfig) and stage.data not in {s.name for s in earlier if s.kind == "sft_data"}:
        raise ValueError(f"stage {stage.name!r} reads data {stage.data!r}, which no earlier sft_data stage writes")
    if isinstance(stage, DifficultyConfig) and reference_kind(stage.reference) == "stage":
        if stage.reference not in {s.name for s in earlier if s.kind in MODEL_STAGE_KINDS}:
            raise ValueError(f"stage {stage.name!r}: reference {stage.reference!r} is not an earlier model stage, "
                             f"an HF model dir, {SMOLLM2!r} or an http(s):// endpoint")
    if isinstance(stage, GRPOConfig) and stage.prompts is not None:
        source = next((s for s in earlier if s.kind == "difficulty" and s.name == stage.prompts), None)
        if source is None:
            raise ValueError(f"stage {stage.name!r} reads prompts {stage.prompts!r}, which no earlier difficulty "
                             "stage writes")
        unfiltered = sorted(set(stage.domains) - set(source.domains))
        if unfiltered:
            raise ValueError(f"stage {stage.name!r} trains on domain(s) {unfiltered} that difficulty stage "
                             f"{stage.prompts!r} does not filter")
    if isinstance(stage, MOPDConfig):
        models = {s.name for s in earlier if s.kind in MODEL_STAGE_KINDS}
        bad = sorted(t for t in stage.teachers.values() if t not in models)
        if bad:
            raise ValueError(f"stage {stage.name!r}: teacher stage(s) {bad} are not earlier model stages")
        missing = sorted(set(stage.teachers) - domains)
        if missing:
            raise ValueError(f"stage {stage.name!r} names teacher domain(s) {missing} not declared in `domains`")


class RecipeError(ValueError):
    """Bad recipe input; the CLI prints it as one line and exits 2."""


def resolve_recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise RecipeError(f"recipe file not found: {path}")
        return path
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if not shipped.exists():
        known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise RecipeError(f"unknown recipe {name_or_path!r}; shipped recipes: {known}")
    return shipped


def load_recipe(name_or_path: str = "tiny", overrides: list[str] | None = None) -> Recipe:
    path = resolve_recipe_path(name_or_path)
    raw = _parse_yaml(path.read_text(), str(path))
    raw.setdefault("name", path.stem)
    for item in overrides or []:
        apply_override(raw, item)
    return validate_recipe(raw, source=str(path))


def validate_recipe(raw: dict[str, Any], source: str = "recipe") -> Recipe:
    from pydantic import ValidationError

    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise RecipeError(f"{source}: {where}: {err['msg']}") from None


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply `a.b.c=value` in place. Stages are addressed by name: `stages.sft.steps=10`."""
    if "=" not in item:
        raise RecipeError(f"bad override {item!r}: expected key=value")
    key, _, text = item.partition("=")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise RecipeError(f"bad override {item!r}: value is not valid YAML") from None
    parts = key.strip().split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        node = _descend(node, part, ".".join(parts[: i + 1]), item)
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


# The Prefect run form of the `cascade` deployment: a shipped recipe (a dropdown) or a YAML path/URI, plus typed
# overrides of the fields users change most. Types and bounds here become the form's JSON schema, so the server
# refuses a bad value (negative steps, unknown domain) before a run is created.
RecipeName = Literal[tuple(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))]  # type: ignore[valid-type]
DomainName = Literal[tuple(sorted(DOMAIN_CLASSES))]  # type: ignore[valid-type]
RUN_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,80}$"


class StageOverride(Strict):
    steps: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)


class RunRequest(Strict):
    recipe: RecipeName = "tiny"
    recipe_uri: str | None = Field(None, description="A recipe YAML path or file:// / s3:// URI; replaces `recipe`.")
    steps: int | None = Field(None, ge=1, description="Steps of every training stage (sft, grpo, mopd).")
    lr: float | None = Field(None, gt=0, description="Peak learning rate of every training stage.")
    stages: dict[str, StageOverride] = Field({}, description="Per stage, by name: steps and lr (win over the above).")
    domains: list[DomainName] | None = Field(
        None, min_length=1, description="Train and evaluate only these of the recipe's domains; an RL or "
        "difficulty stage left with none of its domains is dropped.")
    storage_root: str | None = Field(None, pattern=r"^(file|s3)://([^/?#@]+|[^/?#@]*/.*)$",  # no user:pw@
                                     description="file:///dir or s3://bucket/prefix; credentials come from the "
                                     "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE)")
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="Continue this run; empty: a new run.")

    _credentials = model_validator(mode="before")(_no_url_credentials)


def request_recipe(req: RunRequest, read_uri: Any = None) -> Recipe:
    """The recipe a run form asks for: the named or given recipe with the form's overrides applied.

    `read_uri(uri) -> bytes` reads a recipe given by URI (the caller owns storage access)."""
    source = req.recipe_uri or req.recipe
    if req.recipe_uri and "://" in req.recipe_uri:
        if read_uri is None:
            raise RecipeError(f"cannot read recipe URI {req.recipe_uri!r} here")
        raw = _parse_yaml(read_uri(req.recipe_uri).decode(), req.recipe_uri)
        raw.setdefault("name", Path(req.recipe_uri).stem)
    else:
        path = resolve_recipe_path(source)
        raw = _parse_yaml(path.read_text(), str(path))
        raw.setdefault("name", path.stem)
    _override_stages(raw, req)
    if req.domains is not None:
        _restrict_domains(raw, req.domains, source)
    if req.storage_root is not None:
        raw.setdefault("storage", {})["root"] = req.storage_root
    return validate_recipe(raw, source=source)


def _override_stages(raw: dict[str, Any], req: RunRequest) -> None:
    stages = raw.get("stages") or []
    names = [s.get("name", s.get("kind")) for s in stages]
    unknown = sorted(set(req.stages) - set(names))
    if unknown:
        raise RecipeError(f"stages: no stage named {unknown} (stages: {names})")
    for stage, name in zip(stages, names):
        if stage.get("kind") not in MODEL_STAGE_KINDS:
            if name in req.stages:
                raise RecipeError(f"stages.{name}: a {stage.get('kind')} stage has no steps or lr")
            continue
        per_stage = req.stages.get(name, StageOverride())
        for field in ("steps", "lr"):
            value = getattr(per_stage, field) if getattr(per_stage, field) is not None else getattr(req, field)
            if value is not None:
                stage[field] = value


def _restrict_domains(raw: dict[str, Any], keep: list[str], source: str) -> None:
    declared = raw.get("domains") or {}
    missing = sorted(set(keep) - set(declared))
    if missing:
        raise RecipeError(f"domains: {missing} not in recipe {source} (it has {sorted(declared)})")
    raw["domains"] = {d: spec for d, spec in declared.items() if d in keep}
    kept = []
    for stage in raw.get("stages") or []:
        listed = stage.get("domains")
        if listed is not None:
            stage["domains"] = [d for d in listed if d in keep]
            if not stage["domains"] and stage.get("kind") in ("grpo", "difficulty"):
                continue
        if stage.get("teachers"):
            stage["teachers"] = {d: t for d, t in stage["teachers"].items() if d in keep}
        kept.append(stage)
    raw["stages"] = kept


def _parse_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise RecipeError(f"{source}: not valid YAML: {str(e).splitlines()[0]}") from None
