"""The compiled mirror of :mod:`gae.judgment.judges.weights`."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(inline="always", nogil=True, boundscheck=False)
def count(weights, total, c, a, rate_floor):  # pragma: no cover
    """Count a decision of ``a`` in ``c``, in place; whether it is the action's first (``weights.count``)."""
    if rate_floor > 0:
        keep = np.float32(1.0) - np.float32(rate_floor)
        for b in range(weights.shape[1]):
            weights[c, b] *= keep
        total[c] *= keep
    total[c] += np.float32(1.0)
    fresh = not weights[c, a] > 0
    weights[c, a] += np.float32(1.0)
    return fresh


@numba.njit(inline="always", nogil=True, boundscheck=False)
def welford(weight, mean, variance, x):  # pragma: no cover
    """A weighted Welford step, in place (``weights.welford``)."""
    for k in range(mean.shape[0]):
        delta = np.float32(x[k]) - mean[k]
        mean[k] += delta / weight
        variance[k] += (delta * (np.float32(x[k]) - mean[k]) - variance[k]) / weight
