"""The compiled mirror (numba) of :mod:`gae.judgment.rule`, function for function.

Each function here has the same name as its torch counterpart in ``rule.py``, whose docstring
has the maths; the tests hold the two equal on seeded random streams in every mode. The
kernels trust their inputs (the module validates) and run on private copies of the state, so
a failure never leaves a half-updated memory. They take the state as one tuple
(:class:`~gae.judgment.state.JudgmentState` of arrays), the options as one
:class:`Options` record, and their outputs as tuples of preallocated arrays.

Floating point: the online loop keeps every stored quantity in float32 and evaluates the
update ``c + eta * (x - c)`` in float32, like the reference, without fast-math, so that the
two agree bit for bit. The batched scoring kernel may reassociate sums (it is checked against
torch with a tolerance and never used to learn).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from gae.judgment.config import JudgmentConfig

# reassociate sums and approximate exp, but no 'nnan'/'ninf': -inf marks absent prototypes
_FAST_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}
_NEG_INF = np.float32(-np.inf)
NOT_FINITE = -2  # score_one's answer to a NaN or Inf factor


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
    best_logit = _NEG_INF
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
    best_logit = _NEG_INF
    for a in range(n_actions):
        if n_slots == 1:
            d = np.float32(0.0)
            for k in range(n_factors):
                diff = x[b, k] - estimates[c, a, 0, k]
                sq = diff * diff
                sq_diff[b, a, k] = sq
                d += alpha[c, k] * sq
            logit_a = -d / tau32 if initialized[c, a, 0] else _NEG_INF
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
        best_logit = _NEG_INF
        for a in range(n_actions):
            if n_slots == 1:  # the original design's loop, which the compiler vectorises over K
                d = np.float32(0.0)
                for k in range(n_factors):
                    diff = x[b, k] - estimates[c, a, 0, k]
                    d += alpha[c, k] * (diff * diff)
                logit_a = -d / tau32 if initialized[c, a, 0] else _NEG_INF
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
    """One decision, no allocation but the attention row: (action, or -1 to abstain, or
    NOT_FINITE; confidence). The attention ``K softmax(criterion_logits[c])`` is computed here
    from the live parameter (``rule.attention``), so no cached copy can go stale."""
    n_actions, n_slots, n_factors = estimates.shape[1], estimates.shape[2], estimates.shape[3]
    for k in range(n_factors):
        if not math.isfinite(x[k]):
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
    best_logit = _NEG_INF
    logits = np.empty(n_actions, np.float32)
    for a in range(n_actions):
        logits[a] = _NEG_INF
        for p in range(n_slots):
            if scores(initialized, wins, c, a, p, support):
                d = np.float32(0.0)  # logit(), with category c's attention in row 0
                for k in range(n_factors):
                    diff = x[k] - estimates[c, a, p, k]
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


# -- learning -----------------------------------------------------------------------------------
@numba.njit(inline="always", nogil=True, boundscheck=False)
def clipped(value, options):  # pragma: no cover
    """``value`` clamped to ``options.clip`` when it is on (``rule.clipped``)."""
    if options.clip:
        return min(max(value, np.float32(options.clip_low)), np.float32(options.clip_high))
    return value


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
            if total < closest:
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
def weigh_evidence(x, b, c, a, p, proto_logit, alpha, tau32, state, options):  # pragma: no cover
    """One verified decision's step of the category's change test (``rule.weigh_evidence``)."""
    statistic, evidence, run_count = state.promotion_statistic, state.promotion_evidence, state.run_counts
    gap = logit(x, b, alpha, c, tau32, state.shadow_centroids, a, p) - proto_logit
    clip32 = np.float32(options.evidence_clip)
    e = min(max(gap, -clip32), clip32) - np.float32(options.evidence_allowance)
    statistic[c] = max(np.float32(0.0), statistic[c] + e)
    if statistic[c] == 0:  # the evidence and the run means are those of the current run of the test
        evidence[c, 0] = 0
        evidence[c, 1] = 0
        for j in range(run_count.shape[1]):
            for q in range(run_count.shape[2]):
                run_count[c, j, q] = 0
    elif gap > 0:
        evidence[c, 0] += 1
    else:
        evidence[c, 1] += 1


@numba.njit(inline="always", nogil=True, boundscheck=False)
def follow_step(c, a, p, disp, state, options):  # pragma: no cover
    """(eta, gated) of a prototype that follows a change, as a running mean (``rule.follow_step``)."""
    weight = np.float32(1.0)
    gated = False
    if disp > options.drift_threshold and state.follow_weight[c, a, p] > 0:  # (a restart has nothing to damp)
        weight = np.float32(options.gate_damping)
        gated = True
    state.follow_weight[c, a, p] += weight
    eta = weight / state.follow_weight[c, a, p]
    if np.float32(options.eta_confirmed) * (state.follow_weight[c, a, p] + np.float32(1.0)) >= np.float32(1.0):
        state.following[c, a, p] = False  # the running mean's rate has come down to the seed rule's
    return eta, gated


@numba.njit(inline="always", nogil=True, boundscheck=False)
def track(x, b, c, a, p, fresh, state, options):  # pragma: no cover
    """Move the taught prototype's tracking prototype (``rule.track``)."""
    tracking = state.tracking_centroids
    n_factors = x.shape[1]
    eta = np.float32(options.tracking_eta)
    if not fresh:
        total = np.float32(0.0)
        for k in range(n_factors):
            diff = x[b, k] - tracking[c, a, p, k]
            total += diff * diff
        if np.float32(math.sqrt(total)) > options.drift_threshold:
            eta = eta * np.float32(options.gate_damping)
    for k in range(n_factors):
        value = x[b, k] if fresh else tracking[c, a, p, k] + eta * (x[b, k] - tracking[c, a, p, k])
        tracking[c, a, p, k] = clipped(value, options)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def shadow_and_promotion(x, b, c, a, target, fresh, state, options, events, promotions):  # pragma: no cover
    """Move the taught prototype's shadow, add the decision to the test's run, and promote the
    category when its statistic passes the threshold (``rule.shadow_and_promotion``)."""
    centroids, initialized, shadow = state.centroids, state.initialized, state.shadow_centroids
    statistic, evidence, following = state.promotion_statistic, state.promotion_evidence, state.following
    follow_weight, run_mean, run_count = state.follow_weight, state.run_centroids, state.run_counts
    n_actions, n_slots, n_factors = centroids.shape[1], centroids.shape[2], centroids.shape[3]
    eta_c32 = np.float32(options.eta_confirmed)
    if fresh:  # a new prototype: nothing it saw before belongs to it
        following[c, a, target] = False
        follow_weight[c, a, target] = 0.0
        run_count[c, a, target] = 0
    for k in range(n_factors):
        if fresh:
            value = x[b, k]
        else:
            value = shadow[c, a, target, k] + np.float32(options.shadow_eta) * (x[b, k] - shadow[c, a, target, k])
        shadow[c, a, target, k] = clipped(value, options)
    if statistic[c] > 0:
        run_count[c, a, target] += 1
        if run_count[c, a, target] == 1:
            for k in range(n_factors):
                run_mean[c, a, target, k] = x[b, k]
        else:
            inverse = np.float32(1.0) / np.float32(run_count[c, a, target])
            for k in range(n_factors):
                run_mean[c, a, target, k] += inverse * (x[b, k] - run_mean[c, a, target, k])
    if statistic[c] > options.promotion_threshold:
        promo_statistic, promo_evidence, promo_shift = promotions
        moved = np.float32(0.0)
        n_moved = 0
        for j in range(n_actions):
            for p in range(n_slots):
                if initialized[c, j, p]:
                    from_run = run_count[c, j, p] > 0
                    total = np.float32(0.0)
                    for k in range(n_factors):
                        value = clipped(run_mean[c, j, p, k] if from_run else shadow[c, j, p, k], options)
                        diff = value - centroids[c, j, p, k]
                        total += diff * diff
                        centroids[c, j, p, k] = value
                    moved += np.float32(math.sqrt(total))
                    n_moved += 1
                    # a shadow carries no weight: the prototype restarts like a first touch, its next decision
                    # replaces it; a long run may already be past the hand-over
                    weight = np.float32(run_count[c, j, p]) if from_run else np.float32(0.0)
                    follow_weight[c, j, p] = weight
                    following[c, j, p] = eta_c32 * (weight + np.float32(1.0)) < np.float32(1.0)
                    run_count[c, j, p] = 0
        events.promoted[b] = True
        promo_statistic[b] = statistic[c]
        promo_evidence[b, 0] = evidence[c, 0]
        promo_evidence[b, 1] = evidence[c, 1]
        promo_shift[b] = moved / np.float32(n_moved)
        statistic[c] = 0.0
        evidence[c, 0] = 0
        evidence[c, 1] = 0
        state.tracking_lead[c] = 0.0  # the promoted prototypes score


@numba.njit(cache=True, nogil=True, boundscheck=False)
def prequential(state, options, alpha, x, category, action, confirmed, given, skip, out, events,
                promotions):  # pragma: no cover
    """Score-before-learn over a batch in stream order, updating ``state`` in place (``rule.prequential``).

    ``out = (logits, probs, action, confidence, sq_diff, nearest, before)``, ``events`` the
    :class:`~gae.types.LearnEvents` arrays and ``promotions = (statistic, evidence, shift)``
    per decision, all preallocated. ``confirmed[b]`` is used where ``given[b]``; elsewhere a
    decision is confirmed when the memory recommended its action.
    """
    centroids, initialized, counts, wins = state.centroids, state.initialized, state.counts, state.wins
    logits, probs, out_action, confidence, sq_diff, nearest, before = out
    n_decisions, n_factors = x.shape
    n_slots = centroids.shape[2]
    tau32 = np.float32(options.tau)
    damping32 = np.float32(options.gate_damping)
    keep32 = np.float32(1.0) - np.float32(options.win_decay)
    lead = state.tracking_lead
    for b in range(n_decisions):
        c = category[b]
        # -- score with the state left by decisions 0..b-1 (adaptive: the tracking prototypes while they lead)
        tracked = options.adaptive and lead[c] > 0
        if tracked:
            best, best_logit = score_decision(x, b, c, state.tracking_centroids, initialized, wins,
                                              options.spawn_support, alpha, tau32, logits, sq_diff, nearest)
        else:  # score_decision, written out: called here too (or inlined twice), the seed engine runs markedly slower
            best, best_logit = -1, _NEG_INF
            for j in range(centroids.shape[1]):
                if n_slots == 1:
                    d = np.float32(0.0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, j, 0, k]
                        sq = diff * diff
                        sq_diff[b, j, k] = sq
                        d += alpha[c, k] * sq
                    logit_j = -d / tau32 if initialized[c, j, 0] else _NEG_INF
                    nearest[b, j] = 0 if initialized[c, j, 0] else -1
                else:
                    logit_j, near = nearest_slot(x, b, c, j, centroids, initialized, wins, options.spawn_support,
                                                 alpha, tau32)
                    nearest[b, j] = near
                    row = max(near, 0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, j, row, k]
                        sq_diff[b, j, k] = diff * diff
                logits[b, j] = logit_j
                if logit_j > best_logit:
                    best_logit = logit_j
                    best = j
        output(b, best, best_logit, logits, probs, out_action, confidence, options.min_confidence)
        recommended = out_action[b]
        # -- learn
        if skip[b]:
            events.skipped[b] = True
            continue
        a = action[b]
        is_confirmed = confirmed[b] if given[b] else recommended == a
        eta = np.float32(options.eta_confirmed) if is_confirmed else np.float32(options.eta_override)
        if n_slots == 1 and not tracked:  # the squared differences just scored are the prototype's
            target, disp = -1, np.float32(0.0)
            if initialized[c, a, 0]:
                total = np.float32(0.0)
                for k in range(n_factors):
                    total += sq_diff[b, a, k]
                target, disp = 0, np.float32(math.sqrt(total))
        else:
            target, disp = taught_slot(x, b, c, a, centroids, initialized)
        spawn = target >= 0 and n_slots > 1 and disp > options.spawn_threshold
        follow = False
        if options.adaptive and target >= 0 and not spawn:
            # the verified action's prototype logit: already scored unless tracking prototypes or slots scored
            if n_slots == 1 and not tracked:
                proto_logit = logits[b, a]
            else:
                proto_logit = logit(x, b, alpha, c, tau32, centroids, a, target)
            weigh_evidence(x, b, c, a, target, proto_logit, alpha, tau32, state, options)
            # which of the prototype and its tracking prototype predicted the verified action better
            gap = logit(x, b, alpha, c, tau32, state.tracking_centroids, a, target) - proto_logit
            clip32 = np.float32(options.evidence_clip)
            lead[c] += np.float32(options.lead_rate) * (min(max(gap, -clip32), clip32) - lead[c])
            follow = state.following[c, a, target]
        fresh = target < 0 or spawn  # the decision starts a prototype: it is set to x
        if target < 0:
            target = 0
            events.initialized[b] = True
        elif spawn:
            events.displacement[b] = disp
            events.spawned[b] = True
            target, events.recycled[b] = spawn_slot(c, a, initialized, wins)
            counts[c, a, target] = 0
            wins[c, a, target] = 0.0
        for k in range(n_factors):
            before[b, k] = centroids[c, a, target, k]
        if fresh:
            for k in range(n_factors):
                centroids[c, a, target, k] = clipped(x[b, k], options)
            initialized[c, a, target] = True
            eta = np.float32(1.0)
        else:
            events.displacement[b] = disp
            if follow:
                eta, events.gated[b] = follow_step(c, a, target, disp, state, options)
            elif disp > options.drift_threshold:  # the gate
                eta = eta * damping32
                events.gated[b] = True
            for k in range(n_factors):
                value = centroids[c, a, target, k] + eta * (x[b, k] - centroids[c, a, target, k])
                centroids[c, a, target, k] = clipped(value, options)
        counts[c, a, target] += 1
        if n_slots > 1:
            for p in range(n_slots):
                wins[c, a, p] *= keep32
            wins[c, a, target] += np.float32(1.0)
        events.applied[b] = True
        events.eta[b] = eta
        events.prototype[b] = target
        if options.push_rate > 0 and not is_confirmed and recommended >= 0 and recommended != a:
            r = nearest[b, recommended]
            push32 = np.float32(options.push_rate)
            for k in range(n_factors):
                value = centroids[c, recommended, r, k] - push32 * (x[b, k] - centroids[c, recommended, r, k])
                centroids[c, recommended, r, k] = clipped(value, options)
        if options.adaptive:
            track(x, b, c, a, target, fresh, state, options)
            shadow_and_promotion(x, b, c, a, target, fresh, state, options, events, promotions)
