"""The compiled k-NN loop (numba) behind :class:`gae.KNNMemory`'s exact online engine.

Its plain torch counterpart is :func:`gae.models.knn_engine.knn_prequential_reference`;
the tests hold the two equal. It trusts its inputs. The batched engine runs it on private
copies of the ring; :func:`knn_one`, the single-decision path, checks its one row first and
then works in place on the memory's own buffers (nothing after the check can fail).
"""

from __future__ import annotations

import math

import numba
import numpy as np

NOT_FINITE = -2  # knn_one: a factor is NaN, infinite or beyond the limit (the checked path says which)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def knn_loop(store_x, store_action, store_category, store_step, ring, k, scoped, respect_skip,
             x, category, action, skip, first_step,
             probs, out_action, confidence, applied, skipped, near_ids, near_dist, learn=True):  # pragma: no cover
    """k-NN score-before-learn over a batch; ``ring = [size, head]`` is updated in place
    (``learn=False``: score only, the ring untouched).

    Neighbours are visited oldest first and replace a kept one only when strictly closer,
    which reproduces the stable sort of the original implementation; the winning action is
    the first, in neighbour order, whose vote total is the maximum (the original's dict order).
    ``near_ids`` / ``near_dist`` (B, k) receive each decision's neighbours (their decisions'
    sequence numbers and distances, nearest first; -1 / inf past the traces in reach).
    """
    n_decisions, n_factors = x.shape
    capacity = store_x.shape[0]
    n_actions = probs.shape[1]
    nb_dist = np.empty(k, np.float64)
    nb_action = np.empty(k, np.int64)
    nb_step = np.empty(k, np.int64)
    votes = np.empty(n_actions, np.float64)
    for b in range(n_decisions):
        size, head = ring[0], ring[1]
        oldest = (head - size) % capacity
        found = 0
        for j in range(size):
            slot = (oldest + j) % capacity
            if scoped and store_category[slot] != category[b]:
                continue
            total = 0.0
            for f in range(n_factors):
                diff = np.float64(x[b, f]) - np.float64(store_x[slot, f])
                total += diff * diff
            d = math.sqrt(total)
            pos = min(found, k)
            while pos > 0 and d < nb_dist[pos - 1]:
                if pos < k:
                    nb_dist[pos] = nb_dist[pos - 1]
                    nb_action[pos] = nb_action[pos - 1]
                    nb_step[pos] = nb_step[pos - 1]
                pos -= 1
            if pos < k:
                nb_dist[pos] = d
                nb_action[pos] = store_action[slot]
                nb_step[pos] = store_step[slot]
            found += 1
        for j in range(k):
            near_ids[b, j] = nb_step[j] if j < found else -1
            near_dist[b, j] = nb_dist[j] if j < found else np.inf
        if found < k:
            for a in range(n_actions):
                probs[b, a] = 0.0
            out_action[b] = -1
            confidence[b] = 0.0
        else:
            votes[:] = 0.0
            for j in range(k):
                votes[nb_action[j]] += 1.0 / (nb_dist[j] + 1e-8)
            total_votes = 0.0
            for a in range(n_actions):
                total_votes += votes[a]
            best = nb_action[0]
            for j in range(1, k):
                if votes[nb_action[j]] > votes[best]:
                    best = nb_action[j]
            for a in range(n_actions):
                probs[b, a] = votes[a] / total_votes
            out_action[b] = best
            confidence[b] = votes[best] / total_votes
        if not learn:
            continue
        if respect_skip and skip[b]:
            skipped[b] = True
            continue
        for f in range(n_factors):
            store_x[head, f] = x[b, f]
        store_action[head] = action[b]
        store_category[head] = category[b]
        store_step[head] = first_step + b
        ring[1] = (head + 1) % capacity
        ring[0] = min(size + 1, capacity)
        applied[b] = True


@numba.njit(cache=True, nogil=True, boundscheck=False)
def knn_one(row, limit, c, a, is_skipped, learn, store_x, store_action, store_category, store_step, ring, k, scoped,
            respect_skip, first_step, x, category, action, skip, probs, out_action, confidence, applied, skipped,
            near_ids, near_dist):  # pragma: no cover
    """One decision (``row``, any real dtype, rounded to float32 as the checked path does) as a
    batch of one in the preallocated arrays ``x`` ... ``near_dist``: scored, and learned when
    ``learn``. Returns 0, or NOT_FINITE with nothing changed."""
    for f in range(row.shape[0]):
        x[0, f] = np.float32(row[f])  # a value beyond float32 becomes inf, refused below
        if not math.isfinite(x[0, f]) or abs(row[f]) > limit:
            return NOT_FINITE
    category[0] = c
    action[0] = a
    skip[0] = is_skipped
    applied[0] = False
    skipped[0] = False
    knn_loop(store_x, store_action, store_category, store_step, ring, k, scoped, respect_skip, x, category, action,
             skip, first_step, probs, out_action, confidence, applied, skipped, near_ids, near_dist, learn)
    return 0
