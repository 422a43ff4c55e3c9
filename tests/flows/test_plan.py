"""`cascade plan`: the dry run validates, draws the DAG, and estimates by the formulas stages/recipe/plan.py states."""

from __future__ import annotations

import json

import pytest

from cascade.flows.recipes import load_recipe
from cascade.stages.recipe.throughput import PROFILES
from cascade.stages.train.model import build_tiny_model, num_parameters
from cascade.stages.train.tokenizer import load_tokenizer
from tests.flows.test_cli import cascade, files_under


def test_plan_draws_the_dag_and_estimates_by_the_stated_formulas(tmp_path):
    done = cascade("plan", "tiny-regression", "stages.sft.steps=100", "--json", home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    recipe = load_recipe("tiny-regression", ["stages.sft.steps=100"])
    # the parameter count from the config on the meta device is the real model's
    real = num_parameters(build_tiny_model(recipe.model, len(load_tokenizer()), 0))
    assert plan["params"] == plan["active_params"] == real
    rows = {r["stage"]: r for r in plan["rows"]}
    assert list(rows) == [
        "sft_data",
        "sft",
        "eval after sft",
        "math_rl",
        "eval after math_rl",
        "if_rl_hot",
        "eval after if_rl_hot",
        "MOPD recovery",
    ]
    mean_new = (24 + 32) / 2  # math and instruct max_new_tokens
    assert rows["sft"]["tokens_trained"] == 100 * 32 * (128 + int(mean_new))
    assert rows["math_rl"]["tokens_sampled"] == 40 * 16 * 8 * 24  # steps x prompts x group x math's max_new_tokens
    assert rows["if_rl_hot"]["tokens_trained"] == 40 * 16 * 8 * 32
    # 800 items per domain, each 4 samples at the RL temperature and one greedy answer, and 800 dev items at 4
    # samples (the dev/<domain> column that selects), x max_new_tokens
    assert rows["eval after sft"]["tokens_sampled"] == 800 * (4 + 1 + 4) * 24 + 800 * (4 + 1 + 4) * 32
    # a smaller dev split is counted at its own size; an eval of the dev split alone scores no second split
    small_dev = ["domains.math.dev_size=100", "stages.sft.steps=100", "--json"]
    plan = json.loads(cascade("plan", "tiny-regression", *small_dev, home=tmp_path / "home").stdout)
    dev_rows = {r["stage"]: r for r in plan["rows"]}
    assert dev_rows["eval after sft"]["tokens_sampled"] == (800 * 5 + 100 * 4) * 24 + 800 * (4 + 1 + 4) * 32
    plan = json.loads(cascade("plan", "tiny-regression", "eval.split=dev", *small_dev, home=tmp_path / "home").stdout)
    dev_rows = {r["stage"]: r for r in plan["rows"]}
    assert dev_rows["eval after sft"]["tokens_sampled"] == 100 * 5 * 24 + 800 * 5 * 32
    walk = cascade("plan", "tiny-regression", home=tmp_path / "home").stdout
    assert "|- eval: math, instruct held-out and dev" in walk
    walk = cascade("plan", "tiny-regression", "eval.split=dev", home=tmp_path / "home").stdout
    assert "|- eval: math, instruct dev" in walk
    walk = cascade(
        "plan", "micro", "stages.sft.lora={rank: 4, alpha: 8, target_modules: [q_proj]}", home=tmp_path
    ).stdout
    lora = [line for line in walk.splitlines() if "|- lora" in line]
    assert lora == ["    |- lora: rank 4, alpha 8 on ['q_proj']; the checkpoint holds the merged model and the adapter"]
    assert rows["MOPD recovery"]["teacher_tokens"] == 40 * 16 * 4 * int(mean_new)
    train_flops, sample_flops = PROFILES["cpu"].flops(real)
    assert rows["sft"]["seconds"] == pytest.approx(6 * real * rows["sft"]["tokens_trained"] / train_flops)
    assert rows["math_rl"]["seconds"] == pytest.approx(
        real * 6 * rows["math_rl"]["tokens_trained"] / train_flops
        + real * 2 * rows["math_rl"]["tokens_sampled"] / sample_flops
    )
    # final weights, plus 2 kept step checkpoints of weights and AdamW's two moments, all fp32
    assert rows["sft"]["storage_bytes"] == real * 4 * (1 + 3 * 2)


def test_plan_prints_the_walk_and_draws_a_png_loading_no_model(tmp_path):
    image = tmp_path / "dag.png"
    done = cascade(
        "plan",
        "tiny-regression",
        "--image",
        str(image),
        "--on",
        "h100",
        "--devices",
        "8",
        "--params",
        "30e9",
        "--active-params",
        "3e9",
        home=tmp_path / "home",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "recipe tiny-regression: valid, 4 stages"
    assert [line.split(" [")[0].strip() for line in lines if line[:3].strip().rstrip(".").isdigit()] == [
        "1. sft_data",
        "2. sft",
        "3. math_rl",
        "4. if_rl_hot",
    ]
    assert sum("gate (recover): fired -> MOPD recovery" in line for line in lines) == 3
    assert "model: as given, 30.0G (3.0G active) parameters" in done.stdout
    assert "8 device(s)" in done.stdout
    assert (
        "kubernetes job variables (infra/k8s-gpu-job-template.json): --job-variable gpus_per_node=1 "
        "--job-variable nnodes=1"
    ) in lines
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert files_under(tmp_path / "home") == []  # a dry run writes nothing and converts no model


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "nope"], "unknown recipe 'nope'"),
        (["plan", "tiny", "--on", "tpu"], "--on 'tpu': known profiles are cpu, h100, h200"),
        (["plan", "tiny", "--devices", "0"], "--devices must be >= 1, got 0"),
        (["plan", "tiny", "stages.sft.steps=0"], "greater than or equal to 1"),
        (["plan", "tiny", "--image", "/no/such/dir/dag.png"], "cannot write /no/such/dir/dag.png"),
        # a model that is not on this machine: the error names the flags that plan it from its size
        (["plan", "nemotron-cascade-2"], "give its size: --params N (and --active-params N for a mixture of experts)"),
        (
            [
                "plan",
                "tiny",
                *(f"stages.{s}.compute={{nnodes: 2, rdzv_endpoint: {s}.ns.svc:1}}" for s in ("sft", "math_rl")),
            ],
            "multi-node stages rendezvous at different hosts ['math_rl.ns.svc', 'sft.ns.svc']",
        ),
    ],
)
def test_plan_bad_input_is_one_line_exit_2(tmp_path, args, message):
    done = cascade(*args, home=tmp_path)
    assert done.returncode == 2, done
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_paper_scale_recipe_plans_without_its_model(tmp_path):
    done = cascade(
        "plan",
        "nemotron-cascade-2",
        "--on",
        "h100",
        "--devices",
        "8",
        "--params",
        "30e9",
        "--active-params",
        "3e9",
        "--json",
        home=tmp_path / "home",
    )
    assert done.returncode == 0, done.stderr
    rows = {r["stage"]: r for r in json.loads(done.stdout)["rows"]}
    order = [s for s in rows if not s.startswith("eval after")]
    assert order == [
        "sft_data",
        "sft",
        "if_rl",
        "multi_domain_rl",
        "mopd",
        "rm",
        "rlhf",
        "lc_rl",
        "code_filter",
        "code_rl",
        "swe_rl",
        "MOPD recovery",
    ]  # the paper's order, the reward model before RLHF
    assert rows["rlhf"]["tokens_sampled"] == 160 * 128 * 16 * 4096  # the paper's RLHF batch, 160 steps
    assert rows["rlhf"]["teacher_tokens"] == 2 * rows["rlhf"]["tokens_sampled"]  # KL reference + reward model
    assert files_under(tmp_path / "home") == []


def test_the_walk_says_where_each_training_stage_ranks_and_rollouts_go():
    from cascade.stages.recipe.plan import dag_lines

    def placed(*overrides):
        lines = dag_lines(load_recipe("micro", list(overrides)))
        return [line.strip() for line in lines if line.strip().startswith(("|- ranks", "|- rollouts"))]

    here, hf = (
        "|- ranks: in the stage task's process",
        "|- rollouts: HF engine in each rank, on its share of the prompts",
    )
    assert placed() == [here, here, hf, here, hf]  # sft samples nothing; the two GRPO stages do
    assert placed("compute.nproc_per_node=2")[0] == "|- ranks: torchrun, 2 rank(s) on this node"
    assert placed("compute.launcher=ray", "compute.nnodes=2", "compute.ray_address=10.0.0.5:6379")[0] == (
        "|- ranks: 2 Ray actor(s) on 2 node(s) x 1 per node, one GPU (CPU on a cluster without GPUs) each; "
        "cluster: 10.0.0.5:6379"
    )
    assert placed("compute.launcher=ray", "compute.device=cpu")[0] == (
        "|- ranks: 1 Ray actor(s) on 1 node(s) x 1 per node, one CPU each; cluster: RAY_ADDRESS, else a local Ray"
    )
    assert placed("engine.kind=vllm")[-1] == "|- rollouts: managed vLLM server on the stage task's host"
    assert placed("engine.kind=vllm", "compute.nproc_per_node=2")[-1] == (
        "|- rollouts: managed vLLM server on rank 0's node, shared by the 2 ranks (each its share)"
    )
    assert placed(
        "engine.kind=vllm", "compute.launcher=ray", "compute.nnodes=2", "engine.ray_resources={GPU: 2, rollout: 1}"
    )[-1] == (
        "|- rollouts: managed vLLM server, a Ray actor on resources of its own (GPU: 2, rollout: 1), shared by the 2 "
        "ranks (each its share)"
    )


@pytest.mark.parametrize(
    ("recipe", "overrides", "note"),
    [
        ("micro", [], "128 synthetic rows"),
        ("smollm2-gsm8k", [], "every row of gsm8k_train.jsonl"),  # reads its file only: no synthetic rows
        ("smollm2-gsm8k", ["stages.sft_data.sources.math.shared.count=100"], "100 counted file rows"),
    ],
)
def test_the_sft_data_note_counts_what_the_sources_read(recipe, overrides, note):
    from cascade.stages.kinds.sft_data import source_rows

    loaded = load_recipe(recipe, overrides)
    cfg = loaded.stages[0]
    rows, said = source_rows(cfg, loaded, cfg.domains or list(loaded.domains))
    assert said == note
    assert sum(rows.values()) == {"128 synthetic rows": 128, "100 counted file rows": 100}.get(note, 0)


def test_plan_of_a_gguf_source_reads_its_metadata_and_converts_nothing(tmp_path):
    """smollm2-135m before its first use: the plan counts its parameters from the GGUF's metadata (the converted
    model's count) and leaves no converted model behind."""
    home = tmp_path / "home"
    done = cascade("plan", "smollm2-if", "--json", home=home)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["params"] == plan["active_params"] == 134_515_008  # SmolLM2-135M, its head tied to the embedding
    assert not (home / "models").exists() and "Converting" not in done.stderr
    # its time at the rates measured on smollm2-135m itself (SFT 397 tok/s, HF engine 199 tok/s), not at the tiny
    # model's FLOP/s, which on a CPU a 40x larger model beats: 41 minutes for IF-RL's 40 steps, not 71
    rl = next(r for r in plan["rows"] if r["stage"] == "if_rl")
    assert rl["seconds"] == pytest.approx(rl["tokens_trained"] / 397 + rl["tokens_sampled"] / 199, rel=1e-3)


def test_the_cpu_profile_interpolates_between_its_measured_models():
    """At a measured size the cpu profile gives that model's rates; between two it moves in log size; outside them it
    keeps the nearest model's FLOP/s; the GPU profiles have one figure at every size."""
    cpu = PROFILES["cpu"]
    tiny, smollm2 = cpu.measured
    assert cpu.flops(tiny.params) == pytest.approx((6 * tiny.params * 8552, 2 * tiny.params * 4700))
    assert cpu.flops(smollm2.params) == pytest.approx((6 * smollm2.params * 397, 2 * smollm2.params * 199))
    middle = (tiny.params * smollm2.params) ** 0.5
    low, high = cpu.flops(tiny.params), cpu.flops(smollm2.params)
    assert cpu.flops(middle) == pytest.approx(((low[0] * high[0]) ** 0.5, (low[1] * high[1]) ** 0.5))
    assert cpu.flops(1e6) == low and cpu.flops(7e9) == high
    assert cpu.ceilings() == (8552, 4700) and PROFILES["h100"].ceilings() == (None, None)
    assert PROFILES["h100"].flops(1e6) == PROFILES["h100"].flops(7e10)


def test_a_benchmark_with_a_loader_of_its_own_is_counted_in_the_eval_rows():
    """HumanEval and MBPP load through their own code (a gzipped file, MBPP's test split of a larger file): the plan
    counts what they load (164 and 500 items) instead of saying that they have no file; a data root without them is
    still the note."""
    from cascade.stages.recipe.plan import benchmark_size, eval_estimate

    recipe = load_recipe("smollm2-cascade", ["eval.benchmarks.mbpp={max_new_tokens: 256}"])
    assert benchmark_size("humaneval", recipe) == 164 and benchmark_size("mbpp", recipe) == 500
    est = eval_estimate("source", recipe)
    assert not any("humaneval" in note for note in est.notes)
    # a recipe validates its benchmarks' files; one whose data root went away since reads as the note again
    moved = recipe.model_copy(update={"eval": recipe.eval.model_copy(update={"data_root": "/nonexistent"})})
    assert benchmark_size("humaneval", moved) is None
