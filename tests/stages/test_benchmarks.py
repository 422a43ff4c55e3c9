"""Real benchmark loaders and graders: gold answers pass, wrong ones fail; IFEval agrees with if-verifiable;
pass@k matches hand-computed values; evaluate_benchmark aggregates an engine's completions correctly."""

import json
import threading

import pytest

from cascade.stages.domains import get_domain
from cascade.stages.domains.benchdata import BenchmarkError, benchmark_registry, load_items, resolve_benchmarks
from cascade.stages.engines.interface import Completion
from cascade.stages.evals.benchmarks import evaluate_benchmark, grade_rows, pass_at_k
from cascade.stages.train.model import prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer


def items_of(name, limit=None):
    return load_items(benchmark_registry()[name], limit=limit)


def test_registry_has_the_real_benchmarks_and_refuses_unknown_names():
    registry = benchmark_registry()
    for name, domain in [
        ("gsm8k", "math"),
        ("aime24", "math"),
        ("amc23", "math"),
        ("ifeval", "instruct"),
        ("mmlu_stem", "mcqa"),
    ]:
        assert registry[name].domain == domain
    with pytest.raises(BenchmarkError, match="unknown benchmark 'gsm9k'"):
        resolve_benchmarks(["gsm9k"])


def test_gsm8k_gold_passes_and_off_by_one_fails():
    items = items_of("gsm8k")
    assert len(items) == 1319
    math = get_domain("math")
    assert "\\boxed{}" in items[0].prompt and items[0].meta["answer"] == "18"  # "#### 18"
    assert all(math.grade(it, f"So the answer is \\boxed{{{it.meta['answer']}}}.") == 1.0 for it in items)
    assert all(math.grade(it, it.reference) == 1.0 for it in items)
    off = [math.grade(it, f"\\boxed{{{int(it.meta['answer']) + 1}}}") for it in items[:250]]
    assert off == [0.0] * 250
    unboxed = [math.grade(it, it.meta["answer"]) for it in items[:50]]
    assert unboxed == [0.0] * 50


def test_gsm8k_commas_are_stripped_from_gold():
    item = get_domain("math").benchmarks()["gsm8k"].parse_row({"question": "q", "answer": "work\n#### 1,234"}, 0)
    assert item.meta["answer"] == "1234"
    assert get_domain("math").grade(item, "\\boxed{1,234}") == 1.0  # math-verify reads the thousands separator


@pytest.mark.parametrize("name, rows", [("aime24", 30), ("amc23", 40)])
def test_competition_gold_passes_and_wrong_fails(name, rows):
    items, math = items_of(name), get_domain("math")
    assert len(items) == rows
    assert all(math.grade(it, f"\\boxed{{{it.meta['answer']}}}") == 1.0 for it in items)
    assert all(math.grade(it, f"\\boxed{{{int(it.meta['answer']) + 7}}}") == 0.0 for it in items)


def test_math_verify_equivalence_including_from_a_worker_thread():
    item = items_of("aime24", limit=1)[0]  # gold "204"
    cases = {
        "\\boxed{204}": 1.0,
        "\\boxed{204.0}": 1.0,
        "\\boxed{\\frac{408}{2}}": 1.0,
        "\\boxed{205}": 0.0,
        "\\boxed{204": 0.0,
        "204": 0.0,
    }
    assert {c: get_domain("math").grade(item, c) for c in cases} == cases
    got = {}
    worker = threading.Thread(target=lambda: got.update({c: get_domain("math").grade(item, c) for c in cases}))
    worker.start()
    worker.join(60)
    assert got == cases  # no "signal only works in main thread" error


def test_mmlu_gold_letter_passes_and_wrong_letter_fails():
    items, mcqa = items_of("mmlu_stem"), get_domain("mcqa")
    assert len(items) == 3018
    assert all(mcqa.grade(it, f"The answer is ({it.meta['answer']}).") == 1.0 for it in items)
    wrong = {"A": "B", "B": "C", "C": "D", "D": "A"}
    assert all(mcqa.grade(it, f"The answer is ({wrong[it.meta['answer']]}).") == 0.0 for it in items)
    first = items[0]  # gold index 2
    assert first.meta["answer"] == "C" and "(C) reduce the carrying capacity" in first.prompt
    assert mcqa.grade(first, "C") == 1.0 and mcqa.grade(first, "Answer: C") == 1.0
    assert mcqa.grade(first, "A carrying capacity question.") == 0.0  # a leading article is not an answer


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.7),
        (10, 3, 5, 1 - 21 / 252),
        (4, 4, 2, 1.0),
        (6, 0, 3, 0.0),
        (3, 1, 3, 1.0),
        (20, 1, 1, 0.05),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


# One row per case: instruction, kwargs, response, expected strict, expected loose. Responses are built to
# satisfy or violate the instruction; loose-only cases pass once the first/last line or `*` are removed.
IFEVAL_CASES = [
    ("punctuation:no_comma", {}, "No commas here at all.", True, True),
    ("punctuation:no_comma", {}, "One, two.", False, False),
    ("change_case:english_lowercase", {}, "all of this text is written in lowercase english words.", True, True),
    (
        "change_case:english_lowercase",
        {},
        "Sure! Here it is:\nall of this text is lowercase english words.",
        False,
        True,
    ),
    ("change_case:english_capital", {}, "THIS ENTIRE ANSWER IS WRITTEN IN CAPITAL LETTERS.", True, True),
    ("change_case:english_capital", {}, "THIS IS MOSTLY CAPITALS but not all.", False, False),
    (
        "length_constraints:number_words",
        {"relation": "at least", "num_words": 5},
        "one two three four five six",
        True,
        True,
    ),
    (
        "length_constraints:number_words",
        {"relation": "less than", "num_words": 5},
        "one two three four five six",
        False,
        False,
    ),
    ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3}, "One. Two.", True, True),
    ("length_constraints:number_sentences", {"relation": "at least", "num_sentences": 3}, "One. Two.", False, False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", True, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "First part.\n***\nSecond part.", False, False),
    ("detectable_format:title", {}, "<<My Title>>\nBody text.", True, True),
    ("detectable_format:title", {}, "My Title\nBody text.", False, False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", True, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "* one\n* two", False, False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*a* and *b*", True, True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "*a* and *b*", False, False),
    ("detectable_format:json_format", {}, '{"a": 1}', True, True),
    ("detectable_format:json_format", {}, "not json {", False, False),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nfoo\nSection 2\nbar",
        True,
        True,
    ),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\nP.S. bye", True, True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello. Bye.", False, False),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", True, True),
    ("detectable_content:number_placeholders", {"num_placeholders": 3}, "Dear [name], at [address].", False, False),
    ("keywords:existence", {"keywords": ["ocean", "salt"]}, "The ocean tastes of salt.", True, True),
    ("keywords:existence", {"keywords": ["ocean", "salt"]}, "The ocean is big.", False, False),
    ("keywords:forbidden_words", {"forbidden_words": ["rain"]}, "Sunny skies today.", True, True),
    ("keywords:forbidden_words", {"forbidden_words": ["rain"]}, "Rain again today.", False, False),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat and cat", True, True),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
        "zz top",
        True,
        True,
    ),
    ("startend:quotation", {}, '"Wrapped in quotes."', True, True),
    ("startend:quotation", {}, "Not wrapped.", False, False),
    (
        "startend:end_checker",
        {"end_phrase": "Is there anything else I can help with?"},
        "Done. Is there anything else I can help with?",
        True,
        True,
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Is there anything else I can help with?"},
        "Done. Is there anything else I can help with?\nThanks!",
        False,
        True,
    ),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", True, True),
    ("combination:two_responses", {}, "Only one answer.", False, False),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "THIS is VERY important.",
        True,
        True,
    ),
    (
        "language:response_language",
        {"language": "en"},
        "This is a plain English sentence about the weather.",
        True,
        True,
    ),
    ("detectable_format:constrained_response", {}, "My answer is yes.", True, True),
    ("detectable_format:constrained_response", {}, "Maybe.", False, False),
]


def test_ifeval_verdicts_match_expectations_and_if_verifiable():
    from if_verifiable import IFEvalSample, evaluate_output_for_sample

    from cascade.stages.domains.instruction_checkers import ifeval_verdicts

    for instruction_id, kwargs, response, strict, loose in IFEVAL_CASES:
        prompt = "Write something."
        mine = ifeval_verdicts([instruction_id], [kwargs], prompt, response)
        ref, _ = evaluate_output_for_sample("ifeval", IFEvalSample(0, prompt, [instruction_id], [kwargs]), response)
        case = (instruction_id, response)
        assert [(v["strict"], v["loose"]) for v in mine] == [(strict, loose)], case
        assert [(r.strict_pass, r.loose_pass) for r in ref] == [(strict, loose)], case


def test_ifeval_grades_after_its_punkt_cache_was_deleted():
    """Our punkt_tab files live under the CASCADE_HOME of the checkers' first use: a cache cleaned (or a test's
    home removed) before a later sentence count must not turn every later grade into an error."""
    import shutil

    import nltk

    from cascade.stages.domains import instruction_checkers as checkers

    checkers.prepare_checkers()
    if "tokenizers/punkt_tab/english" not in checkers._nltk_missing:
        pytest.skip("NLTK's own punkt_tab is installed here: the project writes no cache to lose")
    shutil.rmtree(checkers._nltk_root, ignore_errors=True)
    # the loaded model is kept in three caches: make the next sentence count read the files again
    from if_verifiable.ifeval import instructions_util

    instructions_util._get_sentence_tokenizer.cache_clear()
    nltk.tokenize._get_punkt_tokenizer.cache_clear()
    nltk.data.clear_cache()
    kwargs = {"relation": "less than", "num_sentences": 3}
    verdicts = checkers.ifeval_verdicts(["length_constraints:number_sentences"], [kwargs], "Write.", "One. Two.")
    assert [(v["strict"], v["loose"]) for v in verdicts] == [(True, True)]


def draws_random_argument(instruction_id, kwargs):
    """Whether the checker's configuration depends on its RNG (kwargs missing or invalid)."""
    from cascade.stages.domains import instruction_checkers as checkers

    configs = []
    for seed in range(4):
        checkers._checker_rng.seed(seed)
        checker = checkers.checker_classes("ifeval")[instruction_id](instruction_id)
        checker.build_description(**kwargs)
        configs.append(checker.get_instruction_args())
    return any(c != configs[0] for c in configs)


def test_ifeval_prompt_and_instruction_level_agree_with_if_verifiable_on_every_prompt():
    from if_verifiable import IFEvalSample, evaluate_output_for_sample

    items, instruct = items_of("ifeval"), get_domain("instruct")
    assert len(items) == 541
    random_items = {
        it.id
        for it in items
        if any(draws_random_argument(i, k) for i, k in zip(it.meta["instruction_id_list"], it.meta["kwargs"]))
    }
    # letter_frequency asked to count "#" (1122) or "!" (1129): Google's checker counts a random letter instead
    assert random_items == {"ifeval-1122", "ifeval-1129"}
    items = [it for it in items if it.id not in random_items]  # if-verifiable's verdict there is a coin flip
    response = (
        "My answer is yes. THIS IS A TEST, with a comma.\n\n*highlighted* section here [name].\n"
        "P.S. Is there anything else I can help with?"
    )
    details = [instruct.grade_details(it, response) for it in items]
    for it, d in zip(items, details):
        sample = IFEvalSample(0, it.prompt, it.meta["instruction_id_list"], it.meta["kwargs"])
        ref, scores = evaluate_output_for_sample("ifeval", sample, response)
        assert [(v["strict"], v["loose"]) for v in d["instructions"]] == [(r.strict_pass, r.loose_pass) for r in ref]
        assert (d["prompt_strict"], d["prompt_loose"]) == (scores.binary_strict == 1.0, scores.binary_loose == 1.0)
        assert instruct.grade(it, response) == d["score"] == scores.binary_strict
    summary = instruct.summarize_details(details)
    assert 0 < summary["prompt_strict"] <= summary["prompt_loose"] < 1
    assert summary["prompt_strict"] <= summary["instruction_strict"] <= summary["instruction_loose"]


def test_ifeval_random_argument_is_reproducible_and_leaves_global_random_alone():
    import random

    item = next(it for it in items_of("ifeval") if it.id == "ifeval-1129")
    instruct = get_domain("instruct")
    response = "Sunnis Ice Cream!!!!!! " + "a" * 40 + " " + "abcdefghijklmnopqrstuvwxyz" * 3
    verdicts = []
    for seed in (1, 2, 3):
        random.seed(seed)
        before = random.getstate()
        verdicts.append(instruct.grade_details(item, response)["instructions"])
        assert random.getstate() == before
    assert verdicts[0] == verdicts[1] == verdicts[2]


def test_ifeval_empty_response_fails_every_instruction():
    item = items_of("ifeval", limit=1)[0]
    details = get_domain("instruct").grade_details(item, "   ")
    assert len(details["instructions"]) == len(item.meta["instruction_id_list"]) == 3
    assert get_domain("instruct").summarize_details([details])["instruction_loose"] == 0.0


class FakeEngine:
    """Returns scripted completions: `answers[prompt_index][sample]`, in the order prompts arrive."""

    batch_size = 4

    def __init__(self, texts_for):
        self.texts_for = texts_for
        self.calls = 0

    def generate(self, prompts, n, sampling, seeds=None, progress=None):
        self.calls += 1
        groups = []
        for p in prompts:
            groups.append([Completion([], [], text, "stop") for text in self.texts_for(p, n)])
            if progress is not None:
                progress(len(groups), len(prompts))
        return groups


def test_evaluate_benchmark_reports_pass_at_k_rows_and_progress():
    tok = load_tokenizer()
    items = items_of("gsm8k", limit=6)
    by_prompt = {tuple(prompt_ids(tok, it.prompt)): it for it in items}

    def texts_for(prompt, n):  # item i gets i correct samples out of n (capped)
        item = by_prompt[tuple(prompt)]
        right = min(int(item.id.split("-")[1]), n)
        return [f"\\boxed{{{item.meta['answer']}}}"] * right + ["\\boxed{-1}"] * (n - right)

    seen = []
    result = evaluate_benchmark(
        FakeEngine(texts_for), tok, "gsm8k", limit=6, samples=4, progress=lambda done, total: seen.append((done, total))
    )
    expected_c = [0, 1, 2, 3, 4, 4]
    assert result.metrics["items"] == 6 and len(result.rows) == 24
    assert result.metrics["pass@1"] == pytest.approx(sum(c / 4 for c in expected_c) / 6)
    assert result.metrics["pass@4"] == pytest.approx(5 / 6)
    assert seen == [(i, 6) for i in range(1, 7)]  # the engine's progress, one prompt at a time
    row = result.rows[0]
    assert set(row) >= {"prompt", "completion", "verdict", "score", "id", "sample"}
    assert [r["verdict"] for r in result.rows if r["id"] == "gsm8k-2"] == ["pass", "pass", "fail", "fail"]


def test_grade_rows_reports_bad_rows_and_grades_the_rest(tmp_path):
    rows = [
        {"question": "q1", "answer": "w\n#### 7", "completion": "\\boxed{7}"},
        {"question": "q2", "answer": "w\n#### 7"},  # no completion
        {"prompt": "item format", "meta": {"answer": "3"}, "completion": "\\boxed{3}"},
        {"question": "q4", "completion": "\\boxed{1}"},  # no answer
        {"question": "q5", "answer": "w\n#### 8", "completion": "\\boxed{9}"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    result = grade_rows("gsm8k", path)
    assert [(e["row"], e["error"]) for e in result.errors] == [
        (2, "missing 'completion' (a string)"),
        (4, "missing field 'answer'"),
        (6, "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ]
    assert [(r["row"], r["verdict"]) for r in result.rows] == [(1, "pass"), (3, "pass"), (5, "fail")]
    assert result.metrics["pass@1"] == pytest.approx(2 / 3) and result.metrics["errors"] == 3


def test_a_domain_name_grades_item_format_rows(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "Pick (B).", "meta": {"answer": "B"}, "completion": "The answer is (B)."},
        {"prompt": "Pick (A).", "meta": {"answer": "A"}, "completion": "The answer is (C)."},
        {"prompt": "Pick (A).", "meta": "A", "completion": "A"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = grade_rows("mcqa", path)
    assert [r["verdict"] for r in result.rows] == ["pass", "fail"]
    assert result.errors == [{"row": 3, "error": "item rows need 'prompt' (a string) and 'meta' (an object)"}]
    with pytest.raises(BenchmarkError, match="is a domain, not a benchmark"):
        load_items(resolve_benchmarks(["mcqa"], path)[0])
