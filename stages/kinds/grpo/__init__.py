"""The grpo stage kind: its config, checks, estimate and row (here) and, in `run_grpo.py`, its run function: on-policy
RL with group-relative advantages.

This folder owns the kind's whole registry row (registered below, with the checks, plan estimate and report card
it names); the row imports `run_grpo.py` only on its first call: validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from cascade.stages.kinds.registry import StageKind, check_domain_weights, register_kind
from cascade.stages.recipe.config_base import (
    Count,
    ForwardOptions,
    Name,
    NonNegative,
    OnPolicyConfig,
    Positive,
    Read,
    StageConfig,
    _no_bool,
    imported_on_call,
)
from cascade.stages.recipe.data_sources import DataSource, ReadsDataFiles
from cascade.stages.recipe.estimate import StageEstimate, on_policy_estimate
from cascade.stages.scoring.reward_sources import (
    REWARD_SOURCES,
    GraderReward,
    RewardSpec,
    reward_reads,
    reward_terms,
    reward_uses_grader,
)
from cascade.stages.train.loss_registry import ChoosesLoss, LossReads


class GRPOConfig(OnPolicyConfig, ReadsDataFiles, ForwardOptions, ChoosesLoss):
    kind: Literal["grpo"] = "grpo"
    default_loss: ClassVar[str] = "grpo"
    loss_reads: ClassVar[LossReads] = "advantages"
    name: Name
    domains: list[str]
    std_eps: Positive = 1e-6
    # None: each domain's synthetic train split; a name: the prompts an earlier difficulty stage kept; a mapping:
    # domain -> sources, as sft_data reads them (a domain not listed: its synthetic train split)
    prompts: str | dict[str, list[DataSource]] | None = None
    # one reward source ({kind: grader}), or a list of {source, weight} whose rewards are summed
    # (stages/scoring/reward_sources.py: the registry of sources)
    reward: RewardSpec = GraderReward()
    # A control, not a setting to tune: shuffled trains each step on its rewards permuted across the batch
    # (stages.train.losses.shuffled_rewards): the same prompts, samples' distribution and steps, with the tie
    # between a completion and its reward broken. A gain that survives it is not the reward's.
    reward_control: Literal["none", "shuffled"] = "none"
    # KL(pi_theta || pi_ref) in the loss (k3 estimator, stages.train.losses.kl_k3); the paper uses it in RLHF only
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
    # The train/inference mismatch (pi_train != pi_inf: bf16, vLLM's kernels): each sampled token's loss weighted
    # by rho = pi_train / pi_inf, truncated at `is_cap` (tis) or zeroed outside `mis_band` (mis, IcePop's
    # band); none takes rho as 1, the paper's loss. auto: tis where the engine is vLLM or the stage trains in
    # bf16, else none (fp32 in one process: rho is 1 to float rounding).
    importance_correction: Literal["auto", "none", "tis", "mis"] = "auto"
    is_cap: Positive = 2.0
    mis_band: tuple[Positive, Positive] = (0.5, 5.0)
    # How the update lays out its micro-batch's rows for the model, not what it computes (the same loss up to
    # rounding, tested to 1e-5; so not hashed). shared_prefix: each prompt forwarded once, its group's completions
    # run on its repeated KV cache (stages/train/completions.py). packed: the [prompt | completion] rows laid end to end
    # in packed rows of pack_length tokens (None: the micro-batch's longest row), position ids restarting per row
    # as SFT packs, one forward without a cache; each prompt then goes through the model once per completion, but
    # in few, full rows, and `attention: flex_attention` and `compile: true` (ForwardOptions) apply to it only.
    # micro_batch_size still counts completion rows. FSDP and activation checkpointing run full rows either way.
    update_layout: Literal["shared_prefix", "packed"] = "shared_prefix"
    # 0: strictly on-policy, the paper's loop. 1: step t+1's batch is sampled from the weights step t starts from,
    # in the background while step t trains, and importance_correction (auto: tis) weights its tokens
    # (stages/train/rollout_ahead.py). It pays where the sampler has cores of its own: a vLLM server, another Ray node.
    max_staleness: Annotated[Literal[0, 1], BeforeValidator(_no_bool)] = 0
    pack_length: Count | None = None
    not_hashed: ClassVar[frozenset[str]] = (
        OnPolicyConfig.not_hashed | ForwardOptions.FORWARD_OPTIONS | {"update_layout", "pack_length"}
    )
    hashed_when_set: ClassVar[frozenset[str]] = OnPolicyConfig.hashed_when_set | {"loss"}

    @model_validator(mode="after")
    def _correction_bounds(self) -> GRPOConfig:
        if self.is_cap < 1.0:
            raise ValueError(f"stage {self.name!r}: is_cap {self.is_cap} is below 1: it would clip on-policy tokens")
        low, high = self.mis_band
        if not low < 1.0 < high:
            raise ValueError(f"stage {self.name!r}: mis_band {list(self.mis_band)} must hold 1 strictly inside")
        return self

    @model_validator(mode="after")
    def _ahead_without_refills(self) -> GRPOConfig:
        if self.max_staleness and self.refill_rounds:
            raise ValueError(
                f"stage {self.name!r}: refill_rounds choose prompts by the scores of a step's groups, which a batch "
                "sampled ahead (max_staleness: 1) does not have yet; set one of them to 0"
            )
        return self

    @model_validator(mode="after")
    def _forward_options_pack(self) -> GRPOConfig:
        options = [f"attention: {self.attention}"] * (self.attention != "sdpa") + ["compile: true"] * self.compile
        if options and self.update_layout != "packed":
            raise ValueError(
                f"stage {self.name!r}: {' and '.join(options)} apply to the packed update only (the shared-prefix "
                "one runs on a KV cache); set update_layout: packed"
            )
        return self

    def reads(self) -> list[Read]:
        reads = [Read("prompts", self.prompts, "prompts")] if isinstance(self.prompts, str) else []
        reads += reward_reads(self.reward, "reward")
        if self.reference is not None:
            reads.append(Read("reference", self.reference, "policy"))
        return reads

    def file_sources(self) -> dict[str, list[BaseModel]]:
        return dict(self.prompts) if isinstance(self.prompts, dict) else {}

    def reads_rows(self, domain: str) -> tuple[bool, bool]:
        """A row must carry the meta the domain's grader reads only where the reward calls that grader; a reward of
        one's own takes the row's fields as they are."""
        return False, reward_uses_grader(self.reward)

    def named_domains(self) -> list[str]:
        return list(self.domains)


# Its registry row, and what the row names: the checks only this kind knows, its plan estimate.


def _check_grpo(cfg: GRPOConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    check_domain_weights(cfg, cfg.domains)
    if isinstance(cfg.prompts, dict):
        extra = sorted(set(cfg.prompts) - set(cfg.domains))
        if extra:
            raise ValueError(f"stage {cfg.name!r} gives prompts for domain(s) {extra} it does not train on")
    if not isinstance(cfg.prompts, str):
        return
    source = next(s for s in earlier if s.name == cfg.prompts)
    unfiltered = sorted(set(cfg.domains) - set(source.domains))
    if unfiltered:
        raise ValueError(
            f"stage {cfg.name!r} trains on domain(s) {unfiltered} that its prompts' stage {cfg.prompts!r} "
            "does not filter"
        )


def _estimate_grpo(cfg: GRPOConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    scorers = sum(REWARD_SOURCES[term.source.kind].frozen_forward for term in reward_terms(cfg.reward))
    return on_policy_estimate(cfg, recipe, params, cfg.domains, (cfg.kl_coef > 0) + scorers)


register_kind(
    StageKind(
        "grpo",
        GRPOConfig,
        imported_on_call("cascade.stages.kinds.grpo.run_grpo", "run_grpo"),
        makes="policy",
        takes_policy=True,
        holds_compute=True,
        check=_check_grpo,
        gains_on=lambda cfg: list(cfg.domains),
        estimate=_estimate_grpo,
        distributable=True,
    )
)
