"""The records an episodic memory returns and keeps, and the dtypes of its columns."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

COLUMNS = {  # name: dtype of the per-memory columns, each a buffer of ``allocated`` rows
    "ids": torch.int64, "created_at": torch.float64, "importance": torch.float32, "scope": torch.int64,
    "memory_type": torch.int64, "confidence": torch.float32, "valid_from": torch.float64,
    "valid_until": torch.float64, "inserted": torch.int64,
}


class Retrieval(NamedTuple):
    """The ``k`` best memories of each query (padded with id -1 and score ``-inf``).

    Attributes:
        ids: (Q, k) int64 stable memory ids. scores: (Q, k) full scores.
        similarity, recency, importance: (Q, k) the three unweighted terms (0 where padded).
        version: the store version the answer was computed on.
    """

    ids: Tensor
    scores: Tensor
    similarity: Tensor
    recency: Tensor
    importance: Tensor
    version: int


class AuditRecord(NamedTuple):
    """One mutation (add, evict, delete, expire) or admission refusal (reject)."""

    action: str
    time: float
    ids: tuple[int, ...]
    reason: str
    version: int
