"""Every judge of a memory in one compiled call, for the single-decision path
(:class:`gae.judgment.judged.JudgeHost`).

Calling each judge's kernel from Python costs more than the kernel itself (each call unboxes a
dozen arrays), so :func:`decide` does one decision's whole work in one call, in the order the
per-judge calls do it: every judge's ``log_scores``, the mixture
(:func:`gae.judgment.kernels.trust.judge_one`, with the trust step when learning), then every
judge's ``learn``: the same kernels on the same arrays, so the same numbers.

The arrays come as one :class:`gae.compiled.ArrayTable`: first ``trust_weights``, ``scores``,
``vote``, ``logits`` and ``probs`` (``TABLE_HEAD``), then each judge's buffers in its kind's
``BUFFERS`` order. ``judges`` (J, 2) int64 holds each judge's kind code (its index in ``KINDS``)
and the table index of its first buffer, ``params`` (J, P) float64 its ``Options.params()``
(padded). A kind's module binds its own buffers and parameters (its ``bind``,
``bound_log_scores`` and ``bound_learn``); adding a kind adds it to ``KINDS`` and one branch to
:func:`log_scores` and :func:`learn` here.
"""

from __future__ import annotations

import numba
import numpy as np

from gae.compiled import view
from gae.judgment.kernels.judges import bins, gauss, lda
from gae.judgment.kernels.trust import judge_one

KINDS = ("gauss", "lda", "bins")  # a kind's code is its index
TABLE_HEAD = ("trust_weights", "scores", "vote", "logits", "probs")  # the table's first arrays, then the judges'


@numba.njit(inline="always", nogil=True, boundscheck=False)
def log_scores(kind, x, c, addresses, shapes, first, params, out):  # pragma: no cover
    """``out`` (A,) := the scores of the judge of ``kind`` whose buffers start at ``first``."""
    if kind == 0:
        gauss.bound_log_scores(x, c, addresses, shapes, first, params, out)
    elif kind == 1:
        lda.bound_log_scores(x, c, addresses, shapes, first, params, out)
    elif kind == 2:
        bins.bound_log_scores(x, c, addresses, shapes, first, params, out)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def learn(kind, x, c, a, addresses, shapes, first, params):  # pragma: no cover
    """The judge of ``kind`` whose buffers start at ``first`` learns ``x`` as verified ``a``, in place."""
    if kind == 0:
        gauss.bound_learn(x, c, a, addresses, shapes, first, params)
    elif kind == 1:
        lda.bound_learn(x, c, a, addresses, shapes, first, params)
    elif kind == 2:
        bins.bound_learn(x, c, a, addresses, shapes, first, params)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def decide(x, c, a, own, own_logits, addresses, shapes, judges, params, rate, share, floor,
           min_confidence):  # pragma: no cover
    """One decision of every judge and their mixture: ``scores`` row 0 := the prototypes' (A,)
    ``own`` probabilities, or (``own_logits``) logits, rows 1.. the judges' scores, the mixture
    into ``probs`` and ``logits``, and with ``a >= 0`` the trust step then every judge learning
    ``x`` as verified ``a``. Returns ``(action, confidence)``."""
    s, f32 = shapes, np.float32
    trust = view(addresses[0], (s[0, 0], s[0, 1]), f32)
    scores = view(addresses[1], (s[1, 0], s[1, 1]), f32)
    vote = view(addresses[2], (s[2, 0], s[2, 1]), f32)
    logits = view(addresses[3], (s[3, 0],), f32)
    probs = view(addresses[4], (s[4, 0],), f32)
    scores[0, :] = own
    for j in range(judges.shape[0]):
        log_scores(judges[j, 0], x, c, addresses, shapes, judges[j, 1], params[j], scores[j + 1])
    action, confidence = judge_one(scores, own_logits, c, max(a, 0), a >= 0, trust, rate, share, floor,
                                   min_confidence, vote, logits, probs)
    if a >= 0:
        for j in range(judges.shape[0]):
            learn(judges[j, 0], x, c, a, addresses, shapes, judges[j, 1], params[j])
    return action, confidence
