"""KNNMemory semantics on small hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from gae import KNNMemory


def test_abstains_until_k_traces():
    memory = KNNMemory(factors=1, actions=2, k=3, capacity=10)
    step = memory.prequential_(torch.tensor([[0.0], [0.1], [0.2], [0.3]]), torch.zeros(4, dtype=torch.long),
                               torch.tensor([0, 0, 1, 1]))
    assert step.output.action.tolist() == [-1, -1, -1, 1]  # 0.2 (b) outweighs 0.1 + 0.0 (a)
    assert step.sq_diff is None and step.events.applied.all()


def test_distance_weighted_vote_and_confidence():
    memory = KNNMemory(factors=1, actions=["a", "b"], k=3, capacity=10)
    for value, action in ((0.0, "a"), (0.3, "b"), (0.4, "b")):
        memory.learn_one([value], action)
    # query 0.1: distances 0.1 (a), 0.2 (b), 0.3 (b): votes a = 10, b = 5 + 3.33
    weight = {"a": 1 / (0.1 + 1e-8), "b": 1 / (0.2 + 1e-8) + 1 / (0.3 + 1e-8)}
    action, confidence = memory.score_one([0.1])
    assert action == "a" and confidence == pytest.approx(weight["a"] / sum(weight.values()), rel=1e-6)
    with torch.no_grad():
        out = memory(torch.tensor([[0.1]]), torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(out.probs[0], torch.tensor([weight["a"], weight["b"]]) / sum(weight.values()))
    torch.testing.assert_close(out.logits, out.probs.log())


def test_scoped_memory_only_sees_its_category():
    flat = KNNMemory(factors=1, actions=2, k=1, capacity=10, categories=["x", "y"])
    scoped = KNNMemory(factors=1, actions=2, k=1, capacity=10, categories=["x", "y"], scoped=True)
    for memory in (flat, scoped):
        memory.learn_one([0.0], 0, "x")
        memory.learn_one([1.0], 1, "y")
    assert flat.score_one([0.1], "y") == ("0", 1.0)
    assert scoped.score_one([0.1], "y") == ("1", 1.0)


def test_respect_skip_drops_uncertain_outcomes():
    plain = KNNMemory(factors=1, actions=2, k=1, capacity=10)
    careful = KNNMemory(factors=1, actions=2, k=1, capacity=10, respect_skip=True)
    for memory in (plain, careful):
        memory.learn_one([0.5], 1, outcome="__incorrect__")
    assert len(plain) == 1 and len(careful) == 0
    assert careful.learn_one([0.5], 1, outcome="__incorrect__") == {"skipped": True}


def test_capacity_evicts_the_oldest():
    memory = KNNMemory(factors=1, actions=3, k=1, capacity=2)
    for value, action in ((0.0, 0), (0.5, 1), (1.0, 2)):
        memory.learn_one([value], action)
    assert len(memory) == 2
    assert memory.score_one([0.0]) == ("1", 1.0)  # the trace at 0.0 was evicted


def test_categories_are_ignored_without_names():
    memory = KNNMemory(factors=1, actions=2, k=1)
    memory.learn_one([0.2], 1, "anything")
    assert memory.score_one([0.2], "something else") == ("1", 1.0)
    assert memory.parameter_inventory()["total"] == 200 * 4 + 2 + 1
