"""Retrieval from an :class:`~gae.EpisodicMemory`: the ``k`` best memories of each query among
those it may see (scope, validity window, and type when asked), scored by :class:`~gae.RetrievalScorer`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as nnf
from torch import Tensor

from gae import validation as check
from gae.episodic.columns import MEMORY_TYPES, scope_index
from gae.episodic.records import Retrieval
from gae.episodic.scorer import _CHUNK, RetrievalScorer, TopK, top_k
from gae.validation import scope_lists

SUBSET_FROM = _CHUNK  # rows past which a retrieval that may see few of them scores only those


class RetrievingMixin:
    """``retrieve`` of :class:`~gae.EpisodicMemory` (mixed into it)."""

    dim: int
    embeddings: Tensor
    scorer: RetrievalScorer
    scope_names: list[str]
    _lock: Any
    _fresh: Any
    _column: Any
    version: Any

    @torch.no_grad()
    def retrieve(self, queries: Tensor, *, now: float, k: int = 5, scopes: Any = None,
                 memory_type: str | None = None) -> Retrieval:
        """The ``k`` best memories for each of Q queries, among those each query may see.

        Args:
            queries: (Q, D).
            now: the current time in seconds.
            k: memories per query.
            scopes: None (every scope); the scopes every query may see (a list, or a 1-D integer
                tensor (any device) or numpy array); or one list per query (a list of lists or of
                1-D tensors, or a (Q, S) integer tensor or array).
            memory_type: None (every type), or only memories of this type (``'episode'`` or
                ``'semantic'``).
        """
        with self._lock:  # a reload from the store and the read of one state
            self._fresh()
            device = self.embeddings.device
            queries = check.check_factors(queries, self.dim, device, "queries")
            now = check.check_real("now", now, low=-float("inf"))
            k = check.check_int("k", k, low=1)
            if memory_type is not None and memory_type not in MEMORY_TYPES:
                raise ValueError(f"memory_type must be None or one of {MEMORY_TYPES}, got {memory_type!r}")
            allowed = self._allowed(scopes, queries.shape[0])  # (Q, N) or (N,) bool, or None
            created, importance = self._column("created_at"), self._column("importance")
            w_sim, w_rec, w_imp = self.scorer.weights.detach()
            recency = torch.exp(-(now - created).float() / self.scorer.tau)
            valid = (self._column("valid_from") <= now) & (now < self._column("valid_until"))
            if memory_type is not None:
                valid &= self._column("memory_type") == MEMORY_TYPES.index(memory_type)
            if allowed is not None and allowed.dim() == 1:
                valid &= allowed
                allowed = None
            bias = (w_rec * recency + w_imp * importance).masked_fill(~valid, float("-inf"))
            queries = queries.to(self.embeddings.dtype)  # the store's dtype: float32 unless moved with .to(dtype)
            embeddings = self._column("embeddings")
            if allowed is None and valid.numel() > SUBSET_FROM and 2 * int(valid.sum()) < valid.numel():
                # a large store of which the queries may see less than half (a scope's share): the scan
                # reads only those rows, not every embedding (ties rank by row, as a stable sort does)
                seen = valid.nonzero().squeeze(1)
                best = top_k(self.scorer, queries, embeddings[seen], bias[seen], k)
                best = TopK(best.scores, torch.where(best.rows >= 0, seen[best.rows.clamp_min(0)], best.rows))
            else:
                best = top_k(self.scorer, queries, embeddings, bias, k, allowed)
            if not embeddings.shape[0]:  # no memory: nothing to gather from, every slot is padding
                zero = torch.zeros_like(best.scores)
                return Retrieval(best.rows, best.scores, zero, zero.clone(), zero.clone(), self.version)
            rows = best.rows.clamp_min(0)
            found = best.rows >= 0
            unit = nnf.normalize(queries, dim=-1)
            similarity = (unit.unsqueeze(1) * self._column("embeddings")[rows]).sum(-1)
            zero = torch.zeros_like(similarity)
            return Retrieval(self._column("ids")[rows].masked_fill(~found, -1), best.scores,
                             torch.where(found, similarity, zero), torch.where(found, recency[rows], zero),
                             torch.where(found, importance[rows], zero), self.version)

    def _allowed(self, scopes: Any, n_queries: int) -> Tensor | None:
        parsed = scope_lists(scopes, n_queries)
        if parsed is None:
            return None
        memory_scope = self._column("scope")
        if not parsed.per_query:
            wanted = torch.tensor([scope_index(s, self.scope_names, "scopes") for s in parsed.values],
                                  dtype=torch.int64, device=memory_scope.device)
            return torch.isin(memory_scope, wanted)
        wanted_per_query = [torch.tensor([scope_index(s, self.scope_names, "scopes") for s in allowed],
                                         dtype=torch.int64, device=memory_scope.device) for allowed in parsed.values]
        return torch.stack([torch.isin(memory_scope, wanted) for wanted in wanted_per_query])  # (Q, N)

