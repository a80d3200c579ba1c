"""Ledger: a decision memory's events, pending decisions and snapshots in one of the episodic stores.

Every write goes through :meth:`Ledger.writing` (the store's write lock, one transaction):
what is appended there lands whole when the block ends, or nothing of it. Reads outside a
write take the latest committed rows. Sequence numbers come from the ledger's ``head`` (the
last one given), never from a table's largest row, so one deleted by ``forget_`` is never
given again; the ``epoch`` moves whenever rows are deleted, telling every reader to rebuild.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from gae.ledger.sql import EVENT_COLUMNS, Dialect, dialect

DECIDE, LEARN, CLOSE, GROW = "decide", "learn", "close", "grow"  # the kinds of event


@dataclass(frozen=True)
class Event:
    """One ledger row. ``decide``: a decision (``action`` its recommendation, ``detail`` its
    ``confidence``, ``probs`` and the action ``names`` they are over); ``learn``: a verified
    decision as learned (``action`` as given, ``confirmed`` the flag it was learned with);
    ``close``: a decision closed without learning (``detail['reason']``: ``skipped`` or
    ``expired``); ``grow``: names added (``detail['actions']``, ``detail['categories']``)."""

    kind: str
    decision_id: str | None = None
    category: str | int | None = None
    row: np.ndarray | None = None  # (K,) float64
    action: str | int | None = None
    confirmed: bool | None = None
    outcome: str | None = None
    source_id: int | None = None
    decided_version: int | None = None
    version: int | None = None
    at: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    seq: int = 0  # given when appended

    def values(self, ledger: str, seq: int) -> tuple[Any, ...]:
        return (ledger, seq, self.kind, self.decision_id, _dump(self.category),
                None if self.row is None else np.ascontiguousarray(self.row, dtype=np.float64).tobytes(),
                _dump(self.action), None if self.confirmed is None else int(self.confirmed), self.outcome,
                self.source_id, self.decided_version, self.version, self.at, json.dumps(self.detail))

    @classmethod
    def of(cls, record: Sequence[Any]) -> Event:
        seq, kind, decision_id, category, factors, action, confirmed, outcome, source_id, decided, version, at, \
            detail = record
        return cls(kind, decision_id, _load(category), None if factors is None else
                   np.frombuffer(bytes(factors), dtype=np.float64).copy(), _load(action),
                   None if confirmed is None else bool(confirmed), outcome, source_id, decided, version, at,
                   json.loads(detail) if detail else {}, int(seq))


@dataclass(frozen=True)
class Snapshot:
    """A memory's ``state_dict`` (without its pending decisions) after event ``seq``."""

    seq: int
    version: int
    state: dict[str, Any]


def ledgers(store: Any) -> list[str]:
    """The names of the ledgers ``store`` holds, sorted (one holding no meta row yet is not listed)."""
    sql = dialect(store)
    with _thread_lock(store), sql.queue(), store.exclusive():
        sql.create()
        return sorted(str(name) for (name,) in sql.rows(f"SELECT DISTINCT ledger FROM {sql.table('meta')}"))


def _thread_lock(store: Any) -> threading.RLock:
    """The one re-entrant lock of ``store`` for its ledgers' writers (``setdefault`` is atomic: one lock per store)."""
    return store.__dict__.setdefault("_ledger_lock", threading.RLock())


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value)  # a name stays a str, an index an int


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class Ledger:
    """The rows of ledger ``name`` in ``store`` (a :class:`~gae.episodic.store.SQLiteStore` or
    :class:`~gae.episodic.store.PostgresStore`), its tables created on first use."""

    def __init__(self, store: Any, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"ledger must be a non-empty name, got {name!r}")
        if getattr(store, "closed", False):
            raise ValueError(f"{store!r} is closed: open a new store for the memory")
        self.store, self.name = store, name
        self.sql: Dialect = dialect(store)
        self._meta, self._events = self.sql.table("meta"), self.sql.table("events")
        self._pending, self._snapshots = self.sql.table("pending"), self.sql.table("snapshots")
        self._audit = self.sql.table("audit")
        with self.writing():
            self.sql.create()

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def writing(self) -> Iterator[None]:
        """The store's write lock and one transaction: committed when the block ends, rolled back
        if it raises. Threads sharing one store object (several memories on it) take turns first:
        the store's own hold is one connection's, not one thread's."""
        with _thread_lock(self.store), self.sql.queue(), self.store.exclusive():
            yield

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One consistent view of the committed rows (the write lock, on stores whose reads need no other)."""
        with self.writing():
            yield

    # -- meta ---------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Every meta value of this ledger, decoded from JSON (empty for a new ledger)."""
        return {key: json.loads(value) for key, value in
                self.sql.rows(f"SELECT key, value FROM {self._meta} WHERE ledger = ?", (self.name,))}

    def set_meta(self, values: dict[str, Any]) -> None:
        """Inside :meth:`writing`: set meta values."""
        self.sql.many(f"INSERT INTO {self._meta} (ledger, key, value) VALUES (?, ?, ?) ON CONFLICT (ledger, key) "
                      "DO UPDATE SET value = excluded.value",
                      [(self.name, key, json.dumps(value)) for key, value in values.items()])

    def position(self) -> tuple[int, int]:
        """``(head, epoch)``: the last sequence number given and the deletions so far."""
        found = dict(self.sql.rows(f"SELECT key, value FROM {self._meta} WHERE ledger = ? AND key IN ('head', "
                                   "'epoch')", (self.name,)))
        return int(found.get("head", 0)), int(found.get("epoch", 0))

    # -- events ---------------------------------------------------------------------------------
    def append(self, events: Sequence[Event], head: int) -> int:
        """Inside :meth:`writing`, at ``head`` (the caller's :meth:`position`): the events under
        ``head + 1, ...``, the pending table kept with them. Returns the new head."""
        if not events:
            return head
        placeholders = ", ".join("?" * (len(EVENT_COLUMNS) + 1))
        self.sql.many(f"INSERT INTO {self._events} (ledger, {', '.join(EVENT_COLUMNS)}) VALUES ({placeholders})",
                      [event.values(self.name, head + i + 1) for i, event in enumerate(events)])
        for i, event in enumerate(events):  # in event order: an id closed, then given again, is pending again
            if event.kind == DECIDE:  # (an upsert: the latest decision of an id is the pending one, as in RAM)
                self.sql.run(f"INSERT INTO {self._pending} (ledger, decision_id, seq) VALUES (?, ?, ?) ON CONFLICT "
                             "(ledger, decision_id) DO UPDATE SET seq = excluded.seq",
                             (self.name, event.decision_id, head + i + 1))
            elif event.kind in (LEARN, CLOSE) and event.decision_id:
                self.sql.run(f"DELETE FROM {self._pending} WHERE ledger = ? AND decision_id = ?",
                             (self.name, event.decision_id))
        head += len(events)
        self.set_meta({"head": head})
        return head

    def events(self, after: int, before: int | None = None, kinds: Sequence[str] | None = None) -> list[Event]:
        """The events with ``after < seq`` (``< before`` too, when given), in order, of ``kinds`` (default all)."""
        where, params = "ledger = ? AND seq > ?", [self.name, after]
        if before is not None:
            where += " AND seq < ?"
            params.append(before)
        if kinds is not None:
            where += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params.extend(kinds)
        return [Event.of(r) for r in self.sql.rows(
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM {self._events} WHERE {where} ORDER BY seq", tuple(params))]

    def pending(self) -> list[Event]:
        """The decide events of the decisions still pending, oldest first."""
        columns = ", ".join(f"e.{c}" for c in EVENT_COLUMNS)
        return [Event.of(r) for r in self.sql.rows(
            f"SELECT {columns} FROM {self._pending} p JOIN {self._events} e ON e.ledger = p.ledger AND e.seq = p.seq "
            "WHERE p.ledger = ? ORDER BY p.seq", (self.name,))]

    def decision(self, decision_id: str) -> Event | None:
        """The decide event of ``decision_id`` (the latest, for an id given again), if the ledger holds it."""
        found = self.sql.rows(f"SELECT {', '.join(EVENT_COLUMNS)} FROM {self._events} WHERE ledger = ? AND "
                              "decision_id = ? AND kind = ? ORDER BY seq DESC LIMIT 1",
                              (self.name, decision_id, DECIDE))
        return Event.of(found[0]) if found else None

    def count(self, kind: str, reason: str | None = None) -> int:
        where, params = "ledger = ? AND kind = ?", [self.name, kind]
        if reason is not None:
            where += " AND detail = ?"
            params.append(json.dumps({"reason": reason}))
        return int(self.sql.rows(f"SELECT COUNT(*) FROM {self._events} WHERE {where}", tuple(params))[0][0])

    # -- snapshots ------------------------------------------------------------------------------
    def snapshot(self, before: int | None = None) -> Snapshot | None:
        """The latest snapshot (taken after an event ``< before``, when given), loaded with ``weights_only``."""
        where, params = "ledger = ?", cast(list[Any], [self.name])
        if before is not None:
            where += " AND seq < ?"  # (params: a list of str and int)
            params.append(before)
        found = self.sql.rows(f"SELECT seq, version, state FROM {self._snapshots} WHERE {where} ORDER BY seq DESC "
                              "LIMIT 1", tuple(params))
        if not found:
            return None
        seq, version, blob = found[0]
        return Snapshot(int(seq), int(version), torch.load(io.BytesIO(bytes(blob)), weights_only=True))

    def write_snapshot(self, seq: int, version: int, state: dict[str, Any]) -> None:
        """Inside :meth:`writing`: the state after event ``seq``."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.sql.run(f"DELETE FROM {self._snapshots} WHERE ledger = ? AND seq = ?", (self.name, seq))
        self.sql.run(f"INSERT INTO {self._snapshots} (ledger, seq, version, state) VALUES (?, ?, ?, ?)",
                     (self.name, seq, version, buffer.getvalue()))

    # -- deleting -------------------------------------------------------------------------------
    def learned(self, source_ids: Sequence[int] | None = None, last: int | None = None) -> list[tuple[int, Any]]:
        """``(seq, source id)`` of the learn events with these source ids, or of the ``last`` ones, in order."""
        if source_ids is not None:
            marks = ", ".join("?" * len(source_ids))
            rows = self.sql.rows(f"SELECT seq, source_id FROM {self._events} WHERE ledger = ? AND kind = ? AND "
                                 f"source_id IN ({marks}) ORDER BY seq", (self.name, LEARN, *source_ids))
        else:
            rows = self.sql.rows(f"SELECT seq, source_id FROM {self._events} WHERE ledger = ? AND kind = ? "
                                 "ORDER BY seq DESC LIMIT ?", (self.name, LEARN, last))
        return sorted((int(seq), source) for seq, source in rows)

    def sourced(self, source_ids: Sequence[int]) -> list[tuple[int, Any]]:
        """``(seq, source id)`` of every decide and learn event with these source ids, in order."""
        marks = ", ".join("?" * len(source_ids))
        return [(int(seq), source) for seq, source in self.sql.rows(
            f"SELECT seq, source_id FROM {self._events} WHERE ledger = ? AND kind IN (?, ?) AND "
            f"source_id IN ({marks}) ORDER BY seq", (self.name, DECIDE, LEARN, *source_ids))]

    def delete(self, seqs: Sequence[int], action: str, reason: str, actor: str) -> int:
        """Inside :meth:`writing`: delete these decide and learn events, each learn event's
        decision with it (the decide event of its id before it: an id may be given again later),
        the pending rows of the deleted decisions and every snapshot taken after the first
        deleted learn event; move the epoch; audit who, when, why and how many decisions (never
        what). Returns the learn events deleted."""
        doomed, learned, paired = set(seqs), [], set()
        marks = ", ".join("?" * len(seqs))
        for seq, kind, decision_id in self.sql.rows(
                f"SELECT seq, kind, decision_id FROM {self._events} WHERE ledger = ? AND seq IN ({marks})",
                (self.name, *seqs)):
            if kind != LEARN:
                continue
            learned.append(int(seq))
            if decision_id is not None:
                found = self.sql.rows(f"SELECT MAX(seq) FROM {self._events} WHERE ledger = ? AND decision_id = ? "
                                      "AND kind = ? AND seq < ?", (self.name, decision_id, DECIDE, seq))
                if found and found[0][0] is not None:
                    paired.add(int(found[0][0]))
        decisions = len(doomed - paired)  # each decision once: verified (its learn event), or decided and not
        doomed |= paired
        gone = [(self.name, seq) for seq in sorted(doomed)]
        self.sql.many(f"DELETE FROM {self._events} WHERE ledger = ? AND seq = ?", gone)
        self.sql.many(f"DELETE FROM {self._pending} WHERE ledger = ? AND seq = ?", gone)
        if learned:
            self.sql.run(f"DELETE FROM {self._snapshots} WHERE ledger = ? AND seq >= ?", (self.name, min(learned)))
        head, epoch = self.position()
        self.set_meta({"epoch": epoch + 1})
        self.sql.run(f"INSERT INTO {self._audit} (ledger, at, actor, action, reason, count, seq) VALUES "
                     "(?, ?, ?, ?, ?, ?, ?)", (self.name, time.time(), actor, action, reason, decisions, head))
        return len(learned)

    def audit(self) -> list[dict[str, Any]]:
        """Every forget and undo, oldest first: ``at``, ``actor``, ``action``, ``reason``, ``count``
        and ``seq`` (the head then)."""
        return [dict(zip(("at", "actor", "action", "reason", "count", "seq"), row, strict=True)) for row in
                self.sql.rows(f"SELECT at, actor, action, reason, count, seq FROM {self._audit} WHERE ledger = ? "
                              "ORDER BY seq, at", (self.name,))]

    def commits(self) -> int:
        """Ledger commits made through this store object (how memories sharing one see each other's)."""
        return self.store.__dict__.get("_ledger_commits", 0)

    def count_commit(self) -> None:
        self.store.__dict__["_ledger_commits"] = self.commits() + 1

    def erase(self) -> None:
        """After the commit that deleted rows: make them unreadable from the store's files."""
        self.sql.erase()
