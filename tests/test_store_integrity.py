"""A damaged SQLite store never opens silently: opening refuses what is cheap to find (header,
size, ``quick_check``, schema version), ``store.check()`` finds the rest (``integrity_check``,
a checksum on every row, audit record and meta value, the full-text index), and what neither
refuses reads back exactly as written. The Postgres ``check()`` is tested in test_store_postgres.py.
"""

from __future__ import annotations

import pickle
import random
import shutil
import sqlite3
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from gae import AdmissionPolicy, EpisodicMemory
from gae.storage import SQLiteStore, StoreCheck, StoreCorrupted
from gae.storage.base import SCHEMA_VERSION
from gae.storage.integrity import CHECKED, row_checksum

ROOT = Path(__file__).resolve().parents[1]
DIM = 8
QUERY = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)[None]


def written(path: Path) -> EpisodicMemory:
    """A closed store that has added (with content), evicted, deleted, expired and refused."""
    gen = torch.Generator().manual_seed(0)
    memory = EpisodicMemory(DIM, capacity=20, store=SQLiteStore(path))
    for step in range(6):
        memory.add(torch.randn(5, DIM, generator=gen), torch.rand(5, generator=gen), now=float(step),
                   scope=["alice", 3, "bob", "alice", "bob"], source_ids=[(step, i) for i in range(5)],
                   valid_until=torch.tensor([float("inf"), 50.0, 4.0, float("inf"), 90.0], dtype=torch.float64),
                   content=[f"refund {step}", None, "vendor address mismatch", f"note {step} lorem", "ipsum"])
    memory.delete(memory.column("ids")[:2], now=6.0, reason="user asked")
    memory.expire(now=7.0)
    trace = {"embedding": torch.randn(DIM, generator=gen), "importance": 0.7, "outcome": "failure", "quality": 0.9,
             "scope": "bob", "content": "refused trace"}
    memory.admit_and_add([trace], AdmissionPolicy(), now=8.0)
    memory.store.close()
    return memory


def read_back(store: SQLiteStore) -> tuple:
    """Everything a memory reads from its store, as bytes and plain values."""
    snapshot = store.open(DIM)
    assert snapshot is not None
    rows = snapshot.rows
    found = store.retrieve(QUERY, 10.0, k=4, text="refund note vendor", w_text=1.0)
    return (tuple(getattr(rows, name).tobytes() for name in ("seq", "embedding", "importance", "confidence",
                                                              "created_at", "valid_from", "valid_until")),
            rows.scope, rows.memory_type, rows.source_ids, rows.contents(), rows.sensitivities(), snapshot.audit,
            snapshot.version, snapshot.next_id, snapshot.scope_names, found.ids.tobytes(), found.scores.tobytes())


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> tuple[bytes, tuple]:
    """The bytes of a real store file (the same bytes every run: its row uuids are seeded), and
    what it reads back."""
    path = tmp_path_factory.mktemp("store") / "memory.db"
    gen = random.Random(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=gen.getrandbits(128), version=4))
        written(path)
    data = path.read_bytes()
    with SQLiteStore(path) as store:
        expected = read_back(store)
    assert path.read_bytes() == data  # reading changes nothing
    return data, expected


def fresh(path: Path, data: bytes) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(data)


def outcome(path: Path, expected: tuple) -> str:
    """'refused' (opening raised), 'found' (check() reported it) or 'same' (it reads back as written)."""
    try:
        store = SQLiteStore(path)
    except ValueError as error:  # StoreCorrupted, or a version byte that now reads as a newer gae's
        assert isinstance(error, StoreCorrupted) or "newer than this gae" in str(error), error
        assert str(path) in str(error)
        return "refused"
    try:
        try:
            got = read_back(store)
        except StoreCorrupted as error:
            assert str(path) in str(error)
            return "refused"
        report = store.check(raises=False)
        if not report.ok:
            with pytest.raises(StoreCorrupted, match="is damaged"):
                store.check()
            return "found"
        assert got == expected, "a damaged store read back different data, and neither open nor check() saw it"
        return "same"
    finally:
        store.close()


def test_a_flipped_byte_is_refused_found_or_harmless(original, tmp_path):
    data, expected = original
    gen = np.random.default_rng(2024)
    embeddings = np.frombuffer(expected[0][1], dtype=np.float32).reshape(-1, DIM)
    starts = [data.find(row.tobytes()) for row in embeddings]
    assert all(start > 0 for start in starts)
    positions = sorted({*range(100), *(s + int(gen.integers(0, 4 * DIM)) for s in starts),  # header, embeddings
                        *gen.integers(100, len(data), 400).tolist()})
    path = tmp_path / "memory.db"
    counts = {"refused": 0, "found": 0, "same": 0}
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= int(gen.integers(1, 256))
        fresh(path, bytes(damaged))
        result = outcome(path, expected)
        counts[result] += 1
        if result == "refused":
            assert path.read_bytes() == damaged, f"refusing the file changed it (byte {position})"
        if position in starts:
            assert result != "same"
    assert counts["found"] >= len(starts) and counts["refused"] > 0, counts


def test_a_truncated_file_is_refused_with_its_name(original, tmp_path):
    data, _ = original
    path = tmp_path / "memory.db"
    for cut, why in ((100, "truncated"), (4096, "truncated"), (len(data) - 50, "too short")):
        fresh(path, data[:-cut])
        with pytest.raises(StoreCorrupted, match=why) as raised:
            SQLiteStore(path)
        assert str(path) in str(raised.value) and raised.value.where == str(path)
        assert path.read_bytes() == data[:-cut] and not Path(f"{path}-wal").exists()
        with pytest.raises(StoreCorrupted):
            EpisodicMemory(DIM, store=SQLiteStore(path))
    fresh(path, b"not a store at all, just some text, " * 10)
    with pytest.raises(StoreCorrupted, match="not a SQLite database"):
        SQLiteStore(path)


def test_a_sound_store_passes_check(tmp_path):
    path = tmp_path / "memory.db"
    memory = written(path)
    store = SQLiteStore(path)
    report = store.check()
    assert isinstance(report, StoreCheck) and report.ok and report.where == str(path)
    assert report.rows == 30 and report.audit == len(memory.audit_log) and report.seconds > 0
    assert any("integrity_check" in c for c in report.checks) and any("checksums" in c for c in report.checks)
    assert any("full-text" in c for c in report.checks) and not report.skipped
    # it goes on passing as the memory changes, erasing included
    reopened = EpisodicMemory(DIM, capacity=20, store=store)
    reopened.add(torch.ones(3, DIM), 0.5, now=9.0, content=["a", "b", None])
    reopened.delete(reopened.column("ids")[:2], now=10.0, erase=True)
    reopened.expire(now=100.0)
    assert store.check().ok
    assert SQLiteStore(":memory:").check().skipped == ("checksums: the file holds no store yet",)


def test_check_finds_what_changed_behind_the_stores_back(tmp_path):
    written(tmp_path / "sound.db")
    edits = {"embedding": "UPDATE memories SET embedding = zeroblob(32) WHERE seq = 7",
             "content": "UPDATE memories SET content = 'refund 9' WHERE seq = 7",
             "importance": "UPDATE memories SET importance = importance / 2 WHERE seq = 7",
             "tombstone": "UPDATE memories SET deleted_at = NULL, deleted_reason = NULL WHERE seq = 0",
             "audit": "UPDATE audit SET reason = 'nothing to see' WHERE n = 2"}
    for name, statement in edits.items():
        path = tmp_path / f"{name}.db"
        shutil.copyfile(tmp_path / "sound.db", path)
        with sqlite3.connect(path) as connection:
            connection.execute(statement)
        connection.close()
        store = SQLiteStore(path)  # quick_check cannot see a value change
        store.open(DIM)
        with pytest.raises(StoreCorrupted, match="n=2" if name == "audit" else "seq=[07] ") as raised:
            store.check()
        assert str(path) in str(raised.value)
        assert len(raised.value.problems) == (2 if name == "tombstone" else 1)  # a revived row: not in the text index
        report = store.check(raises=False)
        assert not report.ok and report.problems == tuple(raised.value.problems)
        store.close()
    path = tmp_path / "meta.db"  # the counters are checked on every open
    shutil.copyfile(tmp_path / "sound.db", path)
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE meta SET value = '[\"alice\"]' WHERE key = 'scope_names'")
    connection.close()
    with pytest.raises(StoreCorrupted, match="meta value 'scope_names' does not match its checksum"):
        SQLiteStore(path).open(DIM)


def test_check_covers_the_checksummed_tables_beside_the_memories(tmp_path):
    from gae.storage import INT, TEXT, Column, Table

    path = tmp_path / "memory.db"
    written(path)
    notes = Table("notes", (Column("n", INT, nullable=False), Column("body", TEXT)), key=("n",))
    store = SQLiteStore(path)
    store.insert(notes, [(i, f"note {i}") for i in range(5)])
    report = store.check()
    assert report.ok and report.rows == 30 and report.tables == {"notes": 5}
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE notes SET body = 'changed' WHERE n = 3")
        connection.execute("UPDATE memories SET importance = importance / 2 WHERE seq = 7")
    connection.close()
    with pytest.raises(StoreCorrupted) as raised:
        store.check()
    assert raised.value.problems == ["row seq=7 does not match its checksum (its embedding, content or metadata "
                                     "changed)", "table notes: row (n=3) does not match its checksum"]
    store.close()


def test_a_row_damaged_before_its_eviction_stays_reported(tmp_path):
    path = tmp_path / "memory.db"
    memory = EpisodicMemory(DIM, capacity=3, store=SQLiteStore(path))
    memory.add(torch.randn(3, DIM), 0.5, now=0.0)
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE memories SET embedding = zeroblob(32)")  # every row damaged
    connection.close()
    memory.store.close()
    memory = EpisodicMemory(DIM, capacity=3, store=SQLiteStore(path))
    memory.add(torch.randn(1, DIM), 0.9, now=1.0)  # evicts one of them
    (evicted,) = next(record.ids for record in memory.audit_log if record.action == "evict")
    with pytest.raises(StoreCorrupted) as raised:
        memory.store.check()
    assert sorted(raised.value.problems) == sorted(
        [f"row seq={evicted} has no checksum (it did not match its checksum when it was evicted or expired)"]
        + [f"row seq={seq} does not match its checksum (its embedding, content or metadata changed)"
           for seq in {0, 1, 2} - {evicted}])


def test_a_deleted_rows_checksum_is_not_derived_from_its_content(tmp_path):
    path = tmp_path / "memory.db"
    memory = EpisodicMemory(DIM, capacity=10, store=SQLiteStore(path))
    memory.add(torch.randn(2, DIM), 0.5, now=0.0, content=["the secret one", "the other"])
    memory.delete([0], now=1.0)
    with sqlite3.connect(path) as connection:
        *values, stored = connection.execute(f"SELECT {', '.join(CHECKED)}, checksum FROM memories "
                                             "WHERE seq = 0").fetchone()
    connection.close()
    assert values[CHECKED.index("content")] is None and values[CHECKED.index("embedding")] is None
    assert stored == row_checksum(values)  # of what is left, nothing else
    assert memory.store.check().ok


def test_a_schema_1_store_gains_the_checksums_it_would_have_written(tmp_path):
    path = tmp_path / "memory.db"
    written(path)
    with sqlite3.connect(path) as connection:
        sums = connection.execute("SELECT seq, checksum FROM memories ORDER BY seq").fetchall()
        audit = connection.execute("SELECT checksum FROM audit ORDER BY n").fetchall()
        for table in ("memories", "audit", "meta"):
            connection.execute(f"ALTER TABLE {table} DROP COLUMN checksum")
        connection.execute("UPDATE schema_version SET version = 1")
    connection.close()
    store = SQLiteStore(path)
    assert store.check().skipped == ("checksums: schema version 1 has none (open(dim) adds them)",)
    EpisodicMemory(DIM, capacity=20, store=store)
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
        assert connection.execute("SELECT seq, checksum FROM memories ORDER BY seq").fetchall() == sums
        assert connection.execute("SELECT checksum FROM audit ORDER BY n").fetchall() == audit
    connection.close()
    assert store.check().ok
    fixture = tmp_path / "store_v1.db"  # written by gae 0.1.0
    shutil.copyfile(ROOT / "tests" / "data" / "store_v1.db", fixture)
    assert len(EpisodicMemory(6, capacity=12, store=SQLiteStore(fixture))) == 9
    assert SQLiteStore(fixture).check().ok


def test_an_unknown_schema_version_is_refused(tmp_path):
    path = tmp_path / "memory.db"
    written(path)
    for version, error in ((0, "unknown schema version \\[0\\]"), ("two", "unknown schema version \\['two'\\]"),
                           (SCHEMA_VERSION + 1, "newer than this gae")):
        with sqlite3.connect(path) as connection:
            connection.execute("UPDATE schema_version SET version = ?", (version,))
        connection.close()
        before = path.read_bytes()
        with pytest.raises(ValueError, match=error):
            SQLiteStore(path)
        assert path.read_bytes() == before


def test_check_refuses_bad_arguments_and_a_closed_store(tmp_path):
    store = SQLiteStore(tmp_path / "memory.db")
    store.open(DIM)
    with pytest.raises(ValueError, match="raises must be a bool, got 1"):
        store.check(raises=1)
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.check()


def test_the_error_pickles_with_its_problems():
    error = StoreCorrupted("memory.db", ["quick_check: page 3 is wrong", "row seq=5 does not match"])
    again = pickle.loads(pickle.dumps(error))
    assert (again.where, again.problems, str(again)) == (error.where, error.problems, str(error))
    assert str(error).startswith("memory.db is damaged: quick_check: page 3 is wrong; row seq=5")
