"""EpisodicMemory against the one-memory-at-a-time reference (tests/episodic_reference.py).

A hypothesis-drawn sequence of operations (add with scopes, validity windows and explicit or
default query and ``now``; delete; expire; admit_and_add; retrieve with every scope form) runs
on the memory and on the reference side by side. After every operation the store, the
evictions, the version, the audit log and every retrieval must match.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae import AdmissionPolicy, EpisodicMemory, RetrievalScorer
from gae.episodic import EVICTIONS
from tests.episodic_reference import ReferenceMemory, Trace, assert_retrieval_matches, per_query_scopes

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None)
DIM = 4
SCOPES = [0, 1, 2, "alpha", "beta"]
WINDOWS = {"always": (-math.inf, math.inf), "later": (5.0, math.inf), "ending": (-math.inf, 8.0), "narrow": (-3.0, 4.0)}
WEIGHTS = [((0.60, 0.25, 0.15), 15.0), ((1.0, 0.0, 0.0), 15.0), ((0.2, 0.5, 0.9), 4.0)]


@dataclass
class Add:
    size: int
    scopes: list
    window: str
    dt: float
    past: bool  # created_at drawn before now, else the default (now)
    explicit_now: bool  # else the default: the latest created_at
    with_query: bool  # else the default: the last embedding added


@dataclass
class Delete:
    picks: list[int]  # positions in the current store


@dataclass
class Expire:
    dt: float
    at_boundary: bool  # expire exactly at the earliest valid_until still stored


@dataclass
class Admit:
    verdicts: list[bool]  # per trace: does the policy accept it


@dataclass
class Retrieve:
    n_queries: int
    k: int
    form: str  # none | shared | per_query
    picks: list[list[int]]  # scope positions in the scopes that exist
    offset: float  # retrieve at now + offset (the clock does not move)


def adds():
    return st.builds(Add, size=st.integers(1, 5), scopes=st.lists(st.sampled_from(SCOPES), min_size=5, max_size=5),
                     window=st.sampled_from(sorted(WINDOWS)), dt=st.floats(0.0, 8.0), past=st.booleans(),
                     explicit_now=st.booleans(), with_query=st.booleans())


def operations():
    pick_lists = st.lists(st.lists(st.integers(0, 6), max_size=3), min_size=4, max_size=4)
    return st.lists(st.one_of(
        adds(), adds(),
        st.builds(Delete, picks=st.lists(st.integers(0, 9), max_size=3)),
        st.builds(Expire, dt=st.floats(0.0, 6.0), at_boundary=st.booleans()),
        st.builds(Admit, verdicts=st.lists(st.booleans(), min_size=1, max_size=3)),
        st.builds(Retrieve, n_queries=st.integers(1, 4), k=st.integers(1, 7),
                  form=st.sampled_from(["none", "shared", "per_query"]), picks=pick_lists,
                  offset=st.sampled_from([0.0, -6.0, 12.0, 5.0, 8.0, -3.0, 4.0])),  # 5, 8, -3, 4: window ends
    ), min_size=1, max_size=12)


class Scenario:
    """One memory and its reference, driven by the same operations, checked after each."""

    def __init__(self, seed: int, capacity: int, eviction: str, weights: tuple[float, float, float],
                 tau: float) -> None:
        self.memory = EpisodicMemory(DIM, capacity, scorer=RetrievalScorer(*weights, tau=tau), eviction=eviction)
        self.reference = ReferenceMemory(capacity, eviction, weights, tau)
        self.gen = torch.Generator().manual_seed(seed)
        self.now = 0.0
        self.gone: set[int] = set()  # deleted or expired ids: never to be seen again
        self.mark = 0  # audit records before the current operation

    def twin(self, memory: EpisodicMemory) -> Scenario:
        """The same scenario, from here on, driving another memory (a reloaded copy)."""
        twin = copy.copy(self)
        twin.memory, twin.reference, twin.gone = memory, copy.deepcopy(self.reference), set(self.gone)
        twin.gen = torch.Generator().set_state(self.gen.get_state())
        return twin

    def run(self, op: Add | Delete | Expire | Admit | Retrieve) -> None:
        version, self.mark = self.memory.version, len(self.memory.audit_log)
        step: dict[type, Callable[[Any], list[str]]] = {Add: self.add, Delete: self.delete, Expire: self.expire,
                                                         Admit: self.admit, Retrieve: self.retrieve}
        new_records = step[type(op)](op)
        records = self.memory.audit_log[self.mark:]
        mutations = [r for r in records if r.action != "reject"]
        assert [r.action for r in records] == new_records
        assert self.memory.version == version + len(mutations)
        assert [r.version for r in mutations] == list(range(version + 1, self.memory.version + 1))
        assert all(r.version == self.memory.version for r in records if r.action == "reject")
        assert sorted(self.stored_ids()) == sorted(self.reference.ids)
        assert len(self.memory) <= self.memory.capacity

    def stored_ids(self) -> list[int]:
        return self.memory.get_buffer("ids")[: len(self.memory)].tolist()

    def draw_traces(self, n: int, scopes: list, created: list[float], window: str) -> list[Trace]:
        x = torch.randn(n, DIM, generator=self.gen)
        importance = torch.rand(n, generator=self.gen)
        low, high = WINDOWS[window]
        return [Trace(-1, row, c, imp, s, self.now + low, self.now + high)
                for row, imp, s, c in zip(x.tolist(), importance.tolist(), scopes, created, strict=True)]

    def added(self, ids, traces: list[Trace], query, now: float, before: int) -> list[str]:
        """Check one add against the reference; returns the audit actions it should have written."""
        want_ids, evicted = self.reference.add(traces, query, now)
        assert ids.tolist() == want_ids
        assert len(self.memory) == min(self.memory.capacity, before + len(traces))
        records = self.memory.audit_log[self.mark:]
        assert records[0].action == "add" and list(records[0].ids) == want_ids and records[0].time == now
        if evicted:
            assert records[1].action == "evict" and records[1].time == now
            assert set(records[1].ids) == evicted and len(records[1].ids) == len(evicted)
        return ["add", "evict"] if evicted else ["add"]

    def add(self, op: Add) -> list[str]:
        self.now += op.dt
        n = op.size
        ages = (5.0 * torch.rand(n, generator=self.gen, dtype=torch.float64)).tolist() if op.past else [0.0] * n
        created = [self.now - a for a in ages]
        traces = self.draw_traces(n, op.scopes[:n], created, op.window)
        query = torch.randn(DIM, generator=self.gen) if op.with_query else None
        now = self.now if op.explicit_now or not op.past else None
        before = len(self.memory)
        ids = self.memory.add(torch.tensor([t.embedding for t in traces]), torch.tensor([t.importance for t in traces]),
                              created_at=torch.tensor(created, dtype=torch.float64) if op.past else None,
                              scope=[t.scope for t in traces],
                              valid_from=torch.tensor([t.valid_from for t in traces], dtype=torch.float64),
                              valid_until=torch.tensor([t.valid_until for t in traces], dtype=torch.float64),
                              query=query, now=now)
        probe = query.tolist() if query is not None else traces[-1].embedding
        return self.added(ids, traces, probe, max(created) if now is None else now, before)

    def delete(self, op: Delete) -> list[str]:
        present = self.stored_ids()
        ids = list(dict.fromkeys(present[p % len(present)] for p in op.picks)) if present else []
        assert self.memory.delete(ids, now=self.now, reason="user asked") == len(ids)
        self.reference.delete(ids)
        self.gone.update(ids)
        if not ids:
            return []
        record = self.memory.audit_log[-1]
        assert list(record.ids) == ids and record.reason == "user asked"
        return ["delete"]

    def expire(self, op: Expire) -> list[str]:
        ends = [t.valid_until for t in self.reference.traces if self.now <= t.valid_until < math.inf]
        self.now = min(ends) if op.at_boundary and ends else self.now + op.dt
        expired = self.reference.expire(self.now)
        assert self.memory.expire(self.now) == len(expired)
        self.gone.update(expired)
        if not expired:
            return []
        assert set(self.memory.audit_log[-1].ids) == expired
        return ["expire"]

    def admit(self, op: Admit) -> list[str]:
        traces = self.draw_traces(len(op.verdicts), [0] * len(op.verdicts), [self.now] * len(op.verdicts), "always")
        dicts = [{"embedding": torch.tensor(t.embedding), "importance": t.importance, "scope": 0,
                  "outcome": "success" if ok else "failure", "quality": 0.9} for t, ok in zip(traces, op.verdicts,
                                                                                           strict=True)]
        accepted = [t for t, ok in zip(traces, op.verdicts, strict=True) if ok]
        before = len(self.memory)
        ids = self.memory.admit_and_add(dicts, AdmissionPolicy(), now=self.now)
        actions = self.added(ids, accepted, accepted[-1].embedding, self.now, before) if accepted else []
        if not accepted:
            assert ids.tolist() == []
        refusals = self.memory.audit_log[self.mark + len(actions):]
        assert len(refusals) == len(op.verdicts) - len(accepted)
        assert all(r.action == "reject" and "'failure'" in r.reason and r.ids == () and r.time == self.now
                   for r in refusals)
        return actions + ["reject"] * len(refusals)

    def retrieve(self, op: Retrieve) -> list[str]:
        existing = [s for s in SCOPES if not isinstance(s, str) or s in self.memory.scope_names] + [7]
        lists = [[existing[p % len(existing)] for p in picks] for picks in op.picks[: op.n_queries]]
        scopes = {"none": None, "shared": lists[0], "per_query": lists}[op.form]
        queries = torch.randn(op.n_queries, DIM, generator=self.gen)
        at = self.now + op.offset
        result = self.memory.retrieve(queries, now=at, k=op.k, scopes=scopes)
        assert result.version == self.memory.version
        assert_retrieval_matches(result, self.reference, queries, at, op.k, scopes)
        # the safety property on its own, without the reference's help
        traces = {t.id: t for t in self.reference.traces}
        for ids, allowed in zip(result.ids.tolist(), per_query_scopes(scopes, op.n_queries), strict=True):
            for i in (i for i in ids if i >= 0):
                assert i not in self.gone and i in traces
                assert allowed is None or traces[i].scope in allowed
                assert traces[i].valid_from <= at < traces[i].valid_until
        return []


@st.composite
def scenarios(draw, eviction=None):
    weights, tau = draw(st.sampled_from(WEIGHTS))
    return Scenario(draw(st.integers(0, 2**16)), draw(st.integers(1, 6)),
                    eviction or draw(st.sampled_from(EVICTIONS)), weights, tau)


# ---------------------------------------------------------------------------------------
# the batched store equals the reference, one memory at a time
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eviction", EVICTIONS)
@FAST
@given(data=st.data())
def test_store_matches_one_at_a_time_reference(eviction, data):
    scenario = data.draw(scenarios(eviction))
    for op in data.draw(operations()):
        scenario.run(op)


@FAST
@given(scenario=scenarios(), ops=operations(), more=operations())
def test_state_dict_round_trip(scenario, ops, more):
    for op in ops:
        scenario.run(op)
    memory = scenario.memory
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    fresh = EpisodicMemory(DIM, memory.capacity, eviction=memory.eviction)  # default scorer: the weights load
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert fresh.audit_log == memory.audit_log and fresh.scope_names == memory.scope_names
    assert fresh.source_ids == memory.source_ids and fresh.version == memory.version and len(fresh) == len(memory)
    assert int(fresh.next_id) == int(memory.next_id)
    assert torch.equal(fresh.scorer.weights, memory.scorer.weights) and torch.equal(fresh.scorer.tau, memory.scorer.tau)
    queries = torch.randn(3, DIM)
    scope_forms = [None, [0, 1], [[0], [2, 7], []]] + [[name] for name in memory.scope_names]
    for scopes in scope_forms:
        a, b = (m.retrieve(queries, now=scenario.now, k=4, scopes=scopes) for m in (memory, fresh))
        for name in ("ids", "scores", "similarity", "recency", "importance"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.version == b.version
    # both carry on alike, each checked against the reference; new ids continue, none reused
    twin = scenario.twin(fresh)
    used = {i for record in memory.audit_log for i in record.ids} | set(range(int(memory.next_id)))
    for op in more:
        scenario.run(op)
        twin.run(op)
        assert fresh.audit_log == memory.audit_log and twin.stored_ids() == scenario.stored_ids()
        new_ids = [i for record in memory.audit_log[scenario.mark:] if record.action == "add" for i in record.ids]
        assert not set(new_ids) & used
        used.update(new_ids)


def test_column_is_the_public_read_of_live_rows():
    memory = EpisodicMemory(4, capacity=3)
    gen = torch.Generator().manual_seed(1)
    memory.add(torch.randn(5, 4, generator=gen), torch.rand(5, generator=gen), now=1.0)
    assert memory.column("ids").tolist() == memory._column("ids").tolist() and len(memory.column("ids")) == 3
    assert memory.column("embeddings").shape == (3, 4)
    with pytest.raises(ValueError, match="name must be 'embeddings' or one of .* got 'size'"):
        memory.column("size")
