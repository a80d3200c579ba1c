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

from typing import NamedTuple

import torch
from torch import Tensor

from gae import _kernels
from gae.types import LearnEvents, MemoryOutput, StreamStep

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


def _empty_events(n: int) -> LearnEvents:
    def flags() -> Tensor:
        return torch.zeros(n, dtype=torch.bool)

    return LearnEvents(flags(), flags(), flags(), flags(), torch.zeros(n), torch.zeros(n))


def judgment_prequential(
    centroids: Tensor,  # (C, A, K) float32, updated in place
    initialized: Tensor,  # (C, A) bool, updated in place
    counts: Tensor,  # (C, A) int64, updated in place
    alpha: Tensor,  # (C, K) float32 attention weights
    x: Tensor,  # (B, K) float32
    category: Tensor,  # (B,) int64
    action: Tensor,  # (B,) int64
    confirmed: Tensor | None,  # (B,) bool or None: derive from the recommendation
    skip: Tensor,  # (B,) bool
    rule: JudgmentRule,
    backend: str = "compiled",
) -> StreamStep:
    """Score-before-learn over a batch of decisions, in stream order."""
    if backend == "reference":
        return judgment_prequential_reference(centroids, initialized, counts, alpha, x, category, action,
                                              confirmed, skip, rule)
    n, n_factors = x.shape
    n_actions = centroids.shape[1]
    logits = torch.empty(n, n_actions)
    probs = torch.empty(n, n_actions)
    out_action = torch.empty(n, dtype=torch.int64)
    confidence = torch.empty(n)
    sq_diff = torch.empty(n, n_actions, n_factors)
    events = _empty_events(n)
    has_confirmed = confirmed is not None
    confirmed_np = (skip if confirmed is None else confirmed).numpy()  # unread when not has_confirmed
    clip_low, clip_high = rule.clip if rule.clip is not None else (0.0, 0.0)
    _kernels.judgment_loop(
        centroids.numpy(), initialized.numpy(), counts.numpy(), alpha.numpy(),
        x.numpy(), category.numpy(), action.numpy(), confirmed_np, has_confirmed, skip.numpy(),
        rule.tau, rule.eta_confirmed, rule.eta_override, rule.drift_threshold, rule.gate_damping,
        clip_low, clip_high, rule.clip is not None, rule.push_rate, rule.min_confidence,
        logits.numpy(), probs.numpy(), out_action.numpy(), confidence.numpy(), sq_diff.numpy(),
        *(field.numpy() for field in events),
    )
    return StreamStep(MemoryOutput(logits, probs, out_action, confidence), events, sq_diff)


def judgment_prequential_reference(centroids, initialized, counts, alpha, x, category, action, confirmed, skip,
                                   rule: JudgmentRule) -> StreamStep:
    """The same loop as :func:`judgment_prequential`, one decision at a time in plain torch."""
    n, n_factors = x.shape
    n_actions = centroids.shape[1]
    tau = torch.tensor(rule.tau, dtype=torch.float32)
    logits = torch.empty(n, n_actions)
    probs = torch.empty(n, n_actions)
    out_action = torch.empty(n, dtype=torch.int64)
    confidence = torch.empty(n)
    sq_diff = torch.empty(n, n_actions, n_factors)
    applied, gated, skipped, first_touch, eta_out, displacement = _empty_events(n)

    def clip_(row: Tensor) -> Tensor:
        return row.clamp_(*rule.clip) if rule.clip is not None else row

    for b in range(n):
        c, a = int(category[b]), int(action[b])
        sq = (x[b] - centroids[c]) ** 2  # (A, K)
        sq_diff[b] = sq
        logits[b] = torch.where(initialized[c], -(sq * alpha[c]).sum(-1) / tau, float("-inf"))
        recommended = -1
        if initialized[c].any():
            probs[b] = torch.softmax(logits[b], dim=0)
            best = int(logits[b].argmax())
            if float(probs[b, best]) >= rule.min_confidence:  # compared in float64, like the kernels
                recommended = best
        else:
            probs[b] = 0.0
        out_action[b] = recommended
        confidence[b] = probs[b, recommended] if recommended >= 0 else 0.0
        if skip[b]:
            skipped[b] = True
            continue
        is_confirmed = bool(confirmed[b]) if confirmed is not None else recommended == a
        eta = torch.tensor(rule.eta_confirmed if is_confirmed else rule.eta_override, dtype=torch.float32)
        if not initialized[c, a]:
            centroids[c, a] = clip_(x[b].clone())
            initialized[c, a] = True
            first_touch[b] = True
            eta = torch.tensor(1.0)
        else:
            disp = sq[a].sum().sqrt()
            displacement[b] = disp
            if float(disp) > rule.drift_threshold:  # float32 displacement against the float64 threshold
                eta = eta * torch.tensor(rule.gate_damping, dtype=torch.float32)
                gated[b] = True
            centroids[c, a] = clip_(centroids[c, a] + eta * (x[b] - centroids[c, a]))
        counts[c, a] += 1
        applied[b] = True
        eta_out[b] = eta
        if rule.push_rate > 0 and not is_confirmed and recommended >= 0 and recommended != a:
            push = torch.tensor(rule.push_rate, dtype=torch.float32)
            r = recommended
            centroids[c, r] = clip_(centroids[c, r] - push * (x[b] - centroids[c, r]))
    events = LearnEvents(applied, gated, skipped, first_touch, eta_out, displacement)
    return StreamStep(MemoryOutput(logits, probs, out_action, confidence), events, sq_diff)


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
                    backend: str = "compiled") -> tuple[MemoryOutput, LearnEvents]:
    """k-NN score-before-learn over a batch; see :class:`gae.KNNMemory` for the rule."""
    if backend == "reference":
        return knn_prequential_reference(state, x, category, action, skip, first_step, k, scoped, respect_skip,
                                         n_actions)
    n = x.shape[0]
    probs = torch.empty(n, n_actions)
    out_action = torch.empty(n, dtype=torch.int64)
    confidence = torch.empty(n)
    events = _empty_events(n)
    _kernels.knn_loop(state.factors.numpy(), state.actions.numpy(), state.categories.numpy(), state.steps.numpy(),
                      state.ring.numpy(), k, scoped, respect_skip,
                      x.numpy(), category.numpy(), action.numpy(), skip.numpy(), first_step,
                      probs.numpy(), out_action.numpy(), confidence.numpy(),
                      events.applied.numpy(), events.skipped.numpy())
    events.eta.masked_fill_(events.applied, 1.0)
    return _knn_output(probs, out_action, confidence), events


def knn_prequential_reference(state: KNNState, x, category, action, skip, first_step, k, scoped, respect_skip,
                              n_actions) -> tuple[MemoryOutput, LearnEvents]:
    """The same loop as :func:`knn_prequential`, one decision at a time in plain torch."""
    n = x.shape[0]
    capacity = state.factors.shape[0]
    probs = torch.zeros(n, n_actions)
    out_action = torch.full((n,), -1, dtype=torch.int64)
    confidence = torch.zeros(n)
    events = _empty_events(n)
    for b in range(n):
        size, head = int(state.ring[0]), int(state.ring[1])
        order = (head - size + torch.arange(size)) % capacity  # oldest first
        stored_x, stored_a = state.factors[order].double(), state.actions[order]
        if scoped:
            keep = state.categories[order] == category[b]
            stored_x, stored_a = stored_x[keep], stored_a[keep]
        if stored_x.shape[0] >= k:
            dist = ((x[b].double() - stored_x) ** 2).sum(-1).sqrt()
            nearest = torch.sort(dist, stable=True).indices[:k]
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
    return _knn_output(probs, out_action, confidence), events
