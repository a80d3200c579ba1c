"""The ledger's load test: W processes x T threads deciding and verifying on one ledger for S seconds, then its checks.

Every process opens one :class:`~gae.Decider` (serving a :class:`~gae.JudgmentMemory`) on the
same ledger of one store (SQLite or Postgres) and runs T threads on it. Each thread decides a
random case, keeps the decision's id in a small queue and verifies it after a random delay of 0
to ``delay_ms`` ms; one decision in ``HANDOFF`` is handed instead to the next process (through
its inbox, a queue every pool process holds), which verifies it after its own delay: a decision
made in one process, verified in another. They start together (a shared start time) and stop deciding at a deadline; the
decisions still queued then stay pending. Each process then calls ``sync()`` (with
``durable_decisions=False`` its last decisions are written then), waits for the others (a
barrier of files), calls ``sync()`` again and reports its final state.

:func:`check` then reads the ledger and verifies what the issue asks of many processes on one
ledger: every acknowledged verification present exactly once as a learn event, every
acknowledged decision pending, learned or closed (none lost), each process's final state equal
bit for bit to a memory in RAM replaying the ledger's learn and grow events serially in commit
order (:func:`gae.ledger.events.replay`), and a Decider reopened on the store (its snapshot and
the events after it) equal to that replay too. ``scripts/load_ledger.py`` runs the grid and
writes the tables.
"""

from __future__ import annotations

import heapq
import os
import queue
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory
from gae.ledger import CLOSE, DECIDE, LEARN, Ledger
from gae.ledger.events import replay as serial_replay

CATEGORIES = ("invoice", "refund", "payroll")
ACTIONS = ("approve", "reject", "escalate")
FACTORS = 6
LEDGER = "load"
SNAPSHOT_EVERY = 200  # verifications between snapshots: a reopen loads one and replays the rest
QUEUE = 8  # decided ids a thread keeps waiting for their verification
HANDOFF = 4  # one decision in HANDOFF is verified by the next process (when there are several)
BARRIER_TIMEOUT = 120.0  # seconds a process waits for the others at the end of a cell

_INBOXES: list[Any] = []  # one queue per task index, the same in every pool process (init)


def init(inboxes: list[Any]) -> None:
    """The pool's initializer: every process holds every inbox (task ``i`` reads ``inboxes[i]``),
    and has decided and verified on a ledger of its own once (the first call of a process pays
    for imports and first-use costs that no timed cell should)."""
    import tempfile

    _INBOXES[:] = inboxes
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        store = store_of("sqlite", str(Path(folder) / "warm.db"), "")
        with open_memory(store) as decider:
            for _ in range(3):
                decider.verify(decider.decide([0.5] * FACTORS, CATEGORIES[0]).id, ACTIONS[0])
        store.close()
    try:
        import gae.storage.postgres  # noqa: F401
    except ImportError:  # pragma: no cover - the extra is not installed
        pass


def ready(_: int) -> int:
    """A task that returns at once: handing one to every pool process has each import this module
    (and torch) before a timed cell starts."""
    return os.getpid()


def store_of(kind: str, where: str, table: str) -> Any:
    from gae.storage import PostgresStore, SQLiteStore

    if kind == "postgres":
        return PostgresStore(where, table=table)
    return SQLiteStore(where, synchronous="NORMAL" if kind == "sqlite-normal" else "FULL")


def config() -> JudgmentConfig:
    return JudgmentConfig.recommended()


def new_memory() -> JudgmentMemory:
    """The memory of every Decider of a cell, as it is before it opens the ledger (it has learned nothing)."""
    return JudgmentMemory(list(CATEGORIES), list(ACTIONS), FACTORS, config())


def open_memory(store: Any, durable_decisions: bool = True) -> Decider:
    """The Decider every process of a cell opens on the store's ledger."""
    return Decider(new_memory(), store=store, ledger=LEDGER, snapshot_every=SNAPSHOT_EVERY,
                   durable_decisions=durable_decisions)


def fingerprint(memory: Any) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of the memory's ``state_dict`` (a Decider's: its memory's) as (dtype, shape,
    bytes): equal means bit for bit."""
    memory = memory.memory if isinstance(memory, Decider) else memory
    return {key: (str(value.dtype), tuple(value.shape), value.detach().cpu().contiguous().numpy().tobytes())
            for key, value in memory.state_dict().items() if isinstance(value, torch.Tensor)}


def prepare(kind: str, where: str, table: str) -> None:
    """Create the store's tables and the ledger (its meta), so that the timed run measures calls, not the schema."""
    store = store_of(kind, where, table)
    open_memory(store).close()
    store.close()


def _truth(x: list[float], rng: random.Random) -> str:
    """The verified action of a case: set by its first factor, one in ten flipped at random."""
    action = ACTIONS[min(int(x[0] * len(ACTIONS)), len(ACTIONS) - 1)]
    return rng.choice(ACTIONS) if rng.random() < 0.1 else action


def work(kind: str, where: str, table: str, durable_decisions: bool, index: int, processes: int, threads: int,
         start: float, seconds: float, delay_ms: float, cell: int, folder: str) -> dict[str, Any]:
    """Process ``index`` of ``processes`` in cell ``cell``: ``threads`` threads on one Decider, from
    ``start`` (wall clock) for ``seconds``; returns the ids it was acknowledged, each call's
    latency (seconds) and its final state (after a barrier and a sync)."""
    torch.set_num_threads(1)
    store = store_of(kind, where, table)
    memory = open_memory(store, durable_decisions)
    inbox = _INBOXES[index]
    outbox = _INBOXES[(index + 1) % processes] if processes > 1 else None
    deadline = start + seconds
    results: list[dict[str, Any]] = [{"decided": [], "verified": [], "elsewhere": 0, "sent": 0, "received": 0,
                                      "decide": [], "verify": [], "errors": []} for _ in range(threads)]

    def run(thread: int) -> None:
        mine = results[thread]
        rng = random.Random(f"{cell}/{index}/{thread}")
        waiting: list[tuple[float, str, str, bool]] = []  # (due, id, action, decided elsewhere), a heap
        handed: list[tuple[str, str]] = []  # sent after this thread's next verify (its commit wrote them)
        while True:
            now = time.time()
            if now >= deadline:
                break
            while True:
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    break
                if item[0] == cell:  # (a late one of an earlier cell is dropped)
                    mine["received"] += 1
                    heapq.heappush(waiting, (now + rng.uniform(0, delay_ms) / 1e3, item[1], item[2], True))
            try:
                if waiting and waiting[0][0] <= now:
                    _, key, action, elsewhere = heapq.heappop(waiting)
                    began = time.perf_counter()
                    memory.verify(key, action)
                    mine["verify"].append(time.perf_counter() - began)
                    mine["verified"].append(key)
                    mine["elsewhere"] += elsewhere
                    if outbox is not None:
                        for handed_key, handed_action in handed:
                            outbox.put((cell, handed_key, handed_action))
                        mine["sent"] += len(handed)
                        handed.clear()
                elif len(waiting) < QUEUE:
                    x = [rng.random() for _ in range(FACTORS)]
                    category = rng.choice(CATEGORIES)
                    began = time.perf_counter()
                    decision = memory.decide(x, category)
                    mine["decide"].append(time.perf_counter() - began)
                    mine["decided"].append(decision.id)
                    if outbox is not None and rng.randrange(HANDOFF) == 0:
                        handed.append((decision.id, _truth(x, rng)))
                    else:
                        heapq.heappush(waiting, (now + rng.uniform(0, delay_ms) / 1e3, decision.id,
                                                 _truth(x, rng), False))
                else:
                    time.sleep(max(0.0, min(waiting[0][0], deadline) - now))
            except Exception as error:  # noqa: BLE001 - every failed call is reported, and fails the cell
                mine["errors"].append(f"{type(error).__name__}: {error}")

    late = max(0.0, time.time() - start)  # (a process that opened the ledger after the start runs for less)
    time.sleep(max(0.0, start - time.time()))
    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    memory.sync()  # this process's last decisions written (durable_decisions=False)
    Path(folder, f"cell{cell}.{index}.done").touch()
    waited = time.time() + BARRIER_TIMEOUT
    while sum(1 for _ in Path(folder).glob(f"cell{cell}.*.done")) < processes:
        if time.time() > waited:
            raise TimeoutError(f"cell {cell}: process {index} waited {BARRIER_TIMEOUT:g} s for the others")
        time.sleep(0.01)
    memory.sync()  # every other process's commits applied
    listed = ("decided", "verified", "decide", "verify", "errors")
    report: dict[str, Any] = {key: [x for r in results for x in r[key]] for key in listed}
    report.update({key: sum(r[key] for r in results) for key in ("elsewhere", "sent", "received")})
    report.update(index=index, late=late, state=fingerprint(memory),
                  pending=sorted(d.id for d in memory.pending()))
    memory.close()
    store.close()
    return report


def replay(ledger: Ledger) -> JudgmentMemory:
    """A memory in RAM fed the ledger's learn and grow events serially, in commit order."""
    return serial_replay(ledger, new_memory())


def check(kind: str, where: str, table: str, reports: list[dict[str, Any]]) -> dict[str, bool]:
    """The invariants after a cell (each True when the ledger kept its promise)."""
    decided = [key for r in reports for key in r["decided"]]
    verified = [key for r in reports for key in r["verified"]]
    store = store_of(kind, where, table)
    ledger = Ledger(store, LEDGER)
    with ledger.reading():
        events = ledger.events(0)
        head, _ = ledger.position()
        pending = {e.decision_id for e in ledger.pending()}
        expected = fingerprint(replay(ledger))
    learned = Counter(e.decision_id for e in events if e.kind == LEARN)
    closed = {e.decision_id for e in events if e.kind == CLOSE}
    decide_events = [e.decision_id for e in events if e.kind == DECIDE]
    reopened = open_memory(store)
    result = {
        "no_call_failed": not any(r["errors"] for r in reports),
        "unique_decision_ids": len(decided) == len(set(decided)) and len(decide_events) == len(set(decide_events)),
        "every_verification_learned_once": learned == Counter(verified),
        "no_pending_decision_lost": all(key in pending or key in learned or key in closed for key in decided),
        "events_gap_free": [e.seq for e in events] == list(range(1, head + 1)),
        "processes_equal_serial_replay": all(r["state"] == expected for r in reports),
        "processes_agree_on_pending": all(set(r["pending"]) == pending for r in reports),
        "reopen_equals_serial_replay": fingerprint(reopened) == expected,
        "reopen_pending_exact": {d.id for d in reopened.pending()} == pending == set(decided) - set(verified),
    }
    reopened.close()
    store.close()
    return result


def summary(reports: list[dict[str, Any]], seconds: float) -> dict[str, float]:
    """Throughput over the run (decisions and verifications per second, summed over processes),
    the p50 / p99 latency (ms) of decide and verify over every call of the cell, how many
    verifications were of a decision made by another process, the fewest and most calls a
    process made (how fairly the write lock went round) and how late the latest process started."""
    def percentile(values: list[float], q: float) -> float:
        return float(np.percentile(values, q) * 1e3) if values else float("nan")

    decide = [x for r in reports for x in r["decide"]]
    verify = [x for r in reports for x in r["verify"]]
    calls = [len(r["decide"]) + len(r["verify"]) for r in reports]
    return {"decisions_per_s": len(decide) / seconds, "verifications_per_s": len(verify) / seconds,
            "decide_p50_ms": percentile(decide, 50), "decide_p99_ms": percentile(decide, 99),
            "verify_p50_ms": percentile(verify, 50), "verify_p99_ms": percentile(verify, 99),
            "verified_elsewhere": sum(r["elsewhere"] for r in reports),
            "pending_at_end": sum(len(r["decided"]) for r in reports) - sum(len(r["verified"]) for r in reports),
            "fewest_calls": min(calls), "most_calls": max(calls), "latest_start_s": max(r["late"] for r in reports)}
