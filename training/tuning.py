"""The strongest baselines: the k-NN grid run on the tuning seeds, its sensitivity table, and the choice.

Every point of :data:`training.evaluation.GRID` (capacity x k x flat/scoped, for plain k-NN
and for k-NN with an ADWIN window cut) runs on every setting's *tuning* seeds. Per setting,
the contestant ``knn_best`` takes the plain k-NN point with the best mean cumulative accuracy
and ``knn_adwin`` the best ADWIN point; both then run on the *report* seeds, which no choice
has seen. The table of every point is the report's ``sensitivity`` record.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from training.evaluation import GRID, KNN_CAPACITIES, KNN_KS, RECOVERY_AFTER, TUNED
from training.stats import bootstrap_ci

CHOICE_METRIC = "cumulative"  # what the tuning maximises (the mean over the tuning seeds)
SENSITIVITY_METRICS = ("cumulative", "at_recovery_point")


def sensitivity(runs: dict[str, dict[str, list[dict[str, float]]]], resamples: int) -> dict[str, Any]:
    """Per setting, every grid point's figures over the tuning seeds (mean [95% CI]) and the
    points ``knn_best`` and ``knn_adwin`` choose.

    Args:
        runs: ``runs[setting][grid point]``, one dict per tuning seed with the figures of
            :data:`SENSITIVITY_METRICS` (as :func:`training.evaluation.run_stream` returns them).
        resamples: bootstrap resamples over the tuning seeds.

    Returns:
        ``{setting: {"rows": [...], "chosen": {contestant: grid point}}}``; a row names its
        ``kind``, ``capacity``, ``k`` and ``scoped`` and has an interval per metric. Ties go
        to the point first in grid order (flat before scoped, smaller capacity, smaller k).
    """
    table: dict[str, Any] = {}
    for setting, by_point in runs.items():
        rows = []
        for name, seeds in by_point.items():
            options = GRID[name].options
            row: dict[str, Any] = {"name": name, "kind": GRID[name].kind, "capacity": options["capacity"],
                                   "k": options["k"], "scoped": options["scoped"]}
            for key in SENSITIVITY_METRICS:
                ci = bootstrap_ci(np.array([seed[key] for seed in seeds]), resamples=resamples)
                row[key] = {"mean": ci.mean, "low": ci.low, "high": ci.high}
            rows.append(row)
        chosen = {}
        for contestant, kind in TUNED.items():
            candidates = [row for row in rows if row["kind"] == kind]
            if candidates:
                best = max(candidates, key=lambda row: row[CHOICE_METRIC]["mean"])  # max keeps the first of ties
                chosen[contestant] = best["name"]
        table[setting] = {"rows": rows, "chosen": chosen}
    return table


def chosen_options(table: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{setting: {contestant: its options}}`` from a :func:`sensitivity` table, for ``run_stream``."""
    return {setting: {contestant: dict(GRID[name].options) for contestant, name in entry["chosen"].items()}
            for setting, entry in table.items()}


def sensitivity_table(table: dict[str, Any], setting: str, kind: str = "knn",
                      metric: str = CHOICE_METRIC) -> str:
    """Markdown: one row per capacity, one column per k and scope, the metric's mean over the
    tuning seeds in %, the chosen point in bold."""
    entry = table[setting]
    rows = {(row["capacity"], row["k"], row["scoped"]): row for row in entry["rows"] if row["kind"] == kind}
    chosen = {name for name in entry["chosen"].values()}
    columns = [(k, scoped) for scoped in (False, True) for k in KNN_KS]
    lines = ["| capacity | " + " | ".join(f"k={k} {'scoped' if scoped else 'flat'}" for k, scoped in columns) + " |",
             "|---:" + "|---:" * len(columns) + "|"]
    for capacity in KNN_CAPACITIES:
        cells = []
        for k, scoped in columns:
            row = rows.get((capacity, k, scoped))
            if row is None:
                cells.append("—")
                continue
            text = f"{100 * row[metric]['mean']:.1f}"
            cells.append(f"**{text}**" if row["name"] in chosen else text)
        lines.append(f"| {capacity} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def choices_table(table: dict[str, Any]) -> str:
    """Markdown: per setting, the point each tuned contestant chose and its figures on the tuning seeds."""
    lines = ["| setting | contestant | capacity | k | scoped | cumulative accuracy, tuning seeds (%) | "
             f"rolling accuracy {RECOVERY_AFTER} after the middle, tuning seeds (%) |",
             "|---|---|---:|---:|---|---:|---:|"]
    for setting, entry in table.items():
        rows = {row["name"]: row for row in entry["rows"]}
        for contestant, name in entry["chosen"].items():
            row = rows[name]
            cells = [f"{100 * row[key]['mean']:.1f} [{100 * row[key]['low']:.1f}, {100 * row[key]['high']:.1f}]"
                     for key in SENSITIVITY_METRICS]
            lines.append(f"| {setting} | {contestant} | {row['capacity']} | {row['k']} | "
                         f"{'yes' if row['scoped'] else 'no'} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
