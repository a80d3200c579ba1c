"""SQLiteStore: the embedded default store (Python's sqlite3, no server), full-text search with FTS5."""

from __future__ import annotations

import json
import sqlite3
import time as _time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from gae.episodic.store.base import (
    SCHEMA_VERSION,
    SNAPSHOT_COLUMNS,
    AuditEntry,
    Change,
    MemoryStore,
    Rows,
    Snapshot,
    StoreConflict,
    StoreRetrieval,
    check_query,
    check_weights,
    dumps_ids,
    join_scope,
    padded,
    rows_from_records,
    scope_filters,
    split_scope,
)

_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE memories (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    scope_type TEXT NOT NULL,
    scope_id TEXT NOT NULL,
    memory_type TEXT NOT NULL CHECK (memory_type IN ('episode', 'semantic')),
    content TEXT,
    embedding BLOB,
    confidence REAL NOT NULL,
    sensitivity TEXT NOT NULL,
    source_ids TEXT NOT NULL,
    valid_from REAL NOT NULL,
    valid_until REAL NOT NULL,
    importance REAL NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL,
    deleted_reason TEXT
);
CREATE INDEX memories_filter ON memories (scope_type, scope_id, memory_type, valid_until);
CREATE VIRTUAL TABLE memories_text USING fts5 (content);
CREATE TABLE audit (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    action TEXT NOT NULL CHECK (action IN ('add', 'evict', 'delete', 'expire', 'reject')),
    time REAL NOT NULL,
    ids TEXT NOT NULL,
    reason TEXT NOT NULL,
    version INTEGER NOT NULL,
    actor TEXT NOT NULL
);
"""


class SQLiteStore(MemoryStore):
    """A memory store in one SQLite file (or ``':memory:'``), the default of :class:`~gae.EpisodicMemory`.

    The ``memories`` table has the columns of the original design (a uuid ``id``, ``scope_type``
    and ``scope_id``, ``memory_type``, ``content``, the embedding as float32 bytes,
    ``confidence``, ``sensitivity``, ``source_ids`` as JSON, ``valid_from`` / ``valid_until``)
    plus ``seq`` (the memory's integer id), ``importance``, ``created_at`` and a tombstone
    (``deleted_at``, ``deleted_reason``); a btree index on (scope_type, scope_id, memory_type,
    valid_until), an FTS5 table over ``content``, an ``audit`` table and a ``meta`` table with
    the version counter. Evicted and expired rows keep their data with a tombstone; deleted
    rows lose their content and embedding (the audit keeps the record).

    Each :meth:`commit` is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction in WAL mode, so a
    process killed at any point leaves every committed change and nothing of the others.

    Erasure: the connection runs with ``secure_delete`` on, so SQLite overwrites whatever a
    delete frees with zeros. A change with ``erase`` (``EpisodicMemory.delete(..., erase=True)``)
    also rebuilds the full-text index without the deleted rows' terms (FTS5 ``optimize``) and,
    after its commit, checkpoints the WAL and truncates it (``wal_checkpoint(TRUNCATE)``), so
    that when the call returns neither the content nor the embedding is in any of the store's
    files. A reader in the middle of a read holds the WAL: the checkpoint waits for it up to
    ``erase_timeout`` seconds, then raises TimeoutError (the delete itself is committed;
    :meth:`purge` completes it later). :meth:`purge` rewrites the whole file (``VACUUM``), for
    rows deleted before, or by a gae that did not zero freed space.

    Args:
        path: the database file (created if missing), or ``':memory:'``.
        synchronous: SQLite's ``synchronous`` pragma: ``'FULL'`` (default) also survives a
            power cut; ``'NORMAL'`` survives a killed process and is faster.
        actor: written in the audit rows of this connection. Default: ``'gae'``.
        erase_timeout: seconds an erase waits for readers to leave the WAL. Default: 30.
        timeout: seconds a commit waits for another writer's lock before it raises TimeoutError
            (nothing of it written). Default: 30.
    """

    erases = True

    def __init__(self, path: str | Path, *, synchronous: str = "FULL", actor: str = "gae",
                 erase_timeout: float = 30.0, timeout: float = 30.0) -> None:
        if synchronous not in ("FULL", "NORMAL", "OFF"):
            raise ValueError(f"synchronous must be 'FULL', 'NORMAL' or 'OFF', got {synchronous!r}")
        if not isinstance(actor, str) or not actor:
            raise ValueError(f"actor must be a non-empty string, got {actor!r}")
        for name, value in (("erase_timeout", erase_timeout), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self.timeout = float(timeout)
        self.path = str(path)
        self.actor = actor
        self.erase_timeout = float(erase_timeout)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self.timeout)
        try:
            self._wal()
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            self._conn.execute("PRAGMA secure_delete=ON")  # whatever a delete frees is overwritten with zeros
        except BaseException:
            self._conn.close()
            raise
        self.dim: int | None = None
        self._cache: tuple[int, dict[str, Any]] | None = None  # (version, live columns) for retrieve

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, dim={self.dim})"

    def _wal(self) -> None:
        """``journal_mode=WAL``. Connections switching a new file at once get "locked" at once
        (SQLite skips the busy handler there), so this retries, up to ``timeout``."""
        deadline = _time.monotonic() + self.timeout
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or _time.monotonic() >= deadline:
                    raise
                _time.sleep(0.005)

    # -- schema ----------------------------------------------------------------------------
    def _tables(self) -> set[str]:
        return {row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def open(self, dim: int) -> Snapshot | None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if "memories" not in self._tables():
            self._begin_write()  # SQLite's DDL is transactional: all tables or none
            if "memories" in self._tables():  # another process created them while this one waited
                self._conn.execute("COMMIT")
                return self.open(dim)
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
                self._conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("dim", str(dim)), ("version", "0"), ("next_id", "0"), ("scope_names", "[]")])
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self.dim = dim
            return None
        self._migrate()
        stored = int(self._meta("dim"))
        if stored != dim:
            raise ValueError(f"{self.path} holds memories of dim={stored}, not dim={dim}")
        self.dim = dim
        return self._snapshot()

    def _migrate(self) -> None:
        """Bring an older schema up to :data:`SCHEMA_VERSION` (there is one version so far)."""
        version = self._conn.execute("SELECT version FROM schema_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ValueError(f"{self.path} has schema version {version}, newer than this gae ({SCHEMA_VERSION}); "
                             "upgrade gae to open it")

    def _meta(self, key: str) -> str:
        return self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]

    def _snapshot(self) -> Snapshot:
        assert self.dim is not None
        if self._held:  # the write lock is ours: nobody else writes, the read is consistent as it is
            return self._read_snapshot()
        self._conn.execute("BEGIN")  # one consistent read of rows, audit and counters, whatever others write
        try:
            return self._read_snapshot()
        finally:
            self._conn.execute("COMMIT")

    def _read_snapshot(self) -> Snapshot:
        assert self.dim is not None
        records = self._conn.execute(f"SELECT {SNAPSHOT_COLUMNS} FROM memories WHERE deleted_at IS NULL "
                                     "ORDER BY seq").fetchall()
        live = rows_from_records([(r[0], np.frombuffer(r[1], dtype=np.float32), *r[2:10], json.loads(r[10]), *r[11:])
                                  for r in records], self.dim)
        return Snapshot(self.dim, live, self.audit(), int(self._meta("version")), int(self._meta("next_id")),
                        json.loads(self._meta("scope_names")))

    # -- writing -----------------------------------------------------------------------------
    def _commit(self, change: Change) -> None:
        conn = self._conn
        conn.execute("SAVEPOINT gae_change")
        try:
            self._write(change)
            conn.execute("RELEASE gae_change")
        except BaseException:
            if conn.in_transaction:  # (an I/O error or a full disk may have ended the whole transaction)
                conn.execute("ROLLBACK TO gae_change")
                conn.execute("RELEASE gae_change")
            raise
        finally:
            self._cache = None  # whatever happened, the next retrieve reads the rows again

    def _write(self, change: Change) -> None:
        """The statements of one change, in the open write transaction."""
        conn = self._conn
        stored = int(self._meta("version"))
        if change.base_version is not None and stored != change.base_version:
            raise StoreConflict(f"{self.path} is at version {stored}, not {change.base_version}: another writer "
                                "committed first")
        if change.added is not None and len(change.added):
            self._insert(change.added)
        for action, time_, seqs in change.removed:
            self._remove(action, time_, seqs)
        conn.executemany("INSERT INTO audit (action, time, ids, reason, version, actor) VALUES (?, ?, ?, ?, ?, ?)",
                         [(e.action, e.time, dumps_ids(e.ids), e.reason, e.version, self.actor) for e in change.audit])
        conn.executemany("UPDATE meta SET value = ? WHERE key = ?", [
            (str(change.version), "version"), (str(change.next_id), "next_id"),
            (json.dumps(change.scope_names), "scope_names")])
        if change.erase:  # the full-text index rebuilt: a deleted row's terms leave its segments
            conn.execute("INSERT INTO memories_text (memories_text) VALUES ('optimize')")

    @contextmanager
    def _hold(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` if the block raises)."""
        try:
            self._begin_write()
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            self._cache = None

    def _erase_now(self) -> None:
        self._truncate_wal()

    def _begin_write(self) -> None:
        """``BEGIN IMMEDIATE``: take the write lock, waiting up to ``timeout`` for another writer."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            raise TimeoutError(f"{self.path}: another writer held the write lock for more than {self.timeout:g} s; "
                               "nothing of this call was written") from error

    def stored_version(self) -> int:
        return int(self._meta("version"))

    def _truncate_wal(self) -> None:
        """Copy the WAL into the file and truncate it: the old page images, which hold what was
        deleted, are gone. SQLite's busy handler waits up to ``erase_timeout`` for readers that
        still use them (the connection's own ``timeout`` is set back after)."""
        self._conn.execute(f"PRAGMA busy_timeout = {int(self.erase_timeout * 1000)}")
        try:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            self._conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        if busy:
            raise TimeoutError(f"{self.path}: the delete is committed, but a reader still uses the write-ahead "
                               f"log after {self.erase_timeout:g} s, so the deleted data may remain in "
                               f"{self.path}-wal; call purge() once the readers are done")

    def purge(self) -> None:
        """Make everything deleted so far unreadable from the store's files: rewrite the database
        (``VACUUM``, which leaves no freed page or cell behind, even of rows deleted by a gae that
        did not zero freed space), rebuild the full-text index and truncate the WAL."""
        if "memories" in self._tables():
            self._conn.execute("INSERT INTO memories_text (memories_text) VALUES ('optimize')")
        self._conn.execute("VACUUM")
        self._cache = None
        self._truncate_wal()

    def _insert(self, rows: Rows) -> None:
        scopes = [split_scope(key) for key in rows.scope]
        contents, sensitivities = rows.contents(), rows.sensitivities()
        self._conn.executemany(
            "INSERT INTO memories (seq, id, scope_type, scope_id, memory_type, content, embedding, confidence, "
            "sensitivity, source_ids, valid_from, valid_until, importance, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(int(rows.seq[i]), str(uuid.uuid4()), scopes[i][0], scopes[i][1], rows.memory_type[i], contents[i],
              np.ascontiguousarray(rows.embedding[i], dtype=np.float32).tobytes(), float(rows.confidence[i]),
              sensitivities[i], json.dumps(list(rows.source_ids[i])), float(rows.valid_from[i]),
              float(rows.valid_until[i]), float(rows.importance[i]), float(rows.created_at[i]))
             for i in range(len(rows))])
        self._conn.executemany("INSERT INTO memories_text (rowid, content) VALUES (?, ?)",
                               [(int(rows.seq[i]), text) for i, text in enumerate(contents) if text is not None])

    def _remove(self, action: str, time: float, seqs: Sequence[int]) -> None:
        ids = [(float(time), action, int(s)) for s in seqs]
        if action == "delete":  # a user's data goes: only the tombstone and the audit record stay
            self._conn.executemany("UPDATE memories SET deleted_at = ?, deleted_reason = ?, content = NULL, "
                                   "embedding = NULL WHERE seq = ?", ids)
        else:
            self._conn.executemany("UPDATE memories SET deleted_at = ?, deleted_reason = ? WHERE seq = ?", ids)
        self._conn.executemany("DELETE FROM memories_text WHERE rowid = ?", [(int(s),) for s in seqs])

    # -- reading -------------------------------------------------------------------------------
    def audit(self) -> list[AuditEntry]:
        return [AuditEntry(a, t, tuple(json.loads(i)), r, v, actor) for a, t, i, r, v, actor in
                self._conn.execute("SELECT action, time, ids, reason, version, actor FROM audit ORDER BY n")]

    def _live(self) -> dict[str, Any]:
        """The live rows' retrieval columns, cached until the stored version changes."""
        # another connection's commit changes data_version; this connection's commits drop the cache
        version = int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        rows = self._conn.execute("SELECT seq, embedding, scope_type, scope_id, importance, created_at, valid_from, "
                                  "valid_until FROM memories WHERE deleted_at IS NULL ORDER BY seq").fetchall()
        n = len(rows)
        assert self.dim is not None
        live = {"seq": np.array([r[0] for r in rows], dtype=np.int64),
                "embedding": np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(n, self.dim),
                "scope": np.array([join_scope(r[2], r[3]) for r in rows], dtype=object),
                **{name: np.array([r[j] for r in rows], dtype=np.float64)
                   for j, name in enumerate(("importance", "created_at", "valid_from", "valid_until"), start=4)}}
        self._cache = (version, live)
        return live

    def _text_scores(self, text: str) -> dict[int, float]:
        """FTS5 relevance (-bm25, higher is better) of each matching row; the caller scales it by the best
        match among the rows the query may see."""
        terms = [t for t in "".join(ch if ch.isalnum() else " " for ch in text).split() if t]
        if not terms:
            return {}
        query = " OR ".join(f'"{t}"' for t in terms)
        found = self._conn.execute("SELECT rowid, bm25(memories_text) FROM memories_text WHERE memories_text MATCH ?",
                                   (query,)).fetchall()
        return {int(rowid): -score for rowid, score in found}

    def retrieve(self, queries: Any, now: float, k: int = 5, scopes: Any = None, *,
                 weights: tuple[float, float, float] = (0.60, 0.25, 0.15), tau: float = 15.0,
                 text: str | Sequence[str] | None = None, w_text: float = 0.0) -> StoreRetrieval:
        """Rank in this process over the live rows that pass the scope, validity and tombstone
        filters (exact: every candidate is scored); see :meth:`MemoryStore.retrieve`."""
        if self.dim is None:
            raise RuntimeError("open(dim) the store before retrieving from it")
        unit = check_query(queries, self.dim, now, k)
        n_queries = unit.shape[0]
        allowed = scope_filters(scopes, n_queries)
        texts = check_weights(weights, tau, w_text, text, n_queries)
        live = self._live()
        result = padded(n_queries, k)
        valid = (live["valid_from"] <= now) & (now < live["valid_until"])
        recency = np.exp(-(now - live["created_at"]) / tau)
        w_sim, w_rec, w_imp = weights
        groups: dict[tuple[str, ...] | None, list[int]] = {}  # queries that see the same rows share one matmul
        for q, keys in enumerate(allowed):
            groups.setdefault(None if keys is None else tuple(sorted(set(keys))), []).append(q)
        for group, members in groups.items():
            mask = valid if group is None else valid & np.isin(live["scope"], list(group))
            rows = np.flatnonzero(mask)
            if rows.size == 0:
                continue
            every = rows.size == mask.size  # no copy of the embeddings when every row is visible
            embedding, seq = (live["embedding"], live["seq"]) if every else (live["embedding"][rows], live["seq"][rows])
            bias = w_rec * recency[rows] + w_imp * live["importance"][rows]
            similarities = unit[members] @ embedding.T  # (G, R)
            for i, q in enumerate(members):
                similarity = similarities[i].astype(np.float64)
                match = np.zeros(rows.size)
                query_text = texts[q]
                if query_text is not None and w_text != 0.0:
                    scores_by_seq = self._text_scores(query_text)
                    match = np.array([scores_by_seq.get(int(s), 0.0) for s in seq])
                    best = match.max() if match.size else 0.0  # scaled among the rows this query may see
                    match = np.where(match > 0, match / best, 0.0) if best > 0 else (match != 0).astype(float)
                score = w_sim * similarity + bias + w_text * match
                if score.size > k:  # the k best and everything tied with the k-th, then an exact sort
                    kth = np.partition(score, score.size - k)[score.size - k]
                    near = np.flatnonzero(score >= kth)
                else:
                    near = np.arange(score.size)
                order = near[np.lexsort((seq[near], -score[near]))][:k]  # best first; ties: the older memory
                m = order.size
                result.ids[q, :m] = seq[order]
                result.scores[q, :m] = score[order]
                result.similarity[q, :m] = similarity[order]
                result.recency[q, :m] = recency[rows][order]
                result.importance[q, :m] = live["importance"][rows][order]
                result.text[q, :m] = match[order]
        return result

    def close(self) -> None:
        self.closed = True
        self._conn.close()
