"""The decision weights every judge kind counts with, in plain torch (mirrored by
:mod:`gae.judgment.kernels.judges.weights`): with ``rate_floor = r`` each decision of a category
first multiplies all its weights by ``1 - r``, so the statistics they weigh are those of about the
last ``1 / r`` decisions; with ``r = 0`` every decision counts alike; and the weighted running
mean and variance the judges keep of them (:func:`welford`)."""

from __future__ import annotations

from torch import Tensor

from gae.judgment.float32 import _f32


def count(weights: Tensor, total: Tensor, c: int, a: int, rate_floor: float) -> bool:
    """Count a decision of action ``a`` in category ``c``, in place: decay, then ``total[c]`` and
    ``weights[c, a]`` each + 1. Returns whether the action had no weight before (its first decision)."""
    if rate_floor > 0:
        keep = _f32(1.0) - _f32(rate_floor)
        weights[c] *= keep
        total[c] *= keep
    total[c] += 1.0
    fresh = not bool(weights[c, a] > 0)
    weights[c, a] += 1.0
    return fresh


def welford(weight: Tensor, mean: Tensor, variance: Tensor, x: Tensor) -> None:
    """A weighted Welford step of a running mean and (population) variance, in place: the decision
    already counted in ``weight`` (:func:`count`): ``mean += (x - mean) / weight``,
    ``variance += ((x - mean_before)(x - mean) - variance) / weight``."""
    delta = x - mean
    mean += delta / weight
    variance += (delta * (x - mean) - variance) / weight
