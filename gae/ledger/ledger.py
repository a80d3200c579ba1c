"""Ledger: a decision memory's events, pending decisions and snapshots in the tables of a store.

Every write goes through :meth:`Ledger.writing` (the store's write lock, one transaction): what
is appended there lands whole when the block ends, or nothing of it. :meth:`Ledger.reading` is
one consistent view of the committed rows, and reads outside either take the latest committed
rows. Sequence numbers come from the ledger's ``head`` (the last one given), never from a
table's largest row, so one deleted by ``forget_`` is never given again; the ``epoch`` moves
whenever rows are deleted, telling every reader to rebuild.

The rows live in the storage layer's checksummed tables (:mod:`gae.ledger.sql`): every row is
verified when it is read, and a row that does not match its checksum, or holds what this module
never writes (JSON that does not parse, factors that are not float64, a snapshot that does not
load), raises :class:`~gae.storage.StoreCorrupted` naming the store, the table and the row.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch

from gae.ledger.events import CLOSE, DECIDE, LEARN, Event
from gae.ledger.sql import AUDIT, ERASED, EVENTS, META, PENDING, SNAPSHOTS, TABLES
from gae.storage import Store, StoreCorrupted, Table
from gae.validation import check_text

CHUNK = 500  # values per IN (...) list: far under every SQLite's limit on bound parameters


class Snapshot(NamedTuple):
    """A memory's state after event ``seq`` (the dict given to :meth:`Ledger.write_snapshot`, loaded
    with ``weights_only=True``) and its version then."""

    seq: int
    version: int
    state: dict[str, Any]


def ledgers(store: Store) -> list[str]:
    """The names of the ledgers ``store`` holds, sorted (one holding no meta row yet is not listed)."""
    _check_store(store)
    return sorted({row.ledger for row in store.select(META)})


def _check_store(store: Any) -> None:
    if not isinstance(store, Store):
        raise TypeError(f"store must be a SQLiteStore or a PostgresStore of gae.storage, got {type(store).__name__}")


def _chunks(values: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), CHUNK):
        yield values[start:start + CHUNK]


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


class Ledger:
    """The rows of ledger ``name`` in ``store`` (a :class:`~gae.storage.SQLiteStore` or
    :class:`~gae.storage.PostgresStore`), its tables created on first use (a store written by a
    gae before the checksums gains them then).

    Thread safety: the store serializes the blocks of threads sharing it; a Ledger object keeps
    what :meth:`changed` saw, so give each reader its own.

    Args:
        store: the store whose tables hold the ledger.
        name: the ledger's name (several ledgers share a store's tables).
    """

    def __init__(self, store: Store, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"ledger must be a non-empty name, got {name!r}")
        check_text("ledger", name)
        _check_store(store)
        if store.closed:
            raise ValueError(f"{store!r} is closed: open a new store for the memory")
        self.store, self.name = store, name
        self._data_version: int | None = None
        store.create_tables(TABLES)

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def writing(self) -> Iterator[None]:
        """The ledger's write lock and one transaction (:meth:`~gae.storage.store.Store.exclusive`,
        a lock of this ledger's own where the database keeps one per name: Postgres; SQLite has
        one writer per file): committed when the block ends, rolled back if it raises. Threads
        sharing one store object (several memories on it) take turns, and so do processes."""
        with self.store.exclusive(lock=f"ledger.{self.name}"):
            yield

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One consistent view of the committed rows (:meth:`~gae.storage.store.Store.reading`: a
        read transaction, writers go on; inside :meth:`writing`, its view). No write may start in it."""
        with self.store.reading():
            yield

    def changed(self) -> bool:
        """Whether another connection may have committed since this ledger object's last call
        (always True the first time, and on a store that cannot tell: Postgres). Commits through
        the same store object show in :meth:`commits` instead."""
        version = self.store.data_version()
        moved = version is None or version != self._data_version
        self._data_version = version
        return moved

    def commits(self) -> int:
        """Ledger commits made through this store object (how memories sharing one see each other's)."""
        return self.store.commits

    def count_commit(self) -> None:
        """Inside :meth:`writing`: count this block's commit in :meth:`commits`."""
        self.store.count_commit()

    # -- decoding -----------------------------------------------------------------------------
    def _damaged(self, table: Table, row: str, error: BaseException) -> StoreCorrupted:
        """The error for a row that matched its checksum but cannot be decoded (written by a gae
        before the checksums, damaged before they were added)."""
        return StoreCorrupted(self.store.where, f"table {table.name}: row {row} of ledger {self.name!r} cannot be "
                                                f"read: {type(error).__name__}: {error}")

    def _json(self, table: Table, row: str, text: str | None) -> Any:
        try:
            return None if text is None else json.loads(text)
        except ValueError as error:
            raise self._damaged(table, row, error) from error

    def _event(self, row: Any) -> Event:
        """An event as its row holds it (the inverse of :meth:`_event_row`)."""
        where = f"(seq={row.seq})"
        factors = None
        if row.factors is not None:
            if len(row.factors) % 8:
                raise self._damaged(EVENTS, where, ValueError(f"factors of {len(row.factors)} bytes are not float64"))
            factors = np.frombuffer(row.factors, dtype=np.float64).copy()
        detail = self._json(EVENTS, where, row.detail) if row.detail else {}
        if not isinstance(detail, dict) or (row.confirmed is not None and row.confirmed not in (0, 1)):
            raise self._damaged(EVENTS, where, ValueError(f"detail {detail!r}, confirmed {row.confirmed!r}"))
        return Event(row.kind, row.decision_id, self._json(EVENTS, where, row.category), factors,
                     self._json(EVENTS, where, row.action), None if row.confirmed is None else bool(row.confirmed),
                     row.outcome, row.source_id, row.decided_version, row.version, row.at, detail, int(row.seq))

    def _event_row(self, seq: int, event: Event) -> tuple[Any, ...]:
        """The row of ``event`` under sequence number ``seq``: names and indices as JSON, the factors
        as float64 bytes."""
        factors = None if event.row is None else np.ascontiguousarray(event.row, dtype=np.float64).tobytes()
        return (self.name, seq, event.kind, event.decision_id, _dump(event.category), factors, _dump(event.action),
                None if event.confirmed is None else int(event.confirmed), event.outcome, event.source_id,
                event.decided_version, event.version, event.at, json.dumps(event.detail))

    # -- meta ---------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Every meta value of this ledger, decoded from JSON (empty for a new ledger)."""
        return {row.key: self._json(META, f"(key={row.key!r})", row.value)
                for row in self.store.select(META, "ledger = ?", (self.name,))}

    def require_meta(self, meta: dict[str, Any], keys: Sequence[str]) -> None:
        """StoreCorrupted naming the file when ``meta`` (not empty) lacks one of ``keys``, values
        its writer gave every ledger it made: rows deleted behind the ledger's back; or when it is
        empty and the ledger holds events or snapshots (its meta gone)."""
        if not meta:
            held = sum(self.store.count(table, "ledger = ?", (self.name,)) for table in (EVENTS, SNAPSHOTS))
            if held:
                raise StoreCorrupted(self.store.where, f"table {META.name}: ledger {self.name!r} holds {held} events "
                                                       "and snapshots but no meta (rows deleted behind its back)")
        missing = [key for key in keys if key not in meta]
        if meta and missing:
            raise StoreCorrupted(self.store.where, f"table {META.name}: ledger {self.name!r} lacks its {missing} "
                                                   "(rows deleted behind the ledger's back)")

    def set_meta(self, values: dict[str, Any]) -> None:
        """Inside :meth:`writing`: set meta values."""
        self.store.insert(META, [(self.name, key, json.dumps(value)) for key, value in values.items()], upsert=True)

    def position(self) -> tuple[int, int]:
        """``(head, epoch)``: the last sequence number given and the deletions so far."""
        found = {row.key: self._json(META, f"(key={row.key!r})", row.value) for row in self.store.select(
            META, "ledger = ? AND key IN ('head', 'epoch')", (self.name,))}
        head, epoch = found.get("head", 0), found.get("epoch", 0)
        if len(found) == 1:  # (a ledger has both from its first commit, or neither yet)
            raise StoreCorrupted(self.store.where, f"table {META.name}: ledger {self.name!r} lacks its "
                                                   f"{'head' if 'head' not in found else 'epoch'} (a row deleted "
                                                   "behind the ledger's back)")
        if not all(type(value) is int and value >= 0 for value in (head, epoch)):
            raise self._damaged(META, "(key='head')", ValueError(f"head {head!r} and epoch {epoch!r} must be ints"))
        return head, epoch

    def counters(self) -> tuple[int, int, int | None]:
        """Inside :meth:`writing`: ``(head, epoch, sources)``, the last two as :meth:`position` gives
        them and ``sources`` the next source id the ledger gives a verification made without one
        (None for a ledger written before it was kept: its writers start it)."""
        found = {row.key: self._json(META, f"(key={row.key!r})", row.value) for row in self.store.select(
            META, "ledger = ? AND key IN ('head', 'epoch', 'sources')", (self.name,))}
        sources = found.pop("sources", None)
        if sources is not None and (type(sources) is not int or sources < 0):
            raise self._damaged(META, "(key='sources')", ValueError(f"sources {sources!r} must be an int >= 0"))
        head, epoch = found.get("head", 0), found.get("epoch", 0)
        if len(found) == 1 or not all(type(value) is int and value >= 0 for value in (head, epoch)):
            head, epoch = self.position()  # (raises, naming what is wrong)
        return head, epoch, sources

    def open_decisions(self, decision_ids: Sequence[str]) -> dict[str, int]:
        """Which of ``decision_ids`` are pending now, each with the sequence number of its decide
        event (inside :meth:`writing`: as this block leaves them)."""
        found: dict[str, int] = {}
        for chunk in _chunks(list(dict.fromkeys(decision_ids))):
            found.update((row.decision_id, row.seq) for row in self.store.select(
                PENDING, f"ledger = ? AND decision_id IN ({_marks(chunk)})", (self.name, *chunk)))
        return found

    # -- events ---------------------------------------------------------------------------------
    def append(self, events: Sequence[Event], head: int, move_head: bool = True) -> int:
        """Inside :meth:`writing`, at ``head`` (the caller's :meth:`position`): the events under
        ``head + 1, ...``, the pending table kept with them. Returns the new head, which the meta
        records unless ``move_head`` is False (the caller sets it once for several appends)."""
        if not events:
            return head
        self.store.insert(EVENTS, [self._event_row(head + i + 1, event) for i, event in enumerate(events)])
        for i, event in enumerate(events):  # in event order: an id closed, then given again, is pending again
            if event.kind == DECIDE:  # (an upsert: the latest decision of an id is the pending one, as in RAM)
                self.store.insert(PENDING, [(self.name, event.decision_id, head + i + 1)], upsert=True)
            elif event.kind in (LEARN, CLOSE) and event.decision_id:
                self.store.delete(PENDING, "ledger = ? AND decision_id = ?", (self.name, event.decision_id))
        head += len(events)
        if move_head:
            self.set_meta({"head": head})
        return head

    def events(self, after: int, before: int | None = None, kinds: Sequence[str] | None = None) -> list[Event]:
        """The events with ``after < seq`` (``< before`` too, when given), in order, of ``kinds`` (default all)."""
        where, params = "ledger = ? AND seq > ?", [self.name, after]
        if before is not None:
            where += " AND seq < ?"
            params.append(before)
        if kinds is not None:
            where += f" AND kind IN ({_marks(kinds)})"
            params.extend(kinds)
        return [self._event(row) for row in self.store.select(EVENTS, where, params, order="seq")]

    def largest_source(self) -> int | None:
        """The largest source id a decide or learn event of the ledger holds (None: none holds one)."""
        return self.store.largest(EVENTS, "source_id", "ledger = ? AND kind IN (?, ?)", (self.name, DECIDE, LEARN))

    def pending(self) -> list[Event]:
        """The decide events of the decisions still pending, oldest first."""
        with self.store.reading():  # the pending rows and their events in one view
            seqs = [row.seq for row in self.store.select(PENDING, "ledger = ?", (self.name,), order="seq")]
            found: dict[int, Any] = {}
            for chunk in _chunks(seqs):
                found.update((row.seq, row) for row in self.store.select(
                    EVENTS, f"ledger = ? AND seq IN ({_marks(chunk)})", (self.name, *chunk)))
        missing = [seq for seq in seqs if seq not in found]
        if missing:
            raise StoreCorrupted(self.store.where, f"table {PENDING.name}: pending decisions of ledger {self.name!r} "
                                                   f"point at events {missing[:10]}, which {EVENTS.name} lacks")
        return [self._event(found[seq]) for seq in seqs]

    def decision(self, decision_id: str) -> Event | None:
        """The decide event of ``decision_id`` (the latest, for an id given again), if the ledger holds it."""
        found = self.store.select(EVENTS, "ledger = ? AND decision_id = ? AND kind = ?",
                                  (self.name, decision_id, DECIDE), order="seq DESC", limit=1)
        return self._event(found[0]) if found else None

    def count(self, kind: str, reason: str | None = None) -> int:
        """The events of ``kind`` (with ``detail`` ``{"reason": reason}``, when given), counted by the
        database (``check()`` verifies the rows counted)."""
        where, params = "ledger = ? AND kind = ?", [self.name, kind]
        if reason is not None:
            where += " AND detail = ?"
            params.append(json.dumps({"reason": reason}))
        return self.store.count(EVENTS, where, params)

    # -- snapshots ------------------------------------------------------------------------------
    def snapshot(self, before: int | None = None) -> Snapshot | None:
        """The latest snapshot (taken after an event ``< before``, when given), loaded with ``weights_only``."""
        where = "ledger = ?"
        params: list[Any] = [self.name]
        if before is not None:
            where += " AND seq < ?"
            params.append(before)
        found = self.store.select(SNAPSHOTS, where, params, order="seq DESC", limit=1)
        if not found:
            return None
        row = found[0]
        try:
            state = torch.load(io.BytesIO(row.state), weights_only=True)
        except Exception as error:  # noqa: BLE001 - torch raises what its unpickler and zip reader meet
            raise self._damaged(SNAPSHOTS, f"(seq={row.seq})", error) from error
        if not isinstance(state, dict):
            raise self._damaged(SNAPSHOTS, f"(seq={row.seq})", TypeError(f"a {type(state).__name__}, not a dict"))
        return Snapshot(int(row.seq), int(row.version), state)

    def write_snapshot(self, seq: int, version: int, state: dict[str, Any]) -> None:
        """Inside :meth:`writing`: the state after event ``seq`` (replacing one written there).
        ``state`` must load back with ``torch.load(weights_only=True)`` (tensors, numbers, strings
        and containers of them): one that would not is refused here, not when the ledger reopens."""
        self.write_snapshot_data(seq, version, snapshot_data(state))

    def write_snapshot_data(self, seq: int, version: int, data: bytes) -> None:
        """Inside :meth:`writing`: :meth:`write_snapshot` of a state saved already (:func:`snapshot_data`)."""
        self.store.insert(SNAPSHOTS, [(self.name, seq, version, data)], upsert=True)

    # -- deleting -------------------------------------------------------------------------------
    def learned(self, source_ids: Sequence[int] | None = None, last: int | None = None) -> list[tuple[int, Any]]:
        """``(seq, source id)`` of the learn events with these source ids, or of the ``last`` ones, in order."""
        if source_ids is not None:
            rows = [row for chunk in _chunks(list(source_ids)) for row in self.store.select(
                EVENTS, f"ledger = ? AND kind = ? AND source_id IN ({_marks(chunk)})", (self.name, LEARN, *chunk))]
        else:
            rows = self.store.select(EVENTS, "ledger = ? AND kind = ?", (self.name, LEARN), order="seq DESC",
                                     limit=last)
        return sorted((int(row.seq), row.source_id) for row in rows)

    def sourced(self, source_ids: Sequence[int]) -> list[tuple[int, Any]]:
        """``(seq, source id)`` of every decide and learn event with these source ids, in order."""
        return sorted((int(row.seq), row.source_id) for chunk in _chunks(list(source_ids)) for row in self.store.select(
            EVENTS, f"ledger = ? AND kind IN (?, ?) AND source_id IN ({_marks(chunk)})",
            (self.name, DECIDE, LEARN, *chunk)))

    def delete(self, seqs: Sequence[int], action: str, reason: str, actor: str) -> int:
        """Inside :meth:`writing`: delete these decide and learn events, each learn event's
        decision with it (the decide event of its id before it: an id may be given again later),
        the pending rows of the deleted decisions and every snapshot taken after the first
        deleted learn event; move the epoch; audit who, when, why and how many decisions (never
        what). Returns the learn events deleted."""
        doomed, learned, paired = set(seqs), [], set[int]()
        with self.writing():
            self.check_rows()  # (what it counts from must be sound)
            for chunk in _chunks(sorted(doomed)):
                for row in self.store.select(EVENTS, f"ledger = ? AND seq IN ({_marks(chunk)})", (self.name, *chunk)):
                    if row.kind != LEARN:
                        continue
                    learned.append(int(row.seq))
                    if row.decision_id is not None:
                        found = self.store.select(EVENTS, "ledger = ? AND decision_id = ? AND kind = ? AND seq < ?",
                                                  (self.name, row.decision_id, DECIDE, row.seq), order="seq DESC",
                                                  limit=1)
                        paired.update(int(decided.seq) for decided in found)
            decisions = len(doomed - paired)  # each decision once: verified (its learn event), or decided and not
            doomed |= paired
            deleted = 0  # the event rows gone: the head's count goes on adding up (check_rows)
            for chunk in _chunks(sorted(doomed)):
                deleted += self.store.delete(EVENTS, f"ledger = ? AND seq IN ({_marks(chunk)})", (self.name, *chunk))
                self.store.delete(PENDING, f"ledger = ? AND seq IN ({_marks(chunk)})", (self.name, *chunk))
            if learned:
                self.store.delete(SNAPSHOTS, "ledger = ? AND seq >= ?", (self.name, min(learned)))
            head, epoch = self.position()
            self.set_meta({"epoch": epoch + 1, "deleted": self._deleted() + deleted})
            self.store.insert(AUDIT, [(self.name, time.time(), actor, action, reason, decisions, head)])
        return len(learned)

    def _deleted(self) -> int:
        """The event rows deleted by forget and undo so far (the ledger's meta ``deleted``)."""
        found = self.store.select(META, "ledger = ? AND key = 'deleted'", (self.name,))
        deleted = self._json(META, "(key='deleted')", found[0].value) if found else 0
        if type(deleted) is not int or deleted < 0:
            raise self._damaged(META, "(key='deleted')", ValueError(f"deleted {deleted!r} must be an int >= 0"))
        return deleted

    def check_rows(self, adopt: bool = False) -> None:
        """StoreCorrupted when the events held and those deleted do not add up to the head: an
        event row deleted behind the ledger's back (a torn copy, a hand edit), which a checksum on
        each row cannot see. A ledger written before the count was kept gains it here, from what it
        holds (``adopt``, inside :meth:`writing`). Inside :meth:`reading` or :meth:`writing`."""
        head, _ = self.position()
        held = self.store.count(EVENTS, "ledger = ?", (self.name,))
        found = self.store.select(META, "ledger = ? AND key = 'deleted'", (self.name,))
        if not found:
            if held > head:
                raise StoreCorrupted(self.store.where, f"table {EVENTS.name}: ledger {self.name!r} holds {held} "
                                                       f"events past its head {head}")
            if adopt:
                self.set_meta({"deleted": head - held})  # (adopted: the first count, from the rows as they are)
            return
        deleted = self._deleted()
        if held + deleted != head:
            how = "rows are missing" if held + deleted < head else "rows were added"
            raise StoreCorrupted(self.store.where, f"table {EVENTS.name}: ledger {self.name!r} holds {held} events "
                                                   f"and deleted {deleted}, but its head is {head}: {how} behind the "
                                                   "ledger's back")

    def audit(self) -> list[dict[str, Any]]:
        """Every forget and undo, oldest first: ``at``, ``actor``, ``action``, ``reason``, ``count``
        and ``seq`` (the head then)."""
        return [{"at": row.at, "actor": row.actor, "action": row.action, "reason": row.reason, "count": row.count,
                 "seq": row.seq} for row in self.store.select(AUDIT, "ledger = ?", (self.name,), order="seq, at")]

    def erase(self) -> None:
        """After the commit that deleted rows: make them unreadable from the store's files
        (:meth:`~gae.storage.store.Store.erase`; inside :meth:`writing`, once it has committed)."""
        self.store.erase(ERASED)


def snapshot_data(state: dict[str, Any]) -> bytes:
    """``state`` as a snapshot row holds it (``torch.save``), refused with a TypeError unless it loads
    back with ``torch.load(weights_only=True)`` (tensors, numbers, strings and containers of them)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 - what the unpickler refuses, in its words
        raise TypeError(f"state must load with torch.load(weights_only=True): {error}") from error
    return data


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value)  # a name stays a str, an index an int
