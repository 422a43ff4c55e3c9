"""Readers of what one stage makes and a later stage reads: the products kinds meet through.

A kind never imports another kind's run module. The kind that makes a product writes it in its run module; every
stage that reads it reads it here: a prompt set (the prompts a difficulty stage kept) and a reward model (a
one-label sequence classifier, and its score of a sequence). The SFT dataset's reader is stages/datasets/, a policy
checkpoint's stages/train/context.py (load_policy).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from cascade.artifacts.checkpoint import CheckpointRef, materialize
from cascade.stages.domains import Item
from cascade.stages.train.context import StageContext
from cascade.stages.train.tokenizer import load_tokenizer

PROMPTS_FILE = "data/prompts.jsonl"  # a difficulty stage's kept prompts, one Item per line


def load_kept_prompts(ctx: StageContext, ref: CheckpointRef, domains: list[str]) -> list[Item]:
    """The items a difficulty stage kept, of the given domains."""
    local = materialize(ctx.store, ref, Path(tempfile.mkdtemp(dir=ctx.workdir)))
    rows = [json.loads(line) for line in (local / PROMPTS_FILE).read_text().splitlines()]
    return [Item(**row) for row in rows if row["domain"] in domains]


def load_reward_model(model_dir: Path) -> tuple[torch.nn.Module, Any]:
    """A one-label sequence classifier from an HF dir: a reward model's checkpoint, or a causal LM's backbone
    (whose new score head starts at zero)."""
    from transformers import AutoModelForSequenceClassification

    tokenizer = load_tokenizer(model_dir)
    # sdpa reads pair_scores' boolean [K, 1, T, T] mask as "may attend"; eager would add it to the scores
    model = AutoModelForSequenceClassification.from_pretrained(
        str(model_dir), num_labels=1, dtype=torch.float32, attn_implementation="sdpa"
    )
    if getattr(model.config, "problem_type", None) is None:  # a fresh head: not yet trained as a reward model
        torch.nn.init.zeros_(model.score.weight)
        model.config.problem_type = "regression"
    model.config.pad_token_id = tokenizer.pad_token_id  # the head reads the last token that is not padding
    return model, tokenizer


def sequence_scores(model: torch.nn.Module, seqs: list[list[int]], pad: int) -> torch.Tensor:
    """r_phi of each token sequence [n], right-padded into one batch (the head pools the last real token)."""
    ids = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
    return model(input_ids=ids.to(model.device)).logits[:, 0].float()
