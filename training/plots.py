"""Figures for TensorBoard and PNG files. matplotlib is imported lazily, with the Agg backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor


def criterion_weights(weights: Tensor, factor_names: Sequence[str], title: str) -> Any:
    """One category's weight of each criterion as horizontal bars around the neutral 1, each labelled.

    Sized to read at TensorBoard's default image size (a card about 400 pixels wide): one image
    per category, criteria down the side, the value at each bar's end.

    Args:
        weights: (K,) weights (a row of ``JudgmentMemory.criterion_attention()``, or K x a row of
            ``relevances()``; 1 = neutral).
        factor_names: K criterion labels.
        title: the figure's title (the category and what the weights are).

    Returns:
        a ``matplotlib.figure.Figure`` (the caller closes it, or hands it to
        ``SummaryWriter.add_figure`` which does).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    values = weights.detach().cpu().float().numpy()
    if values.ndim != 1 or values.shape[0] != len(factor_names):
        raise ValueError(f"weights must be (K,) with K = {len(factor_names)} factor names, got {tuple(values.shape)}")
    rows = range(len(values))
    figure = Figure(figsize=(4.8, 1.2 + 0.36 * len(values)), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    # bars from the neutral 1, red above it (weighted up), blue below (weighted down)
    colours = ["#c0392b" if value >= 1.0 else "#2e6da4" for value in values]
    axes.barh(rows, values - 1.0, left=1.0, color=colours, height=0.7)
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_yticks(list(rows), list(factor_names), fontsize=12)
    axes.invert_yaxis()  # the first criterion on top
    top = max(float(abs(values - 1.0).max()), 0.05)
    low = 1.0 - 1.35 * top
    axes.set_xlim(max(low, 0.0) if bool((values >= 0).all()) else low, 1.0 + 1.35 * top)  # weights are >= 0
    for row, value in zip(rows, values, strict=True):
        axes.text(value, row, f" {value:.2f} " if value >= 1.0 else f" {value:.2f} ", fontsize=11, va="center",
                  ha="left" if value >= 1.0 else "right")
    axes.tick_params(axis="x", labelsize=10)
    axes.set_title(title, fontsize=13)
    axes.set_xlabel("weight (1 = neutral)", fontsize=11)
    return figure
