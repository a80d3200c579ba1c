"""The compiled mirror (numba) of :mod:`gae.judgment.judges.bins`, function for function.

See :mod:`gae.judgment.kernels.judges.gauss` for the conventions: the bins are computed in
float32 with the reference's operations in its order, so both put a value in the same bin; the
scores' sums run in order (the reference's vectorised sums may associate otherwise).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from gae.compiled import view
from gae.judgment.kernels.judges.weights import count, welford
from gae.judgment.kernels.scoring import VARIANCE_FLOOR32

NEG_INF = np.float32(-np.inf)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bin_of(value, mean, variance, bins, reach):  # pragma: no cover
    """The bin of one criterion's ``value`` (``bins.bin_of``)."""
    n_bins = np.int64(bins)
    if not variance > VARIANCE_FLOOR32:
        return n_bins // 2
    z = (np.float32(value) - mean) / np.float32(math.sqrt(np.float64(variance)))
    position = np.floor((z + np.float32(reach)) * np.float32(bins / (2.0 * reach)))
    if not position >= np.float32(0.0):  # (NaN too: the first bin)
        return np.int64(0)
    if position > np.float32(n_bins - 1):
        return n_bins - 1
    return np.int64(position)


@numba.njit(nogil=True, boundscheck=False)
def log_scores(x, c, weights, total, total_means, total_variances, counts, bins, reach, prior,
               rate_floor, out):  # pragma: no cover
    """``out`` (A,) := each action's score for ``x`` in category ``c`` (``bins.log_scores``)."""
    n_actions, n_factors = counts.shape[1], counts.shape[2]
    prior32 = np.float32(prior)
    spread32 = prior32 * np.float32(bins)
    log_total = np.float32(math.log(max(total[c], np.float32(1e-30))))
    for a in range(n_actions):
        weight = weights[c, a]
        if not weight > 0:
            out[a] = NEG_INF
            continue
        log_norm = np.float32(math.log(weight + spread32))
        likelihood = np.float32(0.0)
        for k in range(n_factors):
            if not total_variances[c, k] > VARIANCE_FLOOR32:  # a criterion that has not varied is left out
                continue
            b = bin_of(x[k], total_means[c, k], total_variances[c, k], bins, reach)
            likelihood += np.float32(math.log(counts[c, a, k, b] + prior32)) - log_norm
        out[a] = likelihood + (np.float32(math.log(weight)) - log_total)


@numba.njit(nogil=True, boundscheck=False)
def learn(x, c, a, weights, total, total_means, total_variances, counts, bins, reach, prior,
          rate_floor):  # pragma: no cover
    """Learn one verified decision, in place (``bins.learn``)."""
    count(weights, total, c, a, rate_floor)
    if rate_floor > 0:
        keep = np.float32(1.0) - np.float32(rate_floor)
        for j in range(counts.shape[1]):
            for k in range(counts.shape[2]):
                for b in range(counts.shape[3]):
                    counts[c, j, k, b] *= keep
    welford(total[c], total_means[c], total_variances[c], x)
    for k in range(counts.shape[2]):
        counts[c, a, k, bin_of(x[k], total_means[c, k], total_variances[c, k], bins, reach)] += np.float32(1.0)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bind(addresses, shapes, first):  # pragma: no cover
    """The judge's buffers, in ``BUFFERS`` order, from an :class:`gae.compiled.ArrayTable` of
    them at ``first``."""
    s, f32 = shapes, np.float32
    return (view(addresses[first], (s[first, 0], s[first, 1]), f32),
            view(addresses[first + 1], (s[first + 1, 0],), f32),
            view(addresses[first + 2], (s[first + 2, 0], s[first + 2, 1]), f32),
            view(addresses[first + 3], (s[first + 3, 0], s[first + 3, 1]), f32),
            view(addresses[first + 4], (s[first + 4, 0], s[first + 4, 1], s[first + 4, 2], s[first + 4, 3]), f32))


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bound_log_scores(x, c, addresses, shapes, first, params, out):  # pragma: no cover
    """:func:`log_scores` of the judge whose buffers :func:`bind` finds, ``params`` its ``Options.params()``."""
    weights, total, total_means, total_variances, counts = bind(addresses, shapes, first)
    log_scores(x, c, weights, total, total_means, total_variances, counts, params[0], params[1], params[2],
               params[3], out)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bound_learn(x, c, a, addresses, shapes, first, params):  # pragma: no cover
    """:func:`learn` of the judge whose buffers :func:`bind` finds, ``params`` its ``Options.params()``."""
    weights, total, total_means, total_variances, counts = bind(addresses, shapes, first)
    learn(x, c, a, weights, total, total_means, total_variances, counts, params[0], params[1], params[2], params[3])


@numba.njit(nogil=True, boundscheck=False, cache=True)
def score(x, category, weights, total, total_means, total_variances, counts, bins, reach, prior, rate_floor,
          out):  # pragma: no cover
    """``out[b]`` := decision b's scores (batched scoring, nothing learned)."""
    for b in range(x.shape[0]):
        log_scores(x[b], category[b], weights, total, total_means, total_variances, counts, bins, reach, prior,
                   rate_floor, out[b])


@numba.njit(nogil=True, boundscheck=False, cache=True)
def prequential(x, category, action, skip, weights, total, total_means, total_variances, counts, bins, reach, prior,
                rate_floor, out):  # pragma: no cover
    """``out[b]`` := decision b's scores before learning it, then learn it unless skipped."""
    for b in range(x.shape[0]):
        c = category[b]
        log_scores(x[b], c, weights, total, total_means, total_variances, counts, bins, reach, prior, rate_floor,
                   out[b])
        if not skip[b]:
            learn(x[b], c, action[b], weights, total, total_means, total_variances, counts, bins, reach, prior,
                  rate_floor)
