"""Integrity on SQLite: the checksums of a SQLiteStore's rows, audit records and meta values
(added to a store of schema 1, verified by ``check()``) and the check of its full-text index.
Each function takes the store's connection, inside the transaction the store holds."""

from __future__ import annotations

import sqlite3

from gae.storage.integrity import AUDIT_CHECKED, CHECKED, checksum, row_checksum, row_problem

ROW = ", ".join(CHECKED)
AUDIT = ", ".join(AUDIT_CHECKED)
SHOWN = 20  # problems of one kind listed; the rest are counted
META = ("dim", "version", "next_id", "scope_names")


def busy(error: sqlite3.DatabaseError) -> bool:
    """A lock or an interrupt, not damage."""
    return isinstance(error, sqlite3.OperationalError) and any(
        word in str(error) for word in ("locked", "busy", "interrupted"))


def mistake(error: sqlite3.DatabaseError) -> bool:
    """The caller's error, not damage: a constraint a write broke, a statement SQLite cannot
    parse, a closed connection or wrong bindings (a table's columns are verified before its
    statements run, so an unknown column is the statement's)."""
    if isinstance(error, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)):
        return True
    return isinstance(error, sqlite3.OperationalError) and any(
        words in str(error) for words in ("syntax error", "no such column", "no such function", "unrecognized token",
                                          "incomplete input"))


def add_checksums(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2, holding the write lock: a checksum column on the memories, audit and meta
    tables, filled from the data as it is, in slices of the key (no cursor reads a table while
    it is updated)."""
    for table in ("memories", "audit", "meta"):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN checksum INTEGER")
    for table, key, columns, kind in (("memories", "seq", ROW, b"row"), ("audit", "n", AUDIT, b"audit"),
                                      ("meta", "rowid", "key, value", b"meta")):
        last = None
        while True:
            after = "" if last is None else f"WHERE {key} > ? "
            found = conn.execute(f"SELECT {key}, {columns} FROM {table} {after}ORDER BY {key} LIMIT 1000",
                                 () if last is None else (last,)).fetchall()
            if not found:
                break
            conn.executemany(f"UPDATE {table} SET checksum = ? WHERE {key} = ?",
                             [(row_checksum(r[1:]) if kind == b"row" else checksum(kind, r[1:]), r[0]) for r in found])
            last = found[-1][0]


def verify(conn: sqlite3.Connection, problems: list[str]) -> tuple[int, int]:
    """Append to ``problems`` every row, audit record and meta value that does not match its
    checksum (or is missing); return the rows and audit records verified."""
    bad: list[str] = []
    rows = 0
    for record in conn.execute(f"SELECT {ROW}, checksum FROM memories ORDER BY seq"):
        rows += 1
        problem = row_problem(record[0], record[:-1], record[-1])
        if problem is not None:
            bad.append(problem)
    audit = 0
    for record in conn.execute(f"SELECT n, {AUDIT}, checksum FROM audit ORDER BY n"):
        audit += 1
        if record[-1] is None or checksum(b"audit", record[1:-1]) != record[-1]:
            bad.append(f"audit record n={record[0]!r} does not match its checksum")
    meta = {key: (value, stored) for key, value, stored in conn.execute("SELECT key, value, checksum FROM meta")}
    bad += [f"meta value {key!r} is missing" for key in META if key not in meta]
    bad += [f"meta value {key!r} does not match its checksum" for key, (value, stored) in meta.items()
            if stored is None or checksum(b"meta", (key, value)) != stored]
    problems += bad[:SHOWN] + ([f"{len(bad) - SHOWN} more rows, audit records or meta values do not match their "
                                "checksums"] if len(bad) > SHOWN else [])
    return rows, audit


def check_text(conn: sqlite3.Connection) -> list[str]:
    """FTS5's own check of the full-text index (a statement that needs the write lock), and that
    the index holds exactly the live rows' content."""
    try:
        conn.execute("INSERT INTO memories_text (memories_text) VALUES ('integrity-check')")
    except sqlite3.DatabaseError as error:
        if busy(error):
            raise
        return [f"full-text index: {error}"]
    differ = conn.execute("SELECT count(*) FROM memories m WHERE m.deleted_at IS NULL AND m.content IS NOT NULL "
                          "AND m.content IS NOT (SELECT t.content FROM memories_text t WHERE t.rowid = m.seq)"
                          ).fetchone()[0]
    extra = conn.execute("SELECT count(*) FROM memories_text t WHERE NOT EXISTS (SELECT 1 FROM memories m "
                         "WHERE m.seq = t.rowid AND m.deleted_at IS NULL AND m.content IS NOT NULL)").fetchone()[0]
    return ([f"full-text index: {differ} live rows' content differs from the index's"] if differ else []) + (
        [f"full-text index: {extra} entries of no live row"] if extra else [])
