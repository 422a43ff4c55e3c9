"""`cascade`: run, resume, inspect and evaluate cascades from the terminal; one module per command group.

Bad input (unknown recipe key, missing file, bad override, unknown run id) is one line on stderr and exit
code 2, checked before anything is written (flows/cli/common.py).
"""

from __future__ import annotations

from flows.cli import deploy, evals, regression, runs  # noqa: F401  (each registers its commands on `app`)
from flows.cli.common import app


def main() -> None:
    app(prog_name="cascade")

