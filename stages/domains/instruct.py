"""Instruct: IFEval-style verifiable constraints (case, exact word counts, list lines, required words); IFEval, IFBench.

Synthetic constraint kinds follow the learnable set in docs/MEASUREMENTS.md. Every check is a pure function of
the response, so the grader is exact; word counting splits on whitespace, as IFEval's own `count_words` approximately
does.

IFEval and IFBench are graded with the checkers if-verifiable ships (stages/domains/instruction_checkers.py, with
how and where that deviates from Google's reference evaluation).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.benchdata import JsonlBenchmark
from cascade.stages.domains.instruction_checkers import ifeval_summary, ifeval_verdicts, parse_instruction_rows

TOPICS = {
    "cats": "cat fur paws purr nap milk soft tail whiskers play",
    "rain": "rain cloud drop wet grey storm puddle cold wind sky",
    "trees": "tree leaf root bark green branch shade wood tall seed",
    "the sea": "sea wave salt blue tide shore fish boat sand deep",
    "music": "song beat drum note sing tune loud band dance voice",
    "food": "bread soup rice hot sweet salt meal bowl taste eat",
    "winter": "snow ice cold white frost coat fire long dark quiet",
    "books": "book page word story read ink shelf tale paper line",
    "dogs": "dog bark run ball bone walk loyal wag fetch friend",
    "the sun": "sun light warm bright day gold shine morning heat sky",
    "cities": "city street car light crowd tower noise bus road shop",
    "gardens": "garden flower soil seed water grow bloom rose bee path",
    "the moon": "moon night silver glow dark star quiet round tide dream",
    "trains": "train track fast station ride steam whistle car long trip",
    "birds": "bird wing fly nest song feather egg sky tree beak",
    "mountains": "peak snow rock high climb cold trail stone view air",
    "coffee": "coffee cup hot bean dark brew morning bitter mug steam",
    "school": "school class book teacher desk learn pen bell lesson friend",
    "rivers": "river flow water bank stone fish bridge cold boat current",
    "summer": "summer sun hot beach swim long day light ice play",
    "bread": "bread oven warm crust flour butter slice bake soft loaf",
    "the wind": "wind blow cold gust air leaf howl sky kite sail",
    "horses": "horse mane ride hoof field run saddle hay gallop barn",
    "the city park": "park bench grass tree path kid swing dog pond walk",
    "the night": "night dark star moon owl quiet sleep dream cold lamp",
    "apples": "apple red tree sweet crisp pie seed core green bite",
    "ships": "ship sail sea deck mast wave port crew anchor wind",
    "snow": "snow flake white cold sled soft fall ice boot quiet",
    "tea": "tea cup leaf hot pot steam green sip warm brew",
    "the farm": "farm barn cow hen field hay corn tractor pig egg",
}
TOPIC_WORDS = {t: w.split() for t, w in TOPICS.items()}
COUNTS = range(2, 12)  # with 30 topics: 9,900 problems, ~990 each for held-out and dev


def words_of(text: str) -> list[str]:
    return [w.strip(".,!?;:").lower() for w in text.split()]


def check(kind: str, n: int, word: str, text: str) -> bool:
    return count_of(kind, text) == n and constraint_holds(kind, word, text)


def partial_credit(kind: str, n: int, word: str, text: str) -> float:
    """The mean of two parts: how near the count is to n (1 - |count - n| / n, at least 0) and whether the
    constraint itself holds. A model that writes garbage still scores apart from sample to sample, so a GRPO
    group has signal (the micro recipe's smoke test of the RL update); 1.0 exactly when `check` holds."""
    nearness = max(0.0, 1 - abs(count_of(kind, text) - n) / n)
    return (nearness + float(constraint_holds(kind, word, text))) / 2


def count_of(kind: str, text: str) -> int:
    """Words, or for bullets the non-empty lines."""
    if kind == "bullets":
        return sum(1 for ln in text.strip().splitlines() if ln.strip())
    return len(text.split())


def constraint_holds(kind: str, word: str, text: str) -> bool:
    if kind == "lowercase":
        return text == text.lower() and any(c.isalpha() for c in text)
    if kind == "capitals":
        return text == text.upper() and any(c.isalpha() for c in text)
    if kind == "end_with":
        return words_of(text)[-1:] == [word]
    if kind == "start_with":
        return words_of(text)[:1] == [word]
    if kind == "include":
        return word in words_of(text)
    if kind == "bullets":
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return bool(lines) and all(ln.startswith("- ") and len(ln) > 2 for ln in lines)
    raise ValueError(f"unknown constraint kind {kind!r}")


PROMPTS = {
    "lowercase": "Write {n} words about {topic}, all in lowercase.",
    "capitals": "Write {n} words about {topic}, all in capital letters.",
    "end_with": "Write exactly {n} words about {topic}, ending with the word {word}.",
    "include": "Write exactly {n} words about {topic} that include the word {word}.",
    "start_with": "Write exactly {n} words about {topic}, starting with the word {word}.",
    "bullets": "Write a list of {n} items about {topic}, each line starting with '- '.",
}


def oracle_response(kind: str, n: int, topic: str, word: str, rng: random.Random) -> str:
    words = [rng.choice(TOPIC_WORDS[topic]) for _ in range(n)]
    if kind == "end_with":
        words[-1] = word
    elif kind == "start_with":
        words[0] = word
    elif kind == "include":
        words[rng.randrange(n)] = word
    elif kind == "capitals":
        words = [w.upper() for w in words]
    elif kind == "bullets":
        return "\n".join(f"- {w}" for w in words)
    return " ".join(words)


GENERATORS = ("templated", "ifeval")  # domains.instruct.options.generator
CREDITS = ("all", "partial")  # domains.instruct.options.credit


class InstructDomain(Domain):
    """generator: "templated" (the tiny model's learnable constraints, above) or "ifeval" (IFEval's own instruction
    types on short writing requests, decontaminated against IFEval: stages/domains/ifeval_constraints.py).
    data_root: where the IFEval prompts are read for that decontamination (None: the default data root).
    credit: "all" (a templated item scores 1 when its count and constraint both hold, else 0) or "partial"
    (`partial_credit`), for reward and eval alike."""

    name = "instruct"

    def __init__(self, generator: str = "templated", data_root: str | None = None, credit: str = "all"):
        if generator not in GENERATORS:
            raise ValueError(f"unknown instruct generator {generator!r}; known: {', '.join(GENERATORS)}")
        if credit not in CREDITS:
            raise ValueError(f"unknown instruct credit {credit!r}; known: {', '.join(CREDITS)}")
        if credit == "partial" and generator != "templated":
            raise ValueError("credit: partial grades the templated generator's items only")
        self.generator = generator
        self.data_root = data_root
        self.credit = credit

    def sample(self, rng: random.Random) -> Item:
        if self.generator == "ifeval":
            return self._sample_constrained(rng)
        kind = rng.choice(sorted(PROMPTS))
        n = rng.choice(COUNTS)
        topic = rng.choice(sorted(TOPICS))
        word = rng.choice(TOPIC_WORDS[topic]) if "{word}" in PROMPTS[kind] else ""
        prompt = PROMPTS[kind].format(n=n, topic=topic, word=word)
        reference = oracle_response(kind, n, topic, word, rng)
        return Item(self.name, "", prompt, reference, {"kind": kind, "n": n, "word": word})

    def _sample_constrained(self, rng: random.Random) -> Item:
        from cascade.stages.domains.ifeval_constraints import draw_constraints, overlaps_ifeval
        from cascade.stages.recipe.config_base import resolve_data_root

        data_root = resolve_data_root(self.data_root)
        for _ in range(100):
            prompt, ids, kwargs = draw_constraints(rng)
            if not overlaps_ifeval(prompt, data_root):
                meta = {"benchmark": "ifeval", "instruction_id_list": ids, "kwargs": kwargs}
                return Item(self.name, "", prompt, "", meta)
        raise ValueError("100 generated instructions in a row overlap IFEval's prompts: the templates need changing")

    def grade(self, item: Item, completion: str) -> float:
        return float(self.grade_details(item, completion)["score"])

    def grade_details(self, item: Item, completion: str) -> dict[str, Any]:
        """{"score"} for synthetic items; for IFEval also prompt-level strict/loose and per-instruction verdicts."""
        m = item.meta
        if "instruction_id_list" not in m:
            grade = partial_credit if self.credit == "partial" else check
            return {"score": float(grade(m["kind"], m["n"], m["word"], completion.strip()))}
        verdicts = ifeval_verdicts(
            m["instruction_id_list"], m["kwargs"], item.prompt, completion, m.get("benchmark", "ifeval")
        )
        strict = all(v["strict"] for v in verdicts)
        loose = all(v["loose"] for v in verdicts)
        return {"score": float(strict), "prompt_strict": strict, "prompt_loose": loose, "instructions": verdicts}

    def summarize_details(self, details: list[dict[str, Any]]) -> dict[str, float]:
        return ifeval_summary(details)

    def benchmarks(self) -> dict[str, Callable]:
        return {
            "ifeval": JsonlBenchmark(
                "ifeval", "instruction_following/ifeval_input_data.jsonl", parse_instruction_rows("ifeval")
            ),
            "ifbench": JsonlBenchmark("ifbench", None, parse_instruction_rows("ifbench")),
        }
