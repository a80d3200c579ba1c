"""The compiled mirror (numba) of :mod:`gae.judgment.trust`, function for function, and the
loop that combines a batch's votes in stream order (:func:`prequential`)."""

from __future__ import annotations

import math

import numba
import numpy as np

NEG_INF = np.float32(-np.inf)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def votes(scores, out):  # pragma: no cover
    """``out`` (A,) := the softmax of (A,) ``scores`` over their finite entries, zero if none (``trust.votes``)."""
    top = NEG_INF
    for a in range(scores.shape[0]):
        if math.isfinite(scores[a]):
            top = max(top, np.float32(scores[a]))
    if top == NEG_INF:
        out[:] = 0.0
        return
    total = np.float32(0.0)
    for a in range(scores.shape[0]):
        out[a] = np.float32(math.exp(scores[a] - top)) if math.isfinite(scores[a]) else np.float32(0.0)
        total += out[a]
    for a in range(scores.shape[0]):
        out[a] /= max(total, np.float32(1e-38))


@numba.njit(inline="always", nogil=True, boundscheck=False)
def weights_of(trust, c, j):  # pragma: no cover
    """Judge ``j``'s weight in category ``c`` (``trust.weights_of``): uniform while the row never learned."""
    for i in range(trust.shape[1]):
        if trust[c, i] != 0:
            return trust[c, j]
    return np.float32(1.0) / np.float32(trust.shape[1])


@numba.njit(inline="always", nogil=True, boundscheck=False)
def mixture(vote, trust, c, out):  # pragma: no cover
    """``out`` (A,) := the mixture of (J, A) votes under category ``c``'s trust (``trust.mixture``)."""
    n_judges, n_actions = vote.shape
    total = np.float32(0.0)
    out[:] = 0.0
    for j in range(n_judges):
        opinion = np.float32(0.0)
        for a in range(n_actions):
            opinion += vote[j, a]
        if opinion > 0:
            w = weights_of(trust, c, j)
            total += w
            for a in range(n_actions):
                out[a] += w * vote[j, a]
    if total > 0:
        for a in range(n_actions):
            out[a] /= max(total, np.float32(1e-38))


@numba.njit(inline="always", nogil=True, boundscheck=False)
def output(probs, min_confidence, logits):  # pragma: no cover
    """``(action, confidence)`` of (A,) mixture probabilities, ``logits`` := log p (``trust.output``)."""
    best, confidence = -1, np.float32(0.0)
    for a in range(probs.shape[0]):
        logits[a] = np.float32(math.log(max(probs[a], np.float32(1e-38)))) if probs[a] > 0 else NEG_INF
        if probs[a] > 0 and (best < 0 or probs[a] > confidence):
            best, confidence = a, probs[a]
    if best < 0 or np.float64(confidence) < min_confidence:
        return -1, np.float32(0.0)
    return best, confidence


@numba.njit(inline="always", nogil=True, boundscheck=False)
def trust_step(vote, c, a, trust, rate, share, floor):  # pragma: no cover
    """One fixed-share step of category ``c``'s trust row, in place (``trust.trust_step``)."""
    n_judges, n_actions = vote.shape
    loss = np.empty(n_judges, np.float32)
    any_opinion = False
    for j in range(n_judges):
        opinion = np.float32(0.0)
        for b in range(n_actions):
            opinion += vote[j, b]
        probability = vote[j, a] if opinion > 0 else np.float32(1.0) / np.float32(n_actions)
        any_opinion = any_opinion or opinion > 0
        loss[j] = -np.float32(math.log(max(probability, np.float32(floor))))
    if not any_opinion:
        return
    least = loss.min()
    w = np.empty(n_judges, np.float32)
    total = np.float32(0.0)
    for j in range(n_judges):
        w[j] = weights_of(trust, c, j) * np.float32(math.exp(-np.float32(rate) * (loss[j] - least)))
        total += w[j]
    for j in range(n_judges):
        trust[c, j] = (np.float32(1.0) - np.float32(share)) * (w[j] / total) + np.float32(share) / np.float32(n_judges)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def decide_row(scores, c, trust, min_confidence, vote, logits, probs):  # pragma: no cover
    """One decision's (J, A) ``vote`` (rows 1.. from its judges' ``scores``; row 0, the
    prototypes', already there), its mixture in ``probs`` and ``logits`` under category ``c``'s
    trust, and its ``(action, confidence)``."""
    for j in range(1, scores.shape[0]):
        votes(scores[j], vote[j])
    mixture(vote, trust, c, probs)
    return output(probs, min_confidence, logits)


@numba.njit(nogil=True, boundscheck=False, cache=True)
def prequential(scores, category, action, skip, trust, rate, share, floor, min_confidence, vote, logits, probs,
                out_action, confidence):  # pragma: no cover
    """Decision b's vote (``vote[b]`` (J, A) from its judges' ``scores[b]``, row 0 already the
    prototypes' probabilities) and the mixture's output under the trust in force, then the
    trust step unless skipped, in stream order."""
    for b in range(scores.shape[0]):
        c = category[b]
        out_action[b], confidence[b] = decide_row(scores[b], c, trust, min_confidence, vote[b], logits[b], probs[b])
        if not skip[b]:
            trust_step(vote[b], c, action[b], trust, rate, share, floor)


@numba.njit(nogil=True, boundscheck=False, cache=True)
def score(scores, category, trust, min_confidence, vote, logits, probs, out_action, confidence):  # pragma: no cover
    """:func:`prequential`'s scoring alone (nothing learned): a batch scored under the trust in force."""
    for b in range(scores.shape[0]):
        out_action[b], confidence[b] = decide_row(scores[b], category[b], trust, min_confidence, vote[b], logits[b],
                                                  probs[b])


@numba.njit(nogil=True, boundscheck=False)
def judge_one(scores, own_logits, c, a, learn, trust, rate, share, floor, min_confidence, vote, logits,
              probs):  # pragma: no cover
    """One decision of :func:`prequential` on the single-decision path: ``vote`` (J, A) from the
    judges' ``scores`` rows, whose row 0 holds the prototypes' probabilities, or (``own_logits``)
    their logits, the mixture into ``probs`` and ``logits``, and (``learn``) the trust step.
    Returns ``(action, confidence)``."""
    if own_logits:
        votes(scores[0], vote[0])
    else:
        vote[0, :] = scores[0]
    action, confidence = decide_row(scores, c, trust, min_confidence, vote, logits, probs)
    if learn:
        trust_step(vote, c, a, trust, rate, share, floor)
    return action, confidence
