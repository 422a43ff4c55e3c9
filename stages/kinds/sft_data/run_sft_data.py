"""SFT data build: prompts from each domain's sources, answered by a teacher, filtered, written as Parquet shards.

Nemotron-Cascade (arXiv 2512.13607 sec. 3) builds its SFT set from 100B+ teacher models' responses across
domains, keeps verified answers, removes duplicates and decontaminates against its benchmarks. Here:

    for each shard (shard_rows consecutive rows of the source stream, stages/datasets/sources.py):
        if the shard is committed under this build's hash: replay its rows into the dedup state; next
        drop prompts that overlap an eval prompt                       (contaminated)
        answer the rest with the domain's teacher, batched            (teacher_error: refused / cut off)
        keep an answer only if the domain's grader passes it          (unverified; not for the oracle)
        drop rows longer than max_tokens as SFT tokenizes them        (too_long)
        drop exact, then near duplicates of rows kept so far          (duplicate, near_duplicate)
        write the shard (Parquet) and commit it: its own manifest, written last
    write the data card; commit the stage checkpoint (every shard + card, manifest last); drop the staging shards

Deviations: the oracle (the default) answers with the reference, correct by construction, so it is not graded
(grading it against itself measures nothing); on CPU the teachers are the tiny model, smollm2-135m or a local
vLLM server, not 100B+ models. Memory is one shard plus the dedup state (16 bytes per kept row and the MinHash
LSH index). A crash loses at most the shard in progress; a rerun regenerates nothing it committed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cascade.artifacts.checkpoint import committed, materialize, read_manifest, write_checkpoint
from cascade.artifacts.config import config_hash, hashed_fields
from cascade.artifacts.layout import shard_key, shards_dir
from cascade.stages.datasets.card import DataCard, SourceCounts
from cascade.stages.datasets.conversations import dedup_text, single_turn
from cascade.stages.datasets.filters import ContaminationIndex, ExactDedup, NearDedup
from cascade.stages.datasets.shards import DATA_DIR, TokenCounter, chat_row, iter_conversations, shard_name, write_shard
from cascade.stages.datasets.sources import Row, iter_rows
from cascade.stages.datasets.teachers import Teacher, make_teacher
from cascade.stages.domains import get_domain
from cascade.stages.domains.base import EVAL_SPLITS, Domain
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft_data import SFTDataConfig
from cascade.stages.recipe.data_sources import GenerationTeacher, OracleTeacher
from cascade.stages.recipe.schema import Recipe
from cascade.stages.train.context import StageContext, StageResult

DATA_CARD_JSON, DATA_CARD_MD = "data_card.json", "DATA_CARD.md"


def run_sft_data(cfg: SFTDataConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    started = time.time()
    build = ShardBuilder(cfg, ctx)
    out = Path(tempfile.mkdtemp(dir=ctx.workdir))
    (out / DATA_DIR).mkdir()
    shards = reused = 0
    try:
        oracle_domains = {d for d in build.domains if isinstance(cfg.domain_teacher(d), OracleTeacher)}
        rows = iter_rows(cfg, ctx.recipe, build.domains, oracle_domains)
        for index, chunk in enumerate(batched(rows, cfg.shard_rows)):
            key = shard_key(ctx.key, index)
            ref = committed(ctx.store, key)
            if ref is not None and ref.config_hash == build.hash:
                # resume: this shard's rows are final; only the dedup state must learn them
                counts = build.reuse(ref, out / DATA_DIR / shard_name(index))
                reused += 1
            else:
                # build: filter, answer, verify, dedup; commit the shard before starting the next
                counts = build.make_shard(index, chunk, out / DATA_DIR / shard_name(index), key)
            build.card.add(counts)
            shards += 1
            ctx.progress(shards, max(shards, build.expected_shards))
    finally:
        build.close()

    # commit: data card, then the stage checkpoint over every shard; the staging copies go after
    (out / DATA_CARD_JSON).write_text(json.dumps(build.card.to_json(), indent=1))
    (out / DATA_CARD_MD).write_text(build.card.to_markdown(cfg.name))
    seconds = time.time() - started
    metrics = {
        **build.card.metrics(),
        "shards": shards,
        "shards_reused": reused,
        "teacher_rows": build.teacher_rows,
        "seconds": round(seconds, 2),
        "teacher_retries": sum(t.retries for t in build.teachers.values()),
        "rows_per_s": round(build.card.to_json()["input"] / max(seconds, 1e-9), 1),
    }
    # the stage's config_hash is what the task layer compares to skip a committed stage
    ref = write_checkpoint(
        ctx.store, ctx.key, out, stage=cfg.name, step=None, parent=None, config_hash=config_hash(cfg), metrics=metrics
    )
    ctx.store.delete(shards_dir(ctx.key))
    shutil.rmtree(out, ignore_errors=True)
    return StageResult(ref, metrics)


def batched(rows: Iterable[Row], size: int) -> Iterable[list[Row]]:
    it = iter(rows)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def build_hash(cfg: SFTDataConfig, recipe: Recipe) -> str:
    """What a shard's content depends on: the stage config, the seed, the tokenizer's model and every domain's
    sizes (the built ones' train sizes, and all held-out sizes: they are the decontamination's eval sets)."""
    blob = {
        "cfg": cfg.model_dump(mode="json"),
        "seed": recipe.seed,
        "model": recipe.model.source,
        "domains": {d: hashed_fields(spec) for d, spec in recipe.domains.items()},
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


class Candidate:
    """A source row on its way through the filters: its conversation (the teacher's answer to a prompt, or the
    source's own conversation) and its token count, once known."""

    __slots__ = ("row", "text", "messages", "tokens")

    def __init__(self, row: Row):
        self.row, self.text, self.messages, self.tokens = row, "", row.messages, 0


class ShardBuilder:
    """The state a build carries across shards: teachers, the eval index, the dedup filters and the card."""

    def __init__(self, cfg: SFTDataConfig, ctx: StageContext):
        from cascade.stages.train.model_source import resolve_model_dir
        from cascade.stages.train.tokenizer import ASSET_DIR, load_tokenizer

        self.cfg, self.ctx = cfg, ctx
        self.domains = cfg.domains or list(ctx.recipe.domains)
        self.hash = build_hash(cfg, ctx.recipe)
        self.work = Path(tempfile.mkdtemp(dir=ctx.workdir, prefix="shards-"))
        tokenizer = load_tokenizer(resolve_model_dir(ctx.recipe.model.source, self.work) or ASSET_DIR)
        self.count_tokens = TokenCounter(tokenizer)  # the tokenizer SFT will use: the recipe model's
        decon = cfg.decontamination
        self.index = ContaminationIndex(eval_prompts(cfg, ctx.recipe), decon.ngram) if decon.enabled else None
        self.exact = ExactDedup() if cfg.dedup.exact else None
        self.near = NearDedup(cfg.dedup.threshold, cfg.dedup.num_perm, cfg.dedup.shingle) if cfg.dedup.near else None
        self.teachers: dict[str, Teacher] = {}  # by config, made on first use: a model teacher is costly to load
        self.teacher_rows = 0  # prompts sent to a teacher by this run (not by resumed shards)
        self.card = DataCard(self._info())
        self.expected_shards = expected_shards(cfg, ctx.recipe)

    def _info(self) -> dict[str, Any]:
        decon = self.cfg.decontamination
        return {
            "build_hash": self.hash,
            "teachers": {d: self.cfg.domain_teacher(d).model_dump(mode="json") for d in self.domains},
            "dedup": self.cfg.dedup.model_dump(),
            "max_tokens": self.cfg.max_tokens,
            "decontamination": {
                **decon.model_dump(),
                "eval_prompts": self.index.prompts if self.index else 0,
                "eval_sets": [f"{d}/{split}" for d in self.ctx.recipe.domains for split in EVAL_SPLITS]
                + list(decon.benchmarks),
            },
        }

    def make_shard(self, index: int, chunk: list[Row], dest: Path, key: str) -> dict[str, SourceCounts]:
        drawn = Counter((row.source, row.domain) for row in chunk)
        counts = {source: SourceCounts(domain, input=n) for (source, domain), n in drawn.items()}
        rows: list[dict[str, Any]] = []
        for domain, group in itertools.groupby(chunk, key=lambda r: r.domain):
            rows += self._filter(domain, [Candidate(r) for r in group], counts)
        shard_dir = self.work / f"{index:05d}"
        shard_dir.mkdir()
        write_shard(rows, shard_dir / dest.name)
        write_checkpoint(
            self.ctx.store,
            key,
            shard_dir,
            stage=f"{self.cfg.name}/shard",
            step=index,
            parent=None,
            config_hash=self.hash,
            metrics={"sources": {s: c.to_json() for s, c in counts.items()}},
        )
        shutil.move(shard_dir / dest.name, dest)
        return counts

    def _filter(self, domain: str, cands: list[Candidate], counts: dict[str, SourceCounts]) -> list[dict[str, Any]]:
        """The kept rows of one domain's run of a shard, in source order; every drop is counted by reason.
        A conversation is checked by its user turns and needs no teacher; a prompt gets the teacher's answer."""
        if self.index is not None:
            cands = drop(counts, cands, [self.index.is_contaminated(c.row.item.prompt) for c in cands], "contaminated")
        answered = self._answer(domain, [c for c in cands if c.messages is None], counts)
        cands = [c for c in cands if c.messages is not None or c in answered]
        prompts = [c for c in cands if c.messages is None]
        for cand, n in zip(prompts, self.count_tokens([c.row.item.prompt for c in prompts], [c.text for c in prompts])):
            cand.messages, cand.tokens = single_turn(cand.row.item.prompt, cand.text), n
        for cand in cands:
            cand.tokens = cand.tokens or self.count_tokens.conversation(cand.messages)
        cands = drop(counts, cands, [c.tokens > self.cfg.max_tokens for c in cands], "too_long")
        kept = []
        for cand in cands:
            source = counts[cand.row.source]
            if self.exact is not None and self.exact.is_duplicate(*dedup_text(cand.messages)):
                source.dropped["duplicate"] += 1
            elif self.near is not None and self.near.is_duplicate(*dedup_text(cand.messages)):
                source.dropped["near_duplicate"] += 1
            else:
                source.rows += 1
                source.tokens += cand.tokens
                kept.append(chat_row(cand.row.item.id, domain, cand.row.source, cand.messages, cand.tokens))
        return kept

    def _answer(self, domain: str, cands: list[Candidate], counts: dict[str, SourceCounts]) -> set[Candidate]:
        """The prompts the teacher answered and, where the build verifies, whose answers the grader passed."""
        if not cands:
            return set()
        self.teacher_rows += len(cands)
        answers = self._teacher(domain).answer([c.row.item for c in cands], self._max_new_tokens(domain))
        for cand, answer in zip(cands, answers, strict=True):
            cand.text = answer.text or ""
        cands = drop(counts, cands, [a.error is not None for a in answers], "teacher_error")
        if self._verifies(domain):
            cands = drop(
                counts, cands, [g < 1.0 - 1e-9 for g in grade(self.ctx.recipe.domain(domain), cands)], "unverified"
            )
        return set(cands)

    def reuse(self, ref, dest: Path) -> dict[str, SourceCounts]:
        """A committed shard: its file (sha256-verified) and counts; its rows go into the dedup state."""
        local = materialize(self.ctx.store, ref, self.work / f"{ref.step:05d}")
        shutil.move(local / dest.name, dest)
        for messages in iter_conversations([dest]):
            if self.exact is not None:
                self.exact.is_duplicate(*dedup_text(messages))
            if self.near is not None:
                self.near.is_duplicate(*dedup_text(messages))
        sources = read_manifest(self.ctx.store, ref.key)["metrics"]["sources"]
        return {label: SourceCounts.from_json(c) for label, c in sources.items()}

    def _teacher(self, domain: str) -> Teacher:
        cfg = self.cfg.domain_teacher(domain)
        key = cfg.model_dump_json()
        if key not in self.teachers:
            self.teachers[key] = make_teacher(cfg, self.ctx.recipe)
        return self.teachers[key]

    def _max_new_tokens(self, domain: str) -> int:
        teacher = self.cfg.domain_teacher(domain)
        budget = teacher.max_new_tokens if isinstance(teacher, GenerationTeacher) else None  # the oracle: none
        return budget or self.ctx.recipe.domains[domain].max_new_tokens

    def _verifies(self, domain: str) -> bool:
        """Rejection sampling: on, for a generating teacher, where the domain has a grader."""
        has_grader = type(get_domain(domain)).grade is not Domain.grade
        return self.cfg.verify and has_grader and not isinstance(self.cfg.domain_teacher(domain), OracleTeacher)

    def close(self) -> None:
        for teacher in self.teachers.values():
            teacher.close()
        shutil.rmtree(self.work, ignore_errors=True)


def drop(counts: dict[str, SourceCounts], cands: list[Candidate], flags: list[bool], reason: str) -> list[Candidate]:
    kept = []
    for cand, flagged in zip(cands, flags, strict=True):
        if flagged:
            counts[cand.row.source].dropped[reason] += 1
        else:
            kept.append(cand)
    return kept


def grade(domain: Domain, cands: list[Candidate]) -> list[float]:
    from cascade.stages.domains.benchdata import describe

    try:
        return domain.grade_batch([c.row.item for c in cands], [c.text for c in cands])
    except (KeyError, TypeError, ValueError) as e:
        sources = sorted({c.row.source for c in cands})
        raise ValueError(
            f"the {domain.name} grader cannot check rows of {', '.join(sources)} ({describe(e)}): "
            f"give them the meta its grader reads, or set verify: false"
        ) from None


def eval_prompts(cfg: SFTDataConfig, recipe: Recipe) -> Iterable[str]:
    """Every prompt the recipe evaluates or tunes on: each domain's held-out and dev splits, and the named
    benchmark files."""
    from cascade.stages.domains.benchdata import load_items, resolve_benchmarks

    for name, spec in recipe.domains.items():
        for split in EVAL_SPLITS:
            yield from (
                item.prompt for item in recipe.domain(name).iter_items(split, spec.split_size(split), recipe.seed)
            )
    for bench in cfg.decontamination.benchmarks:
        yield from (item.prompt for item in load_items(resolve_benchmarks([bench])[0], cfg.resolved_data_root()))


def expected_shards(cfg: SFTDataConfig, recipe: Recipe) -> int:
    """Shards the build will write, when every source says how many rows it gives (else 0: unknown)."""
    from cascade.stages.datasets.sources import draw_count

    counts = [
        draw_count(src, recipe.domains[d].train_size)
        for d in cfg.domains or list(recipe.domains)
        for src in cfg.domain_sources(d)
    ]
    if any(n is None for n in counts):
        return 0
    return -(-sum(counts) // cfg.shard_rows)
