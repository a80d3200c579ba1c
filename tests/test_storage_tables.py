"""The storage layer's checksummed tables, on SQLite and on a real Postgres: specs, round trips
of every column type, checksums that refuse a row changed behind the store's back (and
``check()`` that finds it), the catalog, the write and read blocks across threads and processes,
``data_version`` and the commit counter, erasure, closing, and permission errors."""

from __future__ import annotations

import ast
import math
import os
import pwd
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gae.storage import BLOB, INT, REAL, TEXT, Column, SQLiteStore, Store, StoreCorrupted, Table
from gae.storage.tables import CATALOG, normalised, row_checksum, spec_of, spec_text

ROOT = Path(__file__).resolve().parents[1]

NOTES = Table("notes", (Column("owner", TEXT, nullable=False), Column("n", INT, nullable=False),
                        Column("score", REAL), Column("body", TEXT), Column("data", BLOB)),
              key=("owner", "n"), indexes=(("score", ("owner", "score")),))
TWIN = Table("twin", NOTES.columns, key=NOTES.key)  # the same columns under another name
LOG = Table("log", (Column("at", REAL, nullable=False), Column("what", TEXT, nullable=False)))
COUNTER = Table("counter", (Column("name", TEXT, nullable=False), Column("value", INT, nullable=False)),
                key=("name",))

ROWS = [("alice", 1, 0.1, "hello", b"\x00\x01\x02"), ("alice", 2, -0.0, None, None),
        ("bob", 3, math.inf, "ünïcode ✓", b""), ("bob", -2**63, -1e308, "", b"\xff" * 100),
        ("carol", 2**63 - 1, 5e-324, "x" * 5000, bytes(range(256)) * 40)]


@pytest.fixture(params=["sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def opened(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Store, callable]]:
    """A new store of each kind, and a function that opens another store on the same data."""
    if kind == "sqlite":
        def again() -> Store:
            return SQLiteStore(tmp_path / "tables.db")
    else:
        dsn = request.getfixturevalue("dsn")
        from gae.storage import PostgresStore

        def again() -> Store:
            return PostgresStore(dsn, table="mem")
    stores = []

    def opener() -> Store:
        stores.append(again())
        return stores[-1]

    yield opener(), opener
    for store in stores:
        if not store.closed:
            store.close()


def raw(store: Store, statement: str, params: tuple = ()) -> list[tuple]:
    """A statement run behind the store's back, on a connection of its own."""
    if isinstance(store, SQLiteStore):
        connection = sqlite3.connect(store.path)
        with connection:
            found = connection.execute(statement, params).fetchall()
        connection.close()
        return found
    import psycopg

    with psycopg.connect(store._conn.info.dsn, autocommit=True) as connection:  # the test's own connection
        cursor = connection.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


def physical(store: Store, name: str) -> str:
    return name if isinstance(store, SQLiteStore) else f"mem_{name}"


# -- specs and checksums ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("arguments", "error"), [
    (("Notes", (Column("a", INT),)), "name must be lowercase"), (("n" * 23, (Column("a", INT),)), "at most 22"),
    (("notes", ()), "non-empty sequence of Column"), (("notes", (("a", INT),)), "non-empty sequence of Column"),
    (("notes", (Column("checksum", INT),)), "other than 'checksum'"),
    (("notes", (Column("a", "float"),)), "must have a type of"), (("notes", (Column("a", INT, 1),)), "nullable"),
    (("notes", (Column("a", INT), Column("a", TEXT))), "must be distinct"),
    (("notes", (Column("a", INT),), ("b",)), "key must be distinct columns"),
    (("notes", (Column("a", INT),), (), (("by_b", ("b",)),)), "must be on columns"),
    (("notes", (Column("a", INT),), (), (("x" * 20, ("a",)),)), "index suffix")])
def test_a_bad_spec_is_refused_naming_what_is_wrong(arguments, error):
    with pytest.raises(ValueError, match=error):
        Table(*arguments)


def test_rows_are_normalised_to_their_columns_types_and_bad_values_refused():
    assert normalised(NOTES, ("a", np.int64(3), np.float32(0.5), "t", bytearray(b"x"))) == ("a", 3, 0.5, "t", b"x")
    assert normalised(NOTES, ("a", True, -0.0, None, memoryview(b"y")))[1:3] == (1, 0.0)
    assert math.copysign(1.0, normalised(NOTES, ("a", 1, -0.0, None, None))[2]) == 1.0  # -0.0 is written as 0.0
    for row, error, kind in ((("a", 1.5, None, None, None), "column 'n' holds ints, got 1.5", TypeError),
                             (("a", 2**63, None, None, None), "holds int64 values", ValueError),
                             (("a", 1, "0.5", None, None), "column 'score' holds real numbers", TypeError),
                             (("a", 1, math.nan, None, None), "may not hold NaN", ValueError),
                             (("a", 1, None, b"t", None), "column 'body' holds str", TypeError),
                             (("a", 1, None, "a\x00b", None), "NUL character", ValueError),
                             (("a", 1, None, None, "x"), "column 'data' holds bytes, got str", TypeError),
                             ((None, 1, None, None, None), "column 'owner' may not be None", ValueError),
                             (("a", 1), "must be a sequence of 5 values", ValueError),
                             ("abcde", "must be a sequence of 5 values", ValueError)):
        with pytest.raises(kind, match=error):
            normalised(NOTES, row)


def test_a_checksum_is_keyed_by_the_table_and_the_types_of_the_values():
    row = ("a", 1, 0.5, "t", b"x")
    assert row_checksum("notes", row) == row_checksum("notes", list(row))
    assert row_checksum("notes", row) != row_checksum("twin", row)
    for other in (("a", 1.0, 0.5, "t", b"x"), ("a", "1", 0.5, "t", b"x"), ("a", 1, 0.5, b"t", b"x"),
                  ("a", True, 0.5, "t", b"x"), ("a", 1, 0.5, "t", "x"), ("a", 1, 0.5, "t", b"x", None),
                  ("a1", 0.5, "t", b"x", None), ("a", 1, 0.5, None, b"x"), ("a", 1, 0.5, "", b"x")):
        assert row_checksum("notes", other) != row_checksum("notes", row), other
    assert -2**63 <= row_checksum("notes", row) < 2**63
    assert spec_of("notes", spec_text(NOTES)) == NOTES
    assert NOTES.Row(*row).score == 0.5 and NOTES.names == ("owner", "n", "score", "body", "data")


# -- round trips -------------------------------------------------------------------------------------------------
def test_rows_of_every_type_read_back_exactly(opened):
    store, again = opened
    store.insert(NOTES, ROWS)
    found = again().select(NOTES, order="n")
    expected = sorted((normalised(NOTES, row) for row in ROWS), key=lambda r: r[1])
    assert [tuple(row) for row in found] == expected
    assert [tuple(map(type, row)) for row in found] == [tuple(map(type, row)) for row in expected]
    assert isinstance(found[0], NOTES.Row) and found[0].owner == "bob"
    assert [r.n for r in store.select(NOTES, "owner = ? AND score > ?", ("alice", -1.0), order="n DESC")] == [2, 1]
    assert [r.n for r in store.select(NOTES, order="n", limit=2)] == [-2**63, 1]
    assert store.select(NOTES, "body LIKE ?", ("h%",))[0].body == "hello"  # '%' stays a LIKE on Postgres
    assert store.count(NOTES) == 5 and store.count(NOTES, "owner = ?", ("bob",)) == 2
    assert store.select(NOTES, limit=0) == []


def test_upsert_replaces_and_delete_counts(opened):
    store, again = opened
    store.insert(NOTES, ROWS[:2])
    store.insert(NOTES, [("alice", 1, 9.5, "changed", None)], upsert=True)
    assert [tuple(r) for r in again().select(NOTES, "n = ?", (1,))] == [("alice", 1, 9.5, "changed", None)]
    with pytest.raises(Exception, match="(?i)unique|duplicate"):  # a key given twice without upsert: the database's
        store.insert(NOTES, [("alice", 1, 0.0, None, None)])
    assert store.delete(NOTES, "owner = ?", ("alice",)) == 2 and store.count(NOTES) == 0
    assert store.delete(NOTES) == 0
    with pytest.raises(ValueError, match="upsert needs a key: table 'log' has none"):
        store.insert(LOG, [(1.0, "x")], upsert=True)
    with pytest.raises(ValueError, match="upsert must be a bool"):
        store.insert(NOTES, [], upsert=1)


def test_a_table_never_created_reads_as_empty_and_is_created_by_its_first_write(opened):
    store, again = opened
    assert store.select(LOG) == [] and store.count(LOG) == 0 and store.delete(LOG) == 0
    assert raw(store, "SELECT count(*) FROM " + ("sqlite_master WHERE name = 'log'" if isinstance(store, SQLiteStore)
                                                 else "pg_class WHERE relname = 'mem_log'")) == [(0,)]
    store.insert(LOG, [(1.5, "first")])
    assert [tuple(r) for r in again().select(LOG)] == [(1.5, "first")]
    report = again().check()
    assert report.ok and report.tables == {"log": 1} and any("checksums of every row" in c for c in report.checks)


def test_a_bad_write_writes_nothing(opened):
    store, _ = opened
    store.insert(NOTES, ROWS[:1])
    with pytest.raises(TypeError, match="column 'n' holds ints"):
        store.insert(NOTES, [("dave", 7, None, None, None), ("dave", "8", None, None, None)])
    with pytest.raises(TypeError, match="table must be a gae.storage.Table"):
        store.select("notes")
    with pytest.raises(ValueError, match="the store's own catalog"):
        store.select(CATALOG)
    with pytest.raises(ValueError, match="limit must be None or an int >= 0"):
        store.select(NOTES, limit=-1)
    assert store.count(NOTES) == 1


# -- checksums and check() ----------------------------------------------------------------------------------------
def test_a_row_changed_behind_the_stores_back_is_refused_and_found(opened):
    store, again = opened
    store.insert(NOTES, ROWS)
    store.insert(TWIN, ROWS[:1])
    assert again().check().ok
    raw(store, f"UPDATE {physical(store, 'notes')} SET score = 0.25 WHERE n = 1")
    reader = again()
    with pytest.raises(StoreCorrupted) as raised:
        reader.select(NOTES, "owner = ?", ("alice",))
    assert str(raised.value).startswith(f"{reader.where} is damaged: table notes: row (owner='alice', n=1) does not "
                                        "match its checksum")
    assert [r.n for r in reader.select(NOTES, "owner = ?", ("bob",), order="n")] == [-2**63, 3]  # the sound rows
    report = reader.check(raises=False)
    assert report.problems == ("table notes: row (owner='alice', n=1) does not match its checksum",)
    with pytest.raises(StoreCorrupted, match="table notes: row"):
        reader.check()
    # a sound row copied into another table with the same columns does not match there
    raw(store, f"INSERT INTO {physical(store, 'twin')} SELECT * FROM {physical(store, 'notes')} WHERE n = 3")
    with pytest.raises(StoreCorrupted, match="table twin: row \\(owner='bob', n=3\\) does not match"):
        reader.select(TWIN)
    raw(store, f"UPDATE {physical(store, 'notes')} SET checksum = NULL WHERE n = 2")
    assert "table notes: row (owner='alice', n=2) has no checksum" in again().check(raises=False).problems


def test_the_catalog_refuses_what_does_not_match_it(opened):
    store, again = opened
    store.create_tables([NOTES, LOG])
    grown = Table("notes", (*NOTES.columns, Column("extra", INT)), key=NOTES.key)
    with pytest.raises(ValueError, match="table notes was created with the columns .*another version of gae"):
        again().create_tables([grown])
    reindexed = Table("notes", NOTES.columns, key=NOTES.key, indexes=(("body", ("body",)),))
    again().create_tables([reindexed])  # another index: added, and the catalog says so
    assert again().select(NOTES) == []
    raw(store, f"DROP TABLE {physical(store, 'log')}")
    with pytest.raises(StoreCorrupted, match="its catalog lists table log, but it has no such table"):
        again().select(LOG)
    assert "its catalog lists table log, but it has no such table" in again().check(raises=False).problems
    raw(store, f"UPDATE {physical(store, 'gae_tables')} SET spec = replace(spec, '\"n\"', '\"m\"')")
    with pytest.raises(StoreCorrupted, match="table gae_tables: row \\(name='notes'\\) does not match its checksum"):
        again().select(NOTES)


def test_an_unlisted_table_of_other_columns_is_refused_not_overwritten(opened):
    store, _ = opened
    raw(store, f"CREATE TABLE {physical(store, 'notes')} (owner TEXT, body TEXT)")
    with pytest.raises(StoreCorrupted, match="holds a table notes with the columns \\['owner', 'body'\\]"):
        store.insert(NOTES, ROWS[:1])
    raw(store, f"CREATE TABLE {physical(store, 'log')} (at DOUBLE PRECISION, what TEXT, checksum BIGINT)")
    with pytest.raises(StoreCorrupted, match="table log has checksums, but its catalog does not list it"):
        store.select(LOG)


def test_a_table_of_an_older_gae_is_adopted_with_the_checksums_it_would_have_written(opened):
    store, again = opened
    raw(store, f"CREATE TABLE {physical(store, 'counter')} (name TEXT NOT NULL PRIMARY KEY, value BIGINT NOT NULL)")
    for i in range(2500):  # more than one batch
        raw(store, f"INSERT INTO {physical(store, 'counter')} VALUES (?, ?)", (f"c{i}", i))
    assert store.count(COUNTER) == 2500  # a count reads no row: nothing to adopt yet
    found = store.select(COUNTER, "name = ?", ("c7",))  # the first read adopts it
    assert [tuple(r) for r in found] == [("c7", 7)]
    stored = dict(raw(store, f"SELECT name, checksum FROM {physical(store, 'counter')}"))
    assert stored == {f"c{i}": row_checksum("counter", (f"c{i}", i)) for i in range(2500)}
    assert again().check().tables == {"counter": 2500}


def test_check_verifies_a_store_of_tables_alone(opened, kind):
    store, again = opened
    store.insert(LOG, [(float(i), f"event {i}") for i in range(30)])
    report = again().check()
    assert report.ok and report.tables == {"log": 30} and (report.rows, report.audit) == (0, 0)
    if kind == "sqlite":
        assert SQLiteStore(":memory:").check().skipped == ("checksums: the file holds no store yet",)


# -- blocks, threads, processes ---------------------------------------------------------------------------------------
def test_a_write_block_lands_whole_or_not_at_all(opened):
    store, again = opened
    with pytest.raises(KeyError):
        with store.exclusive():
            store.insert(NOTES, ROWS[:2])
            assert store.count(NOTES) == 2  # the block sees its own writes
            raise KeyError("abandon")
    assert again().count(NOTES) == 0
    called = []
    with pytest.raises(RuntimeError, match="boom"):
        with store.exclusive():
            store.on_rollback(lambda: called.append(True))
            raise RuntimeError("boom")
    assert called == [True]
    with store.exclusive():
        store.insert(NOTES, ROWS[:2])
        with store.exclusive():  # re-entrant: one transaction
            store.delete(NOTES, "n = ?", (1,))
    assert [r.n for r in again().select(NOTES)] == [2]


def test_a_read_block_sees_one_view_while_another_connection_commits(opened):
    store, again = opened
    writer = again()
    store.insert(LOG, [(0.0, "before")])
    with store.reading():
        assert store.count(LOG) == 1
        writer.insert(LOG, [(1.0, "during")])  # another connection commits: the view does not move
        assert [r.what for r in store.select(LOG)] == ["before"]
        with pytest.raises(RuntimeError, match="a write block cannot start inside a read block"):
            store.insert(LOG, [(2.0, "refused")])
    assert [r.what for r in store.select(LOG, order="at")] == ["before", "during"]


def test_data_version_moves_with_other_connections_commits_only(opened, kind):
    store, again = opened
    store.create_tables([LOG])
    writer = again()
    if kind == "postgres":  # Postgres cannot tell: a reader always reads again
        assert store.data_version() is None
        return
    first = store.data_version()
    store.insert(LOG, [(0.0, "own")])
    assert store.data_version() == first  # this connection's commit: the commit counter says it
    writer.insert(LOG, [(1.0, "other")])
    second = store.data_version()
    assert second != first and store.data_version() == second
    with store.reading():
        view = store.data_version()
        writer.insert(LOG, [(2.0, "during")])
        assert store.data_version() == view  # as of the block's view
    assert store.commits == 0
    with store.exclusive():
        store.count_commit()
    assert store.commits == 1


def test_threads_sharing_one_store_take_turns(opened):
    store, _ = opened
    store.insert(COUNTER, [("hits", 0)])
    errors = []

    def work() -> None:
        try:
            for _ in range(40):
                with store.exclusive():  # read, then write: lost updates if two threads interleaved
                    (row,) = store.select(COUNTER, "name = ?", ("hits",))
                    store.insert(COUNTER, [("hits", row.value + 1)], upsert=True)
                with store.reading():
                    store.select(COUNTER)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and store.select(COUNTER)[0].value == 160


WORKER = """
import sys
sys.path.insert(0, sys.argv[1])
from gae.storage import SQLiteStore
from tests.test_storage_tables import COUNTER
store = SQLiteStore(sys.argv[2])
for _ in range(int(sys.argv[3])):
    with store.exclusive():
        (row,) = store.select(COUNTER, "name = ?", ("hits",))
        store.insert(COUNTER, [("hits", row.value + 1)], upsert=True)
store.close()
"""


def test_processes_sharing_one_sqlite_file_take_turns(tmp_path):
    path = tmp_path / "shared.db"
    store = SQLiteStore(path)
    store.insert(COUNTER, [("hits", 0)])
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT), str(path), "50"]) for _ in range(3)]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0, 0]
    assert store.select(COUNTER)[0].value == 150 and store.check().ok
    store.close()


# -- erasing and closing ------------------------------------------------------------------------------------------
def test_erase_leaves_no_byte_of_deleted_rows_in_any_sqlite_file(tmp_path):
    marker = b"QUOKKAZEBRA-" * 8
    folder = tmp_path / "db"
    folder.mkdir()
    store = SQLiteStore(folder / "tables.db")
    store.insert(NOTES, [("alice", i, float(i), f"note {i}", bytes(200)) for i in range(200)])
    store.insert(NOTES, [("secret", 1, 0.5, "x", marker)])

    def holding() -> list[str]:
        return sorted(p.name for p in folder.iterdir() if marker in p.read_bytes())

    assert holding() == ["tables.db-wal"]
    store.delete(NOTES, "owner = ?", ("secret",))
    assert holding() == ["tables.db-wal"]  # the control: deleted, still in the log's old pages
    with store.exclusive():
        store.erase([NOTES])  # inside a block: once it has committed
        assert holding()
    assert holding() == [] and store.count(NOTES) == 200
    store.close()


def test_close_closes_the_lock_file_and_a_closed_store_refuses_calls(tmp_path):
    path = tmp_path / "tables.db"
    store = SQLiteStore(path)
    store.insert(LOG, [(1.0, "x")])
    target = f"{path}.ledger-lock"

    def open_lock_files() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}") == target
            except OSError:
                continue
        return count

    if os.path.isdir("/proc/self/fd"):
        assert open_lock_files() == 1
    store.close()
    if os.path.isdir("/proc/self/fd"):
        assert open_lock_files() == 0
    for call in (lambda: store.select(LOG), lambda: store.insert(LOG, [(2.0, "y")]), store.data_version,
                 lambda: store.erase([LOG])):
        with pytest.raises(RuntimeError, match="the store is closed"):
            call()


# -- permissions --------------------------------------------------------------------------------------------------
def test_a_folder_or_file_the_process_may_not_write_is_a_permission_error(tmp_path, monkeypatch):
    """os.access answers as an unprivileged process would (the tests run as root, whom modes do not stop)."""
    path = tmp_path / "tables.db"
    SQLiteStore(path).close()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    with pytest.raises(PermissionError, match=f"may not create files in the folder {tmp_path} ") as raised:
        SQLiteStore(path)
    assert raised.value.filename == str(path) and not isinstance(raised.value, StoreCorrupted)
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(path) and mode == os.W_OK
                        else real(p, mode))
    with pytest.raises(PermissionError, match="may not write the SQLite store's file") as raised:
        SQLiteStore(path)
    assert raised.value.filename == str(path)
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="the folder of the SQLite store does not exist"):
        SQLiteStore(tmp_path / "missing" / "tables.db")


def as_nobody() -> int | None:
    """The uid of ``nobody`` when this process may become it (root, on a system with fork), else None."""
    if not hasattr(os, "fork") or os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


def opened_as(uid: int, path: Path) -> str:
    """What opening a SQLiteStore on ``path`` raises in a forked child running as ``uid`` (the
    modules are loaded already: no interpreter to start, wherever it lives)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            try:
                SQLiteStore(path).close()
                answer = "opened"
            except BaseException as error:  # noqa: BLE001 - reported to the parent
                answer = f"{type(error).__name__} {error}"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(child, 0)
    return answer


@pytest.mark.skipif(as_nobody() is None, reason="needs root, fork and a 'nobody' user to open as an unprivileged user")
def test_an_unprivileged_process_gets_a_permission_error_not_damage():
    uid = as_nobody()
    folder = Path(tempfile.mkdtemp(prefix="gae-permissions-"))  # (pytest's tmp_path is root's alone)
    try:
        os.chmod(folder, 0o755)  # others may read it, not write it
        store = SQLiteStore(folder / "tables.db")
        store.insert(LOG, [(1.0, "x")])
        store.close()
        os.chmod(folder / "tables.db", 0o666)  # the file is writable, its folder is not
        writable = folder / "open"
        writable.mkdir()
        os.chmod(writable, 0o777)
        SQLiteStore(writable / "tables.db").close()
        os.chmod(writable / "tables.db", 0o644)  # the folder is writable, the file is not
        assert opened_as(uid, folder / "tables.db").startswith(
            f"PermissionError [Errno 13] this process may not create files in the folder {folder} ")
        assert opened_as(uid, writable / "tables.db").startswith(
            "PermissionError [Errno 13] this process may not write the SQLite store's file")
        os.chmod(writable / "tables.db", 0o666)
        assert opened_as(uid, writable / "tables.db") == "opened"  # the control: with the permissions, it opens
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


# -- the layer's shape -------------------------------------------------------------------------------------------------
def test_storage_imports_nothing_above_it_and_loads_its_stores_lazily():
    for path in (ROOT / "gae" / "storage").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith("gae.") or name.startswith(("gae.storage", "gae.validation")), (path, name)
    code = ("import sys; import gae.storage.base; assert 'gae.storage.sqlite' not in sys.modules; "
            "from gae.storage import SQLiteStore, StoreCorrupted, Table; assert 'gae.storage.sqlite' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
