"""The run report's figures, drawn with matplotlib (Agg) as PNG bytes: the forgetting matrix as a heatmap, and each
training stage's curves, a panel per metric group (artifacts/html_report.py places them on the page)."""

from __future__ import annotations

import io
import math
from typing import Any

# Curve panels: title, and the metric names (or a name ending in "/": every metric with that prefix) drawn on it.
PANELS: list[tuple[str, list[str]]] = [
    ("reward (mean)", ["reward", "reward/"]),
    ("share of groups kept", ["kept_groups"]),
    ("response length (tokens)", ["response_length"]),
    ("entropy", ["entropy"]),
    ("loss", ["loss"]),
    ("grad norm", ["grad_norm"]),
    ("logprob mismatch |log pi_train - log pi_inf|, mean and max", ["logprob_mismatch", "logprob_mismatch_max"]),
    ("share of tokens importance-corrected (truncated or masked)", ["is_corrected", "truncated_fraction"]),
    ("MOPD reverse KL per domain", ["reverse_kl/"]),
    ("reward model accuracy", ["accuracy", "rm_accuracy", "train_accuracy", "heldout_accuracy"]),
    # RLHF: a reward model's score beside the hidden rubric it should track; reward hacking is where they part
    ("reward model score vs hidden rubric", ["rm_score", "rubric_score"]),
    ("corr(reward model, rubric) over the step's rollouts", ["rm_rubric_corr"]),
    ("KL to the reference", ["kl"]),
    ("learning rate", ["lr"]),
]
# drawn on the panel's right-hand axis: the rubric is a 0-1 score beside a reward model's unbounded one, and on one
# axis its trend would be flattened to a line
RIGHT_AXIS = {"rubric_score"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _pyplot().close(fig)
    return buf.getvalue()


def heatmap_png(run_id: str, domains: list[str], rows: list[dict[str, Any]]) -> bytes | None:
    """The forgetting matrix as a heatmap: `domains` and the rows of html_report.matrix_cells."""
    if not rows:
        return None
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    values = [[c["score"] if c["score"] is not None else float("nan") for c in r["cells"]] for r in rows]
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(domains), 1.0 + 0.62 * len(rows)))
    image = ax.imshow(
        values,
        cmap="viridis",
        vmin=0.0,
        vmax=max(1e-6, max((v for r in values for v in r if v == v), default=1.0)),
        aspect="auto",
    )
    for i, r in enumerate(rows):
        for j, c in enumerate(r["cells"]):
            if c["score"] is None:
                continue
            text = f"{c['score']:.3f}" + (f"\n±{c['se']:.3f}" if c["se"] is not None else "")
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="black" if c["score"] > 0.6 * image.norm.vmax else "white",
                fontweight="bold" if c["best"] else "normal",
            )
            if c["best"]:
                ax.add_patch(Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, lw=2.5, ec="gold"))
            if domains[j] in r["gate"]:
                ax.add_patch(Rectangle((j - 0.42, i - 0.42), 0.84, 0.84, fill=False, lw=2, ec="red", ls="--"))
    labels = [
        r["stage"]
        + (" [gate: " + ", ".join(r["gate"]) + "]" if r["gate"] else "")
        + (" [recovery]" if r["recovery"] else "")
        for r in rows
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xticks(range(len(domains)), domains, fontsize=8)
    ax.set_xlabel("score ± SE; gold: best in column; red dashed: gate fired", fontsize=7)
    ax.set_title(f"{run_id}: held-out score after each stage", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def _series(rows: list[dict[str, Any]], names: list[str]) -> dict[str, tuple[list[int], list[float]]]:
    found: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for metric, value in row["metrics"].items():
            if any(metric == n or (n.endswith("/") and metric.startswith(n)) for n in names):
                xs, ys = found.setdefault(metric, ([], []))
                xs.append(row["step"])
                ys.append(value)
    return found


def curves_png(stage: str, runs: list[tuple[str, list[dict[str, Any]]]]) -> bytes | None:
    """One figure per stage: a panel per curve that has data, each run a line style (two runs: a comparison)."""
    panels = [(title, [(label, _series(rows, names)) for label, rows in runs]) for title, names in PANELS]
    panels = [(t, per_run) for t, per_run in panels if any(s for _, s in per_run)]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    cols = min(4, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.4 * nrows), squeeze=False)
    styles = ["-", "--"]
    for ax, (title, per_run) in zip(axes.flat, panels):
        right = None
        for k, (label, series) in enumerate(per_run):
            for n, (metric, (xs, ys)) in enumerate(sorted(series.items())):
                name = metric if len(series) > 1 else ""
                tag = " ".join(p for p in (label if len(runs) > 1 else "", name) if p)
                on = ax
                if metric in RIGHT_AXIS:
                    right = right or ax.twinx()
                    on = right
                    right.tick_params(labelsize=7)
                on.plot(xs, ys, styles[k % 2], color=f"C{n}", marker="." if len(xs) < 30 else None, label=tag or None)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a run of few steps got ticks at fractions of a step
        ax.tick_params(labelsize=7)
        handles, labels = ax.get_legend_handles_labels()
        if right is not None:  # one legend for both axes
            more_handles, more_labels = right.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        if handles:
            ax.legend(handles, labels, fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"stage {stage}", fontsize=9)
    fig.tight_layout()
    return _png(fig)
