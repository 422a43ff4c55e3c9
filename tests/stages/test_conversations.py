"""Multi-turn SFT rows: which tokens carry loss (by hand, for the tiny tokenizer and smollm2's template), the
tool domain's conversations, and the checks a conversation passes before it is data."""

import json
import time

import pytest

from cascade.stages.datasets.conversations import check_messages, dedup_text, single_turn, user_text
from cascade.stages.domains import get_domain
from cascade.stages.train.model import completion_ids, conversation_example, prompt_ids
from cascade.stages.train.tokenizer import CHAT_TEMPLATE, load_tokenizer

TOOL_TALK = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "add(a,b)\nAdd 2 and 3."},
    {"role": "assistant", "content": '{"name": "add", "arguments": {"a": 2, "b": 3}}'},
    {"role": "tool", "content": '{"sum": 5}'},
    {"role": "assistant", "content": "2 + 3 = 5."},
]
# tiny's template with its assistant turns marked, as templates that support assistant masks mark them
MARKED_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ message['content'] }}<|im_end|>",
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|im_end|>{% endif %}",
)


def trained_texts(tokenizer, example) -> list[str]:
    return [tokenizer.decode(example.ids[start:end]) for start, end in example.trained]


def test_a_single_turn_row_tokenizes_as_a_prompt_and_its_completion():
    tok = load_tokenizer()
    prompt, answer = prompt_ids(tok, "Add 2 and 3."), completion_ids(tok, "5")
    example = conversation_example(tok, single_turn("Add 2 and 3.", "5"))
    assert example.ids == prompt + answer
    assert example.trained == ((len(prompt), len(prompt) + len(answer)),)


def test_tiny_tokenizer_trains_each_assistant_turn_and_its_end_token_only():
    tok = load_tokenizer()
    example = conversation_example(tok, TOOL_TALK)
    assert trained_texts(tok, example) == [TOOL_TALK[2]["content"] + "<|im_end|>", "2 + 3 = 5.<|im_end|>"]
    # the ids are the template's rendering of the whole conversation, up to the last turn's end token
    rendered = tok.encode(tok.apply_chat_template(TOOL_TALK, tokenize=False), add_special_tokens=False)
    assert example.ids == rendered[: len(example.ids)] and example.ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    untrained = [i for i in range(len(example.ids)) if not any(a <= i < b for a, b in example.trained)]
    context = tok.decode([example.ids[i] for i in untrained])
    assert "Use the tools." in context and "Add 2 and 3." in context and '{"sum": 5}' in context
    assert context.count("<|im_start|>assistant") == 2 and "2 + 3 = 5." not in context


def test_smollm2_template_trains_the_assistant_turns_not_its_default_system_prompt(smollm2_home, monkeypatch):
    monkeypatch.setenv("CASCADE_HOME", str(smollm2_home))
    from cascade.stages.train.model import chat_ready
    from cascade.stages.train.model_source import smollm2_dir

    path = smollm2_dir()
    tok = chat_ready(load_tokenizer(path), path)  # as the stages load it
    talk = TOOL_TALK[1:]  # no system turn: the template inserts its own
    example = conversation_example(tok, talk)
    assert trained_texts(tok, example) == [talk[1]["content"] + "<|im_end|>", "2 + 3 = 5.<|im_end|>"]
    assert tok.decode(example.ids[: example.trained[0][0]]).startswith("<|im_start|>system\nYou are a helpful AI")
    assert [tok.decode(example.ids[b : b + 1]) for _, b in example.trained[:1]] == ["\n"]  # the untrained newline


def test_generation_markers_give_the_mask_where_a_template_has_them():
    tok = load_tokenizer()
    tok.chat_template = MARKED_TEMPLATE
    marked = conversation_example(tok, TOOL_TALK)
    tok.chat_template = CHAT_TEMPLATE
    assert trained_texts(tok, marked) == trained_texts(tok, conversation_example(tok, TOOL_TALK))


def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line():
    tok = load_tokenizer()
    # drops every assistant turn but the last, as templates that strip past reasoning do
    tok.chat_template = (
        "{% for message in messages %}{% if message['role'] != 'assistant' or loop.last %}<|im_start|>"
        "{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match="generation %} markers") as e:
        conversation_example(tok, TOOL_TALK)
    assert "\n" not in str(e.value)


def long_talk(turns: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}"} for i in range(turns)]


def test_a_conversation_costs_a_fixed_number_of_template_renders_whatever_its_length(monkeypatch):
    """A render per assistant turn, each of every turn before it, made 4,000 turns take 11 s."""
    tok = load_tokenizer()
    rendered: list[int] = []
    render = tok.apply_chat_template

    def counted(conversation, *args, **kwargs):
        rendered.append(len(conversation))
        return render(conversation, *args, **kwargs)

    monkeypatch.setattr(tok, "apply_chat_template", counted)
    talk = long_talk(2_000)
    example = conversation_example(tok, talk)
    assert len(example.trained) == 1_000
    assert sum(rendered) <= 2 * len(talk) + 2  # the whole conversation, the context of its last answer, a probe


@pytest.mark.timeout(300)
def test_a_conversation_of_100000_turns_trains_every_answer_in_seconds():
    tok = load_tokenizer()
    talk = long_talk(100_000)
    started = time.monotonic()
    example = conversation_example(tok, talk)
    seconds = time.monotonic() - started
    assert len(example.trained) == 50_000 and example.trained[-1][1] == len(example.ids)
    for j in range(0, 49_999, 7_919):  # an answer, then the untrained turn and header between it and the next
        (start, end), (next_start, _) = example.trained[j], example.trained[j + 1]
        assert tok.decode(example.ids[start:end]) == f"t{2 * j + 1}<|im_end|>"
        between = tok.decode(example.ids[end:next_start])
        assert between == f"\n<|im_start|>user\nt{2 * j + 2}<|im_end|>\n<|im_start|>assistant\n"
    assert seconds < 60, seconds


@pytest.mark.parametrize(
    ("messages", "complaint"),
    [
        ([], "non-empty list"),
        ([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}], "turn 1"),
        ([{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}], "turn 0"),
        ([{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}], "no user turn"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
            "ends with a user turn",
        ),
    ],
)
def test_a_malformed_conversation_is_named(messages, complaint):
    with pytest.raises(ValueError, match=complaint):
        check_messages(messages)


def test_dedup_reads_a_conversations_user_turns_and_a_single_turns_prompt_and_answer():
    assert dedup_text(single_turn("p", "a")) == ("p", "a")
    assert dedup_text(TOOL_TALK) == ("add(a,b)\nAdd 2 and 3.", "") == (user_text(TOOL_TALK), "")


def test_tool_conversations_call_then_answer_from_the_tools_result():
    domain = get_domain("tool")
    for item in domain.generate("train", 40, seed=3):
        talk = check_messages(domain.conversation(item))
        assert [t["role"] for t in talk] == ["user", "assistant", "tool", "assistant"]
        assert talk[0]["content"] == item.prompt and talk[1]["content"] == item.reference
        assert domain.grade(item, talk[1]["content"]) == 1.0  # the call is what the eval grades
        assert domain.conversation(item) == talk  # a pure function of the item
        call = json.loads(item.reference)
        if call["name"] == "add":
            total = call["arguments"]["a"] + call["arguments"]["b"]
            assert json.loads(talk[2]["content"]) == {"sum": total} and talk[3]["content"].endswith(f"= {total}.")
