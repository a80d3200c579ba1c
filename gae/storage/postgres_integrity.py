"""Integrity on Postgres: the checksums of a PostgresStore's rows, audit records and meta values
(written with them, added to a store of schema 1, verified by ``check()``), and what the server
can check of its own files: amcheck's btree checks where the extension is installed, and the
page checksums of a server initialised with ``--data-checksums`` (verified as ``check()`` reads
every page of the table).

Each function takes the store's connection and its statement composer (``PostgresStore._q``,
which fills in ``{t}``, ``{meta}``, ``{audit}`` and ``{version}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gae.storage.integrity import (
    AUDIT_CHECKED,
    CHECKED,
    EMBEDDING,
    checksum,
    embedding_bytes,
    row_checksum,
    row_problem,
    tombstoned,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    Compose = Callable[..., sql.Composed]

ROW = ", ".join(CHECKED)
AUDIT = ", ".join(AUDIT_CHECKED)
SOURCES = CHECKED.index("source_ids")
CORRUPTED = ("XX001", "XX002")  # the server's data_corrupted and index_corrupted
SHOWN = 20  # problems of one kind listed; the rest are counted
BATCH = 1000


def canonical(record: Sequence[Any]) -> list[Any]:
    """A memories record read in binary (:data:`~gae.storage.integrity.CHECKED` order) as
    its checksum sees it: the embedding as little-endian float32 bytes, ``source_ids`` as JSON text."""
    values = list(record)
    values[EMBEDDING] = embedding_bytes(values[EMBEDDING])
    values[SOURCES] = json.dumps(values[SOURCES])
    return values


def audit_values(record: Sequence[Any]) -> list[Any]:
    """An audit record (:data:`~gae.storage.integrity.AUDIT_CHECKED` order) as its checksum sees it."""
    values = list(record)
    values[2] = json.dumps(values[2])
    return values


def tombstone(cur: psycopg.Cursor[Any], q: Compose, action: str, time: float, seqs: Sequence[int]) -> None:
    """Tombstone the rows ``seqs`` (``action``: evict, expire or delete, which also drops the
    content and embedding), each with its new checksum (see
    :func:`~gae.storage.integrity.tombstoned`), inside the open write transaction."""
    from psycopg import sql

    erase = action == "delete"
    found = cur.execute(q(f"SELECT {ROW}, checksum FROM {{t}} WHERE seq = ANY(%s::bigint[])"),
                        ([int(s) for s in seqs],), binary=True).fetchall()
    keys = [int(record[0]) for record in found]
    sums = [tombstoned(canonical(record[:-1]), record[-1], time, action, erase) for record in found]
    purge = ", content = NULL, embedding = NULL" if erase else ""  # the data goes
    cur.execute(q("UPDATE {t} AS m SET deleted_at = %s, deleted_reason = %s, checksum = v.checksum{purge} "
                  "FROM unnest(%s::bigint[], %s::bigint[]) AS v(seq, checksum) WHERE m.seq = v.seq",
                  purge=sql.SQL(purge)), (float(time) + 0.0, action, keys, sums))


def add_checksums(conn: psycopg.Connection[Any], q: Compose) -> None:
    """Schema 1 -> 2, inside the held write transaction: a checksum column on the memories, audit
    and meta tables, filled from the data as it is, a batch of rows at a time."""
    for name in ("t", "audit", "meta"):
        conn.execute(q(f"ALTER TABLE {{{name}}} ADD COLUMN IF NOT EXISTS checksum bigint"))
    for table, key, columns, kind, cast in (("t", "seq", ROW, b"row", "bigint"),
                                            ("audit", "n", AUDIT, b"audit", "bigint"),
                                            ("meta", "key", "value", b"meta", "text")):
        last: Any = None
        while True:
            after = "" if last is None else f"WHERE {key} > %s "
            found = conn.execute(q(f"SELECT {key}, {columns} FROM {{{table}}} {after}ORDER BY {key} LIMIT {BATCH}"),
                                 () if last is None else (last,), binary=True).fetchall()
            if not found:
                break
            if kind == b"row":
                sums = [row_checksum(canonical(r[1:])) for r in found]
            elif kind == b"audit":
                sums = [checksum(kind, audit_values(r[1:])) for r in found]
            else:
                sums = [checksum(kind, (r[0], r[1])) for r in found]
            conn.execute(q(f"UPDATE {{{table}}} AS x SET checksum = v.checksum FROM unnest(%s::{cast}[], %s::bigint[]) "
                           f"AS v(key, checksum) WHERE x.{key} = v.key"), ([r[0] for r in found], sums))
            last = found[-1][0]


def verify(conn: psycopg.Connection[Any], q: Compose, table: str,
           others: Sequence[str] = ()) -> tuple[int, int, list[str], list[str], list[str]]:
    """Every row's, audit record's and meta value's checksum, in one consistent read-only view,
    then amcheck's btree checks where the extension is installed (of the indexes of ``others``,
    the store's checksummed tables, too). Returns the rows and audit records verified, what was
    checked, what was skipped and why, and the problems found."""
    import psycopg

    checks: list[str] = []
    skipped: list[str] = []
    problems: list[str] = []
    bad: list[str] = []
    rows = audit = 0
    pages = conn.execute("SHOW data_checksums").fetchone() == ("on",)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        try:
            with conn.transaction(), conn.cursor("gae_check_rows", binary=True) as cur:  # streamed from the server
                cur.itersize = BATCH
                cur.execute(q(f"SELECT {ROW}, checksum FROM {{t}} ORDER BY seq"))
                for record in cur:
                    rows += 1
                    problem = row_problem(record[0], canonical(record[:-1]), record[-1])
                    if problem is not None:
                        bad.append(problem)
            with conn.transaction(), conn.cursor("gae_check_audit", binary=True) as cur:
                cur.itersize = BATCH
                cur.execute(q(f"SELECT n, {AUDIT}, checksum FROM {{audit}} ORDER BY n"))
                for record in cur:
                    audit += 1
                    if record[-1] is None or checksum(b"audit", audit_values(record[1:-1])) != record[-1]:
                        bad.append(f"audit record n={record[0]!r} does not match its checksum")
            meta = {key: (value, stored) for key, value, stored in
                    conn.execute(q("SELECT key, value, checksum FROM {meta}")).fetchall()}
            bad += [f"meta value {key!r} is missing" for key in ("dim", "version", "next_id", "scope_names")
                    if key not in meta]
            bad += [f"meta value {key!r} does not match its checksum" for key, (value, stored) in meta.items()
                    if stored is None or checksum(b"meta", (key, value)) != stored]
            checks.append("row, audit and meta checksums" + (" (every page read, its checksum verified by the server)"
                                                              if pages else ""))
        except psycopg.Error as error:
            if error.sqlstate not in CORRUPTED:
                raise
            problems.append(f"the server cannot read it: {error}")
        problems += bad[:SHOWN] + ([f"{len(bad) - SHOWN} more rows, audit records or meta values do not match "
                                    "their checksums"] if len(bad) > SHOWN else [])
        if not pages:
            skipped.append("page checksums: the server runs without data_checksums (initdb --data-checksums), so "
                           "a damaged page that still parses is found only by the row checksums")
        _amcheck(conn, [table, f"{table}_meta", f"{table}_audit", *others], checks, skipped, problems)
    skipped.append("the HNSW and full-text (GIN) indexes: Postgres has no check for them (REINDEX rebuilds them)")
    return rows, audit, checks, skipped, problems


def _amcheck(conn: psycopg.Connection[Any], tables: Sequence[str], checks: list[str], skipped: list[str],
             problems: list[str]) -> None:
    """amcheck's ``bt_index_check(index, heapallindexed => true)`` on every btree index of ``tables``."""
    import psycopg

    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'").fetchone() is None:
        skipped.append("btree indexes: the amcheck extension is not installed in this database "
                       "(CREATE EXTENSION amcheck)")
        return
    indexes = [name for (name,) in conn.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'btree' AND i.indrelid = ANY(%s::regclass[]) ORDER BY 1",
        (list(tables),)).fetchall()]
    for name in indexes:
        try:
            with conn.transaction():
                conn.execute("SELECT bt_index_check(%s::regclass, true)", (name,))
        except psycopg.Error as error:
            if error.sqlstate == "42501":  # insufficient privilege
                skipped.append(f"btree indexes: this role may not run amcheck ({error})")
                return
            problems.append(f"amcheck: index {name}: {error}")
    checks.append(f"amcheck bt_index_check of {len(indexes)} btree indexes")
