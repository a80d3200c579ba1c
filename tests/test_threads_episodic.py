"""One EpisodicMemory shared by many threads, in RAM and written through to SQLite.

Eight threads start together (a barrier) and each adds memories in a scope of its own, deletes
some of them, admits traces through a policy (one accepted, one refused), and retrieves; a
ninth thread takes copies (``copy.deepcopy``) of the in-RAM memory meanwhile. Checked:

- every call returned; the ids the adds acknowledged are all different;
- while the others write, a retrieval of a thread's own scope finds exactly the memories that
  thread has added and not deleted: every acknowledged add is there, nothing deleted is;
- ``version`` and the versions retrievals report only grow, as each thread sees them;
- at the end the live ids are the acknowledged adds less the acknowledged deletes, each with the
  embedding its thread added; the audit log holds one record per mutation, versions 1, 2, 3, ...;
- a fresh memory given the audit log's calls one by one ends with the same state; on SQLite, a
  memory reopened on the file holds the same index;
- every copy is of one state: its rows, provenance and audit agree with each other.

The heavy version (more calls per thread) is ``make test-slow``.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as nnf

from gae import AdmissionPolicy, EpisodicMemory
from gae.storage import SQLiteStore

DIM = 8
THREADS = 8
CAPACITY = 100_000  # no evictions: every acknowledged add must stay until deleted
POLICY = AdmissionPolicy()


@pytest.fixture(autouse=True)
def interleave() -> Iterator[None]:
    """Switch threads as often as CPython allows (and one torch thread per op, see test_threads_baselines)."""
    interval, torch_threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(1e-6)
    torch.set_num_threads(1)
    yield
    sys.setswitchinterval(interval)
    torch.set_num_threads(torch_threads)


def embeddings(rng: np.random.Generator, n: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal((n, DIM)).astype(np.float32))


class Writer:
    """One thread's calls and what it was told."""

    def __init__(self, memory: EpisodicMemory, thread: int, calls: int, seed: int) -> None:
        self.memory, self.thread, self.calls = memory, thread, calls
        self.rng = np.random.default_rng([seed, thread])
        self.added: dict[int, torch.Tensor] = {}  # acknowledged id -> the embedding given
        self.deleted: list[int] = []
        self.live: list[int] = []
        self.versions: list[int] = []
        self.admits = 0  # admit_and_add calls: one refused trace each
        self.adds = 0  # calls that added (one version each)
        self.problems: list[str] = []

    def run(self) -> None:
        memory, t = self.memory, self.thread
        for call in range(self.calls):
            now = float(call)
            draw = self.rng.random()
            if draw < 0.4 or not self.live:
                rows = embeddings(self.rng, int(self.rng.integers(1, 3)))
                self.acknowledge(memory.add(rows, 0.5, scope=t, now=now), rows)
            elif draw < 0.55:
                victim = self.live.pop(int(self.rng.integers(len(self.live))))
                assert memory.delete([victim], now=now, reason=f"thread {t}") == 1
                self.deleted.append(victim)
            elif draw < 0.65:
                rows = embeddings(self.rng, 2)
                traces = [{"embedding": rows[0], "importance": 0.5, "outcome": "success", "quality": 0.9, "scope": t},
                          {"embedding": rows[1], "importance": 0.5, "outcome": "failure", "quality": 0.9, "scope": t}]
                self.acknowledge(memory.admit_and_add(traces, POLICY, now=now), rows[:1])
                self.admits += 1
            else:
                found = memory.retrieve(embeddings(self.rng, 1), now=now, k=max(1, len(self.live)), scopes=[t])
                self.versions.append(found.version)
                ids = sorted(i for i in found.ids[0].tolist() if i >= 0)
                if ids != sorted(self.live):
                    self.problems.append(f"thread {t} call {call}: its scope holds {ids}, it holds {sorted(self.live)}")
            self.versions.append(memory.version)

    def acknowledge(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        for i, row in zip(ids.tolist(), rows, strict=True):
            self.added[i] = row
            self.live.append(i)
        self.adds += 1


def consistent(memory: EpisodicMemory) -> str | None:
    """What is wrong inside one memory (a copy), or None: rows, provenance, ids and audit agree."""
    ids = memory.column("ids").tolist()
    if len(ids) != len(memory) or len(memory.source_ids) != len(memory) or len(set(ids)) != len(ids):
        return f"{len(memory)} rows, {len(ids)} ids ({len(set(ids))} different), {len(memory.source_ids)} sources"
    alive: set[int] = set()
    versions = []
    for record in memory.audit_log:
        if record.action == "add":
            alive |= set(record.ids)
        elif record.action in ("delete", "evict", "expire"):
            alive -= set(record.ids)
        if record.action != "reject":
            versions.append(record.version)
    if versions != list(range(1, memory.version + 1)):
        return f"audit versions {versions[:5]}... for version {memory.version}"
    if alive != set(ids):
        return f"the audit leaves {len(alive)} memories alive, the rows hold {len(ids)}"
    return None


def share(memory: EpisodicMemory, calls: int, seed: int, copies: bool) -> tuple[list[Writer], list[str]]:
    writers = [Writer(memory, t, calls, seed) for t in range(THREADS)]
    barrier = threading.Barrier(THREADS + 1)
    done = threading.Event()
    errors: list[BaseException] = []
    torn: list[str] = []
    torch_threads = torch.get_num_threads()

    def run(writer: Writer) -> None:
        try:
            torch.set_num_threads(torch_threads)  # OpenMP keeps one per thread: compute as the replay will
            barrier.wait()
            writer.run()
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def copier() -> None:
        try:
            barrier.wait()
            while not done.is_set():
                if copies:
                    problem = consistent(copy.deepcopy(memory))
                    if problem is not None:
                        torn.append(problem)
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=run, args=(w,)) for w in writers]
    watcher = threading.Thread(target=copier)
    for thread in [*workers, watcher]:
        thread.start()
    for thread in workers:
        thread.join()
    done.set()
    watcher.join()
    if errors:
        raise errors[0]
    return writers, torn


def replay(memory: EpisodicMemory, writers: list[Writer]) -> EpisodicMemory:
    """A fresh in-RAM memory given, one by one, the calls the audit log records, in its order."""
    given = {i: (row, w.thread) for w in writers for i, row in w.added.items()}
    twin = EpisodicMemory(DIM, CAPACITY)
    for record in memory.audit_log:
        if record.action == "add":
            rows = torch.stack([given[i][0] for i in record.ids])
            ids = twin.add(rows, 0.5, scope=given[record.ids[0]][1], now=record.time)
            assert ids.tolist() == list(record.ids)
        elif record.action == "delete":
            twin.delete(list(record.ids), now=record.time, reason=record.reason)
        else:
            assert record.action == "reject", record
            twin.admit_and_add([{"embedding": torch.zeros(DIM), "importance": 0.5, "outcome": "failure",
                                 "quality": 0.9}], POLICY, now=record.time)
    return twin


def same_index(a: EpisodicMemory, b: EpisodicMemory) -> None:
    assert a.version == b.version and a.column("ids").tolist() == b.column("ids").tolist()
    for name in ("embeddings", "created_at", "importance", "scope", "inserted"):
        assert torch.equal(a.column(name), b.column(name)), name
    assert a.audit_log == b.audit_log and a.source_ids == b.source_ids


def shared_run(backing: str, calls: int, seed: int, where: Path) -> None:
    store = SQLiteStore(where / f"run{seed}.db", synchronous="OFF") if backing == "sqlite" else None
    memory = EpisodicMemory(DIM, CAPACITY, store=store)
    writers, torn = share(memory, calls, seed, copies=store is None)
    assert not torn, torn[:3]
    problems = [p for w in writers for p in w.problems]
    assert not problems, problems[:3]
    acknowledged = [i for w in writers for i in w.added]
    assert len(set(acknowledged)) == len(acknowledged), "an id was given twice"
    for w in writers:
        assert w.versions == sorted(w.versions), f"thread {w.thread} saw the version go back"
    live = sorted(i for w in writers for i in w.live)
    assert memory.column("ids").tolist() == sorted(memory.column("ids").tolist()) == live
    embedding = dict(zip(memory.column("ids").tolist(), memory.column("embeddings"), strict=True))
    for w in writers:
        for i in w.live:
            torch.testing.assert_close(embedding[i], nnf.normalize(w.added[i], dim=0), rtol=0, atol=1e-6)
    deletes = sum(len(w.deleted) for w in writers)
    assert memory.version == sum(w.adds for w in writers) + deletes  # one per call that added, one per delete
    assert consistent(memory) is None, consistent(memory)
    assert sum(r.action == "reject" for r in memory.audit_log) == sum(w.admits for w in writers)
    assert sum(r.action == "delete" for r in memory.audit_log) == deletes
    same_index(memory, replay(memory, writers))
    if store is not None:
        store.close()
        reopened = EpisodicMemory(DIM, CAPACITY, store=SQLiteStore(where / f"run{seed}.db"))
        same_index(memory, reopened)
        assert reopened.store is not None
        reopened.store.close()


@pytest.mark.parametrize("backing", ["ram", "sqlite"])
def test_shared_memory_keeps_every_acknowledged_write(backing: str, tmp_path: Path) -> None:
    for seed in range(2):
        shared_run(backing, 40, seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("backing", ["ram", "sqlite"])
def test_heavy(backing: str, tmp_path: Path) -> None:
    for seed in range(5):
        shared_run(backing, 1000 if backing == "ram" else 250, seed, tmp_path)
