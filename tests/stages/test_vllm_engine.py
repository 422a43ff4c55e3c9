"""VLLMEngine against a real vLLM CPU server (from .venv-vllm) on a tiny random Qwen2.

One managed server serves the whole module; the restart test replaces it once. The HF reference here is a
plain full-forward greedy loop written in this file, so a bug shared with any engine cannot hide.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cascade.stages.engines import describe_server, kv_cache_gib, server_options
from cascade.stages.engines.continuous import kv_bytes_per_token
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.engines.vllm import (
    DEFAULT_VENV,
    ServerOptions,
    VLLMEngine,
    WeightSyncError,
    _to_completion,
    trainer_logprobs,
)
from cascade.stages.engines.vllm.server import ManagedServer
from cascade.stages.recipe.sections import EngineConfig
from cascade.stages.train.losses import sampling_logits
from tests.stages.test_difficulty import even_domain, run_filter  # noqa: F401  (even_domain: a fixture)

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
# head_dim = 128 / 4 = 32: the smallest head size vLLM's CPU attention supports.
TINY = dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)
QUESTIONS = ["What is 2+3?", "Name a color.", "Sort: 3 1 2", "Reverse the word cat."]
LOGPROB_ATOL = 1e-4


def live_members(pgid: int) -> list[int]:
    """Non-zombie processes of a group, from /proc: written here so the engine's own helper is not trusted."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            found.append(int(stat_file.parent.name))
    return found


def wait_group_gone(pgid: int, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def require_vllm_venv() -> None:
    """CI (a fresh clone) makes sure the venv is complete; elsewhere a missing venv skips."""
    if os.environ.get("CI"):
        # A skip in CI would hide a broken install step. The script is idempotent: about 2 minutes the first
        # time in a fresh clone, a stamp check after that.
        subprocess.run(["bash", str(REPO_ROOT / "infra" / "vllm-venv.sh")], check=True)
    elif not (DEFAULT_VENV / "bin" / "python").exists():
        pytest.skip(f"no vLLM venv at {DEFAULT_VENV}: run `bash infra/vllm-venv.sh`")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The references are tiny, and two OpenMP threads spinning against the server (and anything else on a
    2-core machine) ran them 10-40x slower than one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model, save_hf
    from cascade.stages.train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    model = build_tiny_model(ModelConfig(**TINY), len(tokenizer), seed=0).eval()
    model_dir = tmp_path_factory.mktemp("tiny-qwen2")
    save_hf(model, tokenizer, model_dir)
    return model_dir, model, tokenizer


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    require_vllm_venv()
    eng = VLLMEngine(tiny[0], workdir=tmp_path_factory.mktemp("vllm-engine"))
    yield eng
    eng.close()


def perturbed(model, seed: int):
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return out


@pytest.fixture(scope="module")
def updated(tiny):
    """The 'trained' policy that the sync test pushes and the restart test expects back."""
    return perturbed(tiny[1], seed=1)


@pytest.fixture(scope="module")
def prompts(tiny):
    tokenizer = tiny[2]
    out = []
    for q in QUESTIONS:
        messages = [{"role": "user", "content": q}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


@torch.no_grad()
def hf_greedy(model, prompt: list[int], steps: int, eos: int) -> tuple[list[int], list[float], float]:
    """Greedy tokens, their logprobs, and the smallest top-1/top-2 gap seen (to tell a near-tie from a bug)."""
    ids, logps, min_gap = list(prompt), [], float("inf")
    for _ in range(steps):
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
        top = logp.topk(2)
        min_gap = min(min_gap, float(top.values[0] - top.values[1]))
        tok = int(top.indices[0])
        ids.append(tok)
        logps.append(float(logp[tok]))
        if tok == eos:
            break
    return ids[len(prompt) :], logps, min_gap


@torch.no_grad()
def hf_score(
    model, prompt: list[int], completion: list[int], temperature: float = 1.0, top_p: float = 1.0
) -> list[float]:
    """log p(completion[t] | prompt + completion[:t]) by one teacher-forced forward, under the distribution of
    `temperature` and `top_p` (losses.sampling_logits, as the trainer takes it)."""
    ids = torch.tensor([prompt + completion])
    logp = torch.log_softmax(sampling_logits(model(ids).logits[0].float(), temperature, top_p), dim=-1)
    rows = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logp[rows, torch.tensor(completion)].tolist()


def test_finish_reason_mapping_and_bad_choices():
    base = {"text": "hi", "token_ids": [5, 2], "logprobs": {"token_logprobs": [-1.0, -0.5]}}
    assert _to_completion({**base, "finish_reason": "stop"}).finish_reason == "stop"
    assert _to_completion({**base, "finish_reason": "length"}).finish_reason == "length"
    with pytest.raises(RuntimeError, match="finish_reason"):
        _to_completion({**base, "finish_reason": "abort"})
    with pytest.raises(RuntimeError, match="token_ids"):
        _to_completion({**base, "token_ids": None, "finish_reason": "stop"})


def test_unsupported_head_dim_fails_before_launch(tmp_path):
    config = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="head_dim 16"):
        VLLMEngine(tmp_path)


def test_a_managed_cpu_servers_kv_cache_is_sized_to_its_rows_and_the_memory_available(tmp_path):
    """256 rows at once by default (vLLM's CPU server takes 128), and a KV cache with room for them, at most a
    quarter of the memory available, said before the server starts."""
    smollm2 = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, hidden_size=576, num_hidden_layers=30)
    bf16 = EngineConfig(kind="vllm", dtype="bfloat16")
    gib = 2**30
    # a token: 30 layers x 2 (keys, values) x 3 heads x 64 numbers x 2 bytes
    assert kv_bytes_per_token(smollm2, 2) == 23_040
    # 256 rows x 768 tokens x 23,040 bytes = 4.22 GiB: 5 whole
    assert kv_cache_gib(bf16, 23_040, 64 * gib) == 5
    assert kv_cache_gib(bf16, 46_080, 64 * gib) == 9  # float32 numbers: 8.44 GiB
    assert kv_cache_gib(bf16, 23_040, 12 * gib) == 3  # a quarter of 12 GiB
    assert kv_cache_gib(bf16, 23_040, gib) == 1  # never under 1
    assert kv_cache_gib(bf16.model_copy(update={"kv_cache_gib": 2}), 23_040, 64 * gib) == 2
    options = server_options(bf16, smollm2, 64 * gib)
    assert (options.max_num_seqs, options.kv_cache_gib, options.dtype) == (256, 5, "bfloat16")
    assert server_options(EngineConfig(kind="vllm"), smollm2, 64 * gib).kv_cache_gib == 9  # auto: a float32 server
    assert describe_server(options, 64 * gib) == (
        "vLLM server: up to 256 rows at once, weights in bfloat16, KV cache 5 GiB (64.0 GiB available)"
    )
    config = {"hidden_size": 576, "num_attention_heads": 9, "max_position_embeddings": 2048}
    server = ManagedServer(tmp_path, config, options, tmp_path)
    cmd = server.cmd(8000)
    assert cmd[cmd.index("--max-num-seqs") + 1] == "256"
    assert server.env()["VLLM_CPU_KVCACHE_SPACE"] == "5"


def test_greedy_matches_hf_reference(engine, tiny, prompts):
    _, model, tokenizer = tiny
    steps = 24
    out = engine.generate(prompts, n=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=steps))
    assert len(out) == len(prompts) and all(len(row) == 2 for row in out)
    for prompt, (first, second) in zip(prompts, out, strict=True):
        ref_ids, ref_logps, gap = hf_greedy(model, prompt, steps, tokenizer.eos_token_id)
        assert gap > 1e-3, "the reference has a near-tie; change the fixture's seed"
        assert first.token_ids == ref_ids
        assert first.logprobs == pytest.approx(ref_logps, abs=LOGPROB_ATOL)
        assert second == first  # greedy: all n samples are the same
        assert first.finish_reason == ("stop" if ref_ids[-1] == tokenizer.eos_token_id else "length")
        assert first.text == tokenizer.decode(first.token_ids, skip_special_tokens=True)


def test_a_benchmark_eval_reads_the_same_greedy_answers_from_both_engines(engine, tiny, monkeypatch):
    """IFEval's first items, greedy, through evaluate_benchmark on vLLM and on the HF engine (refilling 3 slots)
    of one fp32 model, both stopping at the chat template's end of turn, as make_engine builds them: the same
    tokens, so the same completions and grades; both report progress to the end."""
    from cascade.stages.engines.hf import HFEngine
    from cascade.stages.evals.benchmarks import evaluate_benchmark
    from cascade.stages.train.model import end_of_turn_ids

    _, model, tokenizer = tiny
    monkeypatch.setattr(engine, "stop_token_ids", end_of_turn_ids(tokenizer, None))
    results, progress = {}, {}
    for name, eng in (("vllm", engine), ("hf", HFEngine(model, tokenizer, batch_size=3))):
        seen = progress.setdefault(name, [])
        results[name] = evaluate_benchmark(
            eng,
            tokenizer,
            "ifeval",
            limit=8,
            max_new_tokens=16,
            progress=lambda done, total, seen=seen: seen.append(done),
        )
    vllm_rows, hf_rows = results["vllm"].rows, results["hf"].rows
    assert [r["completion"] for r in vllm_rows] == [r["completion"] for r in hf_rows]
    assert [r["score"] for r in vllm_rows] == [r["score"] for r in hf_rows]
    assert results["vllm"].metrics == results["hf"].metrics
    assert progress["vllm"][-1] == progress["hf"][-1] == 8


def test_sampled_logprobs_are_of_the_sampling_distribution_and_seeded(engine, tiny, prompts):
    model = tiny[1]
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=123)
    out = engine.generate(prompts, n=3, sampling=sampling)
    assert [len(row) for row in out] == [3] * len(prompts)
    for prompt, row in zip(prompts, out, strict=True):
        for c in row:
            assert len(c.token_ids) == len(c.logprobs) > 0
            # pi_inf is of the distribution the token was drawn from (T = 0.7 over the top-p nucleus), as the
            # trainer's logprobs are: the server's processed logprobs
            assert c.logprobs == pytest.approx(hf_score(model, prompt, c.token_ids, 0.7, 0.9), abs=LOGPROB_ATOL)
    again = engine.generate(prompts, n=3, sampling=sampling)
    assert [[c.token_ids for c in row] for row in again] == [[c.token_ids for c in row] for row in out]
    # A seed shared by every prompt of a batch would draw the same noise for each; derived seeds must not.
    same_prompt_twice = engine.generate([prompts[0], prompts[0]], n=1, sampling=sampling)
    assert same_prompt_twice[0][0].token_ids != same_prompt_twice[1][0].token_ids


def test_sync_weights_serves_the_updated_model(engine, tiny, updated, prompts):
    model = tiny[1]
    seq = prompts[1] + prompts[2]
    old, new = hf_score(model, seq[:1], seq[1:]), hf_score(updated, seq[:1], seq[1:])
    assert max(abs(a - b) for a, b in zip(old, new, strict=True)) > 1e-2  # the update is visible at all

    seconds = engine.sync_weights(updated)
    assert seconds > 0 and engine.last_sync["probe_max_abs_diff"] <= 1e-3
    assert engine.weight_version == 1
    served = engine.prompt_logprobs(seq)
    assert served == pytest.approx(new, abs=LOGPROB_ATOL)
    assert max(abs(a - b) for a, b in zip(served, old, strict=True)) > 1e-2
    greedy = engine.generate([prompts[0]], 1, SamplingParams(temperature=0.0, max_new_tokens=16))[0][0]
    assert greedy.token_ids == hf_greedy(updated, prompts[0], 16, tiny[2].eos_token_id)[0]


def test_probe_rejects_a_server_that_disagrees(engine, tiny):
    probe = list(range(3, 35))
    never_synced = perturbed(tiny[1], seed=2)
    with pytest.raises(WeightSyncError, match="differ from the trainer"):
        engine._verify(probe, trainer_logprobs(never_synced, probe))


def test_external_mode_uses_a_running_server(engine, prompts):
    external = VLLMEngine(url=engine.url)
    out = external.generate(prompts[:2], 2, SamplingParams(temperature=1.0, max_new_tokens=4))
    assert [len(row) for row in out] == [2, 2]
    external.close()
    assert engine.prompt_logprobs(prompts[0])  # closing the external client left the server alone


@pytest.mark.usefixtures("even_domain")
def test_difficulty_endpoint_samples_once_then_serves_from_cache(engine, tiny, tmp_path, monkeypatch):
    # the difficulty filter's reference as an OpenAI-compatible endpoint: this module's server (a server of its own
    # cost the suite a vLLM start, ~28 CPU-s)
    served = str(tiny[0])
    first, rates, _ = run_filter(tmp_path, engine.url, "a", reference_tokenizer=served)
    assert first["prompts"] == 24 and first["rollouts"] == 24 * 8 and first["cache_hits"] == 0
    assert {r["solved"] for r in rates} != {0}  # graded texts from the server, not empty replies

    monkeypatch.setattr(VLLMEngine, "_complete", lambda *a, **k: pytest.fail("a cached prompt was sampled again"))
    again, rates_again, _ = run_filter(tmp_path, engine.url, "b", reference_tokenizer=served)
    assert again["rollouts"] == 0 and again["cache_hits"] == 24 and rates_again == rates


def test_killed_server_restarts_with_synced_weights(engine, updated, prompts):
    old_pid, old_pgid = engine.server_pid, engine.server_pgid
    os.kill(old_pid, signal.SIGKILL)
    out = engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=8))
    assert [len(row) for row in out] == [2] * len(prompts)
    assert engine.restarts == 1 and engine.server_pid != old_pid
    assert live_members(old_pgid) == []
    if engine.weight_version:  # the sync test ran: the restart must bring back the synced weights, not the originals
        seq = prompts[3]
        assert engine.prompt_logprobs(seq) == pytest.approx(hf_score(updated, seq[:1], seq[1:]), abs=LOGPROB_ATOL)


def test_close_leaves_no_process(engine):
    pgid = engine.server_pgid
    members = live_members(pgid)
    assert members, "the server group should be running before close()"
    engine.close()
    assert live_members(pgid) == []
    for pid in members:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        assert Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z", f"pid {pid} still alive"
    engine.close()  # idempotent
    with pytest.raises(RuntimeError, match="no server"):
        engine.generate([[1, 2, 3]], 1, SamplingParams(max_new_tokens=2))


def test_startup_timeout_names_the_log_and_kills_the_group(tiny, tmp_path):
    require_vllm_venv()
    eng = VLLMEngine(tiny[0], options=ServerOptions(startup_timeout=3.0), workdir=tmp_path, wait=False)
    pgid, log = eng.server_pgid, eng.log_path
    with pytest.raises(TimeoutError, match="not healthy after 3s") as info:
        eng.wait_ready()
    assert str(log) in str(info.value)
    assert wait_group_gone(pgid, 5.0) == []
    eng.close()


# Stands in for the vLLM venv's python: healthy on GET, dies on the first POST, and refuses a second start.
STUB_SERVER = """
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launched")
if os.path.exists(marker):
    print("stub: refusing to start again", flush=True)
    sys.exit(3)
open(marker, "w").close()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        os._exit(1)

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_failed_restart_raises_naming_the_logs(tiny, tmp_path):
    """Crash mid-generate, then a restart that cannot start: a RuntimeError with both logs, nothing left running."""
    (tmp_path / "stub.py").write_text(STUB_SERVER)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "stub.py"}" "$@"\n')
    python.chmod(0o755)
    options = ServerOptions(venv=tmp_path / "venv", startup_timeout=30.0)
    eng = VLLMEngine(tiny[0], options=options, workdir=tmp_path / "work", max_retries=1)
    first_pgid = eng.server_pgid
    with pytest.raises(RuntimeError, match="restart failed") as info:
        eng.generate([[1, 2, 3]], 1, SamplingParams(max_new_tokens=2))
    message = str(info.value)
    assert "server-0.log" in message and "server-1.log" in message
    assert "refusing to start again" in message  # the tail of the failed start's log
    assert eng.restarts == 1 and eng.server_pid is None
    assert live_members(first_pgid) == []
    eng.close()


# Starts a server without waiting for it, reports its group, and exits (no close()) when stdin closes.
CHILD = """
import sys
from cascade.stages.engines.vllm import VLLMEngine
eng = VLLMEngine(sys.argv[1], workdir=sys.argv[2], wait=False)
print(eng.server_pgid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_server_never_outlives_its_trainer(tiny, tmp_path, how):
    """Normal exit without close() runs the finalizer; SIGKILL runs nothing, so the server's watchdog acts."""
    require_vllm_venv()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tiny[0]), str(tmp_path)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pgid = int(child.stdout.readline())
        assert live_members(pgid), "the server should have been launched"
        time.sleep(1.0)  # let the server get going, so there is something to clean up
        if how == "sigkill":
            child.kill()
        else:
            child.stdin.close()
        child.wait(timeout=60)
        assert wait_group_gone(pgid, 15.0) == []
    finally:
        child.kill()
        child.wait()
