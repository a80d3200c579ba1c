"""The store's load test: W writer and R reader processes on one store for T seconds, then the invariants.

Each writer process adds one memory per call in its own scope (``w<i>``) and deletes one of its own
every tenth call; each reader retrieves the 5 best memories of a random query among the first
writer's scope (``w0``) only. They start together (a shared start time) and stop at a deadline.
:func:`check` then reopens the store and verifies what the issue asks of many writers: every
acknowledged add present exactly once, nothing acknowledged as deleted retrievable, one audit
record per acknowledged mutation, versions 1, 2, 3, ... in commit order, and no reader ever given a
memory outside ``w0``. ``scripts/load_store.py`` runs the grid and writes the tables.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from gae import EpisodicMemory

DIM = 32
CAPACITY = 1_000_000  # no evictions: every acknowledged add must be there at the end
READ_SCOPE = "w0"


def store_of(kind: str, where: str, table: str) -> Any:
    from gae.storage import PostgresStore, SQLiteStore

    return SQLiteStore(where) if kind == "sqlite" else PostgresStore(where, table=table)


def prepare(kind: str, where: str, table: str) -> dict[str, Any]:
    """Create the store's tables and its first memory, in the readers' scope (so that the timed run
    measures writes, not the schema, and readers have a scope to read from the start); its report."""
    store = store_of(kind, where, table)
    ids = EpisodicMemory(DIM, capacity=CAPACITY, store=store).add(torch.ones(1, DIM), 0.5, now=time.time(),
                                                                  scope=READ_SCOPE).tolist()
    store.close()
    return {"role": "writer", "index": 0, "added": ids, "deleted": [], "seen": [], "latencies": []}


def ready(_: int) -> int:
    """A task that returns at once: handing one to every pool process has each import this module
    (and torch) before a timed cell starts."""
    return os.getpid()


def work(kind: str, where: str, table: str, role: str, index: int, start: float, seconds: float) -> dict[str, Any]:
    """One process of the load: ``role`` ``'writer'`` or ``'reader'``, from ``start`` (wall clock)
    for ``seconds``; returns what it was told and each call's latency (seconds)."""
    torch.set_num_threads(1)
    store = store_of(kind, where, table)
    memory = EpisodicMemory(DIM, capacity=CAPACITY, store=store)
    gen = torch.Generator().manual_seed(1000 * (role == "reader") + index)
    added: list[int] = []
    deleted: list[int] = []
    seen: list[int] = []
    latencies: list[float] = []
    time.sleep(max(0.0, start - time.time()))
    deadline = start + seconds
    calls = 0
    while time.time() < deadline:
        began = time.perf_counter()
        if role == "reader":
            found = memory.retrieve(torch.randn(1, DIM, generator=gen), now=time.time(), k=5, scopes=[READ_SCOPE])
            seen.extend(i for i in found.ids[0].tolist() if i >= 0)
        elif calls % 10 == 9 and len(added) > len(deleted):
            victim = added[len(deleted)]
            memory.delete([victim], now=time.time(), reason=f"w{index} load")
            deleted.append(victim)
        else:
            added.extend(memory.add(torch.randn(1, DIM, generator=gen), 0.5, now=time.time(), scope=f"w{index}",
                                    content=[f"w{index} call {calls}"]).tolist())
        latencies.append(time.perf_counter() - began)
        calls += 1
    store.close()
    return {"role": role, "index": index, "added": added, "deleted": deleted, "seen": sorted(set(seen)),
            "latencies": latencies}


def check(kind: str, where: str, table: str, reports: list[dict[str, Any]]) -> dict[str, bool]:
    """The invariants after a run (each True when the store kept its promise)."""
    added = [i for r in reports for i in r["added"]]
    deleted = {i for r in reports for i in r["deleted"]}
    in_read_scope = {i for r in reports if r["role"] == "writer" and f"w{r['index']}" == READ_SCOPE
                     for i in r["added"]}
    store = store_of(kind, where, table)
    final = EpisodicMemory(DIM, capacity=CAPACITY, store=store)
    live = final.column("ids").tolist()
    audit = [entry for entry in store.audit() if entry.action != "reject"]
    everything = store.retrieve(np.ones((1, DIM), dtype=np.float32) / DIM ** 0.5, now=time.time(),
                                k=max(1, len(live) + len(deleted)), scopes=None).ids[0].tolist()
    result = {
        "unique_ids": len(added) == len(set(added)) and len(live) == len(set(live)),
        "every_add_present_once": sorted(live) == sorted(set(added) - deleted),
        "no_deleted_retrievable": not deleted & set(everything),
        "one_audit_record_per_mutation": sorted(i for e in audit for i in e.ids) == sorted(added + list(deleted)),
        "versions_gap_free": [e.version for e in audit] == list(range(1, len(audit) + 1)),
        "readers_in_scope": all(i in in_read_scope for r in reports for i in r["seen"]),
    }
    store.close()
    return result


def summary(reports: list[dict[str, Any]], seconds: float) -> dict[str, float]:
    """Throughput over the run (write calls, memories added and retrieve calls per second) and the
    p50 / p99 latency (ms) of write calls (adds and deletes) and retrieves; the store's first
    memory, added before the run (:func:`prepare`), is not counted."""
    def of(role: str) -> tuple[int, list[float]]:
        chosen = [r for r in reports if r["role"] == role]
        return sum(len(r["latencies"]) for r in chosen), [x for r in chosen for x in r["latencies"]]

    writes, write_latencies = of("writer")
    reads, read_latencies = of("reader")

    def percentile(values: list[float], q: float) -> float:
        return float(np.percentile(values, q) * 1e3) if values else float("nan")

    adds = sum(len(r["added"]) for r in reports if r["latencies"])  # (the prepared first memory has no latency)
    return {"writes_per_s": writes / seconds, "adds_per_s": adds / seconds, "retrieves_per_s": reads / seconds,
            "write_p50_ms": percentile(write_latencies, 50), "write_p99_ms": percentile(write_latencies, 99),
            "retrieve_p50_ms": percentile(read_latencies, 50), "retrieve_p99_ms": percentile(read_latencies, 99)}
