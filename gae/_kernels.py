"""Compiled loops (numba) behind the exact online engine and CPU scoring.

These functions are the fast path. Each one has a plain torch counterpart in
:mod:`gae.engine` (the reference) and the tests hold the two equal. They trust their
inputs: the modules validate everything before calling them, and they run on private
copies of the state so that a failure can never leave a half-updated memory.

Floating point: the online loops keep every stored quantity in float32 and evaluate the
update ``c + eta * (x - c)`` in float32, like the torch reference, without fast-math, so
that the two agree to rounding. The batched scoring kernel is allowed to reassociate sums
(it is checked against torch with a tolerance, never used to learn).
"""

from __future__ import annotations

import math

import numba
import numpy as np

# reassociate sums and approximate exp, but no 'nnan'/'ninf': -inf marks absent prototypes
_FAST_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}
_NEG_INF = np.float32(-np.inf)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def _scores(initialized, wins, c, a, p, support):  # pragma: no cover
    """Whether prototype ``p`` of (c, a) takes part in scoring: it is in use and has either the
    support (``wins >= support``) or the most wins of its action (ties: the lowest slot), so every
    action with a prototype in use scores and a fresh, unproven spawn does not."""
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
def _nearest_slot(x, b, c, a, centroids, initialized, wins, support, alpha, tau32):  # pragma: no cover
    """(logit, slot) of the nearest scoring prototype of action ``a`` for decision ``b``;
    (-inf, -1) when the action has none."""
    best_logit = _NEG_INF
    near = -1
    for p in range(centroids.shape[2]):
        if not _scores(initialized, wins, c, a, p, support):
            continue
        d = np.float32(0.0)
        for k in range(x.shape[1]):
            diff = x[b, k] - centroids[c, a, p, k]
            d += alpha[c, k] * (diff * diff)
        if -d / tau32 > best_logit:
            best_logit = -d / tau32
            near = p
    return best_logit, near


@numba.njit(cache=True, nogil=True, boundscheck=False, fastmath=_FAST_MATH)
def judgment_score(x, category, centroids, initialized, wins, support, alpha, tau, logits, probs, action,
                   confidence, min_confidence):  # pragma: no cover
    """Batched scoring of JudgmentMemory into preallocated outputs (no learning).

    ``centroids`` is (C, A, P, K): an action's logit is that of its nearest scoring prototype.
    """
    n_decisions, n_factors = x.shape
    n_actions, n_slots = centroids.shape[1], centroids.shape[2]
    tau32 = np.float32(tau)
    for b in range(n_decisions):
        c = category[b]
        best = -1
        best_logit = _NEG_INF
        for a in range(n_actions):
            if n_slots == 1:  # the original design's loop, which the compiler vectorises over K
                d = np.float32(0.0)
                for k in range(n_factors):
                    diff = x[b, k] - centroids[c, a, 0, k]
                    d += alpha[c, k] * (diff * diff)
                logit_a = -d / tau32 if initialized[c, a, 0] else _NEG_INF
            else:
                logit_a, _ = _nearest_slot(x, b, c, a, centroids, initialized, wins, support, alpha, tau32)
            logits[b, a] = logit_a
            if logit_a > best_logit:
                best_logit = logit_a
                best = a
        _finish_softmax(b, best, best_logit, logits, probs, action, confidence, min_confidence)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def _finish_softmax(b, best, best_logit, logits, probs, action, confidence, min_confidence):  # pragma: no cover
    """Softmax of row ``b`` of ``logits`` (-inf for absent actions: exp gives 0) and its argmax."""
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


NOT_FINITE = -2  # judgment_score_one's answer to a NaN or Inf factor


@numba.njit(cache=True, nogil=True, boundscheck=False)
def judgment_score_one(x, c, centroids, initialized, wins, support, criterion_logits, tau,
                       min_confidence):  # pragma: no cover
    """One decision, no allocation: returns (action, or -1 to abstain, or NOT_FINITE; confidence).

    The attention ``K * softmax(criterion_logits[c])`` is computed here, from the live
    parameter, so no cached copy can go stale.
    """
    n_actions, n_slots, n_factors = centroids.shape[1], centroids.shape[2], centroids.shape[3]
    for k in range(n_factors):
        if not math.isfinite(x[k]):
            return NOT_FINITE, 0.0
    alpha = np.empty(n_factors, np.float32)
    top = criterion_logits[c, 0]
    for k in range(1, n_factors):
        top = max(top, criterion_logits[c, k])
    total = np.float32(0.0)
    for k in range(n_factors):
        alpha[k] = np.float32(math.exp(criterion_logits[c, k] - top))
        total += alpha[k]
    for k in range(n_factors):
        alpha[k] = np.float32(n_factors) * (alpha[k] / total)
    tau32 = np.float32(tau)
    best = -1
    best_logit = _NEG_INF
    logits = np.empty(n_actions, np.float32)
    for a in range(n_actions):
        logits[a] = _NEG_INF
        for p in range(n_slots):
            if not _scores(initialized, wins, c, a, p, support):
                continue
            d = np.float32(0.0)
            for k in range(n_factors):
                diff = x[k] - centroids[c, a, p, k]
                d += alpha[k] * (diff * diff)
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def judgment_loop(centroids, initialized, counts, wins, alpha, x, category, action, confirmed, has_confirmed, skip,
                  tau, eta_confirmed, eta_override, drift_threshold, gate_damping, clip_low, clip_high, do_clip,
                  push_rate, min_confidence, spawn_threshold, spawn_support, win_decay,
                  adaptive, shadow, statistic, evidence, following, follow_weight, run_mean, run_count, tracking,
                  lead, shadow_eta, promotion_threshold, evidence_clip, evidence_allowance, tracking_eta, lead_rate,
                  logits, probs, out_action, confidence, sq_diff, nearest,
                  applied, gated, skipped, first_touch, eta_out, displacement, promoted, prototype, spawned,
                  recycled, before, promo_statistic, promo_evidence, promo_shift):  # pragma: no cover
    """Score-before-learn over a batch in stream order, mutating the state in place.

    The state has P prototype slots per (category, action): ``centroids`` (C, A, P, K),
    ``initialized`` (C, A, P) (the slot is in use), ``counts`` (C, A, P) and ``wins`` (C, A, P),
    each prototype's recent wins (read only when P > 1). An action scores with its nearest
    scoring prototype (:func:`_scores`); ``nearest[b, a]`` is that slot (-1: none), and
    ``sq_diff[b, a]`` its squared differences (slot 0's when the action has none).

    Learning moves the verified action's nearest prototype in use (unweighted L2, the gate's
    distance) with the gated rule. When P > 1 and that distance exceeds ``spawn_threshold``,
    the decision instead starts a new prototype in a free slot, or in the slot with the fewest
    wins when all are in use (``recycled``). Each applied decision decays the wins of its
    action's prototypes by ``1 - win_decay`` and adds 1 to the one it taught (``prototype``);
    ``before[b]`` is that prototype's row before the decision changed it.

    With ``adaptive`` (``drift_mode='adaptive'``, see ``docs/drift.md``) a verified decision
    that moves an existing prototype is first weighed as evidence: ``e = clip(shadow logit -
    prototype logit, +-evidence_clip) - evidence_allowance`` (the taught prototype and its
    shadow) feeds the category's CUSUM ``statistic`` (floored at 0), and ``evidence[c] =
    [closer to the shadow, not closer]`` counts the decisions of the current run (since the
    statistic last stood at 0: the run, whose start is the test's estimate of the change
    point). ``run_mean`` / ``run_count`` are each prototype's mean of the decisions it learned
    during the run (reset with the run). After learning (the shadow at ``shadow_eta``, ungated;
    set to ``x`` with a new prototype), a statistic above ``promotion_threshold`` promotes the
    category: each prototype in use becomes its run mean, or, when the run has none of its
    decisions, its shadow with no weight (its next decision replaces it, like a first touch),
    and starts ``following``. A following prototype learns as a running mean that continues
    from the run: weight 1 a decision, ``gate_damping`` past the gate's threshold (once it has
    a weight to protect), ``eta = weight / follow_weight`` (the total so far), until
    ``eta_confirmed * (follow_weight + 1) >= 1``, where the seed rule's rate takes over. The
    promotion records the evidence in ``promo_*`` and resets the test.

    Each prototype also has a *tracking* prototype (``tracking``): a moving average of its
    decisions at ``tracking_eta``, halved past the gate's threshold, with no difference between
    confirmations and overrides. ``lead[c]`` is a moving average (rate ``lead_rate``) of the
    clipped logit gap ``tracking logit - prototype logit`` of each verified decision's action;
    while it is above 0 the category scores with its tracking prototypes (``sq_diff`` and
    ``nearest`` are then theirs). A promotion resets it to 0: the promoted prototypes score.
    """
    n_decisions, n_factors = x.shape
    n_actions, n_slots = centroids.shape[1], centroids.shape[2]
    tau32 = np.float32(tau)
    eta_c32 = np.float32(eta_confirmed)
    eta_o32 = np.float32(eta_override)
    damping32 = np.float32(gate_damping)
    push32 = np.float32(push_rate)
    low32 = np.float32(clip_low)
    high32 = np.float32(clip_high)
    shadow_eta32 = np.float32(shadow_eta)
    tracking_eta32 = np.float32(tracking_eta)
    lead_rate32 = np.float32(lead_rate)
    keep32 = np.float32(1.0) - np.float32(win_decay)
    for b in range(n_decisions):
        c = category[b]
        # -- score with the state left by decisions 0..b-1 (adaptive: the tracking prototypes while they lead,
        # through _score_decision, which repeats this loop: with this loop inlined twice, or called in both
        # cases, the seed rule ran 30-60% slower, measured against the loop written out here)
        tracked = adaptive and lead[c] > 0
        if tracked:
            best, best_logit = _score_decision(x, b, c, tracking, initialized, wins, spawn_support, alpha, tau32,
                                               logits, sq_diff, nearest)
        else:
            best, best_logit = -1, _NEG_INF
            for a in range(n_actions):
                if n_slots == 1:  # the original design: one prototype, squared differences kept as computed
                    d = np.float32(0.0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, a, 0, k]
                        sq = diff * diff
                        sq_diff[b, a, k] = sq
                        d += alpha[c, k] * sq
                    logit_a = -d / tau32 if initialized[c, a, 0] else _NEG_INF
                    nearest[b, a] = 0 if initialized[c, a, 0] else -1
                else:
                    logit_a, near = _nearest_slot(x, b, c, a, centroids, initialized, wins, spawn_support, alpha,
                                                  tau32)
                    nearest[b, a] = near
                    row = max(near, 0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, a, row, k]
                        sq_diff[b, a, k] = diff * diff
                logits[b, a] = logit_a
                if logit_a > best_logit:
                    best_logit = logit_a
                    best = a
        _finish_softmax(b, best, best_logit, logits, probs, out_action, confidence, min_confidence)
        recommended = out_action[b]
        # -- learn
        if skip[b]:
            skipped[b] = True
            continue
        a = action[b]
        is_confirmed = confirmed[b] if has_confirmed else recommended == a
        eta = eta_c32 if is_confirmed else eta_o32
        # the prototype this decision teaches: the nearest in use, by the gate's unweighted distance
        target = -1
        disp = np.float32(0.0)
        if n_slots == 1:
            if initialized[c, a, 0]:
                target = 0
                total = np.float32(0.0)
                if tracked:  # the gate measures against the prototype, not the estimate that scored
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, a, 0, k]
                        total += diff * diff
                else:
                    for k in range(n_factors):
                        total += sq_diff[b, a, k]
                disp = np.float32(math.sqrt(total))
        else:
            closest = np.float32(np.inf)
            for p in range(n_slots):
                if initialized[c, a, p]:
                    total = np.float32(0.0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, a, p, k]
                        total += diff * diff
                    if total < closest:
                        closest = total
                        target = p
            if target >= 0:
                disp = np.float32(math.sqrt(closest))
        spawn = target >= 0 and n_slots > 1 and disp > spawn_threshold
        follow = False
        if adaptive and target >= 0 and not spawn:
            # the verified action's prototype logit: already scored unless tracking prototypes or slots scored
            if n_slots == 1 and not tracked:
                proto_logit = logits[b, a]
            else:
                proto_logit = _logit(x, b, alpha, tau32, centroids, c, a, target)
            _weigh_evidence(b, c, a, target, proto_logit, x, alpha, tau32, shadow, statistic, evidence, run_count,
                            evidence_clip, evidence_allowance)
            # which of the prototype and its tracking prototype predicted the verified action better
            gap = _logit(x, b, alpha, tau32, tracking, c, a, target) - proto_logit
            clip32 = np.float32(evidence_clip)
            lead[c] += lead_rate32 * (min(max(gap, -clip32), clip32) - lead[c])
            follow = following[c, a, target]
        fresh = target < 0 or spawn  # the decision starts a prototype: it is set to x
        if target < 0:
            target = 0
            first_touch[b] = True
        elif spawn:
            displacement[b] = disp
            spawned[b] = True
            free = -1
            for p in range(n_slots):
                if not initialized[c, a, p]:
                    free = p
                    break
            if free < 0:  # every slot in use: recycle the one with the fewest recent wins
                free = 0
                for p in range(1, n_slots):
                    if wins[c, a, p] < wins[c, a, free]:
                        free = p
                recycled[b] = True
            target = free
            counts[c, a, target] = 0
            wins[c, a, target] = 0.0
        for k in range(n_factors):
            before[b, k] = centroids[c, a, target, k]
        if fresh:
            for k in range(n_factors):
                value = x[b, k]
                if do_clip:
                    value = min(max(value, low32), high32)
                centroids[c, a, target, k] = value
            initialized[c, a, target] = True
            eta = np.float32(1.0)
        else:
            displacement[b] = disp
            if follow:  # a running mean since the change point; the gate halves a far decision's weight
                weight = np.float32(1.0)
                if disp > drift_threshold and follow_weight[c, a, target] > 0:  # (a restart has nothing to damp)
                    weight = damping32
                    gated[b] = True
                follow_weight[c, a, target] += weight
                eta = weight / follow_weight[c, a, target]
                if eta_c32 * (follow_weight[c, a, target] + np.float32(1.0)) >= np.float32(1.0):
                    following[c, a, target] = False  # the running mean's rate has come down to the seed rule's
            elif disp > drift_threshold:
                eta = eta * damping32
                gated[b] = True
            for k in range(n_factors):
                value = centroids[c, a, target, k] + eta * (x[b, k] - centroids[c, a, target, k])
                if do_clip:
                    value = min(max(value, low32), high32)
                centroids[c, a, target, k] = value
        counts[c, a, target] += 1
        if n_slots > 1:
            for p in range(n_slots):
                wins[c, a, p] *= keep32
            wins[c, a, target] += np.float32(1.0)
        applied[b] = True
        eta_out[b] = eta
        prototype[b] = target
        if push32 > 0 and not is_confirmed and recommended >= 0 and recommended != a:
            r = nearest[b, recommended]
            for k in range(n_factors):
                value = centroids[c, recommended, r, k] - push32 * (x[b, k] - centroids[c, recommended, r, k])
                if do_clip:
                    value = min(max(value, low32), high32)
                centroids[c, recommended, r, k] = value
        if adaptive:
            _track(b, c, a, target, fresh, x, tracking, tracking_eta32, drift_threshold, damping32, do_clip, low32,
                   high32)
            _shadow_and_promotion(b, c, a, target, fresh, x, centroids, initialized, shadow, statistic, evidence,
                                  following, follow_weight, run_mean, run_count, shadow_eta32, eta_c32,
                                  promotion_threshold, do_clip, low32, high32, promoted, promo_statistic,
                                  promo_evidence, promo_shift)
            if promoted[b]:
                lead[c] = 0.0  # the promoted prototypes score


@numba.njit(nogil=True, boundscheck=False)
def _score_decision(x, b, c, scored, initialized, wins, support, alpha, tau32, logits, sq_diff,
                    nearest):  # pragma: no cover
    """Every action's logit for decision ``b`` against ``scored`` (C, A, P, K), with its squared
    differences and nearest slot; returns (best action, its logit), (-1, -inf) when none scores.
    The same loop as the scoring in :func:`judgment_loop`, kept as a called function (see there)."""
    n_actions, n_slots, n_factors = scored.shape[1], scored.shape[2], scored.shape[3]
    best = -1
    best_logit = _NEG_INF
    for a in range(n_actions):
        if n_slots == 1:  # the original design: one prototype, squared differences kept as computed
            d = np.float32(0.0)
            for k in range(n_factors):
                diff = x[b, k] - scored[c, a, 0, k]
                sq = diff * diff
                sq_diff[b, a, k] = sq
                d += alpha[c, k] * sq
            logit_a = -d / tau32 if initialized[c, a, 0] else _NEG_INF
            nearest[b, a] = 0 if initialized[c, a, 0] else -1
        else:
            logit_a, near = _nearest_slot(x, b, c, a, scored, initialized, wins, support, alpha, tau32)
            nearest[b, a] = near
            row = max(near, 0)
            for k in range(n_factors):
                diff = x[b, k] - scored[c, a, row, k]
                sq_diff[b, a, k] = diff * diff
        logits[b, a] = logit_a
        if logit_a > best_logit:
            best_logit = logit_a
            best = a
    return best, best_logit


@numba.njit(inline="always", nogil=True, boundscheck=False)
def _logit(x, b, alpha, tau32, estimates, c, a, p):  # pragma: no cover
    """The logit of one estimate (a prototype, or its tracking prototype) for decision ``b``."""
    d = np.float32(0.0)
    for k in range(x.shape[1]):
        diff = x[b, k] - estimates[c, a, p, k]
        d += alpha[c, k] * (diff * diff)
    return -d / tau32


@numba.njit(nogil=True, boundscheck=False)
def _track(b, c, a, p, fresh, x, tracking, tracking_eta32, drift_threshold, damping32, do_clip, low32,
           high32):  # pragma: no cover
    """Move the tracking prototype of the taught prototype: ``tracking_eta``, halved past the gate's threshold."""
    n_factors = x.shape[1]
    eta = tracking_eta32
    if not fresh:
        total = np.float32(0.0)
        for k in range(n_factors):
            diff = x[b, k] - tracking[c, a, p, k]
            total += diff * diff
        if np.float32(math.sqrt(total)) > drift_threshold:
            eta = eta * damping32
    for k in range(n_factors):
        value = x[b, k] if fresh else tracking[c, a, p, k] + eta * (x[b, k] - tracking[c, a, p, k])
        if do_clip:
            value = min(max(value, low32), high32)
        tracking[c, a, p, k] = value


@numba.njit(inline="always", nogil=True, boundscheck=False)
def _weigh_evidence(b, c, a, p, proto_logit, x, alpha, tau32, shadow, statistic, evidence, run_count,
                    evidence_clip, evidence_allowance):  # pragma: no cover
    """The change test for one verified decision; a statistic back at 0 ends the run."""
    n_factors = x.shape[1]
    d = np.float32(0.0)
    for k in range(n_factors):
        diff = x[b, k] - shadow[c, a, p, k]
        d += alpha[c, k] * (diff * diff)
    gap = -d / tau32 - proto_logit  # shadow logit minus prototype logit of the verified action
    clip32 = np.float32(evidence_clip)
    e = min(max(gap, -clip32), clip32) - np.float32(evidence_allowance)
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
def _shadow_and_promotion(b, c, a, target, fresh, x, centroids, initialized, shadow, statistic, evidence, following,
                          follow_weight, run_mean, run_count, shadow_eta32, eta_c32, promotion_threshold, do_clip,
                          low32, high32, promoted, promo_statistic, promo_evidence, promo_shift):  # pragma: no cover
    """Move the shadow of the taught prototype (undamped), add the decision to the run, and
    promote the category when its test passes the threshold."""
    n_actions, n_slots, n_factors = centroids.shape[1], centroids.shape[2], centroids.shape[3]
    if fresh:  # a new prototype: nothing it saw before belongs to it
        following[c, a, target] = False
        follow_weight[c, a, target] = 0.0
        run_count[c, a, target] = 0
    for k in range(n_factors):
        if fresh:
            value = x[b, k]
        else:
            value = shadow[c, a, target, k] + shadow_eta32 * (x[b, k] - shadow[c, a, target, k])
        if do_clip:
            value = min(max(value, low32), high32)
        shadow[c, a, target, k] = value
    if statistic[c] > 0:
        run_count[c, a, target] += 1
        if run_count[c, a, target] == 1:
            for k in range(n_factors):
                run_mean[c, a, target, k] = x[b, k]
        else:
            inverse = np.float32(1.0) / np.float32(run_count[c, a, target])
            for k in range(n_factors):
                run_mean[c, a, target, k] += inverse * (x[b, k] - run_mean[c, a, target, k])
    if statistic[c] > promotion_threshold:
        moved = np.float32(0.0)
        n_moved = 0
        for j in range(n_actions):
            for p in range(n_slots):
                if initialized[c, j, p]:
                    from_run = run_count[c, j, p] > 0
                    total = np.float32(0.0)
                    for k in range(n_factors):
                        value = run_mean[c, j, p, k] if from_run else shadow[c, j, p, k]
                        if do_clip:
                            value = min(max(value, low32), high32)
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
        promoted[b] = True
        promo_statistic[b] = statistic[c]
        promo_evidence[b, 0] = evidence[c, 0]
        promo_evidence[b, 1] = evidence[c, 1]
        promo_shift[b] = moved / np.float32(n_moved)
        statistic[c] = 0.0
        evidence[c, 0] = 0
        evidence[c, 1] = 0


@numba.njit(cache=True, nogil=True, boundscheck=False)
def knn_loop(store_x, store_action, store_category, store_step, ring, k, scoped, respect_skip,
             x, category, action, skip, first_step,
             probs, out_action, confidence, applied, skipped, near_ids, near_dist):  # pragma: no cover
    """k-NN score-before-learn over a batch; ``ring = [size, head]`` is updated in place.

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
