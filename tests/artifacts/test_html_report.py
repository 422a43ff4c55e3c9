"""The run report's pieces without a run: the step log under resume, standard errors, the page of a synthetic
run (every section, escaping, a stopped run), and a comparison of two runs."""

import io
import json
import math
from pathlib import Path

from cascade.artifacts import layout
from cascade.artifacts.html_report import SECTIONS, collect, paired_gain, render, standard_error, where_stopped
from cascade.artifacts.records import EvalRecord
from cascade.artifacts.report import Breakdown, GateDecision, ReportCard, RunReport, StageRecord
from cascade.artifacts.steplog import StepLog, read_rows, read_run
from cascade.artifacts.store import Store


def rows_of(store: Store, key: str) -> list[int]:
    return [r["step"] for r in read_rows(store, key)]


def test_step_log_under_resume_neither_duplicates_nor_loses_steps(tmp_path):
    store = Store(f"file://{tmp_path}")
    key = layout.metrics_key("r", 3, "if_rl")
    history = [{"loss": 1.0 / s} for s in range(1, 7)]
    first = StepLog(store, "r", 3, "if_rl")
    for step in range(1, 6):  # steps 1..5 logged, then the process dies; only some rows reached the store
        first.log(step, history[step - 1])
        if step == 2:
            first.flush()
    assert rows_of(store, key) == [1, 2]
    # the resume continues from the step-4 checkpoint: its history (steps 1..4) is the log; 5.. come again
    again = StepLog(store, "r", 3, "if_rl")
    again.restore(4, history[:4])
    for step in (5, 6):
        again.log(step, history[step - 1])
    again.close()
    rows = read_rows(store, key)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["metrics"]["loss"] for r in rows] == [h["loss"] for h in history]
    # a stage that starts over (no step checkpoint) replaces what the dead attempt logged
    over = StepLog(store, "r", 3, "if_rl")
    over.log(1, {"loss": 9.0})
    over.close()
    assert [r["metrics"]["loss"] for r in read_rows(store, key)] == [9.0]
    assert list(read_run(store, "r")) == ["if_rl"]


def test_a_second_log_of_the_last_step_adds_to_its_row(tmp_path):
    """The reward model logs a check and, at its last step, its held-out result after that step's training
    metrics: before, each later log replaced the row, and the curves lost those steps' loss (2026-11-27)."""
    store = Store(f"file://{tmp_path}")
    log = StepLog(store, "r", 6, "rm")
    log.log(1, {"loss": 0.7})
    log.log(2, {"loss": 0.6})
    log.log(2, {"select_accuracy": 0.75})
    log.log(2, {"heldout_accuracy": 0.7})
    log.close()
    assert read_rows(store, layout.metrics_key("r", 6, "rm")) == [
        {"step": 1, "metrics": {"loss": 0.7}},
        {"step": 2, "metrics": {"loss": 0.6, "select_accuracy": 0.75, "heldout_accuracy": 0.7}},
    ]


def test_a_torn_last_line_is_skipped(tmp_path):
    store = Store(f"file://{tmp_path}")
    key = layout.metrics_key("r", 1, "sft")
    store.write_bytes(key, b'{"step": 1, "metrics": {"loss": 2.0}}\n{"step": 2, "metr')
    assert rows_of(store, key) == [1]


def test_standard_error_of_item_scores():
    assert standard_error([1.0]) is None
    assert math.isclose(standard_error([1.0, 0.0, 1.0, 0.0]), math.sqrt(1 / 3 / 4))
    assert standard_error([0.5, 0.5, 0.5]) == 0.0


# A card as a stage kind's row declares it (stages/kinds/<kind>/__init__.py); the page knows no kind.
DATA_CARD = ReportCard(
    title="Data card",
    totals=(("rows kept", "rows"), ("input rows", "input_rows")),
    breakdowns=(
        Breakdown(label="domain", columns=(("rows", "rows/"), ("tokens", "tokens/"))),
        Breakdown(label="dropped because", columns=(("rows", "dropped/"),)),
    ),
    plots=("pass_rates",),
)


def synthetic_run(store: Store, run_id: str, *, failed: bool = False) -> None:
    report = RunReport(run_id=run_id, recipe="demo<b>")
    store.write_bytes("x/00/pass_rates.png", png_bytes())
    report.record_stage(
        StageRecord.model_validate(
            {
                "name": "build",
                "kind": "any_kind",
                "status": "completed",
                "checkpoint": "file:///x/00",
                "seconds": 1.0,
                "metrics": {
                    "rows": 120,
                    "tokens": 4000,
                    "input_rows": 130,
                    "dropped/duplicate": 10,
                    "rows/math": 120,
                    "tokens/math": 3900,
                },
                "card": DATA_CARD.model_dump(mode="json"),
                "plots": {"pass_rates": store.uri("x/00/pass_rates.png")},
            }
        )
    )
    report.record_stage(
        StageRecord.model_validate(
            {
                "name": "sft",
                "kind": "sft",
                "status": "completed",
                "checkpoint": "file:///x/01",
                "seconds": 10.0,
                "peak_rss_mb": 512.0,
                "metrics": {"steps": 3},
            }
        )
    )
    scores = {
        "sft": {"math": 0.25, "instruct": 0.5, "greedy/instruct": 0.25},
        "if_rl": {"math": 0.1, "instruct": 0.75, "greedy/instruct": 0.5},
    }
    for i, (stage, s) in enumerate(scores.items()):
        report.record_eval(stage, s)
        items = [{"domain": d, "id": f"{d}{k}", "score": float(k < v * 4)} for d, v in s.items() for k in range(4)]
        store.write_bytes(
            layout.eval_key(run_id, i + 1, stage), EvalRecord(model=None, scores=s, items=items).to_json()
        )
    report.record_gate(
        "if_rl",
        [
            GateDecision(
                stage="if_rl",
                domain="math",
                column="math",
                best=0.25,
                best_stage="sft",
                now=0.1,
                drop=0.15,
                tolerance=0.05,
                action="warn",
            )
        ],
    )
    if failed:
        report.record_stage(StageRecord(name="if_rl", kind="grpo", status="failed", checkpoint=None, seconds=3.0))
        report.status, report.stopped = "FAILED", "RuntimeError: simulated <preemption>"
    else:
        report.record_stage(
            StageRecord.model_validate(
                {
                    "name": "if_rl",
                    "kind": "grpo",
                    "status": "completed",
                    "checkpoint": "file:///x/03",
                    "seconds": 4.0,
                    "metrics": {"steps": 2},
                }
            )
        )
        report.status = "FINISHED"
    report.links = {"mlflow": "http://mlflow/#/experiments/1/runs/abc"}
    report.save(store)
    sft, grpo = StepLog(store, run_id, 1, "sft"), StepLog(store, run_id, 3, "if_rl")
    for step in (1, 2, 3):
        sft.log(step, {"loss": 3.0 - step, "lr": 0.1, "grad_norm": 1.0, "tokens_trained": 100.0})
    for step in (1, 2):
        grpo.log(
            step,
            {
                "reward": 0.1 * step,
                "reward/instruct": 0.1 * step,
                "kept_groups": 0.5,
                "entropy": 2.0,
                "response_length": 10.0,
                "loss": 0.1,
                "grad_norm": 0.5,
                "logprob_mismatch": 0.01,
                "tokens_sampled": 80.0,
                "tokens_trained": 120.0,
            },
        )
    sft.close()
    grpo.close()


def png_bytes() -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def test_a_stage_record_s_card_is_drawn_from_its_metrics_and_plots(tmp_path):
    """The card travels in the stage's record: totals, one row per metric suffix, its plot; a record without a
    card draws none."""
    store = Store(f"file://{tmp_path}")
    synthetic_run(store, "r")
    data = render([collect(store, "r")]).html
    data = data[data.index('<section id="data">') : data.index('<section id="gate">')]
    assert "<h3>Data card: build</h3>" in data and data.count("<h3>") == 1  # sft and if_rl have no card
    assert '<td class="text">120</td><td>130</td>' in data
    assert "<tr><td>math</td><td>120</td><td>3,900</td></tr>" in data
    assert "<tr><td>duplicate</td><td>10</td></tr>" in data
    assert data.count('<img class="plot pass-rates"') == 1


def test_the_page_of_a_run_has_every_section_escaped(tmp_path):
    store = Store(f"file://{tmp_path}")
    synthetic_run(store, "ok")
    run = collect(store, "ok", ["build", "sft", "if_rl"])
    assert run.items["if_rl"]["instruct"] == {"instruct0": 1.0, "instruct1": 1.0, "instruct2": 1.0, "instruct3": 0.0}
    rendered = render([run])
    html = rendered.html
    for section_id, _ in SECTIONS:
        assert f'<section id="{section_id}">' in html
    assert "demo&lt;b&gt;" in html and "demo<b>" not in html  # autoescaped
    assert "0.750 ± 0.250" in html  # score ± SE of (1, 1, 1, 0)
    assert "(gate: math)" in html and "finished" in html
    assert sorted(rendered.images) == ["curves-if_rl.png", "curves-sft.png", "forgetting_matrix.png"]
    assert html.count('class="plot curve"') == 2 and "http://mlflow/#/experiments/1/runs/abc" in html
    assert "<script" not in html and "http://" not in html.replace("http://mlflow/", "")  # nothing to fetch
    cost = html[html.index('<section id="cost">') :]
    assert "<td>300</td>" in cost and "<td>240</td>" in cost and "<td>160</td>" in cost  # tokens, summed over steps
    assert "<td>512</td>" in cost  # peak MB


def test_a_stopped_run_says_where_and_what_did_not_run(tmp_path):
    store = Store(f"file://{tmp_path}")
    synthetic_run(store, "bad", failed=True)
    run = collect(store, "bad", ["build", "sft", "if_rl", "math_rl"])
    said = where_stopped(run)
    assert said == "stopped at stage if_rl: RuntimeError: simulated <preemption>; not run: math_rl"
    assert "stopped at stage if_rl: RuntimeError: simulated &lt;preemption&gt;" in render([run]).html


def test_two_runs_side_by_side(tmp_path):
    store = Store(f"file://{tmp_path}")
    synthetic_run(store, "a")
    synthetic_run(store, "b", failed=True)
    rendered = render([collect(store, "a"), collect(store, "b")])
    assert rendered.images == {}  # a comparison is a page, not a run's MLflow plots
    assert rendered.html.count('class="plot heatmap"') == 2
    assert "<h3>a</h3>" in rendered.html and "<h3>b</h3>" in rendered.html
    assert "Solid: a; dashed: b" in rendered.html
    json.dumps(rendered.html)  # plain text


def test_the_printed_forgetting_matrix_carries_standard_errors(tmp_path):
    from cascade.flows.cli.common import console
    from cascade.flows.cli.inspection import print_matrix

    store = Store(f"file://{tmp_path}/store")
    synthetic_run(store, "r")
    with console.capture() as out:
        print_matrix(RunReport.load(store, "r"), store)
    text = out.get()
    # sft: instruct items 1,1,0,0 -> SE sqrt((1/3)/4); math items 1,0,0,0 -> SE sqrt((1/4)/4)
    assert "0.500 ± 0.289" in text and "0.250 ± 0.250" in text
    # if_rl: instruct 1,1,1,0 -> SE 0.25; math 0.1 of 4 items rounds to 0 passes -> SE 0
    assert "0.750 ± 0.250" in text


def test_paired_gain_is_over_the_items_both_evals_scored():
    before = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}
    after = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "new": 0.0}  # "new" has no before: not paired
    gain, se = paired_gain(before, after)
    # differences 0, 1, 0, 1: mean 0.5, sample variance 1/3, SE sqrt(1/3 / 4)
    assert gain == 0.5 and math.isclose(se, math.sqrt(1 / 12), rel_tol=1e-12)
    assert paired_gain(before, {"x": 1.0}) is None


def test_the_printed_report_says_what_each_rl_stage_did_to_its_own_domains(tmp_path):
    from cascade.flows.cli.common import console
    from cascade.flows.cli.inspection import print_matrix

    store = Store(f"file://{tmp_path}/store")
    synthetic_run(store, "r")
    with console.capture() as out:
        print_matrix(RunReport.load(store, "r"), store, {"if_rl": ["instruct"]})
    text = out.get()
    # instruct items 1,1,0,0 -> 1,1,1,0: differences 0,0,1,0, mean 0.25, SE sqrt((0.75/3)/4) = 0.25, +1.0 SE
    gains = text[text.index("Gains of each RL stage") :]
    rows = [line for line in gains.splitlines() if "if_rl" in line]
    assert len(rows) == 2  # instruct's primary metric and its greedy column; math is not if_rl's domain
    assert "instruct" in rows[0] and "0.500" in rows[0] and "0.750" in rows[0]
    assert "+0.250 ± 0.250" in rows[0] and "+1.0" in rows[0]
    # greedy items 1,0,0,0 -> 1,1,0,0: differences 0,1,0,0, mean 0.25, SE 0.25
    assert "greedy/instruct" in rows[1] and "0.250" in rows[1] and "0.500" in rows[1] and "+0.250 ± 0.250" in rows[1]
    matrix = text[: text.index("Gains of each RL stage")]
    assert matrix.index("greedy/instruct") > matrix.index(" instruct ")  # each greedy column after its domain
    assert "greedy/<domain>: greedy pass@1" in matrix
    with console.capture() as out:
        print_matrix(RunReport.load(store, "r"), store)  # no targets (a recipe without RL stages): no table
    assert "Gains of each RL stage" not in out.get()


def test_the_html_report_has_the_gains_table_of_each_rl_stage(tmp_path):
    """The same hand-computed gains as the printed report's: instruct 0.500 -> 0.750, +0.250 ± 0.250, +1.0 SE; its
    greedy column beside it."""
    store = Store(f"file://{tmp_path}/store")
    synthetic_run(store, "r")
    html = render([collect(store, "r", ["build", "sft", "if_rl"], {"if_rl": ["instruct"]})]).html
    table = html[html.index('<table class="gains">') :]
    table = table[: table.index("</table>")]
    rows = [r for r in table.split("<tr>")[2:]]
    assert len(rows) == 2 and "<td>if_rl</td><td>instruct</td><td>0.500</td><td>0.750</td>" in rows[0]
    assert "+0.250 ± 0.250" in rows[0] and "+1.0" in rows[0]
    assert "<td>if_rl</td><td>greedy/instruct</td><td>0.250</td><td>0.500</td>" in rows[1]
    assert '<table class="gains">' not in render([collect(store, "r")]).html  # no RL stage named: no table


def test_gain_targets_come_from_the_stage_kind_registry():
    from cascade.stages.kinds import gain_targets
    from tests.conftest import micro_recipe

    assert gain_targets(micro_recipe(Path("/tmp/unused")).stages) == {"if_rl": ["instruct"], "math_rl": ["math"]}


def page_with_links(tmp_path, links: dict[str, str]) -> str:
    """The HTML page of a synthetic run whose record holds these links."""
    store = Store(f"file://{tmp_path}")
    synthetic_run(store, "r")
    report = RunReport.load(store, "r")
    report.links = links
    report.save(store)
    return render([collect(store, "r")]).html


def test_links_work_where_they_are_links_and_are_text_elsewhere(tmp_path):
    """An http(s) URL is a link; a local MLflow store is the command that serves it and the run's page; any other
    scheme (a `javascript:` PREFECT_UI_URL) is text, never a link."""
    html = page_with_links(
        tmp_path,
        {
            "mlflow": "sqlite:////home/you/.cascade/mlflow.db#/experiments/1/runs/abc",
            "prefect": "javascript:alert(1)//",
        },
    )
    assert (
        "<code>mlflow ui --backend-store-uri sqlite:////home/you/.cascade/mlflow.db</code>, then open "
        "<code>http://127.0.0.1:5000/#/experiments/1/runs/abc</code>"
    ) in html
    assert "<code>javascript:alert(1)//</code>" in html and 'href="javascript' not in html
    assert "<a href=" not in html[html.index('<section id="links">') :]  # neither is a link


def test_a_stages_gains_are_its_primary_metric_then_greedy_then_pass_at_k():
    from cascade.artifacts.html_report import stage_gains

    before = {
        "instruct": {"a": 0.25, "b": 0.5},
        "greedy/instruct": {"a": 0.0, "b": 1.0},
        "pass@4/instruct": {"a": 1.0, "b": 1.0},
    }
    after = {
        "pass@4/instruct": {"a": 0.0, "b": 1.0},
        "instruct": {"a": 0.5, "b": 0.75},
        "greedy/instruct": {"a": 0.0, "b": 1.0},
    }
    gains = stage_gains(["sft", "if_rl"], {"sft": before, "if_rl": after}, {"if_rl": ["instruct"]})
    assert [(g.domain, g.gain) for g in gains] == [
        ("instruct", 0.25),
        ("greedy/instruct", 0.0),
        ("pass@4/instruct", -0.5),
    ]


def test_a_stages_gains_include_its_dev_column_and_every_benchmark_in_both_evals():
    from cascade.artifacts.html_report import stage_gains

    before = {
        "instruct": {"a": 0.0, "b": 0.0},
        "dev/instruct": {"c": 0.0, "d": 1.0},
        "bench/ifeval": {"p": 0.0, "q": 0.0, "r": 1.0},
        "bench/gsm8k": {"g": 1.0},
        "math": {"m": 0.0},  # another domain: not a target of if_rl
    }
    after = {
        "instruct": {"a": 1.0, "b": 0.0},
        "dev/instruct": {"c": 1.0, "d": 1.0},
        "bench/ifeval": {"p": 1.0, "q": 1.0, "r": 1.0},
        "bench/gsm8k": {"g": 0.0},
        "math": {"m": 1.0},
    }
    gains = stage_gains(["source", "if_rl"], {"source": before, "if_rl": after}, {"if_rl": ["instruct"]})
    assert [(g.domain, g.before, g.after) for g in gains] == [
        ("instruct", 0.0, 0.5),
        ("dev/instruct", 0.5, 1.0),
        ("bench/gsm8k", 1.0, 0.0),
        ("bench/ifeval", 1 / 3, 1.0),
    ]
    assert stage_gains(["source", "if_rl"], {"source": before, "if_rl": after}, {}) == []  # no RL stage: no gains


def test_two_runs_links_stay_in_their_own_column_in_a_browser(tmp_path, chromium):
    """Long links (an http MLflow URL with no break in it, a long store path) once widened each run's table past
    its column, into the other run's."""
    store = Store(f"file://{tmp_path}")
    for run in ("a", "b"):
        synthetic_run(store, run)
        report = RunReport.load(store, run)
        report.links = {"mlflow": "http://mlflow.example:5000/#/experiments/1/runs/" + "0123456789abcdef" * 8}
        report.save(store)
    page = tmp_path / "two.html"
    page.write_text(render([collect(store, "a"), collect(store, "b")]).html)
    tab = chromium.new_page(viewport={"width": 1400, "height": 900})
    tab.goto(page.as_uri())
    boxes = tab.eval_on_selector_all(
        "#links .runs > div",
        "cols => cols.map(c => [c, c.querySelector('table')].map(e => e.getBoundingClientRect().right))",
    )
    (left_col, left_table), _ = boxes
    assert left_table <= left_col + 1, boxes  # the first run's table ends inside its own column


def test_a_recovery_is_marked_by_its_record_not_by_its_name(tmp_path):
    store = Store(f"file://{tmp_path}")
    report = RunReport(run_id="rec", recipe="micro")
    report.record_stage(StageRecord(name="if_rl", kind="grpo", status="completed"))
    report.record_stage(StageRecord(name="heal", kind="mopd", status="completed", recovers="if_rl"))
    report.record_stage(StageRecord(name="math_rl", kind="grpo", status="failed"))
    for stage in ("if_rl", "heal", "math_rl"):
        report.record_eval(stage, {"math": 0.5})
    report.status, report.stopped = "FAILED", "RuntimeError: cut"
    report.save(store)
    run = collect(store, "rec", ["if_rl", "math_rl"])
    html = render([run]).html
    assert html.count('<tr class="recovery">') == 1 and '<tr class="recovery"><td>heal' in html
    # the recovery is not an unplanned stage: the planned list still says where the run stopped
    assert where_stopped(run) == "stopped at stage math_rl: RuntimeError: cut"


def test_a_curve_of_few_steps_ticks_whole_steps_only(monkeypatch):
    """Three steps drawn: matplotlib's own ticks would be 1.00, 1.25, 1.50, ..., fractions of a step no run takes."""
    from cascade.artifacts import report_figures

    figures = []
    monkeypatch.setattr(report_figures, "_png", lambda fig: figures.append(fig) or b"png")
    rows = [{"step": step, "metrics": {"loss": 1.0 / step, "lr": 1e-3}} for step in range(1, 4)]
    assert report_figures.curves_png("sft", [("r", rows)]) == b"png"
    (figure,) = figures
    panels = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["loss", "learning rate"]
    for ax in panels:
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks == [1, 2, 3], (ax.get_title(), ticks)


def test_a_run_record_naming_the_command_that_serves_mlflow_shows_it_before_the_page(tmp_path):
    """A local MLflow store's run: the record holds the page `mlflow ui` serves and that command; the page is shown
    as text after the command (it opens only once the command runs), not as a link."""
    html = page_with_links(
        tmp_path,
        {
            "mlflow": "http://127.0.0.1:5000/#/experiments/1/runs/abc",
            "mlflow_ui": "mlflow ui --backend-store-uri sqlite:////home/you/.cascade/mlflow.db",
        },
    )
    assert (
        '<tr><td>MLflow run</td><td class="text"><code>mlflow ui --backend-store-uri '
        "sqlite:////home/you/.cascade/mlflow.db</code>, then open <code>http://127.0.0.1:5000/#/experiments/1/runs/abc"
        "</code></td></tr>"
    ) in html
