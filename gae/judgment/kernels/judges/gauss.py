"""The compiled mirror (numba) of :mod:`gae.judgment.judges.gauss`, function for function.

``log_scores`` scores one decision, ``learn`` learns one, ``prequential`` scores then learns a
batch in stream order; the arrays are the judge's buffers in ``BUFFERS`` order and ``params``
its ``Options.params()``. Sums run in order, in float32 as the reference's terms are, so the two
agree to float32 rounding (the reference's vectorised sums may associate otherwise).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from gae.compiled import view
from gae.judgment.float32 import SPREAD_FLOOR
from gae.judgment.kernels.judges.weights import count, welford
from gae.judgment.kernels.scoring import VARIANCE_FLOOR32

SPREAD_FLOOR32 = np.float32(SPREAD_FLOOR)
HALF_LOG_2PI32 = np.float32(0.5 * math.log(2.0 * math.pi))
NEG_INF = np.float32(-np.inf)


@numba.njit(nogil=True, boundscheck=False)
def log_scores(x, c, weights, means, variances, total, total_means, total_variances, rate_floor, prior,
               out):  # pragma: no cover
    """``out`` (A,) := each action's score for ``x`` in category ``c`` (``gauss.log_scores``)."""
    n_actions, n_factors = means.shape[1], means.shape[2]
    prior32 = np.float32(prior)
    log_total = np.float32(math.log(max(total[c], np.float32(1e-30))))
    for a in range(n_actions):
        weight = weights[c, a]
        if not weight > 0:
            out[a] = NEG_INF
            continue
        log_det = np.float32(0.0)
        quadratic = np.float32(0.0)
        for k in range(n_factors):
            if not total_variances[c, k] > VARIANCE_FLOOR32:  # a criterion that has not varied is left out
                continue
            spread = max((weight * variances[c, a, k] + prior32 * total_variances[c, k]) / (weight + prior32),
                         SPREAD_FLOOR32)
            diff = np.float32(x[k]) - means[c, a, k]
            log_det += np.float32(0.5) * np.float32(math.log(spread))
            quadratic += diff * diff / (np.float32(2.0) * spread)
        likelihood = -(HALF_LOG_2PI32 * np.float32(n_factors) + log_det + quadratic)
        out[a] = likelihood + (np.float32(math.log(weight)) - log_total)


@numba.njit(nogil=True, boundscheck=False)
def learn(x, c, a, weights, means, variances, total, total_means, total_variances, rate_floor,
          prior):  # pragma: no cover
    """Learn one verified decision, in place (``gauss.learn``)."""
    fresh = count(weights, total, c, a, rate_floor)
    welford(total[c], total_means[c], total_variances[c], x)
    if fresh:
        for k in range(means.shape[2]):
            means[c, a, k] = np.float32(x[k])
            variances[c, a, k] = np.float32(0.0)
        return
    welford(weights[c, a], means[c, a], variances[c, a], x)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bind(addresses, shapes, first):  # pragma: no cover
    """The judge's buffers, in ``BUFFERS`` order, from an :class:`gae.compiled.ArrayTable` of
    them at ``first``."""
    s, f32 = shapes, np.float32
    return (view(addresses[first], (s[first, 0], s[first, 1]), f32),
            view(addresses[first + 1], (s[first + 1, 0], s[first + 1, 1], s[first + 1, 2]), f32),
            view(addresses[first + 2], (s[first + 2, 0], s[first + 2, 1], s[first + 2, 2]), f32),
            view(addresses[first + 3], (s[first + 3, 0],), f32),
            view(addresses[first + 4], (s[first + 4, 0], s[first + 4, 1]), f32),
            view(addresses[first + 5], (s[first + 5, 0], s[first + 5, 1]), f32))


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bound_log_scores(x, c, addresses, shapes, first, params, out):  # pragma: no cover
    """:func:`log_scores` of the judge whose buffers :func:`bind` finds, ``params`` its ``Options.params()``."""
    weights, means, variances, total, total_means, total_variances = bind(addresses, shapes, first)
    log_scores(x, c, weights, means, variances, total, total_means, total_variances, params[0], params[1], out)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bound_learn(x, c, a, addresses, shapes, first, params):  # pragma: no cover
    """:func:`learn` of the judge whose buffers :func:`bind` finds, ``params`` its ``Options.params()``."""
    weights, means, variances, total, total_means, total_variances = bind(addresses, shapes, first)
    learn(x, c, a, weights, means, variances, total, total_means, total_variances, params[0], params[1])


@numba.njit(nogil=True, boundscheck=False, cache=True)
def score(x, category, weights, means, variances, total,
          total_means, total_variances, rate_floor, prior, out):  # pragma: no cover
    """``out[b]`` := decision b's scores (batched scoring, nothing learned)."""
    for b in range(x.shape[0]):
        log_scores(x[b], category[b], weights, means, variances, total,
                   total_means, total_variances, rate_floor, prior, out[b])


@numba.njit(nogil=True, boundscheck=False, cache=True)
def prequential(x, category, action, skip, weights, means, variances, total, total_means, total_variances,
                rate_floor, prior, out):  # pragma: no cover
    """``out[b]`` := decision b's scores before learning it, then learn it unless skipped."""
    for b in range(x.shape[0]):
        c = category[b]
        log_scores(x[b], c, weights, means, variances, total, total_means, total_variances, rate_floor, prior,
                   out[b])
        if not skip[b]:
            learn(x[b], c, action[b], weights, means, variances, total, total_means, total_variances, rate_floor,
                  prior)
