"""What every command group shares: the typer app, the console, and one-line errors for bad input.

Bad input (an unknown recipe key, a missing file, a bad override, an unknown run id) is one line on stderr and
exit code 2, checked before anything is written. The CLI parses and prints; the work is done by flows, tasks
and stages.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cascade.artifacts.layout import valid_run_id

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Cascade: multi-stage post-training on Prefect.")
# No markup: what it prints holds user strings (paths, run ids, recipe names) whose `[...]` would be read as
# markup tags (a '[/x]' raised MarkupError; a '[word]' vanished).
console = Console(markup=False)


class CLIError(Exception):
    """Bad user input: printed as one line, exit code 2."""


LOG_FILE: list[str] = []  # where this command's library log lines go (logs_to_file), named by its error line


def fail(message: str, code: int = 2) -> None:
    where = f" (log: {LOG_FILE[0]})" if LOG_FILE else ""
    typer.echo(f"cascade: error: {message}{where}", err=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def flow_logs(path: Path) -> Iterator[None]:
    """Library log lines into `path` (logs_to_file) while this command's flows run; on the way out, the flow
    runs' own log lines drained to the Prefect API before a server this command started stops (else Prefect's
    log worker retried for about a minute after the result, then printed its failure on the terminal)."""
    logs_to_file(path)
    try:
        yield
    finally:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)


def logs_to_file(path) -> None:
    """Library log lines (Prefect's task tracebacks and state changes, any dependency's WARNING) and Python
    warnings go to `path` instead of the terminal, which keeps the progress bars, the matrix and our one-line
    errors; a failure's line names the file."""
    import logging

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for console_handler in [h for h in root.handlers if type(h) is not logging.FileHandler]:
        root.removeHandler(console_handler)
    root.addHandler(handler)
    logging.captureWarnings(True)
    # transformers' loggers write to their own stderr handler, not through the root (a reward model's load report
    # of its new score head reached the terminal)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    LOG_FILE[:] = [str(path)]


def bad_input_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean bad input, not a bug: each becomes one line and exit code 2. The stage driver's
    (`python -m cascade.stages.run`) and what only the CLI meets: its own checks, baselines, eval records, an
    unknown name."""
    from cascade.artifacts.records import EvalRecordError
    from cascade.stages.evals.regression import BaselineError
    from cascade.stages.run import BAD_INPUT

    return (CLIError, *BAD_INPUT, BaselineError, EvalRecordError, LookupError)


def stage_failures() -> tuple[type[BaseException], ...]:
    """The failures of a run that are one line, not a bug: a torchrun stage whose rank died or raised (the
    line names the rank; its traceback is in the torchrun log the line names), and the gate under policy
    `fail` (the line names the domain, its drop and the tolerance), and a training stage whose steps kept
    producing a loss or gradient that is not finite (the line names the steps and the likely cause)."""
    from cascade.stages.errors import DistributedStageError, GateFailed, NonFiniteSteps

    return (DistributedStageError, GateFailed, NonFiniteSteps)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn known bad-input errors into one line on stderr and exit 2, a stage failure into one line and exit 1.
    Any other failure of a command that logs to a file (a run: an eval's missing file, a lost lease, a bug in a
    stage) is one line and exit 1 too, naming the exception; its traceback goes to the log file the line names."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        LOG_FILE.clear()  # an earlier command's log (commands called in one process, as by CliRunner) is not its
        try:
            return fn(*args, **kwargs)
        except bad_input_errors() as e:
            if isinstance(e, (KeyError, IndexError)):  # LookupError's built-in kinds are bugs, not user input
                raise
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
        except stage_failures() as e:
            fail(str(e), code=1)
        except (typer.Exit, typer.Abort):  # click's exits are RuntimeErrors: ours, already printed
            raise
        except Exception as e:
            if not LOG_FILE:
                raise
            import logging

            logging.getLogger("cascade.cli").error("the command failed", exc_info=e)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            fail(f"{type(e).__name__}: {first}" if first else type(e).__name__, code=1)

    return wrapper


def quiet_services() -> None:
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")  # 2 busy cores: 20 s is short
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def store_for(root: str | None):
    from pydantic import ValidationError

    from cascade.artifacts.config import StorageConfig
    from cascade.artifacts.store import Store

    try:
        return Store.from_config(StorageConfig(root=root))
    except ValidationError as e:
        raise CLIError(f"--store: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def stored_recipe(store, run_id: str, compute_overrides: list[str] = ()):
    """The recipe a run executes, as stored with it; an unknown or unreadable run is bad input. `compute.*`
    overrides move the stages still to run (another number of ranks or nodes); nothing else may change."""
    from cascade.artifacts.layout import recipe_key
    from cascade.stages.recipe.schema import apply_override, validate_recipe

    key = recipe_key(run_id)
    if not valid_run_id(run_id) or not store.exists(key):
        raise CLIError(f"unknown run id {run_id!r} in {store.uri('runs')}")
    try:
        raw = json.loads(store.read_bytes(key))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CLIError(f"{store.uri(key)} is not valid JSON (truncated?)") from None
    if not isinstance(raw, dict):
        raise CLIError(f"{store.uri(key)} is not a recipe")
    for item in compute_overrides:
        if not item.startswith("compute."):
            raise CLIError(f"resume takes compute.* overrides only (where ranks run, not what they train): {item!r}")
        apply_override(raw, item)
    return validate_recipe(raw, source=store.uri(key), stored=True)
