r"""One TensorBoard chart per compared metric, with every memory on it and the stream's drift marked.

Each memory logs its metrics under its own tags (``acc/rolling_jm``, ``acc/rolling_knn``), which
TensorBoard's Scalars tab draws on separate cards with separate y-ranges. The training module
therefore also writes a Custom Scalars layout (``SummaryWriter.add_custom_scalars``): one
category (``jm vs knn``) with one multiline chart per metric that every memory logs, titled by the
metric (``acc/rolling``) and holding each memory's tag. The charts are derived from the tags
actually logged, by their ``_<memory>`` suffix (:func:`compared_charts`); the metrics compared are
those of :class:`~training.metrics.StreamMetrics` and the rolling curve, and nothing here lists them.

When the stream drifts, a ``drift/marker`` scalar is logged too and drawn on every chart: at the
decision step :math:`s` (decisions ``0 .. s - 1`` seen) it is

.. math::
    \text{marker}(s) = \frac{|\{d \in D : d < s\}|}{|D|}

for the stream's drift points :math:`D` (0-based indices of the first decision of each new
world): 0 before the drift and 1 from the first step that holds a decision after it, a staircase
of equal steps when the stream drifts several times. TensorBoard's multiline chart joins points
with straight lines, so the marker is also logged at both sides of each edge (steps ``d`` and
``d + 1``), which keeps the edge vertical however thinly the curves are logged.

The tags in a layout are regular expressions that TensorBoard matches at the start of each tag
name; each is escaped and anchored at the end, so that it names one tag.

Examples::

    >>> charts = compared_charts(["acc/rolling_jm", "gate/rate", "acc/rolling_knn", "curve/rolling_jm"],
    ...                          ("jm", "knn"))
    >>> charts
    {'acc/rolling': ['acc/rolling_jm', 'acc/rolling_knn'], 'curve/rolling': ['curve/rolling_jm']}
    >>> custom_scalars_layout(charts, ("jm", "knn"), marker=True)["jm vs knn"]["acc/rolling"]
    ['Multiline', ['acc/rolling_jm$', 'acc/rolling_knn$', 'drift/marker$']]
    >>> [drift_marker((100, 300), step) for step in (100, 101, 300, 301)]
    [0.0, 0.5, 0.5, 1.0]
    >>> marker_steps((100,), first=91, last=120, steps=[100, 110, 120])
    [100, 101, 110, 120]
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["DRIFT_MARKER", "compared_charts", "custom_scalars_layout", "drift_marker",
           "drift_points", "marker_steps"]

DRIFT_MARKER = "drift/marker"


def compared_charts(tags: Iterable[str], memories: Sequence[str]) -> dict[str, list[str]]:
    """The per-memory tags (``<metric>_<memory>``) grouped by metric, in the order the metrics first
    appear, each metric's tags in the order of ``memories``. Tags of no memory are left out."""
    charts: dict[str, dict[str, str]] = {}
    for tag in tags:
        memory = next((name for name in memories if tag.endswith(f"_{name}")), None)
        if memory is not None:
            charts.setdefault(tag[:-len(memory) - 1], {})[memory] = tag
    return {metric: [by_memory[name] for name in memories if name in by_memory]
            for metric, by_memory in charts.items()}


def custom_scalars_layout(charts: Mapping[str, Sequence[str]], memories: Sequence[str], *,
                          marker: bool) -> dict[str, dict[str, list[Any]]]:
    """The layout for ``SummaryWriter.add_custom_scalars``: one category, ``'<memory> vs <memory>'``,
    with one multiline chart per metric of ``charts``, plus :data:`DRIFT_MARKER` on each if ``marker``."""
    extra = [DRIFT_MARKER] if marker else []
    return {" vs ".join(memories): {metric: ["Multiline", [re.escape(tag) + "$" for tag in (*tags, *extra)]]
                                    for metric, tags in charts.items()}}


def drift_points(stream: object) -> tuple[int, ...]:
    """The decisions at which ``stream`` changes, sorted: its ``drift_at`` (a DecisionStream's; a
    scikit-learn stream's holds its permutation), an int, a sequence of ints or None, and missing on a
    stream that never drifts (then ``()``)."""
    value = getattr(stream, "drift_at", None)
    if value is None:
        return ()
    return tuple(sorted({int(value)} if isinstance(value, numbers.Integral) else {int(point) for point in value}))


def drift_marker(points: Sequence[int], step: int) -> float:
    """The marker at decision step ``step``: the fraction of the drift ``points`` below it (see the module)."""
    return sum(point < step for point in points) / len(points)


def marker_steps(points: Sequence[int], *, first: int, last: int, steps: Iterable[int]) -> list[int]:
    """The steps at which a batch whose steps run from ``first`` to ``last`` logs the marker, sorted:
    ``steps`` (those of its curves) and both sides of each drift edge that falls in the batch."""
    edges = {step for point in points for step in (point, point + 1) if first <= step <= last}
    return sorted({*steps, *edges})
