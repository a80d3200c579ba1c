"""The compiled online loop of the judgment memory: the mirror of :mod:`gae.judgment.rule`'s learning.

See :mod:`gae.judgment.kernels` for the conventions; each function names its torch counterpart.
The slot operations are in :mod:`~gae.judgment.kernels.slots`, the ``learning='lvq'`` step in
:mod:`~gae.judgment.kernels.lvq`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from gae.compiled import view
from gae.judgment.kernels.lvq import lvq_step
from gae.judgment.kernels.scoring import (
    NEG_INF,
    NOT_FINITE,
    VARIANCE_FLOOR32,
    logit,
    metric_row,
    nearest_slot,
    output,
    pooled_spread,
    relevance,
    relevance_norm,
    score_decision,
    spread,
)
from gae.judgment.kernels.slots import clipped, push_away, spawn_slot, taught_slot
from gae.judgment.state import JudgmentState
from gae.types import LearnEvents


@numba.njit(inline="always", nogil=True, boundscheck=False)
def logit_gap(value, proto_logit):  # pragma: no cover
    """``value - proto_logit``, 0 where both are -inf and it would be NaN (``rule.logit_gap``)."""
    gap = value - proto_logit
    return gap if gap == gap else np.float32(0.0)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def weigh_evidence(x, b, c, a, p, proto_logit, alpha, tau32, shadow, statistic, evidence, run_count, clip32,
                   allowance32):  # pragma: no cover
    """One verified decision's step of the category's change test (``rule.weigh_evidence``)."""
    gap = logit_gap(logit(x, b, alpha, c, tau32, shadow, a, p), proto_logit)
    statistic[c] = max(np.float32(0.0), statistic[c] + (min(max(gap, -clip32), clip32) - allowance32))
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
def lead_step(x, b, c, a, p, proto_logit, alpha, tau32, tracking, lead, clip32, lead_rate32):  # pragma: no cover
    """The tracking lead of category ``c`` (``rule.lead_step``)."""
    gap = logit_gap(logit(x, b, alpha, c, tau32, tracking, a, p), proto_logit)
    lead[c] += lead_rate32 * (min(max(gap, -clip32), clip32) - lead[c])


@numba.njit(inline="always", nogil=True, boundscheck=False)
def follow_step(c, a, p, disp, following, follow_weight, drift_threshold, damping32, eta_c32):  # pragma: no cover
    """(eta, gated) of a prototype that follows a change, as a running mean (``rule.follow_step``)."""
    weight = np.float32(1.0)
    gated = False
    if disp > drift_threshold and follow_weight[c, a, p] > 0:  # (a restart has nothing to damp)
        weight = damping32
        gated = True
    follow_weight[c, a, p] += weight
    eta = weight / follow_weight[c, a, p]
    if eta_c32 * (follow_weight[c, a, p] + np.float32(1.0)) >= np.float32(1.0):
        following[c, a, p] = False  # the running mean's rate has come down to the seed rule's
    return eta, gated


@numba.njit(nogil=True, boundscheck=False)
def track(x, b, c, a, p, fresh, tracking, tracking_eta32, drift_threshold, damping32, do_clip, low32,
          high32):  # pragma: no cover
    """Move the taught prototype's tracking prototype (``rule.track``)."""
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
        tracking[c, a, p, k] = clipped(value, do_clip, low32, high32)


@numba.njit(inline="always", nogil=True, boundscheck=False)
def shadow_and_promotion(x, b, c, a, target, fresh, centroids, initialized, shadow, statistic, evidence, following,
                         follow_weight, run_mean, run_count, shadow_eta32, eta_c32, promotion_threshold, do_clip,
                         low32, high32, promoted, promo_statistic, promo_evidence,
                         promo_shift):  # pragma: no cover
    """Move the taught prototype's shadow, add the decision to the test's run, and promote the
    category when its statistic passes the threshold (``rule.shadow_and_promotion``; the caller
    resets the tracking lead of a promoted category)."""
    n_actions, n_slots, n_factors = centroids.shape[1], centroids.shape[2], centroids.shape[3]
    if fresh:  # a new prototype: nothing it saw before belongs to it
        following[c, a, target] = False
        follow_weight[c, a, target] = 0.0
        run_count[c, a, target] = 0
    for k in range(n_factors):
        value = x[b, k] if fresh else shadow[c, a, target, k] + shadow_eta32 * (x[b, k] - shadow[c, a, target, k])
        shadow[c, a, target, k] = clipped(value, do_clip, low32, high32)
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
                        value = clipped(run_mean[c, j, p, k] if from_run else shadow[c, j, p, k], do_clip, low32,
                                        high32)
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
def prequential(state, options, alpha, x, category, action, confirmed, given, skip, out, events, promotions, start,
                stop):  # pragma: no cover
    """Score-before-learn over rows ``start..stop-1`` of a batch in stream order, updating
    ``state`` in place (``rule.prequential``).

    ``out = (logits, probs, action, confidence, sq_diff, nearest, before)``, ``events`` the
    :class:`~gae.types.LearnEvents` arrays and ``promotions = (statistic, evidence, shift)``
    per decision, all preallocated (events and promotions as :meth:`LearnEvents.empty` makes
    them). ``confirmed[b]`` is used where ``given[b]``; elsewhere a decision is confirmed when
    the memory recommended its action.
    """
    (centroids, initialized, counts, wins, shadow, statistic, evidence, following, follow_weight, run_mean,
     run_count, tracking, lead, input_counts, means, variances, relevance_logits, recent_errors, factor_counts,
     factor_means, factor_variances) = state
    units = factor_variances if options.memory_units else variances  # what the metric is made of (rule.unit_variances)
    logits, probs, out_action, confidence, sq_diff, nearest, before = out
    applied, gated, skipped, first_touch, eta_out, displacement, promoted, prototype, spawned, recycled = events
    promo_statistic, promo_evidence, promo_shift = promotions
    adaptive, support, min_confidence = options.adaptive, options.spawn_support, options.min_confidence
    drift_threshold, spawn_threshold, push_rate = options.drift_threshold, options.spawn_threshold, options.push_rate
    do_clip, low32, high32 = options.clip, np.float32(options.clip_low), np.float32(options.clip_high)
    tau32, damping32 = np.float32(options.tau), np.float32(options.gate_damping)
    eta_c32, eta_o32 = np.float32(options.eta_confirmed), np.float32(options.eta_override)
    keep32 = np.float32(1.0) - np.float32(options.win_decay)
    clip32, allowance32 = np.float32(options.evidence_clip), np.float32(options.evidence_allowance)
    lead_rate32, tracking_eta32 = np.float32(options.lead_rate), np.float32(options.tracking_eta)
    shadow_eta32, promotion_threshold = np.float32(options.shadow_eta), options.promotion_threshold
    n_factors = x.shape[1]
    n_actions, n_slots = centroids.shape[1], centroids.shape[2]
    lvq = options.lvq
    # lvq: category c's row of the metric (rule.metric), made before it scores and again as it learns
    weights = np.empty_like(alpha) if lvq else alpha
    for b in range(start, stop):
        c = category[b]
        # -- score with the state left by decisions 0..b-1 (adaptive: the tracking prototypes while they lead)
        tracked = adaptive and lead[c] > 0
        if lvq:
            metric_row(weights, c, alpha, relevance_logits, units, c, options.pooled)
        if tracked:
            best, best_logit = score_decision(x, b, c, tracking, initialized, wins, support, alpha, tau32, logits,
                                              sq_diff, nearest)
        else:  # score_decision, written out: called here too (or inlined twice), the seed engine runs markedly slower
            best, best_logit = -1, NEG_INF
            for j in range(n_actions):
                if n_slots == 1:
                    d = np.float32(0.0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, j, 0, k]
                        sq = diff * diff
                        sq_diff[b, j, k] = sq
                        d += weights[c, k] * sq
                    logit_j = -d / tau32 if initialized[c, j, 0] else NEG_INF
                    nearest[b, j] = 0 if initialized[c, j, 0] else -1
                else:
                    logit_j, near = nearest_slot(x, b, c, j, centroids, initialized, wins, support, weights, tau32)
                    nearest[b, j] = near
                    row = max(near, 0)
                    for k in range(n_factors):
                        diff = x[b, k] - centroids[c, j, row, k]
                        sq_diff[b, j, k] = diff * diff
                logits[b, j] = logit_j
                if logit_j > best_logit:
                    best_logit = logit_j
                    best = j
        output(b, best, best_logit, logits, probs, out_action, confidence, min_confidence)
        recommended = out_action[b]
        if lvq:  # the squared differences in the metric's units (rule.units)
            top, total = relevance_norm(relevance_logits, c)
            common = pooled_spread(units, c) if options.pooled else VARIANCE_FLOOR32
            for k in range(n_factors):
                unit = relevance(relevance_logits, c, k, top, total) / spread(units, c, k, options.pooled, common)
                for j in range(n_actions):
                    sq_diff[b, j, k] *= unit
        # -- learn
        if skip[b]:
            skipped[b] = True
            continue
        a = action[b]
        if lvq:
            target, eta, disp, fresh, spawned[b], recycled[b] = lvq_step(
                x, b, c, a, recommended, nearest, logits, alpha, weights, centroids, initialized, counts, wins,
                input_counts, means, variances, relevance_logits, recent_errors, factor_counts, factor_means,
                factor_variances, before, options)
            first_touch[b] = fresh and not spawned[b]
            displacement[b] = disp
            applied[b] = True
            eta_out[b] = eta
            prototype[b] = target
            continue
        is_confirmed = confirmed[b] if given[b] else recommended == a
        eta = eta_c32 if is_confirmed else eta_o32
        if n_slots == 1 and not tracked:  # the squared differences just scored are the prototype's
            target, disp = -1, np.float32(0.0)
            if initialized[c, a, 0]:
                total = np.float32(0.0)
                for k in range(n_factors):
                    total += sq_diff[b, a, k]
                target, disp = 0, np.float32(math.sqrt(total))
        else:
            target, disp = taught_slot(x, b, c, a, centroids, initialized)
        spawn = target >= 0 and n_slots > 1 and disp > spawn_threshold
        follow = False
        if adaptive and target >= 0 and not spawn:
            # the verified action's prototype logit: already scored unless tracking prototypes or slots scored
            if n_slots == 1 and not tracked:
                proto_logit = logits[b, a]
            else:
                proto_logit = logit(x, b, alpha, c, tau32, centroids, a, target)
            weigh_evidence(x, b, c, a, target, proto_logit, alpha, tau32, shadow, statistic, evidence, run_count,
                           clip32, allowance32)
            lead_step(x, b, c, a, target, proto_logit, alpha, tau32, tracking, lead, clip32, lead_rate32)
            follow = following[c, a, target]
        fresh = target < 0 or spawn  # the decision starts a prototype: it is set to x
        if target < 0:
            target = 0
            first_touch[b] = True
        elif spawn:
            displacement[b] = disp
            spawned[b] = True
            # take_slot, keep_before, start_prototype, step_toward and credit, written out in this loop: called
            # here, the seed engine runs some 15% slower (measured against the written-out loop)
            target, recycled[b] = spawn_slot(c, a, initialized, wins)
            counts[c, a, target] = 0
            wins[c, a, target] = 0.0
        for k in range(n_factors):
            before[b, k] = centroids[c, a, target, k]
        if fresh:
            for k in range(n_factors):
                centroids[c, a, target, k] = clipped(x[b, k], do_clip, low32, high32)
            initialized[c, a, target] = True
            eta = np.float32(1.0)
        else:
            displacement[b] = disp
            if follow:
                eta, gated[b] = follow_step(c, a, target, disp, following, follow_weight, drift_threshold, damping32,
                                            eta_c32)
            elif disp > drift_threshold:  # the gate
                eta = eta * damping32
                gated[b] = True
            for k in range(n_factors):
                value = centroids[c, a, target, k] + eta * (x[b, k] - centroids[c, a, target, k])
                centroids[c, a, target, k] = clipped(value, do_clip, low32, high32)
        counts[c, a, target] += 1
        if n_slots > 1:
            for p in range(n_slots):
                wins[c, a, p] *= keep32
            wins[c, a, target] += np.float32(1.0)
        applied[b] = True
        eta_out[b] = eta
        prototype[b] = target
        if push_rate > 0 and not is_confirmed and recommended >= 0 and recommended != a:
            push_away(x, b, c, recommended, nearest[b, recommended], np.float32(push_rate), centroids, do_clip,
                      low32, high32)
        if adaptive:
            track(x, b, c, a, target, fresh, tracking, tracking_eta32, drift_threshold, damping32, do_clip, low32,
                  high32)
            shadow_and_promotion(x, b, c, a, target, fresh, centroids, initialized, shadow, statistic, evidence,
                                 following, follow_weight, run_mean, run_count, shadow_eta32, eta_c32,
                                 promotion_threshold, do_clip, low32, high32, promoted, promo_statistic,
                                 promo_evidence, promo_shift)
            if promoted[b]:
                lead[c] = 0.0  # the promoted prototypes score


STALE = -3  # learn_one: the attention logits differ from those of the staged run


@numba.njit(cache=True, nogil=True, boundscheck=False)
def learn_one(row, c, a, is_confirmed, is_given, is_skipped, n, limit, state, num_decisions, options, alpha, logits_now,
              logits_staged, x, ints, flags, reals, evidence, scores, sq_diff, nearest, before):  # pragma: no cover
    """One decision, learned in place as row ``n`` of a staged batch: its inputs are written into
    the batch's arrays and :func:`prequential` runs on that row alone, so the outputs, events
    and promotions land where a batch call would have put them, and ``num_decisions`` (a 0-d
    array) counts it. Returns ``(0, skipped, gated, eta, displacement, initialized)``, or
    NOT_FINITE / STALE (the attention logits differ from the staged run's) first with nothing
    changed.

    The arguments that change from call to call come first, so the caller binds the others.
    The per-decision arrays come packed (:class:`gae.judgment.online.Staged`): ``ints`` =
    (category, action, output action, prototype), ``flags`` = (confirmed, given, skip, then the
    event flags applied, gated, skipped, initialized, promoted, spawned, recycled), ``reals`` =
    (confidence, eta, displacement, promotion statistic, promotion shift), ``scores`` =
    (logits, probs); their rows are the arrays :func:`prequential` takes.
    """
    nothing = np.float32(0.0)
    for k in range(row.shape[0]):
        if not math.isfinite(row[k]) or abs(row[k]) > limit:
            return NOT_FINITE, False, False, nothing, nothing, False
    for i in range(logits_now.shape[0]):
        for k in range(logits_now.shape[1]):
            if logits_now[i, k] != logits_staged[i, k]:
                return STALE, False, False, nothing, nothing, False
    for k in range(row.shape[0]):
        x[n, k] = np.float32(row[k])
    ints[0, n] = c
    ints[1, n] = a
    flags[0, n] = is_confirmed
    flags[1, n] = is_given
    flags[2, n] = is_skipped
    out = (scores[0], scores[1], ints[2], reals[0], sq_diff, nearest, before)
    events = LearnEvents(flags[3], flags[4], flags[5], flags[6], reals[1], reals[2], flags[7], ints[3], flags[8],
                         flags[9])
    prequential(state, options, alpha, x, ints[0], ints[1], flags[0], flags[1], flags[2], out, events,
                (reals[3], evidence, reals[4]), n, n + 1)
    num_decisions[()] += 1
    return 0, flags[5, n], flags[4, n], reals[1, n], reals[2, n], flags[6, n]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def learn_one_at(row, c, a, is_confirmed, is_given, is_skipped, n, limit, options, addresses,
                 shapes):  # pragma: no cover
    """:func:`learn_one` with its arrays given by address (a :class:`gae.compiled.ArrayTable` of
    the state in :class:`~gae.judgment.state.JudgmentState` order, ``num_decisions``, alpha,
    the live and the staged attention logits, then the staged batch's nine arrays), which
    spares the call receiving and counting thirty arrays: the single-decision path's
    entry (``gae.judgment.online``)."""
    f32, i64, b8 = np.float32, np.int64, np.bool_
    s = shapes
    state = JudgmentState(
        view(addresses[0], (s[0, 0], s[0, 1], s[0, 2], s[0, 3]), f32),
        view(addresses[1], (s[1, 0], s[1, 1], s[1, 2]), b8),
        view(addresses[2], (s[2, 0], s[2, 1], s[2, 2]), i64),
        view(addresses[3], (s[3, 0], s[3, 1], s[3, 2]), f32),
        view(addresses[4], (s[4, 0], s[4, 1], s[4, 2], s[4, 3]), f32),
        view(addresses[5], (s[5, 0],), f32),
        view(addresses[6], (s[6, 0], s[6, 1]), i64),
        view(addresses[7], (s[7, 0], s[7, 1], s[7, 2]), b8),
        view(addresses[8], (s[8, 0], s[8, 1], s[8, 2]), f32),
        view(addresses[9], (s[9, 0], s[9, 1], s[9, 2], s[9, 3]), f32),
        view(addresses[10], (s[10, 0], s[10, 1], s[10, 2]), i64),
        view(addresses[11], (s[11, 0], s[11, 1], s[11, 2], s[11, 3]), f32),
        view(addresses[12], (s[12, 0],), f32),
        view(addresses[13], (s[13, 0],), i64),
        view(addresses[14], (s[14, 0], s[14, 1]), f32),
        view(addresses[15], (s[15, 0], s[15, 1]), f32),
        view(addresses[16], (s[16, 0], s[16, 1]), f32),
        view(addresses[17], (s[17, 0],), f32),
        view(addresses[18], (s[18, 0],), i64),
        view(addresses[19], (s[19, 0], s[19, 1]), f32),
        view(addresses[20], (s[20, 0], s[20, 1]), f32))
    return learn_one(row, c, a, is_confirmed, is_given, is_skipped, n, limit, state,
                     view(addresses[21], (), i64),
                     options,
                     view(addresses[22], (s[22, 0], s[22, 1]), f32),
                     view(addresses[23], (s[23, 0], s[23, 1]), f32),
                     view(addresses[24], (s[24, 0], s[24, 1]), f32),
                     view(addresses[25], (s[25, 0], s[25, 1]), f32),
                     view(addresses[26], (s[26, 0], s[26, 1]), i64),
                     view(addresses[27], (s[27, 0], s[27, 1]), b8),
                     view(addresses[28], (s[28, 0], s[28, 1]), f32),
                     view(addresses[29], (s[29, 0], s[29, 1]), i64),
                     view(addresses[30], (s[30, 0], s[30, 1], s[30, 2]), f32),
                     view(addresses[31], (s[31, 0], s[31, 1], s[31, 2]), f32),
                     view(addresses[32], (s[32, 0], s[32, 1]), i64),
                     view(addresses[33], (s[33, 0], s[33, 1]), f32))
