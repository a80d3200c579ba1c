"""A damaged ledger file never opens silently: a copy of a real ledger with one byte flipped
either refuses to be read (StoreCorrupted naming the file), or reads back exactly as written, or
``store.check()`` reports the damage. Never a raw sqlite3, json, pickle or KeyError.

The ledger is written through :class:`gae.ledger.Ledger` (events of every kind, pending
decisions, snapshots, meta values and an audit record from a delete); the flips land at seeded
random positions and inside every kind of row (each row's bytes found in the file).
"""

from __future__ import annotations

import io
import json
import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gae.ledger import CLOSE, DECIDE, GROW, LEARN, Event, Ledger
from gae.storage import SQLiteStore, StoreCorrupted

NAME = "judgment"


def written(path: Path) -> dict[str, bytes]:
    """A closed ledger file holding every kind of row; returns the bytes of one value of each
    kind, to find in the file."""
    store = SQLiteStore(path)
    ledger = Ledger(store, NAME)
    gen = np.random.default_rng(7)
    rows = gen.random((12, 5))
    with ledger.writing():
        ledger.set_meta({"kind": "JudgmentMemory", "settings": {"eta_confirmed": 0.05, "tau": 0.25},
                         "categories": ["invoice", "refund"], "actions": ["approve", "review", "reject"],
                         "factors": [f"f{k}" for k in range(5)], "head": 0, "epoch": 0, "deleted": 0})
        events = []
        for i in range(12):
            decision = f"decision-{i:03d}"
            events.append(Event(DECIDE, decision, "invoice" if i % 2 else 1, rows[i], "approve", source_id=100 + i,
                                decided_version=i, at=1000.0 + i,
                                detail={"confidence": 0.5 + i / 100, "probs": [0.5, 0.25, 0.25],
                                        "names": ["approve", "review", "reject"], "reasons": ["novel"]}))
            if i % 4 == 3:
                events.append(Event(CLOSE, decision, at=1000.5 + i, detail={"reason": "expired"}))
            elif i % 4 != 2:
                events.append(Event(LEARN, decision, "invoice" if i % 2 else 1, rows[i], ["approve", "reject"][i % 2],
                                    i % 3 == 0, None, 100 + i, i, i + 1, 1000.7 + i,
                                    {"referral": {"taken": True, "wrong": i % 2 == 0}}))
        events.append(Event(GROW, detail={"actions": ["escalate"], "categories": []}))
        head = ledger.append(events, 0)
        ledger.write_snapshot(4, 3, {"memory": {"centroids": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
                                                "counts": torch.ones(2, 3, dtype=torch.int64)},
                                     "referral": {"threshold": 0.6, "window": [1.0, 0.0, 1.0]}})
        ledger.write_snapshot(head, 9, {"memory": {"centroids": torch.zeros(2, 3, 4)}, "referral": None})
        ledger.count_commit()
    with ledger.writing():  # forget decision-009 (its decide and learn events), as a Decider does
        assert ledger.delete([18], "forget", "user request 7", "auditor") == 1
        ledger.write_snapshot(head, 10, {"memory": {"centroids": torch.linspace(0, 1, 24).reshape(2, 3, 4)},
                                         "referral": None})
        ledger.set_meta({"grown_actions": ["approve", "review", "reject", "escalate"]})
    store.close()
    return {"ledger_events": [rows[5].tobytes(), b'"reasons": ["novel"]', b'{"reason": "expired"}'],
            "ledger_meta": [b'"eta_confirmed": 0.05', b'"escalate"]'], "ledger_pending": [b"decision-006"],
            "ledger_snapshots": [torch.linspace(0, 1, 24).numpy().tobytes()[:32], b"referral"],
            "ledger_audit": [b"user request 7", b"auditor"], "gae_tables": [b'"indexes"', b"ledger_snapshots"],
            "ledger_events_decision": [b"decision-006"], "sqlite_autoindex_ledger_pending_1": [b"decision-006"],
            "sqlite_autoindex_ledger_meta_1": [b"grown_actions"]}


VALUES = ("ledger_events", "ledger_meta", "ledger_snapshots", "ledger_audit", "gae_tables")  # markers not in a key


def read_all(store: SQLiteStore) -> Any:
    """Everything a Decider reads of the ledger, as plain comparable values."""
    ledger = Ledger(store, NAME)

    def event(e: Event) -> tuple:
        return (*e[:3], None if e.row is None else e.row.tobytes(), *e[4:])

    def snapshot(s: Any) -> Any:
        if s is None:
            return None
        buffer = io.BytesIO()
        torch.save(s.state, buffer)  # tensors compared by their bytes
        return s.seq, s.version, buffer.getvalue()

    with ledger.reading():
        return (ledger.meta(), ledger.position(), [event(e) for e in ledger.events(0)],
                [event(e) for e in ledger.pending()], snapshot(ledger.snapshot()), snapshot(ledger.snapshot(before=5)),
                [sorted(a.items()) for a in ledger.audit()], ledger.count(CLOSE, "expired"),
                event(ledger.decision("decision-005")), ledger.learned(last=3), ledger.sourced([104, 105]))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Any, bytes, dict[str, list[int]]]:
    """The ledger file as written, what it reads back, and the file compacted (``VACUUM``: no
    stale copy of a row left in free space) with the positions of its rows' values."""
    folder = tmp_path_factory.mktemp("ledger")
    markers = written(folder / "ledger.db")
    data = (folder / "ledger.db").read_bytes()
    store = SQLiteStore(folder / "ledger.db")
    expected = read_all(store)
    assert store.check().ok
    store.close()
    shutil.copyfile(folder / "ledger.db", folder / "compact.db")
    connection = sqlite3.connect(folder / "compact.db")
    connection.execute("VACUUM")
    connection.close()
    compact = (folder / "compact.db").read_bytes()
    store = SQLiteStore(folder / "compact.db")
    assert read_all(store) == expected
    store.close()
    return data, expected, compact, row_positions(folder / "compact.db", compact, markers)


def outcome(path: Path, expected: Any) -> str:
    """'refused' (StoreCorrupted naming the file), 'same' (read back as written) or 'found'
    (read back otherwise, and check() reports a problem)."""
    try:
        store = SQLiteStore(path)
    except StoreCorrupted as error:
        assert str(path) in str(error)
        return "refused"
    try:
        try:
            got = read_all(store)
        except StoreCorrupted as error:
            assert str(path) in str(error) and error.where == str(path), error
            return "refused"
        if got == expected:
            return "same"
        report = store.check(raises=False)
        assert not report.ok, "a damaged ledger read back other rows, and check() found nothing"
        return "found"
    finally:
        store.close()


def fresh(path: Path, data: bytes) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(data)


def flipped(data: bytes, position: int, rng: random.Random) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= rng.randrange(1, 256)
    return bytes(damaged)


def row_positions(path: Path, data: bytes, markers: dict[str, list[bytes]]) -> dict[str, list[int]]:
    """For each table and index, the positions in the file of the first, middle and last byte of
    each of its markers (a value of one of its rows), found in the pages SQLite says it owns."""
    connection = sqlite3.connect(path)
    pages: dict[str, list[int]] = {}
    for name, page in connection.execute("SELECT name, pageno FROM dbstat"):
        pages.setdefault(name, []).append(page)
    size = connection.execute("PRAGMA page_size").fetchone()[0]
    connection.close()
    found: dict[str, list[int]] = {}
    for name, values in markers.items():
        for marker in values:
            starts = [(p - 1) * size + data[(p - 1) * size:p * size].find(marker) for p in pages[name]
                      if marker in data[(p - 1) * size:p * size]]
            assert len(starts) == 1, f"{marker!r} is in {len(starts)} pages of {name}, not one"
            found.setdefault(name, []).extend([starts[0], starts[0] + len(marker) // 2, starts[0] + len(marker) - 1])
    return found


def run(path: Path, data: bytes, expected: Any, positions: list[int], rng: random.Random,
        live: bool = False) -> dict[str, int]:
    """The outcome of a flip at each of ``positions``. ``live``: the positions hold values of live
    rows or index entries, so even a flip the reads do not meet (a key read from its index, say)
    must be found by ``check()``."""
    counts = {"refused": 0, "found": 0, "same": 0}
    for position in positions:
        damaged = flipped(data, position, rng)
        fresh(path, damaged)
        try:
            result = outcome(path, expected)
            if result == "same" and live:
                store = SQLiteStore(path)
                assert not store.check(raises=False).ok, "a flip in a live row that reads back the same escaped check()"
                store.close()
            counts[result] += 1
        except AssertionError as error:
            raise AssertionError(f"byte {position} of {len(data)}: {error}") from error
    return counts


def test_a_sound_ledger_reads_back_and_passes_check(original, tmp_path):
    data, expected, _, _ = original
    path = tmp_path / "ledger.db"
    fresh(path, data)
    store = SQLiteStore(path)
    assert read_all(store) == expected
    report = store.check()
    assert report.ok and report.tables == {"ledger_audit": 1, "ledger_events": 20, "ledger_meta": 9,
                                           "ledger_pending": 3, "ledger_snapshots": 2}
    meta, position, events, pending = expected[:4]
    assert position == (22, 1) and meta["epoch"] == 1 and len(pending) == 3
    assert {e[0] for e in events} == {DECIDE, LEARN, CLOSE, GROW}
    store.close()
    assert path.read_bytes() == data  # reading changes nothing


def test_a_flip_inside_every_kind_of_row_is_refused_or_found(original, tmp_path):
    _, expected, compact, positions = original
    rng = random.Random(11)
    path = tmp_path / "ledger.db"
    for name, where in positions.items():
        counts = run(path, compact, expected, where, rng, live=True)
        if name in VALUES:  # a value the reads return (not a key, which a read may take from its index)
            assert counts["same"] == 0, (name, counts)


def test_a_flipped_byte_anywhere_is_refused_found_or_harmless(original, tmp_path):
    data, expected, _, _ = original
    rng = random.Random(2024)
    positions = sorted(rng.sample(range(len(data)), 200))
    counts = run(tmp_path / "ledger.db", data, expected, positions, rng)
    assert counts["refused"] > 0 and sum(counts.values()) == 200, counts


@pytest.mark.slow
def test_every_flipped_byte_of_the_rows_is_refused_found_or_harmless(original, tmp_path):
    data, expected, _, _ = original
    rng = random.Random(5)
    used = [p for p in range(len(data)) if data[p] != 0 or p < 100]  # zeros: mostly free space, sampled below
    positions = sorted(set(used) | set(rng.sample(range(len(data)), min(len(data), 2000))))
    counts = run(tmp_path / "ledger.db", data, expected, positions, rng)
    assert counts["refused"] > 0, counts


def test_a_row_edited_behind_the_ledgers_back_is_refused_naming_the_table_and_row(original, tmp_path):
    data, _, _, _ = original
    edits = {"ledger_events": ("UPDATE ledger_events SET detail = '{\"reason\": \"skipped\"}' WHERE seq = 6",
                               "row (ledger='judgment', seq=6)"),
             "ledger_meta": ("UPDATE ledger_meta SET value = '21' WHERE key = 'head'",
                             "row (ledger='judgment', key='head')"),
             "ledger_pending": ("UPDATE ledger_pending SET seq = 1 WHERE decision_id = 'decision-006'",
                                "row (ledger='judgment', decision_id='decision-006')"),
             "ledger_snapshots": ("UPDATE ledger_snapshots SET version = 11 WHERE seq = 22",
                                  "row (ledger='judgment', seq=22)"),
             "ledger_audit": ("UPDATE ledger_audit SET count = 0", "row (ledger='judgment', at=")}
    for table, (statement, row) in edits.items():
        path = tmp_path / f"{table}.db"
        fresh(path, data)
        connection = sqlite3.connect(path)
        with connection:
            connection.execute(statement)
        connection.close()
        store = SQLiteStore(path)
        with pytest.raises(StoreCorrupted) as raised:
            read_all(store)
        assert str(path) in str(raised.value) and f"table {table}: {row}" in str(raised.value)
        report = store.check(raises=False)
        assert len(report.problems) == 1 and f"table {table}: {row}" in report.problems[0], report.problems
        store.close()


def test_a_row_moved_to_another_ledger_is_refused(original, tmp_path):
    """The checksum covers the ledger's name: a row copied under another name does not match there."""
    data, _, _, _ = original
    path = tmp_path / "ledger.db"
    fresh(path, data)
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("INSERT INTO ledger_meta SELECT 'other', key, value, checksum FROM ledger_meta")
    connection.close()
    store = SQLiteStore(path)
    assert read_all(store)  # the original ledger reads as before
    with pytest.raises(StoreCorrupted, match="table ledger_meta: row \\(ledger='other'"):
        Ledger(store, "other").meta()
    store.close()


def test_a_dropped_ledger_table_is_refused_not_created_again(original, tmp_path):
    data, _, _, _ = original
    path = tmp_path / "ledger.db"
    fresh(path, data)
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("DROP TABLE ledger_pending")
    connection.close()
    store = SQLiteStore(path)
    with pytest.raises(StoreCorrupted, match="its catalog lists table ledger_pending, but it has no such table"):
        Ledger(store, NAME)
    assert not store.check(raises=False).ok
    store.close()
    shutil.copyfile(path, tmp_path / "kept.db")
    assert "ledger_pending" not in {name for (name,) in sqlite3.connect(tmp_path / "kept.db").execute(
        "SELECT name FROM sqlite_master")}


# -- a ledger written by the gae before the checksums ----------------------------------------------------------
OLD_TABLES = """
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
"""  # gae/ledger/sql.py before the checksums, as it created them


def old_ledger(connection: Any, prefix: str = "", blob: str = "BLOB", mark: str = "?") -> list[tuple]:
    """The tables and rows of a ledger as the gae before the checksums wrote them (its SQL and
    its ``Event.values``), through a DB-API ``connection``; returns the events' rows."""
    for statement in OLD_TABLES.format(p=prefix, blob=blob).split(";"):
        if statement.strip():
            connection.execute(statement)
    rows = np.random.default_rng(3).random((6, 4))

    def insert(table: str, values: list[tuple]) -> None:
        cursor = connection.cursor()
        cursor.executemany(f"INSERT INTO {prefix}{table} VALUES ({', '.join([mark] * len(values[0]))})", values)

    events = [("old", 1, DECIDE, "d0", '"invoice"', rows[0].tobytes(), '"approve"', None, None, 7, 0, None, 10.0,
               '{"confidence": 0.75, "probs": [0.75, 0.25], "names": ["approve", "reject"]}'),
              ("old", 2, LEARN, "d0", '"invoice"', rows[0].tobytes(), '"approve"', 1, None, 7, 0, 1, 11.0, "{}"),
              ("old", 3, DECIDE, "d1", "1", rows[1].tobytes(), "0", None, None, 8, 1, None, 12.0, "{}"),
              ("old", 4, DECIDE, "d2", '"refund"', rows[2].tobytes(), '"reject"', None, None, None, 1, None, 13.0,
               "{}"),
              ("old", 5, CLOSE, "d2", None, None, None, None, None, None, None, None, 14.0, '{"reason": "expired"}'),
              ("old", 6, GROW, None, None, None, None, None, None, None, None, None, None,
               '{"actions": ["escalate"], "categories": []}')]
    insert("ledger_events", events)
    insert("ledger_pending", [("old", "d1", 3)])
    insert("ledger_meta", [("old", "head", "6"), ("old", "epoch", "0"), ("old", "kind", '"JudgmentMemory"'),
                           ("old", "actions", '["approve", "reject"]')])
    state = io.BytesIO()
    torch.save({"centroids": torch.ones(2, 2, 4), "_extra_state": {"action_names": ["approve", "reject"]}}, state)
    insert("ledger_snapshots", [("old", 2, 1, state.getvalue())])
    insert("ledger_audit", [("old", 20.0, "gae", "undo", "", 0, 6)])
    return events


def assert_reads_the_old_rows(ledger: Ledger, events: list[tuple]) -> None:
    assert [(e.seq, e.kind, e.decision_id, e.category, None if e.row is None else e.row.tobytes(), e.action,
             e.confirmed, e.source_id, e.at, e.detail) for e in ledger.events(0)] == [
        (r[1], r[2], r[3], None if r[4] is None else json.loads(r[4]), r[5], None if r[6] is None else json.loads(r[6]),
         None if r[7] is None else bool(r[7]), r[9], r[12], json.loads(r[13])) for r in events]
    assert [e.decision_id for e in ledger.pending()] == ["d1"] and ledger.position() == (6, 0)
    assert ledger.meta() == {"head": 6, "epoch": 0, "kind": "JudgmentMemory", "actions": ["approve", "reject"]}
    snapshot = ledger.snapshot()
    assert snapshot is not None and (snapshot.seq, snapshot.version) == (2, 1)
    assert torch.equal(snapshot.state["centroids"], torch.ones(2, 2, 4))
    assert ledger.audit() == [{"at": 20.0, "actor": "gae", "action": "undo", "reason": "", "count": 0, "seq": 6}]
    assert ledger.count(CLOSE, "expired") == 1


def test_a_ledger_written_before_the_checksums_gains_them_and_keeps_working(tmp_path):
    path = tmp_path / "old.db"
    connection = sqlite3.connect(path)
    with connection:
        events = old_ledger(connection)
    connection.close()
    store = SQLiteStore(path)
    report = store.check()  # before: the tables are there, outside the catalog, and said to be unchecked
    assert report.ok and report.tables == {} and len(report.skipped) == 5
    assert all("not in the catalog" in line for line in report.skipped)
    ledger = Ledger(store, "old")  # adopts the tables: a checksum on every row
    assert_reads_the_old_rows(ledger, events)
    report = store.check()
    assert report.ok and not report.skipped and report.tables == {
        "ledger_audit": 1, "ledger_events": 6, "ledger_meta": 4, "ledger_pending": 1, "ledger_snapshots": 1}
    with ledger.writing():  # and it goes on
        head = ledger.append([Event(LEARN, "d1", 1, np.ones(4), 0, False, None, 8, 1, 2, 15.0)], 6)
    assert head == 7 and ledger.pending() == [] and ledger.events(6)[0].row.tolist() == [1.0] * 4
    store.close()
    connection = sqlite3.connect(path)  # a row changed now is found
    with connection:
        connection.execute("UPDATE ledger_events SET at = 99.0 WHERE seq = 1")
    connection.close()
    store = SQLiteStore(path)
    with pytest.raises(StoreCorrupted, match="table ledger_events: row \\(ledger='old', seq=1\\) does not match"):
        Ledger(store, "old").events(0)
    store.close()


def test_an_old_ledger_whose_file_is_damaged_gains_no_checksums(tmp_path):
    """The checksums vouch for the rows as they are: a file that fails SQLite's integrity check
    is refused before they are added, and left as it was."""
    path = tmp_path / "old.db"
    connection = sqlite3.connect(path)
    with connection:
        old_ledger(connection)
    page = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ledger_events_decision'").fetchone()
    page = page[0]
    size = connection.execute("PRAGMA page_size").fetchone()[0]
    connection.close()
    data = bytearray(path.read_bytes())
    start = (page - 1) * size + data[(page - 1) * size:page * size].index(b"d2")  # the largest key: order kept
    data[start + 1:start + 2] = b"9"  # the index now holds a key no row has
    path.write_bytes(bytes(data))
    store = SQLiteStore(path)  # quick_check does not compare an index with its table
    with pytest.raises(StoreCorrupted, match="before adding checksums to table ledger_meta: integrity_check") as error:
        Ledger(store, "old")
    assert str(path) in str(error.value)
    store.close()
    connection = sqlite3.connect(path)  # nothing was added (the file is in WAL mode now, as every store leaves it)
    assert [row[1] for row in connection.execute("PRAGMA table_info(ledger_meta)")] == ["ledger", "key", "value"]
    assert connection.execute("SELECT count(*) FROM sqlite_master WHERE name = 'gae_tables'").fetchone() == (0,)
    connection.close()


def test_a_postgres_ledger_written_before_the_checksums_gains_them(dsn):
    import psycopg

    from gae.storage import PostgresStore

    with psycopg.connect(dsn, autocommit=True) as connection:
        events = old_ledger(connection, prefix="memories_", blob="BYTEA", mark="%s")
    store = PostgresStore(dsn)
    ledger = Ledger(store, "old")
    assert_reads_the_old_rows(ledger, events)
    report = store.check()
    assert report.ok and report.tables["ledger_events"] == 6 and report.where.startswith("table 'memories' of ")
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("UPDATE memories_ledger_meta SET value = '7' WHERE key = 'head'")
    with pytest.raises(StoreCorrupted, match="table ledger_meta: row \\(ledger='old', key='head'\\)"):
        ledger.position()
    assert not store.check(raises=False).ok
    store.close()
