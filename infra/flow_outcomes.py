"""Expected outcomes of a flow run as one line where it runs: the terminal of `cascade deploy`, which serves the
deployments, and the flow run's log in the UI.

A regression that the regression-eval or recover flow finds, the cascade's gate stopping a run under `policy: fail`,
and a recipe or run form that validation refuses, end the flow run Failed with an exception whose message says all
there is to say. Prefect logs such an exception twice with its traceback (the flow engine's "Encountered exception
during execution", then, in the process `serve` starts for the run, "Engine execution exited with unexpected
exception"): about 45 lines for an outcome the user asked to learn. Both records are dropped for these exceptions;
the flow engine's state line, `Finished in state Failed('Flow run encountered an exception: RegressionFound: 1
regression(s) against baseline ...')`, is the one line left. Any other exception keeps its tracebacks: it is a
failure to read.
"""

from __future__ import annotations

import logging

# the flow engine logs a flow run's exception here, and the engine that `serve` starts for the run logs it again here
FLOW_RUN_LOGGER = "prefect.flow_runs"


def expected_outcomes() -> tuple[type[BaseException], ...]:
    from cascade.stages.errors import GateFailed, RecipeError
    from cascade.stages.evals.regression import RegressionFound

    # NotRecovered, the recover flow's, is a RegressionFound; GateFailed is the gate under `policy: fail` stopping
    # the run as asked, its message naming the domain, the drop and the stage
    return (RecipeError, RegressionFound, GateFailed)


class ExpectedOutcomeTracebacks(logging.Filter):
    """Drops a log record that carries an expected outcome's exception; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], expected_outcomes()))


def expected_outcomes_in_one_line() -> None:
    """Filter the flow-run logger of this process, once (`serve` runs each flow run in a process of its own)."""
    logger = logging.getLogger(FLOW_RUN_LOGGER)
    if not any(isinstance(f, ExpectedOutcomeTracebacks) for f in logger.filters):
        logger.addFilter(ExpectedOutcomeTracebacks())
