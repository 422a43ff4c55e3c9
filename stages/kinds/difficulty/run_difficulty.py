"""Difficulty filter before an RL stage, after Nemotron-Cascade (arXiv 2512.13607 sec. 4, 2603.19220 sec. 3).

A strong reference model answers every candidate train prompt k times (k = 8, temperature from the recipe), and
each answer is graded by its domain's grader, the same one that gives the RL reward and the eval score. A
prompt solved in at least `drop_solved_at` of its k rollouts (default k: solved every time) carries no learning
signal and is dropped; prompts solved 0/k times are kept, dropped, or kept at a seeded fraction (`unsolved`).
The paper's reference is GPT-OSS-120B (its code RL kept 3.5K hard problems); here it is an earlier stage's
checkpoint (the SFT model), an HF model dir or `smollm2-135m`, or any OpenAI-compatible server (through the
vLLM engine's external mode). A rollout solves its prompt when its grade is 1.0, full credit.

Cost. The k samples of a prompt are one engine call with n = k, which the HF engine serves from a single prompt
prefill. Rollouts are cached in the store under `cache/rollouts/<key>/`, key = hash(reference digest, sampling
params, k, seed), one JSONL shard per engine call of up to CHUNK_PROMPTS prompts, one row per prompt hash (of
the token ids the reference sees) with its k completion texts. A re-run, or a run with another threshold or
unsolved policy, samples nothing: it re-grades the cached texts (so a fixed grader never reads stale rewards).
A crash loses at most one shard.

Deviation: the HF engine draws a whole call's samples from one seeded generator, so a prompt's rollouts depend
on the chunk it was sampled in. A warm cache reproduces a run exactly; prompts added later (a larger
`prompts_per_domain`) are sampled in new chunks: valid draws under the same seed, not bit-equal to a cold run.

Output: a dataset checkpoint with `data/prompts.jsonl` (the kept items, which a GRPO stage with `prompts:`
trains on), `data/pass_rates.jsonl` (every prompt: solved count, pass rate, decision) and `pass_rates.png`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from cascade.artifacts.checkpoint import CheckpointRef, write_checkpoint
from cascade.artifacts.config import config_hash
from cascade.artifacts.layout import rollout_cache_key
from cascade.artifacts.store import Store
from cascade.artifacts.transfer import sha256_file
from cascade.stages.domains import Item
from cascade.stages.engines import RolloutEngine, SamplingParams, make_engine
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.difficulty import DifficultyConfig
from cascade.stages.products import PROMPTS_FILE
from cascade.stages.recipe.config_base import reference_kind
from cascade.stages.scale.distributed import resolve_device
from cascade.stages.train.context import StageContext, StageResult, load_policy
from cascade.stages.train.model import end_of_turn_ids, load_hf, prompt_ids
from cascade.stages.train.model_source import resolve_model_dir
from cascade.stages.train.precision import resolve_dtype, sampling_dtype
from cascade.stages.train.rollout import prompt_pool, score_texts, step_seed
from cascade.stages.train.tokenizer import ASSET_DIR, load_tokenizer

CHUNK_PROMPTS = 64  # prompts per engine call and per cache shard
PASS_RATES_FILE = "data/pass_rates.jsonl"
HISTOGRAM_FILE = "pass_rates.png"
DECISIONS = ("kept", "dropped_solved", "dropped_unsolved")


@dataclass
class Reference:
    engine: RolloutEngine
    tokenizer: PreTrainedTokenizerFast
    digest: str  # names the model in the cache key: checkpoint digest, model dir hash, or endpoint + served model


def run_difficulty(cfg: DifficultyConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    """inputs.stages holds the reference stage's checkpoint when cfg.reference names a stage."""
    started = time.time()
    checkpoint = inputs.stages.get(cfg.reference)
    items = prompt_pool(ctx.recipe, cfg.domains, cfg.prompts_per_domain)
    seed = step_seed(ctx.recipe.seed, "difficulty", 0)

    # rollouts: k per prompt, from the store's cache when it holds them, else sampled and cached
    reference = open_reference(cfg, ctx, checkpoint)
    try:
        texts, cache_hits = rollouts(cfg, ctx, reference, items, seed)
    finally:
        reference.engine.close()

    # grade: the domain's grader; count full-credit rollouts per prompt
    solved = (score_texts(ctx.recipe, items, texts) >= 1.0).sum(dim=1).tolist()  # [P] in 0..k

    # keep or drop
    decisions = keep_or_drop(solved, cfg.solved_threshold, cfg.unsolved, cfg.unsolved_fraction, seed)

    # output: the kept prompts, every pass rate and a histogram, as one dataset checkpoint
    metrics = filter_metrics(items, solved, decisions, cfg.k, cache_hits)
    metrics["seconds"] = round(time.time() - started, 2)
    ref = write_filtered(cfg, ctx, items, solved, decisions, metrics, checkpoint)
    return StageResult(ref, metrics, plots={"pass_rates": HISTOGRAM_FILE})


def keep_or_drop(solved: list[int], drop_solved_at: int, unsolved: str, fraction: float | None, seed: int) -> list[str]:
    """One of DECISIONS per prompt, from its solved count. With keep_fraction, round(fraction * #unsolved) of
    the 0-solved prompts are kept, drawn with `seed`."""
    decisions = ["dropped_solved" if s >= drop_solved_at else "kept" for s in solved]
    zero = [i for i, s in enumerate(solved) if s == 0]
    if unsolved == "keep":
        kept = set(zero)
    elif unsolved == "drop":
        kept = set()
    else:
        kept = set(random.Random(f"unsolved:{seed}").sample(zero, math.floor(fraction * len(zero) + 0.5)))
    for i in zero:
        decisions[i] = "kept" if i in kept else "dropped_unsolved"
    return decisions


def open_reference(cfg: DifficultyConfig, ctx: StageContext, checkpoint: CheckpointRef | None) -> Reference:
    kind = reference_kind(cfg.reference)
    if kind == "endpoint":
        from cascade.stages.engines.vllm import VLLMEngine  # HTTP only; the server is someone else's

        tokenizer = load_tokenizer(resolve_model_dir(cfg.reference_tokenizer or "tiny", ctx.workdir) or ASSET_DIR)
        engine = VLLMEngine(url=cfg.reference, stop_token_ids=end_of_turn_ids(tokenizer))
        return Reference(engine, tokenizer, f"endpoint:{engine.url}:{engine.model_name}")
    if kind == "stage":
        if checkpoint is None:
            raise ValueError(f"stage {cfg.name!r}: reference stage {cfg.reference!r} has no checkpoint")
        model, tokenizer = load_policy(ctx, checkpoint)
        digest = f"checkpoint:{checkpoint.digest}"
    else:
        model_dir = resolve_model_dir(cfg.reference, ctx.workdir)
        model, tokenizer = load_hf(model_dir)
        digest = f"model:{model_dir_digest(model_dir)}"
    compute = ctx.recipe.compute_for(cfg)
    dtype = sampling_dtype(ctx.recipe.engine, resolve_dtype(compute, resolve_device(compute.device)))
    if dtype is not None:  # its rollouts differ from fp32 ones: they are cached apart
        model, digest = model.to(dtype), f"{digest}:{str(dtype).removeprefix('torch.')}"
    return Reference(make_engine(ctx.recipe.engine, model, tokenizer, seed=ctx.recipe.seed), tokenizer, digest)


def model_dir_digest(path: Path) -> str:
    """sha256 over every file's relative path and sha256: same weights and tokenizer, same digest."""
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    listing = [(p.relative_to(path).as_posix(), sha256_file(p)) for p in files]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def rollouts(
    cfg: DifficultyConfig, ctx: StageContext, reference: Reference, items: list[Item], seed: int
) -> tuple[list[list[str]], int]:
    """texts[p]: the k completion texts for items[p]; and how many prompts the cache served."""
    prompts = [prompt_ids(reference.tokenizer, it.prompt) for it in items]
    hashes = [prompt_hash(p) for p in prompts]
    texts: dict[str, list[str]] = {}
    hits = done = 0
    for domain in cfg.domains:
        sampling = SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=ctx.recipe.domains[domain].max_new_tokens,
            seed=seed,
        )
        prefix = cache_prefix(reference.digest, sampling, cfg.k)
        known = load_cache(ctx.store, prefix, cfg.k)
        rows = [i for i, it in enumerate(items) if it.domain == domain]
        todo = [i for i in rows if hashes[i] not in known]
        hits += len(rows) - len(todo)
        done += len(rows) - len(todo)  # progress counts cached prompts as done: a warm rerun still reaches 100%
        ctx.progress(done, len(items))
        for start in range(0, len(todo), CHUNK_PROMPTS):
            chunk = todo[start : start + CHUNK_PROMPTS]
            chunk_seed = step_seed(seed, f"chunk:{hashes[chunk[0]]}", 0)  # distinct draws per chunk
            groups = reference.engine.generate([prompts[i] for i in chunk], cfg.k, replace(sampling, seed=chunk_seed))
            shard = {hashes[i]: [c.text for c in group] for i, group in zip(chunk, groups)}
            save_shard(ctx.store, prefix, shard)
            known.update(shard)
            done += len(chunk)
            ctx.progress(done, len(items))
        texts.update(known)
    return [texts[h] for h in hashes], hits


def prompt_hash(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:32]


def cache_prefix(reference_digest: str, sampling: SamplingParams, k: int) -> str:
    key = {"reference": reference_digest, "k": k, **asdict(sampling)}
    return rollout_cache_key(hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32])


def load_cache(store: Store, prefix: str, k: int) -> dict[str, list[str]]:
    """prompt hash -> k texts, from every shard under prefix (temp files of a cut-off write are ignored)."""
    known: dict[str, list[str]] = {}
    for key in store.list(prefix):
        if key.endswith(".jsonl") and not key.rsplit("/", 1)[-1].startswith("."):
            for line in store.read_bytes(key).decode().splitlines():
                row = json.loads(line)
                if len(row["texts"]) == k:
                    known[row["prompt"]] = row["texts"]
    return known


def save_shard(store: Store, prefix: str, shard: dict[str, list[str]]) -> None:
    name = hashlib.sha256("".join(sorted(shard)).encode()).hexdigest()[:24]
    lines = [json.dumps({"prompt": h, "texts": texts}) for h, texts in shard.items()]
    store.write_bytes(f"{prefix}/{name}.jsonl", ("\n".join(lines) + "\n").encode())


def filter_metrics(
    items: list[Item], solved: list[int], decisions: list[str], k: int, cache_hits: int
) -> dict[str, float | int]:
    counts = Counter(decisions)
    metrics: dict[str, float | int] = {
        "prompts": len(items),
        "rollouts": (len(items) - cache_hits) * k,
        "cache_hits": cache_hits,
        **{d: counts[d] for d in DECISIONS},
        "kept_fraction": round(counts["kept"] / max(1, len(items)), 4),
    }
    for domain in sorted({it.domain for it in items}):
        rows = [p for p, it in enumerate(items) if it.domain == domain]
        metrics[f"pass_rate/{domain}"] = round(sum(solved[p] for p in rows) / (k * len(rows)), 4)
        metrics[f"kept/{domain}"] = sum(decisions[p] == "kept" for p in rows)
    return metrics


def write_filtered(
    cfg: DifficultyConfig,
    ctx: StageContext,
    items: list[Item],
    solved: list[int],
    decisions: list[str],
    metrics: dict,
    parent: CheckpointRef | None,
) -> CheckpointRef:
    local = Path(tempfile.mkdtemp(dir=ctx.workdir))
    (local / "data").mkdir()
    with open(local / PROMPTS_FILE, "w") as f:
        for item, decision in zip(items, decisions):
            if decision == "kept":
                f.write(json.dumps(asdict(item)) + "\n")
    with open(local / PASS_RATES_FILE, "w") as f:
        for item, s, decision in zip(items, solved, decisions):
            f.write(
                json.dumps(
                    {
                        "id": item.id,
                        "domain": item.domain,
                        "solved": s,
                        "k": cfg.k,
                        "pass_rate": s / cfg.k,
                        "decision": decision,
                    }
                )
                + "\n"
            )
    plot_pass_rates(items, solved, cfg.k, cfg.solved_threshold, local / HISTOGRAM_FILE)
    return write_checkpoint(
        ctx.store,
        ctx.key,
        local,
        stage=cfg.name,
        step=None,
        parent=parent,
        config_hash=config_hash(cfg),
        metrics=metrics,
    )


def plot_pass_rates(items: list[Item], solved: list[int], k: int, drop_solved_at: int, out: Path) -> None:
    """Prompts per solved count (0..k), stacked by domain; the dropped-as-solved range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = [0] * (k + 1)
    for domain in sorted({it.domain for it in items}):
        counts = Counter(s for it, s in zip(items, solved) if it.domain == domain)
        heights = [counts[s] for s in range(k + 1)]
        ax.bar(range(k + 1), heights, bottom=bottom, label=domain)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.axvspan(drop_solved_at - 0.5, k + 0.5, color="grey", alpha=0.2, label=f"dropped (>= {drop_solved_at}/{k})")
    ax.set_xticks(range(k + 1))
    ax.set_xlabel(f"rollouts solved (of {k})")
    ax.set_ylabel("prompts")
    ax.set_title("Difficulty filter: reference pass counts")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
