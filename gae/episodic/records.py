"""The records an episodic memory returns and keeps, and the dtypes of its columns."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
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


class AuditTrail:
    """The newest :class:`AuditRecord` s, naming at most ``max_ids`` memory ids in all (a record
    naming none counts as one): a batch add of a thousand costs what a thousand single adds
    cost. The newest record always stays, however many ids it names. ``max_ids=None`` keeps
    every record."""

    def __init__(self, max_ids: int | None, records: Iterable[AuditRecord] = ()) -> None:
        self.max_ids = max_ids
        self.records: deque[AuditRecord] = deque()
        self.weight = 0  # the ids the records name (at least one each)
        for record in records:
            self.append(record)

    def append(self, record: AuditRecord) -> None:
        """Keep ``record``, dropping the oldest records while they name more than ``max_ids``."""
        self.records.append(record)
        self.weight += max(1, len(record.ids))
        if self.max_ids is not None:
            while self.weight > self.max_ids and len(self.records) > 1:
                self.weight -= max(1, len(self.records.popleft().ids))

    def __iter__(self) -> Iterator[AuditRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)
