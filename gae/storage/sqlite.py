"""SQLiteStore: the embedded default store (Python's sqlite3, no server), full-text search with FTS5."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time as _time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from gae.storage import sqlite_integrity, sqlite_read, sqlite_schema
from gae.storage.base import (
    SCHEMA_VERSION,
    AuditEntry,
    Change,
    MemoryStore,
    Rows,
    Snapshot,
    StoreCheck,
    StoreRetrieval,
    check_flag,
    check_query,
    check_weights,
    dumps_ids,
    scope_filters,
)
from gae.storage.errors import NewerSchema, StoreConflict, StoreCorrupted
from gae.storage.integrity import (
    CHECKED,
    checksum,
    row_checksum,
    sqlite_file_problems,
    tombstoned,
    written_columns,
)
from gae.storage.sqlite_lock import WriterQueue
from gae.storage.tables import BLOB, INT, REAL, TEXT, Table
from gae.validation import check_int, check_text

_ROW, _AUDIT, _SHOWN = sqlite_integrity.ROW, sqlite_integrity.AUDIT, sqlite_integrity.SHOWN
# the tables of the episodic memory (and SQLite's own): check() knows them without the catalog
# The database files this process holds SQLite connections to, by (device, inode), with how many.
# Closing any descriptor of a file drops every POSIX lock the process holds on it, SQLite's
# included (then another process, closing last, deletes the write-ahead log under this one): the
# header is read with Python's open() only while no connection of the process has the file open.
# (A weak set: a store collected without close() leaves it by itself, its connection closed with it,
# and nothing of that runs under this module's lock, which a collection inside it would deadlock.)
_OPEN_FILES: dict[tuple[int, int], weakref.WeakSet[SQLiteStore]] = {}
_OPEN_FILES_LOCK = threading.Lock()
_EPISODIC = {"schema_version", "meta", "memories", "audit", "sqlite_sequence", "sqlite_stat1"}


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

    Integrity: constructing the store on an existing file first checks what is cheap (SQLite's
    header and the file's size against it, ``PRAGMA quick_check``, the schema version) and refuses
    a damaged file with :class:`~gae.storage.StoreCorrupted`, before anything writes to
    it; every row, audit record and meta value carries a checksum, which :meth:`check` verifies
    with ``PRAGMA integrity_check`` and the full-text index's own check, as it verifies every row
    of every checksummed table (:meth:`~gae.storage.store.Store.create_tables`).

    Permissions: a store writes its file and creates ``<path>-wal``, ``<path>-shm`` and
    ``<path>.ledger-lock`` beside it, so a file or a directory it may not write raises
    PermissionError naming the path and the permission missing (not StoreCorrupted).

    Writers: every write block (:meth:`~gae.storage.store.Store.exclusive`) first takes the
    exclusive ``flock`` of ``<path>.ledger-lock`` (:mod:`~gae.storage.sqlite_lock`), then
    ``BEGIN IMMEDIATE``; :meth:`close` closes both the connection and that file.

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
    _types = {INT: "BIGINT", REAL: "DOUBLE PRECISION", TEXT: "TEXT", BLOB: "BLOB"}
    _row_match = "rowid = ?"

    def __init__(self, path: str | Path, *, synchronous: str = "FULL", actor: str = "gae",
                 erase_timeout: float = 30.0, timeout: float = 30.0) -> None:
        super().__init__()
        if synchronous not in ("FULL", "NORMAL", "OFF"):
            raise ValueError(f"synchronous must be 'FULL', 'NORMAL' or 'OFF', got {synchronous!r}")
        if not isinstance(actor, str) or not actor:
            raise ValueError(f"actor must be a non-empty string, got {actor!r}")
        check_text("actor", actor)
        for name, value in (("erase_timeout", erase_timeout), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self.timeout = float(timeout)
        self.path = str(path)
        self.actor = str(actor)  # a plain str: it is part of each audit record's checksum
        self.erase_timeout = float(erase_timeout)
        self.synchronous = synchronous
        self._check_permissions()
        self._file_key: tuple[int, int] | None = None
        with _OPEN_FILES_LOCK:  # (the header read and the connection's registration, one step for the process)
            existing = self._check_file()
            try:
                self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                             timeout=self.timeout)
            except sqlite3.Error as error:
                raise self._refusal(error, "SQLite cannot open it") from error
            self._file_key = _file_key(self.path) if self._on_disk() else None
            if self._file_key is not None:
                _OPEN_FILES.setdefault(self._file_key, weakref.WeakSet()).add(self)
        self._queue = WriterQueue(self.path) if self._on_disk() else None
        self._owns_queue = True  # (a writer() shares its store's and leaves it open)
        try:
            if existing:
                self._check_database()
            with self._refusing("SQLite cannot switch it to write-ahead logging"):
                self._wal()
                self._conn.execute(f"PRAGMA synchronous={synchronous}")
                self._conn.execute("PRAGMA secure_delete=ON")  # whatever a delete frees is overwritten with zeros
        except BaseException:
            self._close_connection()
            raise
        self.dim: int | None = None
        self._cache: tuple[int, dict[str, Any]] | None = None  # (version, live columns) for retrieve

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, dim={self.dim})"

    @property
    def where(self) -> str:
        return self.path

    def _on_disk(self) -> bool:
        return self.path not in ("", ":memory:") and not self.path.startswith("file:")

    # -- permissions and integrity -------------------------------------------------------------------
    def _check_permissions(self) -> None:
        """PermissionError naming what this process may not do that a store must: read and write
        the file, and create files beside it (the write-ahead log, its index, the writers' lock
        file). A missing folder raises FileNotFoundError."""
        if not self._on_disk():
            return
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(errno.ENOENT, f"the folder of the SQLite store does not exist: {folder}", self.path)
        if os.path.exists(self.path):
            missing = [what for what, mode in (("read", os.R_OK), ("write", os.W_OK)) if not os.access(self.path, mode)]
            if missing:
                raise PermissionError(errno.EACCES, f"this process may not {' or '.join(missing)} the SQLite store's "
                                                    f"file (it needs to read and write it)", self.path)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, f"this process may not create files in the folder {folder} of the "
                                                "SQLite store (it needs write permission there for its write-ahead "
                                                "log, the log's index and its writers' lock file)", self.path)

    def _refusal(self, error: sqlite3.Error, what: str) -> Exception:
        """What to raise for ``error``: PermissionError for SQLite's permission codes, StoreCorrupted otherwise."""
        name = getattr(error, "sqlite_errorname", "")
        if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")):
            return PermissionError(errno.EACCES, f"SQLite may not open or write the store ({what}: {error})",
                                   self.path)
        return StoreCorrupted(self.path, f"{what}: {error}")

    def _check_file(self) -> bool:
        """Refuse a file whose header or size is wrong (:func:`~gae.storage.integrity.sqlite_file_problems`),
        reading it only. True when the file exists and is not empty (a store or something else)."""
        if not self._on_disk() or not os.path.isfile(self.path):
            return False
        key = _file_key(self.path)
        if key is not None and _OPEN_FILES.get(key):  # open here already, and checked then: a read would drop its locks
            return os.path.getsize(self.path) > 0
        problems = sqlite_file_problems(self.path)
        if problems:
            raise StoreCorrupted(self.path, problems)
        return os.path.getsize(self.path) > 0

    def _check_database(self) -> None:
        """``PRAGMA quick_check`` and the schema version, on a connection that may not write."""
        conn = self._conn
        conn.execute("PRAGMA query_only = ON")
        try:
            with self._refusing("SQLite cannot read it"):
                found = [row[0] for row in conn.execute(f"PRAGMA quick_check({_SHOWN})")]
                if found != ["ok"]:
                    raise StoreCorrupted(self.path, [f"quick_check: {line}" for line in found])
                if "memories" in self._tables():
                    self._schema_version()
        finally:
            conn.execute("PRAGMA query_only = OFF")

    @contextmanager
    def _refusing(self, what: str, statements: bool = False) -> Iterator[None]:
        """Raise what reading a damaged store raises (SQLite's errors, undecodable values) as
        :class:`StoreCorrupted` saying ``what`` failed, and SQLite's permission errors as
        PermissionError; a lock stays what it is, and with ``statements`` (statements on tables
        whose columns were verified) a broken constraint or a mistake in a statement too."""
        try:
            yield
        except (StoreCorrupted, NewerSchema):
            raise
        except sqlite3.DatabaseError as error:
            if sqlite_integrity.busy(error) or (statements and sqlite_integrity.mistake(error)):
                raise
            raise self._refusal(error, what) from error
        except (ValueError, TypeError, KeyError, IndexError, UnicodeError) as error:  # json's errors are ValueErrors
            raise StoreCorrupted(self.path, f"{what}: {type(error).__name__}: {error}") from error

    def _schema_version(self) -> int:
        return sqlite_schema.schema_version(self._conn, self.path)

    def check(self, *, raises: bool = True) -> StoreCheck:
        """Verify the whole file (see :meth:`MemoryStore.check`): ``PRAGMA integrity_check`` (every
        page, b-tree and index entry, and the constraints), each row's, audit record's and meta
        value's checksum, and the full-text index (FTS5's ``integrity-check``, and that it holds
        exactly the live rows' content). Reads run in one read transaction, so writers go on; the
        full-text check holds the write lock, so writers wait for it. Reads the whole file: its
        cost is in docs/store.md."""
        check_flag("raises", raises)
        if self.closed:
            raise RuntimeError(f"{self.path}: the store is closed; open a new SQLiteStore to check it")
        began = _time.perf_counter()
        problems: list[str] = []
        checks: list[str] = []
        skipped: list[str] = []
        rows = audit = 0
        tables: dict[str, int] = {}
        try:
            with self._refusing("SQLite cannot read it"), self.reading():
                found = [row[0] for row in self._conn.execute("PRAGMA integrity_check(100)")]
                checks.append("PRAGMA integrity_check")
                problems += [] if found == ["ok"] else [f"integrity_check: {line}" for line in found]
                names = self._tables()
                stored = "memories" in names
                version = self._schema_version() if stored else 0
                if not names:
                    skipped.append("checksums: the file holds no store yet")
                elif not stored:
                    pass  # no memories: the checksummed tables are all there is (_check_tables)
                elif version < 2:
                    skipped.append(f"checksums: schema version {version} has none (open(dim) adds them)")
                else:
                    rows, audit = sqlite_integrity.verify(self._conn, problems)
                    checks.append("row, audit and meta checksums")
                tables = self._check_tables(checks, skipped, problems)
            if stored:
                with self._refusing("its full-text index cannot be read"), self.exclusive():
                    problems += sqlite_integrity.check_text(self._conn)
                    checks.append("full-text index (FTS5 integrity-check, live rows' content)")
        except StoreCorrupted as error:
            problems += error.problems
        report = StoreCheck(self.path, rows, audit, tuple(checks), tuple(skipped), tuple(problems),
                            _time.perf_counter() - began, tables)
        if problems and raises:
            raise StoreCorrupted(self.path, problems)
        return report

    @contextmanager
    def _read_view(self) -> Iterator[None]:
        """``BEGIN`` ... ``COMMIT``: in WAL mode, one snapshot of the committed pages while others write."""
        with self._refusing("SQLite cannot read it"):
            self._conn.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._end()
            raise
        with self._refusing("SQLite cannot read it"):
            if self._conn.in_transaction:
                self._conn.execute("COMMIT")

    def _end(self) -> None:
        """After a block that raised: roll its transaction back, if SQLite has not already (an
        error of the rollback, on a damaged file, must not hide the block's own)."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

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
        return sqlite_schema.tables(self._conn)

    def open(self, dim: int, audit_last: int | None = None) -> Snapshot | None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if "memories" not in self._tables():
            created = False
            with self.exclusive():  # SQLite's DDL is transactional: all tables or none
                if "memories" not in self._tables():  # (another process may have created them while this one waited)
                    sqlite_schema.create(self._conn, dim)
                    created = True
            if created:
                self.dim = dim
                return None
        if self._schema_version() < SCHEMA_VERSION:
            self._migrate()
        with self._refusing("its meta table cannot be read"):
            stored = int(self._meta("dim"))
        if stored != dim:
            raise ValueError(f"{self.path} holds memories of dim={stored}, not dim={dim}")
        self.dim = dim
        return self._snapshot(audit_last)

    def _migrate(self) -> None:
        """Bring an older schema up to :data:`SCHEMA_VERSION` (:func:`~gae.storage.sqlite_schema.migrate`)."""
        with self.exclusive(), self._refusing("cannot add checksums to it"):
            sqlite_schema.migrate(self._conn, self.path)

    def _meta(self, key: str) -> str:
        return sqlite_read.meta(self._conn, self.path, key)

    def _snapshot(self, audit_last: int | None = None) -> Snapshot:
        assert self.dim is not None
        with self._refusing("its rows cannot be read"), self.reading():  # one consistent read
            return self._read_snapshot(audit_last)

    def _read_snapshot(self, audit_last: int | None) -> Snapshot:
        assert self.dim is not None
        return sqlite_read.snapshot(self._conn, self.path, self.dim, lambda: self.audit(audit_last))

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
        audit = [(str(e.action), float(e.time) + 0.0, dumps_ids(e.ids), str(e.reason), int(e.version), self.actor)
                 for e in change.audit]
        conn.executemany(f"INSERT INTO audit ({_AUDIT}, checksum) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [(*values, checksum(b"audit", values)) for values in audit])
        conn.executemany("UPDATE meta SET value = ?, checksum = ? WHERE key = ?", [
            (value, checksum(b"meta", (key, value)), key) for key, value in (
                ("version", str(change.version)), ("next_id", str(change.next_id)),
                ("scope_names", json.dumps(change.scope_names)))])
        if change.erase:  # the full-text index rebuilt: a deleted row's terms leave its segments
            conn.execute("INSERT INTO memories_text (memories_text) VALUES ('optimize')")

    @contextmanager
    def _hold(self, lock: str | None = None) -> Iterator[None]:
        """The writers' queue (:class:`~gae.storage.sqlite_lock.WriterQueue`), then ``BEGIN
        IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` if the block raises). SQLite has one writer per
        file: ``lock`` names nothing of its own here."""
        with self._queue.held(self.timeout) if self._queue is not None else nullcontext():
            try:
                self._begin_write()
                yield
                with self._refusing("SQLite cannot commit to it"):
                    self._conn.execute("COMMIT")
            except BaseException:
                self._end()
                raise
            finally:
                self._cache = None

    def _erase_now(self) -> None:
        self._truncate_wal()

    def _erase(self, tables: Sequence[Table]) -> None:
        """Freed pages are zeroed as they are freed (``secure_delete``): the WAL's old page images
        go with a truncating checkpoint."""
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
        with self._refusing("its meta table cannot be read"):
            return int(self._meta("version"))

    def _truncate_wal(self) -> None:
        """Copy the WAL into the file and truncate it: the old page images, which hold what was
        deleted, are gone. SQLite's busy handler waits up to ``erase_timeout`` for readers that
        still use them (the connection's own ``timeout`` is set back after)."""
        with self._lock:
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
        with self._lock:
            if self._held or self._viewing:
                raise RuntimeError(f"{self.path}: purge() rewrites the file and cannot run inside a write or read "
                                   "block of the store")
            self._check_open()
            if "memories" in self._tables():
                self._conn.execute("INSERT INTO memories_text (memories_text) VALUES ('optimize')")
            self._conn.execute("VACUUM")
            self._cache = None
            self._truncate_wal()

    def _insert(self, rows: Rows) -> None:
        (scopes, contents, sensitivities, memory_types, embedding, confidence, valid_from, valid_until, importance,
         created_at) = written_columns(rows)
        records = []
        for i, seq in enumerate(rows.seq.tolist()):
            values = (seq, scopes[i][0], scopes[i][1], memory_types[i], contents[i], embedding[i].tobytes(),
                      confidence[i], sensitivities[i], dumps_ids(rows.source_ids[i]), valid_from[i], valid_until[i],
                      importance[i], created_at[i], None, None)  # CHECKED's order
            records.append((*values[:-2], str(uuid.uuid4()), row_checksum(values)))
        self._conn.executemany(f"INSERT INTO memories ({', '.join(CHECKED[:-2])}, id, checksum) "
                               f"VALUES ({', '.join(['?'] * (len(CHECKED) - 2 + 2))})", records)
        self._conn.executemany("INSERT INTO memories_text (rowid, content) VALUES (?, ?)",
                               [(int(rows.seq[i]), text) for i, text in enumerate(contents) if text is not None])

    def _remove(self, action: str, time: float, seqs: Sequence[int]) -> None:
        erase = action == "delete"  # a user's data goes: only the tombstone and the audit record stay
        seqs = [int(s) for s in seqs]
        updates = []
        for start in range(0, len(seqs), 500):  # each row's new checksum, from the row as stored
            chunk = seqs[start:start + 500]
            for *values, stored in self._conn.execute(f"SELECT {_ROW}, checksum FROM memories WHERE seq IN "
                                                      f"({', '.join(['?'] * len(chunk))})", chunk):
                updates.append((float(time) + 0.0, action, tombstoned(values, stored, time, action, erase),
                                values[0]))
        self._conn.executemany("UPDATE memories SET deleted_at = ?, deleted_reason = ?, checksum = ?"
                               f"{', content = NULL, embedding = NULL' if erase else ''} WHERE seq = ?", updates)
        self._conn.executemany("DELETE FROM memories_text WHERE rowid = ?", [(s,) for s in seqs])

    # -- reading -------------------------------------------------------------------------------
    def audit(self, last: int | None = None) -> list[AuditEntry]:
        limit = -1 if last is None else check_int("last", last, low=0)  # SQLite: -1, no limit
        with self._refusing("its audit table cannot be read"):
            return sqlite_read.audit(self._conn, limit)

    def _live(self) -> dict[str, Any]:
        """The live rows' retrieval columns, cached until the stored version changes."""
        # another connection's commit changes data_version; this connection's commits drop the cache
        version = int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        assert self.dim is not None
        live = sqlite_read.live_columns(self._conn, self.dim)
        self._cache = (version, live)
        return live

    def _text_scores(self, text: str) -> dict[int, float]:
        with self._refusing("its full-text index cannot be read"):
            return sqlite_read.text_scores(self._conn, text)

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
        with self._refusing("its rows cannot be read"):
            live = self._live()
        return sqlite_read.rank(live, unit, now, k, allowed, texts, weights, tau, w_text, self._text_scores)

    def close(self) -> None:
        """Close the connection and the writers' lock file (the data stays)."""
        with self._lock:
            self.closed = True
            self._close_writer()
            self._close_connection()
            if self._queue is not None and self._owns_queue:
                self._queue.close()

    def _close_connection(self) -> None:
        """Close the connection and take this store out of :data:`_OPEN_FILES`."""
        self._conn.close()
        with _OPEN_FILES_LOCK:
            if self._file_key is not None:
                _OPEN_FILES.get(self._file_key, weakref.WeakSet()).discard(self)

    def _reopen(self) -> SQLiteStore:
        if not self._on_disk():  # (another connection to ":memory:" would open another database)
            return self
        writer = SQLiteStore(self.path, synchronous=self.synchronous, actor=self.actor,
                             erase_timeout=self.erase_timeout, timeout=self.timeout)
        if writer._queue is not None:  # one lock file per store object: the writer queues on this one's
            writer._queue.close()
            writer._queue, writer._owns_queue = self._queue, False
        return writer

    # -- the table API's statements (gae.storage.store.Store) --------------------------------------------------
    def data_version(self) -> int | None:
        with self._lock, self._refusing("SQLite cannot read it"):
            self._check_open()
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _guard(self, what: str) -> AbstractContextManager[None]:
        return self._refusing(what, statements=True)

    def _physical(self, name: str) -> str:
        return name

    def _columns(self, physical: str) -> list[str] | None:
        found = [row[1] for row in self._conn.execute(f"PRAGMA table_info({physical})")]
        return found or None

    def _run(self, statement: str, params: Sequence[Any] = ()) -> int:
        return self._conn.execute(statement, tuple(params)).rowcount

    def _rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(statement, tuple(params)).fetchall()

    def _many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(statement, rows)

    def _stream(self, statement: str) -> Iterator[tuple[Any, ...]]:
        return iter(self._conn.execute(statement))

    def _batches(self, physical: str, names: Sequence[str]) -> Iterator[list[tuple[Any, ...]]]:
        last = None  # in slices of the rowid: no cursor reads a table while it is updated
        while True:
            after = "" if last is None else "WHERE rowid > ? "
            found = self._conn.execute(f"SELECT rowid, {', '.join(names)} FROM {physical} {after}ORDER BY rowid "
                                       "LIMIT 1000", () if last is None else (last,)).fetchall()
            if not found:
                return
            yield found
            last = found[-1][0]

    def _integrity_problems(self) -> list[str]:
        found = [row[0] for row in self._conn.execute(f"PRAGMA integrity_check({_SHOWN})")]
        return [] if found == ["ok"] else [f"integrity_check: {line}" for line in found]

    def _unlisted(self, catalogued: set[str]) -> set[str]:
        return {name for name in self._tables() - _EPISODIC - catalogued - {"gae_tables"}
                if not name.startswith("memories_text")}


def _file_key(path: str) -> tuple[int, int] | None:
    """The file at ``path`` as (device, inode), or None when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino
