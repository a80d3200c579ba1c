"""What a hostile user found in the Decider, each held: what a Decider keeps of a decision cannot
change behind its back, text no store can keep is refused as bad input (the same in RAM and on a
ledger), a failed commit leaves the Decider as it was, and errors name the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory
from gae.ledger.ledger import Ledger
from gae.storage import SQLiteStore


def served(tmp_path, where, grow=False):
    memory = JudgmentMemory(["billing"], ["approve", "escalate"], 3, config=JudgmentConfig.seed(), grow=grow)
    return Decider(memory, store=SQLiteStore(tmp_path / "ledger.db") if where == "sqlite" else None)


@pytest.mark.parametrize("where", ["ram", "sqlite"])
def test_decide_keeps_a_copy_of_the_factors_it_was_given(tmp_path, where):
    decider = served(tmp_path, where)
    decider.verify(decider.decide([0.9, 0.1, 0.4], "billing").id, "approve")
    for case in (torch.tensor([0.9, 0.1, 0.4], dtype=torch.float64), np.array([0.9, 0.1, 0.4]),
                 torch.tensor([0.9, 0.1, 0.4]), [0.9, 0.1, 0.4]):
        decision = decider.decide(case, "billing")
        case[0], case[1] = 0.0, 1.0  # the agent reuses its buffer
        [row] = [factors for d, factors in decider._book.open.values() if d.id == decision.id]
        assert row.tolist() == pytest.approx([0.9, 0.1, 0.4]), type(case)


def test_a_decisions_probs_cannot_change_the_deciders_state():
    decider = served(None, "ram")
    decision = decider.decide([0.8, 0.2, 0.4], "billing")
    with pytest.raises(TypeError, match="read-only"):
        decision.probs["approve"] = math.nan
    with pytest.raises(TypeError, match="read-only"):
        decision.probs.update(approve=1.0)
    assert decider.pending()[0].probs == {"approve": 0.0, "escalate": 0.0} and isinstance(decision.probs, dict)
    Decider(JudgmentMemory(["billing"], ["approve", "escalate"], 3, config=JudgmentConfig.seed())).load_state_dict(
        decider.state_dict())


@pytest.mark.parametrize("where", ["ram", "sqlite"])
def test_text_no_store_can_keep_is_refused_naming_the_argument_and_changes_nothing(tmp_path, where):
    decider = served(tmp_path, where, grow=True)
    decision = decider.decide([0.1, 0.2, 0.3], "billing")
    before = (decider.version, [d.id for d in decider.pending()], decider.memory.action_names)
    for argument, call in (("id", lambda: decider.decide([0.1, 0.2, 0.3], "billing", id="a\ud800")),
                           ("category", lambda: decider.decide([0.1, 0.2, 0.3], "b\ud800")),
                           ("outcome", lambda: decider.verify(decision.id, "approve", outcome="o\ud800")),
                           ("action", lambda: decider.verify(decision.id, "n\ud800")),
                           ("action", lambda: decider.verify_many([decision.id], ["n\ud800"])),
                           ("names", lambda: decider.add_actions_(["z\ud800"]))):
        with pytest.raises(ValueError, match=f"^{argument} must be text UTF-8 can encode"):
            call()
    assert (decider.version, [d.id for d in decider.pending()], decider.memory.action_names) == before


@pytest.mark.parametrize("where", ["ram", "sqlite"])
def test_a_numpy_string_is_a_name_in_ram_as_on_a_ledger(tmp_path, where):
    decider = served(tmp_path, where, grow=True)
    decider.verify(decider.decide([0.1, 0.2, 0.3], "billing").id, np.str_("hold"))
    assert decider.memory.action_names == ("approve", "escalate", "hold")


def test_a_commit_that_fails_leaves_the_decider_as_it_was(tmp_path, monkeypatch):
    """The state in RAM goes ahead of the transaction; when it does not land, the Decider is the
    ledger's again, its version included (a memory that grew name by name is rebuilt to the same)."""
    path = tmp_path / "ledger.db"

    def opened():
        return Decider(JudgmentMemory(["billing"], ["approve"], 3, config=JudgmentConfig.seed(), grow=True),
                       store=SQLiteStore(path))

    decider = opened()
    for action in ("escalate", "hold"):
        decider.verify(decider.decide([0.1, 0.2, 0.3], "billing").id, action)
    decision = decider.decide([0.4, 0.5, 0.6], "billing")
    before = (decider.version, decider.memory.state_dict()["centroids"].clone())

    def full(self, *args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(Ledger, "append", full)
        with pytest.raises(OSError, match="disk full"):
            decider.verify(decision.id, "approve")
    assert decider.version == before[0] == opened().version
    assert torch.equal(decider.memory.state_dict()["centroids"], before[1])
    assert [d.id for d in decider.pending()] == [decision.id]
    decider.verify(decision.id, "approve")
    assert decider.decide([0.4, 0.5, 0.6], "billing").version == opened().version


def test_errors_name_the_argument():
    decider = served(None, "ram")
    with pytest.raises(TypeError, match="^names must be a name or a sequence of names, got 5$"):
        decider.add_actions_(5)
    with pytest.raises(ValueError, match=r"^pending_ttl must be in \(0\.0, inf\), got inf$"):
        Decider(JudgmentMemory(["billing"], ["approve"], 3, config=JudgmentConfig.seed()), pending_ttl=math.inf)


def test_a_state_of_other_names_is_refused_for_its_names_and_changes_nothing():
    grown = Decider(JudgmentMemory(["billing"], ["approve"], 3, config=JudgmentConfig.seed(), grow=True))
    grown.verify(grown.decide([0.1, 0.2, 0.3], "billing").id, "hold")
    grown.decide([0.1, 0.2, 0.3], "billing")
    decider = served(None, "ram")
    decider.verify(decider.decide([0.5, 0.5, 0.5], "billing").id, "approve")
    before = decider.state_dict()
    with pytest.raises(ValueError, match="saved with action_names=\\['approve', 'hold'\\]"):
        decider.load_state_dict(grown.state_dict())
    after = decider.state_dict()
    assert torch.equal(after["memory"]["centroids"], before["memory"]["centroids"])
    assert after["pending"] == before["pending"]


@pytest.mark.parametrize("statement", [
    "DELETE FROM ledger_events WHERE seq = (SELECT MAX(seq) FROM ledger_events WHERE kind = 'learn')",
    "DELETE FROM ledger_events WHERE seq = 1",
    "DELETE FROM ledger_meta WHERE key = 'settings'",
    "DELETE FROM ledger_meta WHERE key = 'head'",
], ids=["last learn", "first decide", "settings", "head"])
def test_a_row_deleted_behind_the_ledgers_back_is_refused_naming_the_file(tmp_path, statement):
    """A checksum on each row cannot see a row that is gone: the head, the events held and those
    forgotten must add up, and every ledger has its meta."""
    import sqlite3

    from gae.storage import StoreCorrupted

    decider = served(tmp_path, "sqlite")
    for i in range(6):
        decider.verify(decider.decide([0.1 * i, 0.2, 0.3], "billing", source_id=i).id, "approve")
    decider.forget_([2])  # a deletion the ledger made itself is no damage
    decider.close()
    Decider(JudgmentMemory(["billing"], ["approve", "escalate"], 3, config=JudgmentConfig.seed()),
            store=SQLiteStore(tmp_path / "ledger.db")).close()
    connection = sqlite3.connect(tmp_path / "ledger.db")
    with connection:
        connection.execute(statement)
    connection.close()
    with pytest.raises(StoreCorrupted, match=str(tmp_path / "ledger.db")):
        Decider(JudgmentMemory(["billing"], ["approve", "escalate"], 3, config=JudgmentConfig.seed()),
                store=SQLiteStore(tmp_path / "ledger.db"))


def test_a_writer_waits_for_another_no_longer_than_its_timeout(tmp_path):
    import threading

    path = tmp_path / "store.db"
    SQLiteStore(path).close()
    holding, done = threading.Event(), threading.Event()

    def hold():
        store = SQLiteStore(path)
        with store.exclusive():
            holding.set()
            done.wait(10)
        store.close()

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    waiting = SQLiteStore(path, timeout=0.2)
    try:
        with pytest.raises(TimeoutError, match="another writer held the write lock for more than 0.2 s"):
            with waiting.exclusive():
                pass
    finally:
        done.set()
        thread.join()
    with waiting.exclusive():  # and once it is free, it writes
        pass
    waiting.close()


def test_the_serial_replay_equals_the_deciders_after_a_name_s_first_use_is_forgotten(tmp_path):
    from gae.ledger import Ledger
    from gae.ledger.events import replay

    def memory():
        return JudgmentMemory(["billing"], ["approve"], 3, config=JudgmentConfig.seed(), grow=True)

    path = tmp_path / "ledger.db"
    decider = Decider(memory(), store=SQLiteStore(path))
    decider.verify(decider.decide([0.1, 0.9, 0.5], "billing", source_id=1).id, "hold")  # brings 'hold'
    decider.verify(decider.decide([0.9, 0.1, 0.5], "billing", source_id=2).id, "escalate")
    decider.verify(decider.decide([0.5, 0.5, 0.9], "billing", source_id=3).id, "hold")
    decider.forget_([1])
    replayed = replay(Ledger(SQLiteStore(path), "judgment"), memory())
    reopened = Decider(memory(), store=SQLiteStore(path)).memory
    names = ("approve", "hold", "escalate")
    assert replayed.action_names == reopened.action_names == decider.memory.action_names == names
    for name, tensor in decider.memory.state_dict().items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            assert torch.equal(replayed.state_dict()[name], tensor), name


def test_a_ledger_whose_meta_is_gone_is_not_taken_for_a_new_one(tmp_path):
    import sqlite3

    from gae.storage import StoreCorrupted

    decider = served(tmp_path, "sqlite")
    decider.verify(decider.decide([0.1, 0.2, 0.3], "billing").id, "approve")
    decider.close()
    connection = sqlite3.connect(tmp_path / "ledger.db")
    with connection:
        connection.execute("DELETE FROM ledger_meta")
    connection.close()
    with pytest.raises(StoreCorrupted, match="holds 2 events and snapshots but no meta"):
        Decider(JudgmentMemory(["billing"], ["approve", "escalate"], 3, config=JudgmentConfig.seed()),
                store=SQLiteStore(tmp_path / "ledger.db"))


def test_a_decision_written_later_is_explained_by_the_state_it_was_made_on(tmp_path):
    """With ``durable_decisions=False`` a decision reaches the ledger after other writers'
    commits: its explanation is still the state it was made on."""
    path = tmp_path / "ledger.db"

    def memory():
        return JudgmentMemory(["billing"], ["approve", "escalate"], 2, config=JudgmentConfig.seed())

    other = Decider(memory(), store=SQLiteStore(path))
    other.verify(other.decide([0.9, 0.1], "billing").id, "approve")
    buffered = Decider(memory(), store=SQLiteStore(path), durable_decisions=False)
    decision = buffered.decide([0.9, 0.1], "billing")
    for _ in range(3):
        other.verify(other.decide([0.9, 0.1], "billing").id, "escalate")
    buffered.sync()
    for decider in (buffered, other, Decider(memory(), store=SQLiteStore(path))):
        explained = decider.explain_decision(decision.id)
        assert decider.memory.action_names[int(explained.action[0])] == decision.action == "approve"
        assert float(explained.confidence[0]) == pytest.approx(decision.confidence)


def test_a_default_source_id_is_the_same_in_ram_on_a_ledger_and_after_a_reopen(tmp_path):
    """A decision decided without a source id gets the memory's next one; a Decider on a ledger
    records it, so ``forget_`` finds it there and a reopened process goes on from the same."""
    path = tmp_path / "ledger.db"

    def memory():
        return JudgmentMemory(["billing"], ["approve", "escalate"], 2, config=JudgmentConfig.seed())

    ram, ledger = Decider(memory()), Decider(memory(), store=SQLiteStore(path), snapshot_every=3)
    for decider in (ram, ledger):
        for i in range(8):
            decision = decider.decide([0.1 * i, 0.5], "billing", source_id=100 if i == 3 else None)
            decider.verify(decision.id, ["escalate", "approve"][i % 2])
        decider.learn_one([0.3, 0.3], "approve", "billing")  # (a plain learn takes the next one too)
    expected = [0, 1, 2, 100, 101, 102, 103, 104, 105]
    assert ram.memory.decision_log.events()["source_id"].tolist() == expected
    assert ledger.memory.decision_log.events()["source_id"].tolist() == expected
    assert Decider(memory(), store=SQLiteStore(path)).memory.next_source_id() == 106
    ram.forget_([1, 105])
    ledger.forget_([1, 105])
    for decider in (ram, ledger, Decider(memory(), store=SQLiteStore(path))):
        assert torch.equal(decider.memory.centroids, ram.memory.centroids)


def test_a_default_source_id_is_never_given_twice_on_a_ledger(tmp_path, monkeypatch):
    """After an undo (a rebuild from an older snapshot), and on a ledger whose snapshots did not
    keep the next id (written before they did), the next default id is past every id given."""
    from gae.decider.durable import LedgerLink

    def memory():
        return JudgmentMemory(["billing"], ["approve", "escalate"], 2, config=JudgmentConfig.seed())

    ram, ledger = Decider(memory()), Decider(memory(), store=SQLiteStore(tmp_path / "ledger.db"), snapshot_every=2)
    for decider in (ram, ledger):
        for i in range(5):
            decider.verify(decider.decide([0.1 * i, 0.5], "billing").id, "approve")
        decider.undo_(2)
        decider.verify(decider.decide([0.9, 0.5], "billing").id, "approve")
        with pytest.raises(ValueError, match=r"source_ids \[3\]"):
            decider.forget_([3])  # (given, then undone: never given again)
    assert ram.memory.next_source_id() == ledger.memory.next_source_id() == 6
    assert Decider(memory(), store=SQLiteStore(tmp_path / "ledger.db")).memory.next_source_id() == 6

    old = LedgerLink.snapshot_state

    def without_the_next_id(self):  # as a gae before the ids were kept wrote its snapshots
        state = old(self)
        state["memory"]["_extra_state"].pop("decision_log", None)
        return state

    with monkeypatch.context() as patch:
        patch.setattr(LedgerLink, "snapshot_state", without_the_next_id)
        written = Decider(memory(), store=SQLiteStore(tmp_path / "old.db"), snapshot_every=3)
        for i in range(7):
            written.verify(written.decide([0.1 * i, 0.5], "billing", source_id=i).id, "approve")
        written.close()
    assert Decider(memory(), store=SQLiteStore(tmp_path / "old.db")).memory.next_source_id() == 7


def test_a_memory_pickled_before_its_inspection_was_kept_still_serves():
    import pickle

    memory = JudgmentMemory(["billing"], ["approve", "escalate"], 2, config=JudgmentConfig.seed())
    for i in range(5):
        memory.learn_one([0.1 * i, 0.5], "approve", "billing")
    del memory.__dict__["_inspects"]  # as an earlier gae pickled it
    del memory.history.staged.__dict__["counted"]
    back = pickle.loads(pickle.dumps(memory))
    assert back.inspects is False and back.next_source_id() == 5
    decider = Decider(back)
    decider.verify(decider.decide([0.2, 0.5], "billing").id, "approve")
