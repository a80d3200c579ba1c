"""The one home of a store's connection: transactions, locks, checksummed tables and erasure.

:class:`Store` is what :class:`~gae.storage.SQLiteStore` and :class:`~gae.storage.PostgresStore`
are before they are episodic memory stores: every statement any part of gae runs goes through
one of them. Its parts:

- **Writing.** :meth:`Store.exclusive` holds the write lock in one transaction: threads sharing
  the store object take turns (a re-entrant lock of the object), processes too (SQLite: an
  exclusive ``flock`` queue on ``<path>.ledger-lock``, then ``BEGIN IMMEDIATE``; Postgres: an
  advisory transaction lock). Its writes land together when the block ends, or none of them.
- **Reading.** :meth:`Store.reading` is one consistent view of the committed rows (a read
  transaction: writers go on), or the enclosing write block's.
- **Tables.** :meth:`Store.create_tables`, :meth:`Store.insert`, :meth:`Store.select`,
  :meth:`Store.delete` and :meth:`Store.count` on :class:`~gae.storage.tables.Table` specs:
  every row carries a checksum (:mod:`gae.storage.tables`) that :meth:`Store.select` verifies,
  and the store's catalog lists every such table, so ``check()`` verifies all of them.
- **Watching.** :meth:`Store.data_version` moves when another connection commits;
  :attr:`Store.commits` counts what the objects sharing this store object committed.
- **Erasing.** :meth:`Store.erase` makes deleted rows unreadable from the store's files.

Damage is refused as :class:`~gae.storage.StoreCorrupted` naming the store (:attr:`Store.where`),
the table and the row; a permission problem raises PermissionError naming the path.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from gae.storage.errors import StoreCorrupted
from gae.storage.tables import CATALOG, Table, describe, normalised, row_checksum, spec_of, spec_text

SHOWN = 20  # problems of one kind listed; the rest are counted
READY, MISSING, LEGACY, REINDEX = "ready", "missing", "legacy", "reindex"  # what _examine finds of a table


class Store(abc.ABC):
    """A database connection and everything done on it (see the module). Subclasses implement
    the dialect: the write hold, the read view, the statements and erasure.

    Thread safety: every method may be called from any thread; blocks of different threads on
    one store object take turns (the object's re-entrant lock), since they share its connection.
    """

    closed: bool = False  # close() was called

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the connection serves one thread's block at a time
        self._held = False  # inside exclusive(): the write lock is this connection's
        self._viewing = False  # inside reading()'s own read transaction
        self._rollback_hooks: list[Callable[[], None]] | None = None  # inside exclusive(): called if it rolls back
        self._erase_after = False  # an erasing change committed in the current hold: complete it when the hold ends
        self._erase_tables: dict[str, Table] = {}  # tables erase() was asked for inside the current hold
        self._ready: dict[str, Table] = {}  # the tables verified (or created) on this connection
        self._commits = 0
        self._writer: Store | None = None  # writer(): a second connection, closed with this one

    # -- naming ---------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def where(self) -> str:
        """What :class:`~gae.storage.StoreCorrupted` names: the SQLite file, or the Postgres table."""

    # -- writing and reading ---------------------------------------------------------------------
    @contextmanager
    def exclusive(self, lock: str | None = None) -> Iterator[None]:
        """A block that holds the store's write lock (:meth:`_hold`): its reads see the latest
        committed state, no other writer commits until it ends, and its writes land when it
        ends, or none of them if it raises (then the hooks of :meth:`on_rollback` run). Waits up
        to the store's ``timeout`` for another process' lock, then raises TimeoutError.
        Re-entrant; other threads of this store object wait for the block to end. An erasure
        asked for inside it (:meth:`erase`, an erasing commit) completes after it.

        ``lock`` names a lock of its own where the database can hold several (Postgres: an
        advisory lock per name, so the writers of one ledger never wait for another's); SQLite
        has one writer per file whatever the name. A block nested in another holds the outer's."""
        with self._lock:
            if self._held:
                yield
                return
            if self._viewing:
                raise RuntimeError(f"{self.where}: a write block cannot start inside a read block (reading()) "
                                   "of the same store: end the read first, or write from the start")
            self._check_open()
            self._rollback_hooks = []
            try:
                with self._hold(lock):
                    self._held = True
                    try:
                        yield
                    finally:
                        self._held = False
            except BaseException:  # the block raised, or its commit failed: nothing of it landed
                self._erase_after = False
                self._erase_tables.clear()
                self._ready.clear()  # (a table created in the block is gone with it: verify them all again)
                self._rolled_back()
                raise
            finally:
                self._rollback_hooks = None
            tables, self._erase_tables = list(self._erase_tables.values()), {}
            if self._erase_after:
                self._erase_after = False
                self._erase_now()
            if tables:
                self._erase(tables)

    def writer(self) -> Store:
        """A second connection to this store's database with its settings, made on first use and
        closed with this store: for a write path that must not wait while this connection reads
        (a ledger's group commit appends there while the Deciders read here). Its writes take the
        same write locks as this store's. A database only this connection can reach (SQLite's
        ``:memory:``) is its own writer."""
        with self._lock:
            self._check_open()
            if self._writer is None:
                self._writer = self._reopen()
            return self._writer

    def _close_writer(self) -> None:
        """Inside ``close()``: close :meth:`writer`'s connection, if one was made."""
        writer, self._writer = self._writer, None
        if writer is not None and writer is not self:
            writer.close()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One consistent view of the committed rows for the block's reads: a read transaction
        (SQLite in WAL mode, Postgres ``REPEATABLE READ, READ ONLY``), so writers go on and never
        wait for it; inside :meth:`exclusive`, that block's view. A write block cannot start
        inside it. Re-entrant; other threads of this store object wait for the block to end."""
        with self._lock:
            if self._held or self._viewing:
                yield
                return
            self._check_open()
            self._viewing = True
            try:
                with self._read_view():
                    yield
            finally:
                self._viewing = False

    @contextmanager
    def _lone_read(self) -> Iterator[None]:
        """One read statement: inside a block, the block's view; alone, the statement's own
        snapshot (both databases run a statement outside a transaction as one), with no read
        transaction around it (on Postgres, three round trips fewer)."""
        with self._lock:
            if not (self._held or self._viewing):
                self._check_open()
            yield

    def on_rollback(self, hook: Callable[[], None]) -> None:
        """Inside :meth:`exclusive`: call ``hook`` if the block's transaction does not land (a
        memory marks its index stale). Outside it, a commit is final: nothing to do."""
        if self._rollback_hooks is not None:
            self._rollback_hooks.append(hook)

    def _rolled_back(self) -> None:
        """Run and forget the hooks of a hold that did not land."""
        hooks, self._rollback_hooks = self._rollback_hooks or [], None
        for hook in hooks:
            hook()

    @property
    def commits(self) -> int:
        """Commits counted with :meth:`count_commit` through this store object: objects sharing
        it (several ledgers on one store) tell by it that another of them wrote, which
        :meth:`data_version` (other connections only) does not show."""
        return self._commits

    def count_commit(self) -> None:
        """Inside :meth:`exclusive`: count the block's commit in :attr:`commits` (a block that then
        rolls back leaves it counted: a reader only reads once more)."""
        with self._lock:
            self._commits += 1

    @abc.abstractmethod
    def data_version(self) -> int | None:
        """A number that moves whenever another connection commits (SQLite's ``PRAGMA
        data_version``: inside a read or write block, as of that block's view), or None where the
        store cannot tell (Postgres): then assume something moved. This connection's own
        commits do not move it (see :attr:`commits`)."""

    def erase(self, tables: Sequence[Table]) -> None:
        """After the commit that deleted rows of ``tables``: make them unreadable from the
        store's files (SQLite: freed pages are zeroed as they are freed, and a truncating WAL
        checkpoint removes the old page images; Postgres: ``VACUUM FULL`` of the tables, then the
        WAL switched and checkpointed twice, or RuntimeError saying what on the server prevents
        it). Inside :meth:`exclusive` it runs when the block has committed. SQLite raises
        TimeoutError when a reader still uses the WAL after the store's ``erase_timeout``."""
        tables = [self._check_table(t) for t in tables]
        with self._lock:
            if self._held:
                self._erase_tables.update((t.name, t) for t in tables)
                return
            self._check_open()
            self._erase(tables)

    # -- tables -----------------------------------------------------------------------------------
    def create_tables(self, tables: Iterable[Table]) -> None:
        """Create the checksummed ``tables`` this store lacks (with their indexes, listed in its
        catalog), in one write transaction, and verify the others: a table the catalog lists as
        the spec says, with the columns it says. A table of an older gae (these columns, no
        checksum, not in the catalog) is adopted: after the database's own integrity check
        passes, it gains a checksum on every row. Raises StoreCorrupted for a table that does not
        match what the catalog records, and ValueError for a table created with other columns
        (by another version of the caller). Table calls create their table on first use: call
        this to create several in one transaction, before a read block that uses them."""
        tables = [self._check_table(t) for t in tables]
        todo = [t for t in tables if self._ready.get(t.name) != t]
        if not todo:
            return
        with self.reading():
            found = {t.name: self._examine(t) for t in todo}
        needed = [t for t in todo if found[t.name] != READY]
        if needed:
            self._create(needed)
        for table in todo:
            self._ready[table.name] = table

    def insert(self, table: Table, rows: Iterable[Sequence[Any]], upsert: bool = False) -> None:
        """Write ``rows`` (each a sequence of the table's column values, in order) with their
        checksums, in one write transaction (the caller's :meth:`exclusive` block, if any).
        ``upsert``: a row whose key is already stored replaces it. Every row is validated first
        (:func:`~gae.storage.tables.normalised`): a bad value raises and writes nothing."""
        self._check_table(table)
        if not isinstance(upsert, bool):
            raise ValueError(f"upsert must be a bool, got {upsert!r}")
        if upsert and not table.key:
            raise ValueError(f"upsert needs a key: table {table.name!r} has none")
        values = [normalised(table, row) for row in rows]
        if not values:
            return
        names = ", ".join((*table.names, "checksum"))
        marks = ", ".join("?" * (len(table.names) + 1))
        statement = f"INSERT INTO {self._physical(table.name)} ({names}) VALUES ({marks})"
        if upsert:
            updated = [name for name in (*table.names, "checksum") if name not in table.key]
            statement += (f" ON CONFLICT ({', '.join(table.key)}) DO UPDATE SET "
                          + ", ".join(f"{name} = excluded.{name}" for name in updated))
        with self.exclusive():
            self._ensure(table, write=True)
            with self._guard(f"table {table.name} cannot be written"):
                self._many(statement, [(*row, row_checksum(table.name, row)) for row in values])

    def select(self, table: Table, where: str = "", params: Sequence[Any] = (), order: str = "",
               limit: int | None = None) -> list[Any]:
        """The rows of ``table`` that match ``where`` (a SQL condition over its columns with ``?``
        placeholders for ``params``; empty: every row), sorted by ``order`` (SQL, such as ``'seq
        DESC'``), at most ``limit`` of them, as ``table.Row`` NamedTuples. Each row's checksum is
        verified: a row that does not match it raises StoreCorrupted naming the store, the table
        and the row. A table never created reads as empty. ``where`` and ``order`` are code,
        never data: values go in ``params``."""
        self._check_table(table)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
        statement = f"SELECT {', '.join(table.names)}, checksum FROM {self._physical(table.name)}"
        statement += f" WHERE {where}" if where else ""
        statement += f" ORDER BY {order}" if order else ""
        statement += " LIMIT ?" if limit is not None else ""
        arguments = (*params, limit) if limit is not None else tuple(params)
        if not self._ensure(table, write=False):
            return []
        with self._lone_read(), self._guard(f"table {table.name} cannot be read"):
            records = self._rows(statement, arguments)
        return [self._verified(table, record) for record in records]

    def count(self, table: Table, where: str = "", params: Sequence[Any] = ()) -> int:
        """How many rows of ``table`` match ``where`` (see :meth:`select`), counted by the
        database: no checksum is read (``check()`` verifies them all)."""
        self._check_table(table)
        statement = f"SELECT COUNT(*) FROM {self._physical(table.name)}" + (f" WHERE {where}" if where else "")
        if not self._ensure(table, write=False):
            return 0
        with self._lone_read(), self._guard(f"table {table.name} cannot be read"):
            return int(self._rows(statement, tuple(params))[0][0])

    def largest(self, table: Table, column: str, where: str = "", params: Sequence[Any] = ()) -> Any:
        """The largest value of ``column`` over the rows of ``table`` that match ``where`` (see
        :meth:`select`), found by the database (None: no row, or none with a value); as
        :meth:`count`, no checksum is read."""
        self._check_table(table)
        if column not in table.names:
            raise ValueError(f"table {table.name} has no column {column!r}; its columns: {list(table.names)}")
        statement = f"SELECT MAX({column}) FROM {self._physical(table.name)}" + (f" WHERE {where}" if where else "")
        if not self._ensure(table, write=False):
            return None
        with self._lone_read(), self._guard(f"table {table.name} cannot be read"):
            return self._rows(statement, tuple(params))[0][0]

    def delete(self, table: Table, where: str = "", params: Sequence[Any] = ()) -> int:
        """Delete the rows of ``table`` that match ``where`` (see :meth:`select`; empty: all), in
        one write transaction (the caller's, if any). Returns how many. The deleted data stays
        in the files until :meth:`erase`."""
        self._check_table(table)
        statement = f"DELETE FROM {self._physical(table.name)}" + (f" WHERE {where}" if where else "")
        with self.exclusive():
            if not self._ensure(table, write=False):
                return 0
            with self._guard(f"table {table.name} cannot be written"):
                return self._run(statement, tuple(params))

    # -- the catalog ----------------------------------------------------------------------------------
    def _check_table(self, table: Any) -> Table:
        if not isinstance(table, Table):
            raise TypeError(f"table must be a gae.storage.Table, got {type(table).__name__}")
        if table.name == CATALOG.name:
            raise ValueError(f"table {CATALOG.name!r} is the store's own catalog")
        return table

    def _ensure(self, table: Table, write: bool) -> bool:
        """True when ``table`` is ready for statements (verified once per store object, created
        when ``write``, adopted when an older gae wrote it); False when it does not exist and
        ``write`` is not asked."""
        if self._ready.get(table.name) == table:
            return True
        with self.reading():
            found = self._examine(table)
        if found == MISSING and not write:
            return False
        if found != READY:
            self._create([table])
        self._ready[table.name] = table
        return True

    def _catalog(self) -> dict[str, str] | None:
        """The catalog's verified rows (name -> spec text), or None when the store has no catalog."""
        columns = self._columns(self._physical(CATALOG.name))
        if columns is None:
            return None
        if columns != [*CATALOG.names, "checksum"]:
            raise StoreCorrupted(self.where, f"its table catalog has the columns {columns}, not "
                                             f"{[*CATALOG.names, 'checksum']}")
        with self._guard("its table catalog cannot be read"):
            records = self._rows(f"SELECT name, spec, checksum FROM {self._physical(CATALOG.name)}")
        return {row.name: row.spec for row in (self._verified(CATALOG, record) for record in records)}

    def _examine(self, table: Table) -> str:
        """Inside a block: READY (catalogued as ``table`` says, with its columns), MISSING (no such
        table), LEGACY (an older gae's table: these columns, no checksum, not catalogued) or
        REINDEX (catalogued with other indexes). Raises StoreCorrupted for what no gae leaves
        behind, ValueError for a table created with other columns."""
        with self._guard(f"table {table.name} cannot be read"):
            catalog = self._catalog() or {}
            columns = self._columns(self._physical(table.name))
        expected = list(table.names)
        if table.name in catalog:
            try:
                stored = spec_of(table.name, catalog[table.name])
            except (ValueError, TypeError, KeyError) as error:
                raise StoreCorrupted(self.where, f"its catalog's record of table {table.name} cannot be read: "
                                                 f"{error}") from error
            if (stored.columns, stored.key) != (table.columns, table.key):
                raise ValueError(f"{self.where}: table {table.name} was created with the columns "
                                 f"{list(stored.columns)} and key {list(stored.key)}, not {list(table.columns)} and "
                                 f"{list(table.key)}: another version of gae wrote it")
            if columns is None:
                raise StoreCorrupted(self.where, f"its catalog lists table {table.name}, but it has no such table")
            if columns != [*expected, "checksum"]:
                raise StoreCorrupted(self.where, f"table {table.name} has the columns {columns}, but its catalog "
                                                 f"records {[*expected, 'checksum']}")
            return READY if stored.indexes == table.indexes else REINDEX
        if columns is None:
            return MISSING
        if columns == expected:
            return LEGACY
        if "checksum" in columns:
            raise StoreCorrupted(self.where, f"table {table.name} has checksums, but its catalog does not list it")
        raise StoreCorrupted(self.where, f"it holds a table {table.name} with the columns {columns}, not the "
                                         f"{expected} gae writes there")

    def _create(self, tables: Sequence[Table]) -> None:
        """Holding the write lock: create, adopt or re-index each of ``tables`` (examined again:
        another writer may have done it meanwhile)."""
        with self._lock:  # (a read block of this thread excludes the write lock: say why)
            if self._viewing:
                raise RuntimeError(f"{self.where}: tables {[t.name for t in tables]} must be created (or gain "
                                   "their checksums) before a read block uses them: call create_tables() first")
        with self.exclusive():
            checked = False
            for table in tables:
                found = self._examine(table)
                if found == READY:
                    continue
                with self._guard(f"table {table.name} cannot be created"):
                    if self._columns(self._physical(CATALOG.name)) is None:
                        self._run(self._create_statement(CATALOG))
                    if found == MISSING:
                        self._run(self._create_statement(table))
                    elif found == LEGACY:
                        if not checked:  # the checksums vouch for the rows as they are: they must be sound first
                            problems = self._integrity_problems()
                            if problems:
                                raise StoreCorrupted(self.where, [f"before adding checksums to table {table.name}: "
                                                                  f"{p}" for p in problems])
                            checked = True
                        self._adopt(table)
                    for suffix, on in table.indexes:
                        self._run(f"CREATE INDEX IF NOT EXISTS {self._physical(table.name)}_{suffix} ON "
                                  f"{self._physical(table.name)} ({', '.join(on)})")
                    row = (table.name, spec_text(table))
                    self._many(f"INSERT INTO {self._physical(CATALOG.name)} (name, spec, checksum) VALUES (?, ?, ?) "
                               "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, checksum = excluded.checksum",
                               [(*row, row_checksum(CATALOG.name, row))])

    def _create_statement(self, table: Table) -> str:
        columns = [f"{c.name} {self._types[c.type]}{'' if c.nullable else ' NOT NULL'}" for c in table.columns]
        columns.append(f"checksum {self._types['int']}")
        if table.key:
            columns.append(f"PRIMARY KEY ({', '.join(table.key)})")
        return f"CREATE TABLE {self._physical(table.name)} ({', '.join(columns)})"

    def _adopt(self, table: Table) -> None:
        """An older gae's ``table``: a checksum column, filled from the rows as they are."""
        physical = self._physical(table.name)
        self._run(f"ALTER TABLE {physical} ADD COLUMN checksum {self._types['int']}")
        for batch in self._batches(physical, table.names):
            self._many(f"UPDATE {physical} SET checksum = ? WHERE {self._row_match}",
                       [(row_checksum(table.name, record[1:]), record[0]) for record in batch])

    def _verified(self, table: Table, record: Sequence[Any]) -> Any:
        """``record`` (the row's values, then its checksum) as ``table.Row``, or StoreCorrupted."""
        values, stored = record[:-1], record[-1]
        if stored is None or type(stored) is not int or row_checksum(table.name, values) != stored:
            wrong = "has no checksum" if stored is None else "does not match its checksum"
            raise StoreCorrupted(self.where, f"table {table.name}: row {describe(table, values)} {wrong}")
        return table.Row(*values)

    def _check_tables(self, checks: list[str], skipped: list[str], problems: list[str]) -> dict[str, int]:
        """Inside a read view: verify every row of every table the catalog lists (and that each
        has the catalog's columns). Returns the rows verified per table."""
        with self._guard("its table catalog cannot be read"):
            try:
                catalog = self._catalog()
            except StoreCorrupted as error:
                problems += error.problems
                return {}
        skipped += [f"table {name}: not in the catalog, so its rows carry no checksum (an older gae's table: "
                    "create_tables() adds them)" for name in sorted(self._unlisted(set(catalog or ())))]
        if catalog is None:
            return {}
        bad: list[str] = []
        counts: dict[str, int] = {}
        for name, text in sorted(catalog.items()):
            try:
                table = spec_of(name, text)
            except (ValueError, TypeError, KeyError) as error:
                bad.append(f"its catalog's record of table {name} cannot be read: {error}")
                continue
            physical = self._physical(name)
            with self._guard(f"table {name} cannot be read"):
                columns = self._columns(physical)
                if columns != [*table.names, "checksum"]:
                    bad.append(f"its catalog lists table {name}, but it has no such table" if columns is None else
                               f"table {name} has the columns {columns}, but its catalog records "
                               f"{[*table.names, 'checksum']}")
                    continue
                counts[name] = 0
                for record in self._stream(f"SELECT {', '.join(table.names)}, checksum FROM {physical}"):
                    counts[name] += 1
                    try:
                        self._verified(table, record)
                    except StoreCorrupted as error:
                        bad.extend(error.problems)
        problems += bad[:SHOWN] + ([f"{len(bad) - SHOWN} more rows of checksummed tables do not match their "
                                    "checksums"] if len(bad) > SHOWN else [])
        checks.append(f"checksums of every row of the {len(catalog)} tables in the catalog "
                      f"({', '.join(sorted(catalog))})")
        return counts

    def _unlisted(self, catalogued: set[str]) -> set[str]:
        """The tables of the store that neither its catalog nor the store itself accounts for."""
        return set()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"{self.where}: the store is closed; open a new store")

    # -- the dialect ------------------------------------------------------------------------------------
    _types: dict[str, str]  # the SQL type of each column type
    _row_match: str  # the condition that picks one stored row by the id _batches gives it

    @abc.abstractmethod
    def _hold(self, lock: str | None = None) -> AbstractContextManager[None]:
        """One transaction holding the write lock (``lock``'s, where the database keeps one per
        name; waiting up to the store's ``timeout``, then TimeoutError): committed when the block
        ends, rolled back if it raises."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection, and :meth:`writer`'s (the data stays)."""

    @abc.abstractmethod
    def _reopen(self) -> Store:
        """A new connection to the same database with the same settings (:meth:`writer`)."""

    @abc.abstractmethod
    def _read_view(self) -> AbstractContextManager[None]:
        """One read transaction, ended when the block ends."""

    @abc.abstractmethod
    def _erase_now(self) -> None:
        """After an erasing episodic commit, outside any transaction: what makes the deleted data
        unreadable from the store's files."""

    @abc.abstractmethod
    def _erase(self, tables: Sequence[Table]) -> None:
        """Outside any transaction: make the deleted rows of ``tables`` unreadable from the files."""

    @abc.abstractmethod
    def _guard(self, what: str) -> AbstractContextManager[None]:
        """Raise what the database raises on damage as StoreCorrupted saying ``what`` failed, and
        a permission problem as PermissionError; a lock and a caller's mistake stay what they are."""

    @abc.abstractmethod
    def _physical(self, name: str) -> str:
        """The database's name of table ``name``."""

    @abc.abstractmethod
    def _columns(self, physical: str) -> list[str] | None:
        """The columns of table ``physical`` in order, or None when there is no such table."""

    @abc.abstractmethod
    def _run(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (``?`` placeholders); returns the rows it changed."""

    @abc.abstractmethod
    def _rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row one statement returns (blobs as ``bytes``)."""

    @abc.abstractmethod
    def _many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters."""

    @abc.abstractmethod
    def _stream(self, statement: str) -> Iterator[tuple[Any, ...]]:
        """The rows of one statement, fetched in batches (blobs as ``bytes``)."""

    @abc.abstractmethod
    def _batches(self, physical: str, names: Sequence[str]) -> Iterator[list[tuple[Any, ...]]]:
        """Inside the write hold: every row of ``physical`` as ``(row id, *values of names)``, in
        batches, each batch fetched after the previous one was updated."""

    @abc.abstractmethod
    def _integrity_problems(self) -> list[str]:
        """What the database's own integrity check finds (SQLite's ``integrity_check``), empty
        when sound or when the database has none."""
