"""The config models of the recipe's sections: the model, the engine, the domains, the evals and the gate.

Every model forbids unknown keys, so a typo is an error, not a silently ignored setting. Every number has
bounds, so a recipe file, a `key=value` override and the Prefect run form all refuse the same bad values
(`steps: 0`, `lr: -1`, `steps: true`) before anything runs. What every stage config builds on (bounds, base
classes, `compute`, data sources and teachers) is `stages/recipe/config_base.py`; each kind's own config lives with its
kind (`stages/kinds/<kind>/__init__.py`), and which config belongs to which kind, and what a kind reads and makes,
is the registry's business (`stages/kinds/registry.py`); the recipe that ties them together is
`stages/recipe/schema.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, SerializeAsAny, model_validator

from cascade.artifacts.config import Strict
from cascade.stages.kinds.mopd import MOPDConfig  # the gate's default recovery stage
from cascade.stages.recipe.config_base import (
    BatchSize,
    Count,
    Fraction,
    Positive,
    StageConfig,
    _no_bool,
    resolve_data_root,
)
from cascade.stages.scoring.reward_sources import CallableReward


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
            raise ValueError(
                f"hidden_size {self.hidden_size} must be num_heads ({self.num_heads}) times an even "
                "head size: RoPE rotates pairs of dimensions"
            )
        return self

    def context_overrides(self) -> dict:
        """The config keys a recipe sets on the model it starts from."""
        out: dict = {}
        if self.max_position_embeddings is not None:
            out["max_position_embeddings"] = self.max_position_embeddings
        if self.rope_scaling is not None:
            out["rope_scaling"] = self.rope_scaling.model_dump(exclude_none=True)
        return out


class EngineConfig(Strict):
    kind: Literal["hf", "vllm"] = "hf"
    url: str | None = None  # an external OpenAI-compatible vLLM server instead of a managed one
    batch_size: BatchSize = 128  # sequences per generate call of the HF engine (training rollouts and evals)
    # The HF engine's decode step (stages/engines/decode.py) for Llama/Qwen2 models. shared_prefix: a prompt's keys
    # and values read once for its n samples (the CPU's best); per_row: a static cache per row; cuda_graphs: per_row
    # captured as CUDA graphs (a cuda model only; the GPU's best); hf: HF's forward, what any other model uses.
    # auto: cuda_graphs on cuda, shared_prefix on the CPU.
    hf_decoder: Literal["auto", "shared_prefix", "per_row", "cuda_graphs", "hf"] = "auto"
    # The dtype the HF engine samples an on-policy stage's rollouts in. fp32: from the trained fp32 weights.
    # compute: from a copy cast to the stage's training dtype, refreshed after each update (bf16 where the stage
    # trains in bf16; the same as fp32 otherwise). On 2 cores of an AMD EPYC a smollm2-135m rollout of 8 x 8 x 128
    # took 14 s from the bf16 copy against 32 s in fp32; the importance correction (auto: tis in bf16) covers the
    # mismatch. fp32 by default, so a recipe's rollouts do not depend on the host's dtype unless it asks. vLLM
    # samples in its own `dtype`.
    rollout_dtype: Literal["fp32", "compute"] = "fp32"
    # The managed vLLM server's own options (`vllm serve` flags); an external server (`url`) has its own.
    tensor_parallel_size: Annotated[int, Field(strict=True, ge=1, le=64)] = 1
    gpu_memory_utilization: Annotated[float, BeforeValidator(_no_bool), Field(gt=0.0, le=1.0)] = 0.9
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: Count | None = None  # None: the model's own context length
    # Rows the managed server decodes at once (`--max-num-seqs`; vLLM's CPU default is 128). On 2 cores of an AMD
    # EPYC, IFEval's 541 x 512 greedy on smollm2-135m in bf16 took 285 s at 256 rows against 385 s at 128 and 313
    # s at 512 (docs/LOG.md 2026-12-08): past 256 the attention over long rows costs more than the rows gain.
    max_num_seqs: Annotated[int, Field(strict=True, ge=1, le=4096)] = 256
    # The managed CPU server's KV cache in GiB (VLLM_CPU_KVCACHE_SPACE). None: room for `max_num_seqs` rows of
    # 768 tokens (a prompt and a 512-token answer), at most a quarter of the memory available when it starts.
    kv_cache_gib: Annotated[int, Field(strict=True, ge=1, le=1024)] | None = None
    # Under compute.launcher ray, a multi-rank stage's managed server is a Ray actor that reserves these, apart
    # from the ranks' bundles, so rollout and training capacity are sized apart: Ray's resource names, CPU, GPU or
    # a custom resource that a node pool advertises (e.g. {rollout: 1}). A CUDA server wants {GPU: <tensor
    # parallel size>}.
    ray_resources: dict[str, Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, allow_inf_nan=False)]] = {
        "CPU": 1.0
    }

    @model_validator(mode="after")
    def _rollout_dtype_is_hf(self) -> EngineConfig:
        if self.kind == "vllm" and self.rollout_dtype != "fp32":
            raise ValueError("engine.rollout_dtype is the HF engine's; a vLLM engine samples in engine.dtype")
        return self


class DomainSpec(Strict):
    # the evals' scorer moves no data build: hashed (in sft_data's build hash) only when set
    hashed_when_set: ClassVar[frozenset[str]] = frozenset({"eval_reward"})
    train_size: Count = 4000
    heldout_size: Count = 800  # items in the eval split (held-out or dev); 800 resolve a ~3-point gain (docs/LOG.md)
    dev_size: Count | None = (
        None  # items in the dev split, where it holds fewer than the held-out one; None: heldout_size
    )
    max_new_tokens: Count = 64
    tolerance: Fraction = 0.05  # the gate fires when the score drops more than this below its best
    # The eval's primary metric: each item's mean grade over `eval_samples` answers sampled at `eval_temperature`,
    # the distribution RL trains (a greedy eval of a weak model churns items between checkpoints and misses what RL
    # moves); greedy pass@1 is scored beside it as column `greedy/<domain>`. None: the temperature of the first RL
    # stage that trains the domain (1.0 without one), and 4 samples. eval_temperature 0: greedy only.
    eval_temperature: Annotated[float, BeforeValidator(_no_bool), Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = (
        None
    )
    eval_samples: Annotated[int, Field(strict=True, ge=1, le=64)] | None = None
    # what scores the eval's answers (every column: held-out, dev, greedy, pass@k); None: the domain's grader. A
    # reward of one's own ({kind: callable, function: "pkg.module:f"}, as an RL stage names it), so the evals
    # measure what that stage trains on; each of its scores must lie in [0, 1], as a grade does.
    eval_reward: CallableReward | None = None
    # keyword arguments of the domain's constructor, e.g. longctx: {num_keys: 8, num_filler: 40} for a longer
    # haystack; every item of the domain (train, held-out, SFT data) is generated with them
    options: dict[str, int | float | str | bool] = {}

    def split_size(self, split: str) -> int:
        """How many items an eval reads from `split` (dev or held-out)."""
        return self.dev_size if split == "dev" and self.dev_size is not None else self.heldout_size

    @model_validator(mode="after")
    def _samples_need_temperature(self) -> DomainSpec:
        if (self.eval_samples or 1) > 1 and self.eval_temperature == 0:
            raise ValueError("eval_samples > 1 needs eval_temperature > 0 (greedy answers are all the same)")
        return self


DEFAULT_EVAL_SAMPLES = 4  # a sampled eval's answers per item (DomainSpec.eval_samples unset)


class BenchmarkEval(Strict):
    """A real benchmark evaluated after every model stage, beside the held-out splits, and gated like them. Its
    key in `eval.benchmarks` is a registered benchmark's name, or with `file`, any column name of the user's."""

    limit: Count | None = None  # the benchmark's first N items; None: all of them
    max_new_tokens: Count = 256
    # A benchmark is a test column: shown after every stage, and watched by the gate (and by regression evals'
    # baselines) only where the recipe says so here, since a gate that acts on a test score selects on it. The
    # domains' dev splits are what gates by default.
    gates: bool = False
    tolerance: Fraction = 0.05  # with gates: the gate fires when pass@1 drops more than this below its best
    # a user's file (a local path or an fsspec URL: s3://, hf://datasets/...), read in `format`: a registered
    # benchmark's name (its row format and grader) or a domain's (rows {prompt, meta, reference?, id?})
    file: str | None = None
    format: str | None = None  # with `file`; None: the key, when the key is a registered benchmark

    def source(self, key: str) -> str:
        """The benchmark (or domain) whose rows and grader this column uses."""
        return self.format or key


class EvalConfig(Strict):
    enabled: bool = True
    # dev: tune settings here (recipes, learning rates, RL knobs); heldout: the recorded result, read once a
    # setting is chosen. Both are disjoint from train and from each other (stages/domains/base.py).
    split: Literal["heldout", "dev"] = "heldout"
    benchmarks: dict[str, BenchmarkEval] = {}  # name (as `cascade eval --benchmark` takes it) -> settings
    # also evaluate the model source before the first stage: the eval row `source`, the "before" of the first
    # stage's gain (a recipe that starts from a pretrained model has no earlier eval to compare with)
    source: bool = False
    data_root: str | None = None  # the benchmark files; None: <repo>/../shared/data; relative: to the repo
    # the engine evals generate on; None: the recipe's engine.kind. vllm: a managed vLLM server (`make vllm`); on 2
    # CPU cores it decodes long answers ~1.6x as fast as the HF engine (docs/RECIPES.md)
    engine: Literal["hf", "vllm"] | None = None
    # the weights and KV cache evals decode in. fp32: the same numbers on every host; compute: the dtype the stages
    # train in (compute.dtype; auto: bf16 where this host runs it faster), half the bytes a decode step reads
    dtype: Literal["fp32", "bf16", "compute"] = "fp32"

    def resolved_data_root(self) -> Path:
        return resolve_data_root(self.data_root)


RECOVERY_PREFIX = "recover-"  # a gate's recovery stage is named for the stage it recovers: recover-<stage>


class GateConfig(Strict):
    policy: Literal["recover", "warn", "fail"] = "warn"
    max_recoveries: int = Field(1, strict=True, ge=0, le=100)  # recoveries per run; past it the gate warns
    # a stage of a kind that `recovers` (stages/kinds/registry.py; the recipe validates it by its `kind`, this
    # one's when it names none); its teachers come from the eval history
    recovery: SerializeAsAny[StageConfig] = MOPDConfig(name="recovery")
