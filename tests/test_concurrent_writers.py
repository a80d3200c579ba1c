"""Many writers, one memory: processes and threads writing one store through their own EpisodicMemory.

Every acknowledged add is stored exactly once under an id no other writer got, every acknowledged
delete is gone, the audit holds one record per acknowledged mutation with versions 1, 2, 3, ... in
commit order, and a memory sees the other writers' changes on its next call. On SQLite and on a
real Postgres (pgserver), with several processes, and on SQLite with threads too.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from gae import EpisodicMemory
from gae.storage import SQLiteStore
from gae.storage.base import Change, StoreConflict

DIM = 8
CAPACITY = 100_000  # no evictions: every acknowledged add must be there at the end
CALLS = 60  # per writer


def make_store(kind: str, where: str) -> Any:
    if kind == "sqlite":
        return SQLiteStore(where)
    from gae.storage import PostgresStore

    return PostgresStore(where)


def writer(kind: str, where: str, name: str, seed: int) -> dict[str, Any]:
    """One writer's calls: adds of one or three memories, and deletes of some of its own; what it
    was told (the ids of each acknowledged add, the ids each delete removed)."""
    torch.set_num_threads(1)
    memory = EpisodicMemory(DIM, capacity=CAPACITY, store=make_store(kind, where))
    gen = torch.Generator().manual_seed(seed)
    added: list[int] = []
    deleted: list[int] = []
    for call in range(CALLS):
        if call == CALLS // 2:  # bad input in the middle of the load: a clear error, nothing written (check())
            bad = torch.randn(2, DIM, generator=gen)
            bad[1, 3] = float("nan")
            with pytest.raises(ValueError, match="embeddings"):
                memory.add(bad, 0.5, now=float(call))
        if call % 5 == 4 and added:
            victim = added[len(deleted) * 3 % len(added)]
            if victim not in deleted:
                memory.delete([victim], reason=f"{name} {call}")
                deleted.append(victim)
                continue
        n = 1 if call % 2 else 3
        ids = memory.add(torch.randn(n, DIM, generator=gen), 0.5, now=float(call),
                         content=[f"{name} call {call} row {i}" for i in range(n)])
        added.extend(ids.tolist())
    memory.store.close()
    return {"name": name, "added": added, "deleted": deleted}


def check(kind: str, where: str, reports: list[dict[str, Any]]) -> None:
    added = [i for report in reports for i in report["added"]]
    deleted = {i for report in reports for i in report["deleted"]}
    assert len(added) == len(set(added)), "two writers were given the same id"
    final = EpisodicMemory(DIM, capacity=CAPACITY, store=make_store(kind, where))
    live = final.column("ids").tolist()
    assert sorted(live) == sorted(set(added) - deleted)  # every acknowledged add present once, every delete gone
    audit = final.store.audit()
    mutations = [entry for entry in audit if entry.action != "reject"]
    assert [entry.version for entry in mutations] == list(range(1, len(mutations) + 1))  # gap-free, in order
    assert final.version == len(mutations)
    acknowledged = len(deleted) + sum(len(report["added"]) for report in reports)  # ids recorded by the audit
    assert sum(len(entry.ids) for entry in mutations) == acknowledged
    assert sorted(i for entry in mutations if entry.action == "add" for i in entry.ids) == sorted(added)
    assert {i for entry in mutations if entry.action == "delete" for i in entry.ids} == deleted
    final.store.close()


def run_processes(kind: str, where: str, writers: int) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    with context.Pool(writers) as pool:
        return pool.starmap(writer, [(kind, where, f"w{i}", i) for i in range(writers)])


def test_processes_writing_one_sqlite_file_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.db")
    EpisodicMemory(DIM, capacity=CAPACITY, store=SQLiteStore(path)).store.close()  # the tables exist
    check("sqlite", path, run_processes("sqlite", path, 3))


def test_threads_writing_one_sqlite_file_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.db")
    reports: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda i=i: reports.append(writer("sqlite", path, f"t{i}", 10 + i)))
               for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reports) == 3
    check("sqlite", path, reports)


def test_a_memory_sees_another_writers_changes_on_its_next_call(tmp_path):
    path = tmp_path / "shared.db"
    a = EpisodicMemory(DIM, capacity=100, store=SQLiteStore(path))
    b = EpisodicMemory(DIM, capacity=100, store=SQLiteStore(path))
    ids = a.add(torch.randn(2, DIM), 0.5)
    found = b.retrieve(torch.randn(1, DIM), now=1.0, k=5)  # b's next call reads a's add
    assert set(found.ids[0][found.ids[0] >= 0].tolist()) == set(ids.tolist()) and len(b) == 2
    more = b.add(torch.randn(1, DIM), 0.5)  # and b's add takes the next id, not a colliding one
    assert more.tolist() == [int(ids.max()) + 1] and b.version == 2
    a.delete(more)
    assert len(b.retrieve(torch.randn(1, DIM), now=1.0, k=5).ids[0].ne(-1).nonzero()) == 2


def test_a_commit_on_a_moved_store_writes_nothing(tmp_path):
    store = SQLiteStore(tmp_path / "shared.db")
    memory = EpisodicMemory(DIM, capacity=100, store=store)
    memory.add(torch.randn(1, DIM), 0.5)
    before = store.audit()
    with pytest.raises(StoreConflict, match="at version 1, not 0: another writer committed first"):
        store.commit(Change(version=1, next_id=1, base_version=0))
    assert store.audit() == before and store.stored_version() == 1


def test_a_writer_that_cannot_get_the_lock_says_so_and_writes_nothing(tmp_path):
    import sqlite3

    path = tmp_path / "shared.db"
    memory = EpisodicMemory(DIM, capacity=100, store=SQLiteStore(path, timeout=0.05))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    with pytest.raises(TimeoutError, match="another writer held the write lock for more than 0.05 s"):
        memory.add(torch.randn(1, DIM), 0.5)
    holder.execute("ROLLBACK")
    holder.close()
    assert memory.store.audit() == [] and memory.store.stored_version() == 0  # nothing of the call was written
    assert memory.add(torch.randn(1, DIM), 0.5).tolist() == [0]


def test_a_hold_that_rolls_back_marks_the_memories_that_wrote_in_it_stale(tmp_path):
    """A caller's own exclusive() block that raises undoes the calls made in it: the memory that
    made them reloads on its next call instead of keeping ids the store never kept."""
    path = tmp_path / "shared.db"
    a = EpisodicMemory(DIM, capacity=100, store=SQLiteStore(path))
    b = EpisodicMemory(DIM, capacity=100, store=SQLiteStore(path))
    with pytest.raises(KeyError), a.store.exclusive():
        assert a.add(torch.randn(1, DIM), 0.5).tolist() == [0]
        raise KeyError("the caller's block fails after the add")
    assert b.add(torch.randn(1, DIM), 0.5).tolist() == [0]  # the store never kept a's id 0
    assert a.add(torch.randn(1, DIM), 0.5).tolist() == [1]  # a reloaded: b's row 0 is in its index, its own is not
    assert a.column("ids").tolist() == [0, 1] and torch.allclose(a.column("embeddings")[0], b.column("embeddings")[0])


def test_a_closed_store_refuses_writes_and_the_index_stays_the_stores(tmp_path):
    store = SQLiteStore(tmp_path / "shared.db")
    memory = EpisodicMemory(DIM, capacity=100, store=store)
    memory.add(torch.randn(1, DIM), 0.5)
    store.close()
    with pytest.raises(RuntimeError, match="add: the store is closed"):
        memory.add(torch.randn(2, DIM), 0.5)
    assert len(memory) == 1 and memory.retrieve(torch.randn(1, DIM), now=1.0, k=5).ids[0].ne(-1).sum() == 1


@pytest.fixture(scope="module")
def postgres_dsn(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real Postgres (pgserver) for this module's tests, each of which uses a table of its own."""
    pgserver = pytest.importorskip("pgserver")
    pytest.importorskip("psycopg")
    server = pgserver.get_server(Path(tmp_path_factory.mktemp("pgdata")), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def test_processes_writing_one_postgres_table_lose_nothing(postgres_dsn):
    EpisodicMemory(DIM, capacity=CAPACITY, store=make_store("postgres", postgres_dsn)).store.close()
    check("postgres", postgres_dsn, run_processes("postgres", postgres_dsn, 3))


KILLED_WRITER = r"""
import sys, torch
from gae import EpisodicMemory
from tests.test_concurrent_writers import killable_store
kind, where, log, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
memory = EpisodicMemory(8, capacity=100000, store=killable_store(kind, where))
gen = torch.Generator().manual_seed(seed)
with open(log, "a") as acknowledged:
    for call in range(100000):
        n = 1 + call % 3
        ids = memory.add(torch.randn(n, 8, generator=gen), 0.5, now=float(call), content=["x"] * n)
        acknowledged.write(" ".join(map(str, ids.tolist())) + "\n")
        acknowledged.flush()
"""


def killable_store(kind: str, where: str) -> Any:
    """The store of the killed-writer test: a SQLite file, or a Postgres table of its own."""
    if kind == "sqlite":
        return SQLiteStore(where)
    from gae.storage import PostgresStore

    return PostgresStore(where, table="killed")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_writer_killed_mid_call_under_load_leaves_the_store_consistent(kind, tmp_path, request):
    """Two writer processes; one is killed with SIGKILL while it writes, then the other. What each
    acknowledged is stored once; a call in flight landed whole (with its audit record) or not at
    all; versions stay gap-free; and the store takes writes again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    where = str(tmp_path / "shared.db") if kind == "sqlite" else request.getfixturevalue("postgres_dsn")
    EpisodicMemory(DIM, capacity=CAPACITY, store=killable_store(kind, where)).store.close()
    logs = [tmp_path / f"writer{i}.log" for i in range(2)]
    root = str(Path(__file__).resolve().parents[1])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    writers = [subprocess.Popen([sys.executable, "-c", KILLED_WRITER, kind, where, str(log), str(i)], env=environment)
               for i, log in enumerate(logs)]
    try:
        deadline = time.monotonic() + 60
        while sum(log.exists() and log.read_text().count("\n") >= 20 for log in logs) < 2:  # both are writing
            assert time.monotonic() < deadline and all(w.poll() is None for w in writers), "the writers did not run"
            time.sleep(0.05)
        writers[0].send_signal(signal.SIGKILL)
        writers[0].wait()
        written = logs[1].read_text().count("\n")
        while logs[1].read_text().count("\n") < written + 10:  # the other writes on, past the killed one's lock
            assert time.monotonic() < deadline and writers[1].poll() is None, "the other writer stopped"
            time.sleep(0.05)
    finally:
        for writer in writers:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
    known = [int(i) for log in logs for line in log.read_text().splitlines() for i in line.split()]
    store = killable_store(kind, where)
    final = EpisodicMemory(DIM, capacity=CAPACITY, store=store)
    live = final.column("ids").tolist()
    assert len(live) == len(set(live)) and set(known) <= set(live)  # nothing acknowledged lost, no id twice
    assert len(set(live) - set(known)) <= 2 * 3  # at most each writer's call in flight (up to 3 memories)
    audit = [entry for entry in store.audit() if entry.action != "reject"]
    assert [entry.version for entry in audit] == list(range(1, len(audit) + 1))
    assert sorted(i for entry in audit for i in entry.ids) == sorted(live)  # each landed whole, with its record
    assert final.add(torch.randn(1, DIM), 0.5).tolist() == [max(live) + 1]  # and the store takes writes again
    store.close()
