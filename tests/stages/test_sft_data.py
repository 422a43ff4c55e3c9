"""SFT data build: sources, decontamination, dedup, rejection sampling, resumable shards, recipe validation.

Teachers here are the oracle or a canned chat-completions server written in this file (so each answer is known);
the OpenAI-compatible teacher against a real vLLM server is in test_sft_data_vllm.py.
"""

from __future__ import annotations

import http.server
import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade.artifacts.checkpoint import committed
from cascade.artifacts.store import Store
from cascade.stages.datasets.conversations import single_turn
from cascade.stages.datasets.filters import ContaminationIndex, normalized_tokens
from cascade.stages.datasets.shards import DATA_DIR, iter_conversations, shard_paths
from cascade.stages.domains import get_domain
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.model import completion_ids, prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer

LONG = (
    "the quick brown fox jumps over the lazy dog while the farmer counts his sheep in the morning light "
    "and the river runs slowly past the mill where children play with paper boats and kites all day long"
)


def recipe_with(tmp_path, stage: dict, domains: dict | None = None, name: str = "store"):
    return validate_recipe(
        {
            "seed": 0,
            "storage": {"root": f"file://{tmp_path}/{name}"},
            "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128},
            "domains": domains or {"math": {"train_size": 40, "heldout_size": 16}},
            "stages": [{"kind": "sft_data", **stage}],
        }
    )


def build(recipe, tmp_path, name: str = "run"):
    store = Store.from_config(recipe.storage)
    ctx = StageContext(recipe, store, name, f"runs/{name}/00-sft_data", ListSink(), workdir=tmp_path)
    return run_sft_data(recipe.stages[0], ctx, StageInputs()), ctx


def read_rows(ctx) -> list[dict]:
    paths = shard_paths(ctx.store.path(f"{ctx.key}/{DATA_DIR}"))
    return [row for p in paths for row in pq.read_table(p).to_pylist()]


def card(ctx) -> dict:
    return json.loads(ctx.store.read_bytes(f"{ctx.key}/data_card.json"))


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_contaminated_user_file_loses_exactly_the_eval_prompts(tmp_path):
    heldout = get_domain("math").generate("heldout", 16, seed=0)
    gsm8k = [json.loads(line) for line in (DEFAULT_DATA_ROOT / "math" / "gsm8k_test.jsonl").open()][:3]
    clean = get_domain("math").generate("train", 10, seed=0)
    edited_gsm8k = [r["question"].replace(" ", "  ", 1).rsplit(" ", 1)[0] + " exactly?" for r in gsm8k]
    contaminated = (
        [h.prompt for h in heldout[:3]]  # verbatim
        + [h.prompt.upper().replace("+", " + ") for h in heldout[3:5]]  # case and spacing edits
        + [h.prompt.rstrip(".?") for h in heldout[5:6]]  # punctuation dropped
        + [f"Hint: {heldout[6].prompt} Show your work."]  # embedded in a longer prompt
        + edited_gsm8k  # a benchmark question with its last word changed: 13-gram overlap
    )
    rows = [{"prompt": p, "reference": "\\boxed{0}"} for p in contaminated]
    rows += [{"prompt": c.prompt, "reference": c.reference} for c in clean]
    source = write_jsonl(tmp_path / "mine.jsonl", rows)
    recipe = recipe_with(
        tmp_path,
        {"sources": {"math": [{"kind": "file", "path": source}]}, "decontamination": {"benchmarks": ["gsm8k"]}},
    )
    result, ctx = build(recipe, tmp_path)
    kept = read_rows(ctx)
    assert [r["messages"][0]["content"] for r in kept] == [c.prompt for c in clean]
    assert result.metrics["dropped/contaminated"] == len(contaminated) == 10
    data_card = card(ctx)
    assert data_card["sources"]["math/file:mine.jsonl"]["dropped"]["contaminated"] == 10
    assert data_card["decontamination"]["eval_sets"] == ["math/heldout", "math/dev", "gsm8k"]
    assert data_card["decontamination"]["eval_prompts"] == 16 + 16 + 1319  # held-out, dev, the benchmark


def test_short_eval_prompts_match_whole_and_long_ones_by_ngram():
    index = ContaminationIndex(["Compute 3+4-2.", " ".join(f"w{i}" for i in range(20))], n=13)
    assert index.is_contaminated("compute 3 + 4 - 2")
    assert index.is_contaminated("Please compute 3+4-2 now")
    assert not index.is_contaminated("Compute 3-4+2.")  # operators are tokens: another problem
    assert not index.is_contaminated("Compute 3+4")  # a part of a short eval prompt is not the prompt
    assert index.is_contaminated(" ".join(f"w{i}" for i in range(5, 18)))  # one shared 13-gram
    assert not index.is_contaminated(" ".join(f"w{i}" for i in range(5, 17)))  # 12 tokens shared: clean
    assert normalized_tokens("A+b, (C)!") == ["a", "+", "b", "c"]


def test_a_template_the_eval_prompts_share_does_not_contaminate_every_prompt_of_its_loader():
    """GSM8K items end with one box instruction: train questions of the same loader are clean, while a
    train prompt that repeats a test question is still caught by that question's own 13-grams."""
    from cascade.stages.domains.math import parse_gsm8k

    def item(question):
        return parse_gsm8k({"question": question, "answer": "#### 1"}, 0).prompt

    test = [item(" ".join(f"q{k}w{i}" for i in range(15))) for k in range(2)]
    index = ContaminationIndex(test, n=13)
    assert index.template_ngrams == 3  # the instruction is 15 tokens (`\\`, `boxed`, `{`, `}` are four): three 13-grams
    assert not index.is_contaminated(item("Natalia sold clips to 48 of her friends in April"))
    # the last words of a test question followed by the instruction are no content of that question
    assert not index.is_contaminated(item("How many did Natalia sell in q1w13 q1w14"))
    assert index.is_contaminated(test[1])
    assert index.is_contaminated(item(" ".join(f"q0w{i}" for i in range(13))))  # a 13-token copy of a question


def test_a_templated_eval_item_with_a_few_words_of_its_own_matches_only_its_own_content():
    """Chat's requests share most of their words with other requests: a few words of each are its own. Those few
    words were once matched as a substring of any prompt, which dropped 320 of 400 chat train prompts (and, through
    a one-number content, every mcqa and code prompt of tiny-paper's build)."""
    from cascade.stages.domains.chat import ChatDomain

    domain = ChatDomain()
    held_out = [item.prompt for split in ("heldout", "dev") for item in domain.iter_items(split, 800, 0)]
    index = ContaminationIndex(held_out, n=13)
    assert len(index.contents) == 25 and index.short == {}  # 25 requests have no 13-gram outside the template
    train = [item.prompt for item in domain.iter_items("train", 400, 0)]
    # 13 share a content with an eval request ("Tell me about Gus" with another tone and word count): the
    # coarseness of template n-grams, not a substring of digits
    assert sum(index.is_contaminated(p) for p in train) == 13
    assert all(index.is_contaminated(p) for p in held_out)


def test_exact_and_near_duplicates_are_dropped_and_counted(tmp_path):
    words = LONG.split()
    near = [" ".join(words[:i] + ["otter"] + words[i + 1 :]) for i in (5, 30)]  # one word swapped each
    rows = [
        {"prompt": "Describe the scene.", "reference": LONG},
        {"prompt": "describe   the SCENE", "reference": LONG.upper()},  # same after normalization
        {"prompt": "Describe the scene.", "reference": LONG},  # verbatim
        {"prompt": "Describe the scene.", "reference": near[0]},
        {"prompt": "Describe the scene.", "reference": near[1]},
        {"prompt": "Describe something else entirely.", "reference": "A short and different answer."},
    ]
    source = write_jsonl(tmp_path / "dups.jsonl", rows)
    stage = {"sources": {"math": [{"kind": "file", "path": source}]}, "dedup": {"threshold": 0.7}}
    result, ctx = build(recipe_with(tmp_path, stage), tmp_path)
    kept = [r["messages"][1]["content"] for r in read_rows(ctx)]
    assert kept == [LONG, "A short and different answer."]
    assert result.metrics["dropped/duplicate"] == 2 and result.metrics["dropped/near_duplicate"] == 2
    assert card(ctx)["dropped"]["near_duplicate"] == 2

    off = {**stage, "dedup": {"exact": True, "near": False}}
    result, _ = build(recipe_with(tmp_path, off, name="off"), tmp_path, "off")
    assert result.metrics["dropped/near_duplicate"] == 0 and result.metrics["rows"] == 4


class CannedChat(http.server.BaseHTTPRequestHandler):
    """A chat-completions endpoint answering each prompt from `answers` (prompt -> text)."""

    answers: dict[str, str] = {}
    requests: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        type(self).requests.append(prompt)
        answer, status, reason = self.answers[prompt], 200, "stop"
        if answer == "REFUSE":  # this one prompt is refused, as a server does for one too long
            answer, status = None, 400
        elif answer == "CUT":
            reason = "length"
        reply = {
            "choices": [{"index": 0, "finish_reason": reason, "message": {"role": "assistant", "content": answer}}]
        }
        data = json.dumps(reply if status == 200 else {"error": "prompt too long"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def canned_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CannedChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    CannedChat.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_rejection_sampling_keeps_only_verified_answers(tmp_path, canned_server, monkeypatch):
    items = get_domain("math").generate("train", 12, seed=0)
    wrong = {it.prompt for it in items[::3]}
    CannedChat.answers = {
        it.prompt: it.reference.replace("boxed{", "boxed{1") if it.prompt in wrong else it.reference for it in items
    }
    monkeypatch.setenv("TEACHER_KEY", "not-a-real-key")
    teacher = {"kind": "openai", "url": canned_server, "model": "m", "api_key_env": "TEACHER_KEY", "batch_size": 4}
    recipe = recipe_with(tmp_path, {"teacher": teacher}, {"math": {"train_size": 12, "heldout_size": 8}})
    result, ctx = build(recipe, tmp_path)
    kept = [r["messages"][0]["content"] for r in read_rows(ctx)]
    assert kept == [it.prompt for it in items if it.prompt not in wrong]
    assert result.metrics["dropped/unverified"] == len(wrong) == 4
    assert sorted(CannedChat.requests) == sorted(it.prompt for it in items)
    assert card(ctx)["teachers"]["math"]["api_key_env"] == "TEACHER_KEY"
    assert "not-a-real-key" not in json.dumps(card(ctx)) + json.dumps(result.metrics)

    unverified = recipe_with(
        tmp_path, {"teacher": teacher, "verify": False}, {"math": {"train_size": 12, "heldout_size": 8}}, "nv"
    )
    assert build(unverified, tmp_path, "nv")[0].metrics["rows"] == 12


def test_refused_and_cut_off_answers_are_teacher_errors(tmp_path, canned_server):
    items = get_domain("math").generate("train", 6, seed=0)
    CannedChat.answers = {it.prompt: it.reference for it in items}
    CannedChat.answers[items[1].prompt], CannedChat.answers[items[4].prompt] = "REFUSE", "CUT"
    teacher = {"kind": "openai", "url": canned_server, "model": "m"}
    recipe = recipe_with(tmp_path, {"teacher": teacher}, {"math": {"train_size": 6, "heldout_size": 8}})
    result, ctx = build(recipe, tmp_path)
    assert [r["messages"][0]["content"] for r in read_rows(ctx)] == [items[i].prompt for i in (0, 2, 3, 5)]
    assert result.metrics["dropped/teacher_error"] == 2 and result.metrics["teacher_retries"] == 0


def test_crashed_build_resumes_at_the_first_uncommitted_shard(tmp_path, monkeypatch):
    import cascade.stages.kinds.sft_data.run_sft_data as sft_data

    stage = {"shard_rows": 16}
    domains = {"math": {"train_size": 40, "heldout_size": 16}, "instruct": {"train_size": 24, "heldout_size": 16}}
    straight, straight_ctx = build(recipe_with(tmp_path, stage, domains, "a"), tmp_path, "a")
    assert straight.metrics["shards"] == 4 and straight.metrics["teacher_rows"] == 64

    recipe = recipe_with(tmp_path, stage, domains, "b")
    real = sft_data.ShardBuilder.make_shard
    calls = []

    def dies_on_third(self, index, *args):
        calls.append(index)
        if len(calls) == 3:
            raise RuntimeError("preempted")
        return real(self, index, *args)

    monkeypatch.setattr(sft_data.ShardBuilder, "make_shard", dies_on_third)
    with pytest.raises(RuntimeError, match="preempted"):
        build(recipe, tmp_path, "b")
    monkeypatch.undo()
    store = Store.from_config(recipe.storage)
    assert [committed(store, f"runs/b/00-sft_data/shards/{k:05d}") is not None for k in range(4)] == [
        True,
        True,
        False,
        False,
    ]
    assert committed(store, "runs/b/00-sft_data") is None

    resumed, ctx = build(recipe, tmp_path, "b")
    assert resumed.metrics["shards_reused"] == 2 and resumed.metrics["teacher_rows"] == 32
    assert read_rows(ctx) == read_rows(straight_ctx)
    counts = ("rows", "tokens", "input_rows", "dropped/duplicate", "rows/math", "tokens/instruct")
    assert {k: resumed.metrics[k] for k in counts} == {k: straight.metrics[k] for k in counts}
    assert not store.exists("runs/b/00-sft_data/shards")  # staging copies go once the stage commits


def test_shared_file_source_and_token_counts_as_sft_sees_them(tmp_path):
    stage = {
        "sources": {
            "math": [
                {"kind": "shared", "file": "math/gsm8k_train.jsonl", "format": "gsm8k", "count": 30},
                {"kind": "synthetic", "share": 0.5},
            ]
        },
        "max_tokens": 300,
    }
    result, ctx = build(recipe_with(tmp_path, stage), tmp_path)
    rows, tokenizer = read_rows(ctx), load_tokenizer()
    data_card = card(ctx)
    gsm = data_card["sources"]["math/shared:gsm8k_train.jsonl"]
    assert gsm["input"] == 30 and gsm["rows"] + gsm["dropped"]["too_long"] == 30 and gsm["dropped"]["too_long"] > 0
    assert data_card["sources"]["math/synthetic"]["input"] == 20  # share 0.5 of train_size 40
    for row in rows:
        prompt, response = (m["content"] for m in row["messages"])
        assert row["num_tokens"] == len(prompt_ids(tokenizer, prompt)) + len(completion_ids(tokenizer, response))
        assert row["num_tokens"] <= 300
    assert sum(r["num_tokens"] for r in rows) == result.metrics["tokens"] == data_card["tokens"]
    assert rows[0]["messages"][1]["content"].endswith("\\boxed{72}")  # GSM8K's first answer, parsed by its loader
    assert "| math/shared:gsm8k_train.jsonl | math | 30 |" in ctx.store.read_bytes(f"{ctx.key}/DATA_CARD.md").decode()


def test_parquet_user_file_and_sft_reads_the_shards(tmp_path):
    table = pa.table({"question": ["Say hi.", "Say bye."], "answer": ["hi", "bye"]})
    pq.write_table(table, tmp_path / "mine.parquet")
    source = {
        "kind": "file",
        "path": str(tmp_path / "mine.parquet"),
        "prompt_field": "question",
        "reference_field": "answer",
    }
    stage = {"sources": {"instruct": [source]}}
    recipe = recipe_with(tmp_path, stage, {"instruct": {"train_size": 5, "heldout_size": 8}})
    _, ctx = build(recipe, tmp_path)
    local = tmp_path / "copy"
    from cascade.artifacts.checkpoint import materialize

    materialize(ctx.store, committed(ctx.store, ctx.key), local)
    assert list(iter_conversations(shard_paths(local / DATA_DIR))) == [
        single_turn("Say hi.", "hi"),
        single_turn("Say bye.", "bye"),
    ]


def talk(user: str, *answers: str) -> list[dict]:
    """A tool-use conversation: the user turn, then assistant turns with a tool result between them."""
    turns = [{"role": "system", "content": "Tools: add(a,b)."}, {"role": "user", "content": user}]
    for i, answer in enumerate(answers):
        turns += [{"role": "tool", "content": '{"sum": 5}'}] if i else []
        turns += [{"role": "assistant", "content": answer}]
    return turns


def test_conversations_are_built_whole_without_a_teacher_and_filtered_by_their_user_turns(tmp_path):
    from cascade.stages.kinds.sft.run_sft import load_examples
    from cascade.stages.train.context import StageContext
    from cascade.stages.train.model import conversation_example

    tool = get_domain("tool")
    heldout = tool.generate("heldout", 8, seed=0)[0].prompt
    kept_talk = talk("Add 2 and 3, then tell me.", '{"name": "add", "arguments": {"a": 2, "b": 3}}', "It is 5.")
    rows = [
        {"messages": kept_talk},
        {"messages": talk("Add 2 and 3, then tell me.", "5", "Five.")},  # the same user turns: a duplicate
        {"messages": talk(heldout, "x")},  # a held-out prompt as a user turn
        {"messages": talk("Say a lot.", LONG * 4)},  # over max_tokens
    ]
    source = write_jsonl(tmp_path / "talks.jsonl", rows)
    stage = {
        "max_tokens": 300,
        "teacher": {"kind": "model", "source": "/no/such/model"},  # asked for nothing: loading it would fail
        "sources": {
            "tool": [
                {"kind": "synthetic", "conversations": True, "count": 3},
                {"kind": "file", "path": source, "messages_field": "messages"},
            ]
        },
    }
    recipe = recipe_with(tmp_path, stage, {"tool": {"train_size": 6, "heldout_size": 8}})
    result, ctx = build(recipe, tmp_path)
    built = read_rows(ctx)
    synthetic = [tool.conversation(item) for item in tool.generate("train", 3, seed=0)]
    assert [r["messages"] for r in built] == [*synthetic, kept_talk]
    tok = load_tokenizer()
    assert [r["num_tokens"] for r in built] == [len(conversation_example(tok, r["messages"]).ids) for r in built]
    dropped = card(ctx)["sources"]["tool/file:talks.jsonl"]["dropped"]
    assert (dropped["duplicate"], dropped["contaminated"], dropped["too_long"]) == (1, 1, 1)
    assert result.metrics["teacher_rows"] == 0

    # SFT reads each conversation with loss on its assistant turns
    sft_ctx = StageContext(recipe, ctx.store, "run", "runs/run/01-sft", ListSink(), workdir=tmp_path / "sft")
    (tmp_path / "sft").mkdir()
    examples = load_examples(sft_ctx, committed(ctx.store, ctx.key), tok)
    trained = [[tok.decode(e.ids[a:b]) for a, b in e.trained] for e in examples]
    assert trained[-1] == [kept_talk[2]["content"] + "<|im_end|>", "It is 5.<|im_end|>"]
    assert [len(t) for t in trained] == [2, 2, 2, 2]


def test_conversations_with_a_bad_turn_or_in_an_rl_stage_are_one_line(tmp_path):
    bad = write_jsonl(tmp_path / "talks.jsonl", [{"messages": talk("hi", "hello")}, {"messages": talk("hi")}])
    source = {"kind": "file", "path": bad, "messages_field": "messages"}
    with pytest.raises(
        RecipeError,
        match=r"talks.jsonl: row 2: 'messages': the conversation ends with a user turn, not an assistant turn$",
    ):
        recipe_with(tmp_path, {"sources": {"tool": [source]}}, {"tool": {"train_size": 6, "heldout_size": 8}})
    with pytest.raises(RecipeError, match="the math generator has no multi-turn conversations; those that do: tool$"):
        recipe_with(tmp_path, {"sources": {"math": [{"kind": "synthetic", "conversations": True}]}})
    rl = {
        "seed": 0,
        "domains": {"tool": {"train_size": 6, "heldout_size": 8}},
        "stages": [{"kind": "grpo", "name": "rl", "domains": ["tool"], "prompts": {"tool": [source]}}],
    }
    with pytest.raises(
        RecipeError, match="conversations are SFT data .an sft_data source.; an RL stage reads prompts$"
    ):
        validate_recipe(rl)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "stage, message",
    [
        (
            {"sources": {"math": [{"kind": "ftp", "path": "x"}]}},
            "Input tag 'ftp' found using 'kind' does not match any of the expected tags",
        ),
        (
            {"sources": {"math": [{"kind": "file", "path": "/no/such/file.jsonl"}]}},
            "file not found: /no/such/file.jsonl",
        ),
        ({"sources": {"math": [{"kind": "file", "path": "/etc/hostname"}]}}, "cannot tell the format"),
        (
            {"sources": {"math": [{"kind": "shared", "file": "math/nope.jsonl", "format": "gsm8k"}]}},
            "data file not found",
        ),
        (
            {"sources": {"math": [{"kind": "shared", "file": "math/gsm8k_train.jsonl", "format": "gsm9k"}]}},
            "unknown format 'gsm9k'",
        ),
        (
            {"sources": {"math": [{"kind": "shared", "file": "mcqa/mmlu_stem_test.jsonl", "format": "mmlu_stem"}]}},
            "format 'mmlu_stem' is a mcqa benchmark, not math",
        ),
        ({"sources": {"math": [{"kind": "synthetic", "count": 3, "share": 0.5}]}}, "not both"),
        ({"sources": {"chess": [{"kind": "synthetic"}]}}, "sources or teachers for domain(s) ['chess']"),
        (
            {"teacher": {"kind": "openai", "url": "http://x/v1", "model": "m", "api_key_env": "sk-abc123"}},
            "teacher.openai.api_key_env: String should match pattern",
        ),
        ({"teacher": {"kind": "openai", "url": "x/v1", "model": "m"}}, "teacher.openai.url: String should match"),
        ({"teacher": {"kind": "model"}}, "teacher.model.source: Field required"),
        ({"teacher": {"kind": "human"}}, "does not match any of the expected tags"),
        ({"decontamination": {"benchmarks": ["gsm9k"]}}, "unknown benchmark(s) ['gsm9k']"),
        ({"decontamination": {"ngram": 0}}, "decontamination.ngram: Input should be greater than or equal to 1"),
        ({"dedup": {"threshold": 1.5}}, "dedup.threshold: Input should be less than or equal to 1"),
        ({"shard_rows": 0}, "shard_rows: Input should be greater than or equal to 1"),
    ],
)
def test_bad_sft_data_settings_are_one_line_errors(tmp_path, stage, message):
    with pytest.raises(RecipeError) as err:
        recipe_with(tmp_path, stage)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_api_key_and_bad_rows_fail_before_anything_is_committed(tmp_path):
    teacher = {"kind": "openai", "url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "CASCADE_NO_SUCH_KEY"}
    recipe = recipe_with(tmp_path, {"teacher": teacher})
    with pytest.raises(RuntimeError, match="environment variable CASCADE_NO_SUCH_KEY .* is not set"):
        build(recipe, tmp_path)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "reference": "fine"}, {"text": "no prompt"}])
    with pytest.raises(ValueError, match=r"bad.jsonl: row 2: no 'prompt' string"):  # found when the recipe validates
        recipe_with(tmp_path, {"sources": {"math": [{"kind": "file", "path": bad}]}}, name="bad")
    assert not (tmp_path / "bad").exists()


def test_shipped_recipes_build_with_dedup_and_decontamination(tmp_path):
    from cascade.flows.recipes import load_recipe
    from tests.conftest import micro_recipe

    for name in ("tiny", "micro"):
        stage = load_recipe(name).stage("sft_data")
        assert stage.dedup.exact and stage.dedup.near and stage.decontamination.enabled
    recipe = micro_recipe(tmp_path)
    result, ctx = build(recipe, tmp_path)
    # the synthetic splits are disjoint by construction: both filters run and drop nothing
    assert result.metrics["rows"] == result.metrics["input_rows"] == 128 and result.metrics["shards"] == 2
    assert card(ctx)["decontamination"]["eval_prompts"] == 64  # 2 domains x (16 held-out + 16 dev)


def test_user_files_stream_from_s3(tmp_path, monkeypatch):
    import gzip
    import io

    import boto3

    from tests.artifacts.servers import FAKE_KEYS, make_bucket, moto_server

    server = moto_server(tmp_path).start()
    try:
        make_bucket(server.url, "corpus")
        for key, value in {**FAKE_KEYS, "AWS_ENDPOINT_URL": server.url, "AWS_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        client = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1")
        jsonl = "".join(json.dumps({"prompt": f"Say {w}.", "reference": w}) + "\n" for w in ("a", "b", "c"))
        client.put_object(Bucket="corpus", Key="sft/mine.jsonl.gz", Body=gzip.compress(jsonl.encode()))
        parquet = io.BytesIO()
        pq.write_table(pa.table({"prompt": ["Say d.", "Say e."], "reference": ["d", "e"]}), parquet)
        client.put_object(Bucket="corpus", Key="sft/more.parquet", Body=parquet.getvalue())
        sources = [
            {"kind": "file", "path": "s3://corpus/sft/mine.jsonl.gz", "count": 2},
            {"kind": "file", "path": "s3://corpus/sft/more.parquet"},
        ]
        recipe = recipe_with(
            tmp_path, {"sources": {"instruct": sources}}, {"instruct": {"train_size": 5, "heldout_size": 8}}
        )
        result, ctx = build(recipe, tmp_path)
    finally:
        server.stop()
    assert [r["messages"][1]["content"] for r in read_rows(ctx)] == ["a", "b", "d", "e"]
    assert set(card(ctx)["sources"]) == {"instruct/file:mine.jsonl.gz", "instruct/file:more.parquet"}


def test_model_teacher_from_a_checkpoint_uri_and_an_hf_dir(tmp_path):
    """A rigged tiny model that always answers "7": the math grader rejects it, unverified rows pass."""
    from cascade.artifacts.checkpoint import write_checkpoint
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model, save_hf
    from tests.stages.rigged import rig_short_answers

    tokenizer = load_tokenizer()
    model = build_tiny_model(
        ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), len(tokenizer), seed=0
    )
    rig_short_answers(model, tokenizer)
    save_hf(model, tokenizer, tmp_path / "teacher" / "model")
    store = Store(f"file://{tmp_path}/models")
    ref = write_checkpoint(store, "teacher", tmp_path / "teacher", stage="sft", step=None, parent=None, config_hash="x")
    domains = {"math": {"train_size": 10, "heldout_size": 8}}
    teacher = {"kind": "model", "source": ref.uri, "max_new_tokens": 4, "batch_size": 4}
    result, _ = build(recipe_with(tmp_path, {"teacher": teacher}, domains, "ckpt"), tmp_path, "ckpt")
    assert result.metrics["dropped/unverified"] == 10 and result.metrics["rows"] == 0
    assert result.metrics["teacher_rows"] == 10

    teacher = {**teacher, "source": str(tmp_path / "teacher" / "model")}
    result, ctx = build(recipe_with(tmp_path, {"teacher": teacher, "verify": False}, domains, "dir"), tmp_path, "dir")
    assert [r["messages"][1]["content"] for r in read_rows(ctx)] == ["7"] * 10


def test_the_stage_checkpoint_carries_the_config_hash_the_task_layer_compares(tmp_path):
    from cascade.artifacts.config import config_hash

    recipe = recipe_with(tmp_path, {})
    result, _ = build(recipe, tmp_path)
    assert result.checkpoint.config_hash == config_hash(recipe.stages[0])
