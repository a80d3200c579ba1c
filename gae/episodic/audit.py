"""An episodic memory's audit trail and version counter, and the copies that carry them.

Every mutation (add, evict, delete, expire) bumps ``version`` and leaves an audit record, as
does a refused admission. The memory keeps the newest records naming at most ``max_audit``
memory ids (:class:`~gae.episodic.records.AuditTrail`); with a store, each record also goes to
the store's pending change, and the store keeps the whole trail.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

from torch import Tensor

from gae import validation as check
from gae.episodic.persistence import Persistence
from gae.episodic.records import AuditRecord, AuditTrail
from gae.storage.base import AuditEntry


class AuditedPersistence(Persistence):
    """:class:`~gae.episodic.persistence.Persistence` with the audit trail: the base of
    :class:`~gae.EpisodicMemory`, which sets ``_max_audit`` and ``_audit`` when it is built."""

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:  # a copy of one state: the rows and the lists as they are now, not as a later call leaves them
            state = super().__getstate__()
            buffers = state["_buffers"]
            state["_buffers"] = type(buffers)((name, None if t is None else t.clone()) for name, t in buffers.items())
            for name in ("scope_names", "source_ids", "contents"):
                state[name] = list(state[name])
            state["_audit"] = AuditTrail(self.max_audit, state["_audit"])
        state.pop("_lock", None)  # a lock cannot be copied: each copy gets its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_audit" not in state:  # pickled before the audit log was bounded: it kept every record
            state["_max_audit"] = None
            state["_audit"] = AuditTrail(None, state.pop("audit_log"))
        super().__setstate__(state)
        self.__dict__["_lock"] = threading.RLock()

    @property
    def max_audit(self) -> int | None:
        """The memory ids the kept audit records may name in all (None: every record is kept).
        Setting it trims the log to the new bound at once."""
        return self.__dict__["_max_audit"]

    @max_audit.setter
    def max_audit(self, value: int | None) -> None:
        value = None if value is None else check.check_int("max_audit", value, low=1)
        with self._lock:
            self.__dict__["_max_audit"] = value
            self._audit = AuditTrail(value, self._audit)

    @property
    def audit_log(self) -> list[AuditRecord]:
        """The audit records kept (the newest, naming at most ``max_audit`` ids), oldest first: a
        copy, taken under the memory's lock. Assigning a list keeps its newest records so."""
        with self._lock:
            return list(self._audit)

    @audit_log.setter
    def audit_log(self, records: Sequence[AuditRecord]) -> None:
        with self._lock:
            self._audit = AuditTrail(self.max_audit, records)

    @property
    def version(self) -> int:
        """Mutations so far: +1 for every add, eviction, delete and expiry (not for a refusal)."""
        return int(self.version_counter)

    # -- recording --------------------------------------------------------------------------
    def _record(self, action: str, now: float, ids: Any, reason: str) -> None:
        """``version + 1`` for a mutation (not for a 'reject'), then its audit record (:meth:`_log`)."""
        counter = cast(Tensor, self._buffers["version_counter"])  # in place: no module attribute lookups
        if action != "reject":
            counter.add_(1)
        self._log(action, now, ids, reason, int(counter))

    def _log(self, action: str, now: float, ids: Any, reason: str, version: int) -> None:
        """The audit record of a mutation that ``version`` already counts (the single-decision path
        counts its own in place), also handed to the store's pending change."""
        id_tuple = tuple(int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids))
        self._audit.append(AuditRecord(action, float(now), id_tuple, reason, version))  # the oldest may drop out
        if self._pending is not None:
            self._pending.audit.append(AuditEntry(action, float(now), id_tuple, reason, version))
            if action in ("evict", "delete", "expire"):
                self._pending.removed.append((action, float(now), id_tuple))

    def _eviction_reason(self) -> str:
        """The reason an eviction's record gives."""
        return f"over capacity {self.capacity} ({self.eviction})"
