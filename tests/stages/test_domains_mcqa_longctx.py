"""MCQA and long-context domains: oracle answers pass, corrupted ones fail, held-out splits are big and disjoint."""

import random
import re

import pytest

from cascade.stages.domains import get_domain
from cascade.stages.domains.longctx import LongContextDomain
from cascade.stages.domains.mcqa import MCQADomain, extract_letter
from cascade.stages.train.model import prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer


def split_key(item):
    return item.split_key or item.prompt


@pytest.mark.parametrize("name", ["mcqa", "longctx"])
def test_oracle_passes_and_heldout_is_large_distinct_and_disjoint(name):
    domain = get_domain(name)
    train = domain.generate("train", 3000, seed=0)
    heldout = domain.generate("heldout", 300, seed=0)
    assert all(domain.grade(it, it.reference) == 1.0 for it in train + heldout)
    assert len({split_key(i) for i in heldout}) == 300
    assert not {split_key(i) for i in train} & {split_key(i) for i in heldout}
    assert domain.generate("heldout", 300, seed=0) == heldout  # deterministic
    assert {it.domain for it in train} == {name}


def test_mcqa_has_over_3000_distinct_problems():
    domain = get_domain("mcqa")
    rng = random.Random(0)
    keys = {domain.sample(rng).split_key for _ in range(60000)}
    assert len(keys) >= 3000
    assert len(get_domain("mcqa").generate("heldout", 900, seed=1)) == 900  # ~10% of 10,080 is held out


def test_mcqa_corrupted_answers_fail():
    domain = get_domain("mcqa")
    for item in domain.generate("heldout", 200, seed=3):
        gold = item.meta["answer"]
        other = "ABCD"[("ABCD".index(gold) + 1) % 4]
        assert domain.grade(item, item.reference.replace(gold, other)) == 0.0
        assert domain.grade(item, "I am not sure.") == 0.0
    for item in domain.generate("train", 50, seed=0):  # the gold letter really is the largest / smallest
        options = dict(re.findall(r"\(([A-D])\) (\d)", item.prompt))
        pick = max if "largest" in item.prompt else min
        assert options[item.meta["answer"]] == pick(options.values())


@pytest.mark.parametrize(
    "text, letter",
    [
        ("The answer is (B).", "B"),
        ("the answer is: c", None),
        ("Answer: D", "D"),
        ("(C) because", "C"),
        ("B", "B"),
        ("A frameshift mutation.", None),
        ("The answer is (A). No, the answer is (D).", "D"),
    ],
)
def test_mcqa_letter_extraction(text, letter):
    assert extract_letter(text) == letter


def test_longctx_corrupted_and_ambiguous_answers_fail():
    domain = get_domain("longctx")
    for item in domain.generate("heldout", 200, seed=5):
        key = item.meta["answer"]
        assert f"The key for {item.meta['name']} is {key}." in item.prompt
        assert domain.grade(item, f"The key for {item.meta['name']} is {key}.") == 1.0
        wrong = f"{(int(key) + 1) % 10 ** len(key):0{len(key)}d}"
        assert domain.grade(item, wrong) == 0.0
        assert domain.grade(item, f"{key} or {wrong}") == 0.0  # listing keys is not retrieval
        assert domain.grade(item, "") == 0.0


def test_longctx_default_prompt_fits_the_tiny_model_and_length_is_configurable():
    tok = load_tokenizer()
    short = get_domain("longctx").generate("train", 2000, seed=0)
    assert max(len(prompt_ids(tok, it.prompt)) for it in short) < 120
    long_domain = LongContextDomain(num_keys=20, num_filler=200)
    long_items = long_domain.generate("heldout", 20, seed=0)
    assert min(len(prompt_ids(tok, it.prompt)) for it in long_items) > 1500
    assert all(long_domain.grade(it, it.reference) == 1.0 for it in long_items)
    with pytest.raises(ValueError):
        LongContextDomain(num_keys=0)


def test_mcqa_domain_checks_its_configuration():
    assert MCQADomain(num_choices=3).sample(random.Random(0)).prompt.count("(") == 3
    with pytest.raises(ValueError):
        MCQADomain(num_choices=11)
    with pytest.raises(ValueError, match="unknown mcqa questions 'mmlu'"):
        MCQADomain(questions="mmlu")


def test_mmlu_stem_questions_split_by_their_text_and_each_is_drawn_once():
    domain = get_domain("mcqa", {"questions": "mmlu_stem"})
    dev, heldout = domain.generate("dev", 299, 0), domain.generate("heldout", 300, 0)
    train = domain.generate("train", 2400, 0)
    texts = [{it.prompt for it in split} for split in (dev, heldout, train)]
    assert [len(t) for t in texts] == [299, 300, 2400]  # no question twice within a split
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    assert [it.id for it in dev[:2]] == ["mcqa-dev-0", "mcqa-dev-1"]
    assert domain.generate("dev", 299, 1) != dev and {it.prompt for it in domain.generate("dev", 299, 1)} == texts[0]
    # graded by the letter, the reward's grader and the eval's
    item = dev[0]
    assert domain.grade(item, item.reference) == 1.0 and item.meta["subject"]
    with pytest.raises(ValueError, match="299 questions in its dev split, fewer than 300: lower domains.mcqa.dev_size"):
        domain.generate("dev", 300, 0)
