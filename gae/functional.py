"""Pure tensor maths shared by the memories and the training loop.

Nothing here holds state or validates input; the modules do both. Every function is
differentiable where that makes sense and runs on any device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gae.types import MemoryOutput


def criterion_attention(criterion_logits: Tensor) -> Tensor:
    """``alpha = K * softmax(criterion_logits)`` over the last dim: all ones at zero logits.

    Shape: (..., K) -> (..., K), each row summing to K.

    Written out (``exp`` of the logits less their maximum, over the sum) rather than with
    ``torch.softmax``: on logits that require grad (the attention parameter), torch 2.x runs
    even a (C, K) softmax through a parallel region, and on a busy machine the thread hand-off
    costs milliseconds per call, a thousand times the arithmetic.
    """
    weights = (criterion_logits - criterion_logits.detach().amax(-1, keepdim=True)).exp()
    return criterion_logits.shape[-1] * (weights / weights.sum(-1, keepdim=True))


def squared_differences(x: Tensor, prototypes: Tensor) -> Tensor:
    """Per-criterion squared differences ``(x - c)^2``: (B, K) and (B, A, K) -> (B, A, K)."""
    return (x.unsqueeze(-2) - prototypes) ** 2


def prototype_logits(sq_diff: Tensor, alpha: Tensor, available: Tensor, tau: float) -> Tensor:
    """Logits ``-sum_k alpha_k (x_k - c_k)^2 / tau``, ``-inf`` where no prototype exists.

    Args:
        sq_diff: (B, A, K) squared differences, see :func:`squared_differences`.
        alpha: (B, K) attention weights of each decision's category.
        available: (B, A) bool, the prototype exists.
        tau: softmax temperature.

    Returns:
        (B, A) logits.
    """
    distance = (sq_diff * alpha.unsqueeze(-2)).sum(-1)  # (B, A)
    return (-distance / tau).masked_fill(~available, float("-inf"))


def memory_output(logits: Tensor, min_confidence: float = 0.0) -> MemoryOutput:
    """Turn (B, A) logits with ``-inf`` for absent actions into a :class:`MemoryOutput`.

    A row with no finite logit abstains (action -1, confidence 0, probabilities all zero),
    and so does a row whose best probability is below ``min_confidence``. Ties go to the
    lowest action index. Gradients flow through ``logits`` and ``probs``.
    """
    known = torch.isfinite(logits).any(-1, keepdim=True)  # (B, 1)
    safe = logits.masked_fill(~known, 0.0)
    probs = torch.softmax(safe, dim=-1) * known
    action = safe.argmax(-1)
    confidence = probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    # the threshold is compared in float64, exactly as the compiled kernels compare it
    abstain = ~known.squeeze(-1) | (confidence.detach().double() < min_confidence)
    return MemoryOutput(logits, probs, action.masked_fill(abstain, -1), confidence.masked_fill(abstain, 0.0))


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
