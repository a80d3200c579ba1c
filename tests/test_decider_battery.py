"""One battery of checks applied to the Decider over every memory, in RAM, on SQLite and on Postgres.

Each check drives ``decide`` / ``verify`` as an agent does and holds the Decider to what a plain
model would do: its memory learns exactly what ``learn_one`` of the same verified decisions
teaches a twin (``confirmed`` meaning the recommendation made at decide time), a reopened
Decider (or a loaded state) is the same Decider, a forgotten or undone decision leaves the
state it would be without it, and a refused call changes nothing.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from gae.storage import SQLiteStore
from tests.conftest import ACTIONS, CATEGORIES, FACTORS, clustered_stream

NAMES = {"categories": [f"c{i}" for i in range(CATEGORIES)], "actions": [f"a{i}" for i in range(ACTIONS)],
         "factors": [f"f{i}" for i in range(FACTORS)]}
MEMORIES = {
    "judgment_seed": lambda: JudgmentMemory(NAMES["categories"], NAMES["actions"], NAMES["factors"],
                                            config=JudgmentConfig.seed()),
    "judgment_adaptive": lambda: JudgmentMemory(NAMES["categories"], NAMES["actions"], NAMES["factors"],
                                                config=JudgmentConfig.seed(), drift_mode="adaptive"),
    "judgment_recommended": lambda: JudgmentMemory(NAMES["categories"], NAMES["actions"], NAMES["factors"],
                                                   JudgmentConfig.recommended()),
    "knn": lambda: KNNMemory(factors=NAMES["factors"], actions=NAMES["actions"], k=3, capacity=40,
                             categories=NAMES["categories"]),
    "retrieval": lambda: RetrievalMemory(factors=NAMES["factors"], actions=NAMES["actions"], k=3, capacity=40,
                                         categories=NAMES["categories"], scoped=True),
}
SERVINGS = ("ram", "sqlite", "postgres")


class Serving:
    """Opens Deciders on one memory kind and one serving: in RAM, or on a fresh store of the kind."""

    def __init__(self, kind: str, where: str, tmp_path, request) -> None:
        self.kind, self.where = kind, where
        self.path = tmp_path / "ledger.db"
        self.dsn = request.getfixturevalue("dsn") if where == "postgres" else None
        self.stores: list = []

    def store(self):
        if self.where == "sqlite":
            store = SQLiteStore(self.path, synchronous="NORMAL")
        else:
            from gae.storage import PostgresStore

            store = PostgresStore(self.dsn)
        self.stores.append(store)
        return store

    def open(self, **options) -> Decider:
        memory = MEMORIES[self.kind]()
        return Decider(memory, **options) if self.where == "ram" else Decider(memory, store=self.store(), **options)

    def close(self) -> None:
        for store in self.stores:
            store.close()


# on Postgres, one judgment memory and the k-NN (the ledger's code is the same for every memory: SQLite shows it)
CELLS = [(kind, where) for kind in MEMORIES for where in SERVINGS
         if where != "postgres" or kind in ("judgment_seed", "knn")]


@pytest.fixture(params=CELLS, ids=lambda p: f"{p[0]}-{p[1]}")
def serving(request, tmp_path):
    kind, where = request.param
    made = Serving(kind, where, tmp_path, request)
    yield made
    made.close()


def decisions(n: int, seed: int = 0):
    stream = clustered_stream(seed, n)
    return [(stream.x[i].tolist(), NAMES["categories"][int(stream.category[i])],
             NAMES["actions"][int(stream.action[i])]) for i in range(n)]


def assert_same_memory(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key, value in sa.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, sb[key]), key


def feed(decider: Decider, stream, sources: bool = False):
    """decide then verify each decision (with its index as source id); returns the decisions."""
    made = []
    for i, (row, category, action) in enumerate(stream):
        decision = decider.decide(row, category, source_id=i if sources else None)
        decider.verify(decision.id, action)
        made.append(decision)
    return made


def test_the_memory_learns_what_learn_one_teaches_a_twin(serving):
    decider = serving.open()
    twin = MEMORIES[serving.kind]()
    for row, category, action in decisions(60):
        decision = decider.decide(row, category)
        assert decision.id in {d.id for d in decider.pending()}
        assert decision.refer == bool(decision.reasons) and decision.probs.keys() == set(NAMES["actions"])
        decider.verify(decision.id, action)
        twin.learn_one(row, action, category, decision.action == action)
    assert decider.pending() == [] and decider.memory.next_seq == 60
    assert_same_memory(decider.memory, twin)


def test_a_reopened_or_loaded_decider_is_the_same(serving):
    decider = serving.open(target_error=0.2)
    stream = decisions(50)
    feed(decider, stream[:40])
    open_ = [decider.decide(row, category, source_id=7) for row, category, _ in stream[40:]]
    again = serving.open(target_error=0.2)  # on a store: the same ledger (another process would open it so)
    if serving.where == "ram":
        again.load_state_dict(copy.deepcopy(decider.state_dict()))
    assert_same_memory(decider.memory, again.memory)
    assert [d.id for d in again.pending()] == [d.id for d in open_]
    assert again.referral.state() == decider.referral.state()
    row, category, action = stream[-1]
    assert again.decide(row, category).probs == decider.decide(row, category).probs  # both go on alike
    if serving.where == "ram":
        for each in (decider, again):
            for decision, (_, _, verified) in zip(open_, stream[40:], strict=True):
                each.verify(decision.id, verified)
    else:  # verified through one, learned by both (the other catches up at its next call)
        for decision, (_, _, verified) in zip(open_, stream[40:], strict=True):
            again.verify(decision.id, verified)
        decider.sync()
    assert_same_memory(decider.memory, again.memory)
    assert again.referral.state() == decider.referral.state()


def test_forget_leaves_the_state_of_a_decider_that_never_saw_them(serving):
    decider, clean = serving.open(), None
    stream = decisions(40)
    if serving.kind in ("knn", "retrieval") and serving.where == "ram":
        feed(decider, stream[:5], sources=True)
        with pytest.raises(ValueError, match="store"):  # a k-NN in RAM keeps no log to replay
            decider.forget_([1])
        return
    made = feed(decider, stream, sources=True)
    gone = {3, 17, 30}
    removed = decider.forget_(sorted(gone), reason="the user asked")
    assert removed == len(gone)
    clean = MEMORIES[serving.kind]()
    for i, ((row, category, action), decision) in enumerate(zip(stream, made, strict=True)):
        if i not in gone:
            clean.learn_one(row, action, category, decision.action == action)
    assert_same_memory_learned(decider.memory, clean)
    with pytest.raises(ValueError, match="source_ids"):
        decider.forget_([3])  # forgotten already


def assert_same_memory_learned(a, b) -> None:
    """The learned state of two memories, apart from the counters that a forget moves (version)."""
    sa, sb = a.state_dict(), b.state_dict()
    for key, value in sa.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, sb[key]), key


def test_undo_takes_back_the_last_verifications(serving):
    decider = serving.open()
    if serving.kind in ("knn", "retrieval") and serving.where == "ram":
        with pytest.raises(ValueError, match="store"):
            decider.undo_(1)
        return
    stream = decisions(30)
    made = feed(decider, stream)
    decider.undo_(4)
    clean = MEMORIES[serving.kind]()
    for (row, category, action), decision in zip(stream[:26], made[:26], strict=True):
        clean.learn_one(row, action, category, decision.action == action)
    assert_same_memory_learned(decider.memory, clean)
    threshold_only = {"low_confidence", "not_calibrated"}
    assert len(decider.referral.calibrator) == len([d for d in made[:26] if set(d.reasons) <= threshold_only
                                                    and d.action is not None])


def test_a_refused_call_changes_nothing(serving):
    decider = serving.open()
    stream = decisions(10)
    feed(decider, stream[:6])
    pending = decider.decide(*stream[6][:2])
    state = copy.deepcopy(decider.memory.state_dict())
    for bad in ([float("nan")] * FACTORS, [0.5] * (FACTORS - 1), "not factors"):
        with pytest.raises((ValueError, TypeError)):
            decider.decide(bad, NAMES["categories"][0])
    with pytest.raises((ValueError, TypeError)):
        decider.decide(stream[0][0], "no such category")
    with pytest.raises(ValueError, match="a0"):  # the refusal names the actions the memory has
        decider.verify(pending.id, "no such action")
    with pytest.raises(KeyError):
        decider.verify("no such id", "a0")
    with pytest.raises(ValueError, match="twice"):
        decider.verify_many([pending.id, pending.id], ["a0", "a1"])
    assert [d.id for d in decider.pending()] == [pending.id]
    assert_same_memory(decider.memory, _loaded(decider, state))


def _loaded(decider, state):
    memory = decider.memory.empty_like()
    memory.load_state_dict(state)
    return memory


def test_explain_decision_needs_the_ledger_and_explains_the_state_it_was_made_on(serving):
    decider = serving.open()
    stream = decisions(25)
    feed(decider, stream[:20])
    decision = decider.decide(*stream[20][:2])
    if serving.where == "ram":
        with pytest.raises(ValueError, match="store"):
            decider.explain_decision(decision.id)
        return
    now = decider.memory.explain(*stream[20][:2])
    feed(decider, stream[21:])  # the memory moves on
    past = decider.explain_decision(decision.id)
    if isinstance(now, torch.Tensor) or hasattr(now, "probs"):
        assert torch.equal(past.probs, now.probs)
    else:
        assert torch.equal(past.ids, now.ids)
    with pytest.raises(KeyError):
        decider.explain_decision("no such id")


def test_threads_share_one_decider(serving):
    decider = serving.open()
    stream = decisions(120)
    errors: list[BaseException] = []

    def agent(part: list) -> None:
        try:
            for row, category, action in part:
                decider.verify(decider.decide(row, category).id, action)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=agent, args=(stream[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and decider.pending() == [] and decider.memory.next_seq == 120
