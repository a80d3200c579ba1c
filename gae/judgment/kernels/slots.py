"""The compiled slot operations every learning rule shares: the mirror of :mod:`gae.judgment.rule`'s.

A prototype slot is found (``taught_slot``), taken for a new prototype (``spawn_slot``,
``take_slot``), started at a decision (``start_prototype``), moved (``step_toward``, and
``push_away`` for a wrong recommendation) and credited (``credit``); each function names its
torch counterpart in :mod:`gae.judgment.primitives` (re-exported by :mod:`gae.judgment.rule`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from gae.judgment.primitives import STATE_LIMIT

STATE_LIMIT32 = np.float32(STATE_LIMIT)  # primitives.STATE_LIMIT: the largest |value| a prototype holds


@numba.njit(inline="always", nogil=True, boundscheck=False)
def clipped(value, do_clip, low32, high32):  # pragma: no cover
    """``value`` clamped to ``[low, high]`` when clipping is on (``rule.clipped``)."""
    return min(max(value, low32), high32) if do_clip else value


@numba.njit(inline="always", nogil=True, boundscheck=False)
def taught_slot(x, b, c, a, centroids, initialized):  # pragma: no cover
    """(slot, unweighted L2 distance) of action ``a``'s nearest prototype in use; (-1, 0) when
    none is (``rule.taught_slot``)."""
    target = -1
    closest = np.float32(np.inf)
    for p in range(centroids.shape[2]):
        if initialized[c, a, p]:
            total = np.float32(0.0)
            for k in range(x.shape[1]):
                diff = x[b, k] - centroids[c, a, p, k]
                total += diff * diff
            if target < 0 or total < closest:  # the first in use, even at an infinite distance
                closest = total
                target = p
    if target < 0:
        return -1, np.float32(0.0)
    return target, np.float32(math.sqrt(closest))


@numba.njit(inline="always", nogil=True, boundscheck=False)
def spawn_slot(c, a, initialized, wins):  # pragma: no cover
    """(slot, recycled) for a new prototype of (c, a): the first free slot, else the one with
    the fewest recent wins (``rule.spawn_slot``)."""
    n_slots = initialized.shape[2]
    for p in range(n_slots):
        if not initialized[c, a, p]:
            return p, False
    free = 0
    for p in range(1, n_slots):
        if wins[c, a, p] < wins[c, a, free]:
            free = p
    return free, True


@numba.njit(inline="always", nogil=True, boundscheck=False)
def take_slot(c, a, initialized, counts, wins):  # pragma: no cover
    """:func:`spawn_slot`, with the slot's count and wins reset: (slot, recycled) (``rule.take_slot``)."""
    target, recycled = spawn_slot(c, a, initialized, wins)
    counts[c, a, target] = 0
    wins[c, a, target] = 0.0
    return target, recycled


@numba.njit(inline="always", nogil=True, boundscheck=False)
def keep_before(b, c, a, p, centroids, before):  # pragma: no cover
    """``before[b]`` := slot ``p`` of (c, a) as it is, before the decision teaches it."""
    for k in range(centroids.shape[3]):
        before[b, k] = centroids[c, a, p, k]


@numba.njit(inline="always", nogil=True, boundscheck=False)
def start_prototype(x, b, c, a, p, centroids, initialized, do_clip, low32, high32):  # pragma: no cover
    """Slot ``p`` of (c, a) set to ``x[b]`` (clipped) and in use: a first touch or a spawn
    (``rule.start_prototype``)."""
    for k in range(x.shape[1]):
        centroids[c, a, p, k] = clipped(x[b, k], do_clip, low32, high32)
    initialized[c, a, p] = True


@numba.njit(inline="always", nogil=True, boundscheck=False)
def step_toward(x, b, c, a, p, eta, centroids, do_clip, low32, high32):  # pragma: no cover
    """``mu <- mu + eta (x - mu)``, clipped: the update every rule makes toward a decision
    (``rule.step_toward``)."""
    for k in range(x.shape[1]):
        value = centroids[c, a, p, k] + eta * (x[b, k] - centroids[c, a, p, k])
        centroids[c, a, p, k] = clipped(value, do_clip, low32, high32)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def push_away(x, b, c, a, p, rate, centroids, do_clip, low32, high32):  # pragma: no cover
    """``mu <- mu - rate (x - mu)``, clipped and held within ``[-STATE_LIMIT, STATE_LIMIT]``: the
    wrongly recommended prototype moved away from ``x[b]`` (``rule.push_away``)."""
    for k in range(x.shape[1]):
        value = clipped(centroids[c, a, p, k] - rate * (x[b, k] - centroids[c, a, p, k]), do_clip, low32, high32)
        centroids[c, a, p, k] = min(max(value, -STATE_LIMIT32), STATE_LIMIT32)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def credit(c, a, p, counts, wins, keep32):  # pragma: no cover
    """Slot ``p`` taught: one more update, and with several slots the action's wins decay and
    ``p`` wins one (``rule.credit``)."""
    counts[c, a, p] += 1
    if wins.shape[2] > 1:
        for q in range(wins.shape[2]):
            wins[c, a, q] *= keep32
        wins[c, a, p] += np.float32(1.0)
