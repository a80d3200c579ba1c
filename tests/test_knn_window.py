"""KNNMemory.keep_newest_: a window cut equals a ring that learned only the kept traces."""

from __future__ import annotations

import pytest
import torch

from gae import KNNMemory
from gae.types import StreamStep


def tied_stream(seed: int, n: int, factors: int = 2, categories: int = 3) -> tuple[torch.Tensor, ...]:
    """Factors on a coarse grid, so many distances tie (ties go to the older trace)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (n, factors), generator=gen).float() / 2
    return x, torch.randint(0, categories, (n,), generator=gen), torch.randint(0, 3, (n,), generator=gen)


def make(capacity: int, scoped: bool) -> KNNMemory:
    return KNNMemory(factors=2, actions=3, k=3, capacity=capacity, categories=3, scoped=scoped)


def assert_same_step(a: StreamStep, b: StreamStep) -> None:
    for left, right in ((a.output, b.output), (a.events, b.events), (a.retrieved, b.retrieved)):
        for u, v in zip(left, right, strict=True):
            assert (u is None and v is None) or torch.equal(u, v)


def aged(memory: KNNMemory) -> list[torch.Tensor]:
    """The stored traces, oldest first."""
    order = memory._age_order()
    return [memory.store_factors[order], memory.store_actions[order], memory.store_categories[order],
            memory.store_steps[order]]


@pytest.mark.parametrize("scoped", [False, True])
@pytest.mark.parametrize(("capacity", "learned", "kept"), [(8, 5, 3), (8, 8, 8), (8, 13, 4), (8, 21, 1), (8, 21, 0),
                                                           (5, 12, 4), (20, 6, 6), (20, 6, 2)])
def test_a_cut_ring_goes_on_as_a_ring_that_learned_only_the_kept_traces(scoped, capacity, learned, kept):
    x, category, action = tied_stream(capacity * 100 + learned, learned + 40)
    cut = make(capacity, scoped)
    for i in range(learned):  # one at a time: the single-decision path's views exist before the cut
        cut.learn_one(x[i].tolist(), int(action[i]), int(category[i]))
    assert cut.keep_newest_(kept) == min(learned, capacity) - kept
    fresh = make(capacity, scoped)
    fresh.num_decisions.fill_(learned - kept)  # so the kept traces carry the same sequence numbers
    if kept:
        kept_part = slice(learned - kept, learned)
        fresh.prequential_(x[kept_part], category[kept_part], action[kept_part])
    assert len(cut) == len(fresh) == kept and int(cut.num_decisions) == learned
    for a, b in zip(aged(cut), aged(fresh), strict=True):
        assert torch.equal(a, b)
    queries, query_categories = x[learned:learned + 10], category[learned:learned + 10]
    for a, b in zip(cut(queries, query_categories), fresh(queries, query_categories), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(cut.neighbours(queries, query_categories), fresh.neighbours(queries, query_categories),
                    strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    # learning goes on alike, in a batch and one decision at a time (the compiled path's views)
    rest = slice(learned, learned + 20)
    assert_same_step(cut.prequential_(x[rest], category[rest], action[rest]),
                     fresh.prequential_(x[rest], category[rest], action[rest]))
    for i in range(learned + 20, learned + 40):
        row, a, c = x[i].tolist(), int(action[i]), int(category[i])
        assert cut.score_one(row, c) == fresh.score_one(row, c)
        assert cut.learn_one(row, a, c) == fresh.learn_one(row, a, c)
    for a, b in zip(aged(cut), aged(fresh), strict=True):
        assert torch.equal(a, b)


def test_forgotten_slots_are_zeroed():
    x, category, action = tied_stream(0, 13)
    memory = make(8, False)
    memory.prequential_(x, category, action)
    memory.keep_newest_(3)
    live = torch.zeros(8, dtype=torch.bool)
    live[memory._age_order()] = True
    assert live.sum() == 3
    for buffer in (memory.store_factors, memory.store_actions, memory.store_categories, memory.store_steps):
        assert not buffer[~live].any()
    assert memory.store_steps[live].tolist() == [10, 11, 12]


def test_keeping_at_least_every_trace_changes_nothing():
    x, category, action = tied_stream(1, 6)
    memory = make(8, False)
    memory.prequential_(x, category, action)
    before = {key: value.clone() for key, value in memory.state_dict().items() if isinstance(value, torch.Tensor)}
    for n in (6, 7, 8, 100):
        assert memory.keep_newest_(n) == 0
    assert all(torch.equal(memory.state_dict()[key], value) for key, value in before.items())


@pytest.mark.parametrize(("n", "error", "message"), [(-1, ValueError, "n must be >= 0, got -1"),
                                                     (2.0, TypeError, "n must be an int, got 2.0"),
                                                     (True, TypeError, "n must be an int, got True"),
                                                     ("3", TypeError, "n must be an int, got '3'")])
def test_a_bad_n_is_refused_and_changes_nothing(n, error, message):
    x, category, action = tied_stream(2, 6)
    memory = make(8, False)
    memory.prequential_(x, category, action)
    before = {key: value.clone() for key, value in memory.state_dict().items() if isinstance(value, torch.Tensor)}
    with pytest.raises(error, match=message):
        memory.keep_newest_(n)
    assert all(torch.equal(memory.state_dict()[key], value) for key, value in before.items())
