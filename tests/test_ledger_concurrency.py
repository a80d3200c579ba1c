"""Many writers, one ledger: processes and threads deciding and verifying through Deciders on one ledger.

Each process opens its own Decider (on a JudgmentMemory) on the shared ledger (SQLite file or a
real Postgres through pgserver) and runs two threads on it; some verifications are of decisions
another process made (read back through ``decider.pending()``), so two writers race for one
decision. At the end, after a barrier and ``sync()``, every process holds the state of the
ledger's serial replay, bit for bit (the memory, its referral and the pending decisions), and so
does a fresh reopen; every acknowledged verification is one learn event, every acknowledged skip
one close event, and every decision is learned, closed or still pending. Workers run as
``sys.executable -c`` children (no fork of a torch process) importing this module.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory
from gae.ledger import CLOSE, DECIDE, GROW, LEARN, Ledger
from gae.ledger.events import apply_event
from gae.ledger.events import replay as serial_replay
from gae.storage import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES, ACTIONS, FACTORS = ["a", "b"], ["approve", "reject"], 4
SNAPSHOT_EVERY = 25
BARRIER_S = 300.0  # a worker waiting this long for the others gives up (the parent reports it)


# -- the memory, its state, the serial replay ----------------------------------------------------
def make_store(kind: str, where: str) -> Any:
    if kind == "sqlite":
        return SQLiteStore(where)
    from gae.storage import PostgresStore

    return PostgresStore(where)


def new_memory() -> JudgmentMemory:
    return JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, JudgmentConfig.recommended())


def open_memory(kind: str, where: str, snapshot_every: int = SNAPSHOT_EVERY) -> Decider:
    """A Decider on the ledger ``judgment`` of the store at ``where`` (a new store object: another "process")."""
    return Decider(new_memory(), store=make_store(kind, where), snapshot_every=snapshot_every)


def close(decider: Decider) -> None:
    """Leave the ledger, and close the Decider's store (its owner is the test)."""
    decider.close()
    decider._durable.ledger.store.close()


def extra_of(decider: Decider, logs: bool = True) -> dict[str, Any]:
    """The memory's extra state but how the decision log happens to group its rows into calls, and
    the Decider's referral; without ``logs``, without the in-RAM logs (a Decider opened from a
    snapshot starts its logs there, by design: gae/decider/durable.py ``snapshot_state``). The
    pending decisions are compared apart."""
    extra = {**decider.memory.state_dict()["_extra_state"], "referral": decider.referral.state()}
    if not logs:
        extra = {k: v for k, v in extra.items() if not k.endswith("_log")}
    if isinstance(extra.get("decision_log"), dict):
        extra["decision_log"] = {k: v for k, v in extra["decision_log"].items()
                                 if k not in ("call_sizes", "call_logits")}
    return extra


def same(a: Any, b: Any) -> bool:
    """Equal, tensors by torch.equal, through dicts, lists and tuples."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def state_of(decider: Decider) -> dict[str, Any]:
    """What must be the same in every Decider on one ledger: the memory's tensors, the rest of its
    state and the referral, the version, the pending ids and the expired count."""
    state = decider.memory.state_dict()
    return {"tensors": {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)},
            "extra": extra_of(decider, logs=False), "with_logs": extra_of(decider), "version": int(decider.version),
            "pending": [d.id for d in decider.pending()], "expired": decider.expired_decisions}


def replay(ledger: Ledger) -> Decider:
    """A Decider in RAM that applied the ledger's events one by one, in order: its memory learned
    the learn and grow events (:func:`gae.ledger.events.apply_event`, held to a memory fed them
    apart and to :func:`gae.ledger.events.replay`), its referral the verified decisions, its book
    the decisions, closings and verifications."""
    ref, plain = Decider(new_memory()), new_memory()
    with ledger.reading():
        events = ledger.events(0)
        replayed = serial_replay(ledger, new_memory())
    for event in events:
        ref._apply(event)
        if event.kind in (LEARN, GROW):
            apply_event(plain, event)
    for memory in (plain, replayed):
        want = {k: v for k, v in ref.memory.state_dict().items() if isinstance(v, torch.Tensor)}
        assert_same_state({k: v for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}, want,
                          "apply_event and gae.ledger.events.replay")
    return ref


def assert_same_state(got: dict[str, Any], want: dict[str, torch.Tensor], what: str) -> None:
    bad = [k for k in want if k not in got or not torch.equal(got[k], want[k])]
    assert not bad and set(got) == set(want), f"{what}: tensors differ from the serial replay: {bad}"


# -- one writer thread ---------------------------------------------------------------------------
def run_thread(memory: Decider, seed: int, own: str, neighbour: str, calls: int, report: dict[str, Any],
               lock: threading.Lock) -> None:
    """Decide ``calls`` times under ids ``own<i>``; after each, maybe verify one of its own pending
    decisions, or one of ``neighbour``'s (taken from ``memory.pending()``: another process or
    thread decided it), or learn one unrelated example. Records every call that returned."""
    rng = random.Random(seed)
    mine: list[tuple[str, list[float]]] = []

    def verify(did: str, action: str, theirs: bool = False) -> None:
        skip = rng.random() < 0.05
        try:
            result = memory.verify(did, action, skip=skip)
        except KeyError:  # another writer verified it first: nothing written
            with lock:
                report["refused"].append(did)
            return
        with lock:
            if skip:
                assert result == {"skipped": True}
                report["skipped"].append(did)
            else:
                report["learned"].append(did)
            if theirs:
                report["crossed"].append(did)

    for i in range(calls):
        x = [rng.random() for _ in range(FACTORS)]
        decision = memory.decide(x, rng.choice(CATEGORIES), id=f"{own}{i}")
        assert decision.id == f"{own}{i}"
        with lock:
            report["decided"].append(decision.id)
        mine.append((decision.id, x))
        roll = rng.random()
        if roll < 0.4:
            did, x = mine.pop(rng.randrange(len(mine)))
            verify(did, "approve" if x[0] > 0.5 else "reject")
        elif roll < 0.75:
            theirs = [d.id for d in memory.pending() if d.id.startswith(neighbour)]
            if theirs:
                verify(rng.choice(theirs), rng.choice(ACTIONS), theirs=True)
        elif roll < 0.8:
            memory.learn_one([rng.random() for _ in range(FACTORS)], rng.choice(ACTIONS), rng.choice(CATEGORIES))
            with lock:
                report["learn_one"] += 1
    # what is left in `mine` stays pending (unless a neighbour verifies it)


def new_report() -> dict[str, Any]:
    return {"decided": [], "learned": [], "skipped": [], "refused": [], "crossed": [], "learn_one": 0, "errors": []}


def run_threads(memory: Decider, wid: int, workers: int, threads: int, calls: int,
                report: dict[str, Any]) -> None:
    """``threads`` threads on ``memory``; with one process, thread t's neighbour is thread t + 1,
    else every thread of process w verifies decisions of process w + 1."""
    lock = threading.Lock()

    def guarded(t: int) -> None:
        neighbour = f"w{wid}-t{(t + 1) % threads}-" if workers == 1 else f"w{(wid + 1) % workers}-"
        try:
            run_thread(memory, 1000 * wid + t, f"w{wid}-t{t}-", neighbour, calls, report, lock)
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            import traceback

            with lock:
                report["errors"].append(f"thread {t}: {error!r}\n{traceback.format_exc()}")

    started = [threading.Thread(target=guarded, args=(t,)) for t in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()


def process_main(kind: str, where: str, wid: str, workers: str, threads: str, calls: str, out: str) -> None:
    """One worker process: its threads, its report, the barrier, then its state after ``sync()``."""
    torch.set_num_threads(1)
    w, n = int(wid), int(workers)
    memory = open_memory(kind, where)
    report = new_report()
    run_threads(memory, w, n, int(threads), int(calls), report)
    folder = Path(out)
    (folder / f"w{w}.json.tmp").write_text(json.dumps(report))
    os.replace(folder / f"w{w}.json.tmp", folder / f"w{w}.json")
    (folder / f"w{w}.done").touch()
    deadline = time.monotonic() + BARRIER_S
    while sum((folder / f"w{i}.done").exists() for i in range(n)) < n:  # the others may still commit
        if time.monotonic() > deadline:
            sys.exit("barrier: the other workers did not finish")
        time.sleep(0.02)
    memory.sync()
    torch.save(state_of(memory), folder / f"w{w}.pt")


WORKER = "import sys; sys.path.insert(0, sys.argv[1]); from tests.test_ledger_concurrency import process_main; " \
         "process_main(*sys.argv[2:])"


def run_processes(kind: str, where: str, folder: Path, workers: int, threads: int, calls: int,
                  timeout: float = 600.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start the workers, wait for them; their reports and their final states."""
    close(open_memory(kind, where))  # the ledger exists before they race to create it
    logs = [open(folder / f"w{w}.err", "w") for w in range(workers)]  # noqa: SIM115
    processes = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT), kind, where, str(w), str(workers),
                                   str(threads), str(calls), str(folder)], stdout=logs[w], stderr=subprocess.STDOUT,
                                  cwd=ROOT) for w in range(workers)]
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
    for w, process in enumerate(processes):
        assert process.returncode == 0, f"worker {w} failed:\n{(folder / f'w{w}.err').read_text()[-4000:]}"
    reports = [json.loads((folder / f"w{w}.json").read_text()) for w in range(workers)]
    states = [torch.load(folder / f"w{w}.pt", weights_only=True) for w in range(workers)]
    return reports, states


# -- the checks ----------------------------------------------------------------------------------
def check_ledger(kind: str, where: str, reports: list[dict[str, Any]], states: list[dict[str, Any]],
                 logs: bool = False) -> None:
    """The ledger against what the writers were told, and their final states against its serial
    replay; with ``logs``, their in-RAM logs too (a writer that opened the ledger on a snapshot
    starts its logs there, so only for writers that opened it empty)."""
    for report in reports:
        assert not report["errors"], report["errors"]
    decided = [i for r in reports for i in r["decided"]]
    learned = [i for r in reports for i in r["learned"]]
    skipped = [i for r in reports for i in r["skipped"]]
    assert len(decided) == len(set(decided))
    assert len(learned) == len(set(learned)), "two writers were both told they verified one decision"
    assert not set(learned) & set(skipped), "one decision both learned and skipped"
    crossed = [i for r in reports for i in r["crossed"]]
    assert crossed, "no writer verified a decision another process (or thread) made"
    assert set(crossed) <= set(learned) | set(skipped)
    if len(reports) > 1:
        assert all(not i.startswith(f"w{w}-") for w, r in enumerate(reports) for i in r["crossed"])

    store = make_store(kind, where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        events = ledger.events(0)
        pending = [e.decision_id for e in ledger.pending()]
        snapshot = ledger.snapshot()
    learn_ids = Counter(e.decision_id for e in events if e.kind == LEARN and e.decision_id is not None)
    close_ids = Counter(e.decision_id for e in events if e.kind == CLOSE)
    decide_ids = Counter(e.decision_id for e in events if e.kind == DECIDE)
    assert learn_ids == Counter(learned), "the learn events are not the acknowledged verifications, once each"
    assert close_ids == Counter(skipped), "the close events are not the acknowledged skips, once each"
    assert decide_ids == Counter(decided)
    assert sum(e.kind == LEARN and e.decision_id is None for e in events) == sum(r["learn_one"] for r in reports)
    assert not set(pending) & (set(learned) | set(skipped))
    assert set(decided) == set(learned) | set(skipped) | set(pending), "an acknowledged decision was lost"
    assert pending, "some decisions should still be pending"
    if len(learned) + sum(r["learn_one"] for r in reports) >= SNAPSHOT_EVERY:
        assert snapshot is not None and snapshot.seq > 0

    ref = replay(ledger)
    want = {k: v for k, v in ref.memory.state_dict().items() if isinstance(v, torch.Tensor)}
    want_extra = extra_of(ref, logs=False)
    assert [d.id for d in ref.pending()] == pending
    for w, state in enumerate(states):
        assert_same_state(state["tensors"], want, f"writer {w} after sync")
        assert same(state["extra"], want_extra), f"writer {w}: the extra state differs from the serial replay's"
        if logs:
            assert same(state["with_logs"], extra_of(ref)), f"writer {w}: the logs differ from the serial replay's"
        assert state["pending"] == pending, f"writer {w}: pending decisions differ from the ledger's"
        assert state["version"] == states[0]["version"] == ref.version
        assert state["expired"] == ref.expired_decisions
    store.close()
    fresh = open_memory(kind, where)
    reopened = state_of(fresh)
    assert_same_state(reopened["tensors"], want, "a fresh reopen")
    assert same(reopened["extra"], want_extra), "a fresh reopen: the extra state differs from the serial replay's"
    assert reopened["pending"] == pending and reopened["version"] == states[0]["version"]
    if pending:  # the reopened Decider goes on: a decision left pending by a worker can be verified
        assert fresh.verify(pending[0], "approve")["skipped"] is False
        ledger = fresh._durable.ledger
        with ledger.reading():
            assert [e.decision_id for e in ledger.events(len(events) and events[-1].seq, kinds=(LEARN,))] \
                == [pending[0]]
    close(fresh)


# -- SQLite ----------------------------------------------------------------------------------------
def test_a_verification_lost_to_another_writer_raises_key_error(tmp_path):
    """(A regression: an error raised while building a call's events once came out as UnboundLocalError.)"""
    path = str(tmp_path / "ledger.db")
    a, b = open_memory("sqlite", path), open_memory("sqlite", path)
    decision = a.decide([0.1, 0.2, 0.3, 0.4], "a")
    assert [d.id for d in b.pending()] == [decision.id]
    a.verify(decision.id, "approve")  # a wins the race; b has not caught up yet
    with pytest.raises(KeyError, match="is not pending"):
        b.verify(decision.id, "reject")
    assert [d.id for d in b.pending()] == []
    other = b.decide([0.4, 0.3, 0.2, 0.1], "b")
    with pytest.raises(ValueError):  # a bad action: its own error, nothing written
        a.verify(other.id, "bogus")
    with pytest.raises(ValueError):  # bad factors
        a.decide([float("nan")] * FACTORS, "a")
    ledger = a._durable.ledger
    with ledger.reading():
        assert [e.kind for e in ledger.events(0)] == [DECIDE, LEARN, DECIDE]
    assert [d.id for d in a.pending()] == [other.id]
    close(a)
    close(b)


def test_two_processes_sharing_one_sqlite_ledger_end_as_its_serial_replay(tmp_path):
    path = str(tmp_path / "ledger.db")
    reports, states = run_processes("sqlite", path, tmp_path, workers=2, threads=2, calls=15)
    check_ledger("sqlite", path, reports, states)


@pytest.mark.slow
def test_four_processes_of_two_threads_sharing_one_sqlite_ledger_end_as_its_serial_replay(tmp_path):
    path = str(tmp_path / "ledger.db")
    reports, states = run_processes("sqlite", path, tmp_path, workers=4, threads=2, calls=40)
    check_ledger("sqlite", path, reports, states)


def test_eight_threads_sharing_one_memory_end_as_the_serial_replay(tmp_path):
    path = str(tmp_path / "ledger.db")
    memory = open_memory("sqlite", path)
    report = new_report()
    run_threads(memory, 0, 1, 8, 50, report)
    assert report["refused"], "threads should race for some decisions"
    memory.sync()
    check_ledger("sqlite", path, [report], [state_of(memory)], logs=True)
    close(memory)


# -- Postgres (pgserver) -----------------------------------------------------------------------
def test_two_processes_sharing_one_postgres_ledger_end_as_its_serial_replay(dsn, tmp_path):
    reports, states = run_processes("postgres", dsn, tmp_path, workers=2, threads=2, calls=8)
    check_ledger("postgres", dsn, reports, states)


@pytest.mark.slow
def test_four_processes_of_two_threads_sharing_one_postgres_ledger_end_as_its_serial_replay(dsn, tmp_path):
    reports, states = run_processes("postgres", dsn, tmp_path, workers=4, threads=2, calls=20)
    check_ledger("postgres", dsn, reports, states)


def test_four_threads_sharing_one_memory_on_postgres_end_as_the_serial_replay(dsn):
    memory = open_memory("postgres", dsn)
    report = new_report()
    run_threads(memory, 0, 1, 4, 8, report)
    memory.sync()
    check_ledger("postgres", dsn, [report], [state_of(memory)], logs=True)
    close(memory)
