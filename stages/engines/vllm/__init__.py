"""Rollout engine backed by a vLLM OpenAI-compatible server, spoken to over plain HTTP.

Importing this package never imports vllm: the server runs from its own venv (`infra/vllm-venv.sh` builds
`<repo>/.venv-vllm`, because vLLM pins fastapi below what Prefect needs), and this side uses only
`urllib.request` + `json`. Three parts, so each can be read (and replaced) on its own:
- `server.py`: the managed server process: venv, command line, environment, launch, health wait, restart,
  process-group kill, the orphan watchdog, and serving tied models untied on CPU;
- `client.py`: the HTTP client of any OpenAI-compatible vLLM server: requests, retries, and the mapping of
  failures to `ServerUnavailable` / `ServerDied`;
- `engine.py`: `VLLMEngine`, the RolloutEngine on a client plus (managed mode) a server: generation, prompt
  logprobs, and weight sync (safetensors on disk, `reload_weights`, a logprob probe).

The names below are the ones callers import from `stages.engines.vllm`.
"""

from cascade.stages.engines.vllm.client import ServerDied, ServerUnavailable, VLLMClient, _to_completion
from cascade.stages.engines.vllm.engine import VLLMEngine, WeightSyncError, trainer_logprobs
from cascade.stages.engines.vllm.server import (
    CPU_HEAD_DIMS,
    DEFAULT_VENV,
    REPO_ROOT,
    SERVED_NAME,
    ManagedServer,
    ServerOptions,
    add_lm_head,
)
from cascade.stages.engines.vllm.server_process import group_members

__all__ = [
    "CPU_HEAD_DIMS",
    "DEFAULT_VENV",
    "REPO_ROOT",
    "SERVED_NAME",
    "ManagedServer",
    "ServerDied",
    "ServerOptions",
    "ServerUnavailable",
    "VLLMClient",
    "VLLMEngine",
    "WeightSyncError",
    "_to_completion",  # tests/stages/test_vllm_engine.py checks the response parsing directly
    "add_lm_head",
    "group_members",
    "trainer_logprobs",
]
