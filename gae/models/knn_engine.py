"""The rule of :class:`gae.KNNMemory`: its batched vote and its exact online engine.

:func:`knn_vote` scores a batch against the stored traces (plain tensor maths, any device).

The ring buffer is small, so the loop runs as a compiled kernel
(:func:`gae.models.knn_kernels.knn_loop`) on CPU copies; :func:`knn_prequential_reference`
is the plain torch transcription of the same rule that the tests hold it equal to. The
functions take CPU tensors of the right dtype, trust them (the module validates), and update
the state in place.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch._C import TensorBase

from gae.compiled import entry_point
from gae.models.knn_kernels import knn_loop, knn_one
from gae.types import LearnEvents, MemoryOutput, Retrieved

BACKENDS = ("compiled", "reference")


def knn_neighbours(
    queries: Tensor,  # (B, K)
    stored: Tensor,  # (N, K), oldest first
    k: int,
    allowed: Tensor | None = None,  # (B, N) bool, which stored traces each query may see
) -> tuple[Tensor, Tensor]:
    """The ``min(k, N)`` stored traces nearest each query: ``(distance, index)``, both (B, min(k, N)).

    Euclidean distances in float64, nearest first, ties to the older trace (a stable sort);
    ``inf`` distance past the traces a query may see.
    """
    dist = torch.cdist(queries.double(), stored.double(), compute_mode="donot_use_mm_for_euclid_dist")  # (B, N)
    if allowed is not None:
        dist = dist.masked_fill(~allowed, float("inf"))
    near_dist, near_index = torch.sort(dist, dim=-1, stable=True)
    return near_dist[:, :k], near_index[:, :k]


def knn_vote(
    queries: Tensor,  # (B, K)
    stored: Tensor,  # (N, K), oldest first
    stored_actions: Tensor,  # (N,) int64
    k: int,
    n_actions: int,
    allowed: Tensor | None = None,  # (B, N) bool, which stored traces each query may see
) -> MemoryOutput:
    """Distance-weighted k-NN vote of the original retrieval memory, batched.

    Distances are Euclidean in float64; the ``k`` nearest (ties: older first) vote with
    weight ``1 / (d + 1e-8)``; the winner is the action with the largest total, ties going
    to the action met first in neighbour order. Queries that see fewer than ``k`` traces
    abstain. ``probs`` are the vote shares and ``logits`` their log.
    """
    n = queries.shape[0]
    if stored.shape[0] < k:
        probs = torch.zeros(n, n_actions, device=queries.device)
        return MemoryOutput(probs.log(), probs, torch.full((n,), -1, device=queries.device),
                            torch.zeros(n, device=queries.device))
    near_dist, near_index = knn_neighbours(queries, stored, k, allowed)
    visible = torch.isfinite(near_dist).sum(-1)
    near_action = stored_actions[near_index]  # (B, k)
    votes = torch.zeros(n, n_actions, dtype=torch.float64, device=queries.device)
    votes.scatter_add_(1, near_action, 1.0 / (near_dist + 1e-8))
    total = votes.sum(-1, keepdim=True)
    is_best = votes.gather(1, near_action) == votes.max(-1, keepdim=True).values  # (B, k)
    first_best = is_best.int().argmax(-1, keepdim=True)
    action = near_action.gather(1, first_best).squeeze(-1)
    abstain = visible < k
    probs = (votes / total).float().masked_fill(abstain.unsqueeze(-1), 0.0)
    confidence = probs.gather(1, action.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return MemoryOutput(probs.log(), probs, action.masked_fill(abstain, -1), confidence.masked_fill(abstain, 0.0))


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
    events = LearnEvents.empty(n)
    near_ids = torch.empty(n, k, dtype=torch.int64)
    near_dist = torch.empty(n, k, dtype=torch.float64)
    knn_loop(state.factors.numpy(), state.actions.numpy(), state.categories.numpy(), state.steps.numpy(),
             state.ring.numpy(), k, scoped, respect_skip,
             x.numpy(), category.numpy(), action.numpy(), skip.numpy(), first_step,
             probs.numpy(), out_action.numpy(), confidence.numpy(),
             events.applied.numpy(), events.skipped.numpy(), near_ids.numpy(), near_dist.numpy())
    return knn_results(probs, out_action, confidence, events, near_ids, near_dist)


def knn_results(probs: Tensor, out_action: Tensor, confidence: Tensor, events: LearnEvents, near_ids: Tensor,
                near_dist: Tensor) -> tuple[MemoryOutput, LearnEvents, Retrieved]:
    """What the compiled loop wrote, as the engine's results (eta 1 for every stored decision)."""
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
    events = LearnEvents.empty(n)
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


class KNNHost:
    """The single-decision path of :class:`gae.KNNMemory`: NumPy views of its ring (kept between
    calls, rebuilt when a buffer is replaced), a preallocated batch of one and the compiled
    entry point of :func:`~gae.models.knn_kernels.knn_one` for them."""

    def __init__(self) -> None:
        self.touched: tuple[Tensor, ...] = ()
        self.pointers: tuple[int, ...] = (-1,)
        self.shape = (0, 0)  # (actions, k) the batch of one was made for
        self.call: Any = None

    def get(self, buffers: dict[str, Any], n_actions: int, k: int) -> KNNHost | None:
        """Itself while the memory's buffers are the ones it viewed; None when one is not a
        contiguous CPU tensor of the engine's dtypes (the caller takes the checked path)."""
        if (tuple(map(TensorBase.data_ptr, self.touched)) == self.pointers
                and self.shape == (n_actions, k)):  # (a growth adds actions without touching the ring)
            return self  # replaced tensors drop the host: see gae.judgment.online.HostState.get
        for tensor in buffers.values():
            if (tensor.device.type != "cpu" or not tensor.is_contiguous()
                    or (tensor.is_floating_point() and tensor.dtype != torch.float32)):
                return None
        self.touched = tuple(tensor for tensor in buffers.values() if tensor.numel())
        self.pointers = tuple(map(TensorBase.data_ptr, self.touched))
        self.shape = (n_actions, k)
        self.ring = tuple(buffers[name].numpy() for name in
                          ("store_factors", "store_actions", "store_categories", "store_steps", "ring"))
        self.num_decisions = buffers["num_decisions"].numpy()
        n_factors = self.ring[0].shape[1]
        self.batch = (np.zeros((1, n_factors), np.float32), np.zeros(1, np.int64), np.zeros(1, np.int64),
                      np.zeros(1, bool), np.zeros((1, n_actions), np.float32), np.zeros(1, np.int64),
                      np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool), np.zeros((1, k), np.int64),
                      np.zeros((1, k), np.float64))
        self.call = None
        return self

    def run(self, row: np.ndarray, limit: float, c: int, a: int, skip: bool, learn: bool, k: int, scoped: bool,
            respect_skip: bool) -> int:
        """Score (and with ``learn``, learn) one decision; 0, or NOT_FINITE with nothing changed.
        The outputs are in ``batch`` (probs, action, confidence at 4, 5, 6; applied, skipped at 7, 8)."""
        args = (row, limit, c, a, skip, learn, *self.ring, k, scoped, respect_skip, int(self.num_decisions),
                *self.batch)
        if self.call is None:
            self.call = entry_point(knn_one, *args)
        return self.call(*args)
