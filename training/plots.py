"""Figures for TensorBoard and PNG files. matplotlib is imported lazily, with the Agg backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor


def attention_heatmap(attention: Tensor, category_names: Sequence[str], factor_names: Sequence[str],
                      title: str = "criterion attention") -> Any:
    """A (categories x criteria) heatmap of attention weights, each cell annotated.

    Args:
        attention: (C, K) weights (``JudgmentMemory.criterion_attention()``; 1 = neutral).
        category_names: C row labels.
        factor_names: K column labels.

    Returns:
        a ``matplotlib.figure.Figure`` (the caller closes it, or hands it to
        ``SummaryWriter.add_figure`` which does).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    values = attention.detach().cpu().float().numpy()
    n_categories, n_factors = values.shape
    figure = Figure(figsize=(1.0 + 0.9 * n_factors, 1.0 + 0.6 * n_categories), layout="constrained")
    axes = figure.add_subplot()
    # centred on 1 (the neutral weight) so up- and down-weighted criteria read at a glance
    spread = max(float(abs(values - 1.0).max()), 1e-3)
    image = axes.imshow(values, cmap="RdBu_r", vmin=1.0 - spread, vmax=1.0 + spread, aspect="auto")
    axes.set_xticks(range(n_factors), list(factor_names), rotation=45, ha="right")
    axes.set_yticks(range(n_categories), list(category_names))
    for row in range(n_categories):
        for col in range(n_factors):
            strong = abs(values[row, col] - 1.0) > 0.6 * spread  # dark cell: white text
            axes.text(col, row, f"{values[row, col]:.2f}", ha="center", va="center", fontsize=8,
                      color="white" if strong else "black")
    axes.set_title(title)
    figure.colorbar(image, ax=axes, label="weight (1 = neutral)")
    return figure
