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

from gae.compiled import view
from gae.judgment.config import JudgmentConfig
from gae.judgment.float32 import VARIANCE_FLOOR

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
    lvq: bool
    pooled: bool
    rate_floor: float
    relevance_rate: float
    miss_penalty: float
    # added after the fields above, with the values that keep what gae did before them, so that an Options
    # pickled by an earlier gae (inside a river or scikit-learn classifier) loads
    rate_per_error: float = 0.0
    error_decay: float = 0.02
    memory_units: bool = False

    @classmethod
    @functools.lru_cache(maxsize=64)  # once per config: a config is immutable, and this runs every call
    def of(cls, config: JudgmentConfig) -> Options:
        """The config's numbers by their flat names (``tau`` of ``config.rule.tau``), its modes as flags."""
        clip = config.rule.clip
        low, high = clip if clip is not None else (0.0, 0.0)
        flags = ("clip", "clip_low", "clip_high", "adaptive", "lvq", "pooled", "memory_units")
        values = {name: float(config.option(name)) for name in cls._fields if name not in flags}
        return cls(**values, clip=clip is not None, clip_low=low, clip_high=high, adaptive=config.adaptive,
                   lvq=config.learning == "lvq", pooled=config.lvq.units == "category",
                   memory_units=config.lvq.units == "memory")


VARIANCE_FLOOR32 = np.float32(VARIANCE_FLOOR)
INF32 = np.float32(np.inf)


# -- scoring ------------------------------------------------------------------------------------
@numba.njit(inline="always", nogil=True, boundscheck=False)
def relevance(relevance_logits, c, k, top, total):  # pragma: no cover
    """``softmax(relevance_logits[c])[k]`` given the row's maximum and its sum of exponentials
    (``rule.relevances``)."""
    return np.float32(math.exp(relevance_logits[c, k] - top)) / total


@numba.njit(inline="always", nogil=True, boundscheck=False)
def relevance_norm(relevance_logits, c):  # pragma: no cover
    """(maximum, sum of exp(logit - maximum)) of row ``c`` of the relevance logits."""
    top = relevance_logits[c, 0]
    for k in range(1, relevance_logits.shape[1]):
        top = max(top, relevance_logits[c, k])
    total = np.float32(0.0)
    for k in range(relevance_logits.shape[1]):
        total += np.float32(math.exp(relevance_logits[c, k] - top))
    return top, total


@numba.njit(inline="always", nogil=True, boundscheck=False)
def unit_row(variances, c):  # pragma: no cover
    """The row of ``variances`` category ``c``'s units are made of (``rule.unit_variances``): its
    own of a (C, K) array of every category's, row 0 of a (1, K) array of the memory's."""
    return 0 if variances.shape[0] == 1 else c


@numba.njit(inline="always", nogil=True, boundscheck=False)
def pooled_spread(variances, c):  # pragma: no cover
    """Category ``c``'s mean running variance over its criteria (``rule.spread`` with
    ``units='category'``, before its floor)."""
    r = unit_row(variances, c)
    total = np.float32(0.0)
    for k in range(variances.shape[1]):
        total += variances[r, k]
    return total / np.float32(variances.shape[1])


@numba.njit(inline="always", nogil=True, boundscheck=False)
def spread(variances, c, k, pooled, common):  # pragma: no cover
    """What criterion ``k``'s squared difference is divided by (``rule.spread``): ``common`` (the
    :func:`pooled_spread`) when pooled, else its own running variance; inf where that is at most
    the floor."""
    value = common if pooled else variances[unit_row(variances, c), k]
    return value if value > VARIANCE_FLOOR32 else INF32


@numba.njit(inline="always", nogil=True, boundscheck=False)
def metric_row(out, i, alpha, relevance_logits, variances, c, pooled):  # pragma: no cover
    """Row ``i`` of ``out`` := category ``c``'s metric ``alpha[i] * softmax(relevance_logits[c]) /
    spread`` (``rule.metric``; ``alpha``'s row ``i`` holds c's attention, ``out`` may be ``alpha``;
    ``variances`` the units' running variances, :func:`unit_row`)."""
    top, total = relevance_norm(relevance_logits, c)
    common = pooled_spread(variances, c) if pooled else VARIANCE_FLOOR32
    for k in range(relevance_logits.shape[1]):
        out[i, k] = alpha[i, k] * relevance(relevance_logits, c, k, top, total) / spread(variances, c, k, pooled,
                                                                                          common)


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
def distance(x, b, alpha, c, estimates, a, p):  # pragma: no cover
    """``sum_k alpha[c, k] (x[b, k] - estimates[c, a, p, k])^2`` (``rule.distances``)."""
    d = np.float32(0.0)
    for k in range(x.shape[1]):
        diff = x[b, k] - estimates[c, a, p, k]
        d += alpha[c, k] * (diff * diff)
    return d


@numba.njit(inline="always", nogil=True, boundscheck=False)
def logit(x, b, alpha, c, tau32, estimates, a, p):  # pragma: no cover
    """``-distance / tau`` (``rule.distances``, ``rule.slot_logits``)."""
    return -distance(x, b, alpha, c, estimates, a, p) / tau32


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
    """Batched scoring into ``out = (logits, probs, action, confidence)``, no learning (``rule.score``).

    A block of decisions at a time: each decision's logits and best action (``rule.distances``,
    ``rule.slot_logits``), then the block's softmax (``rule.output``) one action at a time across
    the block, so that its loops vectorise. numba has no vector ``exp``, and one call of libm's
    ``expf`` per logit took most of the time (docs/scoring_speed.md), so ``exp`` is written out:
    glibc's ``expf`` (``sysdeps/ieee754/flt-32/e_expf.c``, from ARM's optimized-routines, as its
    FMA build runs it), step for step in float64 with its constants. It gives the bits ``expf``
    gives, so the outputs are those of ``output`` (which calls it) bit for bit on the same
    machine (tests/test_scoring_paths.py); across machines torch's own vector ``exp`` differs in
    the last bits, so old checkpoints score as they did within a stated tolerance
    (tests/test_checkpoint_migration.py).
    """
    logits, probs, action, confidence = out
    n_decisions = x.shape[0]
    n_actions, n_slots = estimates.shape[1], estimates.shape[2]
    tau32 = np.float32(options.tau)
    # expf's table: the bits of 2 ** (i / 32), less i << 47 (e_exp2f_data.c)
    table = np.array((0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
                      0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
                      0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
                      0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
                      0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
                      0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
                      0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
                      0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540), np.int64)
    underflow = np.float32(-103.97207641601562)  # -0x1.9fe368p6: below, expf is 0
    may_underflow = np.float32(-103.27892303466797)  # -0x1.9d1d9ep6: below, expf is the least subnormal
    block = max(1, min(1024, n_decisions))
    block_logits = np.empty((n_actions, block), np.float32)  # action-major: the softmax loops run over decisions
    weights = np.empty((n_actions, block), np.float32)  # exp(logit - top)
    top = np.empty(block, np.float32)  # each decision's largest logit, 0 when no action scores
    best = np.empty(block, np.int64)  # its action (the first on a tie), -1 when none scores
    total = np.empty(block, np.float32)  # the sum of the weights, then its inverse
    polynomial = np.empty(block, np.float64)  # expf's 2 ** (r / 32)
    scale_bits = np.empty(block, np.int64)
    scale = scale_bits.view(np.float64)  # expf's 2 ** (k / 32)
    for start in range(0, n_decisions, block):
        size = min(block, n_decisions - start)
        for j in range(size):
            b = start + j
            c = category[b]
            best_j = -1
            top_j = NEG_INF
            for a in range(n_actions):
                if n_slots == 1:  # the original design's loop
                    d = np.float32(0.0)
                    for k in range(x.shape[1]):
                        diff = x[b, k] - estimates[c, a, 0, k]
                        d += alpha[c, k] * (diff * diff)
                    logit_a = -d / tau32 if initialized[c, a, 0] else NEG_INF
                else:
                    logit_a, _ = nearest_slot(x, b, c, a, estimates, initialized, wins, options.spawn_support, alpha,
                                              tau32)
                logits[b, a] = logit_a
                block_logits[a, j] = logit_a
                if logit_a > top_j:
                    top_j = logit_a
                    best_j = a
            best[j] = best_j
            top[j] = top_j if best_j >= 0 else np.float32(0.0)  # keeps -inf - top at -inf, not NaN
            total[j] = 0.0
        for a in range(n_actions):
            for j in range(size):  # expf(logit - top), its float64 steps; -inf clamped to a finite value
                v = np.float64(max(block_logits[a, j] - top[j], np.float32(-104.0)))
                z = 46.16624130844683 * v  # v * 32 / ln 2: 0x1.71547652b82fep+0 * 32
                k = np.rint(z)
                # z - k rounded once, as expf's fused multiply-add gives it: 32 / ln 2 = hi + lo, hi of 29
                # bits, so that hi * v is exact and only the tiny lo * v is rounded
                r = (46.16624128818512 * v - k) + 2.026170875524258e-08 * v
                scale_bits[j] = np.int64(k)
                p = 1.6938359250920212e-06 * r + 0.00023459809789509004  # 0x1.c6af84b912394p-5 / 32 ** 3, ...
                r2 = r * r
                y = 0.021660849396613134 * r + 1.0  # 0x1.62e42ff0c52d6p-1 / 32
                polynomial[j] = p * r2 + y
            for j in range(size):  # the table lookup on its own: with it, the loop above would not vectorise
                scale_bits[j] = table[scale_bits[j] & 31] + (scale_bits[j] << 47)
            for j in range(size):  # its own loop: scale is scale_bits' memory
                shifted = block_logits[a, j] - top[j]
                weight = np.float32(polynomial[j] * scale[j])
                weight = np.float32(1.401298464324817e-45) if shifted < may_underflow else weight
                weights[a, j] = np.float32(0.0) if shifted < underflow else weight
                total[j] += weights[a, j]
        for j in range(size):
            inverse = np.float32(1.0) / total[j] if best[j] >= 0 else np.float32(0.0)
            total[j] = inverse
            sure = (best[j] >= 0) & (inverse >= options.min_confidence)  # the top action's probability is 1 / total
            action[start + j] = best[j] if sure else -1
            confidence[start + j] = inverse if sure else np.float32(0.0)
        for a in range(n_actions):
            for j in range(size):
                probs[start + j, a] = weights[a, j] * total[j]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def score_one(x, c, estimates, initialized, wins, criterion_logits, tau, support, min_confidence, row, alpha,
              logits, relevance_logits, variances, pooled, probs, limit):  # pragma: no cover
    """One decision's factors ``x`` (any real dtype, rounded to float32 here as the checked path
    does): (action, or -1 to abstain, or NOT_FINITE for a NaN, an Inf or a value past ``limit``
    in size (``inf``: none; a decision to be learned: the learning limit); confidence). The attention
    ``K softmax(criterion_logits[c])`` is computed here from the live parameter
    (``rule.attention``), so no cached copy can go stale; with ``learning='lvq'`` (non-empty
    ``relevance_logits``) it is made the metric's row (``rule.metric``). ``row`` (K,), ``alpha``
    (1, K), ``logits`` (A,) and ``probs`` (A,) are float32 scratch space, overwritten: ``logits``
    with the decision's logits, ``probs`` with their softmax (``rule.output``; all 0 when no action
    has a prototype), whose recommended action's entry is the confidence, exactly."""
    n_actions, n_slots, n_factors = estimates.shape[1], estimates.shape[2], estimates.shape[3]
    for k in range(n_factors):
        row[k] = np.float32(x[k])  # a value beyond float32 becomes inf, refused below
        if not math.isfinite(row[k]) or abs(x[k]) > limit:
            return NOT_FINITE, 0.0
    top = criterion_logits[c, 0]  # alpha's row 0: category c's
    for k in range(1, n_factors):
        top = max(top, criterion_logits[c, k])
    total = np.float32(0.0)
    for k in range(n_factors):
        alpha[0, k] = np.float32(math.exp(criterion_logits[c, k] - top))
        total += alpha[0, k]
    for k in range(n_factors):
        alpha[0, k] = np.float32(n_factors) * (alpha[0, k] / total)
    if relevance_logits.shape[0]:
        metric_row(alpha, 0, alpha, relevance_logits, variances, c, pooled)
    tau32 = np.float32(tau)
    best = -1
    best_logit = NEG_INF
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
        for a in range(n_actions):
            probs[a] = 0.0
        return -1, 0.0
    z = np.float32(0.0)
    for a in range(n_actions):
        probs[a] = np.float32(math.exp(logits[a] - best_logit))
        z += probs[a]
    confidence = np.float32(1.0) / z
    for a in range(n_actions):
        probs[a] *= confidence  # (the best one's exp is 1: its probability is the confidence itself)
    if confidence < min_confidence:
        return -1, 0.0
    return best, float(confidence)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def score_one_at(x, c, limit, adaptive, tau, support, min_confidence, pooled, addresses, shapes):  # pragma: no cover
    """:func:`score_one` with the state given by address (a :class:`gae.compiled.ArrayTable` of
    centroids, initialized, wins, tracking_centroids, tracking_lead and criterion_logits, then its
    float32 scratch row, alpha and logits, then relevance_logits and input_variances, then the
    scratch probs): category ``c`` scores with its tracking prototypes while they lead
    (``rule.scoring_estimates``)."""
    s = shapes
    lead = view(addresses[4], (s[4, 0],), np.float32)
    which = 3 if adaptive and lead[c] > 0 else 0
    estimates = view(addresses[which], (s[which, 0], s[which, 1], s[which, 2], s[which, 3]), np.float32)
    return score_one(x, c, estimates, view(addresses[1], (s[1, 0], s[1, 1], s[1, 2]), np.bool_),
                     view(addresses[2], (s[2, 0], s[2, 1], s[2, 2]), np.float32),
                     view(addresses[5], (s[5, 0], s[5, 1]), np.float32), tau, support, min_confidence,
                     view(addresses[6], (s[6, 0],), np.float32), view(addresses[7], (s[7, 0], s[7, 1]), np.float32),
                     view(addresses[8], (s[8, 0],), np.float32), view(addresses[9], (s[9, 0], s[9, 1]), np.float32),
                     view(addresses[10], (s[10, 0], s[10, 1]), np.float32), pooled,
                     view(addresses[11], (s[11, 0],), np.float32), limit)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def novelty(x, c, centroids, initialized, variances, floor):  # pragma: no cover
    """:func:`gae.judgment.primitives.novelty` of case ``x`` (float64) in category ``c``; -1 when
    ``x`` holds a NaN or an Inf (the caller's checked path says which)."""
    for k in range(x.shape[0]):
        if not math.isfinite(x[k]):
            return -1.0
    best = np.inf
    n_actions, n_slots, n_factors = centroids.shape[1], centroids.shape[2], centroids.shape[3]
    for a in range(n_actions):
        for p in range(n_slots):
            if initialized[c, a, p]:
                total = 0.0
                for k in range(n_factors):
                    d = x[k] - np.float64(centroids[c, a, p, k])
                    total += d * d / max(np.float64(variances[c, k]), floor)
                best = min(best, total)
    return best
