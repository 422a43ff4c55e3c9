"""docs/RECIPES.md's reward of one's own runs as written: its files are written to a fresh folder, its command runs
there on `micro`, and the instruct evals of the run are scored by the doc's function.

The blocks are read from the section "A reward of your own": each `<!-- file: NAME -->` block is written to NAME, and
the `<!-- runnable -->` bash block runs in that folder, as tests/test_readme.py runs the README's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## A reward of your own"
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\s*\n```\w*\n(.*?)```", re.S)
RUNNABLE = re.compile(r"<!-- runnable -->\s*\n```bash\n(.*?)```", re.S)


def section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end != -1 else len(text)]


def doc_blocks() -> tuple[dict[str, str], list[str]]:
    """The section's files (name -> text) and its runnable commands."""
    text = section((ROOT / "docs" / "RECIPES.md").read_text(), SECTION)
    return dict(FILE_BLOCK.findall(text)), RUNNABLE.findall(text)


def test_the_section_holds_a_reward_module_its_prompts_and_one_command():
    files, commands = doc_blocks()
    assert sorted(files) == ["my_rewards.py", "prompts.jsonl"] and len(commands) == 1
    rows = [json.loads(line) for line in files["prompts.jsonl"].splitlines()]
    assert all(set(row) == {"prompt", "max_words"} for row in rows)  # TRL's shape: no meta of a grader's


@pytest.mark.slow
def test_the_reward_of_ones_own_runs_on_micro_as_written(tmp_path, prefect_api):
    """Before rewards of one's own took rows without a grader's meta, the command was refused (the instruct grader
    reads `kind`), and no domain's eval could be scored by such a reward."""
    files, (command,) = doc_blocks()
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "MLFLOW_"))}
    env.update(
        CASCADE_HOME=str(home),
        PREFECT_API_URL=prefect_api,
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{command}"], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    spec = importlib.util.spec_from_file_location("doc_rewards", work / "my_rewards.py")
    rewards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rewards)
    (run,) = (home / "runs").iterdir()
    stored = json.loads((run / "recipe.json").read_text())
    if_rl = next(s for s in stored["stages"] if s["name"] == "if_rl")
    assert if_rl["reward"]["function"] == "my_rewards:within_budget"
    assert if_rl["prompts"]["instruct"][0]["path"] == "prompts.jsonl"
    record = json.loads(next((run / "evals").glob("*-if_rl.json")).read_text())
    greedy = [row for row in record["items"] if row["domain"] == "greedy/instruct"]  # one answer: its score is its own
    assert greedy and all(
        row["score"] == rewards.within_budget([row["prompt"]], [row["completion"]])[0] for row in greedy
    )
    # and the column's score, which the gains table and the gate read, is theirs
    assert record["scores"]["greedy/instruct"] == pytest.approx(sum(r["score"] for r in greedy) / len(greedy))
