"""Hostile input from the reliability review: every case is one line on stderr, exit code 2, nothing written.

Runs the CLI in-process (typer's runner) so each case costs milliseconds; tests/flows/test_cli.py runs the same
contract through a real subprocess for the common cases.
"""

import gzip
import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cascade.flows.cli import app


def cascade(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def assert_one_line(code: int, out: str, err: str, message: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("cascade: error: ") and message in lines[0], err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "override, message",
    [
        ("stages.sft.steps=-5", "stages.1.sft.steps: Input should be greater than or equal to 1"),
        ("stages.sft.steps=0", "stages.1.sft.steps: Input should be greater than or equal to 1"),
        ("stages.sft.steps=true", "stages.1.sft.steps: Input should be a valid integer"),
        (
            "stages.sft.steps=99999999999999999999999",
            "stages.1.sft.steps: Input should be less than or equal to 1000000",
        ),
        ("stages.sft.lr=-1", "stages.1.sft.lr: Input should be greater than 0"),
        ("stages.sft.lr=true", "stages.1.sft.lr: Input should be a number, not a boolean"),
        ("stages.sft.lora={rank: 4, alpha: true}", "stages.1.sft.lora.alpha: Input should be a number, not a boolean"),
        ("stages.sft.lora={rank: 4, dropout: false}", "sft.lora.dropout: Input should be a number, not a boolean"),
        ("stages.if_rl.max_staleness=true", "stages.3.grpo.max_staleness: Input should be a number, not a boolean"),
        ("stages.sft.batch_size=0", "stages.1.sft.batch_size: Input should be greater than or equal to 1"),
        ("domains.math.train_size=-1", "domains.math.train_size: Input should be greater than or equal to 1"),
        ("stages.if_rl.group_size=0", "stages.3.grpo.group_size: Input should be greater than or equal to 1"),
        ("stages.sft=5", "stages is not a mapping (address a stage by name, then a field)"),
        ("stages.sft.steps.x=1", "stages.sft.steps is not a mapping"),
        ("storage.root=bogus://x", "unsupported store bogus://"),
        ("storage.root=ftp://host/x", "unsupported store ftp://"),
        ("storage.root=memory://x", "unsupported store memory://"),
        ("storage.root=file://", "storage.root: store 'file://' names no directory"),
        ("seed=&a [*a]", "an alias refers to a node that contains it"),
        # in range, but nonsense together, or more than memory holds
        ("stages.sft.micro_batch_size=16", "stages.1.sft: micro_batch_size 16 is larger than batch_size 8"),
        ("stages.sft.warmup_steps=7", "stages.1.sft: warmup_steps 7 is more than steps 6"),
        ("stages.sft.steps=1", "stages.1.sft: warmup_steps 2 is more than steps 1"),
        ("compute.nproc_per_node=4096", "stage 'sft': 4096 ranks per node on this host's"),
        # a Ray cluster where nothing answers: ray.init retried for minutes, deaf to SIGINT, leaving a stale lease
        ("compute={launcher: ray, ray_address: '127.0.0.1:1'}", "Ray address 127.0.0.1:1: nothing answers there"),
        ("compute={launcher: ray, ray_address: 'ray://127.0.0.1:1'}", "Ray address ray://127.0.0.1:1: nothing answers"),
        ("model.num_heads=3", "model: hidden_size 64 must be num_heads (3) times an even head size"),
        ("model.hidden_size=66", "model: hidden_size 66 must be num_heads (2) times an even head size"),
        ("stages.sft.batch_size=100000000", "stages.1.sft.batch_size: Input should be less than or equal to 65536"),
        ("engine.batch_size=100000000", "engine.batch_size: Input should be less than or equal to 65536"),
        ("stages.if_rl.group_size=65536", "stages.3.grpo: prompts_per_step * group_size is 262144 rollouts"),
    ],
)
def test_bad_numbers_and_overrides_write_nothing(cascade_home, override, message):
    assert_one_line(*cascade("run", "micro", override), message)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["eval.data_root=/no/such/root", "eval.benchmarks={gsm8k: {limit: 5}}"],
            "eval.benchmarks.gsm8k: data file not found: /no/such/root/math/gsm8k_test.jsonl (eval.data_root sets",
        ),
        (
            ["eval.data_root=/no/such/root", "eval.benchmarks={humaneval: {limit: 5}}"],
            "eval.benchmarks.humaneval: data root not found: /no/such/root",
        ),
        (["eval.benchmarks={aime25: {}}"], "eval.benchmarks.aime25: 'aime25' ships no data file"),
    ],
)
def test_an_eval_benchmark_without_its_data_is_refused_before_any_stage(cascade_home, overrides, message):
    """Found when the recipe is read: at the first eval (2026-11-27) the run had already spent its SFT stage."""
    assert_one_line(*cascade("run", "micro", *overrides), message)
    assert files_under(cascade_home) == []
    assert files_under(cascade_home) == []


MICRO_LAYERS = "down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


@pytest.mark.parametrize("command", ["run", "plan"])
@pytest.mark.parametrize(
    "override, message",
    [
        # one known name beside an unknown one: peft adapted q_proj alone, and the stage trained without a word
        ("stages.sft.lora={target_modules: [q_proj, qproj]}", "stage 'sft': lora.target_modules ['qproj']"),
        # a module, but no layer: peft failed when the stage started
        ("stages.math_rl.lora={target_modules: [mlp]}", "stage 'math_rl': lora.target_modules ['mlp']"),
        # found only when the gate fired, after every stage before it
        ("gate.recovery.lora={target_modules: [attn.q_proj]}", "gate.recovery: lora.target_modules ['attn.q_proj']"),
    ],
)
def test_lora_targets_that_match_no_layer_are_refused_before_anything_is_written(
    cascade_home, command, override, message
):
    code, out, err = cascade(command, "micro", override)
    assert_one_line(code, out, err, f"{message} match no layer of the model; the names that would: {MICRO_LAYERS}")
    assert files_under(cascade_home) == []
    code, out, err = cascade("plan", "micro", "stages.sft.lora={target_modules: [self_attn.q_proj, mlp.up_proj]}")
    assert code == 0 and "lora: rank 16, alpha 32 on ['self_attn.q_proj', 'mlp.up_proj']" in out, err


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_text("- a\n- b\n"), "a recipe is a mapping of sections, not a list"),
        (lambda p: p.write_text("42\n"), "a recipe is a mapping of sections, not a int"),
        (lambda p: p.write_bytes(bytes(range(256)) * 4), "is not UTF-8 text"),
        (lambda p: p.mkdir(), "is not a regular file"),
        (_fifo, "is not a regular file"),  # reading it would block forever
    ],
)
def test_recipe_files_that_are_not_recipes(cascade_home, tmp_path, make, message):
    path = tmp_path / "x.yaml"
    make(path)
    assert_one_line(*cascade("run", str(path)), message)
    assert files_under(cascade_home) == []


@pytest.mark.parametrize("command", ["run", "plan"])
@pytest.mark.parametrize(
    "content",
    [bytes(range(128, 256)) * 8, gzip.compress(b"seed: 1\n" * 100), "seed: 1\n".encode("utf-16")],
    ids=["binary", "gzip", "utf-16"],
)
def test_a_recipe_file_that_is_not_utf8_is_one_line_for_run_and_plan(cascade_home, tmp_path, command, content):
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    assert_one_line(*cascade(command, str(path)), f"recipe {path} is not UTF-8 text")
    assert files_under(cascade_home) == []


@pytest.mark.parametrize("run_id", ["nl\n", "a/../b", "UPPER", ""])
def test_run_ids_are_matched_whole(cascade_home, run_id):
    assert_one_line(*cascade("run", "micro", "--run-id", run_id), "bad run id")
    assert files_under(cascade_home) == []


def billion_laughs(levels: int = 9) -> str:
    """Each level a list of ten aliases of the one before: 520 bytes that expand to 10**levels strings."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nseed: *l8\n"


@pytest.mark.timeout(60)  # the alias bomb hung the CLI
@pytest.mark.parametrize(
    "text, message",
    [
        (billion_laughs(), "aliases expand to more than 100000 values"),
        ("seed: &a [*a]\n", "an alias refers to a node that contains it (a recursive structure)"),
        ("domains: {math: {}}\nloop: &l [*l]\n", "an alias refers to a node that contains it (a recursive structure)"),
        ("seed: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64 levels"),
        ("".join(f"c{i}: &c{i} [*c{i - 1}]\n" if i else "c0: &c0 [1]\n" for i in range(200)), "nested deeper than 64"),
    ],
)
def test_hostile_yaml_is_one_line(cascade_home, tmp_path, text, message):
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    assert_one_line(*cascade("run", str(path)), message)
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "content, message",
    [
        (b"question,answer\n1+1,2\n", "data.jsonl:1: not valid JSON"),
        (bytes(range(256)) * 8, "data.jsonl:1: not valid JSON"),
        (b"", "data.jsonl: holds no rows"),
        (b"\n\n", "data.jsonl: holds no rows"),
    ],
)
def test_a_data_file_without_rows_is_refused_before_anything_is_written(cascade_home, tmp_path, content, message):
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    source = f"stages.sft_data.sources={{math: [{{kind: file, path: {data}}}]}}"
    assert_one_line(*cascade("run", "micro", source), f"stage 'sft_data': sources.math.0: {tmp_path}/{message}")
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "store, message",
    [
        ("file://", "--store: store 'file://' names no directory"),
        ("s3://", "--store: store 's3://' names no bucket"),
        ("/dev/null", "--store: store '/dev/null' is not a directory"),
    ],
)
def test_a_store_that_names_no_place_is_one_line(cascade_home, store, message):
    assert_one_line(*cascade("status", "--store", store), message)


def test_a_corrupt_safetensors_file_is_one_line(tmp_path):
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import initial_model, save_hf

    model, tok = initial_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), 0)
    save_hf(model, tok, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert_one_line(*cascade("eval", str(tmp_path / "m")), f"cannot load the model in {tmp_path / 'm'}")


def test_a_deeply_nested_row_is_that_rows_error(tmp_path):
    rows = tmp_path / "rows.jsonl"
    good = {"prompt": "Compute 1+1.", "meta": {"answer": "2"}, "completion": "\\boxed{2}"}
    rows.write_text(json.dumps(good) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n" + json.dumps(good) + "\n")
    code, out, err = cascade("grade", "--benchmark", "math", "--data", str(rows), "--json")
    assert code == 1  # some rows could not be graded; the rest were
    report = json.loads(out)
    assert [r["score"] for r in report["rows"]] == [1.0, 1.0]
    assert report["errors"] == [{"row": 2, "error": "nested too deeply to parse"}]


def test_grading_an_empty_file_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert_one_line(*cascade("grade", "--benchmark", "math", "--data", str(empty)), "holds no items")


def test_status_survives_a_truncated_report_or_recipe(cascade_home):
    for run_id, name in (("ok", None), ("torn-report", "report.json"), ("torn-recipe", "recipe.json")):
        run = cascade_home / "runs" / run_id
        run.mkdir(parents=True)
        (run / "recipe.json").write_text(json.dumps({"name": "r", "domains": {"math": {}}, "stages": []}))
        (run / "report.json").write_text(json.dumps({"run_id": run_id, "recipe": "r"}))
        if name:
            (run / name).write_text((run / name).read_text()[:10])
    code, out, err = cascade("status", "--json")
    assert code == 0, err
    listed = {row["run_id"]: row["stages"] for row in json.loads(out)}
    assert set(listed) == {"ok", "torn-report", "torn-recipe"}
    assert "unreadable" in listed["torn-report"][0][1]
    assert_one_line(*cascade("status", "torn-recipe"), "recipe.json is not valid JSON (truncated?)")
    assert_one_line(*cascade("report", "torn-report"), "report.json is not a valid report (truncated?)")


RLHF_RECIPE = """
model: {{source: tiny, hidden_size: 64, num_layers: 2, num_heads: 2, intermediate_size: 128}}
domains: {{chat: {{train_size: 64, heldout_size: 16}}}}
stages:
  - {{kind: sft_data}}
  - {{kind: sft, steps: 2, warmup_steps: 1}}
  - {{kind: reward_model, init: sft, pairs: {pairs}}}
  - {{kind: grpo, name: rlhf, domains: [chat], reward: {{kind: reward_model, stage: {reward_stage}}}}}
"""


@pytest.mark.parametrize(
    "pairs, reward_stage, message",
    [
        ("{kind: domain}", "sft", "stage 'rlhf' reads reward.stage 'sft', which no earlier reward_model stage writes"),
        (
            "{kind: domain}",
            "nope",
            "stage 'rlhf' reads reward.stage 'nope', which no earlier reward_model stage writes",
        ),
        ("{kind: file, path: PAIRS}", "rm", "pairs.jsonl: row 1: no 'chosen' string"),
        (
            "{kind: file, path: /no/such/pairs.jsonl}",
            "rm",
            "stage 'rm': preference file not found: /no/such/pairs.jsonl",
        ),
        ("{kind: domain, domain: math}", "rm", "stage 'rm': domain 'math' builds no preference pairs"),
        (
            "{kind: on_policy, domain: math}",
            "rm",
            "stage 'rm': on_policy pairs' domain 'math' is not declared in `domains`",
        ),
    ],
)
def test_bad_rlhf_recipes_write_nothing(cascade_home, tmp_path, pairs, reward_stage, message):
    pair_file = tmp_path / "pairs.jsonl"
    pair_file.write_text(json.dumps({"prompt": "Hi", "answer": "Hello", "rejected": "Go away"}) + "\n")
    recipe = tmp_path / "rlhf.yaml"
    recipe.write_text(RLHF_RECIPE.format(pairs=pairs.replace("PAIRS", str(pair_file)), reward_stage=reward_stage))
    assert_one_line(*cascade("run", str(recipe)), message)
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--judge", "http://127.0.0.1:9/v1"], "judge http://127.0.0.1:9/v1 does not answer"),
        (["--judge", "ftp://judge/v1"], "--judge: String should match pattern"),
        ([], "--benchmark arena_hard needs --judge URL, and --judge applies to it only"),
    ],
)
def test_arena_hard_without_a_working_judge_is_one_line(cascade_home, args, message):
    assert_one_line(*cascade("eval", "tiny", "--benchmark", "arena_hard", *args), message)
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"topic": "cats"}, "its meta is not what the instruct grader reads (missing field 'kind')"),
        (
            {"instruction_id_list": ["punctuation:no_commas"], "kwargs": [{}]},
            "its meta is not what the instruct grader reads (unknown IFEval instruction id 'punctuation:no_commas')",
        ),
    ],
)
def test_rl_prompts_whose_meta_the_grader_cannot_read_are_refused_before_anything_is_written(
    cascade_home, tmp_path, meta, message
):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "Write about cats.", "meta": meta}) + "\n")
    source = f"stages.if_rl.prompts={{instruct: [{{kind: file, path: {data}}}]}}"
    assert_one_line(*cascade("run", "micro", source), f"stage 'if_rl': prompts.instruct.0: {data}: row 1: {message}")
    # nothing of a run; the IFEval checkers' NLTK data may be cached (stages/domains/instruction_checkers.py)
    assert [p for p in files_under(cascade_home) if not p.is_relative_to(cascade_home / "cache" / "nltk_data")] == []


def test_rl_prompts_with_a_meta_the_grader_reads_validate(tmp_path):
    from cascade.flows.recipes import load_recipe

    data = tmp_path / "prompts.jsonl"
    meta = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    data.write_text(json.dumps({"prompt": "Write about cats without commas.", "meta": meta}) + "\n")
    recipe = load_recipe("micro", [f"stages.if_rl.prompts={{instruct: [{{kind: file, path: {data}}}]}}"])
    assert recipe.stages[3].prompts["instruct"][0].path == str(data)


def test_a_bad_row_deep_in_a_data_file_is_found_before_anything_is_written(cascade_home, tmp_path):
    data = tmp_path / "data.jsonl"
    good = {"prompt": "Compute 1+1.", "reference": "\\boxed{2}", "meta": {"answer": "2"}}
    rows = [json.dumps(good)] * 50 + [json.dumps({"question": "no prompt field"})] + [json.dumps(good)] * 10
    data.write_text("\n".join(rows) + "\n")
    source = f"stages.sft_data.sources={{math: [{{kind: file, path: {data}}}]}}"
    assert_one_line(*cascade("run", "micro", source), f"stage 'sft_data': sources.math.0: {data}: row 51: no 'prompt'")
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "bad, message",
    [
        (b'{"prompt": "caf\xe9?", "reference": "x"}', "3: not UTF-8 text ('utf-8' codec can't decode byte 0xe9"),
        (
            b'{"prompt": "Big?", "meta": {"n": ' + b"9" * 5000 + b"}}",
            "3: a number too long to read (Exceeds the limit (4300 digits) for integer string conversion",
        ),
    ],
    ids=["latin-1", "5000-digits"],
)
@pytest.mark.parametrize(
    "override, where",
    [
        ("stages.sft_data.sources={{math: [{{kind: file, path: {}}}]}}", "stage 'sft_data': sources.math.0"),
        ("stages.if_rl.prompts={{instruct: [{{kind: file, path: {}}}]}}", "stage 'if_rl': prompts.instruct.0"),
    ],
    ids=["sft-data", "rl-prompts"],
)
def test_a_row_that_cannot_be_decoded_is_named_by_its_number(cascade_home, tmp_path, bad, message, override, where):
    """Bad bytes were found by a text stream that decodes ahead in blocks, and a 5,000-digit integer by Python's
    int limit: each was one line naming the file, not the row."""
    data = tmp_path / "data.jsonl"
    good = json.dumps({"prompt": "Compute 1+1.", "reference": "\\boxed{2}", "meta": {"answer": "2"}}).encode()
    data.write_bytes(good + b"\n" + good + b"\n" + bad + b"\n" + good + b"\n")
    assert_one_line(*cascade("run", "micro", override.format(data)), f"{where}: {data}:{message}")
    assert files_under(cascade_home) == []


@pytest.mark.parametrize(
    "benchmark, row, message",
    [
        ("gsm8k", {"question": "Two plus two?", "answer": 4}, "'int' object has no attribute 'rpartition'"),
        ("aime25", {"question": None, "answer": "4"}, "'NoneType' object has no attribute 'strip'"),
    ],
)
def test_a_field_of_another_type_in_eval_data_is_one_line(cascade_home, tmp_path, benchmark, row, message):
    """An int `answer` or a null `question` in `cascade eval --data` was a traceback (AttributeError)."""
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"question": "One plus one?", "answer": "#### 2"}) + "\n" + json.dumps(row) + "\n")
    code, out, err = cascade("eval", "tiny", "--benchmark", benchmark, "--data", str(data))
    assert_one_line(code, out, err, f"{data}: row 2: a field has the wrong type ({message})")
    assert files_under(cascade_home) == []


def test_a_rewards_module_that_exits_at_import_is_refused_in_one_line(cascade_home, tmp_path, monkeypatch):
    """A `sys.exit(0)` at import ended `cascade run` with exit 0 and no run (SystemExit is no Exception)."""
    (tmp_path / "exit_at_import_rewards.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the working directory joins it
    reward = "stages.if_rl.reward={kind: callable, function: 'exit_at_import_rewards:f'}"
    message = "reward function 'exit_at_import_rewards:f': cannot import exit_at_import_rewards: SystemExit: 0"
    assert_one_line(*cascade("run", "micro", reward), message)
    assert files_under(cascade_home) == []
