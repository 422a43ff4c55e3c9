"""SFT teachers behind one interface: `answer(items, max_new_tokens) -> [Answer]`, one answer per item.

- `oracle`: the item's reference (the synthetic domains' answer by construction, or a file's reference field).
- `model`: any model the rollout engine loads (tiny, smollm2-135m, an HF dir, a committed checkpoint), sampled
  through `make_engine`, so `engine.kind: vllm` serves a teacher exactly as it serves GRPO rollouts.
- `openai`: an OpenAI-compatible chat-completions endpoint (a vLLM server, a hosted model). The API key is read
  from the environment variable the recipe names; the key itself never appears in a recipe or a log.

Errors. A per-prompt refusal (HTTP 400/413/422, or an answer cut off at max_new_tokens) is an `Answer` with an
`error`: the build drops that row as `teacher_error`. Transient failures (HTTP 5xx, connection errors,
timeouts) are retried with exponential backoff (`backoff_s * 2**attempt`, capped at `max_backoff_s`) up to
`max_retries` times; past that, and for anything malformed (not JSON, no `choices[0].message.content`), the
teacher raises `TeacherError`: one line, and the shard in progress is not committed, so nothing already
committed is lost and a rerun continues from that shard.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from cascade.stages.domains.base import Item
from cascade.stages.recipe.config_base import OpenAIEndpoint
from cascade.stages.recipe.data_sources import ModelTeacher, OracleTeacher
from cascade.stages.recipe.schema import Recipe

PER_PROMPT_ERRORS = (400, 413, 422)  # the server refuses this prompt (too long, bad content): drop the row


class TeacherError(RuntimeError):
    """The teacher cannot go on (server down after retries, malformed reply, missing key): one line."""


@dataclass(frozen=True)
class Answer:
    text: str | None
    error: str | None = None  # set: the row is dropped as teacher_error


class Teacher(Protocol):
    retries: int  # transient failures retried so far (a stage metric)

    def answer(self, items: list[Item], max_new_tokens: int) -> list[Answer]: ...

    def close(self) -> None: ...


class Oracle:
    retries = 0

    def answer(self, items: list[Item], max_new_tokens: int) -> list[Answer]:
        return [Answer(item.reference) for item in items]

    def close(self) -> None:
        pass


def make_teacher(cfg: Any, recipe: Recipe) -> Teacher:
    if isinstance(cfg, OracleTeacher):
        return Oracle()
    if isinstance(cfg, ModelTeacher):
        return ModelTeacherEngine(cfg, recipe)
    return OpenAIChatTeacher(cfg)


class ModelTeacherEngine:
    """A model sampled by the recipe's rollout engine, `batch_size` prompts per generate call."""

    def __init__(self, cfg: ModelTeacher, recipe: Recipe):
        from cascade.stages.engines import make_engine

        self.cfg, self.retries = cfg, 0  # the engine retries on its own
        model, self.tokenizer = load_teacher_model(cfg.source, recipe)
        self.engine = make_engine(recipe.engine, model, self.tokenizer, seed=recipe.seed)
        self.seed = recipe.seed
        self.calls = 0

    def answer(self, items: list[Item], max_new_tokens: int) -> list[Answer]:
        from cascade.stages.engines.interface import SamplingParams
        from cascade.stages.train.model import prompt_ids

        answers: list[Answer] = []
        for start in range(0, len(items), self.cfg.batch_size):
            batch = items[start : start + self.cfg.batch_size]
            self.calls += 1
            # Seeded per call: a rerun of a shard samples what the first run sampled.
            sampling = SamplingParams(
                temperature=self.cfg.temperature, max_new_tokens=max_new_tokens, seed=self.seed * 1_000_003 + self.calls
            )
            groups = self.engine.generate([prompt_ids(self.tokenizer, it.prompt) for it in batch], 1, sampling)
            answers += [
                Answer(g[0].text)
                if g[0].finish_reason == "stop"
                else Answer(None, f"cut off at {max_new_tokens} tokens")
                for g in groups
            ]
        return answers

    def close(self) -> None:
        self.engine.close()


def load_teacher_model(source: str, recipe: Recipe):
    """(model, tokenizer) for any model source (stages.train.model_source.resolve_model_dir); the recipe's for
    "tiny"."""
    from cascade.stages.errors import ModelSourceError
    from cascade.stages.train.model import initial_model

    try:
        return initial_model(recipe.model.model_copy(update={"source": source}), recipe.seed)
    except ModelSourceError as e:
        raise TeacherError(f"teacher source {source!r}: {e}") from None


class OpenAIChatTeacher:
    """POST {url}/chat/completions, one request per prompt, `batch_size` requests in flight."""

    def __init__(self, cfg: OpenAIEndpoint, label: str = "openai teacher"):
        self.cfg, self.label = cfg, label  # the label starts its errors (the judge shares this client)
        self.headers = {"Content-Type": "application/json"}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise TeacherError(f"{label}: environment variable {cfg.api_key_env} (the API key) is not set")
            self.headers["Authorization"] = f"Bearer {key}"
        self.retries = 0

    def answer(self, items: list[Item], max_new_tokens: int) -> list[Answer]:
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.cfg.batch_size, len(items))) as pool:
            return list(pool.map(lambda item: self._ask(item, max_new_tokens), items))

    def close(self) -> None:
        pass

    def _ask(self, item: Item, max_new_tokens: int) -> Answer:
        body = json.dumps(
            {
                "model": self.cfg.model,
                "messages": [{"role": "user", "content": item.prompt}],
                "max_tokens": max_new_tokens,
                "temperature": self.cfg.temperature,
            }
        ).encode()
        try:
            return parse_chat_reply(self.request(body, item.id), item.id, self.cfg.url)
        except RequestRefused as err:
            return Answer(None, str(err))

    def request(self, body: bytes, item_id: str) -> bytes:
        """The reply to one POST, retried with backoff on 5xx, connection errors and timeouts (TeacherError when
        the retries run out); RequestRefused when the server refuses this one prompt."""
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return self._post(body)
            except _Transient as err:
                if attempt == self.cfg.max_retries:
                    raise TeacherError(
                        f"{self.label} {self.cfg.url}: {err} on item {item_id}, {attempt + 1} attempts"
                    ) from None
                self.retries += 1
                time.sleep(min(self.cfg.backoff_s * 2**attempt, self.cfg.max_backoff_s))
        raise AssertionError("unreachable")

    def _post(self, body: bytes) -> bytes:
        req = urllib.request.Request(
            f"{self.cfg.url.rstrip('/')}/chat/completions", data=body, headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300].replace("\n", " ")
            if err.code >= 500:
                raise _Transient(f"HTTP {err.code}") from None
            if err.code in PER_PROMPT_ERRORS:
                raise RequestRefused(f"HTTP {err.code}: {detail}") from None
            raise TeacherError(f"{self.label} {self.cfg.url}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise _Transient(f"no answer in {self.cfg.timeout_s:g}s") from None
            raise _Transient(f"{type(reason).__name__}: {reason}") from None


class _Transient(Exception):
    pass


class RequestRefused(Exception):
    """The server refused this one request (a 4xx about the prompt): the item gets no answer, the rest go on."""


def parse_chat_reply(raw: bytes, item_id: str, url: str) -> Answer:
    """The answer in a chat-completions reply; anything that is not one is a TeacherError naming what is wrong."""
    try:
        reply = json.loads(raw)
        choice = reply["choices"][0]
        text, reason = choice["message"]["content"], choice.get("finish_reason")
        if not isinstance(text, str):
            raise TypeError("message.content is not a string")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TeacherError(
            f"openai teacher {url}: malformed response for item {item_id}: not JSON ({raw[:80]!r})"
        ) from None
    except (KeyError, IndexError, TypeError) as e:
        raise TeacherError(
            f"openai teacher {url}: malformed response for item {item_id}: "
            f"no choices[0].message.content ({type(e).__name__}: {e})"
        ) from None
    if reason == "length":
        return Answer(None, "cut off at max_tokens")
    return Answer(text)
