"""The compiled kernels (numba) of :class:`gae.RetrievalMemory`'s single-decision path; their
host is :mod:`gae.models.retrieval_engine`.

The checked path scores and stores through :meth:`gae.EpisodicMemory.retrieve` and
:meth:`gae.EpisodicMemory.add`, batched torch code. Here each kernel mirrors steps of it, named
in its docstring, for one decision, in place on the memory's own buffers. Only steps that IEEE
arithmetic fixes to the bit are transcribed (a subtraction, a product, a division, a comparison,
a sum of two numbers); the steps whose rounding depends on how a library orders its work (vector
norms, ``exp``, the matrix products, a sum of three votes or more) are left to the same torch
calls on tensors of the same shapes and strides, and which of several exactly tied scores make
the top ``k`` is left to ``torch.topk``. So every score, eviction and vote is the checked path's
to the last bit: ``tests/test_retrieval_single.py`` holds the two equal.
"""

from __future__ import annotations

import numba
import numpy as np

REFUSED = 1  # prepare: a factor or the query is not finite or out of range (the checked path says which)
TIED = 1  # top_k_rows: a score equal to the k-th best lies outside the k (torch.topk picks among them)
NOT_A_NUMBER = 2  # top_k_rows: a score is NaN (the checked path handles it)
INCOMPLETE = 3  # top_k_rows: fewer than k memories in reach (the vote abstains)
BAD_LABEL = 1  # scatter_votes: a label is not an action index (the checked path raises)
SUMMED_BY_TORCH = 2  # scatter_votes: three actions or more have votes: their total is torch's to add
FLOAT32_MAX = float(np.finfo(np.float32).max)  # check_factors' bound for a query
_EPS = np.float32(1e-12)  # nnf.normalize's eps
_WEIGHT_FLOOR = np.float32(1e-8)  # _vote's clamp_min
TOTAL_FLOOR = np.float32(1e-30)  # _vote's clamp_min of the total


@numba.njit(cache=True, nogil=True, boundscheck=False)
def prepare(row, bound, center, q, now, created, tau, args, n):  # pragma: no cover
    """The query ``(x - center).to(float32)`` of ``RetrievalMemory._vote`` / ``_store`` into ``q``,
    after ``check_factors``' test of ``row`` (finite, ``|x| <= bound``); and the first ``n``
    exponents ``-(now - created).float() / tau`` of ``EpisodicMemory.retrieve`` (the same as
    ``_eviction_scores`` + ``RetrievalScorer._components``) into ``args``. 0, or REFUSED."""
    for f in range(row.shape[0]):
        if not abs(row[f]) <= bound:  # NaN fails too
            return REFUSED
        q[0, f] = np.float32(row[f]) - np.float32(center)
        if not abs(q[0, f]) <= bound:
            return REFUSED
    for j in range(n):
        args[j] = -np.float32(now - created[j]) / tau[0]
    return 0


@numba.njit(cache=True, nogil=True, boundscheck=False)
def retrieval_terms(q, norm, w, rec, importance, scope, valid_from, valid_until, now, scoped, category, unit,
                    bias):  # pragma: no cover
    """``top_k``'s ``nnf.normalize(queries) * w_sim`` into ``unit`` and ``retrieve``'s
    ``(w_rec * recency + w_imp * importance).masked_fill(~valid, -inf)`` into ``bias``, where a
    memory is valid when ``valid_from <= now < valid_until`` and, when ``scoped``, of scope ``category``."""
    denom = max(norm[0, 0], _EPS)
    for f in range(q.shape[1]):
        unit[0, f] = q[0, f] / denom * w[0]
    for j in range(bias.shape[1]):
        if valid_from[j] <= now and now < valid_until[j] and (not scoped or scope[j] == category):
            bias[0, j] = w[1] * rec[j] + w[2] * importance[j]
        else:
            bias[0, j] = -np.inf


@numba.njit(cache=True, nogil=True, boundscheck=False)
def top_k_rows(block, k, ids, rows, scores, found):  # pragma: no cover
    """``top_k`` of one query in one chunk and ``retrieve``'s padding: the ``k`` best rows of
    ``block`` (1, N), best first, into ``rows`` / ``scores`` and their ``ids`` into ``found``, -1 /
    ``-inf`` past N and -1 where the score is infinite. Returns 0, or INCOMPLETE when a row is -1;
    TIED when a finite score equal to the k-th lies outside the
    ``k`` (which of them ``torch.topk`` keeps is its own affair: ask it); NOT_A_NUMBER for NaN.
    Ties inside the ``k`` may come in another order than torch's: the vote does not see it."""
    n = block.shape[1]
    take = min(k, n)
    count = 0
    for j in range(n):
        v = block[0, j]
        if v != v:
            return NOT_A_NUMBER
        if count == take and not v > scores[take - 1]:
            continue
        pos = min(count, take - 1)
        while pos > 0 and v > scores[pos - 1]:  # after equal scores: the lower row first
            scores[pos] = scores[pos - 1]
            rows[pos] = rows[pos - 1]
            pos -= 1
        scores[pos] = v
        rows[pos] = j
        count = min(count + 1, take)
    for i in range(take, k):
        scores[i] = -np.inf
        rows[i] = -1
    if take and np.isfinite(scores[take - 1]):
        equal = 0
        for j in range(n):
            equal += block[0, j] == scores[take - 1]
        for i in range(take):
            equal -= scores[i] == scores[take - 1]
        if equal:
            return TIED
    status = 0 if take == k else INCOMPLETE
    for i in range(take):
        if not np.isfinite(scores[i]):
            rows[i] = -1
            status = INCOMPLETE
        found[i] = ids[rows[i]] if rows[i] >= 0 else -1
    for i in range(take, k):
        found[i] = -1
    return status


@numba.njit(cache=True, nogil=True, boundscheck=False)
def scatter_votes(scores, labels, votes, total):  # pragma: no cover
    """``_vote``'s ``votes.scatter_add_(1, labels, scores.clamp_min(1e-8))`` for one complete
    query (the weights added in rank order) and, when at most two actions have votes, their
    ``votes.sum(1)`` into ``total``: a sum of two positive numbers and zeros is the same in every
    order. Returns 0; SUMMED_BY_TORCH for more (the order is torch's: ask it); BAD_LABEL, with
    nothing added, for a label that is not an action index (``scatter_add_`` raises)."""
    for i in range(labels.shape[0]):
        if not 0 <= labels[i] < votes.shape[1]:
            return BAD_LABEL
    for a in range(votes.shape[1]):
        votes[0, a] = 0.0
    for i in range(scores.shape[0]):
        votes[0, labels[i]] += max(scores[i], _WEIGHT_FLOOR)
    voted, first = 0, np.float32(0.0)
    for a in range(votes.shape[1]):
        if votes[0, a] > 0:
            if voted == 0:
                first = votes[0, a]
            else:
                total[0, 0] = first + votes[0, a]
            voted += 1
    if voted > 2:
        return SUMMED_BY_TORCH
    if voted == 1:
        total[0, 0] = first
    return 0


@numba.njit(cache=True, nogil=True, boundscheck=False)
def best_share(votes, total):  # pragma: no cover
    """``_vote``'s ``share = votes / total.clamp_min(1e-30)``, ``share.argmax`` (the first of the
    largest) and its share: ``(action, confidence)``."""
    denom = max(total[0, 0], TOTAL_FLOOR)
    best, confidence = 0, votes[0, 0] / denom
    for a in range(1, votes.shape[1]):
        share = votes[0, a] / denom
        if share > confidence:
            best, confidence = a, share
    return best, confidence


@numba.njit(cache=True, nogil=True, boundscheck=False)
def append_row(q, norm, unit, now, scope, embeddings, float32_columns, float64_columns, int64_columns, counters,
               capacity, tau, args):  # pragma: no cover
    """``EpisodicMemory.add`` of one row (importance 1, created at ``now``) up to the eviction:
    ``nnf.normalize`` of the query into ``unit`` and the new row, ``_append`` of its columns and
    the next id, ``size + 1``, ``next_id + 1`` and ``_record``'s ``version + 1`` (``counters`` =
    ``(size, next_id, version_counter)``). When that puts the memory over ``capacity``, the
    exponents of ``_eviction_scores`` over every row go into ``args``. Returns the new id.

    The columns come as ``(importance, confidence)``, ``(created_at, valid_from, valid_until)``
    and ``(ids, scope, memory_type, inserted)``."""
    size, next_id, version = counters
    row, new_id = size[0], next_id[0]
    denom = max(norm[0, 0], _EPS)
    for f in range(q.shape[1]):
        unit[0, f] = q[0, f] / denom
        embeddings[row, f] = unit[0, f]
    float32_columns[0][row] = 1.0
    float32_columns[1][row] = 1.0
    float64_columns[0][row] = now
    float64_columns[1][row] = -np.inf
    float64_columns[2][row] = np.inf
    int64_columns[0][row] = new_id
    int64_columns[1][row] = scope
    int64_columns[2][row] = 0  # 'episode'
    int64_columns[3][row] = new_id
    size[0] = row + 1
    next_id[0] = new_id + 1
    version[0] += 1
    if row + 1 > capacity:
        for j in range(row + 1):
            args[j] = -np.float32(now - float64_columns[0][j]) / tau[0]
    return new_id


@numba.njit(cache=True, nogil=True, boundscheck=False)
def normalize_rows(embeddings, norms, out):  # pragma: no cover
    """``nnf.normalize(embeddings)`` given torch's row norms (M, 1): the rows of ``out``."""
    for j in range(out.shape[0]):
        denom = max(norms[j, 0], _EPS)
        for f in range(out.shape[1]):
            out[j, f] = embeddings[j, f] / denom


@numba.njit(cache=True, nogil=True, boundscheck=False)
def evict_lowest(w, similarity, rec, embeddings, float32_columns, float64_columns, int64_columns,
                 counters):  # pragma: no cover
    """``EpisodicMemory._evict`` of one memory under ``'lowest_score'``: the scores of
    ``RetrievalScorer._scores`` (``w_sim * similarity + w_rec * recency + w_imp * importance``),
    the first row of their stable ascending sort (NaN last), then ``_remove`` of that row (the
    rows after it move up one; the last allocated row keeps its values), ``size - 1`` and
    ``_record``'s ``version + 1``. Returns the row and the id it held."""
    size, version = counters[0], counters[2]
    n = size[0]
    importance = float32_columns[0]
    row, lowest = 0, np.nan
    for j in range(n):
        score = w[0] * similarity[0, j] + w[1] * rec[j] + w[2] * importance[j]
        if score < lowest or (lowest != lowest and score == score):
            row, lowest = j, score
    evicted = int64_columns[0][row]
    for j in range(row, n - 1):
        for f in range(embeddings.shape[1]):
            embeddings[j, f] = embeddings[j + 1, f]
        for column in float32_columns:
            column[j] = column[j + 1]
        for column in float64_columns:
            column[j] = column[j + 1]
        for column in int64_columns:
            column[j] = column[j + 1]
    size[0] = n - 1
    version[0] += 1
    return row, evicted
