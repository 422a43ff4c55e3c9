"""Nothing outside a stage kind's registry row and its own modules names the kind; the same for reward sources and
on-policy losses.

A name is a string literal equal to a registered kind or reward source (`"grpo"`, `"judge"`), anywhere in flows/,
tasks/, stages/, artifacts/ and infra/ (docstrings and comments are not literals equal to a name), or a word of an
f-string's text equal to one (f"mopd-recover-{stage}" builds a name from parts). It may appear
only in a home of what it names: the module of the row's config class (a kind's folder, where its row is
registered) and the module of its run function or builder (for a reward source, also its registry module). A
kind's name may also be a product's (`Product`: what a stage makes; a reward_model stage makes a
`"reward_model"`): then it is at home where `Product` is declared too.
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path
from typing import Any, get_args

from cascade.stages import kinds
from cascade.stages.recipe import config_base
from cascade.stages.scoring import reward_sources
from cascade.stages.train import loss_registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "stages", "artifacts", "infra")
# Strings equal to a name that are not that name: (file, string) -> what they are.
NOT_NAMES = {
    ("stages/domains/livecodebench.py", "difficulty"): "a LiveCodeBench row's field (easy/medium/hard)",
    ("flows/cli/eval_commands.py", "judge"): "`cascade eval --benchmark arena_hard`: the judge model's default name",
    ("flows/cli/eval_modes.py", "judge"): "`cascade eval --benchmark arena_hard`: the judge URL's key in scores.json",
    ("tasks/regression_tasks.py", "judge"): "the regression eval's Prefect task that compares scores with a baseline",
    # a kind's default stage name is its kind's name: these defaults name an earlier stage, not a kind
    ("stages/kinds/sft/__init__.py", "sft_data"): "`data`: the stage whose dataset SFT trains on",
    ("stages/kinds/difficulty/__init__.py", "sft"): "`reference`: the model stage that rolls out",
    ("stages/kinds/reward_model/__init__.py", "sft"): "`init`: the policy stage the backbone starts from",
}


# Words of f-strings equal to a name that are not that name: (file, name) -> what they are.
NOT_NAMES_IN_PARTS = {
    ("flows/cli/eval_commands.py", "judge"): "the --judge option, in its error lines",
    ("flows/cli/eval_modes.py", "judge"): "the --judge option, in its error lines",
    ("flows/regression_eval.py", "judge"): "the regression eval's judge task, named per domain",
    ("stages/datasets/sources.py", "grader"): "a domain's grader, in an error line",
    ("stages/kinds/sft_data/run_sft_data.py", "grader"): "a domain's grader, in an error line",
    ("stages/recipe/schema.py", "sft"): "prose of an error line: conversations are SFT data",
    ("stages/recipe/schema.py", "sft_data"): "prose of an error line: an sft_data stage reads conversations",
    (
        "stages/train/training.py",
        "sft",
    ): "the label of the SFT batch order's seed stream (changing it changes every run)",
}


def module_file(module: str) -> str:
    """`cascade.stages.kinds.sft.run_sft` -> `stages/kinds/sft/run_sft.py` (the checkout's path of one of our
    modules)."""
    return str(Path(sys.modules[module].__file__).resolve().relative_to(ROOT))


def callable_module(function: Any) -> str:
    """The module a row's run function or builder lives in; a lazy one (`imported_on_call`) names it in its qualname."""
    qualname = getattr(function, "__qualname__", "")
    module = qualname.rpartition(".")[0] if qualname.startswith("cascade.") else function.__module__
    __import__(module)
    return module


def homes() -> dict[str, set[str]]:
    """Every registered name -> the files that may spell it."""
    out: dict[str, set[str]] = {}
    for name, row in kinds.KINDS.items():
        out.setdefault(name, set()).update({module_file(row.config.__module__), module_file(callable_module(row.run))})
    for name, row in reward_sources.REWARD_SOURCES.items():
        out.setdefault(name, set()).update(
            {
                module_file(reward_sources.__name__),
                module_file(row.config.__module__),
                module_file(callable_module(row.build)),
            }
        )
    for name, row in loss_registry.LOSSES.items():  # a kind's own loss bears the kind's name
        out.setdefault(name, set()).update(
            {module_file(loss_registry.__name__), module_file(callable_module(row.build))}
        )
    for product in set(get_args(config_base.Product)) & set(out):
        out[product].add(module_file(config_base.__name__))
    return out


def stray_names(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """`file:line: "name"` for every string literal equal to a registered name outside that name's homes."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value in allowed
                    and rel not in allowed[node.value]
                    and (rel, node.value) not in NOT_NAMES
                ):
                    found.append(f'{rel}:{node.lineno}: "{node.value}"')
    return found


def built_names(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """`file:line: name in "part"` for every word of an f-string's text equal to a registered name outside that
    name's homes: a name built from parts (f"mopd-recover-{stage}") is a name too."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.JoinedStr):
                    continue
                for part in node.values:
                    if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                        continue
                    for word in sorted({w.lower() for w in re.split(r"[^A-Za-z0-9_]+", part.value)} & set(allowed)):
                        if rel not in allowed[word] and (rel, word) not in NOT_NAMES_IN_PARTS:
                            found.append(f'{rel}:{part.lineno}: {word} in "{part.value}"')
    return found


def test_no_kind_or_reward_source_is_named_outside_its_homes():
    assert stray_names(ROOT, homes()) == []
    assert built_names(ROOT, homes()) == []


def test_a_kind_named_elsewhere_is_caught(tmp_path):
    """The check bites: the real tree plus a flow that tests a kind by name and a stage that tests a reward source."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "flows" / "probe.py").write_text('def gains(cfg):\n    return cfg.kind == "grpo"\n')
    (tmp_path / "stages" / "probe.py").write_text('def frozen(reward):\n    return reward.kind in ("judge",)\n')
    assert stray_names(tmp_path, homes()) == ['flows/probe.py:2: "grpo"', 'stages/probe.py:2: "judge"']
    (tmp_path / "flows" / "built.py").write_text('def task_name(stage):\n    return f"mopd-recover-{stage}"\n')
    assert built_names(tmp_path, homes()) == ['flows/built.py:2: mopd in "mopd-recover-"']


def test_every_home_exists():
    """A row whose config or run function moved keeps its homes honest: each is a file of the checkout."""
    assert all((ROOT / home).is_file() for files in homes().values() for home in files)
