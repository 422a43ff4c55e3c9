"""`VLLMEngine`: the RolloutEngine (`stages/engines/interface.py`) on a vLLM server, and its weight sync.

Composed of a `VLLMClient` (client.py) and, in managed mode, a `ManagedServer` (server.py):
- managed, `VLLMEngine(model_dir)`: this engine launches the server and owns it; when generate() or
  sync_weights() finds it dead (process exited, connection refused, 5xx after retries), the engine restarts it
  once, reloads the last synced weights, re-checks them against the stored probe, and retries. With
  `owns_model_dir=True` (a copy of the policy saved for this engine) close() removes model_dir too;
- external, `VLLMEngine(url=...)`: an already running server; never started, stopped or restarted here.

Generation. Prompts are token-id lists; up to `prompts_per_request` go in one POST /v1/completions with `n`,
`logprobs`, `return_token_ids`, so the server batches them. Logprobs are vLLM's `processed_logprobs` (after
temperature and top-p, renormalized over the nucleus it sampled from): exactly pi_inf as `base.py` defines it. With a
seed, each prompt
is sent as its own request with a seed derived from (seed, prompt index) (`prompt_seeds`): one seed per
multi-prompt request would give every prompt the same random draws, i.e. correlated samples across the batch.
Per-prompt `seeds` map the same way: each prompt its own request, seeded with a hash of its seed (vLLM seeds
sample j with `seed + j`, so raw consecutive seeds would share streams). Reproducible per seed, but not across
engines: vLLM's draws are its own.

Weight sync protocol (`sync_weights`, disk transfer; the server runs with VLLM_SERVER_DEV_MODE=1):
1. `model.save_pretrained` (safetensors + config) into `<workdir>/weights/vNNNNNN`, written under a temporary
   name and renamed, so a restart never reads a half-written directory; a tied model served untied on CPU
   (see server.py) gets an explicit lm_head tensor in every checkpoint;
2. POST /pause?mode=wait (in-flight requests finish; KV and prefix caches are cleared), POST /collective_rpc
   {"method": "reload_weights", "kwargs": {"weights_path": dir}}, POST /reset_prefix_cache, then POST /resume
   (always, even if the reload failed), and POST /update_weight_version labels the step;
3. probe: the server's prompt logprobs on a fixed token sequence must equal the trainer's own forward
   (`trainer_logprobs`, float32 log_softmax) within `probe_atol` (1e-3 default), else `WeightSyncError`.
Timings land in `last_sync` / `sync_history`; sync_weights also returns the total seconds.
External mode can sync only if that server runs in dev mode and can read this machine's `workdir`.

Untested here (CPU-only machine): `dtype="bfloat16"` (loosen `probe_atol` for it) and `weight_transfer="nccl"`,
which is only a named parameter that raises NotImplementedError: vLLM's /init_weight_transfer_engine and
/update_weights endpoints are the place to build it on a GPU machine. Disk transfer of a large model costs a
full checkpoint write per step. Not thread-safe: one caller at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch

from cascade.stages.engines.interface import Completion, Progress, SamplingParams
from cascade.stages.engines.vllm.client import ServerDied, ServerUnavailable, VLLMClient, _to_completion
from cascade.stages.engines.vllm.probe import PROBE_LENGTH, WeightSyncError, trainer_logprobs
from cascade.stages.engines.vllm.seeds import request_seeds
from cascade.stages.engines.vllm.server import (
    SCRATCH_DIRS,
    SERVED_NAME,
    ManagedServer,
    ServerOptions,
    add_lm_head,
    check_head_dim,
    model_config,
)


def _release(server: ManagedServer | None, workdir: Path, owned: bool, model_copy: Path | None) -> None:
    """The engine's finalizer. It gets the server and paths, never the engine, so the engine can be GC'd."""
    if server is not None:
        server.stop()
    if model_copy is not None:
        shutil.rmtree(model_copy, ignore_errors=True)
    if owned:  # logs stay: error messages point at them
        for sub in ("weights", *SCRATCH_DIRS):
            shutil.rmtree(workdir / sub, ignore_errors=True)
        with contextlib.suppress(OSError):
            workdir.rmdir()  # only if no log was ever written


class VLLMEngine:
    """RolloutEngine on a vLLM server. See the module docstrings for lifecycle and weight-sync protocol."""

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
        owns_model_dir: bool = False,
    ):
        if (model_dir is None) == (url is None):
            raise ValueError("give exactly one of model_dir (managed server) or url (external server)")
        if weight_transfer != "disk":
            raise NotImplementedError(f"weight_transfer={weight_transfer!r}: only 'disk' is implemented here")
        self.options = options or ServerOptions()
        self.model_dir = Path(model_dir).resolve() if model_dir is not None else None
        config: dict[str, Any] = {}
        if self.model_dir is not None:  # fail on a bad model before creating anything
            config = model_config(self.model_dir)
            check_head_dim(config, self.model_dir, self.options.device)
        self.prompts_per_request, self.max_concurrency = prompts_per_request, max_concurrency
        self.stop_token_ids = list(stop_token_ids or [])
        self.probe_atol, self.probe_tokens = probe_atol, probe_tokens
        self.weight_version = 0
        self.last_sync: dict[str, float] = {}
        self.sync_history: list[dict[str, float]] = []
        self._weights_dir: Path | None = None
        self._probe_ref: tuple[list[int], list[float]] | None = None
        owned = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="cascade-vllm-")) if owned else Path(workdir).resolve()
        wd.mkdir(parents=True, exist_ok=True)
        self.workdir = wd
        self._server = ManagedServer(self.model_dir, config, self.options, wd) if self.model_dir else None
        self._client = VLLMClient(
            url or "",
            request_timeout=request_timeout,
            max_retries=max_retries,
            died=self._server.death_notice if self._server else None,
        )
        self._finalizer = weakref.finalize(
            self, _release, self._server, wd, owned, self.model_dir if owns_model_dir else None
        )
        if url is not None:
            # An external server's setup is not known here: untie only if told it was started untied.
            self.untie_embeddings = bool(untie_embeddings)
            self.model_name = self._client.served_model_name()
        else:
            self._init_managed(untie_embeddings, wait)

    def _init_managed(self, untie_embeddings: bool | None, wait: bool) -> None:
        server = self._server
        if untie_embeddings is None:
            untie_embeddings = self.options.device == "cpu" and bool(server.config.get("tie_word_embeddings"))
        self.untie_embeddings = untie_embeddings
        self.model_name = SERVED_NAME
        if untie_embeddings:
            server.serve_untied()
        server.launch()
        self._client.url = server.url  # each launch listens on a new port
        if wait:
            self.wait_ready()

    # ---- lifecycle -------------------------------------------------------------------------------------

    @property
    def managed(self) -> bool:
        return self.model_dir is not None

    @property
    def url(self) -> str:
        return self._client.url

    @property
    def request_timeout(self) -> float:
        return self._client.request_timeout

    @property
    def max_retries(self) -> int:
        return self._client.max_retries

    @property
    def restarts(self) -> int:
        return self._server.restarts if self._server else 0

    @property
    def start_seconds(self) -> float | None:
        return self._server.start_seconds if self._server else None

    @property
    def server_pid(self) -> int | None:
        return self._server.pid if self._server else None

    @property
    def server_pgid(self) -> int | None:
        return self._server.pgid if self._server else None

    @property
    def log_path(self) -> Path | None:
        return self._server.log_path if self._server else None

    def wait_ready(self) -> None:
        """Block until the managed server is healthy; see ManagedServer.wait_ready. No-op for external ones."""
        if self._server is not None:
            self._server.wait_ready()

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _restart(self, cause: Exception) -> None:
        def restore() -> None:
            self._client.url = self._server.url  # the new launch listens on a new port
            if self._weights_dir is not None:
                self._reload(self._weights_dir)
            if self._probe_ref is not None:
                self._verify(*self._probe_ref)

        self._server.restart(cause, restore)

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

    def _post(self, path: str, body: dict[str, Any] | None = None, method: str = "POST") -> Any:
        """One client call, once the managed server (if any) is there and ready."""
        if self._server is not None:
            if self._server.process is None:
                raise RuntimeError(f"vLLM engine has no server (closed, or its start failed; logs in {self.workdir})")
            if not self._server.ready:  # started with wait=False: the first call waits for startup instead
                self._server.wait_ready()
        return self._client.post(path, body, method)

    # ---- generation ------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seeds: list[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        """`seeds` (one per prompt) become vLLM per-request seeds; see the module docstring. `progress` moves as
        requests come back."""
        if not prompts:
            return []
        if self._server is not None and not self._server.ready:  # wait here, not in each worker thread
            self._server.wait_ready()
        return self._with_restart(lambda: self._generate(prompts, n, sampling, seeds, progress))

    def _generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seeds: list[int] | None,
        progress: Progress | None,
    ) -> list[list[Completion]]:
        per_prompt = request_seeds(len(prompts), sampling, seeds)
        if per_prompt is None:
            size = self.prompts_per_request
            chunks = [(prompts[i : i + size], None) for i in range(0, len(prompts), size)]
        else:
            chunks = [([p], seed) for p, seed in zip(prompts, per_prompt)]
        workers = max(1, min(self.max_concurrency, len(chunks)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(self._complete, chunk, n, sampling, seed): len(chunk) for chunk, seed in chunks}
            done = 0
            for future in as_completed(futures):
                done += futures[future]  # the chunk's prompts
                if progress is not None:
                    progress(done, len(prompts))
            parts = [future.result() for future in futures]  # in submission order: prompt order
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
            "model": self.model_name,
            "prompt": [list(map(int, token_ids))],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
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
            "write_s": t_write - t0,
            "reload_s": t_reload - t_ref,
            "probe_s": (t_ref - t_write) + (t_end - t_reload),
            "total_s": t_end - t0,
            "probe_max_abs_diff": max_diff,
            "version": float(version),
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
