"""The single-decision path of :class:`gae.RetrievalMemory`: the host of its compiled kernels.

:class:`RetrievalHost` keeps NumPy views of the store's buffers and scorer between calls,
scratch tensors shaped as the checked path's intermediates, and the kernels' entry points; the
kernels and why their answers are the checked path's to the last bit are in
:mod:`gae.models.retrieval_kernels`.
"""

from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gae.compiled import entry_point
from gae.episodic.records import COLUMNS
from gae.episodic.scorer import _CHUNK
from gae.models.retrieval_kernels import (
    BAD_LABEL,
    FLOAT32_MAX,
    INCOMPLETE,
    NOT_A_NUMBER,
    SUMMED_BY_TORCH,
    TIED,
    TOTAL_FLOOR,
    append_row,
    best_share,
    evict_lowest,
    normalize_rows,
    prepare,
    retrieval_terms,
    scatter_votes,
    top_k_rows,
)
from gae.validation import LEARN_LIMIT


class ScoreViews(NamedTuple):
    """Scoring ``n`` rows: torch tensors (``_t``) shaped and strided as the checked path's, and their NumPy views."""

    args_t: Tensor  # (n,) exponents
    rec_t: Tensor  # (n,) recency
    rec: np.ndarray
    bias_t: Tensor  # (1, n)
    bias: np.ndarray
    block_t: Tensor  # (1, n) scores
    block: np.ndarray
    embeddings_t: Tensor  # (D, n), the store's rows transposed


class EvictViews(NamedTuple):
    """Evicting among ``n`` rows, as :class:`ScoreViews`."""

    args_t: Tensor  # (n,)
    rec_t: Tensor  # (n,)
    rec: np.ndarray
    embeddings_t: Tensor  # (n, D), the store's rows
    norms_t: Tensor  # (n, 1)
    norms: np.ndarray
    unit_rows: np.ndarray  # (n, D) the rows normalised
    unit_rows_t: Tensor  # (D, n), transposed
    similarity_t: Tensor  # (1, n)
    similarity: np.ndarray


class RetrievalHost:
    """The single-decision path of :class:`gae.RetrievalMemory`: NumPy views of its store's
    buffers and scorer (kept between calls, rebuilt when a tensor is replaced), scratch tensors
    shaped as the checked path's intermediates, and the compiled entry points of the kernels."""

    def __init__(self) -> None:
        self.held: tuple[Tensor, ...] = ()
        self.pointers: tuple[int, ...] = ()
        self.entries: dict[Any, Any] = {}
        self.query_t = torch.zeros(1, 0, dtype=torch.float32)

    def get(self, memory: Any) -> RetrievalHost | None:
        """Itself while the memory's tensors are the ones it viewed, at the same addresses; None
        when one is not a contiguous CPU tensor of the dtype the kernels are compiled for (the
        checked path runs)."""
        store = memory._modules["store"]  # the module's dicts directly: getattr costs a microsecond
        scorer = store._modules["scorer"]
        held = (memory._buffers["num_decisions"], *scorer._parameters.values(), *scorer._buffers.values(),
                *store._buffers.values())
        if (len(held) == len(self.held) and all(map(operator.is_, held, self.held))
                and tuple(map(Tensor.data_ptr, held)) == self.pointers):
            return self  # (the addresses too: the store's share_memory() moves its data, keeping the tensors)
        dtypes = {"embeddings": torch.float32, **COLUMNS}
        if (any(t.device.type != "cpu" or not t.is_contiguous() for t in held)
                or any(store._buffers[name].dtype != dtype for name, dtype in dtypes.items())
                or scorer.weights.dtype != torch.float32 or scorer.tau.dtype != torch.float32):
            return None
        self.held, self.pointers = held, tuple(map(Tensor.data_ptr, held))
        with torch.inference_mode(False):  # scratch written in place later, in or out of inference mode
            self.bind(memory, store)
        return self

    def bind(self, memory: Any, store: Any) -> None:
        """Views of the memory's tensors, and scratch space for as many rows as the store holds."""
        def view(name: str) -> np.ndarray:
            return store._buffers[name].detach().numpy()

        self.embeddings_t = store._buffers["embeddings"]
        self.embeddings = view("embeddings")
        rows, dim = self.embeddings.shape
        self.float32_columns = (view("importance"), view("confidence"))
        self.float64_columns = (view("created_at"), view("valid_from"), view("valid_until"))
        self.int64_columns = (view("ids"), view("scope"), view("memory_type"), view("inserted"))
        self.size, self.next_id, self.version = (view(name).reshape(1)
                                                 for name in ("size", "next_id", "version_counter"))
        self.counters = (self.size, self.next_id, self.version)
        self.num_decisions = memory._buffers["num_decisions"].detach().numpy().reshape(1)
        self.weights, self.tau = store.scorer.weights.detach().numpy(), store.scorer.tau.detach().numpy().reshape(1)
        if self.query_t.shape != (1, dim):  # kept across a growth: learn has the query in it by then
            self.row = np.zeros(dim)
            self.query_t, self.norm_t, self.unit_t = (torch.zeros(1, dim, dtype=torch.float32),
                                                      torch.zeros(1, 1, dtype=torch.float32),
                                                      torch.zeros(1, dim, dtype=torch.float32))
            self.query, self.norm, self.unit = self.query_t.numpy(), self.norm_t.numpy(), self.unit_t.numpy()
        self.scratch = {name: torch.zeros(rows, dtype=torch.float32)
                        for name in ("args", "rec", "bias", "block", "norms", "similarity")}
        self.args = self.scratch["args"].numpy()
        self.unit_rows_t = torch.zeros(rows, dim, dtype=torch.float32)
        self.views: dict[tuple, Any] = {}

    def score_views(self, n: int) -> ScoreViews:
        views = self.views.get(("score", n))
        return views if views is not None else self.make_views("score", n)

    def evict_views(self, n: int) -> EvictViews:
        views = self.views.get(("evict", n))
        return views if views is not None else self.make_views("evict", n)

    def vote_space(self, k: int, n_actions: int) -> tuple:
        """The top-``k`` rows, scores, ids and labels, and the (1, A) votes and (1, 1) total tensors."""
        views = self.views.get(("vote", k, n_actions))
        return views if views is not None else self.make_views("vote", k, n_actions)

    @torch.inference_mode(False)  # written in place later, in or out of inference mode
    def make_views(self, kind: str, n: int, n_actions: int = 0) -> Any:
        """The views over the first ``n`` rows that scoring or eviction hand to torch and the
        kernels, shaped and strided as the checked path's tensors; or the vote's space for ``k = n``."""
        s = self.scratch
        if kind == "score":
            rec, bias, block = s["rec"][:n], s["bias"][:n].unsqueeze(0), s["block"][:n].unsqueeze(0)
            self.views[kind, n] = ScoreViews(s["args"][:n], rec, rec.numpy(), bias, bias.numpy(), block,
                                             block.numpy(), self.embeddings_t[:n].T)
        elif kind == "evict":
            rec, norms, unit_rows = s["rec"][:n], s["norms"][:n].unsqueeze(1), self.unit_rows_t[:n]
            similarity = s["similarity"][:n].unsqueeze(0)
            self.views[kind, n] = EvictViews(s["args"][:n], rec, rec.numpy(), self.embeddings_t[:n], norms,
                                             norms.numpy(), unit_rows.numpy(), unit_rows.T, similarity,
                                             similarity.numpy())
        else:
            votes, total = torch.zeros(1, n_actions, dtype=torch.float32), torch.zeros(1, 1, dtype=torch.float32)
            self.views[kind, n, n_actions] = (np.zeros(n, np.int64), np.zeros(n, np.float32), np.zeros(n, np.int64),
                                              np.zeros(n, np.int64), votes, votes.numpy(), total, total.numpy())
            return self.views[kind, n, n_actions]
        return self.views[kind, n]

    def call(self, kernel: Any, *args: Any) -> Any:
        """``kernel(*args)`` through its entry point, resolved on the first call (``entry_point``:
        every later call passes the same types, which is why the host casts what it reads)."""
        entry = self.entries.get(kernel)
        if entry is None:
            entry = self.entries[kernel] = entry_point(kernel, *args)
        return entry(*args)

    def score(self, memory: Any, factors: np.ndarray, category: int) -> tuple[int, float] | None:
        """``RetrievalMemory._vote`` of one decision (``factors``: K real numbers, ``category`` its
        index): ``(action, confidence)``, action -1 when it abstains; None when the checked path
        must answer (a refused value, a NaN score, an unknown label). Changes nothing."""
        n, k = int(self.size[0]), int(memory.k)
        now = float(self.num_decisions[0]) * float(memory.seconds_per_decision)
        self.row[:] = factors
        if (not math.isfinite(now) or n > _CHUNK
                or self.call(prepare, self.row, FLOAT32_MAX, float(memory.center), self.query, now,
                             self.float64_columns[0], self.tau, self.args, n)):
            return None
        if n < k:  # fewer memories than k: it abstains
            return -1, 0.0
        args_t, rec_t, rec, bias_t, bias, block_t, block, embeddings_t = self.score_views(n)
        torch.linalg.vector_norm(self.query_t, 2.0, [-1], True, out=self.norm_t)  # as nnf.normalize
        torch.exp(args_t, out=rec_t)
        self.call(retrieval_terms, self.query, self.norm, self.weights, rec, self.float32_columns[0],
                  self.int64_columns[1], self.float64_columns[1], self.float64_columns[2], now, bool(memory.scoped),
                  category, self.unit, bias)
        torch.addmm(bias_t, self.unit_t, embeddings_t, out=block_t)
        rows, scores, found, labels, votes_t, votes, total_t, total = self.vote_space(k, len(memory.action_names))
        status = self.call(top_k_rows, block, k, self.int64_columns[0], rows, scores, found)
        if status == NOT_A_NUMBER:
            return None
        if status == TIED:  # which of the tied scores make the k is torch.topk's choice: ask it
            values, index = torch.topk(block_t, k, dim=1)
            scores[:], rows[:] = values[0].numpy(), index[0].numpy()
            status = INCOMPLETE if not np.isfinite(scores).all() else 0
            found[:] = self.int64_columns[0][rows]
        if status == INCOMPLETE:  # fewer than k memories in reach: it abstains
            return -1, 0.0
        get = memory.labels.get
        labels[:] = [get(i, 0) for i in found.tolist()]
        status = self.call(scatter_votes, scores, labels, votes, total)
        if status == BAD_LABEL:
            return None
        if status == SUMMED_BY_TORCH:
            torch.sum(votes_t, 1, keepdim=True, out=total_t)
        return self.call(best_share, votes, total)

    def shares(self, memory: Any) -> list[float]:
        """After :meth:`score` answered an action: every action's share of the votes, ``_vote``'s
        ``votes / total.clamp_min(1e-30)`` in float32 (the action's own is its confidence, exactly)."""
        *_, votes, _, total = self.vote_space(int(memory.k), len(memory.action_names))
        return (votes[0] / max(total[0, 0], TOTAL_FLOOR)).tolist()

    def learn(self, memory: Any, factors: np.ndarray, category: int, action: int, skip: bool) -> bool:
        """``RetrievalMemory._prequential``'s learning of one decision, storing it (unless it is
        skipped) as ``EpisodicMemory.add`` would with ``query`` = the row and ``now`` = its time:
        the same rows, eviction, ids, version and audit records. False, with nothing changed, when
        the checked path must do it (a refused value, a store to write through to, another eviction)."""
        store = memory._modules["store"]
        n, capacity = int(self.size[0]), int(store.capacity)
        now = float(self.num_decisions[0]) * float(memory.seconds_per_decision)
        self.row[:] = factors
        if (store.store is not None or store.eviction != "lowest_score" or n > capacity or not math.isfinite(now)
                or self.call(prepare, self.row, LEARN_LIMIT, float(memory.center), self.query, now,
                             self.float64_columns[0], self.tau, self.args, 0)):
            return False
        if skip and memory.respect_skip:
            self.num_decisions[0] += 1
            return True
        torch.linalg.vector_norm(self.query_t, 2.0, [-1], True, out=self.norm_t)
        if n + 1 > self.embeddings.shape[0]:
            store._reserve(n + 1)
            self.get(memory)  # the columns grew into new tensors: view those
        new_id = self.call(append_row, self.query, self.norm, self.unit, now, category if memory.scoped else 0,
                           self.embeddings, self.float32_columns, self.float64_columns, self.int64_columns,
                           self.counters, capacity, self.tau, self.args)
        store.source_ids.append(())
        store.contents.append(None)  # row-aligned with the columns, as EpisodicMemory.add keeps them
        store._log("add", now, (new_id,), "", int(self.version[0]))
        if n + 1 > capacity:
            views = self.evict_views(n + 1)
            torch.linalg.vector_norm(views.embeddings_t, 2.0, [-1], True, out=views.norms_t)  # as nnf.normalize
            torch.exp(views.args_t, out=views.rec_t)
            self.call(normalize_rows, self.embeddings, views.norms, views.unit_rows)
            torch.mm(self.unit_t, views.unit_rows_t, out=views.similarity_t)
            row, evicted = self.call(evict_lowest, self.weights, views.similarity, views.rec, self.embeddings,
                                     self.float32_columns, self.float64_columns, self.int64_columns, self.counters)
            del store.source_ids[row]
            del store.contents[row]
            store._log("evict", now, (evicted,), store._eviction_reason(), int(self.version[0]))
        memory._label(new_id, action)
        self.num_decisions[0] += 1
        return True
