"""docs/ARCHITECTURE.md, checked against the code: its checklists are carried out as written, so the doc cannot drift.

- "Checklist: add a domain": a toy domain gets exactly the methods step 1 says a subclass implements, on the base
  class step 1 names; it is registered with the documented call and import, then generates every split, grades, and
  runs through each entry point the section's closing paragraph names.
- "Checklist: add a stage kind": a toy kind's config derives from the class step 1 names, its run function has step
  2's signature, and its row is step 3's `register_kind(StageKind(...))` call with the fields that call names (so a
  field the doc gains is given too); the recipe validates it, the walk's `Made.inputs` wires it and `run_stage` runs it.
- Every call, class and keyword the checklists write in backticks exists on the module or class the section names,
  with the parameters the doc writes, and every domain method they name is called somewhere in stages/.
- The layer diagram draws the folders tests/test_layering.py checks, none below a folder it may import.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import random
import re
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
DOMAIN_CHECKLIST = "Checklist: add a domain"
KIND_CHECKLIST = "Checklist: add a stage kind"
CONTRACT_SECTIONS = (KIND_CHECKLIST, DOMAIN_CHECKLIST)
PLACEHOLDER = "<kind>"
KIND = "tally"  # the toy stage kind
DOMAIN = "parity"  # the toy domain


# ---------------------------------------------------------------- reading the doc


def section(title: str) -> str:
    """The text of `## title`, up to the next `## ` heading."""
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else len(DOC)]


def steps(title: str) -> dict[int, str]:
    """The numbered steps of a checklist (with their indented lines), by number."""
    found: dict[int, str] = {}
    current = None
    for line in section(title).splitlines():
        numbered = re.match(r"(\d+)\. ", line)
        if numbered:
            current = int(numbered.group(1))
            found[current] = line
        elif current is not None and (line.startswith(" ") or not line):
            found[current] += "\n" + line
        else:
            current = None
    return found


def closing_paragraph(title: str) -> str:
    """What a checklist says follows without further changes: the `Nothing else changes` paragraph."""
    text = section(title)
    return text[text.index("Nothing else changes") :]


def spans(text: str) -> list[str]:
    """Every `backticked` span, whitespace collapsed (a span may wrap)."""
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", text)]


def calls(span: str) -> list[tuple[str, list[str] | None, list[str]]]:
    """(name, parameter names or None when an argument is not a bare name, keyword names) of each call in a span."""
    try:
        tree = ast.parse(span.split(" -> ")[0], mode="eval")
    except SyntaxError:  # an annotation, an import, a keyword alone: names without parameters
        return [(name, None, []) for name in re.findall(r"(?<![\w.<>\"])([A-Za-z_][\w.]*)\(", span)]
    return [
        (
            ast.unparse(node.func),
            [a.id for a in node.args] if all(isinstance(a, ast.Name) for a in node.args) else None,
            [k.arg for k in node.keywords],
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    ]


def named_code(text: str) -> list[object]:
    """The classes, then the modules, a text names in backticks: `stages/x.py`, `from cascade.x import y`, `Class`."""
    paths = re.findall(r"`((?:\w+/)+\w+\.py)`", text)
    names = [f"cascade.{p.removesuffix('.py').replace('/', '.').removesuffix('.__init__')}" for p in paths]
    names += re.findall(r"`from (cascade[\w.]*) import", text)
    modules = [importlib.import_module(name) for name in dict.fromkeys(names)]
    classes = [
        getattr(m, s)
        for s in spans(text)
        if re.fullmatch(r"[A-Z]\w*", s)
        for m in modules
        if inspect.isclass(getattr(m, s, None))
    ]
    return list(dict.fromkeys(classes)) + modules


def resolve(dotted: str, code: list[object]) -> object | None:
    """`a.b` looked up on the first of `code` that has `a`; None if none has it."""
    head, *rest = dotted.split(".")
    owner = next((c for c in code if hasattr(c, head)), None)
    if owner is None:
        return None
    obj = getattr(owner, head)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


def parameters(obj: object) -> list[str]:
    names = list(inspect.signature(obj).parameters)
    return names[1:] if names[:1] == ["self"] else names


def accepts(obj: object, keyword: str) -> bool:
    params = inspect.signature(obj).parameters.values()
    return any(p.name == keyword or p.kind is p.VAR_KEYWORD for p in params)


def first_class(text: str, code: list[object]) -> type:
    """The first class a text names in backticks (a checklist step's base class)."""
    return next(
        resolve(s, code) for s in spans(text) if re.fullmatch(r"[A-Z]\w*", s) and inspect.isclass(resolve(s, code))
    )


# ---------------------------------------------------------------- the contract's names exist


@pytest.mark.parametrize("title", CONTRACT_SECTIONS)
def test_every_name_a_checklist_gives_exists_with_the_parameters_it_writes(title):
    text = section(title)
    code = named_code(text)
    missing, wrong = [], []
    for span in spans(text):
        for name, args, keywords in calls(span):
            obj = resolve(name, code)
            if obj is None:
                missing.append(name)
                continue
            if args is not None and parameters(obj)[: len(args)] != args:
                wrong.append(f"{span}: the code has {name}({', '.join(parameters(obj))})")
            wrong += [f"{span}: {name} takes no {k}=" for k in keywords if not accepts(obj, k)]
        if re.fullmatch(r"[A-Z]\w*", span) and resolve(span, code) is None:
            missing.append(span)
    callables = [resolve(n, code) for s in spans(text) for n, _, _ in calls(s)]
    for keyword in (m.group(1) for s in spans(text) if (m := re.match(r"(\w+)=", s))):
        if not any(c is not None and accepts(c, keyword) for c in callables):
            wrong.append(f"{keyword}= is a parameter of nothing the section names")
    assert not missing, f"{title}: names no module or class it gives has: {missing}"
    assert not wrong, f"{title}: " + "; ".join(wrong)


def test_every_domain_method_the_checklist_names_is_called_by_the_code():
    from cascade.stages.domains.base import Domain

    text = section(DOMAIN_CHECKLIST)
    code = [c for c in named_code(text) if inspect.isclass(c) and issubclass(c, Domain)]
    methods = {name for s in spans(text) for name, _, _ in calls(s) if resolve(name, code) is not None}
    source = "\n".join(p.read_text() for p in (ROOT / "stages").rglob("*.py"))
    uncalled = sorted(m for m in methods if not re.search(rf"[.\"]{m}[(\"]", source))
    assert {"sample", "grade", "generate", "iter_items"} <= methods, methods
    assert not uncalled, f"the doc names domain methods nothing in stages/ calls: {uncalled}"


def test_the_layer_diagram_draws_the_layering_the_test_enforces():
    spec = importlib.util.spec_from_file_location("layering", ROOT / "tests" / "test_layering.py")
    layering = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layering)
    block = section("Layers").split("```")[1]
    rows = [
        re.findall(r"(\w+)/", m.group(0)) for line in block.splitlines() if (m := re.match(r"(\w+/ ?)+(?=\s)", line))
    ]
    assert sorted(f for row in rows for f in row) == sorted(layering.PACKAGES), rows
    for i, row in enumerate(rows):
        for lower in row:
            above = [f for r in rows[:i] for f in r]
            allowed = set(above) - layering.FORBIDDEN.get(lower, set())
            assert not allowed, f"{lower}/ is drawn below {sorted(allowed)}, which it may import"
        for left, right in zip(row, row[1:]):  # beside: the right one never imports the left one
            assert left in layering.FORBIDDEN[right], f"{right}/ is drawn beside {left}/ but may import it"


# ---------------------------------------------------------------- add a domain, as written


def sample_parity(self, rng: random.Random):
    from cascade.stages.domains.base import Item

    n = rng.randrange(10**6)
    answer = "even" if n % 2 == 0 else "odd"
    return Item(self.name, "", f"Is {n} even or odd?", answer, {"answer": answer}, split_key=str(n))


def grade_parity(self, item, completion: str) -> float:
    return float(completion.strip().lower() == item.meta["answer"])


TOY_DOMAIN_METHODS = {"sample": sample_parity, "grade": grade_parity}


@pytest.fixture
def toy_domain():
    """The toy domain, built and registered exactly as the checklist says; unregistered afterwards."""
    from cascade.stages.domains import unregister_domain

    first = steps(DOMAIN_CHECKLIST)[1]
    required = re.findall(r"^\s+- `(\w+)\(", first, flags=re.M)
    assert required and set(required) <= set(TOY_DOMAIN_METHODS), f"the doc asks a domain for {required}"
    base = first_class(first, named_code(first))
    toy = type("ParityDomain", (base,), {"name": DOMAIN, **{m: TOY_DOMAIN_METHODS[m] for m in required}})()
    registration = next(text for text in steps(DOMAIN_CHECKLIST).values() if "register_domain(" in text)
    namespace: dict = {}
    exec(next(s for s in spans(registration) if s.startswith("from ")), namespace)
    eval(next(s for s in spans(registration) if s.startswith("register_domain(")), namespace, {"domain": toy})
    yield toy
    unregister_domain(DOMAIN)


def test_the_toy_domain_generates_every_split_disjoint_and_deterministic(toy_domain):
    from cascade.stages.domains.base import Split, split_of

    first = steps(DOMAIN_CHECKLIST)[1]
    splits = [s for s in spans(first) if s in typing.get_args(Split)]
    assert sorted(splits) == sorted(typing.get_args(Split)), "step 1 names every split there is"
    keys = {}
    for split in splits:
        items = toy_domain.generate(split, 12, seed=3)
        assert items == toy_domain.generate(split, 12, seed=3) == list(toy_domain.iter_items(split, 12, seed=3))
        assert items != toy_domain.generate(split, 12, seed=4)
        keys[split] = {it.split_key for it in items}
        assert len(keys[split]) == 12 and {split_of(k) for k in keys[split]} == {split}
    assert not keys["train"] & (keys["dev"] | keys["heldout"]) and not keys["dev"] & keys["heldout"]


def test_the_toy_domain_grades_its_oracle_answer_right_and_a_wrong_one_wrong(toy_domain):
    items = toy_domain.generate("train", 4, seed=0)
    assert [toy_domain.grade(it, it.reference) for it in items] == [1.0] * 4
    assert toy_domain.grade_batch(items, ["maybe"] * 4) == [0.0] * 4


def toy_domain_recipe():
    from cascade.flows.recipes import load_recipe
    from cascade.stages.recipe.schema import validate_recipe

    raw = load_recipe("micro").model_dump(mode="json")
    raw["domains"] = {DOMAIN: {"train_size": 16, "heldout_size": 4, "max_new_tokens": 4}}
    rl = next(s for s in raw["stages"] if s["name"] == "math_rl") | {"name": f"{DOMAIN}_rl", "domains": [DOMAIN]}
    raw["stages"] = [s for s in raw["stages"] if s["kind"] in ("sft_data", "sft")] + [rl]
    return validate_recipe(raw)


class OracleEngine:
    """Answers every prompt with the oracle's answer of the item it belongs to."""

    def __init__(self, answers: dict[tuple[int, ...], str]):
        self.answers = answers

    def generate(self, prompts, n, sampling, seeds=None, progress=None):
        from cascade.stages.engines.interface import Completion

        return [[Completion([], [], self.answers[tuple(p)], "stop")] * n for p in prompts]


def drive_validate_recipe(recipe, toy) -> None:
    assert recipe.domain(DOMAIN) is toy


def drive_eval_prompts(recipe, toy) -> None:
    from cascade.stages.kinds.sft_data.run_sft_data import eval_prompts

    held = {it.prompt for split in ("heldout", "dev") for it in toy.generate(split, 4, recipe.seed)}
    assert set(eval_prompts(recipe.stage("sft_data"), recipe)) == held


def drive_prompt_pool(recipe, toy) -> None:
    from cascade.stages.train.rollout import prompt_pool

    assert prompt_pool(recipe, [DOMAIN]) == toy.generate("train", 16, recipe.seed)


def drive_score_texts(recipe, toy) -> None:
    from cascade.stages.train.rollout import score_texts

    items = toy.generate("train", 3, recipe.seed)
    assert score_texts(recipe, items, [[it.reference, "maybe"] for it in items]).tolist() == [[1.0, 0.0]] * 3


def drive_evaluate_domains(recipe, toy) -> None:
    from cascade.stages.evals.evaluate import evaluate_domains
    from cascade.stages.train.model import prompt_ids
    from cascade.stages.train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    items = toy.generate(recipe.eval.split, 4, recipe.seed)
    dev = toy.generate("dev", 4, recipe.seed)  # the dev/<domain> column that selects, beside held-out
    engine = OracleEngine({tuple(prompt_ids(tokenizer, it.prompt)): it.reference for it in items + dev})
    scores, rows = evaluate_domains(engine, tokenizer, recipe)
    assert scores[DOMAIN] == 1.0 and {r["id"] for r in rows if r["domain"] == DOMAIN} == {it.id for it in items}


ENTRY_POINT_DRIVERS = {
    "validate_recipe": drive_validate_recipe,
    "eval_prompts": drive_eval_prompts,
    "prompt_pool": drive_prompt_pool,
    "score_texts": drive_score_texts,
    "evaluate_domains": drive_evaluate_domains,
}


def test_the_toy_domain_runs_through_every_entry_point_the_checklist_names(toy_domain):
    named = [name for s in spans(closing_paragraph(DOMAIN_CHECKLIST)) for name, _, _ in calls(s)]
    assert set(named) == set(ENTRY_POINT_DRIVERS), "give the test a driver for each entry point the doc names"
    recipe = toy_domain_recipe()
    for name in named:
        ENTRY_POINT_DRIVERS[name](recipe, toy_domain)


# ---------------------------------------------------------------- add a stage kind, as written


def tally_config_class(base: type, read: type) -> type:
    """Step 1's config: derives from the doc's base class, bounds its number, reads an earlier dataset stage."""

    class TallyConfig(base):
        kind: Literal["tally"] = KIND
        name: str = KIND
        source: str = "sft_data"  # the dataset stage it reads
        count: int = Field(3, ge=1, le=100)

        def reads(self):
            return [read("source", self.source, "dataset")]

    return TallyConfig


def tally_run(write_checkpoint, result: type):
    """Step 2's run function: writes `count` lines as a dataset checkpoint at ctx.key."""
    from cascade.artifacts.config import config_hash

    def run_tally(cfg, ctx, inputs):
        out = ctx.workdir / "tally"
        out.mkdir()
        (out / "rows.txt").write_text("".join(f"{i}\n" for i in range(cfg.count)))
        ref = write_checkpoint(
            ctx.store,
            ctx.key,
            out,
            stage=cfg.name,
            step=None,
            parent=inputs.stages[cfg.source],
            config_hash=config_hash(cfg),
        )
        return result(ref, {"rows": cfg.count})

    return run_tally


TALLY_ROW_CHOICES = {"makes": "dataset"}  # what the toy's run function writes; other fields take neutral values


def row_value(row_class: type, field_name: str) -> object:
    """The toy row's value of a field the doc's call names: the toy's choice, its default, or a neutral value."""
    if field_name in TALLY_ROW_CHOICES:
        return TALLY_ROW_CHOICES[field_name]
    field = {f.name: f for f in fields(row_class)}.get(field_name)
    assert field is not None, f"the doc's row names {field_name}=, which {row_class.__name__} has no field for"
    if field.default is not MISSING:
        return field.default
    hint = typing.get_type_hints(row_class)[field_name]
    if hint is bool:
        return False
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)[0]
    raise AssertionError(f"the doc's row names {field_name}: give the toy kind a value for it (TALLY_ROW_CHOICES)")


@pytest.fixture
def tally_kind():
    """The toy kind, built and registered exactly as the checklist says; unregistered afterwards."""
    from cascade.stages.kinds import unregister_kind

    config_step, run_step, row_step = (steps(KIND_CHECKLIST)[n] for n in (1, 2, 3))
    config_code = named_code(config_step)
    config = tally_config_class(first_class(config_step, config_code), resolve("Read", config_code))
    annotation = next(s for s in spans(config_step) if s.startswith("kind: ")).removeprefix("kind: ")
    assert config.model_fields["kind"].annotation == eval(annotation.replace(PLACEHOLDER, KIND), {"Literal": Literal})
    signature = re.search(rf"`run_{PLACEHOLDER}\(([^)]*)\) -> (\w+)`", run_step)
    run_code = named_code(run_step)
    run = tally_run(resolve("write_checkpoint", run_code), resolve(signature.group(2), run_code))
    assert list(inspect.signature(run).parameters) == signature.group(1).split(", ")
    row_code = named_code(row_step)
    call = ast.parse(next(s for s in spans(row_step) if s.startswith("register_kind(")), mode="eval").body
    row_call = call.args[0]
    pieces = {PLACEHOLDER: KIND, "Config": config, "run": run}
    row_class = resolve(row_call.func.id, row_code)
    args = [pieces[a.value if isinstance(a, ast.Constant) else a.id] for a in row_call.args]
    row = row_class(*args, **{k.arg: row_value(row_class, k.arg) for k in row_call.keywords})
    resolve(call.func.id, row_code)(row)
    yield row
    unregister_kind(KIND)


def tally_recipe(tmp_path, source: str = "sft_data", count: int = 5):
    from cascade.flows.recipes import load_recipe
    from cascade.stages.recipe.schema import validate_recipe

    raw = load_recipe("micro", [f"storage.root=file://{tmp_path}/store"]).model_dump(mode="json")
    raw["stages"] = [s for s in raw["stages"] if s["kind"] in ("sft_data", "sft")] + [
        {"kind": KIND, "source": source, "count": count}
    ]
    return validate_recipe(raw)


def test_the_toy_kind_validates_in_a_recipe_which_checks_what_it_reads(tally_kind, tmp_path):
    from cascade.stages.kinds import kind_of
    from cascade.stages.recipe.schema import RecipeError

    assert kind_of(KIND) is tally_kind
    assert isinstance(tally_recipe(tmp_path).stage(KIND), tally_kind.config)
    with pytest.raises(RecipeError, match=f"'{KIND}' reads source 'sft', which no earlier"):
        tally_recipe(tmp_path, source="sft")
    with pytest.raises(RecipeError, match="less than or equal to 100"):
        tally_recipe(tmp_path, count=101)


def test_the_toy_kind_is_wired_and_run_by_the_registry_alone(tally_kind, tmp_path):
    from cascade.artifacts.checkpoint import MANIFEST, CheckpointRef
    from cascade.artifacts.store import Store
    from cascade.stages.train.context import ListSink, StageContext

    named = [name for s in spans(closing_paragraph(KIND_CHECKLIST)) for name, _, _ in calls(s)]
    code = named_code(closing_paragraph(KIND_CHECKLIST)) + named_code(section(KIND_CHECKLIST))
    assert {"Made.inputs", "run_stage"} <= set(named)
    recipe = tally_recipe(tmp_path)
    stage, store = recipe.stage(KIND), Store.from_config(recipe.storage)
    data = CheckpointRef(
        uri=store.uri("runs/r/00-sft_data"),
        key="runs/r/00-sft_data",
        stage="sft_data",
        config_hash="0" * 16,
        digest="0" * 64,
    )
    policy = data.model_copy(update={"key": "runs/r/01-sft", "stage": "sft"})
    inputs = resolve("Made", code)(stages={"sft_data": data, "sft": policy}, policy=policy).inputs(stage)
    assert inputs.stages == {"sft_data": data} and inputs.policy == (policy if tally_kind.takes_policy else None)
    (tmp_path / "work").mkdir()
    ctx = StageContext(recipe, store, "r", f"runs/r/02-{KIND}", ListSink(), workdir=tmp_path / "work")
    result = resolve("run_stage", code)(stage, ctx, inputs)
    assert result.checkpoint.key == ctx.key and result.metrics == {"rows": 5}
    assert store.exists(f"{ctx.key}/rows.txt") and store.exists(f"{ctx.key}/{MANIFEST}")
