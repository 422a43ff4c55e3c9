"""A generative pairwise judge behind an OpenAI-compatible endpoint (Nemotron-Cascade 2's RLHF reward; ArenaHard).

The judge reads a request and two answers and replies with one letter, A or B. Every comparison is asked in both
orders (x as A, then y as A) and x scores 1 per order it wins, so its score is in {0, 0.5, 1} and a judge that
always says "A" gives exactly 0.5: position bias cancels (ArenaHard's two-game protocol, without its 5-point
scale). A verdict that is not one letter, or a reply that is not a chat completion, or a request the server
refuses, is malformed: it is counted and scores 0 for x. 5xx, connection errors and timeouts are retried with
backoff by the same client the OpenAI teacher uses (stages/datasets/teachers.py); a judge that never answers is a
JudgeError. The API key is read from the environment variable the recipe names (`api_key_env`).

Deviation: ArenaHard judges against GPT-4-0314's answers with GPT-4 as judge; here the baseline is any model
source (`cascade eval --baseline`) and the judge any served model: the protocol is the same, the figures are not.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from cascade.artifacts.html_report import standard_error
from cascade.stages.datasets.teachers import OpenAIChatTeacher, RequestRefused, TeacherError, parse_chat_reply
from cascade.stages.domains import Item
from cascade.stages.engines import Completion
from cascade.stages.scoring.reward_sources import JudgeReward
from cascade.stages.train.rollout import score_groups

VERDICT = re.compile(r"^\W*([AB])\W*$")
JUDGE_PROMPT = """Which answer to the request is better? Reply with one letter: A or B.

[Request]
{request}

[Answer A]
{a}

[Answer B]
{b}"""


class JudgeError(RuntimeError):
    """The judge endpoint does not answer (after its retries); one line for the user."""


def parse_verdict(text: str | None) -> str | None:
    """ "A" or "B" when the reply is that one letter (brackets and punctuation allowed), else None."""
    match = VERDICT.match(text or "")
    return match.group(1) if match else None


class PairwiseJudge:
    """compare(requests, xs, ys): x's score against y per request, both orders asked."""

    def __init__(self, cfg: JudgeReward):
        self.cfg = cfg
        self.client = OpenAIChatTeacher(cfg, label="judge")
        self.malformed = 0  # verdicts that were not A or B, since the last reset
        self.lock = threading.Lock()

    def compare(self, requests: list[str], xs: list[str], ys: list[str]) -> list[float]:
        games = [(r, x, y) for r, x, y in zip(requests, xs, ys, strict=True)] + [
            (r, y, x) for r, x, y in zip(requests, xs, ys, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(self.cfg.concurrency, len(games)))) as pool:
            verdicts = list(pool.map(lambda g: self._verdict(*g[1], tag=f"game-{g[0]}"), enumerate(games)))
        n = len(requests)
        return [((verdicts[i] == "A") + (verdicts[n + i] == "B")) / 2 for i in range(n)]

    def _verdict(self, request: str, a: str, b: str, tag: str) -> str | None:
        body = json.dumps(
            {
                "model": self.cfg.model,
                "temperature": 0.0,
                "max_tokens": self.cfg.max_tokens,
                "messages": [{"role": "user", "content": JUDGE_PROMPT.format(request=request, a=a, b=b)}],
            }
        ).encode()
        try:
            raw = self.client.request(body, tag)
        except RequestRefused:
            raw = None
        except TeacherError as err:  # the retries ran out, or the server refuses every request
            raise JudgeError(str(err)) from None
        try:
            verdict = parse_verdict(parse_chat_reply(raw, tag, self.cfg.url).text) if raw is not None else None
        except TeacherError:  # not a chat completion
            verdict = None
        if verdict is None:
            with self.lock:
                self.malformed += 1
        return verdict

    @property
    def retries(self) -> int:
        return self.client.retries


class JudgeRewards:
    """GRPO reward: each rollout judged against its item's reference answer, both orders; in {0, 0.5, 1}."""

    def __init__(self, cfg: JudgeReward, ctx: Any, stages: dict):
        self.judge = PairwiseJudge(cfg)
        self.recipe = ctx.recipe
        self.last: dict[str, float] = {}

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        cells = [(item, c.text) for item, group in zip(items, groups) for c in group]
        before, retries = self.judge.malformed, self.judge.retries
        scores = self.judge.compare(
            [i.prompt for i, _ in cells], [t for _, t in cells], [i.reference for i, _ in cells]
        )
        self.last = {
            "judge_malformed": float(self.judge.malformed - before),
            "judge_retries": float(self.judge.retries - retries),
            "rubric_score": float(score_groups(self.recipe, items, groups).mean()),
        }
        return torch.tensor(scores).view(len(groups), -1)

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return self.last


def probe(url: str, timeout_s: float) -> None:
    """GET {url}/models: a JudgeError in one line unless something answers there (any HTTP status will do: the
    judge's own requests retry 5xx)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as err:
        raise JudgeError(f"judge {url} does not answer: {getattr(err, 'reason', err)}") from None


def win_rate(scores: list[float]) -> tuple[float, float | None]:
    """(mean, standard error) of per-prompt scores in {0, 0.5, 1}."""
    return sum(scores) / len(scores), standard_error(scores)
