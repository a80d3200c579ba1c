"""Regression tests for the durable ledger's reviewed bugs (gae/durable.py, gae/durable_calls.py, gae/ledger).

Each test names the review's repro it guards (r1 ... r12): reusing an id after its decision
expired, a refused forget_ with buffered decisions, writers with different grow settings, errors
before the build, forget_ / undo_ after growth, the calls a store-backed memory refuses, two
threads on one store object, the open-time check, max_pending on a failed write, explaining a
reused id, verify_many's arguments and the lock file's descriptors.
"""

from __future__ import annotations

import copy
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import gae.durable as durable
from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from gae.episodic.store import SQLiteStore
from gae.judgment.config import REFER_OPTIONS
from gae.ledger import DECIDE, LEARN, Ledger
from tests.test_ledger import without_logs

C, A, K = ("billing", "refund", "fraud"), ("approve", "reject", "escalate"), 5


# -- helpers (as in tests/test_ledger.py) ---------------------------------------------------------
def sqlite(path: Path | str, **options: Any) -> SQLiteStore:
    return SQLiteStore(path, **{"synchronous": "OFF", **options})


def jm(store: Any = None, names: tuple[str, ...] = A, **options: Any) -> JudgmentMemory:
    """A judgment memory; ``store`` a path (a new SQLiteStore on it: another "process"), a store, or None (RAM)."""
    if isinstance(store, (str, Path)):
        store = sqlite(store)
    if store is not None:
        options["store"] = store
    return JudgmentMemory(C, names, K, **options)


def make(kind: str, store: Any = None, **options: Any):
    if kind == "judgment":
        return jm(store, **options)
    if isinstance(store, (str, Path)):
        store = sqlite(store)
    if store is not None:
        options["store"] = store
    return KNNMemory(factors=K, actions=A, k=3, capacity=40, categories=C, scoped=True, **options)


def rows(n: int, seed: int = 0) -> list[list[float]]:
    return np.random.default_rng(seed).random((n, K)).tolist()


def assert_equal_values(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.is_floating_point():
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), where
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_equal_values(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_values(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def unchunked(value: Any) -> Any:
    if isinstance(value, dict):
        value = {key: unchunked(v) for key, v in value.items()}
        if "call_sizes" in value and "call_logits" in value:
            sizes, calls = value.pop("call_sizes"), value.pop("call_logits")
            logits = value.pop("logits")
            value["row_logits"] = logits[calls].repeat_interleave(sizes, 0) if len(calls) else logits
    return value




def assert_same(a, b, *, logs: bool = False) -> None:
    """The two state_dicts equal (the pending decisions and counters too; the logs when ``logs``) and the versions."""
    sa, sb = unchunked(dict(a.state_dict())), unchunked(dict(b.state_dict()))
    if not logs:
        sa, sb = without_logs(sa), without_logs(sb)
    assert list(sa) == list(sb)
    for name in sa:
        assert_equal_values(sa[name], sb[name], name)
    assert a.version == b.version


def assert_same_learned(a, b) -> None:
    ta = {n: t.detach() for n, t in [*a.named_parameters(), *a.named_buffers()]}
    tb = {n: t.detach() for n, t in [*b.named_parameters(), *b.named_buffers()]}
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def frozen(memory) -> tuple:
    state = unchunked(copy.deepcopy(dict(memory.state_dict())))
    events = [(e.seq, e.kind, e.decision_id) for e in memory._ledger.events(0)]
    return state, memory.version, memory.ledger_version, events, memory._ledger.position()


def assert_frozen(memory, before: tuple) -> None:
    state, version, seen, events, position = before
    assert memory._ledger.position() == position
    assert [(e.seq, e.kind, e.decision_id) for e in memory._ledger.events(0)] == events
    assert memory.version == version and memory.ledger_version == seen
    now = unchunked(dict(memory.state_dict()))
    assert list(now) == list(state)
    for name in state:
        assert_equal_values(now[name], state[name], name)


def pending_ids(memory, now: float = 0.0) -> list[str]:
    return [d.id for d in memory.pending(now=now)]


# -- Postgres: one server for this module, a fresh database per test ------------------------------




# -- 1. (r1, r12) an id given again after its decision expired --------------------------------------
@pytest.mark.parametrize("durable_decisions", [True, False])
def test_an_expired_id_can_be_given_again(durable_decisions: bool, tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(4, seed=1)
    memory = jm(path, pending_ttl=10.0, durable_decisions=durable_decisions)
    memory.decide(x[0], "billing", id="x", now=0.0)
    again = memory.decide(x[1], "billing", id="x", now=20.0)  # no IntegrityError
    assert again.id == "x" and again.created_at == 20.0
    assert pending_ids(memory, now=20.0) == ["x"]
    memory.sync()
    assert [e.decision_id for e in Ledger(sqlite(path), "judgment").pending()] == ["x"]
    assert pending_ids(jm(path, pending_ttl=10.0), now=20.0) == ["x"]
    # later writes keep working
    other = memory.decide(x[2], "refund", now=21.0)
    memory.verify(other.id, "approve", now=21.0)
    memory.verify("x", "reject", now=22.0)
    memory.sync()
    assert memory._unflushed == [] and memory.ledger_version == Ledger(sqlite(path), "judgment").position()[0]
    assert pending_ids(memory, now=22.0) == []
    assert_same(memory, jm(path, pending_ttl=10.0))


def test_an_expired_id_can_be_given_again_on_postgres(dsn: str) -> None:
    from gae.episodic.store import PostgresStore

    x = rows(3, seed=2)
    memory = jm(PostgresStore(dsn), pending_ttl=10.0)
    memory.decide(x[0], "billing", id="x", source_id=7, now=0.0)
    assert memory.decide(x[1], "billing", id="x", now=20.0).id == "x"
    assert pending_ids(memory, now=20.0) == ["x"]
    reopened = jm(PostgresStore(dsn), pending_ttl=10.0)
    assert pending_ids(reopened, now=20.0) == ["x"]
    memory.verify("x", "approve", now=21.0)
    memory.sync()
    assert_same(memory, jm(PostgresStore(dsn), pending_ttl=10.0))


def test_two_writers_giving_one_id_do_not_get_stuck(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(5, seed=3)
    lazy, eager = jm(path, durable_decisions=False), jm(path)
    lazy.decide(x[0], "billing", id="x", now=1.0)  # buffered
    eager.decide(x[1], "refund", id="x", now=2.0)  # committed first
    lazy.sync()  # no error
    lazy.sync()  # and not stuck
    eager.sync()
    assert pending_ids(lazy) == pending_ids(eager) == ["x"]
    eager.verify("x", "approve", now=3.0)
    d = lazy.decide(x[2], "fraud", now=4.0)
    lazy.verify(d.id, "reject", now=5.0)
    lazy.sync()
    eager.sync()
    assert pending_ids(lazy) == pending_ids(eager) == []
    fresh = jm(path)
    assert_same(lazy, fresh)
    assert_same(eager, fresh)


# -- 2. (r2b) a refused forget_ with buffered decisions changes nothing ------------------------------
def test_a_refused_forget_with_buffered_decisions_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(2, seed=4)
    a, b = jm(path, durable_decisions=False), jm(path)
    buffered = a.decide(x[0], "billing", now=1.0)
    seen, position = a.ledger_version, Ledger(sqlite(path), "judgment").position()
    with pytest.raises(ValueError, match="999"):
        a.forget_([999])
    assert a.ledger_version == seen and Ledger(sqlite(path), "judgment").position() == position
    assert [e.decision_id for e in a._unflushed] == [buffered.id]
    b.learn_one(x[1], "approve", "billing")  # one event: the head a would have believed it had seen
    a.sync()
    fresh = jm(path)
    assert a.version == b.version == fresh.version
    assert_same(a, fresh)
    assert pending_ids(fresh) == [buffered.id]  # the buffered decide written at that commit
    assert [e.kind for e in Ledger(sqlite(path), "judgment").events(0)] == [LEARN, DECIDE]


# -- 3. (r3) writers with different grow settings ----------------------------------------------------
def test_a_grow_false_writer_catches_up_a_grow_true_writers_new_name(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(6, seed=5)
    a, b = jm(path), jm(path, grow=True)
    a.learn_one(x[0], "approve", "billing")
    b.learn_one(x[1], "approve", "billing")
    b.learn_one(x[2], "brand_new", "billing")  # a name met by learn_one (no growth event)
    b.learn_one(x[3], "reject", "billing")
    a.sync()
    a.sync()  # again: nothing learned twice
    assert a.action_names == b.action_names == (*A, "brand_new")
    assert_same(a, b)
    assert_same(a, jm(path))
    assert_same(a, jm(path, names=(*A, "brand_new")))  # the grown names are not refused
    assert_same(a, jm(path, grow=True))
    before = frozen(a)
    with pytest.raises(ValueError):
        a.learn_one(x[4], "unknown_action", "billing")  # grow=False: its own calls do not grow it
    assert_frozen(a, before)
    assert "unknown_action" not in a.action_names
    a.learn_one(x[5], "brand_new", "refund")  # a name the ledger has
    b.sync()
    assert_same(a, b)
    assert_same(a, jm(path))


# -- 4. (r3, r4, r11) a failure before the build raises the real error --------------------------------
CALLS = {
    "verify": lambda m, d, x: m.verify(d.id, "approve"),
    "verify_many": lambda m, d, x: m.verify_many([d.id], ["approve"]),
    "decide": lambda m, d, x: m.decide(x, "billing"),
    "learn_one": lambda m, d, x: m.learn_one(x, "approve", "billing"),
    "pending": lambda m, d, x: m.pending(),
    "sync": lambda m, d, x: m.sync(),
    "forget_": lambda m, d, x: m.forget_([7]),
    "undo_": lambda m, d, x: m.undo_(1),
    "add_actions_": lambda m, d, x: m.add_actions_("hold"),
}


@pytest.mark.parametrize("durable_decisions", [True, False])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_on_a_closed_store_raises_the_stores_error(call: str, durable_decisions: bool,
                                                          tmp_path: Path) -> None:
    store = sqlite(tmp_path / "l.db")
    memory = jm(store, durable_decisions=durable_decisions)
    x = rows(2, seed=6)
    memory.learn_one(x[0], "approve", "billing")
    d = memory.decide(x[1], "billing", source_id=7)
    memory.sync()
    store.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):  # the store's own error, not UnboundLocalError
        CALLS[call](memory, d, x[1])


# -- 5. (r5, r5b, r12) forget_ and undo_ after growth ------------------------------------------------
def verified_run(memory, x: list[list[float]]) -> list[dict[str, Any]]:
    """Two verified decisions (source ids 7 and 8); what each was learned with."""
    out = []
    for i, (source, action) in enumerate(((7, "approve"), (8, "reject"))):
        d = memory.decide(x[i], "billing", source_id=source, now=float(i))
        memory.verify(d.id, action, now=float(i))
        out.append({"x": x[i], "action": action, "category": "billing", "confirmed": d.action == action,
                    "source": source})
    return out


def feed(memory, learned: list[dict[str, Any]]):
    for r in learned:
        if "grow" in r:
            getattr(memory, r["grow"])(r["names"])
        else:
            memory.learn_one(r["x"], r["action"], r["category"], confirmed=r["confirmed"])
    return memory


@pytest.mark.parametrize("kind", ["judgment", "knn"])
def test_forget_and_undo_after_add_actions(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(4, seed=7)
    memory = make(kind, path)
    learned = verified_run(memory, x)
    memory.add_actions_("hold")
    memory.learn_one(x[2], "hold", "billing")
    learned += [{"grow": "add_actions_", "names": ["hold"]},
                {"x": x[2], "action": "hold", "category": "billing", "confirmed": True}]
    assert memory.forget_([7]) == 1
    kept = learned[1:]
    assert_same_learned(memory, feed(make(kind), kept))
    assert_same(memory, make(kind, path))
    memory.undo_(1)
    kept = kept[:-1]
    assert_same_learned(memory, feed(make(kind), kept))
    assert_same(memory, make(kind, path))
    memory.learn_one(x[3], "approve", "billing")  # and later writes work
    memory.decide(x[3], "billing")
    memory.sync()
    assert_same(memory, make(kind, path))


def test_forget_after_a_grow_true_reopen_added_names(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(3, seed=8)
    memory = jm(path)
    learned = verified_run(memory, x)
    grown = jm(path, names=(*A, "hold"), grow=True)  # adds "hold" on open
    grown.learn_one(x[2], "hold", "refund")
    learned += [{"grow": "add_actions_", "names": ["hold"]},
                {"x": x[2], "action": "hold", "category": "refund", "confirmed": True}]
    assert grown.forget_([7]) == 1
    memory.sync()
    want = feed(jm(), learned[1:])
    assert_same_learned(grown, want)
    assert_same_learned(memory, want)
    assert_same(memory, grown)
    assert_same(jm(path), grown)


def test_forget_and_undo_after_growth_past_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(4, seed=9)
    memory = jm(path, snapshot_every=1)
    learned = verified_run(memory, x)  # a snapshot after each
    memory.add_categories_("tax")
    memory.learn_one(x[2], "approve", "tax")
    learned += [{"grow": "add_categories_", "names": ["tax"]},
                {"x": x[2], "action": "approve", "category": "tax", "confirmed": True}]
    assert_same(memory, jm(path, snapshot_every=1))
    memory.undo_(1)
    assert_same_learned(memory, feed(jm(), learned[:-1]))
    assert_same(memory, jm(path, snapshot_every=1))
    assert memory.forget_([7]) == 1
    assert_same_learned(memory, feed(jm(), learned[1:-1]))
    assert_same(memory, jm(path, snapshot_every=1))
    assert memory.category_names == (*C, "tax")


def test_forget_after_add_actions_on_postgres(dsn: str) -> None:
    from gae.episodic.store import PostgresStore

    x = rows(3, seed=10)
    memory = jm(PostgresStore(dsn), pending_ttl=10.0)
    learned = verified_run(memory, x)
    memory.add_actions_("hold")
    learned.append({"grow": "add_actions_", "names": ["hold"]})
    assert memory.forget_([7]) == 1
    assert_same_learned(memory, feed(jm(), learned[1:]))
    assert_same(memory, jm(PostgresStore(dsn), pending_ttl=10.0))


# -- 6. (r4, r11b) the calls a store-backed memory refuses --------------------------------------------
def test_load_state_dict_on_a_store_backed_memory_raises_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    memory, other = jm(path, snapshot_every=1), jm(path)
    for row in rows(3, seed=11):
        memory.learn_one(row, "approve", "billing")
    before = frozen(memory)
    with pytest.raises(TypeError, match="load_state_dict"):
        memory.load_state_dict(jm().state_dict())
    assert_frozen(memory, before)
    memory.learn_one(rows(1, seed=12)[0], "reject", "refund")
    other.sync()
    assert_same(memory, other)
    assert_same(memory, jm(path))


def test_keep_newest_on_a_store_backed_knn_raises(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    knn = make("knn", path)
    for row in rows(5, seed=13):
        knn.learn_one(row, "approve", "billing")
    before = frozen(knn)
    with pytest.raises(TypeError, match="keep_newest_"):
        knn.keep_newest_(1)
    assert_frozen(knn, before)
    assert len(knn) == len(make("knn", path)) == 5


# -- 7. (r9) two memories on one store object, in two threads ------------------------------------------
@pytest.mark.parametrize("slow_commit", [False, True])
def test_two_threads_on_one_store_object_end_as_the_ledger(slow_commit: bool, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if slow_commit:  # a wider window at the end of each commit, where the other thread must not slip in
        counted = Ledger.count_commit

        def count_commit(self: Ledger) -> None:
            time.sleep(0.0005)
            counted(self)

        monkeypatch.setattr(Ledger, "count_commit", count_commit)
    path = tmp_path / "l.db"
    store = sqlite(path)
    memories = [jm(store), jm(store)]
    acknowledged: list[list[str]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(t: int) -> None:
        memory, data = memories[t], rows(75, seed=20 + t)
        try:
            start.wait()
            for i, row in enumerate(data):
                d = memory.decide(row, C[i % 3], now=float(i))
                memory.verify(d.id, A[(i + t) % 3], now=float(i))
                acknowledged[t].append(d.id)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    learns = [e.decision_id for e in Ledger(sqlite(path), "judgment").events(0) if e.kind == LEARN]
    assert sorted(learns) == sorted(acknowledged[0] + acknowledged[1])  # every acknowledged one, once
    assert len(set(learns)) == len(learns) == 150
    for memory in memories:
        memory.sync()
    fresh = jm(path)
    assert_same(memories[0], fresh)
    assert_same(memories[1], fresh)
    assert_same_learned(fresh, durable.replay(fresh._ledger, jm()))


# -- 8. (r7) the open-time check cannot be bypassed ------------------------------------------------------
def test_a_ledger_created_between_prepare_and_attach_is_still_checked(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "l.db"
    original = durable.prepare
    raced: list[Any] = []

    def racing(*args: Any, **kwargs: Any):
        out = original(*args, **kwargs)
        if not raced:  # "another process" creates the ledger, with another config, right after the check
            raced.append(None)  # (its own open goes through here too)
            raced[0] = JudgmentMemory(C, A, K, JudgmentConfig.recommended(), store=sqlite(path))
            raced[0].learn_one(rows(1)[0], "approve", "billing")
        return out

    monkeypatch.setattr(durable, "prepare", racing)
    with pytest.raises(ValueError, match="tau"):
        JudgmentMemory(C, A, K, JudgmentConfig.seed().replace(tau=0.3), store=sqlite(path))
    monkeypatch.setattr(durable, "prepare", original)
    assert raced and Ledger(sqlite(path), "judgment").meta()["settings"] == {  # decide's referral options aside
        key: value for key, value in JudgmentConfig.recommended().to_dict().items() if key not in REFER_OPTIONS}
    assert_same(JudgmentMemory(C, A, K, JudgmentConfig.recommended(), store=sqlite(path)), raced[0])


# -- 9. (r8, r11) max_pending keeps its value when the write raises ----------------------------------------
def test_max_pending_keeps_its_value_when_the_write_raises(tmp_path: Path) -> None:
    store = sqlite(tmp_path / "l.db")
    memory = jm(store, max_pending=50)
    for row in rows(3, seed=14):
        memory.decide(row, "billing")
    store.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        memory.max_pending = 2
    assert memory.max_pending == 50
    assert len(memory._open) == 3


def test_max_pending_lowered_closes_the_oldest_in_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    memory = jm(path, max_pending=50)
    ids = [memory.decide(row, "billing").id for row in rows(3, seed=15)]
    memory.max_pending = 2
    assert memory.max_pending == 2
    assert pending_ids(memory) == ids[1:]
    assert pending_ids(jm(path, max_pending=2)) == ids[1:]


# -- 10. (r6) explain_decision of an id given again ------------------------------------------------------
def test_explain_decision_of_a_reused_id_explains_the_latest(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    x = rows(8, seed=16)
    memory, ram = jm(path), jm()
    first_want = ram.explain(x[0], "billing")
    memory.decide(x[0], "billing", id="r")
    ram.decide(x[0], "billing", id="r")
    assert memory.verify("r", "approve") == ram.verify("r", "approve")
    for row in x[1:6]:
        memory.learn_one(row, "reject", "billing")
        ram.learn_one(row, "reject", "billing")
    want = ram.explain(x[6], "refund")
    memory.decide(x[6], "refund", id="r")
    got = memory.explain_decision("r")
    assert str(got) != str(first_want)  # (the two decisions are told apart)
    assert type(got) is type(want) and str(got) == str(want)
    for name, value in vars(want).items():
        assert_equal_values(getattr(got, name), value, name)
    assert str(jm(path).explain_decision("r")) == str(want)


# -- 11. verify_many takes no skip= ------------------------------------------------------------------------
def test_durable_verify_many_refuses_skip_like_the_memory_in_ram(tmp_path: Path) -> None:
    memory, ram = jm(tmp_path / "l.db"), jm()
    x = rows(2, seed=17)
    ids = [memory.decide(row, "billing").id for row in x]
    ram_ids = [ram.decide(row, "billing").id for row in x]
    with pytest.raises(TypeError):
        ram.verify_many(ram_ids, ["approve"] * 2, skip=True)
    before = frozen(memory)
    with pytest.raises(TypeError):
        memory.verify_many(ids, ["approve"] * 2, skip=True)
    assert_frozen(memory, before)


# -- 12. one .ledger-lock descriptor per store object -------------------------------------------------------
def lock_fds(path: Path) -> int:
    target, count = f"{path}.ledger-lock", 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            continue
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_many_ledgers_and_memories_on_one_store_object_open_one_lock_file(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = sqlite(path)
    kept = [jm(store) for _ in range(10)]
    kept += [Ledger(store, "judgment") for _ in range(10)]
    kept += [Ledger(store, f"other{i}") for _ in range(5) for i in range(2)]
    kept += [jm(store, ledger="second") for _ in range(5)]
    assert lock_fds(path) == 1
    kept[0].learn_one(rows(1)[0], "approve", "billing")
    for ledger in kept[10:20]:
        ledger.audit()
    assert lock_fds(path) == 1
