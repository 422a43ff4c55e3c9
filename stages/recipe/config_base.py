"""What every stage config builds on: the bounds shared by fields of the same meaning, an earlier stage a stage
reads (`Read`), the base classes of every kind's config (`StageConfig`, `TrainingConfig`, `OnPolicyConfig`, ...),
where a training stage runs (`ComputeConfig`), the data sources and teachers a stage reads prompts and answers
from, an OpenAI-compatible endpoint, and how a registry row names its function without importing it
(`imported_on_call`).

Each kind's own config lives with its kind (`stages/kinds/<kind>/__init__.py`), and the recipe's other sections
in `stages/recipe/sections.py`; this module imports neither, so that every kind's config, the kind registry
(`stages/kinds/registry.py`) and the reward-source registry (`stages/scoring/reward_sources.py`) import it without an
import cycle.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    model_validator,
)

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


REPO_ROOT = Path(__file__).resolve().parents[2]
# the model source's eval row, before the first stage (eval.source); as a MOPD teacher, the model source itself
SOURCE_EVAL = "source"
SMOLLM2 = "smollm2-135m"  # a model source name: SmolLM2-135M-Instruct from a PyPI wheel (stages.train.model)


def resolve_data_root(data_root: str | None) -> Path:
    """The real data files (benchmarks, shared sources): None: <repo>/../shared/data; relative: to the repo."""
    from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT

    return DEFAULT_DATA_ROOT if data_root is None else (REPO_ROOT / data_root).resolve()


def reference_kind(reference: str) -> Literal["endpoint", "model", "stage"]:
    """How a model reference is read: a URL, a model source (path or named model), else a stage name."""
    if reference.startswith(("http://", "https://")):
        return "endpoint"
    if reference == SMOLLM2 or "/" in reference or reference.startswith((".", "~")):
        return "model"
    return "stage"


# --- where a training stage runs: the recipe's `compute`, and a stage's own keys over it ---

Device = Literal["auto", "cpu", "cuda"]  # auto: cuda when torch sees a GPU, else cpu
# auto: torchrun when a stage has more than one rank, else in-process; ray: the ranks as actors on a Ray cluster
Launcher = Literal["auto", "torchrun", "ray"]
# bf16: autocast. auto: bf16 on a GPU that supports it; on a CPU, bf16 where it measures at least 10% faster than
# fp32 on this host (stages/train/precision.py): hosts with the same bf16 flag ran it 1.6x faster or 2x slower.
DType = Literal["auto", "bf16", "fp32"]
Processes = Annotated[int, Field(strict=True, ge=1, le=4096)]
RDZV_ENDPOINT = r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$"  # host:port of the c10d rendezvous (rank 0's node)
RAY_ADDRESS = r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$"


class ComputeConfig(Strict):
    """Where and how training runs. One process (the default) trains in the stage task's own process; more
    launch `torchrun` with FSDP2 (stages/scale/launch.py, docs/SCALE.md)."""

    device: Device = "auto"
    dtype: DType = "auto"
    nproc_per_node: Processes = 1  # GPUs (or CPU processes) per node
    nnodes: Processes = 1
    rdzv_endpoint: str | None = Field(None, pattern=RDZV_ENDPOINT)  # None: a free port on this host (one node)
    activation_checkpointing: bool = False  # recompute each decoder layer in backward: memory for time
    launcher: Launcher = "auto"  # torchrun: FSDP2 in a process group even for one rank (the one-GPU check)
    # launcher ray: the cluster's address (ray://host:10001, or host:6379 on a node of it); None: RAY_ADDRESS, else
    # a Ray instance started on this host
    ray_address: str | None = Field(None, pattern=RAY_ADDRESS)

    @model_validator(mode="after")
    def _multi_node_needs_endpoint(self) -> ComputeConfig:
        if self.nnodes > 1 and self.rdzv_endpoint is None and self.launcher != "ray":
            raise ValueError(
                "compute.nnodes > 1 needs compute.rdzv_endpoint (host:port every node reaches), or "
                "compute.launcher: ray"
            )
        return self

    @model_validator(mode="after")
    def _ray_is_installed(self) -> ComputeConfig:
        if self.launcher == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("compute.launcher ray needs Ray, which is not installed: pip install -e '.[ray]'")
        return self

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def runs_as(self) -> Literal["process", "torchrun", "ray"]:
        """How a distributable stage's ranks run, decided here only: in the stage task's own process (one rank,
        launcher auto), as a torchrun job, or as Ray actors."""
        if self.launcher == "ray":
            return "ray"
        return "process" if self.world_size == 1 and self.launcher == "auto" else "torchrun"


class ComputeOverride(Strict):
    """A training stage's `compute:`: the keys it sets replace the recipe's; the rest stay the recipe's."""

    device: Device | None = None
    dtype: DType | None = None
    nproc_per_node: Processes | None = None
    nnodes: Processes | None = None
    rdzv_endpoint: str | None = Field(None, pattern=RDZV_ENDPOINT)
    activation_checkpointing: bool | None = None
    launcher: Launcher | None = None
    ray_address: str | None = Field(None, pattern=RAY_ADDRESS)

    def over(self, base: ComputeConfig) -> ComputeConfig:
        return ComputeConfig.model_validate(base.model_dump() | self.model_dump(exclude_none=True))


# --- stage configs: every kind's config derives from StageConfig ---


def _path_segment_name(value: object, chars: str = "_-") -> object:
    """A name that becomes a key segment of the store, a local path and an MLflow run name: letters, digits and
    `chars`, at most 64, starting with a letter or digit (so never '..', '/', a space or markup)."""
    if isinstance(value, str) and not re.fullmatch(rf"[A-Za-z0-9][A-Za-z0-9{re.escape(chars)}]{{0,63}}", value):
        allowed = ", ".join(f"'{c}'" for c in chars)
        raise ValueError(f"{value!r} is not a name: letters, digits, {allowed}, at most 64, from a letter or digit")
    return value


# A stage's name: part of paths in the store (and on disk) and of MLflow run names.
Name = Annotated[str, AfterValidator(_path_segment_name)]
# A recipe's name (by default its file's name): part of run ids; a dot as in file names.
RecipeName = Annotated[str, AfterValidator(lambda value: _path_segment_name(value, "._-"))]


class StageConfig(Strict):
    """What every stage config has. `reads()` names the earlier stages whose checkpoints the stage takes as
    inputs, and what each must have made; the recipe checks them, the flow hands their checkpoints over."""

    kind: str
    name: Name

    def reads(self) -> list[Read]:
        return []

    def teacher_stages(self) -> dict[str, str]:
        """Domain -> the earlier stage (SOURCE_EVAL: the model source) whose checkpoint teaches it; {} where the
        stage distills from none, or has not chosen its teachers yet."""
        return {}

    def sampling_temperature(self) -> float | None:
        """The temperature it samples its policy at; None: it samples none."""
        return None

    def named_domains(self) -> list[str]:
        """The recipe domains its `domains:` names; [] where it names none (its kind has no such key, or it is
        unset and the kind takes its default)."""
        return []

    def step_count(self) -> int | None:
        """The optimizer steps it takes (its step checkpoints count up to them); None: it trains nothing."""
        return None

    def compute_override(self) -> ComputeOverride | None:
        """Its own `compute:` keys over the recipe's; None: it sets none (only a training stage may)."""
        return None


class OptimizerConfig(Strict):
    """The optimizer every training stage uses: AdamW, weight decay on matrices only (norm gains and biases are
    not pulled to 0; with tied embeddings the embedding matrix is decayed once)."""

    weight_decay: NonNegative = 0.0
    # beta2 0.95 rather than torch's 0.999: the second moment forgets a gradient spike within ~20 steps, as in
    # small-model pretraining practice (docs/LOG.md)
    adam_betas: tuple[AdamBeta, AdamBeta] = (0.9, 0.95)
    grad_clip: Positive = 1.0


class LoraConfig(Strict):
    """A stage's `lora:`: rank r, scale alpha (the update is scaled by alpha / r), dropout on the adapter's input,
    and the linear layers that get an adapter (module names, or peft's `all-linear`: every linear layer but the
    output head)."""

    rank: Annotated[int, Field(strict=True, ge=1, le=4096)] = 16
    alpha: Annotated[float, BeforeValidator(_no_bool), Field(gt=0, le=1e6)] = 32.0
    dropout: Annotated[float, BeforeValidator(_no_bool), Field(ge=0, lt=1)] = 0.0
    target_modules: Literal["all-linear"] | Annotated[list[str], Field(min_length=1)] = "all-linear"


class TrainingConfig(StageConfig, OptimizerConfig):
    """What every training stage has: a step budget, a peak learning rate, its optimizer, step checkpoints."""

    steps: Steps
    lr: LearningRate
    checkpoint_every: Every = 20  # a step checkpoint every this many steps (0: none)
    keep_step_checkpoints: Count = 2  # committed step checkpoints kept per stage while it runs
    compute: ComputeOverride | None = None  # replaces keys of the recipe's `compute` for this stage
    lora: LoraConfig | None = None  # train low-rank adapters instead of every weight (stages/train/lora.py)
    # Where and how a stage runs does not change what it computes (up to float rounding): the config hash
    # leaves `compute` out, so a step checkpoint written by 2 processes resumes in 1 and the reverse.
    not_hashed: ClassVar[frozenset[str]] = frozenset({"compute"})
    # Hashed only when set, so that a stage without it keeps the hash (and the step checkpoints) it had before
    # the field existed.
    hashed_when_set: ClassVar[frozenset[str]] = frozenset({"lora"})
    # the model it trains is a causal LM; a reward model's is a sequence classifier (its head: `score`)
    trains_classifier: ClassVar[bool] = False

    def step_count(self) -> int | None:
        return self.steps

    def compute_override(self) -> ComputeOverride | None:
        return self.compute

    def backbone(self, source: str) -> str:
        """The model source whose architecture the stage trains, given the recipe's: that one, which every stage
        starts from or starts from a stage that did."""
        return source


class ForwardOptions(Strict):
    """How a training stage's forward runs, not what it computes (so neither is hashed: FORWARD_OPTIONS). Both
    are for packed rows (stages/train/packing.py). flex_attention: torch's block-sparse attention, which skips the
    blocks a packed row's mask shuts (rows of ~50 tokens in 2,048: most of them); sdpa builds a dense mask and
    attends over all of it. compile: torch.compile each decoder layer (fused norms, rotary and activations) and
    the loss's log-softmax (read from the bf16 logits, no fp32 copy of [T, V]); a compile of under a minute at
    the first steps. flex_attention on cuda only, compile in one process only
    (stages.train.packing.check_forward_options).
    Figures per device: bench/RESULTS.md."""

    attention: Literal["sdpa", "flex_attention"] = "sdpa"
    compile: bool = False
    FORWARD_OPTIONS: ClassVar[frozenset[str]] = frozenset({"attention", "compile"})


# The validation context of a run's stored recipe (stages.recipe.schema.validate_recipe(..., stored=True)).
STORED = "stored"


class MicroBatched(Strict):
    """A stage whose step is `batch_size` rows in forwards of `micro_batch_size`, after `warmup_steps` of warm-up.

    A warm-up longer than the stage is refused wherever its value comes from, a default included: the learning
    rate would never reach its peak. A run's stored recipe (validated with the STORED context on resume) is
    exempt, so a run begun before this rule resumes with the settings it began with. A micro-batch larger than the
    batch is refused only where the recipe sets it: the default is cut to the batch."""

    @model_validator(mode="after")
    def _fits_its_batch_and_steps(self, info: ValidationInfo) -> MicroBatched:
        fields = type(self).model_fields
        if self.micro_batch_size != fields["micro_batch_size"].default and self.micro_batch_size > self.batch_size:
            raise ValueError(f"micro_batch_size {self.micro_batch_size} is larger than batch_size {self.batch_size}")
        if self.warmup_steps > self.steps and not (info.context or {}).get(STORED):
            default = "" if self.warmup_steps != fields["warmup_steps"].default else " (the default)"
            raise ValueError(
                f"warmup_steps {self.warmup_steps}{default} is more than steps {self.steps}: the learning rate would "
                "never reach its peak; set warmup_steps"
            )
        return self


class OnPolicyConfig(TrainingConfig):
    """What every on-policy stage (GRPO, MOPD) shares: sample from the current policy, one update per batch."""

    steps: Steps = 60
    prompts_per_step: BatchSize = 16
    group_size: BatchSize = 8  # samples per prompt
    micro_batch_size: BatchSize = 64  # sequences per forward/backward; the loss is normalized globally
    lr: LearningRate = 5e-5
    # the learning rate ramps linearly to lr over the first warmup_steps, then stays: a fresh AdamW's first steps
    # divide by a second moment of one gradient, and its full-size steps at lr move a small policy too far
    warmup_steps: Every = 0
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    # domain -> share of each step's prompts (normalized; e.g. the paper's multi-domain blend mcqa 0.55, tool 0.30,
    # structured 0.15); None: prompts drawn uniformly from the pooled domains, so each in proportion to its pool
    domain_weights: dict[str, Fraction] | None = None
    # every domain (of positive weight) gets at least this many of each step's prompts: at 16 prompts a 0.15 share
    # is 2 prompts, too few groups to carry signal; the rest is shared by weight
    min_prompts_per_domain: Annotated[int, Field(strict=True, ge=0, le=BATCH_LIMIT)] = 0

    def sampling_temperature(self) -> float | None:
        return self.temperature

    @model_validator(mode="after")
    def _weights_sum(self) -> OnPolicyConfig:
        if self.domain_weights is not None and sum(self.domain_weights.values()) <= 0:
            raise ValueError(f"stage {self.name!r}: domain_weights must not all be 0")
        return self

    @model_validator(mode="after")
    def _floor_fits(self) -> OnPolicyConfig:
        domains = self.named_domains()
        if self.min_prompts_per_domain * len(domains) > self.prompts_per_step:
            raise ValueError(
                f"stage {self.name!r}: min_prompts_per_domain {self.min_prompts_per_domain} x "
                f"{len(domains)} domains is more than prompts_per_step {self.prompts_per_step}"
            )
        return self

    @model_validator(mode="after")
    def _rollouts_fit(self) -> OnPolicyConfig:
        rollouts = self.prompts_per_step * self.group_size  # a step's samples are all held at once
        if rollouts > BATCH_LIMIT:
            raise ValueError(f"prompts_per_step * group_size is {rollouts} rollouts per step; at most {BATCH_LIMIT}")
        return self
