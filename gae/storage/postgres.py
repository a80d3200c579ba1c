"""PostgresStore: memories in a Postgres server with pgvector, filtered and ranked by the server."""

from __future__ import annotations

import errno
import json
import time as _time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from gae.storage import postgres_erase
from gae.storage import postgres_integrity as integrity
from gae.storage import postgres_ranking as ranking
from gae.storage import postgres_schema as schema
from gae.storage.base import (
    SCHEMA_VERSION,
    SNAPSHOT_COLUMNS,
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
    padded,
    rows_from_records,
    scope_filters,
    scope_keys,
)
from gae.storage.errors import NewerSchema, StoreConflict, StoreCorrupted
from gae.storage.integrity import checksum, row_checksum, written_columns
from gae.storage.postgres_vector import Vector, register_vector
from gae.storage.tables import BLOB, CATALOG, INT, REAL, TEXT, Table
from gae.validation import check_int, check_text

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


class PostgresStore(MemoryStore):
    """A memory store in a Postgres database with the pgvector extension.

    The same tables as :class:`~gae.storage.SQLiteStore` (the columns of the original design, a
    uuid ``id`` and the memory's integer id ``seq``; tombstones; an audit and a meta table),
    with the embedding as ``vector(dim)``. Indexes: a btree on (scope_type, scope_id,
    memory_type, valid_until), and over the live rows (``deleted_at IS NULL``, so tombstones
    never crowd a scan) an HNSW index (cosine) on the embedding, a GIN full-text index on
    ``content`` and btrees on ``created_at`` and ``importance``. The auxiliary tables are named
    after ``table`` (``<table>_meta``, ``<table>_audit``, ``<table>_schema_version``), so one
    database can hold several memories. Each :meth:`commit` is one transaction.

    :meth:`retrieve` ranks in the server: scope, validity and tombstone filters are in the
    ``WHERE`` clause and the score ``w_sim cos + w_rec exp(-age/tau) + w_imp importance
    (+ w_text text_match)`` is computed in SQL, over every row that passes the filters
    (``exact=True``: SQLiteStore's ranking) or over a candidate pool drawn from the indexes
    (default), which falls back to the exact ranking when it cannot prove it holds the top k.

    With ``row_level_security=True`` the table gets a row-level security policy keyed on the
    session setting ``gae.scopes`` (see :meth:`set_scopes`): a connection restricted to some
    scopes sees, changes and retrieves only their rows, whatever the query. This guards against
    mistakes in the application, not against a client that can set ``gae.scopes`` itself; and
    Postgres superusers and roles with BYPASSRLS are never restricted.

    Integrity: every row, audit record and meta value carries a checksum written with it;
    :meth:`open` refuses an unknown or newer schema version and meta values that do not match
    theirs, and :meth:`check` verifies every checksum (and the btree indexes, with amcheck), the
    rows of every checksummed table (:meth:`~gae.storage.store.Store.create_tables`, named
    ``<table>_<name>``) included.

    Writers: every write block (:meth:`~gae.storage.store.Store.exclusive`) is one transaction
    holding the table's advisory lock; a role that lacks a privilege raises PermissionError.

    Args:
        dsn: a libpq connection string or URI.
        table: the memories table (a lowercase SQL identifier). Default: ``'memories'``.
        actor: written in the audit rows of this connection. Default: ``'gae'``.
        row_level_security: enable the scope policy on the table at :meth:`open`. Default: False.
        ef_search: HNSW ``ef_search`` of approximate retrieval (1 to 1000). Default: the
            candidate count (capped at 1000), since pgvector's index scan returns at most
            ``ef_search`` rows.
        candidates: rows drawn per query from each index (nearest, most recent, most
            important, best text matches) to be re-ranked by the full score. Default:
            ``max(100, 10 k)``.
        timeout: seconds a commit waits for another writer's lock before it raises TimeoutError
            (nothing of it written). Default: 30.

    Attributes:
        exact_fallbacks: queries of approximate :meth:`retrieve` calls that fell back to the
            exact ranking (their pool could not be shown to hold the top k), since construction.

    Examples::

        store = PostgresStore("postgresql://localhost/gae", table="support_memories")
        memory = EpisodicMemory(384, store=store)
    """

    _types = {INT: "bigint", REAL: "double precision", TEXT: "text", BLOB: "bytea"}
    _row_match = "ctid = ?::tid"

    def __init__(self, dsn: str, *, table: str = "memories", actor: str = "gae", row_level_security: bool = False,
                 ef_search: int | None = None, candidates: int | None = None, timeout: float = 30.0) -> None:
        super().__init__()
        if not isinstance(dsn, str) or not dsn:
            raise ValueError(f"dsn must be a non-empty connection string, got {dsn!r}")
        if not isinstance(table, str) or not schema.TABLE_NAME.fullmatch(table):
            raise ValueError(f"table must be a lowercase SQL identifier of at most 40 characters, got {table!r}")
        if not isinstance(actor, str) or not actor:
            raise ValueError(f"actor must be a non-empty string, got {actor!r}")
        check_text("actor", actor)
        if not isinstance(row_level_security, bool):
            raise ValueError(f"row_level_security must be a bool, got {row_level_security!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        for name, value, most in (("ef_search", ef_search, 1000), ("candidates", candidates, None)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1
                                      or (most is not None and value > most)):
                raise ValueError(f"{name} must be None or an int in [1, {most or 'inf'}], got {value!r}")
        try:
            import psycopg
            from psycopg import sql
        except ImportError as error:
            raise ImportError("PostgresStore needs psycopg 3: pip install 'gae-torch[store]'") from error
        self.table = table
        self.actor = str(actor)  # a plain str: it is part of each audit record's checksum
        self.row_level_security = row_level_security
        self.ef_search = ef_search
        self.candidates = candidates
        self.dim: int | None = None
        self.exact_fallbacks = 0
        self._sql = sql
        self._statements: dict[tuple[bool, bool, bool], sql.Composed] = {}
        self._names = {name: sql.Identifier(f"{table}{suffix}") for name, suffix in (
            ("t", ""), ("meta", "_meta"), ("audit", "_audit"), ("version", "_schema_version"),
            ("filter_index", "_filter"), ("hnsw_index", "_embedding_hnsw"), ("text_index", "_content_fts"),
            ("created_index", "_created_at"), ("importance_index", "_importance"),
            ("policy", "_scopes"))}
        self._conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        self._dsn = dsn  # (for writer(); never shown: it may hold a password)
        self._dbname = self._conn.info.dbname  # for repr, which must not show the dsn's password
        self._where = f"table {table!r} of database {self._dbname!r}"  # what StoreCorrupted names

    def __repr__(self) -> str:
        return f"PostgresStore(dbname={self._dbname!r}, table={self.table!r}, dim={self.dim})"

    @property
    def where(self) -> str:
        return self._where

    def _q(self, template: str, **extra: Any) -> sql.Composed:
        """A statement with the store's table names filled in (``{t}``, ``{meta}``, ...)."""
        return self._sql.SQL(template).format(**self._names, **extra)

    # -- schema ----------------------------------------------------------------------------
    def _exists(self) -> bool:
        return self._conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{self.table}_meta",)).fetchone() == (True,)

    def open(self, dim: int, audit_last: int | None = None) -> Snapshot | None:
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 2000:
            raise ValueError(f"dim must be an int in [1, 2000] (pgvector's HNSW limit), got {dim!r}")
        conn = self._conn
        created = False
        if not self._exists():
            with self.exclusive():  # Postgres' DDL is transactional: every table or none
                if not self._exists():  # another process may have created it while we waited
                    for statement in filter(str.strip, schema.SCHEMA.split(";")):
                        conn.execute(self._q(statement, dim=self._sql.Literal(dim)))
                    conn.execute(self._q("INSERT INTO {version} VALUES (%s)"), (SCHEMA_VERSION,))
                    with conn.cursor() as cur:
                        cur.executemany(self._q("INSERT INTO {meta} VALUES (%s, %s, %s)"), [
                            (key, value, checksum(b"meta", (key, value))) for key, value in (
                                ("dim", str(dim)), ("version", "0"), ("next_id", "0"), ("scope_names", "[]"))])
                    if self.row_level_security:
                        self._enable_row_level_security()
                    created = True
        register_vector(conn)
        if created:
            self.dim = dim
            return None
        if self._schema_version() < SCHEMA_VERSION:
            self._migrate()
        with self._refusing("its meta table cannot be read"):
            stored = int(self._meta("dim"))
        if stored != dim:
            raise ValueError(f"table {self.table!r} holds memories of dim={stored}, not dim={dim}")
        if self.row_level_security and not self._has_row_level_security():
            with conn.transaction():
                self._enable_row_level_security()
        self.dim = dim
        return self._snapshot(audit_last)

    def _schema_version(self) -> int:
        """The stored schema version; none or an unknown one is refused (StoreCorrupted), a newer one too."""
        rows = self._conn.execute(self._q("SELECT version FROM {version}")).fetchall()
        if not rows:
            raise StoreCorrupted(self._where, "it has no schema version: not a gae store")
        if len(rows) != 1 or rows[0][0] < 1:
            raise StoreCorrupted(self._where, f"unknown schema version {[r[0] for r in rows]!r} (this gae writes "
                                              f"1 to {SCHEMA_VERSION})")
        if rows[0][0] > SCHEMA_VERSION:
            raise NewerSchema(f"table {self.table!r} has schema version {rows[0][0]}, newer than this gae "
                             f"({SCHEMA_VERSION}); upgrade gae to open it")
        return int(rows[0][0])

    def _migrate(self) -> None:
        """Bring an older schema up to :data:`SCHEMA_VERSION`, holding the write lock. 1 -> 2: a
        checksum on every row, audit record and meta value, of the data as it is
        (:func:`~gae.storage.postgres_integrity.add_checksums`)."""
        with self.exclusive(), self._refusing("cannot add checksums to it"):
            if self._schema_version() >= SCHEMA_VERSION:  # another process migrated it while this one waited
                return
            integrity.add_checksums(self._conn, self._q)
            self._conn.execute(self._q("UPDATE {version} SET version = %s"), (SCHEMA_VERSION,))

    @contextmanager
    def _refusing(self, what: str, statements: bool = False) -> Iterator[None]:
        """Raise what reading damaged data raises (the server's data_corrupted and index_corrupted,
        and without ``statements`` undecodable values) as :class:`StoreCorrupted` saying ``what``
        failed, and a privilege the role lacks as PermissionError."""
        import psycopg

        try:
            yield
        except (StoreCorrupted, NewerSchema):
            raise
        except psycopg.Error as error:
            if error.sqlstate == "42501":  # insufficient_privilege
                raise PermissionError(errno.EACCES, f"{self._where}: this role may not do it ({what}): "
                                                    f"{error}") from error
            if error.sqlstate not in integrity.CORRUPTED:
                raise
            raise StoreCorrupted(self._where, f"{what}: {error}") from error
        except (ValueError, KeyError, IndexError, TypeError) as error:  # json's errors are ValueErrors
            if statements:
                raise
            raise StoreCorrupted(self._where, f"{what}: {type(error).__name__}: {error}") from error

    def check(self, *, raises: bool = True) -> StoreCheck:
        """Verify the whole store (see :meth:`MemoryStore.check`): every row's, audit record's and
        meta value's checksum, read in one consistent read-only view (writers go on), with the
        server verifying each page's checksum as it reads it when it runs with data_checksums; and
        amcheck's ``bt_index_check`` of every btree index where the extension is installed.
        :attr:`StoreCheck.skipped` says what could not be checked. Under row-level security only
        the rows this connection may see are checked."""
        check_flag("raises", raises)
        if self.closed:
            raise RuntimeError(f"{self._where}: the store is closed; open a new PostgresStore to check it")
        began = _time.perf_counter()
        with self._lock:
            stored = self._exists()
            catalog = self._columns(self._physical(CATALOG.name)) is not None
            if not stored and not catalog:
                raise ValueError(f"{self._where} holds no store: nothing to check")
            rows = audit = 0
            checks: list[str] = []
            skipped: list[str] = []
            problems: list[str] = []
            if stored:
                version = self._schema_version()
                if version < SCHEMA_VERSION:
                    skipped.append(f"checksums: schema version {version} has none (open(dim) adds them)")
                else:
                    register_vector(self._conn)
                    others = [self._physical(name) for name in self._catalogued()]
                    rows, audit, checks, skipped, problems = integrity.verify(self._conn, self._q, self.table, others)
            tables: dict[str, int] = {}
            try:
                with self._refusing("the server cannot read it"), self.reading():
                    tables = self._check_tables(checks, skipped, problems)
            except StoreCorrupted as error:
                problems += error.problems
        report = StoreCheck(self._where, rows, audit, tuple(checks), tuple(skipped), tuple(problems),
                            _time.perf_counter() - began, tables)
        if report.problems and raises:
            raise StoreCorrupted(self._where, report.problems)
        return report

    def _has_row_level_security(self) -> bool:
        found = self._conn.execute("SELECT relrowsecurity AND relforcerowsecurity FROM pg_class "
                                   "WHERE oid = %s::regclass", (self.table,)).fetchone()
        return found == (True,)

    def _enable_row_level_security(self) -> None:
        for statement in filter(str.strip, schema.RLS.split(";")):
            self._conn.execute(self._q(statement))

    def set_scopes(self, scopes: Sequence[Any] | np.ndarray | None) -> None:
        """Restrict this connection to the rows of ``scopes`` (names or ints >= 0: a list, or a 1-D
        integer tensor or numpy array), or lift the restriction (None). Needs
        ``row_level_security=True``: the table's policy enforces it."""
        if not self.row_level_security:
            raise ValueError("set_scopes needs a store opened with row_level_security=True")
        setting = "" if scopes is None else json.dumps(scope_keys(scopes, "scopes"))
        self._conn.execute("SELECT set_config('gae.scopes', %s, false)", (setting,))

    def stored_version(self) -> int:
        with self._refusing("its meta table cannot be read"):
            return int(self._meta("version"))

    def _meta(self, key: str) -> str:
        row = self._conn.execute(self._q("SELECT value FROM {meta} WHERE key = %s"), (key,)).fetchone()
        if row is None:
            raise StoreCorrupted(self._where, f"its meta table has no {key!r}")
        return str(row[0])

    def _snapshot(self, audit_last: int | None = None) -> Snapshot:
        assert self.dim is not None
        with self.reading():  # one consistent view of rows, audit and counters
            records = self._conn.execute(self._q(f"SELECT {SNAPSHOT_COLUMNS} FROM {{t}} WHERE deleted_at IS NULL "
                                                 "ORDER BY seq"), binary=True).fetchall()
            audit = self.audit(audit_last)
            with self._refusing("its meta table cannot be read"):
                meta = {}
                for key, value, stored in self._conn.execute(self._q("SELECT key, value, checksum FROM {meta}")):
                    if stored is None or checksum(b"meta", (key, value)) != stored:
                        raise StoreCorrupted(self._where, f"meta value {key!r} does not match its checksum")
                    meta[key] = value
        with self._refusing("its rows cannot be read"):
            live = rows_from_records(records, self.dim)
            return Snapshot(self.dim, live, audit, int(meta["version"]), int(meta["next_id"]),
                            json.loads(meta["scope_names"]))

    # -- writing -----------------------------------------------------------------------------
    def _take_lock(self, cur: psycopg.Cursor[Any], lock: str | None = None) -> None:
        """Take the table's write lock, or ``lock``'s of the table (an advisory transaction lock),
        waiting up to ``timeout``: one round trip (a simple query of literals)."""
        from psycopg import errors

        name = f"gae.store.{self.table}" if lock is None else f"gae.store.{self.table}.{lock}"
        # read committed whatever the server's default: each statement after the lock sees the previous writer's
        # commit; the timeout bounds the wait for the writer lock only
        statement = self._sql.SQL(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {}; "
            "SELECT pg_advisory_xact_lock(hashtext({})); SET LOCAL lock_timeout = 0").format(
            self._sql.Literal(f"{int(self.timeout * 1000)}ms"), self._sql.Literal(name))
        try:
            cur.execute(statement)
        except errors.LockNotAvailable as error:
            what = f"table {self.table!r}" if lock is None else f"table {self.table!r}, {lock}"
            raise TimeoutError(f"{what}: another writer held the write lock for more than "
                               f"{self.timeout:g} s; nothing of this call was written") from error

    @contextmanager
    def _hold(self, lock: str | None = None) -> Iterator[None]:
        """A transaction with the table's advisory lock (``lock``'s, when named), committed when the block ends."""
        with self._conn.transaction(), self._conn.cursor() as cur:
            self._take_lock(cur, lock)
            yield

    @contextmanager
    def _read_view(self) -> Iterator[None]:
        """A ``REPEATABLE READ, READ ONLY`` transaction: one snapshot while others write."""
        with self._conn.transaction():
            self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    def _erase_now(self) -> None:
        self.purge()  # VACUUM cannot run inside a transaction: after the hold, as the base class calls it

    def _commit(self, change: Change) -> None:
        from psycopg.types.json import Jsonb

        conn = self._conn
        with conn.transaction(), conn.cursor() as cur:  # inside the hold: a savepoint
            stored = int(self._meta("version"))
            if change.base_version is not None and stored != change.base_version:
                raise StoreConflict(f"table {self.table!r} is at version {stored}, not {change.base_version}: "
                                    "another writer committed first")
            if change.added is not None and len(change.added):
                self._insert(cur, change.added)
            for action, time, seqs in change.removed:
                integrity.tombstone(cur, self._q, action, time, seqs)
            if change.audit:
                audit = [(str(e.action), float(e.time) + 0.0, [int(i) for i in e.ids], str(e.reason), int(e.version),
                          self.actor) for e in change.audit]
                cur.executemany(self._q(f"INSERT INTO {{audit}} ({integrity.AUDIT}, checksum) "
                                        "VALUES (%s, %s, %s, %s, %s, %s, %s)"),
                                [(a, t, Jsonb(ids), r, v, actor,
                                  checksum(b"audit", (a, t, dumps_ids(ids), r, v, actor)))
                                 for a, t, ids, r, v, actor in audit])
            cur.executemany(self._q("UPDATE {meta} SET value = %s, checksum = %s WHERE key = %s"), [
                (value, checksum(b"meta", (key, value)), key) for key, value in (
                    ("version", str(change.version)), ("next_id", str(change.next_id)),
                    ("scope_names", json.dumps(change.scope_names)))])

    @property
    def erases(self) -> bool:  # type: ignore[override]
        """True when :meth:`purge` can promise erasure on this server (:meth:`erasure_problems`)."""
        return not self.erasure_problems()

    def erasure_problems(self) -> list[str]:
        """Why :meth:`purge` could not promise that deleted data leaves the server's files
        (:func:`~gae.storage.postgres_erase.erasure_problems`); empty when it can."""
        return postgres_erase.erasure_problems(self._conn)

    def purge(self) -> None:
        """Make everything deleted so far unreadable from the server's files
        (:func:`~gae.storage.postgres_erase.purge`: ``VACUUM FULL`` of the table, then the
        WAL switched and checkpointed twice); RuntimeError naming what stands in the way first."""
        with self._lock:
            problems = self.erasure_problems() + postgres_erase.snapshot_problems(self._conn)
            if problems:
                raise RuntimeError(f"table {self.table!r}: purge cannot promise erasure now (any delete is committed; "
                                   "purge() once this is fixed erases it): " + "; ".join(problems))
            postgres_erase.purge(self._conn, [self._q("VACUUM FULL {t}")])

    def _insert(self, cur: psycopg.Cursor[Any], rows: Rows) -> None:
        """INSERT in one pipelined batch (COPY would be faster, but Postgres refuses it under
        row-level security, and the HNSW index's upkeep dominates either way)."""
        from psycopg.types.json import Jsonb

        (scopes, contents, sensitivities, memory_types, embedding, confidence, valid_from, valid_until, importance,
         created_at) = written_columns(rows)
        records = []
        for i, seq in enumerate(rows.seq.tolist()):
            sources = [int(s) for s in rows.source_ids[i]]
            values = (seq, scopes[i][0], scopes[i][1], memory_types[i], contents[i], embedding[i], confidence[i],
                      sensitivities[i], sources, valid_from[i], valid_until[i], importance[i], created_at[i])
            sums = row_checksum((*values[:5], embedding[i].tobytes(), *values[6:8], dumps_ids(sources), *values[9:],
                                 None, None))  # CHECKED's order, as check() reads it back
            records.append((*values[:5], Vector(embedding[i]), *values[6:8], Jsonb(sources), *values[9:], sums))
        cur.executemany(self._q(f"INSERT INTO {{t}} ({', '.join(schema.COLUMNS)}, checksum) "
                                f"VALUES ({', '.join(['%s'] * 14)})"), records)

    # -- reading -------------------------------------------------------------------------------
    def audit(self, last: int | None = None) -> list[AuditEntry]:
        limit = None if last is None else check_int("last", last, low=0)  # Postgres: LIMIT NULL, no limit
        with self._refusing("its audit table cannot be read"):
            return [AuditEntry(a, t, tuple(i), r, v, actor) for a, t, i, r, v, actor, _ in self._conn.execute(
                self._q("SELECT * FROM (SELECT action, time, ids, reason, version, actor, n FROM {audit} "
                        "ORDER BY n DESC LIMIT %s) AS newest ORDER BY n"), (limit,))]

    def _ranking(self, pooled: bool, scoped: bool, texted: bool) -> sql.Composed:
        """One query's ranking statement (:func:`~gae.storage.postgres_ranking.compose`), composed once."""
        if (key := (pooled, scoped, texted)) not in self._statements:
            self._statements[key] = ranking.compose(self._q, *key)
        return self._statements[key]

    def retrieve(self, queries: Any, now: float, k: int = 5, scopes: Any = None, *,
                 weights: tuple[float, float, float] = (0.60, 0.25, 0.15), tau: float = 15.0,
                 text: str | Sequence[str] | None = None, w_text: float = 0.0,
                 exact: bool = False) -> StoreRetrieval:
        """Rank in the server (see :meth:`MemoryStore.retrieve`); the similarity is the dot product
        of the stored embedding with the unit query, as in SQLiteStore.

        ``exact=True`` scores every row that passes the filters. ``exact=False`` (default) scores a
        candidate pool (:mod:`~gae.storage.postgres_ranking`) and falls back to the exact ranking
        for a query whose pool cannot be shown to hold its top ``k`` (and always with a negative
        weight), so that it differs from the exact ranking only where the HNSW index misses a neighbour.
        """
        if self.dim is None:
            raise RuntimeError("open(dim) the store before retrieving from it")
        if not isinstance(exact, bool):
            raise ValueError(f"exact must be a bool, got {exact!r}")
        unit = check_query(queries, self.dim, now, k)
        n_queries = unit.shape[0]
        allowed = scope_filters(scopes, n_queries)
        texts = check_weights(weights, tau, w_text, text, n_queries)
        candidates = max(self.candidates or max(100, 10 * k), k)
        pooled = not exact and min(weights) >= 0 and w_text >= 0
        result = padded(n_queries, k)
        conn = self._conn
        with self.reading():  # every query of the batch sees the same rows
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)",
                         (str(self.ef_search or min(candidates, 1000)),))
            for q, (scopes_q, text_q) in enumerate(zip(allowed, texts, strict=True)):
                if scopes_q is not None and not scopes_q:
                    continue
                params = ranking.parameters(unit[q], now, k, scopes_q, text_q, weights=weights, tau=tau,
                                            w_text=w_text, candidates=candidates)
                shape = (scopes_q is not None, params["tsq"] is not None)
                found = conn.execute(self._ranking(pooled, *shape), params).fetchall()
                bound = found[0][-1] if found else None
                if bound is not None and not found[-1][1] >= bound + 1e-6:  # the pool may miss a row
                    self.exact_fallbacks += 1
                    found = conn.execute(self._ranking(False, *shape), params).fetchall()
                for j, row in enumerate(found):
                    for column, value in zip(result, row[:6], strict=True):  # ids, scores, ..., text
                        column[q, j] = value
        return result

    def close(self) -> None:
        """Close the connection (the data stays)."""
        with self._lock:
            self.closed = True
            self._close_writer()
            self._conn.close()

    def _reopen(self) -> PostgresStore:
        return PostgresStore(self._dsn, table=self.table, actor=self.actor, row_level_security=self.row_level_security,
                             ef_search=self.ef_search, candidates=self.candidates, timeout=self.timeout)

    # -- the table API's statements (gae.storage.store.Store) --------------------------------------------------
    def data_version(self) -> int | None:
        return None  # Postgres keeps no such counter: every reader reads the head again

    def _erase(self, tables: Sequence[Table]) -> None:
        """``VACUUM FULL`` of the tables, then the WAL switched and checkpointed twice
        (:func:`~gae.storage.postgres_erase.purge`); a server that cannot promise it says why."""
        problems = self.erasure_problems() + postgres_erase.snapshot_problems(self._conn)
        names = ", ".join(self._physical(t.name) for t in tables)
        if problems:
            raise RuntimeError(f"{self._where}: the deleted rows of {names} are committed, but this server cannot "
                               "erase them from its files: " + "; ".join(problems))
        postgres_erase.purge(self._conn, [self._sql.SQL("VACUUM FULL {}").format(
            self._sql.Identifier(self._physical(t.name))) for t in tables])

    def _guard(self, what: str) -> AbstractContextManager[None]:
        return self._refusing(what, statements=True)

    def _physical(self, name: str) -> str:
        return f"{self.table}_{name}"

    def _catalogued(self) -> list[str]:
        """The names of the checksummed tables the catalog lists (none without a catalog)."""
        if self._columns(self._physical(CATALOG.name)) is None:
            return []
        return [name for (name,) in self._conn.execute(f"SELECT name FROM {self._physical(CATALOG.name)}")]

    def _columns(self, physical: str) -> list[str] | None:
        found = [name for (name,) in self._conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", (physical,))]
        return found or None

    @staticmethod
    def _statement(statement: str) -> str:
        return statement.replace("%", "%%").replace("?", "%s")

    @staticmethod
    def _bytes(row: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)

    def _run(self, statement: str, params: Sequence[Any] = ()) -> int:
        return self._conn.execute(self._statement(statement), tuple(params)).rowcount

    def _rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [self._bytes(row) for row in self._conn.execute(self._statement(statement), tuple(params)).fetchall()]

    def _many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(self._statement(statement), rows)

    def _stream(self, statement: str) -> Iterator[tuple[Any, ...]]:
        with self._conn.cursor("gae_check_table") as cur:  # streamed from the server
            cur.itersize = integrity.BATCH
            cur.execute(self._statement(statement), ())
            for row in cur:
                yield self._bytes(row)

    def _batches(self, physical: str, names: Sequence[str]) -> Iterator[list[tuple[Any, ...]]]:
        # a cursor's rows are those of its snapshot: the updates between batches do not show in it
        with self._conn.cursor("gae_adopt_table") as cur:
            cur.execute(self._statement(f"SELECT ctid::text, {', '.join(names)} FROM {physical}"), ())
            while batch := cur.fetchmany(integrity.BATCH):
                yield [self._bytes(row) for row in batch]

    def _integrity_problems(self) -> list[str]:
        return []  # Postgres has no check of a table's rows (amcheck checks indexes; check() runs it)
