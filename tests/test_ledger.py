"""A Decider on a durable ledger (gae/decider/durable.py, gae/ledger): every call committed before it returns.

Held to the Decider in RAM: the same calls on a Decider given a store answer and learn what they
answer and learn in RAM, bit for bit; a Decider opened on an existing ledger (at any point, from
a snapshot or not) equals the one that never stopped; forget_ / undo_ equal a memory that never
learned the forgotten decisions; bad input changes nothing, neither in RAM nor in the ledger; and
the memory a Decider serves on a ledger is the ledger's: changed behind its back, it is refused.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory, KNNMemory
from gae.ledger import Ledger, ledgers
from gae.ledger.events import replay
from gae.storage import SQLiteStore

SEED = JudgmentConfig.seed()  # the original rule, which these tests pin (the default is recommended())

C, A, K = ("billing", "refund", "fraud"), ("approve", "reject", "escalate"), 5
CONFIGS = {"seed": JudgmentConfig.seed(), "adaptive": JudgmentConfig.seed().replace(drift_mode="adaptive"),
           "recommended": JudgmentConfig.recommended()}
KINDS = [*CONFIGS, "knn"]
NEEDLE = np.float64(0.123456789012345)  # a factor value whose eight bytes occur nowhere else


def sqlite(path: Path | str, **options: Any) -> SQLiteStore:
    """A store on ``path`` (``synchronous=OFF``: the tests need no power-loss durability, only speed)."""
    return SQLiteStore(path, **{"synchronous": "OFF", **options})


SERVING = ("ledger", "snapshot_every", "durable_decisions", "max_pending", "pending_ttl", "target_error")


def memory_of(kind: str, **options: Any):
    """A memory of ``kind`` that has learned nothing (``options`` the memory's own, e.g. ``grow``)."""
    if kind in CONFIGS:
        return JudgmentMemory(C, A, K, CONFIGS[kind], **options)
    return KNNMemory(factors=K, actions=A, k=3, capacity=40, categories=C, scoped=True, **options)


def make(kind: str, store: Any = None, **options: Any) -> Decider:
    """A Decider on a memory of ``kind``; ``store`` a path (a new SQLiteStore on it: another
    "process"), a store, or None (RAM). ``options`` in :data:`SERVING` are the Decider's, the rest the memory's."""
    if isinstance(store, (str, Path)):
        store = sqlite(store)
    serving = {key: options.pop(key) for key in SERVING if key in options}
    return Decider(memory_of(kind, **options), store=store, **serving)


def ledger_of(decider: Decider) -> Ledger:
    """The ledger a Decider given a store writes to."""
    return decider._durable.ledger


def stream(n: int, seed: int = 0) -> list[tuple[list[float], str, str]]:
    rng = np.random.default_rng(seed)
    centres = rng.random((len(C), len(A), K))
    c, a = rng.integers(0, len(C), n), rng.integers(0, len(A), n)
    x = np.clip(centres[c, a] + 0.15 * rng.standard_normal((n, K)), 0, 1)
    return [(row, C[i], A[j]) for row, i, j in zip(x.tolist(), c, a, strict=True)]


# -- comparing memories ------------------------------------------------------------------------
def assert_equal_values(a: Any, b: Any, where: str) -> None:
    """``a == b`` all the way down, tensors by ``torch.equal`` (and dtype)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.is_floating_point():  # bit for bit, NaN where NaN (an explanation of an action without a prototype)
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
    """A saved state with each decision log's rows as rows: its cut into calls (``call_sizes``,
    ``call_logits``) follows when the staged single decisions were flushed (any ``state_dict()``
    call flushes them, in RAM too), so each row gets its call's attention logits instead."""
    if isinstance(value, dict):
        value = {key: unchunked(v) for key, v in value.items()}
        if "call_sizes" in value and "call_logits" in value:
            sizes, calls = value.pop("call_sizes"), value.pop("call_logits")
            logits = value.pop("logits")
            value["row_logits"] = logits[calls].repeat_interleave(sizes, 0) if len(calls) else logits
    return value


def without_logs(state: dict[str, Any]) -> dict[str, Any]:
    """A memory's state_dict without its in-RAM logs (a Decider's: its memory's)."""
    if "memory" in state:
        return {**state, "memory": without_logs(state["memory"])}
    extra = {key: value for key, value in state.get("_extra_state", {}).items() if not key.endswith("_log")}
    return {**state, "_extra_state": extra} if "_extra_state" in state else state


def state_of(decider: Decider) -> dict[str, Any]:
    """The Decider's state_dict (its memory's, the pending decisions, the expired count, the
    referral), each decision log's rows as rows."""
    return unchunked(decider.state_dict())


def assert_same(a: Decider, b: Decider, *, version: bool = True, logs: bool = True) -> None:
    """Every entry of the two Deciders' state_dicts equal (the memory's tensors with torch.equal,
    its extra state, the pending decisions, the expired count and the referral, and the memory's
    logs unless ``logs=False``: a Decider opened from a snapshot starts its in-RAM logs there, see
    test_a_reopened_memory_starts_its_logs_at_its_snapshot), and the versions."""
    sa, sb = state_of(a), state_of(b)
    if not logs:
        sa, sb = without_logs(sa), without_logs(sb)
    assert list(sa) == list(sb) and list(sa["memory"]) == list(sb["memory"])
    for name in sa:
        assert_equal_values(sa[name], sb[name], name)
    if version:
        assert a.version == b.version == a.memory.version


def learned(memory) -> dict[str, torch.Tensor]:
    """The learned buffers and the parameters (of a Decider: of its memory)."""
    if isinstance(memory, Decider):
        memory = memory.memory
    return {name: t.detach().clone() for name, t in [*memory.named_parameters(), *memory.named_buffers()]}


def assert_same_learned(a, b) -> None:
    ta, tb = learned(a), learned(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def assert_same_decision(got, want, *, same_id: bool = True) -> None:
    assert (got.action, got.confidence, got.probs) == (want.action, want.confidence, want.probs)
    assert (got.category, got.version, got.created_at, got.source_id) == (want.category, want.version,
                                                                          want.created_at, want.source_id)
    if same_id:
        assert got.id == want.id


def frozen(decider: Decider) -> tuple:
    """What a refused call must leave as it was: the state_dict (cloned), the version, the pending
    decisions and the ledger's events."""
    ledger = ledger_of(decider)
    state = copy.deepcopy(state_of(decider))
    return state, decider.version, decider.pending(now=0.0), ledger.events(0), ledger.position()


def assert_frozen(decider: Decider, before: tuple, *, logs: bool = True) -> None:
    state, version, pending, events, position = before
    ledger = ledger_of(decider)
    assert ledger.position() == position
    assert_events_equal(ledger.events(0), events)
    assert decider.version == version and decider.pending(now=0.0) == pending
    now = state_of(decider)
    if not logs:
        state, now = without_logs(state), without_logs(now)
    assert list(now) == list(state) and list(now["memory"]) == list(state["memory"])
    for name in state:
        assert_equal_values(now[name], state[name], name)


def assert_events_equal(got: list, want: list) -> None:
    assert len(got) == len(want)
    for x, y in zip(got, want, strict=True):
        assert (x.kind, x.seq, x.decision_id, x.action, x.category, x.detail) == (y.kind, y.seq, y.decision_id,
                                                                                   y.action, y.category, y.detail)
        assert (x.row is None) == (y.row is None) and (x.row is None or np.array_equal(x.row, y.row))


# -- one scenario, played on several memories at once ---------------------------------------
def drive(memories: list, n: int, seed: int = 0, *, close: bool = True, every: Any = None,
          start: float = 0.0) -> list[tuple[list[str], str]]:
    """The same calls on every memory, their answers compared as they come: decisions with and
    without an id and a source id, verified out of order (by name and by index, skipped, uncertain,
    two at once with verify_many), and learn_one between them. ``every(i)`` runs after step i.
    Returns the decisions left open (each memory's id, and the verified action to give)."""
    rng = np.random.default_rng(seed + 1000)
    opened: list[tuple[list[str], str]] = []
    for i, (row, category, action) in enumerate(stream(n, seed)):
        now = start + i
        if i % 7 == 6:  # learned directly
            answers = [m.learn_one(row, action, category) for m in memories]
            assert all(answer == answers[0] for answer in answers)
        else:
            given = f"case-{seed}-{i}" if i % 3 else None
            source = i % 4 if i % 2 else None
            decisions = [m.decide(row, category, id=given, source_id=source, now=now) for m in memories]
            for decision in decisions[1:]:
                assert_same_decision(decision, decisions[0], same_id=given is not None)
            opened.append(([d.id for d in decisions], action))
        while len(opened) > 2:  # verified out of order, a few kept open
            ids, verified = opened.pop(int(rng.integers(len(opened))))
            mode = int(rng.integers(6))
            if mode == 0:
                answers = [m.verify(key, verified, skip=True, now=now) for m, key in zip(memories, ids, strict=True)]
                assert answers[0] == {"skipped": True}
            elif mode == 1:
                answers = [m.verify(key, verified, outcome="__incorrect__", now=now)
                           for m, key in zip(memories, ids, strict=True)]
            elif mode == 2:
                other_ids, other = opened.pop(0)
                answers = [m.verify_many([key, other_key], [verified, A.index(other)], now=now)
                           for m, key, other_key in zip(memories, ids, other_ids, strict=True)]
            elif mode == 3:
                answers = [m.verify(key, A.index(verified), now=now) for m, key in zip(memories, ids, strict=True)]
            else:
                answers = [m.verify(key, verified, now=now) for m, key in zip(memories, ids, strict=True)]
            assert all(answer == answers[0] for answer in answers)
        if every is not None:
            every(i)
    if close:
        for ids, verified in opened:
            answers = [m.verify(key, verified, now=start + n) for m, key in zip(memories, ids, strict=True)]
            assert all(answer == answers[0] for answer in answers)
        opened = []
    return opened


# -- 1. the same calls, the same answers and state ---------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_decider_on_a_store_answers_and_learns_what_the_decider_in_ram_does(kind: str, tmp_path: Path) -> None:
    durable, ram = make(kind, tmp_path / "ledger.db", snapshot_every=5), make(kind)
    drive([durable, ram], 70, seed=1)
    assert durable.pending(now=100.0) == ram.pending(now=100.0) == []
    assert_same(durable, ram)
    assert durable.add_actions_("hold") is None and ram.add_actions_("hold") is None
    assert durable.add_categories_(["shipping"]) is None and ram.add_categories_(["shipping"]) is None
    drive([durable, ram], 20, seed=2, start=200.0)  # after a growth
    assert durable.memory.action_names == ram.memory.action_names
    assert durable.memory.category_names == ram.memory.category_names
    assert_same(durable, ram)
    assert_same(make(kind, tmp_path / "ledger.db"), ram, logs=False)  # and what it committed holds all of it
    assert durable.ledger_version == ledger_of(durable).position()[0] > 0 and ram.ledger_version is None
    assert_same_learned(replay(ledger_of(durable), memory_of(kind)), ram)  # the serial replay, event by event


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_a_decision_answers_its_recorded_values(kind: str, tmp_path: Path) -> None:
    memory = make(kind, tmp_path / "ledger.db")
    first = memory.decide([0.5] * K, "billing", id="case-1", source_id=3, now=10.0)
    assert first.id == "case-1" and first.source_id == 3 and first.created_at == 10.0
    assert first.action is None and first.probs == dict.fromkeys(A, 0.0)  # nothing learned: abstains
    anonymous = memory.decide([0.5] * K, "billing", now=11.0)
    assert len(anonymous.id) == 32 and memory.pending(now=12.0) == [first, anonymous]
    assert [e.kind for e in ledger_of(memory).events(0)] == ["decide", "decide"]


# -- 2. reopening --------------------------------------------------------------------------------
@pytest.mark.parametrize("snapshot_every", [3, 1000])
@pytest.mark.parametrize("kind", KINDS)
def test_a_memory_reopened_at_any_point_equals_the_memory_that_never_stopped(kind: str, snapshot_every: int,
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    live, ram = make(kind, path, snapshot_every=snapshot_every), make(kind)
    reopened = 0

    def reopen(i: int) -> None:
        nonlocal reopened
        if i % 9 == 4:
            assert_same(make(kind, path, snapshot_every=snapshot_every), live, logs=False)  # pending decisions included
            reopened += 1

    opened = drive([live, ram], 60, seed=3, close=False, every=reopen)
    assert reopened >= 6 and opened
    if snapshot_every == 3:
        assert ledger_of(live).snapshot() is not None
    back = make(kind, path, snapshot_every=snapshot_every)
    assert [d.id for d in back.pending(now=100.0)] == [d.id for d in live.pending(now=100.0)]
    for ids, verified in opened:  # the pending decisions verified from the reopened memory
        assert back.verify(ids[0], verified, now=100.0) == ram.verify(ids[1], verified, now=100.0)
    assert back.pending(now=100.0) == live.pending(now=100.0) == []  # the live memory caught up
    assert_same(back, ram, logs=False)
    assert_same(live, back, logs=False)


@pytest.mark.parametrize("kind", ["seed"])
def test_a_reopened_memory_starts_its_logs_at_its_snapshot(kind: str, tmp_path: Path) -> None:
    """By design: a snapshot holds the state, not the in-RAM logs (the ledger has every event), so
    it stays the size of the state; the learned state is the never-stopped memory's bit for bit."""
    path = tmp_path / "ledger.db"
    live = make(kind, path, snapshot_every=3)
    drive([live], 20, seed=3)
    snapshot = ledger_of(live).snapshot()
    assert snapshot is not None and set(snapshot.state) == {"memory", "referral"}  # the Decider's state, no pending
    extra = snapshot.state["memory"]["_extra_state"]  # of the logs, only where the next default source id is
    assert [key for key in extra if key.endswith("_log")] == ["decision_log"]
    assert set(extra["decision_log"]) == {"max_events", "next_source"}
    reopened = make(kind, path, snapshot_every=3)
    assert_same(reopened, live, logs=False)
    assert reopened.memory.next_source_id() == live.memory.next_source_id() > 0


@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_on_one_ledger_see_each_others_commits(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    a, b, ram = make(kind, path), make(kind, path), make(kind)
    data = stream(40, seed=4)
    for i, (row, category, action) in enumerate(data):
        decider, verifier = (a, b) if i % 2 else (b, a)
        decision = decider.decide(row, category, now=float(i))
        twin = ram.decide(row, category, now=float(i))
        assert_same_decision(decision, twin, same_id=False)
        assert [d.id for d in verifier.pending(now=float(i))] == [decision.id]  # made in the other process
        assert verifier.verify(decision.id, action, now=float(i)) == ram.verify(twin.id, action, now=float(i))
    row, category, _ = stream(1, seed=5)[0]
    from_a, from_b = a.decide(row, category, now=50.0), b.decide(row, category, now=50.0)
    assert_same_decision(from_b, from_a, same_id=False)  # b decides on what a verified and the other way round
    assert [d.id for d in a.pending(now=50.0)] == [d.id for d in b.pending(now=50.0)] == [from_a.id, from_b.id]
    a.learn_one(row, "approve", category)
    b.verify(from_a.id, "reject", now=51.0)
    a.verify(from_b.id, "reject", now=51.0)
    b.pending(now=51.0)
    assert_same(a, b)


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_two_memories_on_one_store_object_see_each_others_commits(kind: str, tmp_path: Path) -> None:
    store = sqlite(tmp_path / "ledger.db")
    a, b = make(kind, store), make(kind, store)
    for i, (row, category, action) in enumerate(stream(20, seed=6)):
        a.verify(b.decide(row, category, now=float(i)).id, action, now=float(i))
    assert b.pending(now=20.0) == []  # b catches up with a's last verification
    assert_same(a, b)
    lazy = make(kind, store, durable_decisions=False)  # decides without the write lock: still caught up
    row, category, _ = stream(1, seed=7)[0]
    a.learn_one(row, "escalate", category)
    assert_same_decision(lazy.decide(row, category, now=30.0), a.decide(row, category, now=30.0), same_id=False)


# -- 3. the ledger's names and settings --------------------------------------------------------
MISMATCHES = {
    "a config option": (lambda store: Decider(JudgmentMemory(C, A, K, config=SEED, tau=0.3), store=store), "tau"),
    "another config": (lambda store: Decider(JudgmentMemory(C, A, K, JudgmentConfig.recommended()), store=store),
                       "prototypes"),
    "other factors": (lambda store: Decider(JudgmentMemory(C, A, ["a", "b", "c", "d", "e"], config=SEED), store=store),
                      "factors"),
    "more factors": (lambda store: Decider(JudgmentMemory(C, A, K + 1, config=SEED), store=store), "factors"),
    "other actions": (lambda store: Decider(JudgmentMemory(C, ("approve", "deny", "escalate"), K, config=SEED),
                                            store=store),
                      "actions"),
    "fewer actions, not a start": (lambda store: Decider(JudgmentMemory(C, A[1:], K, config=SEED), store=store),
                                   "actions"),
    "the actions in another order": (lambda store: Decider(JudgmentMemory(C, A[::-1], K, config=SEED), store=store),
                                     "actions"),
    "a new action, no grow": (lambda store: Decider(JudgmentMemory(C, (*A, "hold"), K, config=SEED), store=store),
                              "actions"),
    "other categories": (lambda store: Decider(JudgmentMemory((*C[:2], "tax"), A, K, config=SEED), store=store),
                         "categories"),
    "fewer categories, not a start": (lambda store: Decider(JudgmentMemory(C[1:], A, K, config=SEED), store=store),
                                      "categories"),
    "another kind": (lambda store: Decider(KNNMemory(factors=K, actions=A, categories=C), store=store,
                                           ledger="judgment"), "kind"),
    "a memory that learned": (lambda store: Decider(learned_once(), store=store), "learned"),
}


def learned_once() -> JudgmentMemory:
    memory = JudgmentMemory(C, A, K, config=SEED)
    memory.learn_one([0.3] * K, "reject", "refund")
    return memory


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_a_memory_unlike_the_ledgers_is_refused_naming_what_differs(case: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    decider = Decider(JudgmentMemory(C, A, K, config=SEED), store=sqlite(path))
    decider.learn_one([0.1] * K, "approve", "billing")
    before = ledger_of(decider).events(0)
    build, field = MISMATCHES[case]
    with pytest.raises(ValueError, match=field):
        build(sqlite(path))
    assert_events_equal(ledger_of(decider).events(0), before)
    assert_same(Decider(JudgmentMemory(C, A, K, config=SEED), store=sqlite(path)), decider, logs=False)


@pytest.mark.parametrize("names", ["actions", "categories", "both"])
def test_a_memory_with_a_start_of_the_ledgers_names_grows_to_them(names: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    decider = Decider(JudgmentMemory(C, A, K, config=SEED), store=sqlite(path))
    forgetting_run(decider, 10, seed=24)
    before = ledger_of(decider).events(0)
    categories, actions = (C[:1] if names != "actions" else C), (A[:2] if names != "categories" else A)
    opened = Decider(JudgmentMemory(categories, actions, K, config=SEED), store=sqlite(path))
    assert opened.memory.category_names == C and opened.memory.action_names == A
    assert_events_equal(ledger_of(decider).events(0), before)  # nothing written: the names were the ledger's
    assert_same(opened, decider, logs=False)


def test_knn_settings_and_categories_must_match_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Decider(KNNMemory(factors=K, actions=A, k=3, capacity=40, categories=C), store=sqlite(path))
    for options, field in (({"k": 4}, "k"), ({"capacity": 41}, "capacity"), ({"scoped": True}, "scoped"),
                           ({"respect_skip": True}, "respect_skip"), ({"categories": None}, "categories")):
        with pytest.raises(ValueError, match=field):
            Decider(KNNMemory(factors=K, actions=A, **{"k": 3, "capacity": 40, "categories": C, **options}),
                    store=sqlite(path))
    other = Decider(KNNMemory(factors=K, actions=A, k=3, capacity=40, categories=C), store=sqlite(path),
                    ledger="other")
    assert other.version == 0 and ledgers(sqlite(path)) == ["knn", "other"]


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_grow_adds_the_new_names_and_a_reopened_memory_keeps_the_ledgers(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    first = make(kind, path)
    first.learn_one([0.1] * K, "approve", "billing")
    if kind == "knn":
        grown = Decider(KNNMemory(factors=K, actions=(*A, "hold"), k=3, capacity=40, categories=(*C, "shipping"),
                                  scoped=True, grow=True), store=sqlite(path))
    else:
        grown = Decider(JudgmentMemory((*C, "shipping"), (*A, "hold"), K, CONFIGS[kind], grow=True),
                        store=sqlite(path))
    assert grown.memory.action_names == (*A, "hold") and grown.memory.category_names == (*C, "shipping")
    assert [e.kind for e in ledger_of(grown).events(0)] == ["learn", "grow"]
    grown.verify(grown.decide([0.9] * K, "shipping", now=1.0).id, "hold", now=1.0)
    again = make(kind, path)  # the names it was created with: it is opened with the ledger's names
    assert again.memory.action_names == (*A, "hold") and again.memory.category_names == (*C, "shipping")
    assert_same(again, grown, logs=False)
    first.pending()  # the memory opened before the growth catches up with it
    assert first.memory.action_names == (*A, "hold")
    assert_same(first, grown, logs=False)
    assert make(kind, path, grow=True).memory.action_names == (*A, "hold")  # nothing new: nothing written
    assert len(ledger_of(grown).events(0)) == 4




def test_a_memory_with_the_grown_ledgers_names_is_not_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Decider(JudgmentMemory(C, A, K, config=SEED), store=sqlite(path))
    Decider(JudgmentMemory(C, (*A, "hold"), K, config=SEED, grow=True), store=sqlite(path))
    assert Decider(JudgmentMemory(C, (*A, "hold"), K, config=SEED), store=sqlite(path)).memory.action_names == (*A,
                                                                                                                "hold")


# -- 3b. the memory on a ledger is the ledger's ---------------------------------------------------
@pytest.mark.parametrize("argument", ["store", "ledger", "snapshot_every", "durable_decisions"])
@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_a_memory_given_a_store_names_the_decider_and_writes_nothing(kind: str, argument: str,
                                                                      tmp_path: Path) -> None:
    store = sqlite(tmp_path / "ledger.db")
    value = {"store": store, "ledger": "judgment", "snapshot_every": 5, "durable_decisions": False}[argument]
    owner = "JudgmentMemory" if kind in CONFIGS else "KNNMemory"
    with pytest.raises(TypeError) as info:
        memory_of(kind, **{argument: value})
    message = str(info.value)
    assert f"Decider({owner}(...), {argument}=...)" in message and "\n" not in message, message
    assert ledgers(store) == []  # no ledger was begun


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_a_decider_on_a_store_has_the_surface_of_one_in_ram_and_the_memory_keeps_its_own(kind: str,
                                                                                       tmp_path: Path) -> None:
    memory = memory_of(kind)
    surface = set(dir(memory))
    in_ram, durable = Decider(memory_of(kind)), Decider(memory, store=sqlite(tmp_path / "ledger.db"))

    def public(decider: Decider) -> set[str]:
        return {name for name in dir(decider) if not name.startswith("_")}

    assert public(in_ram) == public(durable) and type(in_ram) is type(durable)
    assert {"decide", "verify", "verify_many", "pending", "learn_one", "add_actions_", "add_categories_", "forget_",
            "undo_", "explain_decision", "sync", "close", "state_dict", "load_state_dict", "memory", "referral",
            "target_error", "max_pending", "pending_ttl", "expired_decisions", "version",
            "ledger_version"} <= public(durable)
    assert durable.memory is memory and set(dir(memory)) == surface  # the model is not rewired by its ledger
    assert not [name for name, value in vars(memory).items() if callable(value) and not isinstance(value, type)
                and name not in ("_lock",) and not isinstance(value, torch.nn.Module)]  # no method set per instance
    assert "ledger='knn'" in repr(durable) if kind == "knn" else "ledger='judgment'" in repr(durable)


def change_learn_one(decider: Decider) -> None:
    decider.memory.learn_one(ROW, "approve", "billing")


def change_prequential(decider: Decider) -> None:
    decider.memory.prequential_(torch.full((1, K), 0.2), torch.zeros(1, dtype=torch.long),
                                torch.zeros(1, dtype=torch.long))


def change_learn(decider: Decider) -> None:
    decider.memory.learn_(torch.full((1, K), 0.2), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


def change_names(decider: Decider) -> None:
    decider.memory.add_actions_("hold")


def change_load(decider: Decider) -> None:
    decider.memory.load_state_dict(decider.memory.empty_like().state_dict())


def change_load_alike(decider: Decider) -> None:
    """A state of as many decisions (the same version), learned from others."""
    other = decider.memory.empty_like()
    while other.version < decider.memory.version:
        other.learn_one([0.9] * K, "escalate", "fraud")
    assert other.version == decider.memory.version
    decider.memory.load_state_dict(other.state_dict())


def change_undo(decider: Decider) -> None:
    decider.memory.undo_(1)


def change_window(decider: Decider) -> None:
    decider.memory.keep_newest_(1)


BEHIND_ITS_BACK = {"learn_one": (change_learn_one, KINDS), "prequential_": (change_prequential, KINDS),
                   "learn_": (change_learn, KINDS), "add_actions_": (change_names, KINDS),
                   "load_state_dict": (change_load, KINDS), "load_state_dict of the same version":
                   (change_load_alike, KINDS), "undo_": (change_undo, list(CONFIGS)),
                   "keep_newest_": (change_window, ["knn"])}  # (a k-NN keeps no log to undo from)
NEXT_CALLS = {
    "decide": lambda m: m.decide(ROW, "billing", now=5.0), "verify": lambda m: m.verify("open", "approve", now=5.0),
    "verify_many": lambda m: m.verify_many(["open"], ["approve"], now=5.0),
    "learn_one": lambda m: m.learn_one(ROW, "approve", "billing"), "pending": lambda m: m.pending(now=5.0),
    "sync": lambda m: m.sync(), "forget_": lambda m: m.forget_([1]), "undo_": lambda m: m.undo_(1),
    "explain_decision": lambda m: m.explain_decision("open"), "add_categories_": lambda m: m.add_categories_("tax"),
    "max_pending": lambda m: setattr(m, "max_pending", 1)}


@pytest.mark.parametrize(("kind", "change"), [(kind, change) for change, (_, kinds) in sorted(BEHIND_ITS_BACK.items())
                                               for kind in kinds])
def test_a_memory_changed_behind_its_deciders_back_is_refused_at_the_next_call(kind: str, change: str,
                                                                              tmp_path: Path) -> None:
    act = BEHIND_ITS_BACK[change][0]
    path = tmp_path / "ledger.db"
    decider = make(kind, path, snapshot_every=3)
    rows = forgetting_run(decider, 10, seed=20)
    decider.decide(ROW, "billing", id="open", source_id=1, now=4.0)
    ledger = ledger_of(decider)
    events, position = ledger.events(0), ledger.position()
    want = state_of(make(kind, path, snapshot_every=3))
    act(decider)
    for name, call in NEXT_CALLS.items():
        with pytest.raises(RuntimeError, match="decider.memory was changed outside"):
            call(decider)
        assert ledger.position() == position, name  # nothing written
    assert_events_equal(ledger.events(0), events)
    back = make(kind, path, snapshot_every=3)  # a new Decider on the store gets the ledger's state back
    got = state_of(back)
    for key in want:
        assert_equal_values(without_logs(got)[key], without_logs(want)[key], key)
    assert_same_learned(back, fed(kind, rows))
    back.verify("open", "approve", now=6.0)  # and goes on


@pytest.mark.parametrize("kind", KINDS)
def test_a_memory_that_learned_starts_a_new_ledger_from_a_snapshot_at_seq_0(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    memory = memory_of(kind)
    for i, (row, category, action) in enumerate(stream(30, seed=21)):
        memory.learn_one(row, action, category, source_id=i % 3)
    ram = Decider(copy.deepcopy(memory))
    durable = Decider(memory, store=sqlite(path), snapshot_every=1000)
    ledger = ledger_of(durable)
    snapshot = ledger.snapshot()
    assert snapshot is not None and snapshot.seq == 0 and snapshot.version == memory.version == ram.version > 0
    assert ledger.events(0) == [] and ledger.position()[0] == 0 and durable.ledger_version == 0
    assert_same(make(kind, path), durable, logs=False)  # a reopened Decider starts where the memory was
    assert_same_learned(replay(ledger, memory_of(kind)), durable)
    drive([durable, ram], 25, seed=22)
    assert_same(durable, ram)
    assert_same(make(kind, path), ram, logs=False)
    assert_same_learned(replay(ledger, memory_of(kind)), ram)
    twice = memory_of(kind)
    twice.learn_one(ROW, "approve", "billing")
    with pytest.raises(ValueError, match="learned 1 decision"):  # the ledger exists now: its state is the one
        Decider(twice, store=sqlite(path))
    assert_same(make(kind, path), ram, logs=False)


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_a_decider_on_a_store_is_not_copied_and_its_state_is_the_ledgers(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    durable = make(kind, path)
    forgetting_run(durable, 10, seed=23)
    durable.decide(ROW, "billing", id="open", now=1.0)
    for copying in (copy.deepcopy, copy.copy, lambda d: pickle.dumps(d)):
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            copying(durable)
    before = frozen(durable)
    with pytest.raises(TypeError, match="load_state_dict"):
        durable.load_state_dict(make(kind).state_dict())
    assert_frozen(durable, before)
    in_ram = make(kind)  # its state_dict goes to a Decider in RAM, pending decisions and all
    in_ram.load_state_dict(durable.state_dict())
    assert_same(in_ram, durable)
    assert in_ram.verify("open", "approve", now=2.0) == durable.verify("open", "approve", now=2.0)
    assert_same_learned(in_ram, durable)


def test_a_closed_decider_leaves_its_ledger_and_writes_what_it_held(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with make("seed", path, durable_decisions=False) as decider:
        buffered = decider.decide(ROW, "billing", id="a", now=1.0)
        assert make("seed", path).pending(now=1.0) == []
    assert make("seed", path).pending(now=1.0) == [buffered]  # written as it left
    for name, call in NEXT_CALLS.items():
        with pytest.raises(RuntimeError, match="close"):
            call(decider)
        assert len(ledger_of(decider).events(0)) == 1, name
    decider.close()  # twice: nothing to do


# -- 4. bad input changes nothing ----------------------------------------------------------------
ROW = [0.2] * K
BAD_CALLS = {  # name: (the call, the error the memory in RAM raises for it, what the message names)
    "unknown id": (lambda m: m.verify("nope", "approve", now=1.0), KeyError, "nope"),
    "verified already": (lambda m: m.verify("done", "approve", now=1.0), KeyError, "done"),
    "an unknown verified action": (lambda m: m.verify("open", "sell", now=1.0), ValueError, "action"),
    "a verified action index out of range": (lambda m: m.verify("open", 9, now=1.0), ValueError, "action"),
    "a float verified action": (lambda m: m.verify("open", 1.5, now=1.0), TypeError, "action"),
    "a bad outcome": (lambda m: m.verify("open", "approve", outcome=3, now=1.0), TypeError, "outcome"),
    "a bad skip": (lambda m: m.verify("open", "approve", skip=1, now=1.0), TypeError, "skip"),
    "verify_many with an unknown id": (lambda m: m.verify_many(["open", "nope"], ["approve"] * 2, now=1.0),
                                       KeyError, "nope"),
    "verify_many naming one twice": (lambda m: m.verify_many(["open", "open"], ["approve"] * 2, now=1.0),
                                     ValueError, "twice"),
    "verify_many of other lengths": (lambda m: m.verify_many(["open"], [], now=1.0), ValueError, "one entry"),
    "a duplicate id": (lambda m: m.decide(ROW, "refund", id="open", now=1.0), ValueError, "already pending"),
    "NaN factors": (lambda m: m.decide([math.nan] * K, "refund", now=1.0), ValueError, "factor"),
    "infinite factors": (lambda m: m.decide([math.inf] * K, "refund", now=1.0), ValueError, "factor"),
    "factors past the learning limit": (lambda m: m.decide([1e30] * K, "refund", now=1.0), ValueError, "factor"),
    "too many factors": (lambda m: m.decide([0.2] * (K + 1), "refund", now=1.0), ValueError, "factor"),
    "too few factors": (lambda m: m.decide([0.2] * (K - 1), "refund", now=1.0), ValueError, "factor"),
    "an unknown category": (lambda m: m.decide(ROW, "shipping", now=1.0), ValueError, "category"),
    "a float category": (lambda m: m.decide(ROW, 1.5, now=1.0), TypeError, "category"),
    "a bool category": (lambda m: m.decide(ROW, True, now=1.0), TypeError, "category"),
    "an int id": (lambda m: m.decide(ROW, "refund", id=7, now=1.0), TypeError, "id"),
    "a negative source id": (lambda m: m.decide(ROW, "refund", source_id=-1, now=1.0), ValueError, "source_id"),
    "a NaN now": (lambda m: m.decide(ROW, "refund", now=math.nan), ValueError, "now"),
    "learn_one of NaN factors": (lambda m: m.learn_one([math.nan] * K, "approve", "billing"), ValueError, "factor"),
    "learn_one of an unknown action": (lambda m: m.learn_one(ROW, "sell", "billing"), ValueError, "action"),
    "learn_one of an unknown category": (lambda m: m.learn_one(ROW, "approve", "shipping"), ValueError,
                                         "category"),
    "learn_one of a bad outcome": (lambda m: m.learn_one(ROW, "approve", "billing", outcome=3), TypeError,
                                   "outcome"),
    "an action added twice": (lambda m: m.add_actions_("approve"), ValueError, "approve"),
    "a category named twice": (lambda m: m.add_categories_(["x", "x"]), ValueError, "x"),
    "forget_ of an unknown source": (lambda m: m.forget_([12345]), ValueError, "12345"),
    "undo_ of more than learned": (lambda m: m.undo_(50), ValueError, "undo_"),
    "forget_ with a bad erase": (lambda m: m.forget_([1], erase=1), TypeError, "erase"),
    "learn_one of a bad source id": (lambda m: m.learn_one(ROW, "approve", "billing", source_id=-2), ValueError,
                                     "source_id"),
    "undo_ with a bad reason": (lambda m: m.undo_(1, reason=None), TypeError, "reason"),
    "a max_pending of zero": (lambda m: setattr(m, "max_pending", 0), ValueError, "max_pending"),
}



def bad_input_memory(kind: str, path: Path | None):
    """A Decider (on a ledger at ``path``, or in RAM) with decisions learned, one verified as "done", one "open"."""
    memory = make(kind, path, snapshot_every=3) if path is not None else make(kind)
    for row, category, action in stream(12, seed=8):
        memory.verify(memory.decide(row, category, source_id=1, now=0.0).id, action, now=0.0)
    memory.verify(memory.decide(ROW, "refund", id="done", now=0.0).id, "approve", now=0.0)
    memory.decide(ROW, "refund", id="open", now=0.0)
    return memory




@pytest.mark.parametrize("case", sorted(BAD_CALLS))
@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_a_refused_call_changes_nothing_in_ram_or_in_the_ledger(kind: str, case: str, tmp_path: Path) -> None:
    memory = bad_input_memory(kind, tmp_path / "ledger.db")
    call = BAD_CALLS[case][0]
    logs = kind != "seed" or case not in ("forget_ of an unknown source", "undo_ of more than learned")
    before = frozen(memory)  # (without the logs a refused forget_ drops: test_a_refused_forget_keeps_the_logs)
    with pytest.raises(Exception):  # noqa: B017, PT011 - which one: test_a_refused_call_raises_the_error_...
        call(memory)
    assert_frozen(memory, before, logs=logs)
    assert_same(make(kind, tmp_path / "ledger.db"), memory, logs=False)  # nothing of it reached the ledger
    memory.verify("open", "approve", now=2.0)  # and the memory goes on
    assert memory.pending(now=2.0) == []


@pytest.mark.parametrize("call", [lambda m: m.forget_([12345]), lambda m: m.undo_(50)], ids=["forget_", "undo_"])
def test_a_refused_forget_keeps_the_logs(call: Any, tmp_path: Path) -> None:
    memory = bad_input_memory("seed", tmp_path / "ledger.db")
    before = frozen(memory)
    with pytest.raises(ValueError):
        call(memory)
    assert_frozen(memory, before)


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_refused_call_raises_the_error_of_the_decider_in_ram(case: str, tmp_path: Path) -> None:
    call, error, match = BAD_CALLS[case]
    for where in (tmp_path / "ledger.db", None):
        memory = bad_input_memory("seed", where)
        with pytest.raises(error, match=match):
            call(memory)


# -- 5. forget_ and undo_ ------------------------------------------------------------------------
def forgetting_run(memory, n: int, seed: int) -> list[dict[str, Any]]:
    """Decisions verified (two at a time in reverse order, source id i % 5) and learn_one between
    them; returns what was learned, in ledger order, with the confirmed flag each was learned with."""
    rows: list[dict[str, Any]] = []
    data = stream(n, seed)
    for i in range(0, n - 1, 2):
        (x1, c1, a1), (x2, c2, a2) = data[i], data[i + 1]
        if i % 10 == 8:
            memory.learn_one(x1, a1, c1)
            rows.append({"x": x1, "action": a1, "category": c1, "confirmed": True, "source": None})
            continue
        d1 = memory.decide(x1, c1, source_id=i % 5, now=float(i))
        d2 = memory.decide(x2, c2, source_id=(i + 1) % 5, now=float(i))
        memory.verify(d2.id, a2, now=float(i))
        memory.verify(d1.id, a1, now=float(i))
        rows += [{"x": x2, "action": a2, "category": c2, "confirmed": d2.action == a2, "source": (i + 1) % 5,
                  "id": d2.id},
                 {"x": x1, "action": a1, "category": c1, "confirmed": d1.action == a1, "source": i % 5, "id": d1.id}]
    return rows


def fed(kind: str, rows: list[dict[str, Any]]):
    """A memory in RAM fed these decisions, nothing else."""
    memory = make(kind)
    for r in rows:
        memory.learn_one(r["x"], r["action"], r["category"], confirmed=r["confirmed"])
    return memory


@pytest.mark.parametrize("kind", KINDS)
def test_forget_and_undo_equal_a_memory_that_never_learned_them(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    memory = make(kind, sqlite(path, actor="dpo-officer"), snapshot_every=4)
    other = make(kind, path, snapshot_every=4)  # another process, open all along
    rows = forgetting_run(memory, 40, seed=9)
    kept_open = memory.decide(ROW, "billing", id="still-open", now=50.0)
    version = memory.version

    assert memory.forget_([1, 3], reason="request 17") == sum(r["source"] in (1, 3) for r in rows)
    kept = [r for r in rows if r["source"] not in (1, 3)]
    assert_same_learned(memory, fed(kind, kept))
    assert memory.pending(now=50.0) == [kept_open]
    if kind in CONFIGS:  # (a k-NN's version is its decisions seen: test_a_knn_version_only_grows)
        assert memory.version > version
    assert other.pending(now=50.0) == [kept_open]  # the other process rebuilt
    assert_same(other, memory, logs=False)
    if kind in CONFIGS:  # the same calls in RAM, then forget_ there
        ram = make(kind)
        forgetting_run(ram, 40, seed=9)
        ram.forget_([1, 3])
        assert_same_learned(memory, ram)
        forgotten = next(r["id"] for r in rows if r["source"] == 1)
        with pytest.raises(KeyError):
            memory.explain_decision(forgotten)

    version = memory.version
    memory.undo_(3, reason="mistake")
    assert_same_learned(memory, fed(kind, kept[:-3]))
    assert memory.version > version or kind == "knn"
    other.pending(now=50.0)
    assert_same(other, memory, logs=False)
    assert_same(make(kind, path, snapshot_every=4), memory, logs=False)  # a new process too

    audit = ledger_of(memory).audit()
    assert [(row["action"], row["reason"], row["count"], row["actor"]) for row in audit] == [
        ("forget", "request 17", len(rows) - len(kept), "dpo-officer"), ("undo", "mistake", 3, "dpo-officer")]
    assert all(set(row) == {"at", "actor", "action", "reason", "count", "seq"} for row in audit)
    assert all(isinstance(row["at"], float) and isinstance(row["seq"], int) for row in audit)

    version = memory.version  # learning goes on after them, as in RAM
    row, category, action = stream(1, seed=10)[0]
    memory.verify(memory.decide(row, category, now=60.0).id, action, now=60.0)
    assert memory.version > version


def test_a_knn_version_counts_the_decisions_it_holds(tmp_path: Path) -> None:
    """A k-NN's version is the decisions it has seen (num_decisions): forgetting lowers it, as it
    would be in a k-NN that never saw them (documented in docs/ledger.md)."""
    memory = make("knn", tmp_path / "ledger.db")
    forgetting_run(memory, 10, seed=19)
    version = memory.version
    memory.forget_([1])
    assert memory.version == int(memory.memory.num_decisions) < version
    memory.undo_(1)
    assert memory.version == int(memory.memory.num_decisions) < version - 1


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_forget_of_what_another_process_learned_since(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    a, b = make(kind, path), make(kind, path)
    rows = forgetting_run(a, 20, seed=11)
    b.learn_one(ROW, "approve", "billing")  # a has not seen it yet
    a.forget_([2])
    kept = [r for r in rows if r["source"] != 2] + [{"x": ROW, "action": "approve", "category": "billing",
                                                      "confirmed": True, "source": None}]
    assert_same_learned(a, fed(kind, kept))
    b.pending()
    assert_same(a, b, logs=False)


@pytest.mark.parametrize("where", ["wal", "file"])
@pytest.mark.parametrize("kind", ["seed", "knn"])
@pytest.mark.parametrize("how", ["forget", "undo"])
def test_erase_removes_the_forgotten_factors_from_every_file(kind: str, how: str, where: str, tmp_path: Path) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "ledger.db"
    store = SQLiteStore(path)  # the default synchronous=FULL
    memory = make(kind, store, snapshot_every=2)
    rows = forgetting_run(memory, 10, seed=12)
    secret = [0.5, 0.25, float(NEEDLE), 0.75, 0.5]
    memory.verify(memory.decide(secret, "fraud", source_id=99, now=20.0).id, "reject", now=20.0)
    if where == "file":  # the factors checkpointed into the database file, not only in its -wal
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    needles = {"float64": NEEDLE.tobytes(), "float32": np.float32(NEEDLE).tobytes()}

    def holding(needle: bytes) -> list[str]:
        return sorted(p.name for p in folder.iterdir() if needle in p.read_bytes())

    assert holding(needles["float64"]) == [{"wal": "ledger.db-wal", "file": "ledger.db"}[where]]
    if kind == "knn":  # the ring's float32 copy, in the snapshot taken after it
        assert holding(needles["float32"])
    if how == "forget":
        assert memory.forget_([99], erase=True, reason="erasure") == 1
    else:
        memory.undo_(1, erase=True)
    assert holding(needles["float64"]) == holding(needles["float32"]) == []
    assert_same_learned(memory, fed(kind, rows))
    assert_same(make(kind, path, snapshot_every=2), memory, logs=False)




def test_forget_with_erase_removes_a_skipped_decision_of_the_source(tmp_path: Path) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    memory = make("seed", SQLiteStore(folder / "ledger.db"))
    secret = [0.5, 0.25, float(NEEDLE), 0.75, 0.5]
    memory.verify(memory.decide(secret, "fraud", source_id=7, now=1.0).id, "reject", skip=True, now=1.0)
    memory.verify(memory.decide(ROW, "fraud", source_id=7, now=2.0).id, "reject", now=2.0)
    memory.forget_([7], erase=True)
    assert [p.name for p in folder.iterdir() if NEEDLE.tobytes() in p.read_bytes()] == []


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_forget_without_erase_and_errors_of_forget(kind: str, tmp_path: Path) -> None:
    memory = make(kind, tmp_path / "ledger.db")
    rows = forgetting_run(memory, 10, seed=13)
    assert memory.forget_(np.array([0])) == sum(r["source"] == 0 for r in rows)
    with pytest.raises(ValueError, match="0"):  # forgotten already
        memory.forget_([0])
    with pytest.raises(TypeError, match="reason"):
        memory.forget_([1], reason=3)
    with pytest.raises(ValueError, match="n"):
        memory.undo_(0)
    assert_same_learned(memory, fed(kind, [r for r in rows if r["source"] != 0]))




def test_forget_keeps_a_later_decision_that_reused_the_id(tmp_path: Path) -> None:
    memory = make("seed", tmp_path / "ledger.db")
    memory.verify(memory.decide([0.1] * K, "billing", id="x", source_id=1, now=0.0).id, "approve", now=0.0)
    memory.verify(memory.decide([0.9] * K, "billing", id="x", source_id=2, now=1.0).id, "reject", now=1.0)
    assert memory.forget_([1]) == 1
    reference = make("seed")
    reference.learn_one([0.9] * K, "reject", "billing", confirmed=False)
    assert_same_learned(memory, reference)




def test_forget_keeps_a_pending_decision_that_reused_the_id(tmp_path: Path) -> None:
    memory = make("seed", tmp_path / "ledger.db")
    memory.verify(memory.decide([0.1] * K, "billing", id="y", source_id=1, now=0.0).id, "approve", now=0.0)
    pending = memory.decide([0.9] * K, "billing", id="y", source_id=2, now=1.0)
    memory.forget_([1])
    assert memory.pending(now=1.0) == [pending]
    assert make("seed", tmp_path / "ledger.db").pending(now=1.0) == [pending]


# -- the past ------------------------------------------------------------------------------------
def explained(decider: Decider, row: list[float], category: str) -> Any:
    """What ``explain_decision`` answers for a decision made now: the memory's ``explain`` (a
    judgment's Explanation; a k-NN's ``neighbours``, which its ``explain`` of one decision is)."""
    memory = decider.memory
    if isinstance(memory, JudgmentMemory):
        return memory.explain(row, category)
    neighbours = memory.neighbours(torch.tensor([row], dtype=torch.float64), torch.tensor([C.index(category)]))
    assert_equal_values(memory.explain(row, category), neighbours, "explain")
    return neighbours


def assert_same_explanation(got, want) -> None:
    assert type(got) is type(want) and str(got) == str(want)
    if isinstance(want, tuple):  # a k-NN's Retrieved
        assert_equal_values(got, want, "retrieved")
        return
    for name, value in vars(want).items():
        assert_equal_values(getattr(got, name), value, name)


@pytest.mark.parametrize("kind", KINDS)
def test_explain_decision_explains_with_the_state_the_decision_was_made_with(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    memory, ram = make(kind, path, snapshot_every=3), make(kind)
    answers: dict[str, Any] = {}
    data = stream(40, seed=14)
    for i in range(0, 40, 2):
        (x1, c1, a1), (x2, c2, a2) = data[i], data[i + 1]
        d1 = memory.decide(x1, c1, now=float(i))
        answers[d1.id] = explained(ram, x1, c1)  # the state it is made with
        ram.decide(x1, c1, id=d1.id, now=float(i))
        d2 = memory.decide(x2, c2, now=float(i))
        answers[d2.id] = explained(ram, x2, c2)
        ram.decide(x2, c2, id=d2.id, now=float(i))
        if i % 8 == 6:
            memory.learn_one(x2, a2, c2)
            ram.learn_one(x2, a2, c2)
        for key, action in ((d2.id, a2), (d1.id, a1)) if i < 36 else ():  # the last four stay pending
            assert memory.verify(key, action, now=float(i)) == ram.verify(key, action, now=float(i))
    reopened = make(kind, path, snapshot_every=3)
    for i, (key, want) in enumerate(answers.items()):
        assert_same_explanation(memory.explain_decision(key), want)
        if i % 3 == 0:
            assert_same_explanation(reopened.explain_decision(key), want)
    with pytest.raises(KeyError):
        memory.explain_decision("never")
    with pytest.raises(ValueError, match="store"):
        ram.explain_decision(next(iter(answers)))


# -- 6. durable_decisions=False --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_buffered_decisions_are_written_at_the_next_write_or_sync(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    memory, ram = make(kind, path, durable_decisions=False), make(kind)
    first = memory.decide(ROW, "billing", id="a", now=1.0)
    assert memory.pending(now=1.0) == [first]
    assert ledger_of(memory).events(0) == [] and make(kind, path).pending(now=1.0) == []  # a crash now loses it
    memory.sync()
    assert make(kind, path).pending(now=1.0) == [first]
    second = memory.decide([0.4] * K, "refund", id="b", now=2.0)
    assert [d.id for d in make(kind, path).pending(now=2.0)] == ["a"]
    memory.learn_one([0.3] * K, "approve", "billing")  # any write call takes it along
    assert make(kind, path).pending(now=2.0) == [first, second]
    third = memory.decide([0.6] * K, "fraud", id="c", now=3.0)
    answer = memory.verify("c", "reject", now=3.0)  # a verification is always durable, with its decision
    reopened = make(kind, path)
    assert reopened.pending(now=3.0) == [first, second]
    for key, row, category in (("a", ROW, "billing"), ("b", [0.4] * K, "refund")):
        ram.decide(row, category, id=key, now=1.0 if key == "a" else 2.0)
    ram.learn_one([0.3] * K, "approve", "billing")
    twin = ram.decide([0.6] * K, "fraud", id="c", now=3.0)
    assert_same_decision(third, twin)
    assert answer == ram.verify("c", "reject", now=3.0)
    assert_same(reopened, ram, logs=False)
    assert_same(memory, ram)
    memory.sync()  # nothing buffered: nothing written
    assert len(ledger_of(memory).events(0)) == 5


def test_a_buffered_decision_sees_what_other_processes_verified(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    writer, lazy = make("seed", path), make("seed", path, durable_decisions=False)
    for i, (row, category, action) in enumerate(stream(20, seed=15)):
        writer.verify(writer.decide(row, category, now=float(i)).id, action, now=float(i))
        row2, category2, _ = stream(1, seed=100 + i)[0]
        assert_same_decision(lazy.decide(row2, category2, now=float(i)), writer.decide(row2, category2, now=float(i)),
                             same_id=False)
    writer.pending(now=0.0)
    lazy.sync()
    mine = [d.id for d in lazy.pending(now=0.0)]
    assert sorted(d.id for d in writer.pending(now=0.0)) == sorted(mine)
    assert sorted(d.id for d in make("seed", path).pending(now=0.0)) == sorted(mine) and len(mine) == 40
    assert_same_learned(lazy, writer)
    assert lazy.version == writer.version


# -- 7. pending_ttl and max_pending ----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_expired_decisions_are_closed_in_the_ledger_and_counted_on_reopen(kind: str, tmp_path: Path) -> None:
    path, limits = tmp_path / "ledger.db", {"pending_ttl": 10.0, "max_pending": 3}
    memory, ram = make(kind, path, **limits), make(kind, **limits)
    ids = []
    for i in range(5):  # over max_pending: the oldest two expire
        decision = memory.decide([0.1 * i] * K, "billing", id=f"t{i}", now=float(i))
        assert_same_decision(decision, ram.decide([0.1 * i] * K, "billing", id=f"t{i}", now=float(i)))
        ids.append(decision.id)
    assert [d.id for d in memory.pending(now=4.0)] == ids[2:] and memory.expired_decisions == 2
    reopened = make(kind, path, **limits)
    assert [d.id for d in reopened.pending(now=4.0)] == ids[2:] and reopened.expired_decisions == 2
    assert list(reopened._book.open) == ids[2:]
    late = memory.decide([0.5] * K, "billing", id="late", now=12.5)  # t2, made at 2.0, is past its ten seconds
    ram.decide([0.5] * K, "billing", id="late", now=12.5)
    assert memory.pending(now=12.5) == ram.pending(now=12.5) == [*ram.pending(now=12.5)[:2], late]
    assert [d.id for d in memory.pending(now=12.5)] == ["t3", "t4", "late"]
    assert memory.expired_decisions == ram.expired_decisions == 3
    closes = [(e.decision_id, e.detail) for e in ledger_of(memory).events(0) if e.kind == "close"]
    assert closes == [(f"t{i}", {"reason": "expired"}) for i in range(3)]
    reopened = make(kind, path, **limits)
    assert list(reopened._book.open) == ["t3", "t4", "late"] and reopened.expired_decisions == 3
    assert reopened.verify("t4", "approve", now=13.5) == ram.verify("t4", "approve", now=13.5)  # t3 expires now
    assert reopened.expired_decisions == ram.expired_decisions == 4
    assert_same(make(kind, path, **limits), ram, logs=False)
    assert "t3" not in make(kind, path, **limits)._book.open




def test_pending_expires_and_counts_as_in_ram(tmp_path: Path) -> None:
    memory, ram = make("seed", tmp_path / "ledger.db", pending_ttl=10.0), make("seed", pending_ttl=10.0)
    for m in (memory, ram):
        m.decide(ROW, "billing", id="old", now=0.0)
    assert memory.pending(now=11.0) == ram.pending(now=11.0) == []
    assert memory.expired_decisions == ram.expired_decisions == 1


def test_verifying_an_expired_decision_raises_key_error(tmp_path: Path) -> None:
    memory = make("seed", tmp_path / "ledger.db", pending_ttl=10.0)
    memory.decide(ROW, "billing", id="old", now=0.0)
    with pytest.raises(KeyError, match="old"):
        memory.verify("old", "approve", now=11.0)


# -- 8. PostgresStore --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The superuser DSN of a Postgres server that lives as long as this module's tests, and its data folder."""
    pgserver = pytest.importorskip("pgserver")
    pytest.importorskip("psycopg")
    folder = tmp_path_factory.mktemp("pgdata")
    server = pgserver.get_server(folder, cleanup_mode="stop")
    yield server.get_uri(), folder
    server.cleanup()


@pytest.fixture
def server(postgres: tuple[str, Path]) -> str:
    return postgres[0]


@pytest.mark.parametrize("kind", ["recommended", "knn"])
def test_postgres_reopen_equals_the_memory_that_never_stopped_and_forget(kind: str, dsn: str) -> None:
    from gae.storage import PostgresStore

    live, ram = make(kind, PostgresStore(dsn), snapshot_every=3), make(kind)
    other = make(kind, PostgresStore(dsn), snapshot_every=3)

    def reopen(i: int) -> None:
        if i % 10 == 5:
            assert_same(make(kind, PostgresStore(dsn), snapshot_every=3), live, logs=False)

    opened = drive([live, ram], 30, seed=16, close=False, every=reopen)
    back = make(kind, PostgresStore(dsn), snapshot_every=3)
    for ids, verified in opened:
        assert back.verify(ids[0], verified, now=40.0) == ram.verify(ids[1], verified, now=40.0)
    assert_same(back, ram, logs=False)

    rows = forgetting_run(live, 10, seed=17)
    assert live.forget_([2], reason="pg") == sum(r["source"] == 2 for r in rows)
    other.pending(now=0.0)
    assert_same(other, live, logs=False)
    assert_same(make(kind, PostgresStore(dsn), snapshot_every=3), live, logs=False)
    assert [(r["action"], r["reason"]) for r in ledger_of(live).audit()] == [("forget", "pg")]


def test_postgres_erase_says_why_the_server_cannot_promise_it_and_erases_once_it_can(
        postgres: tuple[str, Path], dsn: str) -> None:
    import psycopg

    from gae.storage import PostgresStore

    folder, needle = postgres[1], np.float64(0.987654321098765)

    def holding() -> list[Path]:
        return [p for p in folder.rglob("*") if p.is_file() and needle.tobytes() in p.read_bytes()]

    memory = make("knn", PostgresStore(dsn))
    rows = forgetting_run(memory, 10, seed=18)
    memory.verify(memory.decide([0.5, float(needle), 0.5, 0.5, 0.5], "fraud", source_id=98, now=30.0).id, "reject",
                  now=30.0)
    last = memory.decide(ROW, "billing", source_id=97, now=31.0)
    memory.verify(last.id, "approve", now=31.0)
    rows.append({"x": ROW, "action": "approve", "category": "billing", "confirmed": last.action == "approve",
                 "source": 97})
    assert holding()
    with psycopg.connect(dsn) as conn:
        recycle = conn.execute("SHOW wal_recycle").fetchone()[0]
    assert recycle == "on"  # pgserver's default (Postgres'): erase refuses, naming why, after the forget committed
    with pytest.raises(RuntimeError, match="wal_recycle"):
        memory.forget_([98], erase=True)
    assert holding()  # as it says: deleted, not erased
    assert_same_learned(memory, fed("knn", rows))  # the forgotten decision gone, though not erased
    assert_same(make("knn", PostgresStore(dsn)), memory, logs=False)
    assert [(r["action"], r["count"]) for r in ledger_of(memory).audit()] == [("forget", 1)]

    with psycopg.connect(postgres[0], autocommit=True) as admin:  # a server set up for erasure
        admin.execute("ALTER SYSTEM SET wal_recycle = off")
        admin.execute("SELECT pg_reload_conf()")
    try:
        assert memory.forget_([97], erase=True) == 1
        assert holding() == []  # the earlier forget's rows too: VACUUM FULL and the WAL's segments removed
    finally:
        with psycopg.connect(postgres[0], autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET wal_recycle")
            admin.execute("SELECT pg_reload_conf()")
    assert_same_learned(memory, fed("knn", rows[:-1]))
