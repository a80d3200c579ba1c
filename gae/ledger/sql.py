"""The ledger's tables on each store: the same statements, in SQLite's and Postgres' dialects.

Four tables, each row under its ledger's name (several memories may share one store):
``ledger_meta`` (the head sequence number, the epoch, the names and settings the ledger was
created with), ``ledger_events`` (every decision, verification, closing and growth, by
sequence number), ``ledger_pending`` (the decisions still open, pointing at their event),
``ledger_snapshots`` (the memory's state after a sequence number) and ``ledger_audit`` (who
forgot or undid what, when and why: counts, never content).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: SQLite's own lock alone
    fcntl = None  # type: ignore[assignment]

EVENT_COLUMNS = ("seq", "kind", "decision_id", "category", "factors", "action", "confirmed", "outcome",
                 "source_id", "decided_version", "version", "at", "detail")

_TABLES = """
CREATE TABLE IF NOT EXISTS {p}ledger_meta (ledger TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (ledger, key));
CREATE TABLE IF NOT EXISTS {p}ledger_events (ledger TEXT NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL,
    decision_id TEXT, category TEXT, factors {blob}, action TEXT, confirmed INTEGER, outcome TEXT,
    source_id BIGINT, decided_version BIGINT, version BIGINT, at DOUBLE PRECISION, detail TEXT,
    PRIMARY KEY (ledger, seq));
CREATE INDEX IF NOT EXISTS {p}ledger_events_decision ON {p}ledger_events (ledger, decision_id);
CREATE INDEX IF NOT EXISTS {p}ledger_events_source ON {p}ledger_events (ledger, source_id);
CREATE TABLE IF NOT EXISTS {p}ledger_pending (ledger TEXT NOT NULL, decision_id TEXT NOT NULL, seq BIGINT NOT NULL,
    PRIMARY KEY (ledger, decision_id));
CREATE TABLE IF NOT EXISTS {p}ledger_snapshots (ledger TEXT NOT NULL, seq BIGINT NOT NULL, version BIGINT NOT NULL,
    state {blob} NOT NULL, PRIMARY KEY (ledger, seq));
CREATE TABLE IF NOT EXISTS {p}ledger_audit (ledger TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL,
    action TEXT NOT NULL, reason TEXT NOT NULL, count BIGINT NOT NULL, seq BIGINT NOT NULL)
"""


class Dialect:
    """A store's connection as the ledger uses it: ``run`` / ``rows`` / ``many`` with ``?``
    placeholders, ``changed`` (whether another connection may have committed since the last
    call), and ``erase`` (after a commit that deleted rows: make them unreadable from the files)."""

    prefix = ""
    blob = "BLOB"

    def __init__(self, store: Any) -> None:
        self.store = store

    def create(self) -> None:
        for statement in _TABLES.format(p=self.prefix, blob=self.blob).split(";"):
            if statement.strip():
                self.run(statement)

    def table(self, name: str) -> str:
        return f"{self.prefix}ledger_{name}"

    def run(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        raise NotImplementedError

    def rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def many(self, statement: str, params: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def changed(self) -> bool:
        return True

    @contextmanager
    def queue(self) -> Iterator[None]:
        """Taken before the store's write lock: a lock writers wait on, where the store's would make them poll."""
        yield

    def erase(self) -> None:
        raise NotImplementedError


class SQLiteDialect(Dialect):
    """On :class:`~gae.episodic.store.SQLiteStore`'s connection (WAL, ``secure_delete`` on)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self._conn = store._conn
        self._data_version = -1
        path = store.path
        on_disk = fcntl is not None and path not in ("", ":memory:") and not path.startswith("file:")
        if on_disk and "_ledger_lock_file" not in store.__dict__:  # one per store object, closed with it
            store.__dict__["_ledger_lock_file"] = open(f"{path}.ledger-lock", "a+b")  # noqa: SIM115
        self._lock_file = store.__dict__.get("_ledger_lock_file")

    @contextmanager
    def queue(self) -> Iterator[None]:
        """An exclusive ``flock`` on ``<path>.ledger-lock`` around the write: SQLite's busy handler
        makes a waiting writer sleep (1, 2, 5, ... 100 ms) and retry, so under contention one
        process starves the others and the lock sits idle between them; the kernel wakes the next
        waiter of a file lock at once. Writers that do not take it (an episodic memory on the same
        file) still serialize through SQLite's own lock."""
        held = self.store.__dict__.get("_ledger_queued", 0)  # (under the store's thread lock: one writer here)
        if self._lock_file is None or held:
            self.store.__dict__["_ledger_queued"] = held + 1
            try:
                yield
            finally:
                self.store.__dict__["_ledger_queued"] = held
            return
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self.store.__dict__["_ledger_queued"] = 1
        try:
            yield
        finally:
            self.store.__dict__["_ledger_queued"] = 0
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def run(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        self._conn.execute(statement, params)

    def rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(statement, params).fetchall()

    def many(self, statement: str, params: list[tuple[Any, ...]]) -> None:
        self._conn.executemany(statement, params)

    def changed(self) -> bool:
        """``PRAGMA data_version`` moves when another connection commits (a few microseconds):
        this connection's own commits go through the ledger, which knows them."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        moved, self._data_version = version != self._data_version, version
        return moved

    def erase(self) -> None:
        """Freed pages are zeroed (``secure_delete``); the WAL's old page images go with a truncating checkpoint."""
        self.store._truncate_wal()


class PostgresDialect(Dialect):
    """On :class:`~gae.episodic.store.PostgresStore`'s connection, its tables named after the store's table."""

    blob = "BYTEA"

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self._conn = store._conn
        self.prefix = f"{store.table}_"

    @staticmethod
    def _sql(statement: str) -> str:
        return statement.replace("?", "%s")

    def run(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        self._conn.execute(self._sql(statement), params)

    def rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in self._conn.execute(self._sql(statement), params).fetchall()]

    def many(self, statement: str, params: list[tuple[Any, ...]]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(self._sql(statement), params)

    def erase(self) -> None:
        """``VACUUM FULL`` of the ledger's tables, then the WAL switched and checkpointed twice
        (:func:`gae.episodic.store.postgres_erase.purge`); a server that cannot promise it says why."""
        from psycopg import sql

        from gae.episodic.store import postgres_erase

        problems = postgres_erase.erasure_problems(self._conn) + postgres_erase.snapshot_problems(self._conn)
        if problems:
            raise RuntimeError("the forgotten rows are deleted, but this server cannot erase them from its files: "
                               + "; ".join(problems))
        for name in ("events", "pending", "snapshots"):
            postgres_erase.purge(self._conn, sql.SQL("VACUUM FULL {}").format(sql.Identifier(self.table(name))))


def dialect(store: Any) -> Dialect:
    """The dialect of one of :mod:`gae.episodic.store`'s stores; TypeError for anything else."""
    from gae.episodic.store import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteDialect(store)
    try:
        from gae.episodic.store import PostgresStore
    except ImportError:  # pragma: no cover - the extra is not installed
        PostgresStore = None  # type: ignore[assignment,misc]  # noqa: N806
    if PostgresStore is not None and isinstance(store, PostgresStore):
        return PostgresDialect(store)
    raise TypeError(f"store must be a SQLiteStore or a PostgresStore of gae.episodic.store, got {type(store).__name__}")
