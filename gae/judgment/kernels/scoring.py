"""The compiled scoring of the judgment memory: the mirror of :mod:`gae.judgment.rule`'s scoring.

See :mod:`gae.judgment.kernels` for the conventions. The batched scoring kernel may
reassociate sums (it is checked against torch with a tolerance and never used to learn).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numba
import numpy as np

from gae.judgment.config import JudgmentConfig

# reassociate sums and approximate exp, but no 'nnan'/'ninf': -inf marks absent prototypes
_FAST_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}
NEG_INF = np.float32(-np.inf)
NOT_FINITE = -2  # score_one's (and learn_one's) answer to a NaN or Inf factor (learn_one: or one past its limit)


class Options(NamedTuple):
    """The :class:`~gae.JudgmentConfig` as the kernels read it: numbers and flags only."""

    tau: float
    eta_confirmed: float
    eta_override: float
    drift_threshold: float
    gate_damping: float
    clip: bool
    clip_low: float
    clip_high: float
    push_rate: float
    min_confidence: float
    adaptive: bool
    shadow_eta: float
    promotion_threshold: float
    evidence_clip: float
    evidence_allowance: float
    tracking_eta: float
    lead_rate: float
    spawn_threshold: float
    spawn_support: float
    win_decay: float

    @classmethod
    @functools.lru_cache(maxsize=64)  # once per config: a config is immutable, and this runs every call
    def of(cls, config: JudgmentConfig) -> Options:
        low, high = config.clip if config.clip is not None else (0.0, 0.0)
        values = {name: float(getattr(config, name)) for name in cls._fields if hasattr(config, name)
                  and name not in ("clip", "adaptive")}
        return cls(**values, clip=config.clip is not None, clip_low=low, clip_high=high, adaptive=config.adaptive)


# -- scoring ------------------------------------------------------------------------------------
@numba.njit(inline="always", nogil=True, boundscheck=False)
def scores(initialized, wins, c, a, p, support):  # pragma: no cover
    """Whether prototype ``p`` of (c, a) takes part in scoring (``rule.scoring_mask``)."""
    if not initialized[c, a, p]:
        return False
    n_slots = initialized.shape[2]
    if n_slots == 1 or wins[c, a, p] >= support:
        return True
    for q in range(n_slots):
        if q != p and initialized[c, a, q] and (wins[c, a, q] > wins[c, a, p]
                                                or (wins[c, a, q] == wins[c, a, p] and q < p)):
            return False
    return True


@numba.njit(inline="always", nogil=True, boundscheck=False)
def logit(x, b, alpha, c, tau32, estimates, a, p):  # pragma: no cover
    """``-sum_k alpha[c, k] (x[b, k] - estimates[c, a, p, k])^2 / tau`` (``rule.distances``)."""
    d = np.float32(0.0)
    for k in range(x.shape[1]):
        diff = x[b, k] - estimates[c, a, p, k]
        d += alpha[c, k] * (diff * diff)
    return -d / tau32


@numba.njit(inline="always", nogil=True, boundscheck=False)
def nearest_slot(x, b, c, a, estimates, initialized, wins, support, alpha, tau32):  # pragma: no cover
    """(logit, slot) of action ``a``'s nearest scoring prototype; (-inf, -1) when it has none."""
    best_logit = NEG_INF
    near = -1
    for p in range(estimates.shape[2]):
        if not scores(initialized, wins, c, a, p, support):
            continue
        value = logit(x, b, alpha, c, tau32, estimates, a, p)
        if value > best_logit:
            best_logit = value
            near = p
    return best_logit, near


@numba.njit(inline="always", nogil=True, boundscheck=False)
def output(b, best, best_logit, logits, probs, action, confidence, min_confidence):  # pragma: no cover
    """Softmax of row ``b`` of ``logits`` (-inf for absent actions) and its argmax (``rule.output``)."""
    n_actions = logits.shape[1]
    if best < 0:
        for a in range(n_actions):
            probs[b, a] = 0.0
        action[b] = -1
        confidence[b] = 0.0
        return
    z = np.float32(0.0)
    for a in range(n_actions):
        p = np.exp(logits[b, a] - best_logit)  # float32 exp: math.exp would round-trip through float64
        probs[b, a] = p
        z += p
    scale = np.float32(1.0) / z
    for a in range(n_actions):
        probs[b, a] *= scale
    best_probability = probs[b, best]
    if best_probability < min_confidence:
        action[b] = -1
        confidence[b] = 0.0
    else:
        action[b] = best
        confidence[b] = best_probability


@numba.njit(nogil=True, boundscheck=False)
def score_decision(x, b, c, estimates, initialized, wins, support, alpha, tau32, logits, sq_diff,
                   nearest):  # pragma: no cover
    """Every action's logit for decision ``b`` against ``estimates`` (C, A, P, K), with the
    squared differences of the slot that scored and its index (``rule.score_decision``); returns
    (best action, its logit), (-1, -inf) when none scores. With one slot it is the original
    design's loop, which the compiler vectorises over K."""
    n_actions, n_slots, n_factors = estimates.shape[1], estimates.shape[2], estimates.shape[3]
    best = -1
    best_logit = NEG_INF
    for a in range(n_actions):
        if n_slots == 1:
            d = np.float32(0.0)
            for k in range(n_factors):
                diff = x[b, k] - estimates[c, a, 0, k]
                sq = diff * diff
                sq_diff[b, a, k] = sq
                d += alpha[c, k] * sq
            logit_a = -d / tau32 if initialized[c, a, 0] else NEG_INF
            nearest[b, a] = 0 if initialized[c, a, 0] else -1
        else:
            logit_a, near = nearest_slot(x, b, c, a, estimates, initialized, wins, support, alpha, tau32)
            nearest[b, a] = near
            row = max(near, 0)
            for k in range(n_factors):
                diff = x[b, k] - estimates[c, a, row, k]
                sq_diff[b, a, k] = diff * diff
        logits[b, a] = logit_a
        if logit_a > best_logit:
            best_logit = logit_a
            best = a
    return best, best_logit


@numba.njit(cache=True, nogil=True, boundscheck=False, fastmath=_FAST_MATH)
def score(x, category, estimates, initialized, wins, alpha, options, out):  # pragma: no cover
    """Batched scoring into ``out = (logits, probs, action, confidence)``, no learning (``rule.score``)."""
    logits, probs, action, confidence = out
    n_decisions, n_factors = x.shape
    n_actions, n_slots = estimates.shape[1], estimates.shape[2]
    tau32 = np.float32(options.tau)
    for b in range(n_decisions):
        c = category[b]
        best = -1
        best_logit = NEG_INF
        for a in range(n_actions):
            if n_slots == 1:  # the original design's loop, which the compiler vectorises over K
                d = np.float32(0.0)
                for k in range(n_factors):
                    diff = x[b, k] - estimates[c, a, 0, k]
                    d += alpha[c, k] * (diff * diff)
                logit_a = -d / tau32 if initialized[c, a, 0] else NEG_INF
            else:
                logit_a, _ = nearest_slot(x, b, c, a, estimates, initialized, wins, options.spawn_support, alpha,
                                          tau32)
            logits[b, a] = logit_a
            if logit_a > best_logit:
                best_logit = logit_a
                best = a
        output(b, best, best_logit, logits, probs, action, confidence, options.min_confidence)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def score_one(x, c, estimates, initialized, wins, criterion_logits, tau, support, min_confidence):  # pragma: no cover
    """One decision's factors ``x`` (any real dtype, rounded to float32 here as the checked path
    does): (action, or -1 to abstain, or NOT_FINITE; confidence). The attention
    ``K softmax(criterion_logits[c])`` is computed here from the live parameter
    (``rule.attention``), so no cached copy can go stale."""
    n_actions, n_slots, n_factors = estimates.shape[1], estimates.shape[2], estimates.shape[3]
    row = np.empty(n_factors, np.float32)
    for k in range(n_factors):
        row[k] = np.float32(x[k])  # a value beyond float32 becomes inf, refused below
        if not math.isfinite(row[k]):
            return NOT_FINITE, 0.0
    alpha = np.empty((1, n_factors), np.float32)  # row 0: category c's
    top = criterion_logits[c, 0]
    for k in range(1, n_factors):
        top = max(top, criterion_logits[c, k])
    total = np.float32(0.0)
    for k in range(n_factors):
        alpha[0, k] = np.float32(math.exp(criterion_logits[c, k] - top))
        total += alpha[0, k]
    for k in range(n_factors):
        alpha[0, k] = np.float32(n_factors) * (alpha[0, k] / total)
    tau32 = np.float32(tau)
    best = -1
    best_logit = NEG_INF
    logits = np.empty(n_actions, np.float32)
    for a in range(n_actions):
        logits[a] = NEG_INF
        for p in range(n_slots):
            if scores(initialized, wins, c, a, p, support):
                d = np.float32(0.0)  # logit(), with category c's attention in row 0
                for k in range(n_factors):
                    diff = row[k] - estimates[c, a, p, k]
                    d += alpha[0, k] * (diff * diff)
                logits[a] = max(logits[a], -d / tau32)
        if logits[a] > best_logit:
            best_logit = logits[a]
            best = a
    if best < 0:
        return -1, 0.0
    z = np.float32(0.0)
    for a in range(n_actions):
        z += np.float32(math.exp(logits[a] - best_logit))
    confidence = np.float32(1.0) / z
    if confidence < min_confidence:
        return -1, 0.0
    return best, float(confidence)
