"""Named outputs of the memories.

Every public method returns one of these instead of a bare tuple, so that a harness reads
``out.action`` rather than ``out[2]`` and the fields are documented in one place.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


class MemoryOutput(NamedTuple):
    """What a memory says about a batch of decisions, before it learns from them.

    Attributes:
        logits: (B, A) float. ``-inf`` for an action the memory has no evidence for.
        probs: (B, A) float. Rows sum to 1, or are all zero where the memory abstains
            because it has no evidence at all for the decision's category.
        action: (B,) int64. The recommended action, ``-1`` where the memory abstains.
        confidence: (B,) float. Probability of the recommended action, ``0`` on abstention.
    """

    logits: Tensor
    probs: Tensor
    action: Tensor
    confidence: Tensor


class LearnEvents(NamedTuple):
    """What learning did with each decision of a batch, in stream order.

    Attributes:
        applied: (B,) bool. The state was changed by this decision.
        gated: (B,) bool. The drift gate damped the step (displacement > threshold).
        skipped: (B,) bool. The outcome was uncertain and the decision was not learned.
        initialized: (B,) bool. The decision created its prototype (first touch).
        eta: (B,) float. The step size used; 1 for a first touch, 0 when not applied.
        displacement: (B,) float. Unweighted L2 distance from the prototype before the
            update (with ``learning='lvq'``: the squared distance under its metric); 0 when not
            applied or on a first touch.
        promoted: (B,) bool. After learning this decision, the change test promoted its
            category: each prototype became the mean of its decisions since the change point (or
            its shadow when it had none) (``drift_mode='adaptive'``; always False otherwise).
        prototype: (B,) int64. The prototype slot the decision taught (``prototypes=P``:
            0..P-1; always 0 with one prototype), -1 when not applied or for memories
            without prototypes.
        spawned: (B,) bool. The decision lay farther than ``spawn_threshold`` from every
            prototype of its action and started a new one (``prototypes > 1``; with
            ``learning='lvq'``, only where the memory's recommendation was wrong).
        recycled: (B,) bool. The new prototype took the slot of the one with the fewest
            recent wins, because all were in use.
    """

    applied: Tensor
    gated: Tensor
    skipped: Tensor
    initialized: Tensor
    eta: Tensor
    displacement: Tensor
    promoted: Tensor
    prototype: Tensor
    spawned: Tensor
    recycled: Tensor

    @classmethod
    def empty(cls, n: int) -> LearnEvents:
        """The events of ``n`` decisions before learning: nothing happened (``prototype`` -1)."""
        def flags() -> Tensor:
            return torch.zeros(n, dtype=torch.bool)

        return cls(flags(), flags(), flags(), flags(), torch.zeros(n), torch.zeros(n), flags(),
                   torch.full((n,), -1, dtype=torch.int64), flags(), flags())


class CaseState(NamedTuple):
    """What a memory's state says about one case and its category, beside its answer
    (:meth:`gae.DecisionMemory.inspect_one`): what a :class:`~gae.Decider` refers a decision on.

    Attributes:
        novelty: the squared distance from the case to its category's nearest prototype, each
            criterion in units of the category's running variance (a judgment memory with
            ``learning='lvq'``); ``inf`` where the category has no prototype, ``nan`` where the
            memory keeps no spread.
        support: how many decisions the category's spread rests on (0 without one).
        change: how far the category's change test has gone toward its threshold (1: it fires;
            ``drift_mode='adaptive'``), 0 without one.
        trust: the category's trust in each judge (a judgment memory with judges, rows summing
            to 1; uniform before it learned), None without judges.
    """

    novelty: float
    support: int
    change: float
    trust: tuple[float, ...] | None


class Assessment(NamedTuple):
    """One decision as a memory assesses it (:meth:`gae.DecisionMemory.assess_one`): what a
    :class:`~gae.Decider` answers ``decide`` with.

    Attributes:
        action: the recommended action's index, -1 where the memory abstains.
        confidence: its probability (0 on abstention).
        probs: every action's probability, in index order (all 0 where the memory has no
            opinion in the category).
        row: (K,) float64, the factors as the memory checked them, as ``learn_one`` checks them
            (a copy: what a Decider keeps of a decision until it is verified).
        state: what the memory's state says about the case (:class:`CaseState`), when asked
            for and the memory keeps any of it (``inspects``); else None.
    """

    action: int
    confidence: float
    probs: list[float]
    row: np.ndarray
    state: CaseState | None = None


class Retrieved(NamedTuple):
    """What a retrieval memory's answers were built from: the stored traces that voted.

    Attributes:
        ids: (B, k) int64, nearest or best first, -1 past the traces in reach. For
            :class:`~gae.KNNMemory` the sequence number of the decision each trace came from;
            for :class:`~gae.RetrievalMemory` the :class:`~gae.EpisodicMemory` id.
        scores: (B, k) float64. KNNMemory: the Euclidean distance (``inf`` where padded);
            RetrievalMemory: the retrieval score (``-inf`` where padded).
        similarity, recency, importance: (B, k) float64, the score's three unweighted terms
            (RetrievalMemory; ``None`` for KNNMemory).
        version: (B,) int64, the :class:`~gae.EpisodicMemory` version each answer was
            computed on (RetrievalMemory; ``None`` for KNNMemory).
    """

    ids: Tensor
    scores: Tensor
    similarity: Tensor | None = None
    recency: Tensor | None = None
    importance: Tensor | None = None
    version: Tensor | None = None

    def to(self, device: torch.device | str) -> Retrieved:
        """The same record with every tensor on ``device``."""
        def move(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.to(device)

        return Retrieved(self.ids.to(device), self.scores.to(device), move(self.similarity), move(self.recency),
                         move(self.importance), move(self.version))


class StreamStep(NamedTuple):
    """Result of a prequential (score-before-learn) pass over a batch.

    Attributes:
        output: the pre-learning :class:`MemoryOutput` of every decision.
        events: the :class:`LearnEvents` of the learning that followed each score.
        sq_diff: (B, A, K) float, the per-criterion squared differences between each
            decision and every prototype of its category at scoring time, or ``None`` for
            memories without prototypes (:class:`~gae.KNNMemory`). With several prototypes
            per action (``prototypes=P``), those of each action's nearest scoring prototype.
            In ``drift_mode='adaptive'``, while a category's tracking prototypes lead, they are
            what scored, and these are their differences (what ``attention_loss`` trains on).
            With ``learning='lvq'``, each is in the metric's units: times the category's
            relevance over its running variance at scoring time (what the attention weighs).
        nearest: (B, A) int64, the prototype slot each action scored with (its nearest
            scoring prototype), -1 where the action had none; ``None`` for memories without
            prototypes.
        before: (B, K) float, the row of the prototype each decision taught (see
            ``events.prototype``) as it was before that decision changed it (0 where not
            applied); ``None`` for memories without prototypes.
        retrieved: the :class:`Retrieved` traces behind each answer, for the memories that
            vote with stored traces; ``None`` for :class:`~gae.JudgmentMemory`.
        votes: (B, J, A) float, each judge's probabilities before learning (judge 0: the
            prototypes), for a :class:`~gae.JudgmentMemory` with judges (``output`` is then
            their mixture); ``None`` otherwise.
        own: the prototypes' own pre-learning :class:`MemoryOutput` where ``output`` is the
            judges' mixture (what ``sq_diff`` and ``attention_loss`` belong to); ``None`` otherwise.
    """

    output: MemoryOutput
    events: LearnEvents
    sq_diff: Tensor | None
    nearest: Tensor | None = None
    before: Tensor | None = None
    retrieved: Retrieved | None = None
    votes: Tensor | None = None
    own: MemoryOutput | None = None

    @property
    def prototypes_output(self) -> MemoryOutput:
        """The prototypes' own output: ``own`` where the memory has judges, else ``output``."""
        return self.output if self.own is None else self.own

    def to(self, device: torch.device | str) -> StreamStep:
        """The same step with every tensor on ``device``."""
        def move(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.to(device)

        return StreamStep(MemoryOutput(*(t.to(device) for t in self.output)),
                          LearnEvents(*(t.to(device) for t in self.events)), move(self.sq_diff),
                          nearest=move(self.nearest), before=move(self.before),
                          retrieved=None if self.retrieved is None else self.retrieved.to(device),
                          votes=move(self.votes),
                          own=None if self.own is None else MemoryOutput(*(t.to(device) for t in self.own)))


class GateLog(NamedTuple):
    """Every drift-gate event, in stream order. All fields are 1-D tensors of one length.

    Attributes:
        step: int64, the sequence number of the decision in the memory's stream.
        category: int64 category index.
        action: int64 action index.
        displacement: float, distance from the prototype that triggered the gate.
        eta: float, the damped step size that was applied (while a prototype follows a change in
            ``drift_mode='adaptive'``: the halved weight over the running mean's total weight).
    """

    step: Tensor
    category: Tensor
    action: Tensor
    displacement: Tensor
    eta: Tensor


class PromotionLog(NamedTuple):
    """Every promotion of the change test (``drift_mode='adaptive'``), in stream order.

    All fields are 1-D tensors of one length; the evidence is the run of the category's
    change test that crossed the threshold (the decisions since its statistic last stood at 0).

    Attributes:
        step: int64, the sequence number of the decision after which the promotion happened.
        category: int64 category index.
        statistic: float, the CUSUM statistic that crossed ``promotion_threshold``.
        shadow_right: int64, verified decisions that lay closer to the shadow of their action
            than to its prototype.
        main_right: int64, the others of the run.
        shift: float, mean L2 distance the category's prototypes moved when promoted.
    """

    step: Tensor
    category: Tensor
    statistic: Tensor
    shadow_right: Tensor
    main_right: Tensor
    shift: Tensor


class RecycleLog(NamedTuple):
    """Every recycled prototype (``prototypes=P > 1``), in stream order. All fields are 1-D
    tensors of one length.

    A verified decision that lies farther than ``spawn_threshold`` from every prototype of its
    action, when all P slots of the action are in use, replaces the prototype with the fewest
    recent wins by itself.

    Attributes:
        step: int64, the sequence number of the decision that took the slot.
        category: int64 category index.
        action: int64 action index.
        prototype: int64, the slot that was recycled.
        displacement: float, the decision's distance to the nearest prototype of its action
            (unweighted L2; with ``learning='lvq'``, the squared distance under its metric).
    """

    step: Tensor
    category: Tensor
    action: Tensor
    prototype: Tensor
    displacement: Tensor
