"""`cascade`: run, resume, inspect and evaluate cascades from the terminal; one module per command group (and the
eval command's modes, flows/cli/eval_modes.py).

Bad input (unknown recipe key, missing file, bad override, unknown run id) is one line on stderr and exit
code 2, checked before anything is written (flows/cli/common.py).
"""

from __future__ import annotations

import sys

from cascade.flows.cli import (  # noqa: F401  (each registers its commands on `app`)
    deploy_command,
    eval_commands,
    inspection,
    plan_command,
    regression_commands,
    runs,
)
from cascade.flows.cli.common import app


def main(argv: list[str] | None = None) -> None:
    app(args=optional_values(sys.argv[1:] if argv is None else argv), prog_name="cascade")


OPTIONAL_VALUE = {"--html"}  # options whose value may be left out: `--html` alone means "the default place"


def optional_values(argv: list[str]) -> list[str]:
    """`--html` as the last word or before another option gets the empty value (typer has no optional values)."""
    out = []
    for i, word in enumerate(argv):
        out.append(word)
        if word in OPTIONAL_VALUE and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append("")
    return out
