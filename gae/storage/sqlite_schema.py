"""The schema of a SQLiteStore: its tables, their creation, the stored schema version and the
migration from an older one. Each function takes the store's connection, inside the transaction
the store holds (creating and migrating need the write lock)."""

from __future__ import annotations

import sqlite3

from gae.storage import sqlite_integrity
from gae.storage.base import SCHEMA_VERSION, NewerSchema, StoreCorrupted
from gae.storage.integrity import checksum

SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL, checksum INTEGER);
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
    deleted_reason TEXT,
    checksum INTEGER
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
    actor TEXT NOT NULL,
    checksum INTEGER
);
"""


def tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def create(conn: sqlite3.Connection, dim: int) -> None:
    """The tables of :data:`SCHEMA` and the first meta values, in the caller's write transaction
    (SQLite's DDL is transactional: all tables or none)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
    conn.executemany("INSERT INTO meta VALUES (?, ?, ?)", [
        (key, value, checksum(b"meta", (key, value))) for key, value in (
            ("dim", str(dim)), ("version", "0"), ("next_id", "0"), ("scope_names", "[]"))])


def schema_version(conn: sqlite3.Connection, path: str) -> int:
    """The stored schema version; an unknown one is refused (StoreCorrupted), a newer one too."""
    if "schema_version" not in tables(conn):
        raise StoreCorrupted(path, "it has a memories table but no schema_version table: not a gae store")
    rows = conn.execute("SELECT version FROM schema_version").fetchall()
    if len(rows) != 1 or type(rows[0][0]) is not int or rows[0][0] < 1:
        raise StoreCorrupted(path, f"unknown schema version {[r[0] for r in rows]!r} (this gae writes "
                                   f"1 to {SCHEMA_VERSION})")
    version = int(rows[0][0])
    if version > SCHEMA_VERSION:
        raise NewerSchema(f"{path} has schema version {version}, newer than this gae ({SCHEMA_VERSION}); "
                          "upgrade gae to open it (if no newer gae wrote it, the file is damaged)")
    return version


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring an older schema up to :data:`SCHEMA_VERSION`, the caller holding the write lock.
    1 -> 2: a checksum on every row, audit record and meta value, of the data as it is, which
    ``PRAGMA integrity_check`` must find sound first."""
    if schema_version(conn, path) >= SCHEMA_VERSION:  # another process migrated it while this one waited
        return
    found = [row[0] for row in conn.execute(f"PRAGMA integrity_check({sqlite_integrity.SHOWN})")]
    if found != ["ok"]:
        raise StoreCorrupted(path, [f"integrity_check (before adding checksums): {line}" for line in found])
    sqlite_integrity.add_checksums(conn)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
