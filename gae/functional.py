"""The k-NN baseline's batched scoring, in plain tensor maths (no state, no validation)."""

from __future__ import annotations

import torch
from torch import Tensor

from gae.types import MemoryOutput


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
