"""Report figures over stream seeds: rolling accuracy with bootstrap bands, an ablation forest plot, and
the k-NN sensitivity panels.

matplotlib is imported lazily, with the Agg backend; each function returns a Figure and the
caller saves it (``fig.savefig(path, dpi=100)``). Intervals come from :mod:`training.stats`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def rolling_accuracy_figure(curves: Mapping[str, Sequence[Any]], drift_at: int | Sequence[int] | None = None, *,
                            mark_at: int | None = None, title: str = "rolling accuracy over stream seeds") -> Any:
    """Mean rolling accuracy per contestant as a line, its bootstrap interval as a shaded band.

    Args:
        curves: contestant name -> an :class:`~training.stats.Interval` of (T,) curves, or any
            ``(mean, low, high)`` of (T,) arrays. NaN leaves a gap; lengths may differ by contestant.
        drift_at: index (0-based) of the first decision after each drift, as in
            :func:`~training.stats.recovery_decisions`; drawn as a dashed line between decisions
            ``drift_at`` and ``drift_at + 1`` (1-based). ``None`` for no drift.
        mark_at: a decision (1-based) to mark on every curve, its value given in the legend.
        title: the axes title.

    Returns:
        a ``matplotlib.figure.Figure`` 11 x 5 inches (1100 x 500 px at dpi 100).
    """
    _use_agg()
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("curves must name at least one contestant")
    figure = Figure(figsize=(11, 5), layout="constrained")
    axes = figure.add_subplot()
    colours = _colours(len(curves))
    for colour, (name, curve) in zip(colours, curves.items(), strict=True):
        mean, low, high = _as_band(name, curve)
        decision = np.arange(1, mean.shape[0] + 1)
        label = name
        if mark_at is not None:
            _check_decision("mark_at", mark_at, mean.shape[0], name)
            value = mean[mark_at - 1]
            label = f"{name} ({'n/a' if np.isnan(value) else f'{value:.3f}'} at {mark_at:,})"
            axes.plot(mark_at, value, marker="o", markersize=7, color=colour, markeredgecolor="white", zorder=4)
        axes.fill_between(decision, low, high, color=colour, alpha=0.2, linewidth=0)
        axes.plot(decision, mean, color=colour, linewidth=1.6, label=label)
    for index, drift in enumerate(_drifts(drift_at)):
        # the drift falls between the last old decision and the first new one
        axes.axvline(drift + 0.5, color="0.3", linestyle="--", linewidth=1.1,
                     label="drift" if index == 0 else None)
        axes.annotate(f"drift after {drift:,}", xy=(drift + 0.5, 0.02), xycoords=("data", "axes fraction"),
                      xytext=(4, 0), textcoords="offset points", fontsize=9, color="0.3")
    if mark_at is not None:
        axes.axvline(mark_at, color="0.55", linestyle=":", linewidth=1.0)
    axes.set_ylim(0, 1)
    axes.set_xlim(left=1)
    axes.set_xlabel("decision")
    axes.set_ylabel("rolling accuracy")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    # outside the axes so no band is ever hidden behind it
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title=_band_note(curves))
    return figure


def ablations_figure(differences: Mapping[str, Sequence[Any]], *, reference: Mapping[str, Sequence[Any]] | None = None,
                     reference_label: str = "reference", scale: float = 100.0,
                     title: str = "ablations: paired difference to the full model") -> Any:
    """A forest plot: one row per ablation, mean paired difference and its interval, a line at 0.

    Args:
        differences: ablation label -> an :class:`~training.stats.Interval` (scalar fields) of a
            paired difference (:func:`~training.stats.paired_difference`), top row first.
        reference: label -> an earlier figure for the same row (e.g. the original claim), drawn as
            a hollow marker with a thin bar just below the measured one. Every label must be a row.
        reference_label: the legend entry for the reference markers (e.g. ``"original claim"``).
        scale: multiplies every value; 100 turns accuracy fractions into percentage points.
        title: the axes title.

    Returns:
        a ``matplotlib.figure.Figure``; each row's figures are also written at its right end.
    """
    _use_agg()
    from matplotlib.figure import Figure

    if not differences:
        raise ValueError("differences must name at least one ablation")
    reference = dict(reference or {})
    unknown = sorted(set(reference) - set(differences))
    if unknown:
        raise ValueError(f"reference labels must be rows of differences, got unknown {unknown}")
    rows = len(differences)
    figure = Figure(figsize=(9, 1.4 + 0.55 * rows), layout="constrained")
    axes = figure.add_subplot()
    axes.axvline(0, color="0.3", linewidth=1.0)
    level, reference_shown = None, False
    for row, (label, interval) in enumerate(differences.items()):
        mean, low, high = (scale * value for value in _as_point(label, interval))
        level = _level(interval) or level
        # offset the measured point up and the reference down only when both share the row
        lift = 0.12 if label in reference else 0.0
        axes.errorbar(mean, row - lift, xerr=[[mean - low], [high - mean]], fmt="o", color="C0", capsize=3,
                      markersize=6, label="measured" if row == 0 else None)
        axes.annotate(f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]", xy=(1.0, row - lift),
                      xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points",
                      va="center", fontsize=9, color="C0")
        if label in reference:
            ref_mean, ref_low, ref_high = (scale * value for value in _as_point(label, reference[label]))
            axes.errorbar(ref_mean, row + lift, xerr=[[ref_mean - ref_low], [ref_high - ref_mean]], fmt="o",
                          color="C1", markerfacecolor="white", capsize=3, markersize=6, elinewidth=1.0,
                          label=None if reference_shown else reference_label)
            reference_shown = True
            axes.annotate(f"{ref_mean:+.1f} [{ref_low:+.1f}, {ref_high:+.1f}]", xy=(1.0, row + lift),
                          xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points",
                          va="center", fontsize=9, color="C1")
    axes.set_yticks(range(rows), list(differences))
    axes.set_ylim(rows - 0.5, -0.5)  # first ablation on top, as listed
    unit = "pp" if scale == 100.0 else f"x {scale:g}"
    interval_note = f"{level:.0%} bootstrap interval" if level else "interval"
    axes.set_xlabel(f"paired difference ({unit}), {interval_note}")
    axes.set_title(title)
    axes.grid(axis="x", alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, frameon=False, fontsize=9)
    return figure


def sensitivity_figure(table: Mapping[str, Any], *, metric: str = "cumulative",
                       title: str = "k-NN sensitivity: cumulative accuracy over the tuning seeds") -> Any:
    """One panel per setting: a k-NN grid's metric against its capacity (log scale), one line per
    k, scoped solid and flat dashed, and the best k-NN with an ADWIN window cut per capacity
    dotted in black; the points the tuned contestants chose are circled.

    Args:
        table: :func:`training.tuning.sensitivity`'s record, ``{setting: {"rows", "chosen"}}``.
        metric: the row figure drawn (its ``mean``).
        title: the figure's title.

    Returns:
        a ``matplotlib.figure.Figure``, four panels a row.
    """
    _use_agg()
    from matplotlib.figure import Figure

    if not table:
        raise ValueError("table must hold at least one setting")
    columns = min(4, len(table))
    rows = -(-len(table) // columns)
    figure = Figure(figsize=(3.6 * columns, 2.9 * rows + 0.8), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False, sharex=True)
    ks = sorted({row["k"] for entry in table.values() for row in entry["rows"]})
    colours = dict(zip(ks, _colours(len(ks)), strict=True))
    for axes, (setting, entry) in zip(grid.flat, table.items(), strict=False):
        plain = [row for row in entry["rows"] if row["kind"] == "knn"]
        for k in ks:
            for scoped in (True, False):
                points = sorted((row["capacity"], row[metric]["mean"]) for row in plain
                                if row["k"] == k and row["scoped"] == scoped)
                if points:
                    x, y = zip(*points, strict=True)
                    axes.plot(x, y, color=colours[k], linestyle="-" if scoped else "--", linewidth=1.3,
                              label=f"k={k}, {'scoped' if scoped else 'flat'}")
        adwin: dict[int, float] = {}
        for row in entry["rows"]:
            if row["kind"] == "knn_adwin":
                adwin[row["capacity"]] = max(adwin.get(row["capacity"], -np.inf), row[metric]["mean"])
        if adwin:
            x, y = zip(*sorted(adwin.items()), strict=True)
            axes.plot(x, y, color="black", linestyle=":", linewidth=1.5, label="k-NN + ADWIN (best k, scope)")
        by_name = {row["name"]: row for row in entry["rows"]}
        for name in entry["chosen"].values():
            axes.plot(by_name[name]["capacity"], by_name[name][metric]["mean"], marker="o", markersize=9,
                      markerfacecolor="none", markeredgecolor="red", linestyle="none")
        axes.set_xscale("log", base=2)
        capacities = sorted({row["capacity"] for row in entry["rows"]})
        axes.set_xticks(capacities, labels=[str(c) for c in capacities], fontsize=8)
        axes.minorticks_off()
        axes.set_title(setting, fontsize=10)
        axes.grid(alpha=0.3)
    for axes in list(grid.flat)[len(table):]:
        axes.set_visible(False)
    for axes in grid[:, 0]:
        axes.set_ylabel("accuracy")
    for axes in grid[-1, :]:
        axes.set_xlabel("capacity")
    handles, labels = grid.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(5, len(labels)), frameon=False, fontsize=8)
    figure.suptitle(f"{title} (red circles: the chosen points)")
    return figure


def _use_agg() -> None:
    import matplotlib

    matplotlib.use("Agg")


def _colours(count: int) -> list[Any]:
    from matplotlib import colormaps

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    return [palette(i % palette.N) for i in range(count)]


def _as_band(name: str, curve: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        mean, low, high = (np.asarray(part, dtype=np.float64) for part in tuple(curve)[:3])
    except (TypeError, ValueError) as error:
        raise ValueError(f"curves[{name!r}] must be (mean, low, high) numeric arrays: {error}") from None
    if mean.ndim != 1 or mean.shape[0] == 0 or low.shape != mean.shape or high.shape != mean.shape:
        raise ValueError(f"curves[{name!r}] must be (mean, low, high) of one (T,) shape, "
                         f"got {mean.shape}, {low.shape}, {high.shape}")
    return mean, low, high


def _as_point(label: str, interval: Sequence[Any]) -> tuple[float, float, float]:
    try:
        mean, low, high = (float(part) for part in tuple(interval)[:3])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{label!r} must be an Interval or (mean, low, high) of numbers: {error}") from None
    return mean, low, high


def _level(interval: Any) -> float | None:
    return getattr(interval, "level", None)


def _band_note(curves: Mapping[str, Sequence[Any]]) -> str:
    levels = {_level(curve) for curve in curves.values()}
    level = levels.pop() if len(levels) == 1 else None
    return f"band: {level:.0%} bootstrap interval" if level else "band: interval"


def _drifts(drift_at: int | Sequence[int] | None) -> list[int]:
    if drift_at is None:
        return []
    drifts = [drift_at] if isinstance(drift_at, (int, np.integer)) else list(drift_at)
    for drift in drifts:
        if not isinstance(drift, (int, np.integer)) or isinstance(drift, bool) or drift < 0:
            raise ValueError(f"drift_at must be a non-negative int or a list of them, got {drift_at!r}")
    return drifts


def _check_decision(name: str, decision: Any, length: int, contestant: str) -> None:
    if not isinstance(decision, (int, np.integer)) or isinstance(decision, bool) or not 1 <= decision <= length:
        raise ValueError(f"{name} must be a decision in [1, {length}] (curve {contestant!r}), got {decision!r}")
