"""RetrievalMemory: the recency-weighted retrieval contestant."""

from __future__ import annotations

import pytest
import torch

from gae import KNNMemory, RetrievalMemory


def test_abstains_until_k_memories_are_in_reach():
    memory = RetrievalMemory(factors=2, actions=2, k=3, capacity=10, categories=2, scoped=True)
    step = memory.prequential_(torch.rand(5, 2), torch.tensor([0, 0, 1, 0, 0]), torch.tensor([0, 1, 0, 1, 0]))
    assert step.output.action.tolist()[:4] == [-1, -1, -1, -1]  # category 0 has 3 memories only at the 5th
    assert int(step.output.action[4]) >= 0


def test_recency_lets_it_follow_a_changed_world():
    """The same situation verified as 'approve' long ago and as 'reject' recently: retrieval follows
    the recent verdicts, k-NN (no notion of time) still votes by distance alone."""
    x_old = torch.full((6, 2), 0.70) + 0.01 * torch.arange(6).unsqueeze(1)  # slightly closer to the probe
    x_new = torch.full((6, 2), 0.60)
    x = torch.cat([x_old, x_new])
    actions = torch.tensor([0] * 6 + [1] * 6)
    category = torch.zeros(12, dtype=torch.long)
    retrieval = RetrievalMemory(factors=2, actions=["approve", "reject"], k=5, capacity=50, seconds_per_decision=10.0)
    knn = KNNMemory(factors=2, actions=["approve", "reject"], k=5, capacity=50)
    for memory in (retrieval, knn):
        memory.learn_(x, category, actions)
    probe = [0.72, 0.72]
    assert retrieval.score_one(probe)[0] == "reject"
    assert knn.score_one(probe)[0] == "approve"


def test_scoped_retrieval_never_crosses_categories():
    memory = RetrievalMemory(factors=2, actions=2, k=1, capacity=10, categories=["a", "b"], scoped=True)
    memory.learn_one([0.9, 0.9], 1, "a")
    memory.learn_one([0.1, 0.1], 0, "b")
    assert memory.score_one([0.9, 0.9], "b") == ("0", 1.0)


def test_uncertain_outcomes_are_not_stored_by_default():
    memory = RetrievalMemory(factors=2, actions=2, k=1, capacity=10)
    assert memory.learn_one([0.9, 0.1], 1, outcome="__incorrect__") == {"skipped": True}
    assert len(memory.store) == 0
    careless = RetrievalMemory(factors=2, actions=2, k=1, capacity=10, respect_skip=False)
    careless.learn_one([0.9, 0.1], 1, outcome="__incorrect__")
    assert len(careless.store) == 1


def test_capacity_bounds_the_store_and_the_audit_tells_why():
    memory = RetrievalMemory(factors=2, actions=2, k=1, capacity=5)
    memory.learn_(torch.rand(12, 2), torch.zeros(12, dtype=torch.long), torch.randint(0, 2, (12,)))
    assert len(memory.store) == 5
    assert sum(len(r.ids) for r in memory.store.audit_log if r.action == "evict") == 7


@pytest.mark.parametrize("kwargs,words", [({"k": 0}, ["k", "0"]), ({"k": 9, "capacity": 4}, ["k", "capacity"]),
                                          ({"scoped": True}, ["scoped", "categories"]),
                                          ({"seconds_per_decision": 0.0}, ["seconds_per_decision", "0.0"])])
def test_bad_settings_are_refused(kwargs, words):
    with pytest.raises(ValueError) as info:
        RetrievalMemory(factors=2, actions=2, **kwargs)
    assert all(word in str(info.value) for word in words)


def test_labels_stay_bounded_by_the_capacity():
    memory = RetrievalMemory(factors=2, actions=2, k=1, capacity=10)
    memory.learn_(torch.rand(500, 2), torch.zeros(500, dtype=torch.long), torch.randint(0, 2, (500,)))
    assert len(memory.labels) <= 20 and set(memory.store.ids[: len(memory.store)].tolist()) <= set(memory.labels)


def test_state_dict_round_trip_keeps_the_labels():
    memory = RetrievalMemory(factors=2, actions=["a", "b"], k=3, capacity=10)
    memory.learn_(torch.rand(30, 2), torch.zeros(30, dtype=torch.long), torch.randint(0, 2, (30,)))
    restored = RetrievalMemory(factors=2, actions=["a", "b"], k=3, capacity=10)
    restored.load_state_dict(torch.load(_saved(memory), weights_only=True))
    probe = torch.rand(8, 2), torch.zeros(8, dtype=torch.long)
    assert torch.equal(memory(*probe).action, restored(*probe).action) and restored.labels == memory.labels


def _saved(memory):
    import io

    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    return buffer
