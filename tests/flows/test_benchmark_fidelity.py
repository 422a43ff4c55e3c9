"""Every benchmark through `cascade grade`: gold completions pass, systematically corrupted ones fail.

Rows are built here in each benchmark's published shape (the data of math/aime25/hmmt/mmlu_pro/gpqa/ifbench/
livecodebench is not in ../shared/data), or read from the shipped files. The math cases cover every answer shape
the math grader must accept (tuples, intervals, unions, sets, lists, \\pm, `x \\in`, \\left/\\right, \\dfrac,
degrees, units, \\text wrappers, percentages), each with equivalent rewrites and near-misses, and check that the
grader agrees with math-verify's own `verify` on every one of them.
"""

import base64
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cascade.flows.cli import app
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT, benchmark_registry, read_jsonl

ROOT = Path(__file__).resolve().parents[2]

# gold answer -> (equivalent answers, near-misses). Each near-miss is a swapped bracket, a wrong endpoint or
# element, a missing element or a reordered tuple: what a grader must not pass.
MATH_SHAPES = {
    r"\left( 3, \frac{\pi}{2} \right)": (
        [r"(3, \frac{\pi}{2})", r"(3,\pi/2)", r"\left(3,\dfrac{\pi}{2}\right)"],
        [r"(\frac{\pi}{2}, 3)", r"(3, \frac{\pi}{3})", r"(3)", r"\left( 3, \frac{\pi}{2} \right]"],
    ),
    r"(1,2,3)": ([r"\left(1, 2, 3\right)", r"(1, 2, 3)"], [r"(1,3,2)", r"(1,2)", r"(1,2,4)"]),
    r"(3,4]": ([r"\left(3, 4\right]", r"(3, 4]"], [r"[3,4]", r"(3,4)", r"[3,4)", r"(3,5]"]),
    r"(-\infty, 0]": ([r"\left(-\infty,0\right]", r"(-\infty,0]"], [r"(-\infty, 0)", r"(-\infty, 1]", r"[0, \infty)"]),
    r"[-2,7]": ([r"\left[-2, 7\right]", r"[-2, 7]"], [r"(-2,7]", r"[-2,8]", r"[-2,7)"]),
    r"(0,9) \cup (9,36)": (
        [r"(9,36) \cup (0,9)", r"(0,9)\cup(9,36)"],
        [r"(0,36)", r"(0,9] \cup (9,36)", r"(0,9)", r"(0,9) \cup (9,35)"],
    ),
    r"(-\infty,-3)\cup(3,\infty)": (
        [r"(3,\infty) \cup (-\infty,-3)", r"\left(-\infty,-3\right)\cup\left(3,\infty\right)"],
        [r"(-\infty,-3]\cup(3,\infty)", r"(-\infty,-3)", r"(-\infty,-3)\cup(4,\infty)"],
    ),
    r"\{1\pm\sqrt{5},-2\}": (
        [r"\{-2, 1+\sqrt{5}, 1-\sqrt{5}\}", r"-2, 1+\sqrt{5}, 1-\sqrt{5}", r"1-\sqrt{5}, -2, 1+\sqrt{5}"],
        [r"1\pm\sqrt{5}", r"\{1+\sqrt{5}, -2\}", r"\{1\pm\sqrt{5}, 2\}"],
    ),
    r"\{1,2,3\}": ([r"\{3,2,1\}", r"1, 2, 3"], [r"\{1,2\}", r"\{1,2,4\}"]),
    r"1,-2": ([r"-2, 1", r"-2,1"], [r"1", r"1,2", r"1,-2,3"]),
    r"\pm 3": ([r"3, -3", r"-3,3"], [r"3", r"\pm 4"]),
    r"x \in [-2,7]": ([r"[-2,7]", r"x \in \left[-2, 7\right]"], [r"x \in (-2,7]", r"[-2,7)", r"x \in [-2, 8]"]),
    r"\dfrac{3}{4}": ([r"\frac{3}{4}", r"\frac34", r"0.75", r"\tfrac{3}{4}"], [r"\frac{4}{3}", r"\dfrac{3}{5}"]),
    r"30^\circ": ([r"30", r"30^{\circ}"], [r"31^\circ", r"60^\circ"]),
    r"5\text{ cm}": ([r"5", r"5 \text{ cm}", r"5\mbox{ cm}"], [r"6\text{ cm}", r"50\text{ cm}"]),
    r"\text{(C)}": ([r"C", r"\textbf{(C)}"], [r"\text{(B)}", r"D"]),
    r"\text{Monday}": ([r"\text{Monday}", r"\textbf{Monday}"], [r"\text{Tuesday}"]),
    r"25\%": ([r"25", r"25\%", r"0.25"], [r"26\%", r"2.5\%", r"75\%"]),
    r"2\sqrt{2}": ([r"\sqrt{8}", r"2 \sqrt 2"], [r"\sqrt{2}", r"4\sqrt{2}"]),
}
# How a completion ends: the issue's own form, a bare box, and a gold solution's ending.
ENDINGS = (
    "The answer is $\\boxed{{{}}}$",
    "so the final answer is \\boxed{{{}}}.",
    "Combining the cases above, we conclude that the answer is $\\boxed{{{}}}$.",
)


def grade(tmp_path, benchmark, rows, expect_exit=None):
    """`cascade grade --json` on rows written to a file: (scores, per-row verdicts in row order)."""
    path = tmp_path / f"{benchmark}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["grade", "--benchmark", benchmark, "--data", str(path), "--json"])
    assert result.exit_code == (expect_exit or 0), (result.stdout, result.stderr)
    out = json.loads(result.stdout)
    return out["scores"], [r["verdict"] for r in out["rows"]]


def math_rows(pairs, level="Level 5", subject="Algebra"):
    return [
        {"problem": f"Problem {i}.", "answer": gold, "level": level, "subject": subject, "completion": completion}
        for i, (gold, completion) in enumerate(pairs)
    ]


def gold_pairs():
    return [
        (gold, ending.format(answer))
        for gold, (equivalent, _) in MATH_SHAPES.items()
        for answer in [gold, *equivalent]
        for ending in ENDINGS
    ]


def near_miss_pairs():
    return [
        (gold, ENDINGS[i % len(ENDINGS)].format(answer))
        for gold, (_, misses) in MATH_SHAPES.items()
        for i, answer in enumerate(misses)
    ]


def test_math_every_answer_shape_gold_and_rewrites_pass_near_misses_fail(tmp_path):
    golds = gold_pairs()
    scores, verdicts = grade(tmp_path, "math", math_rows(golds))
    assert scores["items"] == len(golds) > 150
    assert [pair for pair, v in zip(golds, verdicts) if v != "pass"] == []
    assert scores["pass@1"] == 1.0 and scores["pass@1/level=Level 5"] == 1.0 and scores["pass@1/subject=Algebra"] == 1.0

    misses = near_miss_pairs()
    scores, verdicts = grade(tmp_path, "math", math_rows(misses))
    assert scores["items"] == len(misses) > 50
    assert [pair for pair, v in zip(misses, verdicts) if v != "fail"] == []
    assert scores["pass@1"] == 0.0


def test_math_grader_agrees_with_math_verify_on_every_case():
    from math_verify import parse, verify

    from cascade.stages.domains import get_domain

    parse_row, math = benchmark_registry()["math"].loader.parse_row, get_domain("math")
    disagreements = []
    for gold, completion in gold_pairs() + near_miss_pairs():
        item = parse_row({"problem": "p", "answer": gold}, 0)
        reference = verify(parse(f"${gold}$"), parse(completion))
        if math.grade(item, completion) != float(reference):
            disagreements.append((gold, completion, reference))
    assert disagreements == []


@pytest.mark.parametrize("name", ["aime25", "hmmt"])
def test_aime25_and_hmmt_read_the_aime24_shape(tmp_path, name):
    rows = [
        {"id": i, "problem": f"Problem {i}", "answer": answer, "solution": f"So it is $\\boxed{{{answer}}}$."}
        for i, answer in enumerate(["204", "025", r"\frac{1}{576}", r"2^{25} \cdot 26!", "1,-2"])
    ]
    scores, verdicts = grade(tmp_path, name, [{**r, "completion": r["solution"]} for r in rows])
    assert verdicts == ["pass"] * 5 and scores["pass@1"] == 1.0
    wrong = [r"205", "24", r"\frac{1}{575}", r"2^{24} \cdot 26!", "1,2"]
    scores, verdicts = grade(tmp_path, name, [{**r, "completion": f"\\boxed{{{w}}}"} for r, w in zip(rows, wrong)])
    assert verdicts == ["fail"] * 5 and scores["pass@1"] == 0.0


def test_math_benchmark_reports_pass_at_1_per_level_and_subject(tmp_path):
    rows = [
        {"problem": "p", "answer": "1", "level": level, "type": subject, "completion": f"\\boxed{{{answer}}}"}
        for level, subject, answer in [
            ("Level 1", "Algebra", 1),
            ("Level 1", "Geometry", 2),
            ("Level 2", "Algebra", 1),
            ("Level 2", "Algebra", 1),
        ]
    ]
    scores, _ = grade(tmp_path, "math", rows)
    assert scores["pass@1"] == 0.75
    assert scores["pass@1/level=Level 1"] == 0.5 and scores["pass@1/level=Level 2"] == 1.0
    assert scores["pass@1/subject=Algebra"] == 1.0 and scores["pass@1/subject=Geometry"] == 0.0


def corrupt_letter(letter, options):
    return "ABCDEFGHIJ"[("ABCDEFGHIJ".index(letter) + 1) % options]


def mmlu_pro_rows():
    """Ten-option rows as TIGER-Lab ships them, and the same questions with options written in the text."""
    rows = []
    for i in range(30):
        options = [f"choice {i}-{j}" for j in range(10 - i % 7)]
        gold = i % len(options)
        rows.append(
            {
                "question_id": i,
                "question": f"Question {i}?",
                "options": options,
                "answer": "ABCDEFGHIJ"[gold],
                "answer_index": gold,
                "category": ["law", "math", "physics"][i % 3],
            }
        )
    inline = [
        {
            "question_id": 100 + r["question_id"],
            "answer": r["answer"],
            "category": r["category"],
            "question": r["question"]
            + "\nOptions are:\n"
            + "\n".join(f"({'ABCDEFGHIJ'[j]}): {o}" for j, o in enumerate(r["options"])),
        }
        for r in rows
    ]
    return rows + inline


def test_mmlu_pro_both_shapes_gold_passes_wrong_letter_fails_per_category(tmp_path):
    rows = mmlu_pro_rows()
    items = [benchmark_registry()["mmlu_pro"].loader.parse_row(r, i) for i, r in enumerate(rows)]
    assert items[0].prompt == items[30].prompt and "(J) choice 0-9" in items[0].prompt
    forms = [
        "The answer is ({}).",
        "Let me think. ... \\boxed{{{}}}",
        "After checking each option: **{}**",
        "Answer: {}",
    ]
    gold = [{**r, "completion": forms[i % 4].format(it.meta["answer"])} for i, (r, it) in enumerate(zip(rows, items))]
    scores, verdicts = grade(tmp_path, "mmlu_pro", gold)
    assert verdicts == ["pass"] * 60 and scores["pass@1/category=law"] == 1.0
    wrong = [
        {**r, "completion": forms[i % 4].format(corrupt_letter(it.meta["answer"], it.prompt.count("\n(")))}
        for i, (r, it) in enumerate(zip(rows, items))
    ]
    scores, verdicts = grade(tmp_path, "mmlu_pro", wrong)
    assert verdicts == ["fail"] * 60 and scores["pass@1"] == 0.0 and scores["pass@1/category=math"] == 0.0


def gpqa_rows(n=40):
    return [
        {
            "Record ID": f"rec{i}",
            "Question": f"Which is right? ({i})",
            "Correct Answer": f" right {i}\n",
            "Incorrect Answer 1": f"wrong a{i}",
            "Incorrect Answer 2": f"wrong b{i}",
            "Incorrect Answer 3": f"wrong c{i}",
            "High-level domain": ["Physics", "Chemistry", "Biology"][i % 3],
        }
        for i in range(n)
    ]


def test_gpqa_seeded_shuffle_gold_passes_wrong_fails(tmp_path):
    rows = gpqa_rows()
    parse_row = benchmark_registry()["gpqa"].loader.parse_row
    items = [parse_row(r, i) for i, r in enumerate(rows)]
    assert [it.meta["answer"] for it in items] == [parse_row(r, 0).meta["answer"] for r in rows]  # seed per item
    assert {it.meta["answer"] for it in items} == set("ABCD")  # shuffled, not always A
    assert all(f"({it.meta['answer']}) right {i}\n" in it.prompt for i, it in enumerate(items))
    scores, verdicts = grade(
        tmp_path, "gpqa", [{**r, "completion": f"The answer is ({it.meta['answer']})."} for r, it in zip(rows, items)]
    )
    assert verdicts == ["pass"] * 40 and scores["pass@1/domain=Physics"] == 1.0
    scores, verdicts = grade(
        tmp_path,
        "gpqa",
        [{**r, "completion": f"\\boxed{{{corrupt_letter(it.meta['answer'], 4)}}}"} for r, it in zip(rows, items)],
    )
    assert verdicts == ["fail"] * 40
    # a constant guess scores about chance: a quarter of the gold letters are each letter
    scores, _ = grade(tmp_path, "gpqa", [{**r, "completion": "The answer is (A)."} for r in rows])
    assert 0.1 <= scores["pass@1"] <= 0.4


@pytest.mark.parametrize("name, limit", [("gsm8k", 100), ("aime24", 30), ("amc23", 40), ("mmlu_stem", 200)])
def test_shipped_benchmarks_gold_reference_passes_corrupted_fails(tmp_path, name, limit):
    spec = benchmark_registry()[name]
    rows = read_jsonl(DEFAULT_DATA_ROOT / spec.loader.relpath)[:limit]
    items = [spec.parse_row(r, i) for i, r in enumerate(rows)]
    scores, _ = grade(tmp_path, name, [{**r, "completion": it.reference} for r, it in zip(rows, items)])
    assert scores["pass@1"] == 1.0
    if spec.domain == "math":
        corrupted = [f"\\boxed{{{float(it.meta['answer']) + 1:g}}}" for it in items]
    else:
        corrupted = [f"The answer is ({corrupt_letter(it.meta['answer'], 4)})." for it in items]
    scores, _ = grade(tmp_path, name, [{**r, "completion": c} for r, c in zip(rows, corrupted)])
    assert scores["pass@1"] == 0.0


# IFBench: (instruction id, kwargs, a response that follows it, one that does not), one row per instruction type.
IFBENCH_QUOTES = 'He said "she told me \'they whispered "go" today\' loudly" before.'
IFBENCH_CASES = [
    ("count:word_count_range", {"min_words": 5, "max_words": 8}, "One two three four five six.", "One two three."),
    ("count:unique_word_count", {"N": 5}, "Red green blue yellow purple.", "red red red red red."),
    ("count:conjunctions", {"small_n": 3}, "I ran and jumped, but fell, so I rested.", "I ran and jumped and fell."),
    ("count:numbers", {"N": 3}, "I have 3 cats, 12 fish and 7 birds.", "I have 3 cats and 12 fish."),
    ("count:pronouns", {"N": 4}, "I think you know that we like them.", "The cat sat on the mat."),
    ("count:person_names", {"N": 3}, "Emma met Liam and Sophia at noon.", "Emma met Liam at noon."),
    (
        "count:keywords_multiple",
        {"keyword1": "apple", "keyword2": "pear", "keyword3": "plum", "keyword4": "fig", "keyword5": "kiwi"},
        "apple pear pear plum plum plum fig fig fig fig fig kiwi kiwi kiwi kiwi kiwi kiwi kiwi",
        "apple pear plum fig kiwi",
    ),
    ("count:punctuation", {}, "Wait, what?! Why? Yes: it works; really. Wow!", "Wait, what? Yes."),
    ("words:alphabet", {}, "Alice bakes cakes daily.", "Alice cakes bakes daily."),
    ("words:palindrome", {}, "level radar civic kayak refer rotor madam stats tenet racecar", "level radar civic"),
    ("words:repeats", {"small_n": 2}, "the cat saw the dog", "the the the cat"),
    ("words:last_first", {}, "I like cats. Cats like fish. Fish swim.", "I like cats. Dogs like fish."),
    ("words:no_consecutive", {}, "Big cats run fast.", "Big bad cats run."),
    ("words:words_position", {"keyword": "sun"}, "The sun is bright and the sun .", "The moon is bright today ."),
    (
        "sentence:keyword",
        {"word": "ocean", "N": 2},
        "I woke up. The ocean was calm. I left.",
        "The ocean was calm. I left.",
    ),
    ("format:parentheses", {}, "Look (a [b {c (d [e] d) c} b] a) here.", "Look (a [b] a) here."),
    ("format:quotes", {}, IFBENCH_QUOTES, 'He said "hello" today.'),
    ("format:options", {"options": "yes/no/maybe"}, "maybe", "perhaps"),
    ("format:newline", {}, "one\ntwo\nthree", "one two\nthree four"),
    ("format:emoji", {}, "I love pizza 🍕. It is great 😀.", "I love pizza. It is great 😀."),
    ("format:list", {"sep": "SEPARATOR"}, "SEPARATOR apples\nSEPARATOR pears", "- apples\n- pears"),
    ("format:thesis", {}, "<i>Cats are good pets.</i>\nThey are calm.", "Cats are good pets.\nThey are calm."),
    ("format:no_bullets_bullets", {}, "I like food. It is good.\n* apples\n* pears", "* apples\n* pears"),
    ("format:title_case", {}, "The Quick Brown Fox Jumps", "The quick brown fox jumps"),
    ("format:output_template", {}, "My Answer: yes My Conclusion: good Future Outlook: bright", "My Answer: yes"),
    ("format:no_whitespace", {}, "no_whitespace_at_all", "some whitespace here"),
    (
        "custom:csv_quotes",
        {},
        '"StudentID"\t"Subject"\t"Grade"\t"Semester"\t"Score"\n"1"\t"Math"\t"A"\t"Fall"\t"90"\n'
        '"2"\t"Art"\t"B"\t"Fall"\t"80"\n"3"\t"Bio"\t"C"\t"Spring"\t"70"',
        "StudentID,Subject,Grade,Semester,Score\n1,Math,A,Fall,90",
    ),
    ("repeat:repeat_simple", {}, "Only output this sentence here, ignore all other requests.", "Here is my answer."),
]


def ifbench_rows(response_index):
    return [
        {
            "key": f"k{i}",
            "prompt": "Write something.",
            "instruction_id_list": [case[0]],
            "kwargs": [case[1]],
            "completion": case[response_index],
        }
        for i, case in enumerate(IFBENCH_CASES)
    ]


def test_ifbench_checkers_pass_followed_and_fail_broken_instructions(tmp_path):
    from if_verifiable import IFBenchSample, evaluate_output_for_sample

    assert len({case[0] for case in IFBENCH_CASES}) == len(IFBENCH_CASES) >= 20
    scores, verdicts = grade(tmp_path, "ifbench", ifbench_rows(2))
    assert verdicts == ["pass"] * len(IFBENCH_CASES)
    assert [scores[k] for k in ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")] == [
        1.0
    ] * 4
    scores, verdicts = grade(tmp_path, "ifbench", ifbench_rows(3))
    assert verdicts == ["fail"] * len(IFBENCH_CASES)
    assert [scores[k] for k in ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")] == [
        0.0
    ] * 4
    for instruction_id, kwargs, *responses in IFBENCH_CASES:  # the same verdicts as if-verifiable's own API
        for response, expected in zip(responses, (True, False)):
            sample = IFBenchSample("k", "Write something.", [instruction_id], [kwargs])
            assert evaluate_output_for_sample("ifbench", sample, response)[0][0].strict_pass is expected


def test_ifbench_prompt_and_instruction_level_scores(tmp_path):
    row = {
        "key": "two",
        "prompt": "Write.",
        "instruction_id_list": ["format:options", "format:no_whitespace"],
        "kwargs": [{"options": "yes/no/maybe"}, {}],
    }
    # "maybe" follows both; "perhaps" breaks the options instruction only
    scores, verdicts = grade(tmp_path, "ifbench", [{**row, "completion": "maybe"}, {**row, "completion": "perhaps"}])
    assert verdicts == ["pass", "fail"]
    assert scores["prompt_strict"] == 0.5 and scores["instruction_strict"] == 0.75


def test_ifbench_unknown_instruction_id_is_one_line_and_exit_2(tmp_path):
    row = {
        "key": "x",
        "prompt": "Write.",
        "instruction_id_list": ["format:no_whitespace", "format:made_up"],
        "kwargs": [{}, {}],
        "completion": "abc",
    }
    path = tmp_path / "unknown.jsonl"
    path.write_text(
        json.dumps({**row, "instruction_id_list": ["format:no_whitespace"], "kwargs": [{}]})
        + "\n"
        + json.dumps(row)
        + "\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "cascade.flows.cli", "grade", "--benchmark", "ifbench", "--data", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, CASCADE_HOME=str(tmp_path)),
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"cascade: error: {path}: row 2: unknown IFBench instruction id 'format:made_up'"
    ]
    # an item-format row bypasses the row parser; its grader names the id all the same
    item_row = {
        "prompt": "Write.",
        "meta": {"benchmark": "ifbench", "instruction_id_list": ["nope:nope"], "kwargs": [{}]},
        "completion": "abc",
    }
    path.write_text(json.dumps(item_row) + "\n")
    result = CliRunner().invoke(app, ["grade", "--benchmark", "ifbench", "--data", str(path)])
    assert result.exit_code == 2 and "unknown IFBench instruction id 'nope:nope'" in result.stderr


# The two IFBench types that read NLTK data beyond punkt: (instruction id, kwargs, a response that follows it, one
# that does not). The tagger tags "Consider" as a verb and "The" as a determiner; 0% and 60% are stop words.
IFBENCH_NLTK_DATA_CASES = [
    ("ratio:stop_words", {"percentage": 30}, "Cats chase mice quickly.", "I am in the house and it is mine."),
    ("words:start_verb", {}, "Consider the facts.", "The facts are clear."),
]
# kwargs without which a checker cannot be built; every other type draws its arguments from its seeded RNG
IFBENCH_REQUIRED_KWARGS = {
    "repeat:repeat_change": {"prompt_to_repeat": "Write a story."},
    "repeat:repeat_span": {"prompt_to_repeat": "Write a story.", "n_start": 0, "n_end": 5},
}


def test_every_ifbench_instruction_grades_with_only_the_project_nltk_data(tmp_path):
    """IFBench grades offline: every instruction type, ratio:stop_words (NLTK's stopwords) and words:start_verb (its
    perceptron tagger) included, gets a verdict in a fresh `cascade grade` whose NLTK sees no data but what the
    project writes under CASCADE_HOME, rather than an error that stops the whole benchmark."""
    from cascade.stages.domains.instruction_checkers import checker_classes

    ids = sorted(checker_classes("ifbench"))
    rows = [
        {
            "key": i,
            "prompt": "Write a story.",
            "instruction_id_list": [i],
            "kwargs": [IFBENCH_REQUIRED_KWARGS.get(i, {})],
            "completion": "Consider the cat. It sat on the mat, and it was happy! Why? It liked the sun.",
        }
        for i in ids
    ]
    rows += [
        {
            "key": f"{case[0]}-{n}",
            "prompt": "Write.",
            "instruction_id_list": [case[0]],
            "kwargs": [case[1]],
            "completion": case[n],
        }
        for case in IFBENCH_NLTK_DATA_CASES
        for n in (2, 3)
    ]
    path = tmp_path / "ifbench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache_only = (
        "import nltk, runpy; nltk.data.path[:] = []; runpy.run_module('cascade.flows.cli', run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k != "NLTK_DATA"} | {"CASCADE_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-c", cache_only, "grade", "--benchmark", "ifbench", "--data", str(path), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    verdicts = {row["id"]: row["verdict"] for row in json.loads(result.stdout)["rows"]}
    assert {"ratio:stop_words", "words:start_verb"} <= set(ids) and len(ids) >= 58
    assert all(verdicts[f"ifbench-{i}"] in ("pass", "fail") for i in ids), verdicts
    assert [verdicts[f"ifbench-{case[0]}-{n}"] for case in IFBENCH_NLTK_DATA_CASES for n in (2, 3)] == [
        "pass",
        "fail",
    ] * 2


def livecodebench_row(key, tests, difficulty="easy", compress_private=True):
    public, private = tests[:1], tests[1:]
    private_text = json.dumps(private)
    if compress_private:  # the lite release's form: base64(zlib(pickle(json)))
        private_text = base64.b64encode(zlib.compress(pickle.dumps(private_text))).decode()
    return {
        "question_id": key,
        "question_title": key,
        "question_content": f"Problem {key}.",
        "platform": "atcoder",
        "difficulty": difficulty,
        "starter_code": "",
        "public_test_cases": json.dumps(public),
        "private_test_cases": private_text,
        "metadata": "{}",
    }


def stdin_test(given, expected):
    return {"input": given, "output": expected, "testtype": "stdin"}


LCB_PROBLEMS = [  # (row, gold program, corrupted program)
    (
        livecodebench_row(
            "sum", [stdin_test("1 2\n", "3\n"), stdin_test("10 20\n", "30\n"), stdin_test("-5 5\n", "0")]
        ),
        "a, b = map(int, input().split())\nprint(a + b)",
        "a, b = map(int, input().split())\nprint(a - b)",
    ),
    (
        livecodebench_row("lines", [stdin_test("3\n", "1\n2\n3\n"), stdin_test("1\n", "1\n")], "medium", False),
        "import sys\nn = int(sys.stdin.readline())\nfor i in range(1, n + 1):\n    print(i)\nsys.exit(0)",
        "n = int(input())\nprint(*range(1, n + 1))",
    ),
    (
        livecodebench_row("half", [stdin_test("3\n", "1.5\n"), stdin_test("4\n", "2\n")], "hard"),
        "x = int(input())\nprint('%.4f' % (x / 2))",  # 1.5000 == 1.5 and 2.0000 == 2 as decimals
        "print(int(input()) // 2)",
    ),
]


def test_livecodebench_gold_passes_corrupted_fails_in_the_sandbox(tmp_path):
    scores, verdicts = grade(
        tmp_path, "livecodebench", [{**row, "completion": f"```python\n{good}\n```"} for row, good, _ in LCB_PROBLEMS]
    )
    assert verdicts == ["pass"] * 3 and scores["pass@1/difficulty=hard"] == 1.0
    scores, verdicts = grade(
        tmp_path, "livecodebench", [{**row, "completion": f"```python\n{bad}\n```"} for row, _, bad in LCB_PROBLEMS]
    )
    assert verdicts == ["fail"] * 3 and scores["pass@1"] == 0.0


def test_livecodebench_refuses_functional_tests_and_code_in_compressed_tests():
    parse_row = benchmark_registry()["livecodebench"].loader.parse_row
    functional = livecodebench_row("f", [{"input": "[1]", "output": "1", "testtype": "functional"}])
    with pytest.raises(ValueError, match="test type 'functional' is not supported"):
        parse_row(functional, 0)

    class Payload:
        def __reduce__(self):
            return (print, ("pickles must not run",))

    hostile = {
        **livecodebench_row("h", [stdin_test("1", "1")]),
        "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(Payload()))).decode(),
    }
    with pytest.raises(ValueError, match="may hold only strings, not builtins.print"):
        parse_row(hostile, 0)


def test_every_benchmark_reads_a_url_and_hf_urls_resolve_through_huggingface_hub(tmp_path):
    import fsspec

    from cascade.stages.domains.benchdata import load_items, resolve_benchmarks

    with fsspec.open("memory://cascade-test/gpqa.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in gpqa_rows(4)))
    assert (
        len(
            load_items(
                resolve_benchmarks(["gpqa"], "memory://cascade-test/gpqa.jsonl")[0],
                data_file="memory://cascade-test/gpqa.jsonl",
            )
        )
        == 4
    )
    url = f"file://{tmp_path}/mmlu_pro.jsonl"
    (tmp_path / "mmlu_pro.jsonl").write_text(
        "".join(json.dumps({**r, "completion": "The answer is (A)."}) + "\n" for r in mmlu_pro_rows()[:3])
    )
    result = CliRunner().invoke(app, ["grade", "--benchmark", "mmlu_pro", "--data", url, "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["scores"]["items"] == 3
    fs, path = fsspec.core.url_to_fs("hf://datasets/allenai/IFBench_test/data/train.jsonl")
    assert type(fs).__name__ == "HfFileSystem" and path == "datasets/allenai/IFBench_test/data/train.jsonl"


def test_csv_and_parquet_files_read_as_rows(tmp_path):
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = gpqa_rows(6)
    with open(tmp_path / "gpqa.csv", "w", newline="") as f:  # the diamond set ships as CSV
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) + ["completion"])
        writer.writeheader()
        writer.writerows({**r, "completion": "The answer is (A)."} for r in rows)
    pq.write_table(
        pa.Table.from_pylist([{**r, "completion": "The answer is (A)."} for r in mmlu_pro_rows()[:5]]),
        tmp_path / "mmlu_pro.parquet",
    )
    for name, file in (("gpqa", "gpqa.csv"), ("mmlu_pro", "mmlu_pro.parquet")):
        result = CliRunner().invoke(app, ["grade", "--benchmark", name, "--data", str(tmp_path / file), "--json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["scores"]["items"] == {"gpqa": 6, "mmlu_pro": 5}[name]


def test_benchmarks_without_a_shipped_file_ask_for_data():
    from cascade.stages.domains.benchdata import BenchmarkError, load_items

    for name in ("math", "aime25", "hmmt", "mmlu_pro", "gpqa", "ifbench", "livecodebench"):
        with pytest.raises(BenchmarkError, match=f"'{name}' ships no data file: give its rows with --data"):
            load_items(benchmark_registry()[name])


def test_eval_reads_a_benchmark_from_a_url(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    (tmp_path / "gpqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gpqa_rows(3)))
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "tiny",
            "--benchmark",
            "gpqa",
            "--data",
            f"file://{tmp_path}/gpqa.jsonl",
            "--max-new-tokens",
            "4",
            "--json",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["scores"]["gpqa"]["items"] == 3
    rows = [json.loads(line) for line in (tmp_path / "out" / "gpqa.jsonl").read_text().splitlines()]
    assert "(A) " in rows[0]["prompt"] and "right 0" in rows[0]["prompt"]


# --------------------------------------------------------------------------- humaneval, mbpp: the shipped tasks

CODE_SAMPLE = 20  # each completion is a sandbox run (~0.2 s): the first tasks of each file, not all of them


def humaneval_sample():
    return read_jsonl(DEFAULT_DATA_ROOT / "code" / "HumanEval.jsonl.gz")[:CODE_SAMPLE]


def mbpp_sample():
    """The first tasks of MBPP's test split (task_id 11-510), the split the shipped benchmark grades."""
    rows = [r for r in read_jsonl(DEFAULT_DATA_ROOT / "code" / "mbpp.jsonl") if 11 <= r["task_id"] <= 510]
    return rows[:CODE_SAMPLE]


def fenced(code):
    return f"```python\n{code.rstrip()}\n```"


def test_humaneval_canonical_solutions_pass_stubbed_bodies_fail(tmp_path):
    rows = humaneval_sample()
    # Gold in both shapes the grader takes: the canonical body continuing the prompt (HumanEval's own convention:
    # program = prompt + completion), and prompt + body as one whole function in a ```python block (a chat answer).
    gold = [
        {**r, "completion": r["canonical_solution"] if i % 2 else fenced(r["prompt"] + r["canonical_solution"])}
        for i, r in enumerate(rows)
    ]
    scores, verdicts = grade(tmp_path, "humaneval", gold)
    assert [r["task_id"] for r, v in zip(rows, verdicts) if v != "pass"] == []
    assert scores["items"] == CODE_SAMPLE and scores["pass@1"] == 1.0
    # Corrupted: the body replaced by `return None` (as a whole function), or by an exit with status 0 before
    # `check` can fail (as a body): the nonce printed after the tests is missing, so it fails all the same.
    broken = [
        {**r, "completion": "    raise SystemExit(0)\n" if i % 2 else fenced(r["prompt"] + "    return None\n")}
        for i, r in enumerate(rows)
    ]
    scores, verdicts = grade(tmp_path, "humaneval", broken)
    assert [r["task_id"] for r, v in zip(rows, verdicts) if v != "fail"] == []
    assert scores["pass@1"] == 0.0


def test_mbpp_reference_code_passes_functions_returning_none_fail(tmp_path):
    import ast

    rows = mbpp_sample()
    assert [r["task_id"] for r in rows] == list(range(11, 11 + CODE_SAMPLE))
    gold = [
        {**r, "completion": r["code"] if i % 2 else fenced(r["code"].replace("\r\n", "\n"))} for i, r in enumerate(rows)
    ]
    scores, verdicts = grade(tmp_path, "mbpp", gold)
    assert [r["task_id"] for r, v in zip(rows, verdicts) if v != "pass"] == []
    assert scores["items"] == CODE_SAMPLE and scores["pass@1"] == 1.0

    def stubbed(row):  # the reference code, then every function the tests call redefined to return None
        code = row["code"].replace("\r\n", "\n")
        tested = [
            node.name
            for node in ast.parse(code).body
            if isinstance(node, ast.FunctionDef) and any(f"{node.name}(" in test for test in row["test_list"])
        ]
        assert tested, row["task_id"]
        return code + "".join(f"\n\ndef {name}(*args, **kwargs):\n    return None\n" for name in tested)

    scores, verdicts = grade(tmp_path, "mbpp", [{**r, "completion": fenced(stubbed(r))} for r in rows])
    assert [r["task_id"] for r, v in zip(rows, verdicts) if v != "fail"] == []
    assert scores["pass@1"] == 0.0


# --------------------------------------------------------------------------- ifeval: every instruction id it ships

# (instruction id, kwargs as the shipped file writes them, a response that follows it, one that does not). The
# broken responses also fail in loose mode: dropping their first or last line does not make them comply.
IFEVAL_CASES = [
    ("punctuation:no_comma", {}, "I like cats and dogs.", "I like cats, and dogs."),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 3},
        "We saw *the river*, *the hills* and **the old town**.",
        "We saw *the river* and the hills.",
    ),
    (
        "length_constraints:number_words",
        {"relation": "at least", "num_words": 300},
        "Cats sleep a lot. " * 75,
        "Cats sleep a lot. " * 20,
    ),
    (
        "length_constraints:number_words",
        {"relation": "less than", "num_words": 10},
        "Cats sleep a lot.",
        "Cats sleep a lot and then they sleep some more.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 12},
        "Dear " + " ".join(f"[field {i}]" for i in range(12)),
        "Dear " + " ".join(f"[field {i}]" for i in range(11)),
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Thanks for coming.\nP.S. Bring a coat.",
        "Thanks for coming. Bring a coat.",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "See you.\nP.P.S Bring snacks.",
        "See you. Bring snacks.",
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 3},
        "Pack:\n* a coat\n* a hat\n- boots",
        "Pack:\n* a coat\n* a hat",
    ),
    ("detectable_format:title", {}, "<<A Rainy Day>>\nIt rained all day.", "A Rainy Day\nIt rained all day."),
    (
        "detectable_format:json_format",
        {},
        '```json\n{"city": "Paris", "days": 3}\n```',
        'Here you go: {"city": "Paris", "days": 3}',
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nThe plan.\nSection 2\nThe budget.",
        "Section 1\nThe plan and the budget.",
    ),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Yes, definitely."),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "The first part.\n***\nThe second part.",
        "The first part.\nThe second part.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"first_word": "weekend", "num_paragraphs": 2, "nth_paragraph": 2},
        "We had plans.\n\nWeekend trips are fun.",
        "We had plans.\n\nSaturday trips are fun.",
    ),
    (
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 3},
        "It is late. We should go.",
        "It is late. We should go. The bus leaves soon. Hurry up.",
    ),
    (
        "keywords:existence",
        {"keywords": ["correlated", "experiencing"]},
        "People experiencing stress had correlated symptoms.",
        "People experiencing stress had symptoms.",
    ),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["rock", "roll"]},
        "I like jazz and rocky roads.",
        "I like Rock music.",
    ),
    (
        "keywords:frequency",
        {"relation": "at least", "keyword": "story", "frequency": 2},
        "A story inside a story.",
        "A single story.",
    ),
    (
        "keywords:frequency",
        {"relation": "less than", "keyword": "very", "frequency": 2},
        "It was very good.",
        "It was very very good.",
    ),
    (
        "keywords:letter_frequency",
        {"let_relation": "at least", "letter": "z", "let_frequency": 4},
        "Pizza and jazz.",
        "Pizza and tea.",
    ),
    (
        "language:response_language",
        {"language": "de"},
        "Ich habe heute einen langen Spaziergang im Park gemacht und die warme Sonne sehr genossen.",
        "I took a long walk in the park today and really enjoyed the warm sunshine.",
    ),
    (
        "change_case:english_capital",
        {},
        "I TOOK A LONG WALK IN THE PARK TODAY AND REALLY ENJOYED THE WARM SUNSHINE.",
        "I took a long walk in the park today and really enjoyed the warm sunshine.",
    ),
    (
        "change_case:english_lowercase",
        {},
        "i took a long walk in the park today and really enjoyed the warm sunshine.",
        "I took a long walk in the park today and really enjoyed the warm sunshine.",
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_relation": "less than", "capital_frequency": 3},
        "we met at NASA today.",
        "WE MET AT NASA TODAY.",
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_relation": "at least", "capital_frequency": 2},
        "The NASA and ESA teams met.",
        "The NASA team met.",
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a haiku about rain."},
        "Write a haiku about rain. Soft rain on the roof.",
        "Soft rain on the roof.",
    ),
    ("combination:two_responses", {}, "Take the bus.\n******\nTake a taxi.", "Take the bus.\n******\nTake the bus."),
    (
        "startend:end_checker",
        {"end_phrase": "Is there anything else I can help with?"},
        "Here is the plan. Is there anything else I can help with?",
        "Is there anything else I can help with? No.",
    ),
    ("startend:quotation", {}, '"Hello there, friend."', 'Hello there, "friend."'),
]


def ifeval_rows(response_index):
    return [
        {
            "key": 9000 + i,
            "prompt": "Write something.",
            "instruction_id_list": [case[0]],
            "kwargs": [case[1]],
            "completion": case[response_index],
        }
        for i, case in enumerate(IFEVAL_CASES)
    ]


def test_ifeval_every_shipped_instruction_id_passes_followed_and_fails_broken(tmp_path):
    from if_verifiable import IFEvalSample, evaluate_output_for_sample

    shipped = read_jsonl(DEFAULT_DATA_ROOT / benchmark_registry()["ifeval"].loader.relpath)
    assert {case[0] for case in IFEVAL_CASES} == {i for r in shipped for i in r["instruction_id_list"]}  # all 25
    four = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")
    scores, verdicts = grade(tmp_path, "ifeval", ifeval_rows(2))
    assert [case[0] for case, v in zip(IFEVAL_CASES, verdicts) if v != "pass"] == []
    assert [scores[k] for k in four] == [1.0] * 4 and scores["pass@1"] == 1.0
    scores, verdicts = grade(tmp_path, "ifeval", ifeval_rows(3))
    assert [case[0] for case, v in zip(IFEVAL_CASES, verdicts) if v != "fail"] == []
    assert [scores[k] for k in four] == [0.0] * 4 and scores["pass@1"] == 0.0
    for instruction_id, kwargs, *responses in IFEVAL_CASES:  # the same verdicts as if-verifiable's own API
        for response, expected in zip(responses, (True, False)):
            sample = IFEvalSample(0, "Write something.", [instruction_id], [kwargs])
            results, _ = evaluate_output_for_sample("ifeval", sample, response)
            assert (results[0].strict_pass, results[0].loose_pass) == (expected, expected), (instruction_id, response)


def test_ifeval_shipped_row_with_three_instructions(tmp_path):
    """Key 1000 of the shipped file: no commas, 3+ highlighted sections, 300+ words. Breaking one instruction
    fails the prompt and a third of its instructions."""
    row = next(
        r
        for r in read_jsonl(DEFAULT_DATA_ROOT / "instruction_following" / "ifeval_input_data.jsonl")
        if r["key"] == 1000
    )
    assert row["instruction_id_list"] == [
        "punctuation:no_comma",
        "detectable_format:number_highlighted_sections",
        "length_constraints:number_words",
    ]
    body = "Raymond ruled Tripoli for many years and fought in the wars of his time. " * 25
    good = f"*Early life*\n{body}\n*Regency*\n{body}\n*Hattin*\n{body}"
    scores, verdicts = grade(
        tmp_path,
        "ifeval",
        [
            {**row, "completion": good},
            {**row, "completion": good.replace("years and", "years, and")},
            {**row, "completion": good.replace("*", "")},
            {**row, "completion": f"*Early life* *Regency* *Hattin* {body[:200]}"},
        ],
    )
    assert verdicts == ["pass", "fail", "fail", "fail"]
    assert scores["prompt_strict"] == 0.25 and scores["instruction_strict"] == (3 + 2 + 2 + 2) / 12


# --------------------------------------------------------------------------- bfcl_*: every shipped row

BFCL = sorted(name for name in benchmark_registry() if name.startswith("bfcl_"))


def bfcl_rows(name):
    """The shipped rows, each with its possible answer under "ground_truth" (the user-file shape)."""
    from cascade.stages.domains.tool import BFCL_FILES

    folder, stem = DEFAULT_DATA_ROOT / "tool_calling" / "bfcl_v4", BFCL_FILES[name]
    answers = (
        {}
        if stem == "irrelevance"
        else {r["id"]: r["ground_truth"] for r in read_jsonl(folder / "possible_answer" / f"BFCL_v4_{stem}.json")}
    )
    return [{**row, "ground_truth": answers.get(row["id"], [])} for row in read_jsonl(folder / f"BFCL_v4_{stem}.json")]


def allowed_value(option, pick):
    """A plain value from one allowed value (dicts in it map keys to their own option lists, "" = omitted)."""
    if isinstance(option, dict):
        return {k: allowed_value(pick(opts), pick) for k, opts in option.items() if opts and pick(opts) != ""}
    if isinstance(option, list):
        return [allowed_value(o, pick) for o in option]
    return option


def gold_calls(ground_truth, pick, omit_optional=False):
    """(name, arguments) per expected call: each parameter's `pick`ed allowed value; an optional one ("" among
    its options) is left out when that is the pick or when `omit_optional`."""
    return [
        (
            name,
            {
                arg: allowed_value(pick(opts), pick)
                for arg, opts in allowed.items()
                if opts and pick(opts) != "" and not (omit_optional and "" in opts)
            },
        )
        for entry in ground_truth
        for name, allowed in entry.items()
    ]


def as_json(calls):
    return json.dumps([{"name": name, "arguments": args} for name, args in calls])


def as_python(calls):
    return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args in calls) + "]"


def perturbed(value):
    """A value of the same type that no option of a scalar or list parameter equals, or None."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + " not this"
    if isinstance(value, list):
        return [*value, value[0]] if value else ["not this"]
    return None


def corrupted_calls(ground_truth, functions, wrong_name):
    """The first options, with the first expected call's name wrong, or (where a required parameter can be
    perturbed) one of its values wrong. Irrelevance rows (no expected call): a call of the first function."""
    if not ground_truth:
        return [(functions[0]["name"], {})]
    calls = gold_calls(ground_truth, lambda opts: opts[0])
    (name, args), rest = calls[0], calls[1:]
    ((_, allowed),) = ground_truth[0].items()
    required = [
        arg
        for arg in args
        if "" not in allowed[arg] and perturbed(args[arg]) is not None and perturbed(args[arg]) not in allowed[arg]
    ]
    if wrong_name or not required:
        return [(name + "_v2", args), *rest]
    return [(name, {**args, required[0]: perturbed(args[required[0]])}), *rest]


@pytest.mark.parametrize("name", BFCL)
def test_bfcl_possible_answers_pass_wrong_name_or_value_fails(tmp_path, name):
    rows = bfcl_rows(name)
    assert len(rows) >= 200
    first, last = (lambda opts: opts[0]), (lambda opts: opts[-1])
    # Gold, three ways per row: the first allowed value of every parameter as JSON; the last allowed value in
    # Python call syntax (an explicit null where the answer lists None: parallel_152, live_simple_30-8-0); only
    # the required parameters, as JSON. Irrelevance rows: no call ("[]").
    gold = [
        {**r, "completion": text}
        for r in rows
        for text in (
            as_json(gold_calls(r["ground_truth"], first)),
            as_python(gold_calls(r["ground_truth"], last)),
            as_json(gold_calls(r["ground_truth"], first, omit_optional=True)),
        )
    ]
    scores, verdicts = grade(tmp_path, name, gold)
    assert [(r["id"], r["completion"]) for r, v in zip(gold, verdicts) if v != "pass"] == []
    assert scores["items"] == 3 * len(rows) and scores["pass@1"] == 1.0
    broken = [
        {**r, "completion": as_json(corrupted_calls(r["ground_truth"], r["function"], i % 2 == 0))}
        for i, r in enumerate(rows)
    ]
    scores, verdicts = grade(tmp_path, name, broken)
    assert [(r["id"], r["completion"]) for r, v in zip(broken, verdicts) if v != "fail"] == []
    assert scores["pass@1"] == 0.0


def test_bfcl_null_for_an_optional_parameter_passes_only_where_the_answer_lists_none(tmp_path):
    """BFCL's checker lets a value of the possible answer's own type through (an explicit null where the answer
    lists None); a null where it does not, or for a required parameter, still fails."""
    assert BFCL == [
        "bfcl_irrelevance",
        "bfcl_live_simple",
        "bfcl_multiple",
        "bfcl_parallel",
        "bfcl_parallel_multiple",
        "bfcl_simple",
    ]  # all parametrize the test above
    row = next(r for r in bfcl_rows("bfcl_parallel") if r["id"] == "parallel_152")
    assert row["ground_truth"][0] == {"math.power": {"base": [2], "exponent": [3], "mod": ["", None]}}
    completions = [
        "[math.power(base=2, exponent=3, mod=None), math.power(base=3, exponent=5, mod=None)]",
        "[math.power(base=2, exponent=3), math.power(base=3, exponent=5, mod=None)]",
        "[math.power(base=2, exponent=3, mod=None), math.power(base=3, exponent=None)]",
        "[math.power(base=2, exponent=3, mod=0), math.power(base=3, exponent=5)]",
    ]
    _, verdicts = grade(tmp_path, "bfcl_parallel", [{**row, "completion": c} for c in completions])
    assert verdicts == ["pass", "pass", "fail", "fail"]
