"""bench_learning.py's verdict and table: each side's mean and paired gain over SFT on the same items, ours - TRL
with its standard error, and the reward curves of both trainers."""

from __future__ import annotations

from pathlib import Path

from cascade.artifacts.html_report import paired_gain
from cascade.artifacts.score_columns import GREEDY, ScoreColumn

CURVE_ENDS = 5  # steps averaged at each end of a reward curve in the table
PARITY = "parity holds"
SHORTFALL = "ours gains less than TRL: a bug to find"


def verdict(gain: float, se: float | None) -> str:
    """Parity: ours - TRL at least -1 SE (no spread, so no SE: at least 0)."""
    return PARITY if gain >= -(se or 0.0) else SHORTFALL


def summarize(sides: dict[str, dict], domain: str) -> dict:
    """sides: "sft", "ours", "trl" -> {"scores": column -> item id -> score, ...}. Per side the mean of each
    column (the primary metric, greedy beside it where the eval samples) and, for the trained sides, the paired
    gain over SFT (gain, SE); ours - TRL on the primary metric with its verdict."""
    columns = [c for c in (domain, ScoreColumn(domain, metric=GREEDY).key) if c in sides["sft"]["scores"]]
    start = sides["sft"]["scores"]
    summary: dict = {"columns": columns, "sides": {}}
    for name, side in sides.items():
        scores = side["scores"]
        summary["sides"][name] = {
            "mean": {c: sum(scores[c].values()) / len(scores[c]) for c in columns},
            "gain": {} if name == "sft" else {c: paired_gain(start[c], scores[c]) for c in columns},
        }
    gain, se = paired_gain(sides["trl"]["scores"][domain], sides["ours"]["scores"][domain])
    summary["ours_minus_trl"] = (gain, se)
    summary["verdict"] = verdict(gain, se)
    return summary


def format_gain(gain: tuple[float, float | None] | None) -> str:
    if gain is None:
        return "-"
    value, se = gain
    return f"{value:+.3f} ± {se:.3f} ({value / se:+.1f} SE)" if se else f"{value:+.3f} ± 0"


def render(sides: dict[str, dict], summary: dict) -> str:
    """The table (markdown) and the ours - TRL line with its verdict."""
    primary, greedy = (summary["columns"] + [None])[:2]
    lines = [
        f"| side | steps | seconds | reward first {CURVE_ENDS} | reward last {CURVE_ENDS} | {primary} | "
        f"gain vs SFT | {greedy or 'greedy'} | greedy gain |",
        "|" + " --- |" * 9,
    ]
    for name, side in sides.items():
        row, reward = summary["sides"][name], side.get("reward")
        ends = [
            f"{sum(part) / len(part):.3f}" if part else "-"
            for part in ((reward[:CURVE_ENDS], reward[-CURVE_ENDS:]) if reward else ([], []))
        ]
        cells = [
            name,
            str(side.get("steps", "-")),
            f"{side['seconds']:.1f}" if "seconds" in side else "-",
            *ends,
            f"{row['mean'][primary]:.3f}",
            format_gain(row["gain"].get(primary)),
            f"{row['mean'][greedy]:.3f}" if greedy else "-",
            format_gain(row["gain"].get(greedy)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"ours - TRL: {format_gain(summary['ours_minus_trl'])}: {summary['verdict']}")
    return "\n".join(lines)


def plot_rewards(sides: dict[str, dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in ("ours", "trl"):
        ax.plot(range(1, len(sides[name]["reward"]) + 1), sides[name]["reward"], marker=".", label=name)
    ax.set(xlabel="step", ylabel="mean reward", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
