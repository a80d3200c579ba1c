"""KNNMemory: the retrieval baseline, a ring buffer of traces voted by their k nearest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gae import validation as check
from gae.models.base import INCORRECT, DecisionMemory
from gae.models.knn_engine import KNNHost, KNNState, knn_neighbours, knn_prequential, knn_results, knn_vote
from gae.moved import refuse_serving
from gae.types import Assessment, LearnEvents, MemoryOutput, Retrieved, StreamStep
from gae.validation import Names

_QUERY_CHUNK = 4096  # queries scored at once in forward: bounds the (chunk, N) distance matrix


class KNNMemory(DecisionMemory):
    r"""The original design's retrieval memory ("AgenticMemory"), on tensors.

    Every learned decision is appended to a ring buffer of ``capacity`` traces (FIFO
    eviction, one store shared by all categories). Scoring takes the ``k`` stored traces
    nearest in Euclidean distance (ties: older first), lets each vote for its action with
    weight :math:`1 / (d + 10^{-8})`, and recommends the action with the largest total
    (ties: the action met first in neighbour order), with confidence = its share of the
    votes. With fewer than ``k`` traces it abstains. Cost: O(N K) per decision.

    Like the original it learns every decision whatever its outcome; ``respect_skip=True``
    drops the uncertain ones. ``scoped=True`` lets a decision see only traces of its own
    category (the store and its FIFO order stay shared). :meth:`keep_newest_` cuts the window
    to the newest traces (what a drift detector does on a change).

    Thread safety: one memory may be shared by threads. Every public call (``score_one``,
    ``learn_one``, ``prequential_``, ``learn_``, ``forward``, ``neighbours``, ``keep_newest_``,
    ``add_actions_``, ``add_categories_``, ``state_dict``, ``load_state_dict``) holds the memory's
    lock (a :class:`threading.RLock`, as every gae decision memory) from its checks to its last
    write, so decisions are learned one call after another, in the order the lock was taken (a
    batch's decisions stay together, in order), and a score sees the ring before or after each
    learning call, never half of one (``forward`` and ``neighbours`` copy the ring under the lock
    and score the copy). ``state_dict()`` and ``copy.deepcopy`` are of one state, with a lock
    of its own. Not covered: pickling while other threads learn, writing the buffers directly,
    or moving the memory (``to``) while other threads call it.

    Args:
        factors: number of factors, or their names. A keyword, as ``actions``:
            ``KNNMemory(factors=8, actions=["approve", "reject"])``; a positional call raises a
            TypeError, since :class:`~gae.JudgmentMemory` takes ``(categories, actions, factors)``.
        actions: number of actions, or their names.
        k: neighbours that vote. Default: 5.
        capacity: traces kept. Default: 200 (the original's ``cap``).
        categories: number of categories, or their names; None ignores categories. Default: None.
        scoped: restrict neighbours to the decision's category (needs ``categories``). Default: False.
        respect_skip: do not store decisions marked ``skip``. Default: False.
        grow: ``learn_one`` adds an action or category name it has not met (``add_actions_``). Default: False.

    Attributes:
        store_factors: buffer (capacity, K) float32.
        store_actions, store_categories, store_steps: buffers (capacity,) int64.
        ring: buffer (2,) int64, ``[size, head]``: traces stored and the next slot to write.
        num_decisions: buffer () int64, decisions seen.

    Examples::

        >>> memory = KNNMemory(factors=2, actions=["approve", "reject"], k=1)
        >>> memory.score_one([0.9, 0.1])
        (None, 0.0)
        >>> _ = memory.learn_one([0.9, 0.1], "approve")
        >>> memory.score_one([0.8, 0.2])
        ('approve', 1.0)
    """

    _version = 1
    store_factors: Tensor
    store_actions: Tensor
    store_categories: Tensor
    store_steps: Tensor
    ring: Tensor
    num_decisions: Tensor

    @check.names_by_keyword
    def __init__(self, *, factors: Names, actions: Names, k: int = 5, capacity: int = 200,
                 categories: Names | None = None, scoped: bool = False, respect_skip: bool = False,
                 grow: bool = False, **serving: Any) -> None:
        refuse_serving(type(self).__name__, serving)
        if serving:
            raise TypeError(f"KNNMemory() got unexpected keyword argument(s) {sorted(serving)}")
        super().__init__()
        self._init_neighbours(factors, actions, categories, k, capacity, scoped)
        self.capacity = capacity
        self.respect_skip = bool(respect_skip)
        self.grow = bool(grow)
        self.register_buffer("store_factors", torch.zeros(capacity, self.n_factors))
        self.register_buffer("store_actions", torch.zeros(capacity, dtype=torch.int64))
        self.register_buffer("store_categories", torch.zeros(capacity, dtype=torch.int64))
        self.register_buffer("store_steps", torch.zeros(capacity, dtype=torch.int64))
        self.register_buffer("ring", torch.zeros(2, dtype=torch.int64))
        self.register_buffer("num_decisions", torch.zeros((), dtype=torch.int64))
        self._host = KNNHost()  # the single-decision path's views of the ring

    def settings(self) -> dict[str, Any]:
        """``k``, ``capacity``, ``scoped`` and ``respect_skip``: what a ledger records."""
        return {"k": self.k, "capacity": self.capacity, "scoped": self.scoped, "respect_skip": self.respect_skip}

    def empty_like(self, categories: Sequence[str] | None = None, actions: Sequence[str] | None = None) -> KNNMemory:
        blank = KNNMemory(factors=self.factor_names, actions=self.action_names if actions is None else actions,
                          k=self.k, capacity=self.capacity,
                          categories=self.category_names if categories is None else categories, scoped=self.scoped,
                          respect_skip=self.respect_skip, grow=self.grow)
        blank.backend = self.backend
        return blank

    def explain(self, factors: Any, category: Any = "general") -> Retrieved:
        """The stored traces the memory votes with for a batch (``factors`` (B, K) with ``category``
        a (B,) tensor of indices) or one decision (its K factors, ``category`` a name or index):
        :meth:`neighbours`."""
        with self._lock:
            if isinstance(factors, Tensor) and factors.dim() == 2:
                return self.neighbours(factors, category)
            x = self._one_factor_row(factors)
            return self.neighbours(x, torch.tensor([self._category_index(category)], device=x.device))

    def __len__(self) -> int:
        return int(self.ring[0])

    @property
    def version(self) -> int:
        """The update counter: decisions seen (a window cut, :meth:`keep_newest_`, is not counted)."""
        return int(self.num_decisions)

    def _age_order(self) -> Tensor:
        """Slots of the stored traces, oldest first."""
        size, head = int(self.ring[0]), int(self.ring[1])
        return (head - size + torch.arange(size, device=self.ring.device)) % self.capacity

    @torch.no_grad()
    def keep_newest_(self, n: int) -> int:
        r"""Cut the window: keep only the ``n`` newest traces, forget the older ones.

        The forgotten traces' slots are zeroed. The kept traces stay in their slots and the ring
        keeps its head (``ring = [n, head]``): they are still visited oldest first and the next
        decision is still written at ``head``, so scoring and learning go on exactly as in a
        ring that had learned only those traces, in that order (distance ties still go to the
        older trace). The decisions seen (``num_decisions``) do not change. The single-decision
        path reads the ring in place, so it sees the cut at once.

        Args:
            n: traces to keep, an int >= 0; ``n >= len(self)`` changes nothing.

        Returns:
            The number of traces forgotten.

        Raises:
            TypeError / ValueError: ``n`` is not an int >= 0; nothing changes.
        """
        with self._lock:
            n = check.check_int("n", n, low=0)
            size = len(self)
            if n >= size:
                return 0
            forgotten = self._age_order()[:size - n]
            for buffer in (self.store_factors, self.store_actions, self.store_categories, self.store_steps):
                buffer.index_fill_(0, forgotten, 0)
            self.ring[0] = n
            self._edited()
            return size - n

    def forward(self, x: Tensor, category: Tensor) -> MemoryOutput:
        """Score a batch against the current store (no side effects), in chunks of queries."""
        with self._lock:
            x, category = self._check_query(x, category)
            x = x.to(self.store_factors.dtype)  # the precision prequential_ scores in, so both paths agree
            order = self._age_order()
            stored, stored_actions = self.store_factors[order], self.store_actions[order]
            stored_categories = self.store_categories[order]
            n_actions = len(self.action_names)
        outputs = []  # on copies of the ring (indexing copies): other threads may learn meanwhile
        for start in range(0, x.shape[0], _QUERY_CHUNK):
            queries, cats = x[start:start + _QUERY_CHUNK], category[start:start + _QUERY_CHUNK]
            allowed = (cats.unsqueeze(1) == stored_categories.unsqueeze(0)) if self.scoped else None
            outputs.append(knn_vote(queries, stored, stored_actions, self.k, n_actions, allowed))
        return MemoryOutput(*(torch.cat(parts) for parts in zip(*outputs, strict=True)))

    @torch.no_grad()
    def neighbours(self, x: Tensor, category: Tensor) -> Retrieved:
        """The stored traces each decision's vote would come from now (no side effects).

        Returns:
            :class:`~gae.types.Retrieved` with ``ids`` (B, k), the sequence numbers of the
            decisions the ``k`` nearest traces came from (nearest first, ties to the older; -1
            past the traces in reach), and ``scores`` (B, k), their Euclidean distances (``inf``
            where padded): the same ones :meth:`prequential_` reports in ``StreamStep.retrieved``.
        """
        with self._lock:
            x, category = self._check_query(x, category)
            x = x.to(self.store_factors.dtype)
            order = self._age_order()
            stored, stored_categories, stored_steps = (self.store_factors[order], self.store_categories[order],
                                                       self.store_steps[order])
        ids = torch.full((x.shape[0], self.k), -1, dtype=torch.int64, device=x.device)  # on the copies
        scores = torch.full((x.shape[0], self.k), float("inf"), dtype=torch.float64, device=x.device)
        if order.numel():
            allowed = (category.unsqueeze(1) == stored_categories.unsqueeze(0)) if self.scoped else None
            dist, index = knn_neighbours(x, stored, self.k, allowed)
            found = torch.isfinite(dist)
            ids[:, :dist.shape[1]] = torch.where(found, stored_steps[index], -1)
            scores[:, :dist.shape[1]] = dist
        return Retrieved(ids, scores)

    # -- one decision at a time ------------------------------------------------------------
    def score_one(self, factors, category: str | int = "general") -> tuple[str | None, float]:
        """Score one decision: ``(action name or None when abstaining, confidence)``; one
        compiled call on the memory's own ring on a CPU module (see :meth:`learn_one`)."""
        lock = self._lock  # acquire() and release() cost half a `with` block, on every call
        lock.acquire()  # the batch of one it reads is the memory's: read it before another call writes it
        try:
            done = self._one(factors, category, None, False, False)
            if done is None:
                return super().score_one(factors, category)
            return self._action_name(int(done[5][0])), float(done[6][0])
        finally:
            lock.release()

    def assess_one(self, factors, category: str | int = "general", inspect: bool = False) -> Assessment:
        """One decision's :class:`~gae.types.Assessment` (see :meth:`DecisionMemory.assess_one`):
        one compiled call on a CPU module (the batch of one holds every action's probability). A
        k-NN keeps nothing to inspect: ``state`` is None."""
        lock = self._lock
        lock.acquire()
        try:
            row = self._learnable_row(factors)
            done = None if row is None else self._one(row, category, None, False, False)
            if row is None or done is None:
                return super().assess_one(factors, category, inspect)
            return Assessment(int(done[5][0]), float(done[6][0]), done[4][0].tolist(), row)
        finally:
            lock.release()

    def learn_one(self, factors, action: str | int, category: str | int = "general", confirmed: bool | None = True,
                  outcome: str | None = None, *, source_id: int | None = None) -> dict[str, Any]:
        """Learn one decision (see :meth:`DecisionMemory.learn_one`). On a CPU module this is one
        compiled call that scores and stores it in place in the memory's ring, exactly as
        :meth:`prequential_` on a batch of one; anything unusual takes that checked path. A k-NN
        keeps no log: ``source_id`` is checked and not kept."""
        lock = self._lock
        lock.acquire()
        try:
            if ((outcome is None or outcome.__class__ is str) and (confirmed is None or confirmed.__class__ is bool)
                    and (source_id is None or (source_id.__class__ is int and 0 <= source_id < 2**63))):
                done = self._one(factors, category, action, outcome == INCORRECT, True)
                if done is not None:
                    return self._stored(bool(done[8][0]))
            return super().learn_one(factors, action, category, confirmed, outcome, source_id=source_id)
        finally:
            lock.release()

    def _one(self, factors: Any, category: Any, action: Any, skip: bool, learn: bool) -> tuple | None:
        """One decision on the compiled single-decision path: the batch of one it filled, or
        None when it must take the checked path."""
        host = self._host.get(self._buffers, len(self._action_names), self.k)  # (the property costs a call)
        if host is None or (learn and self.backend != "compiled"):  # the reference backend learns in torch
            return None
        decision = self._decision(factors, category, action, learn)
        if decision is None:
            return None
        row, c, a = decision
        limit = check.LEARN_LIMIT if learn else np.inf
        if host.run(row, limit, c, a, skip, learn, self.k, self.scoped, self.respect_skip) != 0:
            return None
        if learn:
            host.num_decisions[()] += 1
        return host.batch

    def _prequential(self, x, category, action, confirmed, skip, source_ids=None) -> StreamStep:
        device = self.store_factors.device
        if x.shape[0] == 1 and device.type == "cpu":  # the single-decision path, in place on the ring
            done = self._one(x[0].numpy(), int(category[0]), int(action[0]), bool(skip[0]), True)
            if done is not None:
                probs, out_action, confidence, applied, skipped, near_ids, near_dist = (
                    torch.from_numpy(array.copy()) for array in done[4:])
                events = LearnEvents.empty(1)
                events.applied.copy_(applied)
                events.skipped.copy_(skipped)
                output, events, retrieved = knn_results(probs, out_action, confidence, events, near_ids, near_dist)
                return StreamStep(output, events, None, retrieved=retrieved)
        buffers = (self.store_factors, self.store_actions, self.store_categories, self.store_steps, self.ring)
        state = KNNState(*(t.detach().to("cpu", copy=True) for t in buffers))
        category, action, skip = (t.to("cpu").contiguous() for t in (category, action, skip))
        x = x.detach().to("cpu", self.store_factors.dtype).contiguous()  # the store's precision, as forward
        output, events, retrieved = knn_prequential(state, x, category, action, skip, int(self.num_decisions),
                                                    self.k, self.scoped, self.respect_skip, len(self.action_names),
                                                    self.backend)
        for target, source in zip(buffers, state, strict=True):
            target.copy_(source)
        self.num_decisions += x.shape[0]
        step = StreamStep(output, events, None, retrieved=retrieved)
        return step if device.type == "cpu" else step.to(device)

    def extra_repr(self) -> str:
        categories = None if self.category_names is None else len(self.category_names)
        return (f"factors={self.n_factors}, actions={len(self.action_names)}, k={self.k}, "
                f"capacity={self.capacity}, categories={categories}, scoped={self.scoped}, "
                f"respect_skip={self.respect_skip}")
