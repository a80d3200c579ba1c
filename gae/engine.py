"""The exact online engine: score-before-learn over a batch, fast path and reference.

A prequential pass scores decision ``t`` with the state left by decisions ``0..t-1`` and
then learns from it, which is inherently sequential. The state is tiny (C x A x K floats),
so the loop runs as a compiled kernel (:mod:`gae._kernels`) on CPU copies of the state;
:func:`judgment_prequential_reference` and :func:`knn_prequential_reference` are the plain
torch transcriptions of the same rules that the tests hold the kernels equal to.

All functions here take CPU tensors of the right dtype, trust them (the modules validate),
and update the state tensors in place.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from gae import _kernels
from gae.types import LearnEvents, MemoryOutput, PromotionLog, Retrieved, StreamStep

BACKENDS = ("compiled", "reference")


class JudgmentRule(NamedTuple):
    """Hyperparameters of the centroid learning rule (see :class:`gae.JudgmentMemory`)."""

    tau: float
    eta_confirmed: float
    eta_override: float
    drift_threshold: float
    gate_damping: float
    clip: tuple[float, float] | None
    push_rate: float
    min_confidence: float
    # drift_mode='adaptive' (docs/drift.md); evidence_clip, evidence_allowance and lead_rate are fixed
    # by design, not tuned per stream
    shadow_eta: float = 0.5
    promotion_threshold: float = math.log(20.0)
    evidence_clip: float = 1.0  # nats: one decision can move the test (and the lead) by at most this
    evidence_allowance: float = 0.25  # nats subtracted per decision: no drift means a falling statistic
    tracking_eta: float = 0.2  # the tracking prototypes: a memory of about the last 5 decisions of their action
    lead_rate: float = 0.1  # the lead: who predicted the category's last 10 or so verified decisions better
    # prototypes=P > 1 (several prototypes per category and action)
    spawn_threshold: float = 0.5  # unweighted L2 beyond which a decision starts a new prototype
    spawn_support: float = 1.5  # recent wins a prototype needs to score: two wins close together
    win_decay: float = 0.05  # per decision of the action: wins remember about the last 1 / 0.05 = 20


class AdaptiveState(NamedTuple):
    """The state of ``drift_mode='adaptive'``, as CPU tensors updated in place."""

    shadow: Tensor  # (C, A, P, K) float32 shadow prototypes
    statistic: Tensor  # (C,) float32 CUSUM statistic per category
    evidence: Tensor  # (C, 2) int64 [closer to the shadow, not closer] in the test's current run
    following: Tensor  # (C, A, P) bool, the prototype learns as a running mean since a promotion
    follow_weight: Tensor  # (C, A, P) float32, the weight of that running mean so far
    run_mean: Tensor  # (C, A, P, K) float32, mean of the decisions each prototype learned in the current run
    run_count: Tensor  # (C, A, P) int64, how many (0: the run has none; run_mean is then stale)
    tracking: Tensor  # (C, A, P, K) float32 tracking prototypes
    lead: Tensor  # (C,) float32, how much better the tracking prototypes predicted lately (> 0: they score)


def _empty_events(n: int) -> LearnEvents:
    def flags() -> Tensor:
        return torch.zeros(n, dtype=torch.bool)

    return LearnEvents(flags(), flags(), flags(), flags(), torch.zeros(n), torch.zeros(n), flags(),
                       torch.full((n,), -1, dtype=torch.int64), flags(), flags())


def _promotions(events: LearnEvents, category: Tensor, statistic: Tensor, evidence: Tensor,
                shift: Tensor) -> PromotionLog:
    """The rows of the per-decision promotion outputs where a promotion happened (step = batch position)."""
    where = events.promoted.nonzero().squeeze(-1)
    return PromotionLog(where, category[where], statistic[where], evidence[where, 0], evidence[where, 1],
                        shift[where])


def judgment_prequential(
    centroids: Tensor,  # (C, A, P, K) float32, updated in place
    initialized: Tensor,  # (C, A, P) bool, updated in place
    counts: Tensor,  # (C, A, P) int64, updated in place
    wins: Tensor,  # (C, A, P) float32 recent wins, updated in place (unused when P = 1)
    alpha: Tensor,  # (C, K) float32 attention weights
    x: Tensor,  # (B, K) float32
    category: Tensor,  # (B,) int64
    action: Tensor,  # (B,) int64
    confirmed: Tensor | None,  # (B,) bool or None: derive from the recommendation
    skip: Tensor,  # (B,) bool
    rule: JudgmentRule,
    backend: str = "compiled",
    adaptive: AdaptiveState | None = None,  # drift_mode='adaptive', updated in place
) -> tuple[StreamStep, PromotionLog]:
    """Score-before-learn over a batch of decisions, in stream order.

    The state has a prototype-slot dimension P (one slot: the original design; the module
    passes its (C, A, K) buffers as views with P = 1). Returns the step and the promotions it
    made (``step`` = position in the batch; empty unless ``adaptive`` is given).
    """
    if backend == "reference":
        return judgment_prequential_reference(centroids, initialized, counts, wins, alpha, x, category, action,
                                              confirmed, skip, rule, adaptive)
    n, n_factors = x.shape
    n_actions = centroids.shape[1]
    logits = torch.empty(n, n_actions)
    probs = torch.empty(n, n_actions)
    out_action = torch.empty(n, dtype=torch.int64)
    confidence = torch.empty(n)
    sq_diff = torch.empty(n, n_actions, n_factors)
    nearest = torch.empty(n, n_actions, dtype=torch.int64)
    events = _empty_events(n)
    has_confirmed = confirmed is not None
    confirmed_np = (skip if confirmed is None else confirmed).numpy()  # unread when not has_confirmed
    clip_low, clip_high = rule.clip if rule.clip is not None else (0.0, 0.0)
    state = adaptive if adaptive is not None else _NO_ADAPTIVE
    promo_statistic, promo_evidence, promo_shift = torch.zeros(n), torch.zeros(n, 2, dtype=torch.int64), torch.zeros(n)
    before = torch.zeros(n, n_factors)
    _kernels.judgment_loop(
        centroids.numpy(), initialized.numpy(), counts.numpy(), wins.numpy(), alpha.numpy(),
        x.numpy(), category.numpy(), action.numpy(), confirmed_np, has_confirmed, skip.numpy(),
        rule.tau, rule.eta_confirmed, rule.eta_override, rule.drift_threshold, rule.gate_damping,
        clip_low, clip_high, rule.clip is not None, rule.push_rate, rule.min_confidence,
        rule.spawn_threshold, rule.spawn_support, rule.win_decay,
        adaptive is not None, state.shadow.numpy(), state.statistic.numpy(), state.evidence.numpy(),
        state.following.numpy(), state.follow_weight.numpy(), state.run_mean.numpy(), state.run_count.numpy(),
        state.tracking.numpy(), state.lead.numpy(), rule.shadow_eta, rule.promotion_threshold, rule.evidence_clip,
        rule.evidence_allowance, rule.tracking_eta, rule.lead_rate,
        logits.numpy(), probs.numpy(), out_action.numpy(), confidence.numpy(), sq_diff.numpy(), nearest.numpy(),
        events.applied.numpy(), events.gated.numpy(), events.skipped.numpy(), events.initialized.numpy(),
        events.eta.numpy(), events.displacement.numpy(), events.promoted.numpy(), events.prototype.numpy(),
        events.spawned.numpy(), events.recycled.numpy(), before.numpy(),
        promo_statistic.numpy(), promo_evidence.numpy(), promo_shift.numpy(),
    )
    step = StreamStep(MemoryOutput(logits, probs, out_action, confidence), events, sq_diff, nearest, before)
    return step, _promotions(events, category, promo_statistic, promo_evidence, promo_shift)


# placeholders the kernel never reads when drift_mode='seed' (one set of types: one compilation)
_NO_ADAPTIVE = AdaptiveState(torch.zeros(1, 1, 1, 1), torch.zeros(1), torch.zeros(1, 2, dtype=torch.int64),
                             torch.zeros(1, 1, 1, dtype=torch.bool), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1, 1),
                             torch.zeros(1, 1, 1, dtype=torch.int64), torch.zeros(1, 1, 1, 1), torch.zeros(1))


def scoring_mask(initialized: Tensor, wins: Tensor, support: float) -> Tensor:
    """(..., P) bool: the prototypes that take part in scoring, from the occupancy mask and the
    recent wins (both (..., P)): in use, and either ``wins >= support`` or the most wins of its
    action (ties: the lowest slot). With one slot, the occupancy mask itself."""
    if initialized.shape[-1] == 1:
        return initialized
    ranked = torch.where(initialized, wins, float("-inf"))
    top = torch.zeros_like(initialized).scatter_(-1, ranked.argmax(-1, keepdim=True), True)  # first maximum
    return initialized & ((wins >= support) | top)


def judgment_prequential_reference(centroids, initialized, counts, wins, alpha, x, category, action, confirmed,
                                   skip, rule: JudgmentRule,
                                   adaptive: AdaptiveState | None = None) -> tuple[StreamStep, PromotionLog]:
    """The same loop as :func:`judgment_prequential`, one decision at a time in plain torch."""
    n, n_factors = x.shape
    n_actions, n_slots = centroids.shape[1], centroids.shape[2]
    tau = torch.tensor(rule.tau, dtype=torch.float32)
    logits = torch.empty(n, n_actions)
    probs = torch.empty(n, n_actions)
    out_action = torch.empty(n, dtype=torch.int64)
    confidence = torch.empty(n)
    sq_diff = torch.empty(n, n_actions, n_factors)
    nearest = torch.empty(n, n_actions, dtype=torch.int64)
    events = _empty_events(n)
    promo_statistic, promo_evidence, promo_shift = torch.zeros(n), torch.zeros(n, 2, dtype=torch.int64), torch.zeros(n)
    before = torch.zeros(n, n_factors)

    def f32(value: float) -> Tensor:
        return torch.tensor(value, dtype=torch.float32)

    def clip_(row: Tensor) -> Tensor:
        return row.clamp_(*rule.clip) if rule.clip is not None else row

    for b in range(n):
        c, a = int(category[b]), int(action[b])
        sq = (x[b] - centroids[c]) ** 2  # (A, P, K): the prototypes, for the gate and the change test
        tracked = adaptive is not None and bool(adaptive.lead[c] > 0)  # the tracking prototypes score
        scored_sq = (x[b] - adaptive.tracking[c]) ** 2 if tracked and adaptive is not None else sq
        scores = scoring_mask(initialized[c], wins[c], rule.spawn_support)  # (A, P)
        slot_logits = torch.where(scores, -(scored_sq * alpha[c]).sum(-1) / tau, float("-inf"))  # (A, P)
        logits[b], near = slot_logits.max(-1)  # the first maximum: the lowest slot on a tie
        nearest[b] = torch.where(scores.any(-1), near, -1)
        sq_diff[b] = scored_sq[torch.arange(n_actions), nearest[b].clamp(min=0)]
        available = scores.any(-1)
        recommended = -1
        if available.any():
            probs[b] = torch.softmax(logits[b], dim=0)
            best = int(logits[b].argmax())
            if float(probs[b, best]) >= rule.min_confidence:  # compared in float64, like the kernels
                recommended = best
        else:
            probs[b] = 0.0
        out_action[b] = recommended
        confidence[b] = probs[b, recommended] if recommended >= 0 else 0.0
        if skip[b]:
            events.skipped[b] = True
            continue
        is_confirmed = bool(confirmed[b]) if confirmed is not None else recommended == a
        eta = torch.tensor(rule.eta_confirmed if is_confirmed else rule.eta_override, dtype=torch.float32)
        # the prototype this decision teaches: the nearest in use by the gate's unweighted distance
        in_use = initialized[c, a].nonzero().squeeze(-1)
        target, disp = -1, f32(0.0)
        if in_use.numel():
            distances = sq[a, in_use].sum(-1).sqrt()
            j = int(distances.argmin())
            target, disp = int(in_use[j]), distances[j]
        spawn = target >= 0 and n_slots > 1 and float(disp) > rule.spawn_threshold
        follow = False
        if adaptive is not None and target >= 0 and not spawn:
            shadow, statistic, evidence, following, follow_weight, run_mean, run_count, tracking, lead = adaptive
            # the change test: is the verified decision closer to the shadow than to the prototype?
            proto_logit = -(sq[a, target] * alpha[c]).sum() / tau
            gap = -((x[b] - shadow[c, a, target]) ** 2 * alpha[c]).sum() / tau - proto_logit
            step_evidence = gap.clamp(-rule.evidence_clip, rule.evidence_clip) - f32(rule.evidence_allowance)
            statistic[c] = torch.clamp(statistic[c] + step_evidence, min=0.0)
            if statistic[c] == 0:  # a new run of the test: its evidence and its means start again
                evidence[c] = 0
                run_count[c] = 0
            else:
                evidence[c, 0 if gap > 0 else 1] += 1
            follow = bool(following[c, a, target])
            # the lead: did the tracking prototype predict the verified action better than the prototype?
            lead_gap = -((x[b] - tracking[c, a, target]) ** 2 * alpha[c]).sum() / tau - proto_logit
            clipped = lead_gap.clamp(-rule.evidence_clip, rule.evidence_clip)
            lead[c] += f32(rule.lead_rate) * (clipped - lead[c])
        fresh = target < 0 or spawn
        if target < 0:
            target = 0
            events.initialized[b] = True
        elif spawn:
            events.displacement[b], events.spawned[b] = disp, True
            free = (~initialized[c, a]).nonzero().squeeze(-1)
            if free.numel():
                target = int(free[0])
            else:  # every slot in use: recycle the one with the fewest recent wins (the lowest slot on a tie)
                target = int(wins[c, a].argmin())
                events.recycled[b] = True
            counts[c, a, target], wins[c, a, target] = 0, 0.0
        before[b] = centroids[c, a, target]
        if fresh:
            centroids[c, a, target] = clip_(x[b].clone())
            initialized[c, a, target] = True
            eta = torch.tensor(1.0)
        else:
            events.displacement[b] = disp
            if follow:  # a running mean since the change point: the gate halves a far decision's weight
                weight = f32(1.0)
                if float(disp) > rule.drift_threshold and follow_weight[c, a, target] > 0:  # a restart: no damping
                    weight = torch.tensor(rule.gate_damping, dtype=torch.float32)
                    events.gated[b] = True
                follow_weight[c, a, target] += weight
                eta = weight / follow_weight[c, a, target]
                if f32(rule.eta_confirmed) * (follow_weight[c, a, target] + f32(1.0)) >= 1.0:
                    following[c, a, target] = False  # its rate is down to the seed rule's: that rule takes over
            elif float(disp) > rule.drift_threshold:  # float32 displacement against the float64 threshold
                eta = eta * torch.tensor(rule.gate_damping, dtype=torch.float32)
                events.gated[b] = True
            centroids[c, a, target] = clip_(centroids[c, a, target] + eta * (x[b] - centroids[c, a, target]))
        counts[c, a, target] += 1
        if n_slots > 1:
            wins[c, a] *= f32(1.0) - f32(rule.win_decay)
            wins[c, a, target] += 1.0
        events.applied[b], events.eta[b], events.prototype[b] = True, eta, target
        if rule.push_rate > 0 and not is_confirmed and recommended >= 0 and recommended != a:
            push = torch.tensor(rule.push_rate, dtype=torch.float32)
            r, p = recommended, int(nearest[b, recommended])
            centroids[c, r, p] = clip_(centroids[c, r, p] - push * (x[b] - centroids[c, r, p]))
        if adaptive is None:
            continue
        shadow, statistic, evidence, following, follow_weight, run_mean, run_count, tracking, lead = adaptive
        if fresh:  # a new prototype: nothing seen before belongs to it
            tracking[c, a, target] = clip_(x[b].clone())
            shadow[c, a, target] = clip_(x[b].clone())
            following[c, a, target], follow_weight[c, a, target], run_count[c, a, target] = False, 0.0, 0
        else:  # the tracking prototype at tracking_eta, halved past the gate's threshold; the shadow ungated
            eta_t = f32(rule.tracking_eta)
            if float((x[b] - tracking[c, a, target]).pow(2).sum().sqrt()) > rule.drift_threshold:
                eta_t = eta_t * torch.tensor(rule.gate_damping, dtype=torch.float32)
            tracking[c, a, target] = clip_(tracking[c, a, target] + eta_t * (x[b] - tracking[c, a, target]))
            shadow[c, a, target] = clip_(shadow[c, a, target] + f32(rule.shadow_eta) * (x[b] - shadow[c, a, target]))
        if statistic[c] > 0:  # the decision belongs to the test's current run
            run_count[c, a, target] += 1
            if run_count[c, a, target] == 1:
                run_mean[c, a, target] = x[b]
            else:
                inverse = f32(1.0) / run_count[c, a, target].to(torch.float32)
                run_mean[c, a, target] += inverse * (x[b] - run_mean[c, a, target])
        if float(statistic[c]) > rule.promotion_threshold:
            live = initialized[c]
            from_run = run_count[c] > 0
            promoted = clip_(torch.where(from_run[..., None], run_mean[c], shadow[c]))
            promo_shift[b] = (promoted[live] - centroids[c][live]).pow(2).sum(-1).sqrt().mean()
            promo_statistic[b], promo_evidence[b] = statistic[c], evidence[c]
            centroids[c][live] = promoted[live]
            weight = torch.where(from_run, run_count[c].to(torch.float32), 0.0)  # a shadow: restarts, no weight
            follow_weight[c][live] = weight[live]
            following[c][live] = (f32(rule.eta_confirmed) * (weight + f32(1.0)) < 1.0)[live]  # a long run: handed over
            run_count[c][live] = 0
            events.promoted[b] = True
            statistic[c], evidence[c], lead[c] = 0.0, 0, 0.0  # the promoted prototypes score
    step = StreamStep(MemoryOutput(logits, probs, out_action, confidence), events, sq_diff, nearest, before)
    return step, _promotions(events, category, promo_statistic, promo_evidence, promo_shift)


class KNNState(NamedTuple):
    """The ring buffer of :class:`gae.KNNMemory`, as CPU tensors updated in place."""

    factors: Tensor  # (N, K) float32
    actions: Tensor  # (N,) int64
    categories: Tensor  # (N,) int64
    steps: Tensor  # (N,) int64, sequence number of the decision that wrote the slot
    ring: Tensor  # (2,) int64: [size, head]


def _knn_output(probs: Tensor, out_action: Tensor, confidence: Tensor) -> MemoryOutput:
    return MemoryOutput(probs.log(), probs, out_action, confidence)


def knn_prequential(state: KNNState, x: Tensor, category: Tensor, action: Tensor, skip: Tensor, first_step: int,
                    k: int, scoped: bool, respect_skip: bool, n_actions: int,
                    backend: str = "compiled") -> tuple[MemoryOutput, LearnEvents, Retrieved]:
    """k-NN score-before-learn over a batch; see :class:`gae.KNNMemory` for the rule."""
    if backend == "reference":
        return knn_prequential_reference(state, x, category, action, skip, first_step, k, scoped, respect_skip,
                                         n_actions)
    n = x.shape[0]
    probs = torch.empty(n, n_actions)
    out_action = torch.empty(n, dtype=torch.int64)
    confidence = torch.empty(n)
    events = _empty_events(n)
    near_ids = torch.empty(n, k, dtype=torch.int64)
    near_dist = torch.empty(n, k, dtype=torch.float64)
    _kernels.knn_loop(state.factors.numpy(), state.actions.numpy(), state.categories.numpy(), state.steps.numpy(),
                      state.ring.numpy(), k, scoped, respect_skip,
                      x.numpy(), category.numpy(), action.numpy(), skip.numpy(), first_step,
                      probs.numpy(), out_action.numpy(), confidence.numpy(),
                      events.applied.numpy(), events.skipped.numpy(), near_ids.numpy(), near_dist.numpy())
    events.eta.masked_fill_(events.applied, 1.0)
    return _knn_output(probs, out_action, confidence), events, Retrieved(near_ids, near_dist)


def knn_prequential_reference(state: KNNState, x, category, action, skip, first_step, k, scoped, respect_skip,
                              n_actions) -> tuple[MemoryOutput, LearnEvents, Retrieved]:
    """The same loop as :func:`knn_prequential`, one decision at a time in plain torch."""
    n = x.shape[0]
    capacity = state.factors.shape[0]
    probs = torch.zeros(n, n_actions)
    out_action = torch.full((n,), -1, dtype=torch.int64)
    confidence = torch.zeros(n)
    events = _empty_events(n)
    near_ids = torch.full((n, k), -1, dtype=torch.int64)
    near_dist = torch.full((n, k), float("inf"), dtype=torch.float64)
    for b in range(n):
        size, head = int(state.ring[0]), int(state.ring[1])
        order = (head - size + torch.arange(size)) % capacity  # oldest first
        stored_x, stored_a, stored_step = state.factors[order].double(), state.actions[order], state.steps[order]
        if scoped:
            keep = state.categories[order] == category[b]
            stored_x, stored_a, stored_step = stored_x[keep], stored_a[keep], stored_step[keep]
        dist = ((x[b].double() - stored_x) ** 2).sum(-1).sqrt()
        ranked = torch.sort(dist, stable=True).indices[:k]
        near_ids[b, :ranked.numel()] = stored_step[ranked]
        near_dist[b, :ranked.numel()] = dist[ranked]
        if stored_x.shape[0] >= k:
            nearest = ranked
            neighbour_actions = stored_a[nearest]
            votes = torch.zeros(n_actions, dtype=torch.float64)
            votes.index_add_(0, neighbour_actions, 1.0 / (dist[nearest] + 1e-8))
            is_best = votes[neighbour_actions] == votes.max()
            best = int(neighbour_actions[int(is_best.nonzero()[0])])
            probs[b] = (votes / votes.sum()).float()
            out_action[b] = best
            confidence[b] = votes[best] / votes.sum()
        if respect_skip and skip[b]:
            events.skipped[b] = True
            continue
        state.factors[head] = x[b]
        state.actions[head] = action[b]
        state.categories[head] = category[b]
        state.steps[head] = first_step + b
        state.ring[0] = min(size + 1, capacity)
        state.ring[1] = (head + 1) % capacity
        events.applied[b] = True
        events.eta[b] = 1.0
    return _knn_output(probs, out_action, confidence), events, Retrieved(near_ids, near_dist)
