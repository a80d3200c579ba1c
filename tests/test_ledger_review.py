"""The ledger's corner cases a hostile review found: ids given again, refused deletions with
buffered decisions, writers of different ``grow``, growth before a forget, calls that must be
refused, memories sharing one store object in threads, and the lock file."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from gae.episodic.store import SQLiteStore

CATEGORIES, ACTIONS, FACTORS = ["billing", "refund"], ["approve", "reject"], 3


def memory(path: Path, **options) -> JudgmentMemory:
    return JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, JudgmentConfig.recommended(),
                          store=options.pop("store", None) or SQLiteStore(path), **options)


def rows(n: int, seed: int) -> list[list[float]]:
    return np.random.default_rng(seed).random((n, FACTORS)).tolist()


def tensors(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    left, right = tensors(a), tensors(b)
    assert left.keys() == right.keys()
    assert [k for k in left if not torch.equal(left[k], right[k])] == []


@pytest.mark.parametrize("durable", [True, False])
def test_an_id_given_again_after_it_expired_is_pending_again(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "l.db"
    m = memory(path, pending_ttl=10.0, durable_decisions=durable)
    x = rows(2, 0)
    m.learn_one(x[0], "approve", "billing")
    m.decide(x[1], "billing", id="x", now=0.0)
    again = m.decide(x[1], "billing", id="x", now=20.0)
    m.sync()
    assert [d.id for d in m.pending(now=21.0)] == ["x"] == [d.id for d in memory(path).pending(now=21.0)]
    assert m.expired_decisions == 1
    m.verify("x", "approve", now=22.0)  # later writes go on
    assert again.id == "x" and memory(path).pending(now=23.0) == []


def test_two_writers_giving_one_id_do_not_jam_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    a, b = memory(path, durable_decisions=False), memory(path)
    x = rows(3, 1)
    a.decide(x[0], "billing", id="same")  # buffered in a
    b.decide(x[1], "billing", id="same")  # committed by b
    a.sync()
    b.learn_one(x[2], "reject", "billing")
    a.sync()
    assert_same(a, b)
    assert [d.id for d in memory(path).pending()] == ["same"]  # the latest decision of the id, as in RAM


def test_a_refused_forget_with_buffered_decides_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    a, b = memory(path, durable_decisions=False), memory(path)
    x = rows(2, 2)
    buffered = a.decide(x[0], "billing")
    with pytest.raises(ValueError, match="999"):
        a.forget_([999])
    b.learn_one(x[1], "approve", "billing")
    a.sync()
    again = memory(path)
    assert a.version == b.version == again.version
    assert_same(a, again)
    assert [d.id for d in again.pending()] == [buffered.id]  # written at a's next commit


def test_a_writer_without_grow_replays_the_names_another_met(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    a, b = memory(path), memory(path, grow=True)
    x = rows(3, 3)
    a.learn_one(x[0], "approve", "billing")
    b.learn_one(x[1], "hold", "billing")  # b meets a new action
    a.sync()
    assert a.action_names == b.action_names == (*ACTIONS, "hold")
    assert_same(a, b)
    before = tensors(a)
    with pytest.raises(ValueError):
        a.learn_one(x[2], "typo", "billing")  # a's own call does not grow
    assert a.action_names == (*ACTIONS, "hold")
    assert [k for k, v in tensors(a).items() if not torch.equal(v, before[k])] == []
    for names in (ACTIONS, [*ACTIONS, "hold"]):  # opened without grow, with the first or the grown names
        opened = JudgmentMemory(CATEGORIES, names, FACTORS, JudgmentConfig.recommended(), store=SQLiteStore(path))
        assert_same(opened, a)


def test_a_closed_store_raises_its_own_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    m = memory(tmp_path / "l.db", store=store)
    decision = m.decide(rows(1, 4)[0], "billing")
    store.close()
    for call in (lambda: m.verify(decision.id, "approve"), lambda: m.decide(rows(1, 5)[0], "billing")):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):  # the store's own error
            call()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        m.max_pending = 1
    assert m.max_pending == 100_000  # a call that raises changes nothing


@pytest.mark.parametrize("grow", ["add_actions_", "add_categories_", "reopen"])
def test_forget_and_undo_after_a_growth(tmp_path: Path, grow: str) -> None:
    path = tmp_path / "l.db"
    m = memory(path, snapshot_every=2)
    x = rows(6, 6)
    for i in range(3):
        d = m.decide(x[i], "billing", source_id=i)
        m.verify(d.id, ACTIONS[i % 2])
    if grow == "reopen":
        m = JudgmentMemory(CATEGORIES, [*ACTIONS, "hold"], FACTORS, JudgmentConfig.recommended(),
                           store=SQLiteStore(path), grow=True, snapshot_every=2)
    else:
        getattr(m, grow)("new")
    m.learn_one(x[3], "approve", "refund")
    m.forget_([1])
    m.undo_(1)
    ram = JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, JudgmentConfig.recommended())
    for i in (0, 2):
        ram.learn_one(x[i], ACTIONS[i % 2], "billing", confirmed=None)
    assert torch.equal(m.centroids[:2, :2], ram.centroids) and torch.equal(m.counts[:2, :2], ram.counts)
    assert_same(memory(path, grow=True) if grow != "reopen" else m, m)


def test_calls_outside_the_ledger_are_refused(tmp_path: Path) -> None:
    m = memory(tmp_path / "l.db")
    m.learn_one(rows(1, 7)[0], "approve", "billing")
    before = tensors(m)
    with pytest.raises(TypeError, match="load_state_dict"):
        m.load_state_dict(JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, JudgmentConfig.recommended()).state_dict())
    assert [k for k, v in tensors(m).items() if not torch.equal(v, before[k])] == []
    knn = KNNMemory(FACTORS, ACTIONS, store=SQLiteStore(tmp_path / "k.db"))
    with pytest.raises(TypeError, match="keep_newest_"):
        knn.keep_newest_(1)
    with pytest.raises(TypeError):
        m.verify_many([], [], skip=True)  # as in RAM: verify_many takes no skip=


def test_explain_decision_of_an_id_given_again_explains_its_latest_decision(tmp_path: Path) -> None:
    m = memory(tmp_path / "l.db")
    x = rows(4, 8)
    m.learn_one(x[0], "approve", "billing")
    first = m.decide(x[1], "billing", id="r")
    m.verify("r", "approve")
    m.learn_one(x[2], "reject", "billing")
    then = m.explain(x[3], "billing")  # the state the second decision of "r" is made with
    m.decide(x[3], "billing", id="r")
    m.learn_one(x[0], "reject", "billing")  # and the state moves on
    explained = m.explain_decision("r")
    assert first.id == "r" and torch.equal(explained.distance, then.distance)


def test_memories_sharing_one_store_object_in_threads(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = SQLiteStore(path)
    memories = [memory(path, store=store), memory(path, store=store)]
    acknowledged: list[str] = []

    def run(m: JudgmentMemory, seed: int) -> None:
        for x in rows(60, seed):
            d = m.decide(x, "billing")
            m.verify(d.id, "approve" if x[0] > 0.5 else "reject")
            acknowledged.append(d.id)

    threads = [threading.Thread(target=run, args=(m, 10 + i)) for i, m in enumerate(memories)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for m in memories:
        m.sync()
    again = memory(path)
    assert memories[0].version == memories[1].version == again.version == len(acknowledged) == 120
    assert_same(memories[0], again)
    assert_same(memories[1], again)
    learned = [e.decision_id for e in again._ledger.events(0, kinds=("learn",))]
    assert sorted(learned) == sorted(acknowledged)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_one_lock_file_per_store_object(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = SQLiteStore(path)
    held = [memory(path, store=store, ledger=f"ledger{i}") for i in range(5)]

    lock = os.path.realpath(f"{path}.ledger-lock")
    opened = [fd for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == lock]
    assert len(held) == 5 and len(opened) == 1
