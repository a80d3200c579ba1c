"""The batch every stream yields and every training step consumes."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class DecisionBatch(NamedTuple):
    """B verified decisions, in stream order.

    Attributes:
        x: (B, K) float32 factors.
        category: (B,) int64 category index.
        action: (B,) int64 the verified action (what the verifier accepted or chose).
        truth: (B,) int64 the ground-truth action (equal to ``action`` when a stream has no
            separate ground truth, as in files).
        overridden: (B,) bool, the verified action differs from the ground truth (label noise).
        confirmed: (B,) int8, 1 = the verifier confirmed the recommendation, 0 = overrode it,
            -1 = unknown: let the memory compare its own recommendation with ``action``.
        skip: (B,) bool, the outcome is uncertain and must not be learned.
        timestamp: (B,) float64 seconds.
        id: (B,) int64 decision id.
        position: (B,) int64 position of the decision in the stream (0-based).
    """

    x: Tensor
    category: Tensor
    action: Tensor
    truth: Tensor
    overridden: Tensor
    confirmed: Tensor
    skip: Tensor
    timestamp: Tensor
    id: Tensor
    position: Tensor
