"""EpisodicMemory on fixed, hand-made cases: the Retrieval fields, each eviction rule and its ties, the
defaults of add, an empty store, repeated deletes and a float64 store; each checked against the
reference of tests/episodic_reference.py where it has one."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from gae import AdmissionPolicy, EpisodicMemory, RetrievalScorer
from gae.episodic import EVICTIONS
from tests.episodic_reference import ReferenceMemory, Trace, assert_retrieval_matches

DIM = 4


def filled(seed: int = 0, **kwargs) -> tuple[EpisodicMemory, ReferenceMemory, torch.Generator]:
    """Six memories: names and ints for scopes, one not yet valid, one expired by t=10, one deleted."""
    gen = torch.Generator().manual_seed(seed)
    memory = EpisodicMemory(DIM, capacity=8, **kwargs)
    weights, tau = tuple(memory.scorer.weights.tolist()), float(memory.scorer.tau)
    reference = ReferenceMemory(8, memory.eviction, weights, tau)
    scopes, created = ["alpha", 0, "beta", 0, 1, "alpha"], [0.0, 2.0, 3.0, 5.0, 6.0, 9.0]
    valid_from, valid_until = [-math.inf, -math.inf, 20.0, -math.inf, -math.inf, -math.inf], [math.inf] * 6
    valid_until[3] = 10.0
    x, importance = torch.randn(6, DIM, generator=gen), torch.rand(6, generator=gen)
    traces = [Trace(-1, e, c, i, s, f, u) for e, c, i, s, f, u in
              zip(x.tolist(), created, importance.tolist(), scopes, valid_from, valid_until, strict=True)]
    memory.add(x, importance, created_at=torch.tensor(created), scope=scopes, valid_from=torch.tensor(valid_from),
               valid_until=torch.tensor(valid_until), now=9.0)
    reference.add(traces, [], 9.0)
    memory.delete([4], now=9.5)
    reference.delete([4])
    return memory, reference, gen


@pytest.mark.parametrize("scopes", [None, ["alpha"], [0, "beta"], [["alpha"], [0, 1], []],
                                    [[3], ["beta", "alpha"], [0]]])
@pytest.mark.parametrize("now", [9.5, 10.0, 25.0])
def test_retrieval_fields_match_reference(scopes, now):
    memory, reference, gen = filled(scorer=RetrievalScorer(0.5, 0.3, 0.2, tau=6.0))
    queries = torch.randn(3, DIM, generator=gen)
    result = memory.retrieve(queries, now=now, k=4, scopes=scopes)
    assert type(result).__name__ == "Retrieval"
    assert result._fields == ("ids", "scores", "similarity", "recency", "importance", "version")
    assert result.version == memory.version == 2
    assert_retrieval_matches(result, reference, queries, now, 4, scopes)
    assert 4 not in result.ids.tolist()  # deleted
    if now >= 10.0:
        assert 3 not in result.ids  # validity ended at 10
    if now < 20.0:
        assert 2 not in result.ids  # not valid before 20


def test_retrieval_reports_the_version_it_saw():
    memory, _, gen = filled()
    first = memory.retrieve(torch.randn(1, DIM, generator=gen), now=9.5)
    memory.add(torch.randn(1, DIM, generator=gen), torch.rand(1, generator=gen), now=11.0)
    second = memory.retrieve(torch.randn(1, DIM, generator=gen), now=11.0)
    assert (first.version, second.version) == (2, 3) and memory.version == 3


def test_retrieval_of_an_empty_store_is_all_padding():
    memory = EpisodicMemory(DIM)
    for _ in range(2):
        result = memory.retrieve(torch.randn(2, DIM), now=0.0, k=3, scopes=[0])
        assert (result.ids == -1).all() and torch.isinf(result.scores).all() and result.ids.shape == (2, 3)
        assert all((getattr(result, name) == 0).all() for name in ("similarity", "recency", "importance"))
        ids = memory.add(torch.randn(2, DIM), torch.rand(2))
        memory.delete(ids)  # emptied again: the buffers are allocated but hold nothing


@pytest.mark.parametrize("eviction", EVICTIONS)
@pytest.mark.parametrize("one_by_one", [False, True])
def test_eviction_ties_go_to_the_older(eviction, one_by_one):
    memory = EpisodicMemory(DIM, capacity=2, eviction=eviction)
    same = torch.tensor([[1.0, 0.5, -0.25, 2.0]])
    batches = [same] * 4 if one_by_one else [same.expand(4, DIM)]
    for batch in batches:
        memory.add(batch, torch.full((len(batch),), 0.5), created_at=3.0, query=-same[0], now=7.0)
    assert sorted(memory.ids[:2].tolist()) == [2, 3]
    assert sorted(i for r in memory.audit_log if r.action == "evict" for i in r.ids) == [0, 1]


@pytest.mark.parametrize("eviction,survivors", [("lowest_score", [0, 2]), ("fifo", [1, 2]),
                                                ("importance_recency", [1, 2])])
def test_each_rule_evicts_what_it_says(eviction, survivors):
    memory = EpisodicMemory(2, capacity=2, eviction=eviction)
    # 0: old, on the query's side, unimportant; 1: recent and important, far from the query
    memory.add(torch.tensor([[1.0, 0.0]]), torch.tensor([0.0]), now=0.0)
    memory.add(torch.tensor([[-1.0, 0.0]]), torch.tensor([1.0]), now=9.0)
    memory.add(torch.tensor([[0.0, 1.0]]), torch.tensor([0.6]), query=torch.tensor([1.0, 0.0]), now=10.0)
    assert sorted(memory.ids[:2].tolist()) == survivors
    assert memory.audit_log[-1].reason == f"over capacity 2 ({eviction})"


def test_add_defaults_and_stored_columns():
    memory = EpisodicMemory(DIM)
    memory.add(torch.randn(2, DIM), torch.rand(2))  # no time at all: created at 0
    memory.add(torch.randn(2, DIM), torch.rand(2), now=4.0, scope="0", memory_type=["semantic", "episode"],
               confidence=0.25, source_ids=[[0, 1], []])
    memory.add(torch.randn(1, DIM), torch.rand(1), created_at=torch.tensor([6.0]), scope=["z"])
    assert memory.created_at[:5].tolist() == [0.0, 0.0, 4.0, 4.0, 6.0]
    assert [r.time for r in memory.audit_log] == [0.0, 4.0, 6.0]  # now defaults to the latest created_at
    assert memory.scope_names == ["0", "z"] and memory.scope[:5].tolist() == [0, 0, -1, -1, -2]
    assert memory.memory_type[:5].tolist() == [0, 0, 1, 0, 0]
    assert memory.confidence[:5].tolist() == [1.0, 1.0, 0.25, 0.25, 1.0]
    assert memory.source_ids == [(), (), (0, 1), (), ()]
    torch.testing.assert_close(memory.embeddings[:5].norm(dim=-1), torch.ones(5))
    # int scope 0 and the name "0" are different scopes
    ids = memory.retrieve(torch.randn(1, DIM), now=6.0, k=5, scopes=[0]).ids
    assert sorted(i for i in ids[0].tolist() if i >= 0) == [0, 1]


def test_delete_counts_each_id_once():
    memory, _, _ = filled()
    assert memory.delete([1, 1, 5], now=10.0) == 2
    assert memory.audit_log[-1].ids == (1, 5) and memory.delete([]) == 0 and memory.version == 3


def test_retrieval_with_a_learnable_scorer_builds_no_graph():
    memory, reference, gen = filled(scorer=RetrievalScorer(learnable=True))
    queries = torch.randn(2, DIM, generator=gen)
    result = memory.retrieve(queries, now=9.5, k=3)
    assert not result.scores.requires_grad
    assert_retrieval_matches(result, reference, queries, 9.5, 3)


@pytest.mark.parametrize("eviction", EVICTIONS)
def test_a_float64_store_answers_like_the_float32_one(eviction):
    memory, reference, gen = filled(eviction=eviction)
    wide = copy.deepcopy(memory).to(torch.float64)
    assert wide.embeddings.dtype == torch.float64 and wide.scorer.weights.dtype == torch.float64
    x, importance, query = torch.randn(4, DIM, generator=gen), torch.rand(4, generator=gen), torch.randn(DIM)
    for m in (memory, wide):  # float32 inputs, and over capacity: eviction scores in the store's dtype
        m.add(x, importance, query=query, now=12.0)
    assert memory.get_buffer("ids")[:8].tolist() == wide.get_buffer("ids")[:8].tolist()
    queries = torch.randn(3, DIM, generator=gen)
    a, b = (m.retrieve(queries, now=12.0, k=4, scopes=[0, "alpha"]) for m in (memory, wide))
    assert torch.equal(a.ids, b.ids) and b.scores.dtype == torch.float64
    torch.testing.assert_close(a.scores.double(), b.scores, rtol=0, atol=1e-5)


def test_admitted_traces_keep_their_type_and_validity():
    memory = EpisodicMemory(2, capacity=10)
    policy = AdmissionPolicy()
    trace = {"embedding": torch.tensor([1.0, 0.0]), "importance": 0.5, "outcome": "success", "quality": 0.9,
             "memory_type": "semantic", "valid_from": 5.0, "valid_until": 10.0, "created_at": 1.0}
    ids = memory.admit_and_add([trace], policy, now=2.0)
    assert int(memory.memory_type[0]) == 1 and float(memory.created_at[0]) == 1.0
    assert memory.retrieve(torch.tensor([[1.0, 0.0]]), now=4.0, k=1).ids.tolist() == [[-1]]  # not yet valid
    assert memory.retrieve(torch.tensor([[1.0, 0.0]]), now=6.0, k=1).ids.tolist() == [ids.tolist()]
    assert memory.retrieve(torch.tensor([[1.0, 0.0]]), now=10.0, k=1).ids.tolist() == [[-1]]  # expired
