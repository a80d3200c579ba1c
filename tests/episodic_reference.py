"""Slow, obvious references for RetrievalScorer, top_k and EpisodicMemory: python loops over memories.

Everything here is plain python floats (float64) over lists, one memory at a time, so it can
be read against the formula in DESIGN.md section 7 and share no code with the fast paths:

    score(m, q) = w_sim * cos(q, m) + w_rec * exp(-(now - t_m) / tau) + w_imp * importance_m
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Vector = Sequence[float]
Scope = int | str


def cosine(a: Vector, b: Vector) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm > 0 else 0.0


def score(weights: Vector, tau: float, query: Vector, embedding: Vector, age: float, importance: float) -> float:
    w_sim, w_rec, w_imp = weights
    return w_sim * cosine(query, embedding) + w_rec * math.exp(-age / tau) + w_imp * importance


def score_matrix(weights: Vector, tau: float, queries: torch.Tensor, embeddings: torch.Tensor, age: torch.Tensor,
                 importance: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, N) float64 scores, ``age`` (N,) or (Q, N), ``mask`` (N,) or (Q, N) with -inf where False."""
    q_rows, e_rows, imp = queries.tolist(), embeddings.tolist(), importance.tolist()
    out = torch.empty(len(q_rows), len(e_rows), dtype=torch.float64)
    for i, q in enumerate(q_rows):
        for j, e in enumerate(e_rows):
            a = float(age[j] if age.dim() == 1 else age[i, j])
            allowed = mask is None or bool(mask[j] if mask.dim() == 1 else mask[i, j])
            out[i, j] = score(weights, tau, q, e, a, imp[j]) if allowed else -math.inf
    return out


@dataclass
class Trace:
    """One stored memory of the reference store."""

    id: int
    embedding: list[float]
    created_at: float
    importance: float
    scope: Scope
    valid_from: float = -math.inf
    valid_until: float = math.inf
    source_ids: tuple[int, ...] = ()


@dataclass
class Hit:
    id: int
    score: float
    similarity: float
    recency: float
    importance: float


@dataclass
class ReferenceMemory:
    """The store, one memory at a time: after each single add, over capacity, evict one memory.

    ``'lowest_score'``: the lowest score against the current query at ``now``;
    ``'fifo'``: the oldest inserted; ``'importance_recency'``: the lowest ``importance * exp(-age / tau)``.
    Ties go to the older (lower id).
    """

    capacity: int
    eviction: str
    weights: tuple[float, float, float]
    tau: float
    traces: list[Trace] = field(default_factory=list)
    next_id: int = 0

    def _eviction_key(self, trace: Trace, query: Vector, now: float) -> tuple[float, int]:
        age = now - trace.created_at
        if self.eviction == "fifo":
            return (float(trace.id), trace.id)
        if self.eviction == "importance_recency":
            return (trace.importance * math.exp(-age / self.tau), trace.id)
        return (score(self.weights, self.tau, query, trace.embedding, age, trace.importance), trace.id)

    def add(self, traces: Sequence[Trace], query: Vector, now: float) -> tuple[list[int], set[int]]:
        """Store each trace in turn (ids assigned here), evicting as it goes; returns (ids, evicted ids)."""
        ids, evicted = [], set()
        for trace in traces:
            trace.id = self.next_id
            self.next_id += 1
            ids.append(trace.id)
            self.traces.append(trace)
            if len(self.traces) > self.capacity:
                victim = min(self.traces, key=lambda t: self._eviction_key(t, query, now))
                self.traces.remove(victim)
                evicted.add(victim.id)
        return ids, evicted

    def delete(self, ids: Sequence[int]) -> None:
        gone = set(ids)
        self.traces = [t for t in self.traces if t.id not in gone]

    def expire(self, now: float) -> set[int]:
        expired = {t.id for t in self.traces if t.valid_until <= now}
        self.traces = [t for t in self.traces if t.id not in expired]
        return expired

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.traces]

    def visible(self, trace: Trace, now: float, allowed: Sequence[Scope] | None) -> bool:
        in_scope = allowed is None or trace.scope in allowed
        return in_scope and trace.valid_from <= now < trace.valid_until

    def retrieve(self, query: Vector, now: float, k: int, allowed: Sequence[Scope] | None) -> list[Hit]:
        """The best ``k`` visible memories of one query, best first (ties: lower id first)."""
        hits = []
        for t in self.traces:
            if self.visible(t, now, allowed):
                recency = math.exp(-(now - t.created_at) / self.tau)
                hits.append(Hit(t.id, score(self.weights, self.tau, query, t.embedding, now - t.created_at,
                                            t.importance), cosine(query, t.embedding), recency, t.importance))
        return sorted(hits, key=lambda h: (-h.score, h.id))[:k]


def per_query_scopes(scopes: object, n_queries: int) -> list[Sequence[Scope] | None]:
    """The allowed scopes of each query, from any form ``EpisodicMemory.retrieve`` accepts."""
    if scopes is None:
        return [None] * n_queries
    assert isinstance(scopes, (list, tuple))
    if scopes and all(isinstance(s, (list, tuple)) for s in scopes):
        return list(scopes)
    return [scopes] * n_queries


def assert_retrieval_matches(result, reference: ReferenceMemory, queries: torch.Tensor, now: float, k: int,
                             scopes: object = None, atol: float = 2e-5) -> None:
    """Every field of a :class:`~gae.Retrieval` against the reference, row by row.

    Found entries come first, are distinct and visible, and their score and components match
    the reference; the sorted scores equal the reference top-k; ids equal the reference ids
    wherever the reference ranking has no near-tie; padding is id -1, score -inf, components 0.
    """
    n_queries = queries.shape[0]
    for field_name in ("ids", "scores", "similarity", "recency", "importance"):
        assert getattr(result, field_name).shape == (n_queries, k), field_name
    assert result.ids.dtype == torch.int64
    for row, (query, allowed) in enumerate(zip(queries.tolist(), per_query_scopes(scopes, n_queries), strict=True)):
        expected = reference.retrieve(query, now, k, allowed)
        by_id = {h.id: h for h in reference.retrieve(query, now, len(reference.traces), allowed)}
        ids = result.ids[row].tolist()
        n_found = len(expected)
        assert all(i >= 0 for i in ids[:n_found]) and all(i == -1 for i in ids[n_found:]), (ids, n_found)
        assert len(set(ids[:n_found])) == n_found
        assert set(ids[:n_found]) <= set(by_id), "a memory the query may not see was returned"
        found = [by_id[i] for i in ids[:n_found]]
        for name in ("score", "similarity", "recency", "importance"):
            got = getattr(result, name if name != "score" else "scores")[row].double()
            want = torch.tensor([getattr(h, name) for h in found], dtype=torch.float64)
            torch.testing.assert_close(got[:n_found], want, rtol=0, atol=atol, msg=name)
            padding = float("-inf") if name == "score" else 0.0
            assert (got[n_found:] == padding).all(), name
        torch.testing.assert_close(result.scores[row, :n_found].double(),
                                   torch.tensor([h.score for h in expected], dtype=torch.float64), rtol=0, atol=atol)
        ranked = [h.score for h in sorted(by_id.values(), key=lambda h: -h.score)]
        gaps = [a - b for a, b in zip(ranked[:-1], ranked[1:], strict=True)][:n_found]
        if all(gap > 10 * atol for gap in gaps):
            assert ids[:n_found] == [h.id for h in expected]
