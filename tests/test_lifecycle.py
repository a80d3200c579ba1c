"""Decide now, verify later (gae.Decider in RAM) on every decision memory and judgment mode.

Held to the single-decision API: decide then verify, in order, learns what score_one then
learn_one(confirmed=None) learns, bit for bit (the decision log differs only in recording the
confirmed flag as given: it is a fact about what the person accepted, kept by a replay). The
memories themselves no longer decide: their old calls answer with one sentence naming the Decider.
"""

from __future__ import annotations

import copy
import io
import pickle
import threading
import warnings

import numpy as np
import pytest
import torch

from gae import Decider, Decision, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory

C, A, K = ("billing", "refund", "fraud"), ("approve", "reject", "escalate"), 5
JUDGMENTS = {"seed": JudgmentConfig.seed(), "adaptive": JudgmentConfig(drift_mode="adaptive"),
             "prototypes": JudgmentConfig(prototypes=3), "recommended": JudgmentConfig.recommended()}


def make(kind: str, **options):
    if kind in JUDGMENTS:
        return JudgmentMemory(C, A, K, JUDGMENTS[kind], **options)
    if kind == "knn":
        return KNNMemory(factors=K, actions=A, k=3, capacity=50, categories=C, scoped=True, **options)
    return RetrievalMemory(factors=K, actions=A, k=3, capacity=50, categories=C, scoped=True, **options)


def decider(kind: str, *, grow: bool = False, **options) -> Decider:
    """A Decider in RAM on a fresh memory of ``kind``; ``options`` are the Decider's."""
    return Decider(make(kind, **({"grow": True} if grow else {})), **options)


KINDS = [*JUDGMENTS, "knn", "retrieval"]


def stream(n: int, seed: int = 0) -> list[tuple[list[float], str, str]]:
    rng = np.random.default_rng(seed)
    centres = rng.random((len(C), len(A), K))
    c, a = rng.integers(0, len(C), n), rng.integers(0, len(A), n)
    x = np.clip(centres[c, a] + 0.15 * rng.standard_normal((n, K)), 0, 1)
    return [(row, C[i], A[j]) for row, i, j in zip(x.tolist(), c, a, strict=True)]


def tensors(memory) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, and the judgment's decision log without its 'given' column."""
    if isinstance(memory, Decider):
        memory = memory.memory
    found = {name: t.detach().clone() for name, t in [*memory.named_parameters(), *memory.named_buffers()]}
    if isinstance(memory, JudgmentMemory):
        found.update({f"log.{k}": v for k, v in memory.decision_log.events().items() if k != "given"})
    return found


def assert_same(a, b) -> None:
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name
    assert a.version == b.version


@pytest.mark.parametrize("kind", KINDS)
def test_decide_then_verify_learns_what_score_one_then_learn_one_learns(kind: str) -> None:
    lifecycle, single = decider(kind), make(kind)
    for i, (row, category, action) in enumerate(stream(300)):
        decision = lifecycle.decide(row, category, now=float(i))
        assert (decision.action, decision.confidence) == pytest.approx(single.score_one(row, category), abs=1e-6)
        if decision.action is not None:
            assert decision.probs[decision.action] == decision.confidence
        assert decision.version == single.version and decision.category == category
        mine = lifecycle.verify(decision.id, action, now=float(i))
        # verify's contract: confirmed = (the action it decided == the verified one); with judges that is the
        # mixture's answer, which learn_one(confirmed=None) does not derive (docs/judges.md, "Not yet")
        theirs = single.learn_one(row, action, category, confirmed=decision.action == action)
        assert mine == theirs
    assert lifecycle.pending() == [] and lifecycle.expired_decisions == 0
    assert_same(lifecycle.memory, single)
    assert lifecycle.version == single.version


@pytest.mark.parametrize("kind", KINDS)
def test_decide_answers_what_the_batched_forward_answers(kind: str) -> None:
    memory = make(kind)
    for row, category, action in stream(200, seed=10):
        memory.learn_one(row, action, category)
    served = Decider(memory)
    for scale in (1.0, 10.0):  # beyond the data's range the logits grow, and float32 rounding with them
        for row, category, _ in stream(100, seed=11):
            row = [scale * value for value in row]
            decision = served.decide(row, category)
            with torch.no_grad():
                out = memory(torch.tensor([row]), torch.tensor([C.index(category)]))
            logits = out.logits[0][torch.isfinite(out.logits[0])]
            tolerance = 1e-6 * max(1.0, float(logits.abs().max())) if logits.numel() else 1e-6
            assert decision.action == memory._action_name(int(out.action[0]))
            assert decision.confidence == pytest.approx(float(out.confidence[0]), abs=tolerance)
            assert list(decision.probs.values()) == pytest.approx(out.probs[0].tolist(), abs=tolerance)


def test_a_memory_that_cannot_learn_refuses_to_decide() -> None:
    served = Decider(make("seed").double())  # a judgment memory learns in float32 only
    with pytest.raises(TypeError, match="float32"):
        served.decide([0.5] * K, "billing")
    assert served.pending() == []


@pytest.mark.parametrize("kind", KINDS)
def test_interleaved_lifecycles_learn_in_verification_order_with_their_own_recommendation(kind: str) -> None:
    data = stream(120, seed=1)
    lifecycle, reference = decider(kind), make(kind)
    for row, category, action in data[:100]:  # something learned, so recommendations are made
        lifecycle.learn_one(row, action, category)
        reference.learn_one(row, action, category)
    (x1, c1, a1), (x2, c2, a2) = data[100], data[101]
    d1 = lifecycle.decide(x1, c1)
    d2 = lifecycle.decide(x2, c2)
    assert [d.id for d in lifecycle.pending()] == [d1.id, d2.id]
    lifecycle.verify(d2.id, a2)
    lifecycle.verify(d1.id, a1)
    reference.learn_one(x2, a2, c2, confirmed=d2.action == a2)
    reference.learn_one(x1, a1, c1, confirmed=d1.action == a1)  # what it recommended then, not now
    assert_same(lifecycle, reference)


def test_a_decision_is_frozen_and_exported() -> None:
    decision = decider("seed").decide([0.5] * K, "billing", id="case-1", source_id=3, now=10.0)
    assert isinstance(decision, Decision) and decision.id == "case-1" and decision.source_id == 3
    assert decision.created_at == 10.0 and decision.action is None and decision.probs == dict.fromkeys(A, 0.0)
    with pytest.raises(AttributeError):
        decision.action = "approve"  # type: ignore[misc]
    assert len(decider("seed").decide([0.5] * K, "billing").id) == 32  # a uuid4 hex


@pytest.mark.parametrize("kind", KINDS)
def test_verify_many_equals_the_calls_one_by_one(kind: str) -> None:
    data = stream(60, seed=2)
    many, one = decider(kind), decider(kind)
    ids_many = [many.decide(row, category, now=0.0).id for row, category, _ in data]
    ids_one = [one.decide(row, category, now=0.0).id for row, category, _ in data]
    answers = many.verify_many(ids_many[::-1], [action for _, _, action in data][::-1], now=1.0)
    assert answers == [one.verify(i, action, now=1.0) for i, (_, _, action) in zip(ids_one[::-1], data[::-1],
                                                                                    strict=True)]
    assert_same(many, one)


def state(served: Decider) -> tuple:
    return tensors(served), [d.id for d in served.pending()], served.expired_decisions


def assert_unchanged(served: Decider, before: tuple) -> None:
    after = state(served)
    assert after[1:] == before[1:]
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value), name


@pytest.mark.parametrize("kind", KINDS)
def test_refused_calls_change_nothing(kind: str) -> None:
    served = decider(kind)
    for row, category, action in stream(40, seed=3):
        served.learn_one(row, action, category)
    open_ = served.decide([0.2] * K, "refund", id="open")
    before = state(served)
    with pytest.raises(KeyError, match="nope"):
        served.verify("nope", "approve")
    with pytest.raises(ValueError, match="already pending"):
        served.decide([0.2] * K, "refund", id="open")
    for bad in ([float("nan")] * K, [1.0] * (K + 1), [1e30] * K):
        with pytest.raises(ValueError):
            served.decide(bad, "refund")
    with pytest.raises(ValueError, match="category"):
        served.decide([0.2] * K, "unknown")
    with pytest.raises(TypeError, match="id"):
        served.decide([0.2] * K, "refund", id=7)
    with pytest.raises((TypeError, ValueError), match="source_id"):
        served.decide([0.2] * K, "refund", source_id=-1)
    with pytest.raises(ValueError, match="action"):
        served.verify(open_.id, "unknown")
    with pytest.raises(TypeError, match="skip"):
        served.verify(open_.id, "approve", skip=1)
    with pytest.raises(KeyError, match="missing"):
        served.verify_many([open_.id, "missing"], ["approve", "approve"])
    with pytest.raises(ValueError, match="twice"):
        served.verify_many([open_.id, open_.id], ["approve", "approve"])
    with pytest.raises(ValueError, match="action"):
        served.verify_many([open_.id], ["unknown"])
    with pytest.raises(ValueError, match="one entry per decision"):
        served.verify_many([open_.id], [])
    with pytest.raises(ValueError, match="now"):
        served.pending(now=float("nan"))
    with pytest.raises(TypeError, match="source_id"):
        served.learn_one([0.2] * K, "approve", "refund", source_id="7")
    with pytest.raises(ValueError, match="store"):  # in RAM no past state is kept
        served.explain_decision(open_.id)
    assert_unchanged(served, before)
    served.verify(open_.id, "approve")
    with pytest.raises(KeyError, match="verified already"):
        served.verify(open_.id, "approve")


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_skip_closes_a_decision_without_learning(kind: str) -> None:
    served = decider(kind)
    decision = served.decide([0.3] * K, "fraud")
    version = served.version
    assert served.verify(decision.id, "reject", skip=True) == {"skipped": True}
    assert served.version == version and served.pending() == []
    uncertain, twin = served.decide([0.3] * K, "fraud"), copy.deepcopy(served)
    answer = served.verify(uncertain.id, "reject", outcome="__incorrect__")  # learn_one's skip semantics
    assert answer == twin.memory.learn_one([0.3] * K, "reject", "fraud", confirmed=False, outcome="__incorrect__")
    assert answer == {"skipped": True} or not served.memory.respect_skip  # the k-NN learns it unless told not to


def test_max_pending_and_pending_ttl_expire_the_oldest_and_count_them(caplog) -> None:
    served = decider("seed", max_pending=3, pending_ttl=10.0)
    assert served.max_pending == 3 and served.pending_ttl == 10.0
    ids = [served.decide([0.1 * i] * K, "billing", now=float(i)).id for i in range(5)]
    assert [d.id for d in served.pending(now=4.0)] == ids[2:] and served.expired_decisions == 2
    with caplog.at_level("INFO", logger="gae.decider"):
        assert [d.id for d in served.pending(now=12.5)] == ids[3:]  # created at 2.0: past its ten seconds
    assert served.expired_decisions == 3 and "expired" in caplog.text
    with pytest.raises(KeyError):
        served.verify(ids[0], "approve", now=12.5)
    served.max_pending = 1
    assert [d.id for d in served.pending(now=12.5)] == ids[4:] and served.expired_decisions == 4
    for bad in (0, 1.5, True):
        with pytest.raises((TypeError, ValueError), match="max_pending"):
            served.max_pending = bad
    for bad in (0.0, -1.0, float("inf"), "1"):
        with pytest.raises((TypeError, ValueError), match="pending_ttl"):
            served.pending_ttl = bad
    assert served.max_pending == 1 and served.pending_ttl == 10.0  # refused settings change nothing
    with pytest.raises((TypeError, ValueError), match="max_pending"):
        Decider(make("knn"), max_pending=0)
    with pytest.raises((TypeError, ValueError), match="pending_ttl"):
        Decider(make("knn"), pending_ttl=-1.0)
    assert decider("knn").max_pending == 100_000 and decider("retrieval").pending_ttl is None


@pytest.mark.parametrize("kind", KINDS)
def test_pending_decisions_travel_in_the_state_dict(kind: str) -> None:
    served = decider(kind)
    data = stream(50, seed=4)
    for row, category, action in data[:40]:
        served.learn_one(row, action, category)
    opened = [served.decide(row, category, source_id=i, now=1.0) for i, (row, category, _) in enumerate(data[40:])]
    buffer = io.BytesIO()
    saved = served.state_dict()
    assert set(saved) == {"memory", "pending", "expired_decisions", "referral"}
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = decider(kind)
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    assert loaded.pending() == served.pending() == opened
    twins = [copy.deepcopy(served), pickle.loads(pickle.dumps(served))]
    for decision, (_, _, action) in zip(opened, data[40:], strict=True):
        expected = served.verify(decision.id, action)
        assert loaded.verify(decision.id, action) == expected
        assert [twin.verify(decision.id, action) for twin in twins] == [expected] * 2
    assert_same(loaded, served)
    for twin in twins:
        assert_same(twin, served)
        assert twin.referral.state() == served.referral.state()


def old_checkpoint(served: Decider) -> dict:
    """The memory's state_dict as a gae before the Decider saved it: its pending decisions, expired
    count and referral in its extra state (the layout those checkpoints have)."""
    own = served.state_dict()
    state = dict(own["memory"])
    state["_extra_state"] = {**state["_extra_state"], "pending": own["pending"],
                             "expired_decisions": own["expired_decisions"], "referral": own["referral"]}
    return state


@pytest.mark.parametrize("kind", ["seed", "recommended", "knn", "retrieval"])
def test_a_checkpoint_saved_before_the_decider_keeps_its_pending_decisions_and_referral(kind: str) -> None:
    served = decider(kind, target_error=0.2, pending_ttl=100.0)
    data = stream(80, seed=12)
    for i, (row, category, action) in enumerate(data[:70]):
        served.verify(served.decide(row, category, source_id=i, now=float(i)).id, action, now=float(i))
    served.decide(data[70][0], data[70][1], id="stale", now=0.0)
    served.pending(now=150.0)  # the stale one expires: counted
    opened = [served.decide(row, category, source_id=i, now=200.0) for i, (row, category, _) in enumerate(data[71:])]
    assert served.expired_decisions == 1 and served.referral.state()["calibration"]["seq"]
    buffer = io.BytesIO()
    torch.save(old_checkpoint(served), buffer)
    buffer.seek(0)
    old = torch.load(buffer, weights_only=True)

    loaded = decider(kind, target_error=0.2, pending_ttl=100.0)
    loaded.load_state_dict(old)  # the migration path
    assert loaded.pending(now=200.0) == served.pending(now=200.0) == opened
    assert loaded.expired_decisions == 1 and loaded.referral.state() == served.referral.state()
    assert loaded.referral.threshold == served.referral.threshold
    assert_same(loaded, served)
    alone = make(kind)  # the memory alone loads its own part, and says where the rest goes
    with pytest.warns(UserWarning, match=r"pending decision.*Decider\(memory\)\.load_state_dict"):
        alone.load_state_dict(old)
    assert_same(alone, served.memory)
    for decision, (_, _, action) in zip(opened, data[71:], strict=True):
        assert loaded.verify(decision.id, action, now=201.0) == served.verify(decision.id, action, now=201.0)
    assert_same(loaded, served)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(kind).load_state_dict(served.memory.state_dict())  # a state of today: nothing to say


def test_source_ids_reach_the_judgments_log_and_forget() -> None:
    served, reference = decider("seed"), make("seed")
    data = stream(30, seed=5)
    for i, (row, category, action) in enumerate(data):
        decision = served.decide(row, category, source_id=100 + i % 3)
        served.verify(decision.id, action)
        if i % 3 != 1:
            reference.learn_one(row, action, category, confirmed=decision.action == action)
    assert served.memory.decision_log.events()["source_id"].tolist() == [100 + i % 3 for i in range(30)]
    assert served.forget_([101]) == 10
    for name, value in reference.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(served.memory.state_dict()[name], value), name


@pytest.mark.parametrize("flushed", [False, True])
def test_forget_in_ram_removes_the_given_source_ids_and_nothing_learned_without_one(flushed: bool) -> None:
    served, reference = decider("seed"), make("seed")
    sources = [1, 3, None, None, None, None, 1, None, None, None, None, None]
    for (row, category, action), source in zip(stream(12, seed=15), sources, strict=True):
        served.learn_one(row, action, category, source_id=source)  # one without a source id takes a fresh one
        if source != 1:
            reference.learn_one(row, action, category)
        if flushed:
            served.state_dict()  # (the staged single decisions written to the log: the ids must not depend on it)
    assert served.memory.decision_log.events()["source_id"].tolist() == [1, 3, 4, 5, 6, 7, 1, 8, 9, 10, 11, 12]
    assert served.forget_([1]) == 2
    for name, value in reference.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(served.memory.state_dict()[name], value), name


def test_forget_and_undo_in_ram_take_back_pending_decisions_and_need_a_log() -> None:
    served = decider("seed")
    data = stream(12, seed=13)
    for i, (row, category, action) in enumerate(data[:10]):
        served.verify(served.decide(row, category, source_id=i % 2).id, action)
    kept = served.decide(data[10][0], data[10][1], source_id=5)
    gone = served.decide(data[11][0], data[11][1], source_id=1)
    assert served.forget_([1]) == 5  # the five learned, and the pending one with the same source
    assert served.pending() == [kept] and gone.id not in [d.id for d in served.pending()]
    with pytest.raises(ValueError, match="77"):
        served.forget_([77])
    served.undo_(2)
    assert int(served.memory.num_decisions) == 3
    with pytest.raises(ValueError):
        served.undo_(4)
    knn = decider("knn")  # a k-NN keeps no log to replay in RAM: a ledger replays it
    knn.verify(knn.decide([0.2] * K, "billing", source_id=1).id, "approve")
    for call in (lambda: knn.forget_([1]), lambda: knn.undo_(1)):
        with pytest.raises(ValueError, match="store"):
            call()
    assert knn.version == 1


def test_grow_decides_in_an_unseen_category_and_verifies_a_new_action() -> None:
    served = Decider(JudgmentMemory(["billing"], ["approve"], K, config=JudgmentConfig.seed(), grow=True))
    decision = served.decide([0.4] * K, "shipping")
    assert decision.action is None and decision.confidence == 0.0
    served.verify(decision.id, "hold")
    memory = served.memory
    assert memory.category_names == ("billing", "shipping") and memory.action_names == ("approve", "hold")
    assert served.decide([0.4] * K, "shipping").action == "hold"


@pytest.mark.parametrize("kind", ["seed", "recommended", "knn"])
def test_threads_decide_and_verify_without_losing_any(kind: str) -> None:
    served, data, threads_n = decider(kind), stream(800, seed=6), 4
    answers: list[list] = [[] for _ in range(threads_n)]

    def work(t: int) -> None:
        for row, category, action in data[t::threads_n]:
            decision = served.decide(row, category)
            answers[t].append(served.verify(decision.id, action))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(map(len, answers)) == len(data) and served.pending() == []
    assert served.version == len(data)


@pytest.mark.parametrize("kind", ["seed", "knn", "retrieval"])
def test_a_grown_memory_checkpoints_decisions_made_before_the_growth(kind: str) -> None:
    served = decider(kind, grow=True)
    first, second = served.decide([0.1] * K, "billing"), served.decide([0.2] * K, "billing")
    served.verify(first.id, "hold")  # a new action: the second decision's probs predate it
    assert served.memory.action_names[-1] == "hold"
    twin = decider(kind, grow=True)
    twin.add_actions_("hold")
    twin.load_state_dict(served.state_dict())
    (loaded,) = twin.pending()
    assert loaded.id == second.id and loaded.probs == {**second.probs, "hold": 0.0}
    assert twin.verify(second.id, "hold") == served.verify(second.id, "hold")


def test_a_memory_pickled_before_the_lifecycle_scores_learns_and_decides() -> None:
    from gae.judgment.online import HostState

    memory = make("seed")
    for row, category, action in stream(50, seed=7):
        memory.learn_one(row, action, category)
    state = copy.deepcopy(memory).__getstate__()  # tensors of its own
    for name in ("_open", "expired_decisions", "_max_pending", "_pending_ttl", "referral"):
        assert name not in state  # serving state is the Decider's: a memory pickles none
    old_host = HostState()  # an older gae's views: nothing watched yet, and no sentinel
    old_host.touched = old_host.scored = old_host.pointers = old_host.scored_pointers = ()
    state["_host"] = old_host
    old = JudgmentMemory.__new__(JudgmentMemory)
    old.__setstate__(state)
    row = [0.5] * K
    assert old.score_one(row, "billing") == memory.score_one(row, "billing")
    assert old.learn_one(row, "approve", "billing") == memory.learn_one(row, "approve", "billing")
    served, reference = Decider(old), Decider(memory)
    assert served.pending() == [] and served.max_pending == 100_000 and served.expired_decisions == 0
    assert served.verify(served.decide(row, "refund").id, "reject") == reference.verify(
        reference.decide(row, "refund").id, "reject")


def test_a_memory_pickled_with_pending_decisions_unpickles_without_them() -> None:
    """A gae before the Decider pickled a memory with its serving state (its open decisions, the
    expired count, the referral, the bounds): it unpickles as the model alone, which a Decider serves."""
    memory = make("seed")
    for row, category, action in stream(30, seed=8):
        memory.learn_one(row, action, category)
    state = copy.deepcopy(memory).__getstate__()
    from collections import OrderedDict

    from gae.decider.refer import Referral

    state.update(_open=OrderedDict(), expired_decisions=3, referral=Referral(0.05), _max_pending=7,
                 _pending_ttl=1.0)
    old = JudgmentMemory.__new__(JudgmentMemory)
    old.__setstate__(state)
    for name in ("_open", "expired_decisions", "referral", "_max_pending", "_pending_ttl"):
        assert name not in old.__dict__
    assert_same(old, memory)
    assert Decider(old).decide([0.5] * K, "billing").action == Decider(memory).decide([0.5] * K, "billing").action


def test_numpy_ids_categories_and_flags_become_plain_values() -> None:
    served = decider("seed")
    decision = served.decide(np.full(K, 0.3), np.str_("billing"), id=np.str_("case"), source_id=np.int64(4),
                             now=np.float64(2.0))
    assert type(decision.id) is str and type(decision.category) is str and type(decision.source_id) is int
    buffer = io.BytesIO()
    torch.save(served.state_dict(), buffer)
    buffer.seek(0)
    loaded = decider("seed")
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    assert loaded.pending() == [decision]
    assert loaded.verify("case", "approve", skip=np.True_) == {"skipped": True}
    knn = decider("knn")
    assert type(knn.decide([0.3] * K, np.int64(1)).category) is int


TAMPERS = {
    "an int id": lambda p: p["id"].__setitem__(0, 5),
    "a duplicate id": lambda p: p["id"].__setitem__(1, p["id"][0]),
    "an unknown action": lambda p: p["action"].__setitem__(0, "sell"),
    "a NaN factor": lambda p: p["factors"][0].__setitem__(0, float("nan")),
    "a short factor row": lambda p: p["factors"][0].pop(),
    "a longer list": lambda p: p["version"].append(3),
    "a missing field": lambda p: p.pop("created_at"),
    "a negative source id": lambda p: p["source_id"].__setitem__(0, -1),
    "probs of another length": lambda p: p["probs"][0].append(0.5),
}


@pytest.mark.parametrize("layout", ["decider", "before the decider"])
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_tampered_pending_block_is_refused_naming_it_and_changes_nothing(tamper: str, layout: str) -> None:
    source = decider("seed")
    for i in range(2):
        source.decide([0.1 * (i + 1)] * K, "billing", source_id=i)
    state = source.state_dict() if layout == "decider" else old_checkpoint(source)
    TAMPERS[tamper](state["pending"] if layout == "decider" else state["_extra_state"]["pending"])
    served = decider("seed")
    served.learn_one([0.9] * K, "reject", "fraud")
    kept = served.decide([0.9] * K, "fraud")
    before = state_of(served)
    with pytest.raises(ValueError, match="pending"):
        served.load_state_dict(state)
    assert served.pending() == [kept] and state_of(served) == before


def state_of(served: Decider) -> list:
    return [(name, t.tolist()) for name, t in tensors(served).items()]


@pytest.mark.parametrize("layout", ["decider", "before the decider"])
def test_a_negative_expired_count_is_refused(layout: str) -> None:
    state = decider("seed").state_dict() if layout == "decider" else old_checkpoint(decider("seed"))
    (state if layout == "decider" else state["_extra_state"])["expired_decisions"] = -3
    with pytest.raises(ValueError, match="expired_decisions"):
        decider("seed").load_state_dict(state)


def test_a_bad_state_is_refused_and_changes_nothing() -> None:
    served = decider("seed")
    served.learn_one([0.5] * K, "approve", "billing")
    kept = served.decide([0.5] * K, "billing")
    before = state_of(served)
    with pytest.raises(TypeError, match="dict"):
        served.load_state_dict([])  # type: ignore[arg-type]
    other = Decider(JudgmentMemory(C, ("approve", "deny"), K, JudgmentConfig.seed()))
    other.decide([0.5] * K, "billing")
    with pytest.raises(ValueError):  # another memory's names: refused whole, the pending decisions too
        served.load_state_dict(other.state_dict())
    assert served.pending() == [kept] and state_of(served) == before


def test_a_call_that_raises_expires_nothing_and_an_expired_id_may_be_reused() -> None:
    served = decider("seed", pending_ttl=10.0)
    served.decide([0.2] * K, "billing", id="old", now=0.0)
    live = served.decide([0.3] * K, "billing", id="live", now=8.0)
    with pytest.raises(ValueError, match="action"):
        served.verify("live", "unknown", now=12.0)
    with pytest.raises(TypeError, match="outcome"):
        served.verify("live", "approve", outcome=3, now=12.0)
    with pytest.raises(KeyError, match="old"):  # past its ten seconds: expired, though still held
        served.verify("old", "approve", now=12.0)
    with pytest.raises(ValueError, match="factors"):
        served.decide([float("nan")] * K, "billing", now=12.0)
    assert served.expired_decisions == 0 and list(served._book.open) == ["old", "live"]
    again = served.decide([0.4] * K, "billing", id="old", now=12.0)  # an expired id may be used again
    assert served.pending(now=12.0) == [live, again] and served.expired_decisions == 1


def test_a_parameter_swapped_in_the_modules_dict_is_seen_by_the_fast_path() -> None:
    memory = make("seed")
    for row, category, action in stream(200, seed=8):
        memory.learn_one(row, action, category)
    row = stream(1, seed=9)[0][0]
    swapped = torch.nn.Parameter(torch.randn_like(memory.criterion_logits) * 3)
    memory._parameters["criterion_logits"] = swapped  # as torch.func.functional_call swaps it
    expected = DecisionMemoryScore.checked(memory, row, "refund")
    assert memory.score_one(row, "refund") == pytest.approx(expected, abs=1e-6)


class DecisionMemoryScore:
    @staticmethod
    def checked(memory, row, category):
        """The checked path's answer: the batched forward."""
        with torch.no_grad():
            out = memory(torch.tensor([row]), torch.tensor([memory.category_names.index(category)]))
        return memory._action_name(int(out.action[0])), float(out.confidence[0])


# -- the memories no longer serve: their old calls name the Decider ---------------------------------
MOVED_CALLS = ["decide", "verify", "verify_many", "pending", "explain_decision", "sync", "referral", "max_pending",
               "pending_ttl", "expired_decisions", "ledger_version"]
SERVING_ARGUMENTS = {"store": None, "ledger": "judgment", "snapshot_every": 5, "durable_decisions": False,
                     "max_pending": 3, "pending_ttl": 1.0, "target_error": 0.05, "refer_confidence": 0.5,
                     "refer_margin": 0.2}


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.count(". ") == 0


@pytest.mark.parametrize("kind", ["seed", "knn", "retrieval"])
@pytest.mark.parametrize("name", MOVED_CALLS)
def test_a_memorys_old_serving_call_names_the_decider(kind: str, name: str) -> None:
    memory = make(kind)
    with pytest.raises(AttributeError) as info:
        getattr(memory, name)
    message = str(info.value)
    assert f"Decider(memory).{name}" in message and "gae.Decider" in message and one_sentence(message), message
    assert hasattr(Decider(make(kind)), name)  # and the Decider has it


@pytest.mark.parametrize("kind", ["seed", "knn", "retrieval"])
@pytest.mark.parametrize("argument", sorted(SERVING_ARGUMENTS))
def test_a_memory_built_with_a_serving_argument_names_the_decider(kind: str, argument: str) -> None:
    with pytest.raises(TypeError) as info:
        make(kind, **{argument: SERVING_ARGUMENTS[argument]})
    message = str(info.value)
    assert f"{argument}=..." in message and "Decider(" in message and one_sentence(message), message


@pytest.mark.parametrize("option", ["target_error", "refer_confidence", "refer_margin"])
def test_a_config_with_act_or_refer_options_names_the_decider(option: str) -> None:
    value = {"target_error": 0.05, "refer_confidence": 0.5, "refer_margin": 0.2}[option]
    with pytest.raises(TypeError, match=rf"{option}.*Decider\(memory, {option}=\.\.\.\)"):
        JudgmentConfig.recommended().replace(**{option: value})
    with pytest.raises(TypeError, match=rf"{option}.*Decider\(memory, {option}=\.\.\.\)"):
        JudgmentConfig(**{option: value})


def test_a_decider_in_ram_refuses_ledger_options_and_what_is_not_a_memory() -> None:
    for options in ({"ledger": "judgment"}, {"snapshot_every": 5}, {"durable_decisions": False}):
        with pytest.raises(ValueError, match=f"{next(iter(options))}.*store"):
            Decider(make("seed"), **options)
    with pytest.raises(TypeError, match="JudgmentMemory, KNNMemory or RetrievalMemory"):
        Decider(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    served = decider("seed")
    assert served.ledger_version is None and "in RAM" in repr(served)
    served.sync()  # nothing to do in RAM
    served.close()
    served.decide([0.5] * K, "billing")  # and it goes on


@pytest.mark.parametrize("kind", ["seed", "recommended", "knn", "retrieval"])
def test_a_decider_in_ram_deepcopies_and_pickles_whole_with_a_lock_and_ids_of_its_own(kind: str) -> None:
    served = decider(kind, target_error=0.1, max_pending=50, pending_ttl=1000.0)
    for i, (row, category, action) in enumerate(stream(60, seed=14)):
        decision = served.decide(row, category, now=float(i))
        if i % 4:
            served.verify(decision.id, action, now=float(i))
    twins = [copy.deepcopy(served), pickle.loads(pickle.dumps(served))]
    for twin in twins:
        assert twin.memory is not served.memory and twin._lock is not served._lock
        assert twin.pending(now=60.0) == served.pending(now=60.0) and twin.referral.state() == served.referral.state()
        assert (twin.max_pending, twin.pending_ttl, twin.target_error) == (50, 1000.0, 0.1)
        assert_same(twin, served)
    fresh_ids = {d.decide([0.5] * K, "billing", now=61.0).id for d in (served, *twins)}
    assert len(fresh_ids) == 3  # a copy draws ids of its own
