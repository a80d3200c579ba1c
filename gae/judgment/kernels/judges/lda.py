"""The compiled mirror (numba) of :mod:`gae.judgment.judges.lda`, function for function.

See :mod:`gae.judgment.kernels.judges.gauss` for the conventions. The precision is computed in
float64 as the reference computes it (``cholesky_inverse``, in the same order), then rounded.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from gae.compiled import view
from gae.judgment.float32 import VARIANCE_FLOOR
from gae.judgment.kernels.judges.weights import count

RIDGE = 1e-3  # lda.RIDGE
NEG_INF = np.float32(-np.inf)


@numba.njit(nogil=True, boundscheck=False)
def log_scores(x, c, weights, means, total, decisions, covariance, precision, shrinkage, rate_floor, refresh,
               out):  # pragma: no cover
    """``out`` (A,) := each action's score for ``x`` in category ``c`` (``lda.log_scores``)."""
    n_actions, n_factors = means.shape[1], means.shape[2]
    log_total = np.float32(math.log(max(total[c], np.float32(1e-30))))
    diff = np.empty(n_factors, np.float32)
    for a in range(n_actions):
        weight = weights[c, a]
        if not weight > 0:
            out[a] = NEG_INF
            continue
        for k in range(n_factors):
            diff[k] = np.float32(x[k]) - means[c, a, k]
        quadratic = np.float32(0.0)  # the precision is symmetric: each off-diagonal pair once, doubled
        for k in range(n_factors):
            row = np.float32(0.0)
            for i in range(k):
                row += precision[c, k, i] * diff[i]
            quadratic += (np.float32(2.0) * row + precision[c, k, k] * diff[k]) * diff[k]
        out[a] = (np.float32(math.log(weight)) - log_total) - np.float32(0.5) * quadratic


@numba.njit(nogil=True, boundscheck=False)
def cholesky_inverse(sigma):  # pragma: no cover
    """The inverse of a symmetric positive definite float64 matrix through its Cholesky factor
    (``lda.cholesky_inverse``)."""
    n = sigma.shape[0]
    lower = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            total = 0.0
            for m in range(j):
                total += lower[i, m] * lower[j, m]
            total = sigma[i, j] - total
            lower[i, j] = math.sqrt(total) if i == j else total / lower[j, j]
    inverse_lower = np.zeros((n, n))
    for i in range(n):
        inverse_lower[i, i] = 1.0 / lower[i, i]
        for j in range(i):
            total = 0.0
            for m in range(j, i):
                total += lower[i, m] * inverse_lower[m, j]
            inverse_lower[i, j] = -total / lower[i, i]
    inverse = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            total = 0.0
            for m in range(max(i, j), n):
                total += inverse_lower[m, i] * inverse_lower[m, j]
            inverse[i, j] = total
    return inverse


@numba.njit(nogil=True, boundscheck=False)
def between(means, weights):  # pragma: no cover
    """(K,) float64 the weighted variance of one category's action means (``lda.between``)."""
    n_actions, n = means.shape
    total = 0.0
    centre = np.zeros(n)
    for a in range(n_actions):
        if weights[a] > 0:
            total += np.float64(weights[a])
            for k in range(n):
                centre[k] += np.float64(weights[a]) * np.float64(means[a, k])
    if total <= 0:
        return centre
    for k in range(n):
        centre[k] = centre[k] / total
    spread = np.zeros(n)
    for a in range(n_actions):
        if weights[a] > 0:
            for k in range(n):
                d = np.float64(means[a, k]) - centre[k]
                spread[k] += np.float64(weights[a]) * (d * d)
    for k in range(n):
        spread[k] = spread[k] / total
    return spread


@numba.njit(nogil=True, boundscheck=False)
def precision_of(covariance, means, weights, shrinkage, out):  # pragma: no cover
    """``out`` (K, K) := the precision of one category's covariance, its actions' means and weights
    (``lda.precision``)."""
    n = covariance.shape[0]
    sigma = np.empty((n, n))
    total = between(means, weights)
    varied = np.empty(n, np.bool_)
    for k in range(n):
        total[k] = np.float64(covariance[k, k]) + total[k]
        varied[k] = total[k] > VARIANCE_FLOOR
    for i in range(n):
        for j in range(n):
            value = (1.0 - shrinkage) * np.float64(covariance[i, j]) if varied[i] and varied[j] else 0.0
            if i == j:
                value += shrinkage * np.float64(covariance[i, i]) + RIDGE * total[i] if varied[i] else 1.0
            sigma[i, j] = value
    inverse = cholesky_inverse(sigma)
    for i in range(n):
        for j in range(n):
            out[i, j] = np.float32(inverse[i, j]) if varied[i] and varied[j] else np.float32(0.0)


@numba.njit(nogil=True, boundscheck=False)
def learn(x, c, a, weights, means, total, decisions, covariance, precision, shrinkage, rate_floor,
          refresh):  # pragma: no cover
    """Learn one verified decision, in place (``lda.learn``)."""
    n_factors = means.shape[2]
    fresh = count(weights, total, c, a, rate_floor)
    decisions[c] += 1
    if fresh:
        for k in range(n_factors):
            means[c, a, k] = np.float32(x[k])
    delta = np.empty(n_factors, np.float32)
    for k in range(n_factors):
        delta[k] = np.float32(x[k]) - means[c, a, k]
    for i in range(n_factors):
        for j in range(n_factors):
            covariance[c, i, j] += (delta[i] * delta[j] - covariance[c, i, j]) / total[c]
    for k in range(n_factors):
        means[c, a, k] += delta[k] / weights[c, a]
    seen = decisions[c]
    every = np.int64(refresh)
    if seen <= every or seen % every == 0:
        precision_of(covariance[c], means[c], weights[c], shrinkage, precision[c])


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bind(addresses, shapes, first):  # pragma: no cover
    """The judge's buffers, in ``BUFFERS`` order, from an :class:`gae.compiled.ArrayTable` of
    them at ``first``."""
    s, f32 = shapes, np.float32
    return (view(addresses[first], (s[first, 0], s[first, 1]), f32),
            view(addresses[first + 1], (s[first + 1, 0], s[first + 1, 1], s[first + 1, 2]), f32),
            view(addresses[first + 2], (s[first + 2, 0],), f32),
            view(addresses[first + 3], (s[first + 3, 0],), np.int64),
            view(addresses[first + 4], (s[first + 4, 0], s[first + 4, 1], s[first + 4, 2]), f32),
            view(addresses[first + 5], (s[first + 5, 0], s[first + 5, 1], s[first + 5, 2]), f32))


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bound_log_scores(x, c, addresses, shapes, first, params, out):  # pragma: no cover
    """:func:`log_scores` of the judge whose buffers :func:`bind` finds, ``params`` its ``Options.params()``."""
    weights, means, total, decisions, covariance, precision = bind(addresses, shapes, first)
    log_scores(x, c, weights, means, total, decisions, covariance, precision, params[0], params[1], params[2], out)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def bound_learn(x, c, a, addresses, shapes, first, params):  # pragma: no cover
    """:func:`learn` of the judge whose buffers :func:`bind` finds, ``params`` its ``Options.params()``."""
    weights, means, total, decisions, covariance, precision = bind(addresses, shapes, first)
    learn(x, c, a, weights, means, total, decisions, covariance, precision, params[0], params[1], params[2])


@numba.njit(nogil=True, boundscheck=False, cache=True)
def score(x, category, weights, means, total, decisions,
          covariance, precision, shrinkage, rate_floor, refresh, out):  # pragma: no cover
    """``out[b]`` := decision b's scores (batched scoring, nothing learned)."""
    for b in range(x.shape[0]):
        log_scores(x[b], category[b], weights, means, total, decisions,
                   covariance, precision, shrinkage, rate_floor, refresh, out[b])


@numba.njit(nogil=True, boundscheck=False, cache=True)
def prequential(x, category, action, skip, weights, means, total, decisions, covariance, precision, shrinkage,
                rate_floor, refresh, out):  # pragma: no cover
    """``out[b]`` := decision b's scores before learning it, then learn it unless skipped."""
    for b in range(x.shape[0]):
        c = category[b]
        log_scores(x[b], c, weights, means, total, decisions, covariance, precision, shrinkage, rate_floor, refresh,
                   out[b])
        if not skip[b]:
            learn(x[b], c, action[b], weights, means, total, decisions, covariance, precision, shrinkage,
                  rate_floor, refresh)
