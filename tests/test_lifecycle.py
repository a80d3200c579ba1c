"""Decide now, verify later (gae/lifecycle.py) on every decision memory and judgment mode.

Held to the single-decision API: decide then verify, in order, learns what score_one then
learn_one(confirmed=None) learns, bit for bit (the decision log differs only in recording the
confirmed flag as given: it is a fact about what the person accepted, kept by a replay).
"""

from __future__ import annotations

import copy
import io
import threading

import numpy as np
import pytest
import torch

from gae import Decision, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory

C, A, K = ("billing", "refund", "fraud"), ("approve", "reject", "escalate"), 5
JUDGMENTS = {"seed": JudgmentConfig.seed(), "adaptive": JudgmentConfig(drift_mode="adaptive"),
             "prototypes": JudgmentConfig(prototypes=3), "recommended": JudgmentConfig.recommended()}


def make(kind: str, **options):
    if kind in JUDGMENTS:
        return JudgmentMemory(C, A, K, JUDGMENTS[kind], **options)
    if kind == "knn":
        return KNNMemory(factors=K, actions=A, k=3, capacity=50, categories=C, scoped=True, **options)
    return RetrievalMemory(factors=K, actions=A, k=3, capacity=50, categories=C, scoped=True, **options)


KINDS = [*JUDGMENTS, "knn", "retrieval"]


def stream(n: int, seed: int = 0) -> list[tuple[list[float], str, str]]:
    rng = np.random.default_rng(seed)
    centres = rng.random((len(C), len(A), K))
    c, a = rng.integers(0, len(C), n), rng.integers(0, len(A), n)
    x = np.clip(centres[c, a] + 0.15 * rng.standard_normal((n, K)), 0, 1)
    return [(row, C[i], A[j]) for row, i, j in zip(x.tolist(), c, a, strict=True)]


def tensors(memory) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, and the judgment's decision log without its 'given' column."""
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
    lifecycle, single = make(kind), make(kind)
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
    assert_same(lifecycle, single)


@pytest.mark.parametrize("kind", KINDS)
def test_decide_answers_what_the_batched_forward_answers(kind: str) -> None:
    memory = make(kind)
    for row, category, action in stream(200, seed=10):
        memory.learn_one(row, action, category)
    for scale in (1.0, 10.0):  # beyond the data's range the logits grow, and float32 rounding with them
        for row, category, _ in stream(100, seed=11):
            row = [scale * value for value in row]
            decision = memory.decide(row, category)
            with torch.no_grad():
                out = memory(torch.tensor([row]), torch.tensor([C.index(category)]))
            logits = out.logits[0][torch.isfinite(out.logits[0])]
            tolerance = 1e-6 * max(1.0, float(logits.abs().max())) if logits.numel() else 1e-6
            assert decision.action == memory._action_name(int(out.action[0]))
            assert decision.confidence == pytest.approx(float(out.confidence[0]), abs=tolerance)
            assert list(decision.probs.values()) == pytest.approx(out.probs[0].tolist(), abs=tolerance)


def test_a_memory_that_cannot_learn_refuses_to_decide() -> None:
    memory = make("seed").double()  # a judgment memory learns in float32 only
    with pytest.raises(TypeError, match="float32"):
        memory.decide([0.5] * K, "billing")
    assert memory.pending() == []


@pytest.mark.parametrize("kind", KINDS)
def test_interleaved_lifecycles_learn_in_verification_order_with_their_own_recommendation(kind: str) -> None:
    data = stream(120, seed=1)
    lifecycle, reference = make(kind), make(kind)
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
    decision = make("seed").decide([0.5] * K, "billing", id="case-1", source_id=3, now=10.0)
    assert isinstance(decision, Decision) and decision.id == "case-1" and decision.source_id == 3
    assert decision.created_at == 10.0 and decision.action is None and decision.probs == dict.fromkeys(A, 0.0)
    with pytest.raises(AttributeError):
        decision.action = "approve"  # type: ignore[misc]
    assert len(make("seed").decide([0.5] * K, "billing").id) == 32  # a uuid4 hex


@pytest.mark.parametrize("kind", KINDS)
def test_verify_many_equals_the_calls_one_by_one(kind: str) -> None:
    data = stream(60, seed=2)
    many, one = make(kind), make(kind)
    ids_many = [many.decide(row, category, now=0.0).id for row, category, _ in data]
    ids_one = [one.decide(row, category, now=0.0).id for row, category, _ in data]
    answers = many.verify_many(ids_many[::-1], [action for _, _, action in data][::-1], now=1.0)
    assert answers == [one.verify(i, action, now=1.0) for i, (_, _, action) in zip(ids_one[::-1], data[::-1],
                                                                                    strict=True)]
    assert_same(many, one)


def state(memory) -> tuple:
    return tensors(memory), [d.id for d in memory.pending()], memory.expired_decisions


def assert_unchanged(memory, before: tuple) -> None:
    after = state(memory)
    assert after[1:] == before[1:]
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value), name


@pytest.mark.parametrize("kind", KINDS)
def test_refused_calls_change_nothing(kind: str) -> None:
    memory = make(kind)
    for row, category, action in stream(40, seed=3):
        memory.learn_one(row, action, category)
    open_ = memory.decide([0.2] * K, "refund", id="open")
    before = state(memory)
    with pytest.raises(KeyError, match="nope"):
        memory.verify("nope", "approve")
    with pytest.raises(ValueError, match="already pending"):
        memory.decide([0.2] * K, "refund", id="open")
    for bad in ([float("nan")] * K, [1.0] * (K + 1), [1e30] * K):
        with pytest.raises(ValueError):
            memory.decide(bad, "refund")
    with pytest.raises(ValueError, match="category"):
        memory.decide([0.2] * K, "unknown")
    with pytest.raises(TypeError, match="id"):
        memory.decide([0.2] * K, "refund", id=7)
    with pytest.raises((TypeError, ValueError), match="source_id"):
        memory.decide([0.2] * K, "refund", source_id=-1)
    with pytest.raises(ValueError, match="action"):
        memory.verify(open_.id, "unknown")
    with pytest.raises(TypeError, match="skip"):
        memory.verify(open_.id, "approve", skip=1)
    with pytest.raises(KeyError, match="missing"):
        memory.verify_many([open_.id, "missing"], ["approve", "approve"])
    with pytest.raises(ValueError, match="twice"):
        memory.verify_many([open_.id, open_.id], ["approve", "approve"])
    with pytest.raises(ValueError, match="action"):
        memory.verify_many([open_.id], ["unknown"])
    with pytest.raises(ValueError, match="one entry per decision"):
        memory.verify_many([open_.id], [])
    with pytest.raises(ValueError, match="now"):
        memory.pending(now=float("nan"))
    assert_unchanged(memory, before)
    memory.verify(open_.id, "approve")
    with pytest.raises(KeyError, match="verified already"):
        memory.verify(open_.id, "approve")


@pytest.mark.parametrize("kind", ["seed", "knn"])
def test_skip_closes_a_decision_without_learning(kind: str) -> None:
    memory = make(kind)
    decision = memory.decide([0.3] * K, "fraud")
    version = memory.version
    assert memory.verify(decision.id, "reject", skip=True) == {"skipped": True}
    assert memory.version == version and memory.pending() == []
    uncertain, twin = memory.decide([0.3] * K, "fraud"), copy.deepcopy(memory)
    answer = memory.verify(uncertain.id, "reject", outcome="__incorrect__")  # learn_one's skip semantics
    assert answer == twin.learn_one([0.3] * K, "reject", "fraud", confirmed=False, outcome="__incorrect__")
    assert answer == {"skipped": True} or not memory.respect_skip  # the k-NN learns it unless told not to


def test_max_pending_and_pending_ttl_expire_the_oldest_and_count_them(caplog) -> None:
    memory = make("seed", max_pending=3, pending_ttl=10.0)
    ids = [memory.decide([0.1 * i] * K, "billing", now=float(i)).id for i in range(5)]
    assert [d.id for d in memory.pending(now=4.0)] == ids[2:] and memory.expired_decisions == 2
    with caplog.at_level("INFO", logger="gae.lifecycle"):
        assert [d.id for d in memory.pending(now=12.5)] == ids[3:]  # created at 2.0: past its ten seconds
    assert memory.expired_decisions == 3 and "expired" in caplog.text
    with pytest.raises(KeyError):
        memory.verify(ids[0], "approve", now=12.5)
    memory.max_pending = 1
    assert [d.id for d in memory.pending(now=12.5)] == ids[4:] and memory.expired_decisions == 4
    for bad in (0, 1.5, True):
        with pytest.raises((TypeError, ValueError), match="max_pending"):
            memory.max_pending = bad
    for bad in (0.0, -1.0, float("inf"), "1"):
        with pytest.raises((TypeError, ValueError), match="pending_ttl"):
            memory.pending_ttl = bad
    with pytest.raises((TypeError, ValueError), match="max_pending"):
        KNNMemory(factors=K, actions=A, max_pending=0)
    assert make("knn").max_pending == 100_000 and make("retrieval").pending_ttl is None


@pytest.mark.parametrize("kind", KINDS)
def test_pending_decisions_travel_in_the_state_dict(kind: str) -> None:
    memory = make(kind)
    data = stream(50, seed=4)
    for row, category, action in data[:40]:
        memory.learn_one(row, action, category)
    opened = [memory.decide(row, category, source_id=i, now=1.0) for i, (row, category, _) in enumerate(data[40:])]
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    loaded = make(kind)
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    assert loaded.pending() == memory.pending() == opened
    twin = copy.deepcopy(memory)
    for decision, (_, _, action) in zip(opened, data[40:], strict=True):
        expected = memory.verify(decision.id, action)
        assert loaded.verify(decision.id, action) == expected and twin.verify(decision.id, action) == expected
    assert_same(loaded, memory)
    assert_same(twin, memory)


def test_source_ids_reach_the_judgments_log_and_forget() -> None:
    memory, reference = make("seed"), make("seed")
    data = stream(30, seed=5)
    for i, (row, category, action) in enumerate(data):
        decision = memory.decide(row, category, source_id=100 + i % 3)
        memory.verify(decision.id, action)
        if i % 3 != 1:
            reference.learn_one(row, action, category, confirmed=decision.action == action)
    assert memory.decision_log.events()["source_id"].tolist() == [100 + i % 3 for i in range(30)]
    assert memory.forget_([101]) == 10
    for name, value in reference.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(memory.state_dict()[name], value), name


def test_grow_decides_in_an_unseen_category_and_verifies_a_new_action() -> None:
    memory = JudgmentMemory(["billing"], ["approve"], K, grow=True)
    decision = memory.decide([0.4] * K, "shipping")
    assert decision.action is None and decision.confidence == 0.0
    memory.verify(decision.id, "hold")
    assert memory.category_names == ("billing", "shipping") and memory.action_names == ("approve", "hold")
    assert memory.decide([0.4] * K, "shipping").action == "hold"


@pytest.mark.parametrize("kind", ["seed", "recommended", "knn"])
def test_threads_decide_and_verify_without_losing_any(kind: str) -> None:
    memory, data, threads_n = make(kind), stream(800, seed=6), 4
    answers: list[list] = [[] for _ in range(threads_n)]

    def work(t: int) -> None:
        for row, category, action in data[t::threads_n]:
            decision = memory.decide(row, category)
            answers[t].append(memory.verify(decision.id, action))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(map(len, answers)) == len(data) and memory.pending() == []
    assert memory.version == len(data)


@pytest.mark.parametrize("kind", ["seed", "knn", "retrieval"])
def test_a_grown_memory_checkpoints_decisions_made_before_the_growth(kind: str) -> None:
    memory = make(kind, grow=True)
    first, second = memory.decide([0.1] * K, "billing"), memory.decide([0.2] * K, "billing")
    memory.verify(first.id, "hold")  # a new action: the second decision's probs predate it
    assert memory.action_names[-1] == "hold"
    twin = make(kind, grow=True)
    twin.add_actions_("hold")
    twin.load_state_dict(memory.state_dict())
    (loaded,) = twin.pending()
    assert loaded.id == second.id and loaded.probs == {**second.probs, "hold": 0.0}
    assert twin.verify(second.id, "hold") == memory.verify(second.id, "hold")


def test_a_memory_pickled_before_the_lifecycle_scores_learns_and_decides() -> None:
    from gae.judgment.online import HostState

    memory = make("seed")
    for row, category, action in stream(50, seed=7):
        memory.learn_one(row, action, category)
    state = copy.deepcopy(memory).__getstate__()  # tensors of its own
    for name in ("_open", "expired_decisions", "_max_pending", "_pending_ttl"):
        del state[name]
    old_host = HostState()  # an older gae's views: nothing watched yet, and no sentinel
    old_host.touched = old_host.scored = old_host.pointers = old_host.scored_pointers = ()
    state["_host"] = old_host
    old = JudgmentMemory.__new__(JudgmentMemory)
    old.__setstate__(state)
    row = [0.5] * K
    assert old.score_one(row, "billing") == memory.score_one(row, "billing")
    assert old.learn_one(row, "approve", "billing") == memory.learn_one(row, "approve", "billing")
    assert old.pending() == [] and old.max_pending == 100_000 and old.expired_decisions == 0
    assert old.verify(old.decide(row, "refund").id, "reject") == memory.verify(memory.decide(row, "refund").id,
                                                                              "reject")


def test_numpy_ids_categories_and_flags_become_plain_values() -> None:
    memory = make("seed")
    decision = memory.decide(np.full(K, 0.3), np.str_("billing"), id=np.str_("case"), source_id=np.int64(4),
                             now=np.float64(2.0))
    assert type(decision.id) is str and type(decision.category) is str and type(decision.source_id) is int
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    loaded = make("seed")
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    assert loaded.pending() == [decision]
    assert loaded.verify("case", "approve", skip=np.True_) == {"skipped": True}
    knn = make("knn")
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


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_tampered_pending_block_is_refused_naming_it_and_changes_nothing(tamper: str) -> None:
    source = make("seed")
    for i in range(2):
        source.decide([0.1 * (i + 1)] * K, "billing", source_id=i)
    state = source.state_dict()
    TAMPERS[tamper](state["_extra_state"]["pending"])
    memory = make("seed")
    kept = memory.decide([0.9] * K, "fraud")
    before = state_of(memory)
    with pytest.raises(ValueError, match="pending"):
        memory.load_state_dict(state)
    assert memory.pending() == [kept] and state_of(memory) == before


def state_of(memory) -> list:
    return [(name, t.tolist()) for name, t in tensors(memory).items()]


def test_a_negative_expired_count_is_refused() -> None:
    state = make("seed").state_dict()
    state["_extra_state"]["expired_decisions"] = -3
    with pytest.raises(ValueError, match="expired_decisions"):
        make("seed").load_state_dict(state)


def test_a_call_that_raises_expires_nothing_and_an_expired_id_may_be_reused() -> None:
    memory = make("seed", pending_ttl=10.0)
    memory.decide([0.2] * K, "billing", id="old", now=0.0)
    live = memory.decide([0.3] * K, "billing", id="live", now=8.0)
    with pytest.raises(ValueError, match="action"):
        memory.verify("live", "unknown", now=12.0)
    with pytest.raises(TypeError, match="outcome"):
        memory.verify("live", "approve", outcome=3, now=12.0)
    with pytest.raises(KeyError, match="old"):  # past its ten seconds: expired, though still held
        memory.verify("old", "approve", now=12.0)
    with pytest.raises(ValueError, match="factors"):
        memory.decide([float("nan")] * K, "billing", now=12.0)
    assert memory.expired_decisions == 0 and list(memory._open) == ["old", "live"]
    again = memory.decide([0.4] * K, "billing", id="old", now=12.0)  # an expired id may be used again
    assert memory.pending(now=12.0) == [live, again] and memory.expired_decisions == 1


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
