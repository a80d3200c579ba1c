"""EpisodicMemory and AdmissionPolicy: every bad input is refused by name and value and changes nothing;
what the policy admits, what it refuses and why, and how admit_and_add stores and logs it."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from gae import Admission, AdmissionPolicy, EpisodicMemory

DIM = 4


def filled() -> EpisodicMemory:
    memory = EpisodicMemory(DIM, capacity=5)
    gen = torch.Generator().manual_seed(0)
    memory.add(torch.randn(3, DIM, generator=gen), torch.rand(3, generator=gen), scope=["alpha", 0, 1], now=1.0,
               source_ids=[[7], [], [8, 9]])
    return memory


def snapshot(memory: EpisodicMemory) -> dict:
    return {"tensors": copy.deepcopy({k: v for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}),
            "audit": list(memory.audit_log), "version": memory.version, "next_id": int(memory.next_id),
            "scope_names": list(memory.scope_names), "source_ids": list(memory.source_ids), "len": len(memory)}


def assert_unchanged(memory: EpisodicMemory, before: dict) -> None:
    after = snapshot(memory)
    for key, value in before["tensors"].items():
        assert torch.equal(value, after["tensors"][key]), key
    assert {k: v for k, v in after.items() if k != "tensors"} == {k: v for k, v in before.items() if k != "tensors"}


def with_value(x: torch.Tensor, value: float) -> torch.Tensor:
    x = x.clone()
    x[1, 2] = value
    return x


TRACE = {"embedding": torch.ones(DIM), "importance": 0.5, "outcome": "success", "quality": 0.9}
REFUSED = {**TRACE, "outcome": "failure"}
X, IMP = torch.randn(3, DIM), torch.tensor([0.1, 0.5, 0.9])
BAD_ADDS = [  # keyword arguments over a good add of 3 memories, error, words the message must contain
    ({"embeddings": torch.randn(3, 5)}, ValueError, ["embeddings", "(3, 5)"]),
    ({"embeddings": torch.randn(DIM)}, ValueError, ["embeddings", "(4,)"]),
    ({"embeddings": with_value(X, math.nan)}, ValueError, ["embeddings", "nan", "[1, 2]"]),
    ({"embeddings": with_value(X, math.inf)}, ValueError, ["embeddings", "inf"]),
    ({"embeddings": X.long()}, TypeError, ["embeddings", "torch.int64"]),
    ({"embeddings": X.tolist()}, TypeError, ["embeddings", "list"]),
    ({"embeddings": X[:0], "importance": IMP[:0]}, ValueError, ["embeddings", "empty"]),
    ({"importance": torch.tensor([0.1, math.nan, 0.2])}, ValueError, ["importance", "nan"]),
    ({"importance": torch.tensor([0.1, math.inf, 0.2])}, ValueError, ["importance", "inf"]),
    ({"importance": torch.tensor([0.1, 1.5, 0.2])}, ValueError, ["importance", "1.5"]),
    ({"importance": -0.25}, ValueError, ["importance", "-0.25"]),
    ({"importance": IMP[:2]}, ValueError, ["importance", "(2,)"]),
    ({"created_at": math.nan}, ValueError, ["created_at", "nan"]),
    ({"now": math.inf}, ValueError, ["now", "inf"]),
    ({"now": "late"}, TypeError, ["now", "'late'"]),
    ({"confidence": 2.0}, ValueError, ["confidence", "2.0"]),
    ({"valid_from": math.nan}, ValueError, ["valid_from", "nan"]),
    ({"valid_until": torch.tensor([1.0, 2.0])}, ValueError, ["valid_until", "(2,)"]),
    # each of these also names a new scope: a refused add must not register it
    ({"memory_type": "fact"}, ValueError, ["memory_type", "'fact'"]),
    ({"memory_type": ["episode", "semantic"]}, ValueError, ["memory_type", "'semantic'"]),
    ({"memory_type": 5}, TypeError, ["memory_type", "5"]),
    ({"scope": ["gamma", -2, 0]}, ValueError, ["scope", "-2"]),
    ({"scope": 1.5}, TypeError, ["scope", "1.5"]),
    ({"scope": ["gamma", 0]}, ValueError, ["scope", "(3)", "2"]),
    ({"source_ids": [[1], [2]]}, ValueError, ["source_ids", "(3)", "2"]),
    ({"query": torch.randn(5)}, ValueError, ["query", "(1, 5)"]),
    ({"query": torch.tensor([0.0, math.nan, 0.0, 1.0])}, ValueError, ["query", "nan"]),
    ({"query": [1.0, 0.0, 0.0, 0.0]}, TypeError, ["query", "list"]),
]


@pytest.mark.parametrize("kwargs,error,words", BAD_ADDS)
def test_bad_add_is_refused_and_changes_nothing(kwargs, error, words):
    memory = filled()
    before = snapshot(memory)
    arguments = {"embeddings": X, "importance": IMP, "scope": ["gamma", "alpha", 0], "now": 2.0, **kwargs}
    with pytest.raises(error) as info:
        memory.add(arguments.pop("embeddings"), arguments.pop("importance"), **arguments)
    assert all(word in str(info.value) for word in words), (words, str(info.value))
    assert_unchanged(memory, before)
    assert "gamma" not in memory.scope_names


Q = torch.randn(2, DIM)
BAD_RETRIEVALS = [
    ({"queries": torch.randn(2, 5)}, ValueError, ["queries", "(2, 5)"]),
    ({"queries": torch.randn(DIM)}, ValueError, ["queries", "(4,)"]),
    ({"queries": with_value(Q, math.nan)}, ValueError, ["queries", "nan", "[1, 2]"]),
    ({"queries": Q[:0]}, ValueError, ["queries", "empty"]),
    ({"k": 0}, ValueError, ["k", "0"]),
    ({"k": 2.5}, TypeError, ["k", "2.5"]),
    ({"now": math.nan}, ValueError, ["now", "nan"]),
    ({"scopes": ["gamma"]}, ValueError, ["scopes", "'gamma'", "alpha"]),
    ({"scopes": [["alpha"], [0, "gamma"]]}, ValueError, ["scopes", "'gamma'"]),
    ({"scopes": [[0], [1], [0, 1]]}, ValueError, ["scopes", "(2)", "3"]),
    ({"scopes": [-1]}, ValueError, ["scopes", "-1"]),
    ({"scopes": "alpha"}, TypeError, ["scopes", "'alpha'"]),
    ({"scopes": 0}, TypeError, ["scopes", "0"]),
]


@pytest.mark.parametrize("kwargs,error,words", BAD_RETRIEVALS)
def test_bad_retrieval_is_refused(kwargs, error, words):
    memory = filled()
    before = snapshot(memory)
    arguments = {"queries": Q, "now": 2.0, "k": 2, **kwargs}
    with pytest.raises(error) as info:
        memory.retrieve(arguments.pop("queries"), **arguments)
    assert all(word in str(info.value) for word in words), (words, str(info.value))
    assert_unchanged(memory, before)


@pytest.mark.parametrize("call,error,words", [
    (lambda m: m.delete([99]), ValueError, ["ids", "99"]),
    (lambda m: m.delete([0, 99, 1]), ValueError, ["ids", "[99]"]),
    (lambda m: m.delete([0], now=math.nan), ValueError, ["now", "nan"]),
    (lambda m: m.delete([0], now="soon"), TypeError, ["now", "'soon'"]),
    (lambda m: m.expire(math.nan), ValueError, ["now", "nan"]),
    (lambda m: m.expire("soon"), TypeError, ["now", "'soon'"]),
    (lambda m: m.admit_and_add([{**TRACE, "embedding": torch.randn(5)}, REFUSED], AdmissionPolicy(), now=2.0),
     ValueError, ["embeddings", "(1, 5)"]),
    (lambda m: m.admit_and_add([{**TRACE, "importance": 1.5}, REFUSED], AdmissionPolicy(), now=2.0),
     ValueError, ["importance", "1.5"]),
    (lambda m: m.admit_and_add([REFUSED], AdmissionPolicy(), now=math.nan), ValueError, ["now", "nan"]),
])
def test_bad_delete_expire_admit_are_refused_and_change_nothing(call, error, words):
    memory = filled()
    before = snapshot(memory)
    with pytest.raises(error) as info:
        call(memory)
    assert all(word in str(info.value) for word in words), (words, str(info.value))
    assert_unchanged(memory, before)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"dim": 0}, ValueError, ["dim", "0"]),
    ({"dim": "4"}, TypeError, ["dim", "'4'"]),
    ({"capacity": 0}, ValueError, ["capacity", "0"]),
    ({"capacity": 2.5}, TypeError, ["capacity", "2.5"]),
    ({"eviction": "lru"}, ValueError, ["eviction", "'lru'", "fifo"]),
])
def test_bad_hyperparameters(kwargs, error, words):
    with pytest.raises(error) as info:
        EpisodicMemory(**{"dim": DIM, **kwargs})
    assert all(word in str(info.value) for word in words), str(info.value)


# ---------------------------------------------------------------------------------------
# admission
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("trace,reason", [
    ({"outcome": "success", "quality": 0.9}, ""),
    ({"outcome": "corrected", "quality": 0.5}, ""),  # quality == min_quality is enough
    ({"outcome": "useful_failure", "quality": 1}, ""),
    ({"outcome": "failure", "quality": 0.9}, "outcome 'failure' not in ('success', 'corrected', 'useful_failure')"),
    ({"quality": 0.9}, "outcome None not in"),
    ({"outcome": "success", "quality": 0.49}, "quality 0.49 below 0.5"),
    ({"outcome": "success", "quality": math.nan}, "quality nan below 0.5"),
    ({"outcome": "success", "quality": "high"}, "quality 'high' below 0.5"),
    ({"outcome": "success", "quality": True}, "quality True below 0.5"),
    ({"outcome": "success"}, "quality None below 0.5"),
])
def test_default_policy(trace, reason):
    verdict = AdmissionPolicy().admit(trace)
    assert isinstance(verdict, Admission) and verdict.accepted == (reason == "")
    assert verdict.reason.startswith(reason) and (verdict.reason == "") == verdict.accepted


def test_policy_options():
    policy = AdmissionPolicy(allowed_outcomes=["failure"], min_quality=0.0, allowed_scopes=["alpha", 3])
    assert policy.admit({"outcome": "failure", "quality": 0.0, "scope": "alpha"}) == Admission(True, "")
    assert policy.admit({"outcome": "failure", "quality": 0.0, "scope": 3}).accepted
    assert policy.admit({"outcome": "failure", "quality": 0.0}) == Admission(False, "scope 0 not in ('alpha', 3)")
    assert policy.admit({"outcome": "success", "quality": 1.0, "scope": "alpha"}).reason.startswith("outcome")
    assert repr(policy) == ("AdmissionPolicy(allowed_outcomes=('failure',), min_quality=0.0, "
                            "allowed_scopes=('alpha', 3))")


@pytest.mark.parametrize("kwargs,error,words", [
    ({"allowed_outcomes": "success"}, ValueError, ["allowed_outcomes", "'success'"]),
    ({"allowed_outcomes": []}, ValueError, ["allowed_outcomes", "[]"]),
    ({"min_quality": 1.5}, ValueError, ["min_quality", "1.5"]),
    ({"min_quality": "0.5"}, TypeError, ["min_quality", "'0.5'"]),
])
def test_bad_policy(kwargs, error, words):
    with pytest.raises(error) as info:
        AdmissionPolicy(**kwargs)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_admit_and_add_stores_the_accepted_in_one_add_and_logs_each_refusal():
    memory = filled()
    policy = AdmissionPolicy(allowed_scopes=["alpha", "team", 0])
    traces = [{**TRACE, "scope": "team", "confidence": 0.4, "source_ids": [3, 4]},
              {**TRACE, "quality": 0.1},
              {**TRACE, "embedding": -torch.ones(DIM), "importance": 0.2},
              {**TRACE, "scope": "other"}]
    version, n_records = memory.version, len(memory.audit_log)
    ids = memory.admit_and_add(traces, policy, now=5.0)
    assert ids.tolist() == [3, 4] and len(memory) == 5 and memory.version == version + 1
    records = memory.audit_log[n_records:]
    assert [r.action for r in records] == ["add", "reject", "reject"]
    assert records[0].ids == (3, 4) and records[0].time == 5.0
    assert [r.reason for r in records[1:]] == [policy.admit(traces[1]).reason, policy.admit(traces[3]).reason]
    assert all(r.ids == () and r.time == 5.0 and r.version == memory.version for r in records[1:])
    assert memory.scope_names == ["alpha", "team"] and memory.scope[3:5].tolist() == [-2, 0]
    assert memory.confidence[3:5].tolist() == [pytest.approx(0.4), 1.0] and memory.source_ids[3:] == [(3, 4), ()]
    assert memory.created_at[3:5].tolist() == [5.0, 5.0]


def test_admit_and_add_with_nothing_accepted_only_logs():
    memory = filled()
    before = snapshot(memory)
    ids = memory.admit_and_add([REFUSED, {**TRACE, "quality": 0.0}], AdmissionPolicy(), now=3.0)
    assert ids.dtype == torch.int64 and ids.tolist() == []
    assert [r.action for r in memory.audit_log[len(before["audit"]):]] == ["reject", "reject"]
    memory.audit_log = memory.audit_log[: len(before["audit"])]
    assert_unchanged(memory, before)  # nothing else moved, not even the version
    assert memory.admit_and_add([], AdmissionPolicy(), now=3.0).tolist() == []
    assert_unchanged(memory, before)


def test_admit_and_add_over_capacity_evicts():
    memory = EpisodicMemory(DIM, capacity=1)
    ids = memory.admit_and_add([TRACE, REFUSED, {**TRACE, "embedding": -torch.ones(DIM)}], AdmissionPolicy(),
                               now=1.0, query=torch.ones(DIM))
    assert ids.tolist() == [0, 1] and memory.ids[:1].tolist() == [0]
    assert [(r.action, r.ids, r.version) for r in memory.audit_log] == [("add", (0, 1), 1), ("evict", (1,), 2),
                                                                         ("reject", (), 2)]


def test_loading_another_width_or_a_larger_store_is_refused():
    source = EpisodicMemory(4, capacity=30)
    source.add(torch.randn(20, 4), torch.rand(20), now=0.0)
    with pytest.raises(ValueError, match="dim=3"):
        EpisodicMemory(3, capacity=30).load_state_dict(source.state_dict())
    with pytest.raises(ValueError, match="capacity=5"):
        EpisodicMemory(4, capacity=5).load_state_dict(source.state_dict())


def test_float_ids_are_refused_not_truncated():
    memory = EpisodicMemory(2, capacity=5)
    memory.add(torch.randn(3, 2), torch.rand(3), now=0.0)
    with pytest.raises(TypeError, match="ids must be integers"):
        memory.delete([1.7])
    assert len(memory) == 3
