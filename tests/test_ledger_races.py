"""Races of the write protocol (build under the Decider's lock, append in the group commit, learn
after), each forced at the point where it bites by a hook on the committer, and the edges of the
store layer under it: a verification checked against the decision its call saw, decisions made
without writing kept through a rebuild while a commit carries them, one id decided by two threads,
one call's failure kept out of its batch, SQLite's ``:memory:`` and the writer queue's timeouts.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gae import Decider, JudgmentMemory
from gae.ledger import Ledger
from gae.storage import SQLiteStore
from gae.storage.sqlite_lock import WriterQueue


def memory() -> JudgmentMemory:
    return JudgmentMemory(["invoice"], ["approve", "reject"], 2)


def until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the other thread never got there"
        time.sleep(0.001)


def in_one_batch(committer, threads: list[threading.Thread]) -> None:
    """Run ``threads`` (each one call of a Decider on ``committer``) so that their calls queue
    into one batch: as if another thread were committing until all of them wait."""
    with committer._state:
        committer._committing = True
    for thread in threads:
        thread.start()
    until(lambda: len(committer._queue) == len(threads))
    with committer._state:
        committer._committing = False
        committer._state.notify_all()
    for thread in threads:
        thread.join(60)


def learn_rows(path: Path) -> list[list[float]]:
    store = SQLiteStore(path)
    try:
        return [list(event.row) for event in Ledger(store, "judgment").events(0, kinds=("learn",))]
    finally:
        store.close()


def test_a_verification_built_on_a_decision_another_writer_verified_and_reused_the_id_of_is_refused(tmp_path):
    path = tmp_path / "l.db"
    first, second = Decider(memory(), store=SQLiteStore(path)), Decider(memory(), store=SQLiteStore(path))
    first.decide([0.9, 0.1], "invoice", id="x")  # decision A
    second.sync()
    committer = first._durable.committer
    commit = committer.commit

    def meanwhile(call):  # between the build of first's verify (on A) and its commit:
        committer.commit = commit
        second.verify("x", "approve")  # A is verified elsewhere
        second.decide([0.1, 0.9], "invoice", id="x")  # and its id given to decision B
        return commit(call)

    committer.commit = meanwhile
    with pytest.raises(KeyError, match="'x' is not pending"):
        first.verify("x", "reject")
    assert learn_rows(path) == [[0.9, 0.1]]  # A learned once; B still pending, for the one who saw it
    assert [d.id for d in first.pending()] == ["x"] and first.pending()[0].category == "invoice"
    assert first.verify("x", "reject")["skipped"] is False
    assert learn_rows(path) == [[0.9, 0.1], [0.1, 0.9]]


def test_decisions_made_without_writing_survive_a_rebuild_while_a_commit_carries_them(tmp_path):
    path = tmp_path / "l.db"
    mine = Decider(memory(), store=SQLiteStore(path), durable_decisions=False)
    other = Decider(memory(), store=SQLiteStore(path))  # another process
    other.learn_one([0.9, 0.1], "approve", "invoice", source_id=1)
    mine.sync()
    mine.decide([0.3, 0.7], "invoice", id="u")  # not written: in mine's book only
    link = mine._durable
    take, inside, go = link.take_unflushed, threading.Event(), threading.Event()

    def taken(head=None, keep=None):
        events = take(head, keep)
        if head is not None and events and not inside.is_set():
            inside.set()  # in the committer's transaction, u taken from the unwritten ones
            go.wait(30)
        return events

    link.take_unflushed = taken
    other.forget_([1])  # a deletion elsewhere: mine's next look rebuilds
    writer = threading.Thread(target=lambda: mine.learn_one([0.5, 0.5], "reject", "invoice", source_id=2))
    writer.start()
    assert inside.wait(30)
    mine.decide([0.1, 0.9], "invoice", id="v")  # rebuilds while u is in flight
    go.set()
    writer.join(30)
    mine.sync()
    fresh = Decider(memory(), store=SQLiteStore(path))
    assert sorted(d.id for d in mine.pending()) == sorted(d.id for d in fresh.pending()) == ["u", "v"]
    assert mine.verify("u", "approve")["skipped"] is False


def test_one_id_decided_by_two_threads_at_once_is_pending_once_with_the_winners_factors(tmp_path):
    path = tmp_path / "l.db"
    decider = Decider(memory(), store=SQLiteStore(path))
    committer = decider._durable.committer
    commit, built, out = committer.commit, threading.Event(), {}

    def held(call):  # the first call waits in the commit until the second has built
        if call.events[0].row[0] == 0.9:
            built.wait(30)
        return commit(call)

    committer.commit = held

    def decide(x: float) -> None:
        try:
            out[x] = decider.decide([x, round(1 - x, 1)], "invoice", id="x").id
        except ValueError as error:
            out[x] = str(error)
        finally:
            built.set()

    first = threading.Thread(target=decide, args=(0.9,))
    first.start()
    until(lambda: "x" in decider._made)
    decide(0.1)
    first.join(30)
    assert out[0.9] == "x" and "already pending" in out[0.1]
    committer.commit = commit
    decider.verify("x", "approve")
    assert learn_rows(path) == [[0.9, 0.1]]  # the winner's factors, learned once


def test_a_call_the_store_refuses_fails_alone_not_the_calls_sharing_its_transaction(tmp_path, monkeypatch):
    path = tmp_path / "l.db"
    decider = Decider(memory(), store=SQLiteStore(path))
    pending = decider.decide([0.9, 0.1], "invoice")
    committer, append = decider._durable.committer, Ledger.append

    def refusing(self, events, head, move_head=True):
        if any(event.outcome == "refused" for event in events):
            raise RuntimeError("the store refuses this row")
        return append(self, events, head, move_head)

    monkeypatch.setattr(Ledger, "append", refusing)
    out = {}

    def run(name, call):
        try:
            out[name] = call()
        except Exception as error:  # noqa: BLE001 - what each call raised is the check
            out[name] = error

    threads = [threading.Thread(target=run, args=("verify", lambda: decider.verify(pending.id, "approve"))),
               threading.Thread(target=run, args=("learn", lambda: decider.learn_one([0.2, 0.8], "reject", "invoice",
                                                                                    outcome="refused")))]
    in_one_batch(committer, threads)
    assert out["verify"]["skipped"] is False and isinstance(out["learn"], RuntimeError)
    assert learn_rows(path) == [[0.9, 0.1]] and int(decider.memory.num_decisions) == 1


def test_a_decider_on_sqlite_in_memory_writes_where_it_reads(tmp_path):
    store = SQLiteStore(":memory:")
    decider = Decider(memory(), store=store)
    made = decider.decide([0.9, 0.1], "invoice")
    decider.verify(made.id, "approve")
    assert store.writer() is store
    assert Ledger(store, "judgment").position() == (2, 0)
    assert decider.decision(made.id).id == made.id
    assert int(Decider(memory(), store=store).memory.num_decisions) == 1
    store.close()


def test_writes_that_time_out_behind_a_stuck_writer_leave_at_most_one_thread_and_file(tmp_path):
    path = str(tmp_path / "q.db")
    stuck = open(path + ".ledger-lock", "a+b")  # noqa: SIM115 - another process's lock, held throughout
    fcntl.flock(stuck, fcntl.LOCK_EX)
    queue = WriterQueue(path)
    files, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for _ in range(50):
        with pytest.raises(TimeoutError, match="nothing of this call was written"):
            with queue.held(0.001):
                pass
    assert threading.active_count() - threads <= 1 and len(os.listdir("/proc/self/fd")) - files <= 2
    fcntl.flock(stuck, fcntl.LOCK_UN)
    with queue.held(5.0):  # the lock comes back at once, and the stranded wait lets go of it
        pass
    queue.close()
    stuck.close()


def test_a_second_connection_in_a_process_keeps_its_sqlite_locks_and_another_process_closing_keeps_the_log(
        tmp_path):
    # closing any descriptor of the database file drops every POSIX lock the process holds on it, SQLite's
    # included: a process reading the header again for its writer() (or a second store) lost them, and the
    # next process to close thought it was the last, checkpointed and deleted the write-ahead log under it
    path = tmp_path / "l.db"
    store = SQLiteStore(path)
    decider = Decider(memory(), store=store)  # (its writer: a second connection to the file)
    second = SQLiteStore(path)  # and a second store object in the same process
    decider.verify(decider.decide([0.9, 0.1], "invoice").id, "approve")
    child = ("import sys; sys.path.insert(0, sys.argv[1]); from gae import Decider, JudgmentMemory; "
             "from gae.storage import SQLiteStore; s = SQLiteStore(sys.argv[2]); "
             "d = Decider(JudgmentMemory(['invoice'], ['approve', 'reject'], 2), store=s); "
             "d.verify(d.decide([0.1, 0.9], 'invoice').id, 'reject'); d.close(); s.close()")
    subprocess.run([sys.executable, "-c", child, str(Path(__file__).resolve().parents[1]), str(path)], check=True,
                   timeout=120)
    assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()  # still this process's
    decider.verify(decider.decide([0.5, 0.5], "invoice").id, "approve")
    second.close()
    decider.close()
    store.close()
    assert learn_rows(path) == [[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]]  # every acknowledged verification, once


def test_an_id_no_store_can_keep_is_refused_when_decided_not_when_written(tmp_path):
    decider = Decider(memory(), store=SQLiteStore(tmp_path / "l.db"), durable_decisions=False)
    for bad in ("abc\x00def", "\ud800"):
        with pytest.raises(ValueError, match="id must"):
            decider.decide([0.9, 0.1], "invoice", id=bad)
    made = decider.decide([0.9, 0.1], "invoice", id="fine")
    decider.sync()
    assert decider.verify(made.id, "approve")["skipped"] is False
    decider.close()


def test_a_decision_not_written_yet_whose_id_another_writer_made_pending_is_dropped_not_written_over_it(tmp_path):
    path = tmp_path / "l.db"
    lazy = Decider(memory(), store=SQLiteStore(path), durable_decisions=False)
    eager = Decider(memory(), store=SQLiteStore(path))
    lazy.decide([0.9, 0.1], "invoice", id="order-1")  # in lazy's book only
    eager.decide([0.1, 0.9], "invoice", id="order-1")  # written: the ledger's order-1
    lazy.sync()
    store = SQLiteStore(path)
    decided = [list(e.row) for e in Ledger(store, "judgment").events(0, kinds=("decide",))]
    store.close()
    assert decided == [[0.1, 0.9]]
    assert [d.id for d in lazy.pending()] == ["order-1"]
    assert list(lazy._book.open["order-1"].row) == [0.1, 0.9]  # lazy holds the ledger's order-1, eager's
    eager.verify("order-1", "reject")
    assert learn_rows(path) == [[0.1, 0.9]]


def test_close_writes_every_decision_that_returned_and_refuses_those_after_it(tmp_path):
    path = tmp_path / "l.db"
    decider = Decider(memory(), store=SQLiteStore(path), durable_decisions=False)
    returned: list[str] = []
    refused: list[BaseException] = []
    started = threading.Event()

    def deciding() -> None:
        started.set()
        while True:
            try:
                returned.append(decider.decide([0.3, 0.7], "invoice").id)
            except RuntimeError as error:
                refused.append(error)
                return

    threads = [threading.Thread(target=deciding) for _ in range(3)]
    for thread in threads:
        thread.start()
    started.wait(30)
    until(lambda: len(returned) > 50)
    decider.close()
    for thread in threads:
        thread.join(30)
    assert len(refused) == 3 and all("close()" in str(error) for error in refused)
    store = SQLiteStore(path)
    written = {e.decision_id for e in Ledger(store, "judgment").events(0, kinds=("decide",))}
    store.close()
    assert set(returned) <= written and len(returned) > 50


def test_a_verification_of_a_buffered_decision_dropped_in_its_own_commit_is_refused(tmp_path):
    path = tmp_path / "l.db"
    lazy = Decider(memory(), store=SQLiteStore(path), durable_decisions=False)
    eager = Decider(memory(), store=SQLiteStore(path))
    lazy.decide([0.9, 0.1], "invoice", id="x")  # not written
    committer = lazy._durable.committer
    commit = committer.commit

    def meanwhile(call):  # another writer takes the id between the build of lazy's verify and its commit
        committer.commit = commit
        eager.decide([0.1, 0.9], "invoice", id="x")
        return commit(call)

    committer.commit = meanwhile
    with pytest.raises(KeyError, match="'x' is not pending"):
        lazy.verify("x", "approve")  # its x was dropped: the verification is not eager's
    assert eager.verify("x", "reject")["skipped"] is False
    assert learn_rows(path) == [[0.1, 0.9]]


def test_a_forget_that_writes_buffered_decisions_never_writes_over_another_writers_id(tmp_path):
    path = tmp_path / "l.db"
    lazy = Decider(memory(), store=SQLiteStore(path), durable_decisions=False)
    eager = Decider(memory(), store=SQLiteStore(path))
    eager.learn_one([0.5, 0.5], "approve", "invoice", source_id=1)
    lazy.sync()
    lazy.decide([0.9, 0.1], "invoice", id="x")
    eager.decide([0.1, 0.9], "invoice", id="x")
    lazy.forget_([1])  # writes lazy's buffered decisions first
    store = SQLiteStore(path)
    decided = [list(e.row) for e in Ledger(store, "judgment").events(0, kinds=("decide",))]
    store.close()
    assert decided == [[0.1, 0.9]]


def test_a_batch_that_waits_out_the_lock_fails_once_not_once_per_call(tmp_path):
    path = tmp_path / "l.db"
    decider = Decider(memory(), store=SQLiteStore(path, timeout=0.5))
    other = SQLiteStore(path)  # another writer, holding the lock throughout
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with other.exclusive():
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    committer = decider._durable.committer
    waited: dict[int, tuple[str, float]] = {}

    def learn(i: int) -> None:
        began = time.monotonic()
        try:
            decider.learn_one([0.1 * i, 0.5], "approve", "invoice", source_id=100 + i)
            waited[i] = ("ok", time.monotonic() - began)
        except TimeoutError:
            waited[i] = ("TimeoutError", time.monotonic() - began)

    in_one_batch(committer, [threading.Thread(target=learn, args=(i,)) for i in range(4)])
    release.set()
    holder.join(30)
    assert sorted(kind for kind, _ in waited.values()) == ["TimeoutError"] * 4
    assert max(seconds for _, seconds in waited.values()) < 2.0  # one wait of 0.5 s, not five
    assert decider.learn_one([0.9, 0.5], "approve", "invoice", source_id=200)["skipped"] is False
    other.close()
