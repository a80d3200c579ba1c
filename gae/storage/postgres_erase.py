"""Erasure on Postgres: what must hold for deleted data to leave a server's files, and the purge that makes it so.

A deleted row's old version stays in the table's file, and its vector in the HNSW index, until a
vacuum; the WAL holds the inserted row until its segment is gone. ``VACUUM FULL`` writes the table
and every index anew without the dead versions; switching the WAL and checkpointing, twice, puts
the segments that held them behind the redo point, where the server removes them, unless it
recycles them (renamed, with their bytes) or keeps them for an archive, standbys or slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


def erasure_problems(conn: psycopg.Connection[Any]) -> list[str]:
    """Why a purge on this server could not promise that deleted data leaves its files: WAL
    segments recycled rather than removed (``wal_recycle``), kept for archiving, standbys or
    replication slots, or a role that may not ``CHECKPOINT`` or switch the WAL. Empty when it can."""
    settings = dict(conn.execute("SELECT name, setting FROM pg_settings "
                                 "WHERE name IN ('wal_recycle', 'archive_mode', 'wal_keep_size')").fetchall())
    problems = []
    if settings.get("wal_recycle") != "off":
        problems.append("wal_recycle is on: old WAL segments are renamed for reuse with their bytes "
                        "(ALTER SYSTEM SET wal_recycle = off; SELECT pg_reload_conf())")
    if settings.get("archive_mode") not in (None, "off"):
        problems.append("archive_mode is on: WAL segments are kept for the archive")
    if settings.get("wal_keep_size") not in (None, "0"):
        problems.append("wal_keep_size is not 0: WAL segments are kept for standbys")
    if conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() != (0,):
        problems.append("replication slots hold WAL segments")
    if conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone() != (0,):
        problems.append("standbys are connected: their copies of the files hold the rows")
    if conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() != (True,):
        problems.append("the role is not a superuser: CHECKPOINT and pg_switch_wal() need it")
    return problems


def snapshot_problems(conn: psycopg.Connection[Any]) -> list[str]:
    """What would make ``VACUUM FULL`` keep a deleted row's old version now: another session
    with an open snapshot (it copies versions such a snapshot may still see), or a prepared
    transaction. Empty when there is none."""
    problems = []
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL "
                       "AND pid <> pg_backend_pid()").fetchone()
    sessions = 0 if row is None else int(row[0])
    if sessions:
        problems.append(f"{sessions} other session(s) hold a snapshot that may still see the deleted rows")
    if conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() != (0,):
        problems.append("prepared transactions hold a snapshot")
    return problems


def purge(conn: psycopg.Connection[Any], vacuums: Sequence[sql.Composed]) -> None:
    """``vacuums`` (each table's ``VACUUM FULL``), then the WAL switched and checkpointed twice:
    the segment in use when the rows were deleted is closed, then past a checkpoint, and removed.
    On an autocommit connection, outside any transaction (VACUUM cannot run inside one)."""
    for vacuum_full in vacuums:
        conn.execute(vacuum_full)
    for _ in range(2):
        conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
