"""The compiled ``learning='lvq'`` step: the mirror of :mod:`gae.judgment.lvq`, function for function.

See :mod:`gae.judgment.kernels` for the conventions; the online loop
(:func:`gae.judgment.kernels.learning.prequential`) calls :func:`lvq_step` for each verified decision.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from gae.judgment.kernels.scoring import (
    NEG_INF,
    VARIANCE_FLOOR32,
    distance,
    metric_row,
    pooled_spread,
    relevance,
    relevance_norm,
    spread,
)
from gae.judgment.kernels.slots import credit, keep_before, push_away, start_prototype, step_toward, take_slot
from gae.judgment.lvq import TINY

TINY32 = np.float32(TINY)  # lvq.TINY: the smallest normal float32


@numba.njit(inline="always", nogil=True, boundscheck=False)
def observe(x, b, c, counts, means, variances):  # pragma: no cover
    """Category ``c``'s running mean and variance take ``x[b]`` (``lvq.observe``)."""
    counts[c] += 1
    n = np.float32(counts[c])
    for k in range(x.shape[1]):
        delta = x[b, k] - means[c, k]
        means[c, k] += delta / n
        variances[c, k] += (delta * (x[b, k] - means[c, k]) - variances[c, k]) / n


@numba.njit(inline="always", nogil=True, boundscheck=False)
def miss(x, b, c, a, weights, centroids, initialized, wins, penalty32):  # pragma: no cover
    """Every prototype in use of another action nearer to ``x[b]`` than action ``a``'s nearest loses
    ``miss_penalty`` of its wins (``lvq.miss``)."""
    own = np.float32(np.inf)
    found = False
    for p in range(centroids.shape[2]):
        if initialized[c, a, p]:
            own = min(own, distance(x, b, weights, c, centroids, a, p))
            found = True
    if not found:
        return
    for j in range(centroids.shape[1]):
        for p in range(centroids.shape[2]):
            if j != a and initialized[c, j, p] and distance(x, b, weights, c, centroids, j, p) < own:
                wins[c, j, p] *= np.float32(1.0) - penalty32


@numba.njit(inline="always", nogil=True, boundscheck=False)
def lvq_rate(count, floor32):  # pragma: no cover
    """``max(1 / (count + 1), rate_floor)`` (``lvq.lvq_rate``)."""
    return max(np.float32(1.0) / (np.float32(count) + np.float32(1.0)), floor32)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def rate_floor(c, wrong, recent_errors, options):  # pragma: no cover
    """Category ``c``'s recent error rate takes one decision, in place, and its step sizes' floor
    (``lvq.rate_floor``)."""
    recent_errors[c] += np.float32(options.error_decay) * (np.float32(1.0 if wrong else 0.0) - recent_errors[c])
    return max(np.float32(options.rate_floor), np.float32(options.rate_per_error) * recent_errors[c])


@numba.njit(inline="always", nogil=True, boundscheck=False)
def relevance_step(x, b, c, a, p, r, q, alpha, centroids, variances, relevance_logits, rate32,
                   pooled):  # pragma: no cover
    """One GRLVQ step of category ``c``'s relevance logits (``lvq.relevance_step``)."""
    top, total = relevance_norm(relevance_logits, c)
    common = pooled_spread(variances, c) if pooled else VARIANCE_FLOOR32
    d_own = np.float32(0.0)
    d_rival = np.float32(0.0)
    for k in range(x.shape[1]):
        scale = alpha[c, k] / spread(variances, c, k, pooled, common)
        own = x[b, k] - centroids[c, a, p, k]
        rival = x[b, k] - centroids[c, r, q, k]
        lam = relevance(relevance_logits, c, k, top, total)
        d_own += lam * (scale * (own * own))
        d_rival += lam * (scale * (rival * rival))
    both = d_own + d_rival
    if not (both > 0 and both < np.inf):  # (NaN fails too)
        return
    square = both * both
    exact = square >= TINY32 and square < np.inf  # the formula as written, where every step it takes is finite
    if exact:
        for k in range(x.shape[1]):
            scale = alpha[c, k] / spread(variances, c, k, pooled, common)
            own = x[b, k] - centroids[c, a, p, k]
            rival = x[b, k] - centroids[c, r, q, k]
            gradient = np.float32(2.0) * (d_rival * (scale * (own * own)) - d_own * (scale * (rival * rival))) / square
            if not math.isfinite(gradient):  # (then its step, times a relevance in [0, 1], is not either)
                exact = False
                break
    for k in range(x.shape[1]):  # each relevance from the logits before this step: top and total are theirs
        scale = alpha[c, k] / spread(variances, c, k, pooled, common)
        own = x[b, k] - centroids[c, a, p, k]
        rival = x[b, k] - centroids[c, r, q, k]
        lam = relevance(relevance_logits, c, k, top, total)
        if exact:
            gradient = np.float32(2.0) * (d_rival * (scale * (own * own)) - d_own * (scale * (rival * rival))) / square
            step = lam * gradient
        else:  # rescaled, every factor in [0, 1] (lvq.relevance_step)
            step = np.float32(2.0) * ((d_rival / both) * (lam * (scale * (own * own)) / both)
                                      - (d_own / both) * (lam * (scale * (rival * rival)) / both))
        relevance_logits[c, k] -= rate32 * step


@numba.njit(inline="always", nogil=True, boundscheck=False)
def rival_action(logits, b, a):  # pragma: no cover
    """The best-scoring action other than ``a``, -1 when none scored (``lvq.rival_action``)."""
    rival = -1
    best = NEG_INF
    for j in range(logits.shape[1]):
        if j != a and logits[b, j] > best:
            best = logits[b, j]
            rival = j
    return rival


@numba.njit(nogil=True, boundscheck=False)
def lvq_step(x, b, c, a, recommended, nearest, logits, alpha, weights, centroids, initialized, counts, wins,
             input_counts, means, variances, relevance_logits, recent_errors, factor_counts, factor_means,
             factor_variances, before, options):  # pragma: no cover
    """Learn one verified decision with ``learning='lvq'`` (``lvq.lvq_step``): returns ``(slot,
    eta, distance, fresh, spawned, recycled)`` and writes the slot's row before the update into
    ``before[b]``; ``weights`` is scratch for the category's metric."""
    n_slots = centroids.shape[2]
    do_clip, low32, high32 = options.clip, np.float32(options.clip_low), np.float32(options.clip_high)
    observe(x, b, c, input_counts, means, variances)
    observe(x, b, 0, factor_counts, factor_means, factor_variances)
    units = factor_variances if options.memory_units else variances  # (rule.unit_variances)
    wrong = recommended != a
    floor32 = rate_floor(c, wrong, recent_errors, options)
    metric_row(weights, c, alpha, relevance_logits, units, c, options.pooled)
    if n_slots > 1 and options.miss_penalty > 0:
        miss(x, b, c, a, weights, centroids, initialized, wins, np.float32(options.miss_penalty))
    target = -1
    nearest_distance = np.float32(0.0)
    for p in range(n_slots):  # the nearest prototype in use under the metric
        if initialized[c, a, p]:
            d = distance(x, b, weights, c, centroids, a, p)
            if target < 0 or d < nearest_distance:
                nearest_distance = d
                target = p
    spawned = False
    recycled = False
    if target < 0:  # a first touch
        target = 0
        fresh = True
    else:
        rival = rival_action(logits, b, a)
        if options.relevance_rate > 0 and rival >= 0:
            relevance_step(x, b, c, a, target, rival, nearest[b, rival], alpha, centroids, units,
                           relevance_logits, np.float32(options.relevance_rate), options.pooled)
        spawned = n_slots > 1 and wrong and nearest_distance > options.spawn_threshold
        fresh = spawned
        if spawned:
            target, recycled = take_slot(c, a, initialized, counts, wins)
    keep_before(b, c, a, target, centroids, before)
    if fresh:
        start_prototype(x, b, c, a, target, centroids, initialized, do_clip, low32, high32)
        eta = np.float32(1.0)
    else:
        eta = lvq_rate(counts[c, a, target], floor32)
        step_toward(x, b, c, a, target, eta, centroids, do_clip, low32, high32)
    credit(c, a, target, counts, wins, np.float32(1.0) - np.float32(options.win_decay))
    if wrong and recommended >= 0 and options.push_rate > 0:  # away from x: a negative step
        q = nearest[b, recommended]
        rate = np.float32(options.push_rate) * lvq_rate(counts[c, recommended, q], floor32)
        push_away(x, b, c, recommended, q, rate, centroids, do_clip, low32, high32)
    return target, eta, nearest_distance, fresh, spawned, recycled
