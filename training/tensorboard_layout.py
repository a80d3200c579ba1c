r"""One TensorBoard run per memory, one chart per metric with every run on it, the drift on its own chart.

The training module writes each memory into its own run, a subfolder of the logger's version
(``version_0/seed``, ``version_0/recommended``, ``version_0/knn``), under the same tag names
(``acc/rolling``, ``acc/cumulative``, ...). TensorBoard's Time Series and Scalars tabs draw one
tag of every run on one card, one colour per run, so the memories compare on one chart with no
layout at all. The module also writes a Custom Scalars layout (``SummaryWriter.add_custom_scalars``)
to the version's own run: one category, ``memories``, with one multiline chart per metric that
every memory logs (:func:`compared_charts`; the Custom Scalars tab matches a chart's tag regex
in every run, so each chart holds every memory), and a category ``stream`` with the drift chart.

When the stream drifts, the version's own run logs :data:`DRIFT_MARKER` on its own chart (never
on a rate's axis): at the decision step :math:`s` (decisions ``0 .. s - 1`` seen) it is

.. math::
    \text{marker}(s) = \frac{|\{d \in D : d < s\}|}{|D|}

for the stream's drift points :math:`D` (0-based indices of the first decision of each new
world): 0 before the drift and 1 from the first step that holds a decision after it, a staircase
of equal steps when the stream drifts several times. TensorBoard joins points with straight
lines, so the marker is also logged at both sides of each edge (steps ``d`` and ``d + 1``), which
keeps the edge vertical however thinly the curves are logged.

The tags in a layout are regular expressions that TensorBoard matches at the start of each tag
name; each is escaped and anchored at the end, so that it names one tag.

Examples::

    >>> compared_charts({"seed": ["acc/rolling", "gate/rate"], "knn": ["acc/rolling", "curve/rolling"]})
    ['acc/rolling']
    >>> layout = custom_scalars_layout(["acc/rolling"], marker=True)
    >>> layout["memories"]["acc/rolling"], layout["stream"][DRIFT_MARKER]
    (['Multiline', ['acc/rolling$']], ['Multiline', ['stream/drift$']])
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

DRIFT_MARKER = "stream/drift"


def compared_charts(run_tags: Mapping[str, Iterable[str]]) -> list[str]:
    """The tags every run of ``run_tags`` (run name -> the scalar tags it logged) logged, in the order
    of the first run's tags: the metrics on which all the memories compare."""
    runs = [list(tags) for tags in run_tags.values()]
    if not runs:
        return []
    common = set(runs[0]).intersection(*runs[1:])
    return list(dict.fromkeys(tag for tag in runs[0] if tag in common))


def custom_scalars_layout(charts: Sequence[str], *, marker: bool) -> dict[str, dict[str, list[Any]]]:
    """The layout for ``SummaryWriter.add_custom_scalars``: category ``memories`` with one multiline
    chart per tag of ``charts`` (every run's series of that tag), and, if ``marker``, category
    ``stream`` with :data:`DRIFT_MARKER` on its own chart."""
    layout: dict[str, dict[str, list[Any]]] = {"memories": {tag: ["Multiline", [re.escape(tag) + "$"]]
                                                            for tag in charts}}
    if marker:
        layout["stream"] = {DRIFT_MARKER: ["Multiline", [re.escape(DRIFT_MARKER) + "$"]]}
    return layout


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
