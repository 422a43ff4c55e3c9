"""GRPO prompt pools from files: a benchmark file parsed by its own loader, a user's JSONL or Parquet."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cascade.stages.domains
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo, train_prompts
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.train.context import ListSink
from tests.stages.test_training import SMALL, VowelDomain, stage_ctx

GSM8K_TRAIN = DEFAULT_DATA_ROOT / "math" / "gsm8k_train.jsonl"


def rl_recipe(tmp_path, prompts, domains=("vowels",), **stage):
    return validate_recipe(
        {
            "seed": 0,
            "storage": {"root": f"file://{tmp_path}/store"},
            "model": SMALL.model_dump(),
            "compute": {"dtype": "fp32"},
            "domains": {
                "vowels": {"train_size": 50, "heldout_size": 4, "max_new_tokens": 6},
                "math": {"train_size": 50, "heldout_size": 4, "max_new_tokens": 6},
            },
            "stages": [
                {
                    "kind": "grpo",
                    "name": "rl",
                    "domains": list(domains),
                    "prompts": prompts,
                    "steps": 1,
                    "prompts_per_step": 2,
                    "group_size": 4,
                    "lr": 1e-2,
                    "checkpoint_every": 0,
                    **stage,
                }
            ],
        }
    )


@pytest.fixture
def vowels(monkeypatch):
    monkeypatch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
    cascade.stages.domains.register_domain(VowelDomain())


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_user_file_is_the_prompt_pool_and_trains_a_step(tmp_path, vowels, fmt):
    rows = [{"question": f"Say {w}.", "extra": {"id": i}} for i, w in enumerate(["bab", "dod", "kik"])]
    path = tmp_path / f"prompts.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    recipe = rl_recipe(
        tmp_path, {"vowels": [{"kind": "file", "path": str(path), "prompt_field": "question", "meta_field": "extra"}]}
    )
    sink = ListSink()
    ctx = stage_ctx(recipe, tmp_path, "rl", sink)
    pool = train_prompts(recipe.stage("rl"), ctx, StageInputs())
    assert [(it.domain, it.prompt, it.meta) for it in pool] == [("vowels", r["question"], r["extra"]) for r in rows]
    run_grpo(recipe.stage("rl"), ctx, StageInputs())
    ((step, metrics),) = sink.rows
    assert step == 1 and metrics["grad_norm"] > 0 and metrics["tokens_sampled"] > 0


def test_gsm8k_train_through_its_benchmark_loader(tmp_path, vowels):
    """A shared file is parsed by the benchmark's own row parser: the grader finds GSM8K's final answer."""
    recipe = rl_recipe(
        tmp_path,
        {"math": [{"kind": "shared", "file": "math/gsm8k_train.jsonl", "format": "gsm8k", "count": 3}]},
        domains=("math", "vowels"),
    )
    pool = train_prompts(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl"), StageInputs())
    first = json.loads(GSM8K_TRAIN.read_text().splitlines()[0])
    assert len(pool) == 3 + 50  # three GSM8K rows, then the vowels domain's synthetic train split
    assert pool[0].prompt.startswith(first["question"]) and pool[0].meta["answer"] == "72"
    assert cascade.stages.domains.get_domain("math").grade(pool[0], "so \\boxed{72}") == 1.0


@pytest.mark.parametrize(
    "prompts, message",
    [
        (
            {"vowels": [{"kind": "file", "path": "/no/such/prompts.jsonl"}]},
            "stage 'rl': prompts.vowels.0: file not found: /no/such/prompts.jsonl",
        ),
        (
            {"math": [{"kind": "shared", "file": "math/gsm8k_train.jsonl", "format": "gsm8k"}]},
            "stage 'rl' gives prompts for domain(s) ['math'] it does not train on",
        ),
        (
            {"vowels": [{"kind": "shared", "file": "math/gsm8k_train.jsonl", "format": "gsm8k"}]},
            "prompts.vowels.0: format 'gsm8k' is a math benchmark, not vowels",
        ),
    ],
)
def test_bad_prompt_files_are_refused_before_any_work(tmp_path, vowels, prompts, message):
    with pytest.raises(RecipeError, match=re.escape(message)) as e:
        rl_recipe(tmp_path, prompts)
    assert "\n" not in str(e.value)
