"""The recover flow: MOPD from the best-per-domain teachers onto a regressed checkpoint, then its eval.

Teachers come from a stored baseline (`<store>/baselines/<name>.json`): per domain, the checkpoint holding the
baseline score, i.e. the best known one. The student is the regressed checkpoint. The recovery stage is the
recipe's `gate.recovery` MOPD config, run by the same `stage_task` as the cascade's in-run recovery, as stage
00 `recover` of a new run `recover-<time>` (checkpoint `<store>/runs/<run_id>/00-recover`). The new checkpoint
is evaluated and compared with the same baseline (table artifact `recover-<baseline>`, and the same table printed);
a domain still regressed ends the flow run Failed (NotRecovered), never Completed. Started by hand, or by
the automation on `cascade.regression.detected` (infra/automations.py) with the event's recipe, baseline and
checkpoint URI.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from pydantic import BaseModel

from cascade.artifacts import layout
from cascade.artifacts.report import EvalScores
from cascade.flows.recipes import load_any_recipe
from cascade.flows.regression_eval import new_eval_id
from cascade.infra.flow_outcomes import expected_outcomes_in_one_line
from cascade.stages.evals.regression import NotRecovered, regressions, verdict_lines
from cascade.stages.kinds import StageInputs
from cascade.tasks.lifecycle import finish_task, running
from cascade.tasks.regression_tasks import (
    evaluate_checkpoint_task,
    judge_task,
    load_baseline_task,
    publish_verdicts_task,
    record_recovered_task,
    resolve_task,
)
from cascade.tasks.results import result_storage
from cascade.tasks.stage import stage_task

STAGE = "recover"


class RecoverOutcome(BaseModel):
    """What a recovery made: its run, its checkpoint's URI, that checkpoint's eval and the verdicts against the
    baseline (one row per gated column, as `compare` gives them)."""

    run_id: str
    checkpoint: str
    scores: EvalScores
    verdicts: list[dict[str, Any]]


@flow(name="recover", flow_run_name="recover-{baseline}", log_prints=True)
def recover_flow(
    student: str, recipe: str = "tiny", baseline: str = "nightly", run_id: str | None = None
) -> RecoverOutcome:
    """The recovered checkpoint's URI, scores and verdicts against the baseline; NotRecovered (the flow run ends
    Failed, in one line) when a domain is still below the baseline after the recovery."""
    expected_outcomes_in_one_line()
    loaded = load_any_recipe(recipe)  # a name, a path, or the URI of a run's recipe.json (the nightly's default)
    run_id = run_id or f"recover-{new_eval_id()}"
    best = load_baseline_task(loaded, baseline)
    if best is None or not set(best.domains) & set(loaded.domains):
        raise ValueError(f"baseline {baseline!r} has no teacher for any domain of recipe {loaded.name!r}")
    start = resolve_task.with_options(task_run_name=f"resolve-student-{student}")(loaded, student)
    teachers = {
        d: resolve_task.with_options(task_run_name=f"resolve-teacher-{d}")(loaded, entry.uri)
        for d, entry in sorted(best.domains.items())
        if d in loaded.domains
    }
    # teachers by domain: two domains' best checkpoints may come from stages of one name in different runs
    cfg = loaded.gate.recovery.model_copy(update={"name": STAGE, "teachers": {d: r.stage for d, r in teachers.items()}})
    inputs = StageInputs(policy=start, teachers=teachers)
    with running(loaded, run_id) as loaded:  # one writer per run: LeaseHeld otherwise
        recover_stage = stage_task.with_options(
            task_run_name=f"00-{cfg.kind}-{STAGE}", result_storage=result_storage(loaded, run_id)
        )
        model = recover_stage(loaded, run_id, cfg, 0, inputs)
        record = evaluate_checkpoint_task.with_options(task_run_name=f"eval-after-{STAGE}")(
            loaded, model.uri, model, layout.eval_key(run_id, 0, STAGE)
        )
        scores = EvalScores(after_stage=STAGE, scores=record.scores)
        record_recovered_task(loaded, run_id, scores)
        rows = judge_task(loaded, best, record)
        publish_verdicts_task(loaded, baseline, layout.verdicts_key(run_id), rows, STAGE)
        print(
            f"recovery of {student} into {model.uri}, against baseline {baseline!r}:\n" + "\n".join(verdict_lines(rows))
        )
        if regressions(rows):  # inside the run: its report ends FAILED, naming what is still below the baseline
            raise NotRecovered(baseline, rows)
    finish_task(loaded, run_id, "FINISHED")
    return RecoverOutcome(run_id=run_id, checkpoint=model.uri, scores=scores, verdicts=rows)
