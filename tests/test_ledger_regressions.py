"""Regression tests for the durable ledger's reviewed bugs (gae/decider/durable.py, gae/ledger).

Each test names the review's repro it guards (r1 ... r12): reusing an id after its decision
expired, a refused forget_ with buffered decisions, writers with different grow settings, errors
before the build, forget_ / undo_ after growth, the calls a Decider on a store refuses (and a
memory changed behind its back), two threads on one store object, the open-time check,
max_pending on a failed write, explaining a reused id, verify_many's arguments and the lock
file's descriptors.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory, KNNMemory
from gae.judgment.config import REFER_OPTIONS
from gae.ledger import DECIDE, LEARN, Ledger
from gae.ledger.events import replay
from gae.storage import SQLiteStore
from tests.test_ledger import ledger_of, without_logs

C, A, K = ("billing", "refund", "fraud"), ("approve", "reject", "escalate"), 5


# -- helpers (as in tests/test_ledger.py) ---------------------------------------------------------
def sqlite(path: Path | str, **options: Any) -> SQLiteStore:
    return SQLiteStore(path, **{"synchronous": "OFF", **options})


SERVING = ("ledger", "snapshot_every", "durable_decisions", "max_pending", "pending_ttl")


def serve(memory: Any, store: Any, options: dict[str, Any]) -> Decider:
    """A Decider on ``memory``; ``store`` a path (a new SQLiteStore on it: another "process"), a
    store, or None (RAM); the options in :data:`SERVING` are taken from ``options`` for it."""
    if isinstance(store, (str, Path)):
        store = sqlite(store)
    return Decider(memory, store=store, **{key: options.pop(key) for key in SERVING if key in options})


def jm(store: Any = None, names: tuple[str, ...] = A, **options: Any) -> Decider:
    """A Decider on a judgment memory (``options``: the Decider's, and the memory's own such as ``grow``)."""
    serving = {key: options.pop(key) for key in SERVING if key in options}
    return serve(JudgmentMemory(C, names, K, **{"config": JudgmentConfig.seed(), **options}), store, serving)


def make(kind: str, store: Any = None, **options: Any) -> Decider:
    if kind == "judgment":
        return jm(store, **options)
    serving = {key: options.pop(key) for key in SERVING if key in options}
    return serve(KNNMemory(factors=K, actions=A, k=3, capacity=40, categories=C, scoped=True, **options), store,
                 serving)


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




def assert_same(a: Decider, b: Decider, *, logs: bool = False) -> None:
    """The two Deciders' state_dicts equal (the memory's, the pending decisions, the expired count
    and the referral; the memory's logs when ``logs``) and the versions."""
    sa, sb = unchunked(a.state_dict()), unchunked(b.state_dict())
    if not logs:
        sa, sb = without_logs(sa), without_logs(sb)
    assert list(sa) == list(sb) and list(sa["memory"]) == list(sb["memory"])
    for name in sa:
        assert_equal_values(sa[name], sb[name], name)
    assert a.version == b.version


def assert_same_learned(a: Any, b: Any) -> None:
    """The learned buffers and the parameters of two memories (of a Decider: its memory's)."""
    a, b = (m.memory if isinstance(m, Decider) else m for m in (a, b))
    ta = {n: t.detach() for n, t in [*a.named_parameters(), *a.named_buffers()]}
    tb = {n: t.detach() for n, t in [*b.named_parameters(), *b.named_buffers()]}
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def frozen(decider: Decider) -> tuple:
    state = unchunked(copy.deepcopy(decider.state_dict()))
    events = [(e.seq, e.kind, e.decision_id) for e in ledger_of(decider).events(0)]
    return state, decider.version, decider.ledger_version, events, ledger_of(decider).position()


def assert_frozen(decider: Decider, before: tuple) -> None:
    state, version, seen, events, position = before
    assert ledger_of(decider).position() == position
    assert [(e.seq, e.kind, e.decision_id) for e in ledger_of(decider).events(0)] == events
    assert decider.version == version and decider.ledger_version == seen
    now = unchunked(decider.state_dict())
    assert list(now) == list(state) and list(now["memory"]) == list(state["memory"])
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
    assert memory._durable.unflushed == [] and memory.ledger_version == Ledger(sqlite(path), "judgment").position()[0]
    assert pending_ids(memory, now=22.0) == []
    assert_same(memory, jm(path, pending_ttl=10.0))


def test_an_expired_id_can_be_given_again_on_postgres(dsn: str) -> None:
    from gae.storage import PostgresStore

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
    assert [e.decision_id for e in a._durable.unflushed] == [buffered.id]
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
    assert a.memory.action_names == b.memory.action_names == (*A, "brand_new")
    assert_same(a, b)
    assert_same(a, jm(path))
    assert_same(a, jm(path, names=(*A, "brand_new")))  # the grown names are not refused
    assert_same(a, jm(path, grow=True))
    before = frozen(a)
    with pytest.raises(ValueError):
        a.learn_one(x[4], "unknown_action", "billing")  # grow=False: its own calls do not grow it
    assert_frozen(a, before)
    assert "unknown_action" not in a.memory.action_names
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
    with pytest.raises(RuntimeError, match="the store is closed"):  # the store's own error, not UnboundLocalError
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
    assert memory.memory.category_names == (*C, "tax")


def test_forget_after_add_actions_on_postgres(dsn: str) -> None:
    from gae.storage import PostgresStore

    x = rows(3, seed=10)
    memory = jm(PostgresStore(dsn), pending_ttl=10.0)
    learned = verified_run(memory, x)
    memory.add_actions_("hold")
    learned.append({"grow": "add_actions_", "names": ["hold"]})
    assert memory.forget_([7]) == 1
    assert_same_learned(memory, feed(jm(), learned[1:]))
    assert_same(memory, jm(PostgresStore(dsn), pending_ttl=10.0))


# -- 6. (r4, r11b) the calls a Decider on a store refuses ---------------------------------------------
def test_load_state_dict_on_a_decider_on_a_store_raises_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    memory, other = jm(path, snapshot_every=1), jm(path)
    for row in rows(3, seed=11):
        memory.learn_one(row, "approve", "billing")
    before = frozen(memory)
    for state in (jm().state_dict(), jm().memory.state_dict()):  # a Decider's, and a memory's (the migration path)
        with pytest.raises(TypeError, match="load_state_dict"):
            memory.load_state_dict(state)
        assert_frozen(memory, before)
    memory.learn_one(rows(1, seed=12)[0], "reject", "refund")
    other.sync()
    assert_same(memory, other)
    assert_same(memory, jm(path))


def test_load_state_dict_into_the_memory_of_a_decider_on_a_store_is_refused_at_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    memory = jm(path, snapshot_every=1)
    for row in rows(3, seed=11):
        memory.learn_one(row, "approve", "billing")
    position = ledger_of(memory).position()
    memory.memory.load_state_dict(jm().memory.state_dict())  # behind the Decider's back
    with pytest.raises(RuntimeError, match="decider.memory was changed outside"):
        memory.learn_one(rows(1, seed=12)[0], "reject", "refund")
    assert ledger_of(memory).position() == position
    assert jm(path).version == 3


def test_keep_newest_on_the_knn_of_a_decider_on_a_store_is_refused_at_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    knn = make("knn", path)
    for row in rows(5, seed=13):
        knn.learn_one(row, "approve", "billing")
    before = frozen(knn)
    assert knn.memory.keep_newest_(1) == 4  # the memory's own call: its Decider refuses to go on from it
    with pytest.raises(RuntimeError, match="decider.memory was changed outside"):
        knn.learn_one(rows(1, seed=14)[0], "approve", "billing")
    with pytest.raises(RuntimeError, match="decider.memory was changed outside"):
        knn.pending()
    assert ledger_of(knn).position() == before[4]
    assert len(make("knn", path).memory) == 5


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
    assert_same_learned(fresh, replay(ledger_of(fresh), JudgmentMemory(C, A, K, config=JudgmentConfig.seed())))


# -- 8. (r7) the open-time check cannot be bypassed ------------------------------------------------------
def test_a_ledger_created_just_before_the_open_takes_its_lock_is_still_checked(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "l.db"
    original = Ledger.writing
    raced: list[Any] = []

    def racing(self: Ledger) -> Any:
        if not raced:  # "another process" creates the ledger, with another config, as this open begins
            raced.append(None)  # (its own open goes through here too)
            raced[0] = Decider(JudgmentMemory(C, A, K, JudgmentConfig.recommended()), store=sqlite(path))
            raced[0].learn_one(rows(1)[0], "approve", "billing")
        return original(self)

    monkeypatch.setattr(Ledger, "writing", racing)
    with pytest.raises(ValueError, match="tau"):
        Decider(JudgmentMemory(C, A, K, JudgmentConfig.seed().replace(tau=0.3)), store=sqlite(path))
    monkeypatch.setattr(Ledger, "writing", original)
    settings = Ledger(sqlite(path), "judgment").meta()["settings"]
    assert raced and settings == JudgmentConfig.recommended().to_dict() == raced[0].memory.settings()
    assert not set(REFER_OPTIONS) & set(settings)  # act or refer is the Decider's: no ledger setting
    assert_same(Decider(JudgmentMemory(C, A, K, JudgmentConfig.recommended()), store=sqlite(path)), raced[0])


# -- 9. (r8, r11) max_pending keeps its value when the write raises ----------------------------------------
def test_max_pending_keeps_its_value_when_the_write_raises(tmp_path: Path) -> None:
    store = sqlite(tmp_path / "l.db")
    memory = jm(store, max_pending=50)
    for row in rows(3, seed=14):
        memory.decide(row, "billing")
    store.close()
    with pytest.raises(RuntimeError, match="the store is closed"):  # the store's own error
        memory.max_pending = 2
    assert memory.max_pending == 50
    assert len(memory._book.open) == 3


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
    first_want = ram.memory.explain(x[0], "billing")
    memory.decide(x[0], "billing", id="r")
    ram.decide(x[0], "billing", id="r")
    assert memory.verify("r", "approve") == ram.verify("r", "approve")
    for row in x[1:6]:
        memory.learn_one(row, "reject", "billing")
        ram.learn_one(row, "reject", "billing")
    want = ram.memory.explain(x[6], "refund")
    memory.decide(x[6], "refund", id="r")
    got = memory.explain_decision("r")
    assert str(got) != str(first_want)  # (the two decisions are told apart)
    assert type(got) is type(want) and str(got) == str(want)
    for name, value in vars(want).items():
        assert_equal_values(getattr(got, name), value, name)
    assert str(jm(path).explain_decision("r")) == str(want)


# -- 11. verify_many takes no skip= ------------------------------------------------------------------------
def test_durable_verify_many_refuses_skip_like_the_decider_in_ram(tmp_path: Path) -> None:
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


# -- 13. a call refused after catching up with another writer leaves its Decider as the ledger holds it ------
REFUSED_AFTER_CATCHING_UP = {
    "verify of a decision the other verified": (lambda m, d: m.verify(d.id, "reject", now=2.0), KeyError),
    "forget_ of an unknown source": (lambda m, d: m.forget_([999]), ValueError),
    "undo_ of more than learned": (lambda m, d: m.undo_(50), ValueError),
    "explain_decision of an unknown id": (lambda m, d: m.explain_decision("never"), KeyError),
    "decide with NaN factors": (lambda m, d: m.decide([float("nan")] * K, "billing", now=2.0), ValueError),
    "learn_one of an unknown action": (lambda m, d: m.learn_one([0.5] * K, "sell", "billing"), ValueError),
}


@pytest.mark.parametrize("durable_decisions", [True, False])
@pytest.mark.parametrize("case", sorted(REFUSED_AFTER_CATCHING_UP))
def test_a_call_refused_after_catching_up_leaves_the_decider_usable(case: str, durable_decisions: bool,
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    a, b = jm(path), jm(path, durable_decisions=durable_decisions)
    x = rows(3, seed=18)
    decision = a.decide(x[0], "billing", source_id=5, now=1.0)
    a.verify(decision.id, "approve", now=1.0)  # b has not seen it: its next call catches up first
    call, error = REFUSED_AFTER_CATCHING_UP[case]
    with pytest.raises(error):
        call(b, decision)
    assert pending_ids(b, now=2.0) == []  # no RuntimeError: what b applied came from the ledger, not behind its back
    assert_same(b, a)
    b.verify(b.decide(x[1], "refund", now=3.0).id, "reject", now=3.0)  # and it goes on
    a.sync()
    assert_same(a, b)
    assert_same(b, jm(path))
