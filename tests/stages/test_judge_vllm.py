"""The judge against a real vLLM server (from .venv-vllm) behind the fault proxy of the teacher's tests.

The served tiny model is rigged to answer "A" to every prompt: a judge with total position bias. Asked in both
orders, every comparison must come out exactly 0.5, whatever the proxy does to the requests in between.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cascade.flows.cli import app
from cascade.stages.scoring.judge import PairwiseJudge
from cascade.stages.scoring.reward_sources import JudgeReward
from tests.stages.rigged import rigged_vllm_server
from tests.stages.test_sft_data_vllm import FaultProxy
from tests.stages.test_vllm_engine import TINY, require_vllm_venv

pytestmark = pytest.mark.vllm
REQUESTS = ["Tell me about Ada and rain in a calm tone.", "Name a color.", "Say hi."]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    require_vllm_venv()
    with rigged_vllm_server(tmp_path_factory, TINY, answer="A") as url:
        yield url


@pytest.fixture
def proxy(upstream):
    server = FaultProxy(upstream)
    yield server
    server.stop()


def judge_at(url: str, **settings) -> PairwiseJudge:
    return PairwiseJudge(JudgeReward(url=url, model="cascade-policy", backoff_s=0.05, concurrency=1, **settings))


def test_both_orders_cancel_a_position_biased_judge_through_5xx_and_a_timeout(proxy):
    proxy.faults = {2: "500", 5: "stall"}
    judge = judge_at(proxy.url, timeout_s=2.5)
    scores = judge.compare(REQUESTS, ["x answer"] * 3, ["y answer"] * 3)
    assert scores == [0.5, 0.5, 0.5]  # "A" in both orders: one win each way
    assert judge.retries == 2 and judge.malformed == 0
    assert proxy.count == 2 * len(REQUESTS) + 2  # each fault cost exactly one retry; nothing lost


def test_a_malformed_reply_is_counted_and_scores_zero(proxy):
    proxy.faults = {1: "malformed"}  # the first game (request 0, x as A) gets half a JSON body
    judge = judge_at(proxy.url)
    scores = judge.compare(REQUESTS, ["x"] * 3, ["y"] * 3)
    assert scores == [0.0, 0.5, 0.5]  # request 0: its x-as-A game scores 0, and y won the other order
    assert judge.malformed == 1 and judge.retries == 0


def test_cascade_eval_arena_hard_reports_the_win_rate_both_orders(proxy, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "tiny",
            "--recipe",
            "micro",
            "--benchmark",
            "arena_hard",
            "--judge",
            proxy.url,
            "--judge-model",
            "cascade-policy",
            "--limit",
            "3",
            "--max-new-tokens",
            "4",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert scores["prompts"] == 3 and scores["win_rate"] == 0.5 and scores["standard_error"] == 0.0
    assert scores["malformed_verdicts"] == 0 and proxy.count == 6
    rows = [json.loads(line) for line in (tmp_path / "out" / "arena_hard.jsonl").read_text().splitlines()]
    assert [r["score"] for r in rows] == [0.5] * 3 and rows[0]["prompt"].startswith("Use ABC notation")
