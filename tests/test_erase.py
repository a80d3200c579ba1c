"""Erase means erased: ``EpisodicMemory.delete(..., erase=True)`` leaves no byte of the deleted
content or embedding in any file of the store, which a plain delete does not promise: on SQLite
(the database, its write-ahead log and shared-memory index, the full-text index included) and on a
real Postgres (its whole data directory: heap, indexes, WAL), where the server's configuration must
allow it and a store says why not otherwise; ``purge()`` does the same for everything deleted
before. Every check scans the bytes of every file for a unique marker string, its lower-case
full-text term, and the marker memory's float32 embedding in either byte order (SQLite writes it
little-endian; pgvector's wire format is big-endian, its files native).
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from gae import EpisodicMemory
from gae.storage import SQLiteStore

DIM = 16
MARKER = "ZEBRAQUOKKA7781"


def marker_embedding() -> torch.Tensor:
    return (torch.full((1, DIM), 0.25) + torch.arange(DIM) * 0.001)


def traces(folder: Path) -> dict[str, list[str]]:
    """For each file under ``folder``, which of the marker's traces its bytes hold."""
    unit = (marker_embedding() / marker_embedding().norm()).float().numpy()[0]
    patterns = {"content": MARKER.encode(), "term": MARKER.lower().encode(),
                "embedding": unit.astype("<f4").tobytes(),
                "embedding_big_endian": b"".join(struct.pack(">f", float(v)) for v in unit)}
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            data = path.read_bytes()
        except OSError:  # a socket or a file the server holds exclusively
            continue
        found[str(path.relative_to(folder))] = [name for name, pattern in patterns.items() if pattern in data]
    return found


def clean(folder: Path) -> bool:
    return not any(traces(folder).values())


def filled(folder: Path, store=None) -> tuple[EpisodicMemory, int]:
    """A store with the marker memory between 500 others (so it shares pages with them)."""
    memory = EpisodicMemory(DIM, capacity=10_000, store=SQLiteStore(folder / "memories.db") if store is None else store)
    gen = torch.Generator().manual_seed(0)
    memory.add(torch.randn(200, DIM, generator=gen), 0.5, content=[f"filler {i} lorem ipsum" for i in range(200)])
    (marker,) = memory.add(marker_embedding(), 0.9, content=[f"the {MARKER} secret"]).tolist()
    memory.add(torch.randn(300, DIM, generator=gen), 0.5, content=[f"more filler {i} dolor" for i in range(300)])
    return memory, marker


def test_a_plain_delete_leaves_traces_in_the_files_the_scan_finds(tmp_path):
    """The control: without erase, the write-ahead log still holds the deleted row's old pages."""
    memory, marker = filled(tmp_path)
    memory.delete([marker])
    assert any(found for found in traces(tmp_path).values())


def test_erase_leaves_no_trace_in_any_file(tmp_path):
    memory, marker = filled(tmp_path)
    assert any(found for found in traces(tmp_path).values())  # it was written
    assert memory.delete([marker], now=5.0, reason="user request 42", erase=True) == 1
    assert clean(tmp_path)
    assert (tmp_path / "memories.db-wal").stat().st_size == 0  # the log was truncated
    # the audit keeps who, when, why and the id, never the content
    record = memory.store.audit()[-1]
    assert (record.action, record.time, record.ids, record.reason) == ("delete", 5.0, (marker,), "user request 42")
    assert MARKER not in repr(memory.store.audit())
    # the memory and a memory reopened on the store no longer have it; the others are intact
    reopened = EpisodicMemory(DIM, capacity=10_000, store=SQLiteStore(tmp_path / "memories.db"))
    assert marker not in reopened.column("ids").tolist() and len(reopened) == len(memory) == 500
    hits = reopened.store.retrieve(np.ones((1, DIM), dtype=np.float32), now=10.0, k=3, text="filler", w_text=1.0)
    assert (hits.ids >= 0).all()


def test_purge_erases_what_plain_deletes_left(tmp_path):
    memory, marker = filled(tmp_path)
    memory.delete([marker])
    memory.store.purge()
    assert clean(tmp_path)
    assert len(EpisodicMemory(DIM, capacity=10_000, store=SQLiteStore(tmp_path / "memories.db"))) == 500


def test_an_erase_waits_for_a_reader_then_says_what_is_left(tmp_path):
    memory, marker = filled(tmp_path)
    memory.store.erase_timeout = 0.05
    reader = sqlite3.connect(tmp_path / "memories.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memories").fetchone()  # a read snapshot that still needs the WAL
    with pytest.raises(TimeoutError, match="the delete is committed, but a reader still uses the write-ahead log"):
        memory.delete([marker], erase=True)
    assert marker not in memory.column("ids").tolist()  # committed: acknowledged as deleted, not yet erased
    reader.execute("COMMIT")
    reader.close()
    memory.store.purge()
    assert clean(tmp_path)


def test_bad_erase_arguments_are_refused_and_change_nothing(tmp_path):
    memory, marker = filled(tmp_path)
    version = memory.version
    with pytest.raises(TypeError, match="erase must be a bool, got 'yes'"):
        memory.delete([marker], erase="yes")
    assert memory.version == version and marker in memory.column("ids").tolist()
    with pytest.raises(ValueError, match="erase_timeout must be a number of seconds >= 0, got -1"):
        SQLiteStore(tmp_path / "other.db", erase_timeout=-1)


def test_without_a_store_erase_deletes_as_usual():
    memory = EpisodicMemory(DIM, capacity=10)
    (i,) = memory.add(marker_embedding(), 0.5).tolist()
    assert memory.delete([i], erase=True) == 1 and len(memory) == 0


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory):
    """A Postgres server of its own (its data directory is scanned, its settings changed): (dsn, data directory)."""
    pgserver = pytest.importorskip("pgserver")
    pytest.importorskip("psycopg")
    folder = Path(tmp_path_factory.mktemp("pgerase")) / "pgdata"
    server = pgserver.get_server(folder, cleanup_mode="stop")
    yield server.get_uri(), folder
    server.cleanup()


def test_postgres_refuses_erase_and_says_why_until_its_server_can_promise_it(postgres, tmp_path):
    import psycopg
    import torch

    from gae.storage import PostgresStore

    dsn, _ = postgres
    with psycopg.connect(dsn, autocommit=True) as admin:  # the server's default, whatever ran before
        admin.execute("ALTER SYSTEM SET wal_recycle = on")
        admin.execute("SELECT pg_reload_conf()")
    store = PostgresStore(dsn, table="refused")
    memory = EpisodicMemory(DIM, capacity=10, store=store)
    (i,) = memory.add(torch.eye(DIM)[:1], 0.5).tolist()
    version = memory.version
    assert not store.erases and any("wal_recycle is on" in p for p in store.erasure_problems())
    with pytest.raises(ValueError, match="erase=True: PostgresStore cannot guarantee"):
        memory.delete([i], erase=True)
    assert memory.version == version and i in memory.column("ids").tolist()
    with pytest.raises(RuntimeError, match="purge cannot promise erasure now .*wal_recycle is on"):
        store.purge()
    store.close()
    with psycopg.connect(dsn, autocommit=True) as admin:  # what the problem said to do
        admin.execute("ALTER SYSTEM SET wal_recycle = off")
        admin.execute("SELECT pg_reload_conf()")


def test_postgres_erase_leaves_no_trace_in_the_data_directory(postgres):
    from gae.storage import PostgresStore

    dsn, data = postgres
    store = PostgresStore(dsn, table="erased")
    if store.erasure_problems():  # the refusal test above turns wal_recycle off; alone, do it here
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET wal_recycle = off")
            admin.execute("SELECT pg_reload_conf()")
    assert store.erasure_problems() == []
    memory, marker = filled(data, store)
    memory.delete([marker])  # the control: a plain delete leaves the row's bytes in the server's files
    assert not clean(data)
    store.purge()
    assert clean(data)
    (again,) = memory.add(marker_embedding(), 0.9, content=[f"the {MARKER} secret"]).tolist()
    assert not clean(data)
    memory.delete([again], reason="user request", erase=True)  # erase=True: gone when the call returns
    assert clean(data)
    assert MARKER not in repr(store.audit()) and store.audit()[-1].ids == (again,)
    assert len(EpisodicMemory(DIM, capacity=10_000, store=PostgresStore(dsn, table="erased"))) == 500
    store.close()


def test_postgres_erase_of_a_checksummed_table_leaves_no_trace(postgres):
    """The ledger's erase (Store.erase on its tables): VACUUM FULL of those tables, then the WAL
    purge, or a refusal naming what on the server prevents it."""
    import psycopg

    from gae.storage import TEXT, Column, PostgresStore, Table

    dsn, data = postgres
    notes = Table("notes", (Column("owner", TEXT, nullable=False), Column("body", TEXT)), key=("owner",))
    store = PostgresStore(dsn, table="tabled")
    store.insert(notes, [(f"filler {i}", "lorem ipsum " * 5) for i in range(300)])
    store.insert(notes, [("secret", f"the {MARKER} secret")])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET wal_recycle = on")
        admin.execute("SELECT pg_reload_conf()")
    store.delete(notes, "owner = ?", ("secret",))
    with pytest.raises(RuntimeError, match="the deleted rows of tabled_notes are committed, but this server cannot "
                                           "erase them from its files: wal_recycle is on"):
        store.erase([notes])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET wal_recycle = off")
        admin.execute("SELECT pg_reload_conf()")
    assert not clean(data)  # the control: deleted, and still in the server's files
    with store.exclusive():
        store.erase([notes])  # inside a write block: once it has committed
    assert clean(data) and store.count(notes) == 300 and store.check().tables == {"notes": 300}
    store.close()
