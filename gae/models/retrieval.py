"""RetrievalMemory: a decision memory that retrieves with the recency-weighted score and votes."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gae import validation as check
from gae.episodic import EpisodicMemory
from gae.episodic.scorer import RetrievalScorer
from gae.models.base import INCORRECT, DecisionMemory
from gae.models.retrieval_engine import RetrievalHost
from gae.moved import refuse_serving
from gae.types import Assessment, LearnEvents, MemoryOutput, Retrieved, StreamStep
from gae.validation import Names


class RetrievalMemory(DecisionMemory):
    r"""Decisions stored in an :class:`~gae.EpisodicMemory`, answered by the top-``k`` vote.

    Each verified decision is stored with its factor vector, centred on ``center`` (so that
    cosine similarity separates factor vectors in [0, 1]), as the embedding, its action as the
    label and its category as the scope. A decision is scored by retrieving the ``k`` memories
    with the highest ``w_sim cos + w_rec exp(-age / tau) + w_imp importance`` (restricted to
    its category when ``scoped``); each votes for its action with its score, and the memory
    recommends the action with the largest total (confidence = its share). With fewer than
    ``k`` memories in reach it abstains. Recency lets it forget a world that has changed.

    The clock is the decision count: decision ``t`` happens at ``t * seconds_per_decision``.

    On a CPU module ``score_one`` and ``learn_one`` take a compiled single-decision path
    (:mod:`gae.models.retrieval_engine`) that works in place on the store's buffers and
    answers and stores exactly what :meth:`prequential_` on a batch of one does, to the last bit.

    Thread safety: one memory may be shared by threads. Every public call (``score_one``,
    ``learn_one``, ``prequential_``, ``learn_``, ``forward``, ``neighbours``,
    ``neighbours_and_output``, ``delete``, ``add_actions_``, ``add_categories_``, ``state_dict``,
    ``load_state_dict``, ``parameter_inventory``) holds the memory's lock (a
    :class:`threading.RLock`, as every gae decision memory) from its checks to its last write.
    Its :attr:`store` holds the same lock (a store assigned later too), so the store's own calls
    (``memory.store.retrieve``, ...) take turns with the memory's. Decisions are learned one call
    after another, in the order the lock was taken (a batch's decisions stay together, in order);
    a score sees the store before or after each learning call, never half of one; the labels and
    the store's rows, ids, version and audit log stay consistent with each other. ``state_dict()``
    and ``copy.deepcopy`` are of one state, with a lock of its own (shared with its store's
    copy). Not covered: pickling while other threads learn, writing the buffers directly, or
    moving the memory (``to``) while other threads call it.

    Args:
        factors, actions: counts or names, keywords only (``RetrievalMemory(factors=8, actions=4)``):
            a positional call raises a TypeError, as :class:`~gae.KNNMemory`'s.
        k: memories that vote. Default: 5.
        capacity: memories kept (eviction: the lowest score against the decision being stored,
            the original rule). Default: 400.
        categories: counts or names; None ignores categories. Default: None.
        scoped: only memories of the decision's category vote (needs categories). Default: False.
        scorer: the retrieval score. Default: :class:`~gae.RetrievalScorer` (0.60/0.25/0.15, tau 15 s).
        seconds_per_decision: the simulated time between decisions. Default: 1.
        center: subtracted from the factors to make the embedding. Default: 0.5.
        respect_skip: do not store uncertain outcomes. Default: True.
        grow: ``learn_one`` adds an action or category name it has not met (``add_actions_``). Default: False.

    Examples::

        >>> memory = RetrievalMemory(factors=2, actions=["approve", "reject"], k=1)
        >>> _ = memory.learn_one([0.9, 0.1], "approve")
        >>> memory.score_one([0.8, 0.2])[0]
        'approve'
    """

    num_decisions: Tensor

    @check.names_by_keyword
    def __init__(self, *, factors: Names, actions: Names, k: int = 5, capacity: int = 400,
                 categories: Names | None = None, scoped: bool = False, scorer: RetrievalScorer | None = None,
                 seconds_per_decision: float = 1.0, center: float = 0.5, respect_skip: bool = True,
                 grow: bool = False, **serving: Any) -> None:
        refuse_serving(type(self).__name__, serving)
        if serving:
            raise TypeError(f"RetrievalMemory() got unexpected keyword argument(s) {sorted(serving)}")
        super().__init__()
        self._init_neighbours(factors, actions, categories, k, capacity, scoped)
        self.respect_skip = bool(respect_skip)
        self.grow = bool(grow)
        self.seconds_per_decision = check.check_real("seconds_per_decision", seconds_per_decision, low=0.0,
                                                     low_open=True)
        self.center = check.check_real("center", center, low=-float("inf"))
        self.capacity = capacity
        self.store = EpisodicMemory(self.n_factors, capacity, scorer=scorer, eviction="lowest_score")
        self.labels: dict[int, int] = {}  # action of each stored memory id (pruned as the store evicts)
        self.register_buffer("num_decisions", torch.zeros((), dtype=torch.int64))
        self._host = RetrievalHost()  # the single-decision path's views of the store (a copy builds its own)

    @property
    def version(self) -> int:
        """The store's :attr:`~gae.EpisodicMemory.version`: +1 for every add, eviction and delete."""
        return self.store.version

    def _now(self) -> float:
        return float(self.num_decisions) * self.seconds_per_decision

    def _vote(self, x: Tensor, category: Tensor, now: float) -> tuple[MemoryOutput, Retrieved]:
        n, n_actions = x.shape[0], len(self.action_names)
        scopes: list | None = None
        if self.scoped:  # one shared list when every query has the same category: a cheaper mask
            values = category.tolist()
            scopes = [values[0]] if len(set(values)) == 1 else [[c] for c in values]
        queries = (x - self.center).to(self.store.embeddings.dtype)
        found = self.store.retrieve(queries, now=now, k=self.k, scopes=scopes) if len(self.store) else None
        device = self.store.embeddings.device
        probs = torch.zeros(n, n_actions, device=device)
        action = torch.full((n,), -1, dtype=torch.int64, device=device)
        confidence = torch.zeros(n, device=device)
        nothing = torch.zeros(n, self.k, dtype=torch.float64, device=device)
        retrieved = Retrieved(torch.full((n, self.k), -1, dtype=torch.int64, device=device), nothing, nothing,
                              nothing, nothing, torch.full((n,), self.store.version, dtype=torch.int64, device=device))
        if found is not None:
            retrieved = Retrieved(found.ids, found.scores.double(), found.similarity.double(), found.recency.double(),
                                  found.importance.double(), retrieved.version)
            complete = (found.ids >= 0).all(dim=1)  # fewer than k memories in reach: abstain
            weights = found.scores.clamp_min(1e-8).masked_fill(found.ids < 0, 0.0)
            labels = torch.tensor([[self.labels.get(i, 0) for i in row] for row in found.ids.tolist()],
                                  dtype=torch.int64, device=device)
            votes = torch.zeros(n, n_actions, dtype=weights.dtype, device=device).scatter_add_(1, labels, weights)
            share = (votes / votes.sum(1, keepdim=True).clamp_min(1e-30)).float()
            best = share.argmax(1)
            probs = torch.where(complete.unsqueeze(1), share, probs)
            action = torch.where(complete, best, action)
            confidence = torch.where(complete, share.gather(1, best.unsqueeze(1)).squeeze(1), confidence)
        return MemoryOutput(probs.log(), probs, action, confidence), retrieved

    def forward(self, x: Tensor, category: Tensor) -> MemoryOutput:
        """Score a batch against the current store at the current time (no side effects)."""
        return self.neighbours_and_output(x, category)[0]

    @torch.no_grad()
    def neighbours(self, x: Tensor, category: Tensor) -> Retrieved:
        """The memories each decision's vote would come from now, with their scores and the three
        score terms (no side effects): what :meth:`prequential_` reports in ``StreamStep.retrieved``."""
        return self.neighbours_and_output(x, category)[1]

    @torch.no_grad()
    def neighbours_and_output(self, x: Tensor, category: Tensor) -> tuple[MemoryOutput, Retrieved]:
        """:meth:`forward` and :meth:`neighbours` from one retrieval."""
        with self._lock:
            x, category = self._check_query(x, category)
            return self._vote(x.detach(), category, self._now())

    @torch.no_grad()
    def delete(self, ids: Sequence[int] | Tensor | np.ndarray, reason: str = "deleted") -> int:
        """Delete stored memories by id (the ids ``neighbours`` and ``StreamStep.retrieved`` report:
        a list, or an integer tensor on any device or numpy array), at the current time; unknown ids
        are an error and change nothing. Returns how many went."""
        with self._lock:
            removed = self.store.delete(ids, now=self._now(), reason=reason)
            self._edited()
            alive = set(self.store._column("ids").tolist())
            self.labels = {i: a for i, a in self.labels.items() if i in alive}
            return removed

    def _prequential(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                     skip: Tensor, source_ids: Tensor | None = None) -> StreamStep:
        x = x.detach()
        outputs = []
        n, device = x.shape[0], x.device
        applied = torch.zeros(n, dtype=torch.bool, device=device)
        skipped = torch.zeros(n, dtype=torch.bool, device=device)
        skip_flags, categories, actions = skip.tolist(), category.tolist(), action.tolist()
        retrieved = []
        for b in range(n):  # strictly in stream order: each decision sees only the ones before it
            now = self._now()
            output, found = self._vote(x[b:b + 1], category[b:b + 1], now)
            outputs.append(output)
            retrieved.append(found)
            if self.respect_skip and skip_flags[b]:
                skipped[b] = True
            else:
                self._store(x[b:b + 1], categories[b], actions[b], now)
                applied[b] = True
            self.num_decisions += 1
        output = MemoryOutput(*(torch.cat(parts) for parts in zip(*outputs, strict=True)))
        never = torch.zeros(n, dtype=torch.bool, device=device)
        events = LearnEvents(applied, never, skipped, never.clone(), applied.float(), torch.zeros(n, device=device),
                             never.clone(), torch.full((n,), -1, dtype=torch.int64, device=device), never.clone(),
                             never.clone())
        return StreamStep(output, events, None,
                          retrieved=Retrieved(*(torch.cat(parts) for parts in zip(*retrieved, strict=True))))

    def _store(self, x: Tensor, category: int, action: int, now: float) -> None:
        embedding = (x - self.center).to(self.store.embeddings.dtype)
        ids = self.store.add(embedding, 1.0, created_at=now, scope=category if self.scoped else 0,
                             query=embedding[0], now=now)
        self._label(int(ids[0]), action)

    def _label(self, memory_id: int, action: int) -> None:
        """Remember the action of a stored memory (and forget those of evicted ones when they pile up)."""
        self.labels[memory_id] = action
        if len(self.labels) > 2 * self.store.capacity:
            alive = set(self.store._column("ids").tolist())
            self.labels = {i: a for i, a in self.labels.items() if i in alive}

    # -- one decision at a time ------------------------------------------------------------
    def score_one(self, factors, category: str | int = "general") -> tuple[str | None, float]:
        """Score one decision: ``(action name or None when abstaining, confidence)``. On a CPU
        module this runs the compiled single-decision path on the store's own buffers
        (:mod:`gae.models.retrieval_engine`), the checked path's answer to the last bit;
        anything unusual takes the checked path."""
        lock = self._lock  # acquire() and release() cost half a `with` block, on every call
        lock.acquire()  # the host's scratch space is the memory's: one call at a time
        try:
            one = self._one(factors, category, 0, False)
            host = None if one is None else self._host.get(self)
            done = None if host is None or one is None else host.score(self, one[0], one[1])
            if done is None:
                return super().score_one(factors, category)
            return self._action_name(done[0]), done[1]
        finally:
            lock.release()

    def assess_one(self, factors, category: str | int = "general", inspect: bool = False) -> Assessment:
        """One decision's :class:`~gae.types.Assessment` (see :meth:`DecisionMemory.assess_one`): on
        a CPU module ``score_one``'s compiled path, whose votes give every action's share. A
        retrieval memory keeps nothing to inspect: ``state`` is None."""
        lock = self._lock
        lock.acquire()
        try:
            row = self._learnable_row(factors)
            one = None if row is None else self._one(row, category, 0, False)
            host = None if one is None else self._host.get(self)
            done = None if host is None or one is None else host.score(self, one[0], one[1])
            if row is None or host is None or done is None:
                return super().assess_one(factors, category, inspect)
            action, confidence = done
            probs = [0.0] * len(self.action_names) if action < 0 else host.shares(self)
            return Assessment(int(action), float(confidence), probs, row)
        finally:
            lock.release()

    def learn_one(self, factors, action: str | int, category: str | int = "general", confirmed: bool | None = True,
                  outcome: str | None = None, *, source_id: int | None = None) -> dict[str, Any]:
        """Learn one decision (see :meth:`DecisionMemory.learn_one`). On a CPU module it is stored
        in place as :meth:`prequential_` on a batch of one would store it (same rows, ids, evictions,
        version and audit); anything unusual takes that checked path. It keeps no log of sources:
        ``source_id`` is checked and not kept."""
        with self._lock:
            if ((outcome is None or outcome.__class__ is str) and (confirmed is None or confirmed.__class__ is bool)
                    and (source_id is None or (source_id.__class__ is int and 0 <= source_id < 2**63))):
                skip = outcome == INCORRECT
                one = self._one(factors, category, action, True)
                host = None if one is None else self._host.get(self)
                if host is not None and one is not None and host.learn(self, one[0], one[1], one[2], skip):
                    return self._stored(skip and self.respect_skip)
            return super().learn_one(factors, action, category, confirmed, outcome, source_id=source_id)

    def _one(self, factors: Any, category: Any, action: Any, learn: bool) -> tuple[np.ndarray, int, int] | None:
        """``(factors as an array of K real numbers, category index, action index)`` of one decision
        for the compiled path, or None when it must take the checked path (which validates and raises)."""
        return None if self.backend != "compiled" else self._decision(factors, category, action, learn)

    def parameter_inventory(self) -> dict[str, int]:
        """Every number held, by buffer name (the store grows to ``capacity``), and the ``total``."""
        with self._lock:
            inventory = super().parameter_inventory()
            inventory["labels"] = 2 * len(self.labels)
        inventory["total"] += inventory["labels"]
        return inventory

    def extra_repr(self) -> str:
        return (f"factors={self.n_factors}, actions={len(self.action_names)}, k={self.k}, "
                f"capacity={self.store.capacity}, scoped={self.scoped}, respect_skip={self.respect_skip}")

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "store" and isinstance(value, EpisodicMemory):  # one lock for both: the single-decision
            value.__dict__["_lock"] = self._lock  # path writes the store's buffers under the memory's lock

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # a lock of its own (DecisionMemory), shared with its store again
        self.store.__dict__["_lock"] = self._lock

    def get_extra_state(self) -> dict[str, Any]:
        return {**self._names_state(), "label_ids": list(self.labels), "labels": list(self.labels.values())}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.labels = dict(zip(state["label_ids"], state["labels"], strict=True))

    # -- what a Decider builds on -----------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """What a ledger records: the vote, the store's size and scoring, the clock and the centring."""
        scorer = self.store.scorer
        return {"k": self.k, "capacity": self.capacity, "scoped": self.scoped, "respect_skip": self.respect_skip,
                "seconds_per_decision": self.seconds_per_decision, "center": self.center,
                "weights": [float(w) for w in scorer.weights.tolist()], "tau": float(scorer.tau),
                "learnable": isinstance(scorer.weights, torch.nn.Parameter)}

    def empty_like(self, categories: Sequence[str] | None = None,
                   actions: Sequence[str] | None = None) -> RetrievalMemory:
        blank = RetrievalMemory(factors=self.factor_names, actions=self.action_names if actions is None else actions,
                                k=self.k, capacity=self.capacity,
                                categories=self.category_names if categories is None else categories,
                                scoped=self.scoped, scorer=copy.deepcopy(self.store.scorer),
                                seconds_per_decision=self.seconds_per_decision, center=self.center,
                                respect_skip=self.respect_skip, grow=self.grow)
        blank.backend = self.backend
        return blank

    def explain(self, factors: Any, category: Any = "general") -> Retrieved:
        """The stored memories the vote comes from, with their scores and the three score terms, for
        a batch (``factors`` (B, K), ``category`` a (B,) tensor) or one decision: :meth:`neighbours`."""
        with self._lock:
            if isinstance(factors, Tensor) and factors.dim() == 2:
                return self.neighbours(factors, category)
            x = self._one_factor_row(factors)
            return self.neighbours(x, torch.tensor([self._category_index(category)], device=x.device))
