"""An EpisodicMemory's audit log is bounded: it keeps the newest records naming at most
``max_audit`` memory ids (a record naming none counts as one), while a store keeps the whole
trail. ``scripts/soak.py`` measures it flat over a long run (docs/soak.md)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from gae import EpisodicMemory
from gae.episodic.memory import MAX_AUDIT
from gae.storage import SQLiteStore

DIM = 4


def churn(memory: EpisodicMemory, steps: int, seed: int = 0) -> None:
    """One memory at a time over a small capacity, a delete now and then: adds, evictions, deletes."""
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids = memory.add(torch.randn(1, DIM, generator=generator), torch.rand(1, generator=generator), now=float(step))
        if step % 7 == 3:
            memory.delete(ids)


def records(memory: EpisodicMemory) -> list[tuple]:
    return [(r.action, r.time, r.ids, r.reason, r.version) for r in memory.audit_log]


def test_the_log_keeps_the_newest_max_audit_records() -> None:
    bounded, full = EpisodicMemory(DIM, capacity=3, max_audit=5), EpisodicMemory(DIM, capacity=3, max_audit=None)
    churn(bounded, 40)
    churn(full, 40)
    assert len(full.audit_log) > 40  # adds, evictions and deletes
    assert records(bounded) == records(full)[-5:]
    assert bounded.version == full.version  # the bound drops records, never counts
    assert EpisodicMemory(DIM).max_audit == MAX_AUDIT == 10_000


def test_a_batch_costs_its_ids_and_the_newest_record_always_stays() -> None:
    memory = EpisodicMemory(DIM, capacity=50, max_audit=100)
    generator = torch.Generator().manual_seed(0)
    for step in range(12):  # 30 ids an add; over capacity, evictions of 30
        memory.add(torch.randn(30, DIM, generator=generator), torch.rand(30, generator=generator), now=float(step))
    kept = memory.audit_log
    assert sum(max(1, len(r.ids)) for r in kept) <= 100 < sum(max(1, len(r.ids)) for r in kept) + 30
    assert kept[-1].version == memory.version
    big = EpisodicMemory(DIM, capacity=500, max_audit=10)
    big.add(torch.randn(300, DIM, generator=generator), torch.rand(300, generator=generator), now=0.0)
    assert [len(r.ids) for r in big.audit_log] == [300]  # one record over the bound: it stays alone
    big.delete([0], now=1.0)
    assert [r.action for r in big.audit_log] == ["delete"]


def test_the_log_is_a_copy() -> None:
    memory = EpisodicMemory(DIM, capacity=3, max_audit=4)
    churn(memory, 10)
    before = records(memory)
    log = memory.audit_log
    log.clear()
    assert records(memory) == before and len(before) == 4


def test_assigning_a_log_keeps_its_last_max_audit_records() -> None:
    memory = EpisodicMemory(DIM, capacity=3, max_audit=3)
    twin = EpisodicMemory(DIM, capacity=3, max_audit=None)
    churn(twin, 12)
    memory.audit_log = twin.audit_log
    assert memory.audit_log == twin.audit_log[-3:]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_a_bad_max_audit_is_refused_naming_it(bad) -> None:
    with pytest.raises((ValueError, TypeError), match="max_audit"):
        EpisodicMemory(DIM, max_audit=bad)


def test_state_dict_carries_the_bounded_log_and_a_smaller_bound_keeps_the_newest() -> None:
    memory = EpisodicMemory(DIM, capacity=3, max_audit=6)
    churn(memory, 30)
    state = memory.state_dict()
    assert len(state["_extra_state"]["audit_log"]) == 6
    same, smaller = EpisodicMemory(DIM, capacity=3, max_audit=6), EpisodicMemory(DIM, capacity=3, max_audit=2)
    same.load_state_dict(state)
    smaller.load_state_dict(state)
    assert same.audit_log == memory.audit_log and smaller.audit_log == memory.audit_log[-2:]


def test_copies_keep_the_bound_and_the_records() -> None:
    memory = EpisodicMemory(DIM, capacity=3, max_audit=4)
    churn(memory, 20)
    for twin in (copy.deepcopy(memory), pickle.loads(pickle.dumps(memory))):
        assert twin.audit_log == memory.audit_log and twin.max_audit == 4
        churn(twin, 5, seed=1)
        assert len(twin.audit_log) == 4


def test_a_memory_pickled_before_the_bound_keeps_every_record() -> None:
    memory = EpisodicMemory(DIM, capacity=3, max_audit=None)
    churn(memory, 20)
    state = memory.__getstate__()  # as an older gae pickled it: a plain list, no bound
    state["audit_log"] = list(state.pop("_audit"))
    del state["_max_audit"]
    old = EpisodicMemory.__new__(EpisodicMemory)
    old.__setstate__(state)
    assert old.max_audit is None and old.audit_log == memory.audit_log
    churn(old, 5, seed=1)  # five adds and their evictions: nothing dropped
    assert old.audit_log[:len(memory.audit_log)] == memory.audit_log and len(old.audit_log) >= len(memory.audit_log) + 5


def test_the_store_keeps_the_whole_trail_and_a_reopened_memory_the_newest(tmp_path) -> None:
    path = tmp_path / "memory.db"
    memory = EpisodicMemory(DIM, capacity=3, store=SQLiteStore(path), max_audit=5)
    churn(memory, 25)
    full = memory.store.audit()
    assert len(full) > 25 and [(e.action, e.time, e.ids, e.reason, e.version) for e in full[-5:]] == records(memory)
    assert memory.store.audit(last=3) == full[-3:] and memory.store.audit(last=0) == []
    assert memory.store.audit(last=len(full) + 10) == full
    for bad in (-1, 1.5, True):
        with pytest.raises((ValueError, TypeError), match="last"):
            memory.store.audit(last=bad)
    memory.store.close()
    reopened = EpisodicMemory(DIM, capacity=3, store=SQLiteStore(path), max_audit=4)
    assert records(reopened) == records(memory)[-4:] and reopened.version == memory.version
    churn(reopened, 3, seed=1)
    trail = reopened.store.audit()
    assert len(reopened.audit_log) == 4 and trail[:len(full)] == full and len(trail) > len(full)


def test_setting_max_audit_trims_the_log_at_once_and_is_checked() -> None:
    memory = EpisodicMemory(DIM, capacity=3, max_audit=None)
    churn(memory, 30)
    full = memory.audit_log
    memory.max_audit = 5
    assert memory.audit_log == full[-5:] and copy.deepcopy(memory).audit_log == full[-5:]
    for bad in (0, -2, 2.5, True):
        with pytest.raises((TypeError, ValueError), match="max_audit"):
            memory.max_audit = bad
    assert memory.max_audit == 5 and memory.audit_log == full[-5:]
