"""Decide now, verify later: a decision memory's pending decisions.

An agent scores a case, acts on it or hands it to a person, and learns the verified outcome
minutes or days later. :meth:`LifecycleMixin.decide` scores and records the decision (its
factors, category, recommendation, probabilities and the memory's version) under an id;
:meth:`LifecycleMixin.verify` learns it when its outcome arrives, with ``confirmed`` meaning
that the person accepted what the memory recommended *then*, whatever it would recommend now.

The memory keeps the open decisions, oldest first, bounded by ``max_pending`` (default
100,000) and ``pending_ttl`` (seconds, default none): past either the oldest expire, are
counted in ``expired_decisions`` and logged (logger ``gae.lifecycle``). They travel in the
``state_dict``. Verifications learn in the order they arrive, each decision with its own
recorded recommendation: decide 1, decide 2, verify 2, verify 1 learns 2 first.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from gae import validation as check
from gae.refer import REASONS, Referral, verified_detail

logger = logging.getLogger("gae.lifecycle")
MAX_PENDING = 100_000  # open decisions a memory keeps by default


@dataclass(frozen=True)
class Decision:
    """One decision as the memory made it, pending until verified.

    Attributes:
        id: its id (a uuid4 hex unless the caller gave one).
        action: the recommended action's name, or None when the memory abstained.
        confidence: the recommendation's probability (0.0 when abstaining).
        probs: every action's name -> its probability.
        category: the category, as given.
        version: the memory's ``version`` when it decided.
        created_at: when it decided (seconds, ``time.time()`` unless ``now`` was given).
        source_id: where the decision came from (``forget_`` removes by it), or None.
        refer: whether it should go to a person rather than be acted on alone (``reasons``
            is not empty).
        reasons: why, as :data:`gae.refer.REASONS` words, in that order (:class:`gae.refer.Referral`).
    """

    id: str
    action: str | None
    confidence: float
    probs: dict[str, float]
    category: str | int
    version: int
    created_at: float
    source_id: int | None = None
    refer: bool = False
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        reasons = tuple(self.reasons)
        if self.refer != bool(reasons) or reasons != tuple(r for r in REASONS if r in reasons):
            raise ValueError(f"a Decision refers exactly when it has reasons, each one of {list(REASONS)} once, in "
                             f"that order; got refer={self.refer!r}, reasons={self.reasons!r}")
        object.__setattr__(self, "reasons", reasons)  # frozen: a list given becomes the tuple it stands for


@dataclass(frozen=True)
class _Open:
    """A pending decision and the factors it was made on, checked: a float64 NumPy row of the
    values given (a list of numbers, a CPU array or tensor), else the memory's checked tensor row."""

    decision: Decision
    row: np.ndarray | Tensor  # (K,)


class LifecycleMixin:
    """``decide`` / ``verify`` / ``verify_many`` / ``pending`` for :class:`~gae.DecisionMemory`
    (mixed into it: every decision memory has them). Each holds the memory's lock."""

    _lock: Any
    _open: OrderedDict[str, _Open]
    expired_decisions: int
    grow: bool
    n_factors: int
    referral: Referral  # the act-or-refer rule (gae/refer.py), set by each memory
    num_decisions: Tensor

    if TYPE_CHECKING:  # provided by DecisionMemory and its subclasses
        @property
        def action_names(self) -> tuple[str, ...]: ...
        @property
        def version(self) -> int: ...
        def __call__(self, x: Tensor, category: Tensor) -> Any: ...
        def _one_factor_row(self, factors: Any, limit: float | None = None) -> Tensor: ...
        def _fast_row(self, factors: Any) -> np.ndarray | None: ...
        def _check_learnable(self) -> None: ...
        def _trim_pending(self, limit: int) -> None: ...
        def _unseen(self, category: Any) -> bool: ...
        def _category_index(self, category: str | int) -> int: ...
        def _action_name(self, index: int) -> str | None: ...
        def learn_one(self, factors: Any, action: str | int, category: str | int = "general",
                      confirmed: bool | None = True, outcome: str | None = None) -> dict[str, Any]: ...
        def _learn_checked(self, factors: Any, action: str | int, category: str | int, confirmed: bool | None,
                           outcome: str | None, source_id: int | None) -> dict[str, Any]: ...

    def _init_pending(self, max_pending: int = MAX_PENDING, pending_ttl: float | None = None) -> None:
        self.__dict__["_open"] = OrderedDict()  # id -> _Open, oldest first
        self.__dict__["expired_decisions"] = 0
        self.pending_ttl = pending_ttl
        self.max_pending = max_pending

    @property
    def max_pending(self) -> int:
        """At most this many decisions stay pending; a decision over it expires the oldest."""
        return self.__dict__["_max_pending"]

    @max_pending.setter
    def max_pending(self, value: int) -> None:
        value = check.check_int("max_pending", value, low=1)
        with self._lock:
            if self.__dict__.get("_ledger") is not None:  # on a ledger the decisions it drops are closed there
                self._trim_pending(value)
                return
            self.__dict__["_max_pending"] = value
            self._expire(None)

    @property
    def pending_ttl(self) -> float | None:
        """Seconds a decision stays pending (None: until verified or pushed out by ``max_pending``)."""
        return self.__dict__["_pending_ttl"]

    @pending_ttl.setter
    def pending_ttl(self, value: float | None) -> None:
        self.__dict__["_pending_ttl"] = None if value is None else check.check_real(
            "pending_ttl", value, low=0.0, low_open=True)

    # -- the lifecycle --------------------------------------------------------------------
    def decide(self, factors: Sequence[float] | Tensor | Any, category: str | int = "general", id: str | None = None,
               source_id: int | None = None, *, now: float | None = None) -> Decision:
        """Score one decision and keep it pending under ``id`` until :meth:`verify`.

        The factors are checked as ``learn_one`` checks them (a decision that could never be
        learned is refused now, not at its verification). With ``grow=True``, a category not
        met yet abstains. ``now`` (seconds) stamps ``created_at`` and ages the pending
        decisions (default: ``time.time()``).

        Raises:
            ValueError / TypeError: bad factors, category, id (empty, or already pending),
                ``source_id`` or ``now``, or a memory that cannot learn as it is (a judgment
                memory moved to float64); nothing changes.
        """
        stamp = self._stamp(now)
        if id is not None and (not isinstance(id, str) or not id):
            raise TypeError(f"id must be a non-empty str or None, got {id!r}")
        source_id = _source_id(source_id)
        with self._lock:
            if id is not None and self._live(id, stamp):
                raise ValueError(f"id {id!r} is already pending: verify it first or give another id")
            decision, row = self._decision_now(factors, category, id, source_id, stamp)
            key = decision.id
            self._expire(stamp, key)  # past pending_ttl (an expired one of this id too)
            self._open[key] = _Open(decision, row)
            self._expire(stamp)  # and the oldest over max_pending
            return decision

    def verify(self, id: str, action: str | int, outcome: str | None = None, skip: bool = False, *,
               now: float | None = None) -> dict[str, Any]:
        """Learn pending decision ``id``: the verified ``action``, with ``confirmed`` = (the
        action it recommended when it decided == ``action``), ``outcome`` as ``learn_one``
        takes it (``'__incorrect__'``: uncertain, not learned). ``skip=True`` closes it
        without learning. Returns what ``learn_one`` returns (``{'skipped': True}`` when
        skipped); the decision is no longer pending.

        Raises:
            KeyError: ``id`` is not pending (unknown, verified already, or expired).
            ValueError / TypeError: a bad action, outcome or ``skip``. Either way nothing changes.
        """
        stamp = self._stamp(now)
        if not isinstance(skip, (bool, np.bool_)):
            raise TypeError(f"skip must be a bool, got {skip!r}")
        with self._lock:
            opened = self._pending_one(id, stamp)
            self._check_verified_action(action)
            if outcome is not None and not isinstance(outcome, str):
                raise TypeError(f"outcome must be None or a string, got {outcome!r}")
            decision = opened.decision
            if skip:
                result: dict[str, Any] = {"skipped": True}
            else:  # learn_one checks the rest and raises before it changes anything
                confirmed = decision.action is not None and decision.action == self._verified_name(action)
                seq = int(self.num_decisions)  # the sequence number this learn takes
                result = self._learn_checked(opened.row, action, decision.category, confirmed, outcome,
                                             decision.source_id) if decision.source_id is not None else \
                    self.learn_one(opened.row, action, decision.category, confirmed, outcome)
                if not result.get("skipped", False):
                    self._observe_verified(decision.category, decision.confidence, confirmed,
                                           verified_detail(decision.action is not None, decision.reasons), seq)
            del self._open[decision.id]
            self._expire(stamp)
            return result

    def verify_many(self, ids: Sequence[str], actions: Sequence[str | int],
                    outcomes: Sequence[str | None] | None = None, *, now: float | None = None) -> list[dict[str, Any]]:
        """:meth:`verify` of each ``(id, action[, outcome])`` in order, checked as a whole first:
        every id pending and given once, every action and outcome valid, so a call that raises
        learns nothing. Returns the list of ``verify``'s answers."""
        stamp = self._stamp(now)
        ids, actions = list(ids), list(actions)
        outcomes = [None] * len(ids) if outcomes is None else list(outcomes)
        if not len(ids) == len(actions) == len(outcomes):
            raise ValueError(f"ids, actions and outcomes must have one entry per decision, got {len(ids)}, "
                             f"{len(actions)} and {len(outcomes)}")
        with self._lock:
            seen: set[str] = set()
            for id_, action, outcome in zip(ids, actions, outcomes, strict=True):
                self._pending_one(id_, stamp)
                if id_ in seen:
                    raise ValueError(f"ids names decision {id_!r} twice")
                seen.add(id_)
                self._check_verified_action(action)
                if outcome is not None and not isinstance(outcome, str):
                    raise TypeError(f"outcome must be None or a string, got {outcome!r}")
            return [self.verify(id_, action, outcome, now=stamp) for id_, action, outcome in
                    zip(ids, actions, outcomes, strict=True)]

    def pending(self, *, now: float | None = None) -> list[Decision]:
        """The decisions not verified yet, oldest first (those past ``pending_ttl`` expire first)."""
        stamp = self._stamp(now)
        with self._lock:
            self._expire(stamp)
            return [opened.decision for key, opened in self._open.items() if self._live(key, stamp)]

    # -- helpers ----------------------------------------------------------------------------
    def _decision_now(self, factors: Any, category: Any, id: str | None, source_id: int | None,
                      stamp: float) -> tuple[Decision, np.ndarray | Tensor]:
        """What ``decide`` answers and the factors' checked row, computed on the state as it is,
        changing nothing (a decision that could never be verified is refused here)."""
        self._check_learnable()
        row = self._decided_row(factors)
        names = self.action_names
        if self._unseen(category):
            action, confidence, probs = None, 0.0, dict.fromkeys(names, 0.0)
        else:
            chosen, confidence, scores = self._scores_one(row, category)
            action, probs = self._action_name(chosen), dict(zip(names, scores, strict=True))
        unseen = action is None  # no opinion in the category yet
        reasons = self.referral.reasons(confidence, probs.values(), unseen=unseen,
                                        signals=() if unseen else self._refer_signals(row, category))
        key = uuid.uuid4().hex if id is None else str(id)  # plain values: a checkpoint loads with weights_only
        return Decision(key, action, confidence, probs, _plain_category(category), self.version, stamp,
                        source_id, bool(reasons), reasons), row

    # -- act or refer (gae/refer.py) -------------------------------------------------------
    def _refer_signals(self, row: np.ndarray | Tensor, category: str | int) -> tuple[str, ...]:
        """The memory's own reasons to refer a decision of this checked row in a category it has
        an opinion in: ``novel`` and ``recent_change`` where it can tell (:class:`~gae.refer.Referral`).
        A memory with nothing to tell returns ``()``."""
        return ()

    def _trust_row(self, category: str | int) -> list[float] | None:
        """The category's trust weights now, for ``recent_change`` (None: the memory has none)."""
        return None

    def _observe_verified(self, category: str | int, confidence: float, confirmed: bool, detail: dict[str, Any],
                          seq: int) -> None:
        """A verified decision, learned as ``seq``, told to the referral (``detail``:
        :func:`gae.refer.verified_detail`)."""
        self.referral.observe(self._category_index(category), min(max(confidence, 0.0), 1.0), bool(confirmed),
                              eligible=bool(detail.get("eligible")), alone=bool(detail.get("alone")), seq=seq,
                              trust=self._trust_row(category))

    def _decided_row(self, factors: Any) -> np.ndarray | Tensor:
        """The factors as :class:`_Open` keeps them, checked as ``learn_one`` checks them: a
        float64 copy when they convert in one step and are finite within the learning limit,
        else the checked path's tensor row (which raises, naming the problem, when they are bad)."""
        row = self._fast_row(factors)
        if row is not None and row.size and np.abs(row).max() <= check.LEARN_LIMIT:  # (False for NaN and inf)
            return row.copy()  # (the fast row may be the caller's own array)
        return self._one_factor_row(factors, check.LEARN_LIMIT)[0].clone()

    def _scores_one(self, row: np.ndarray | Tensor, category: str | int) -> tuple[int, float, list[float]]:
        """``(action index or -1, confidence, every action's probability)`` of one decided row:
        the batched ``forward``. A memory with a single-decision path answers there instead,
        with ``score_one``'s action and confidence."""
        x = self._one_factor_row(row)
        with torch.no_grad():
            out = self(x, torch.tensor([self._category_index(category)], device=x.device))
        return int(out.action[0]), float(out.confidence[0]), out.probs[0].tolist()

    @staticmethod
    def _stamp(now: float | None) -> float:
        if now is None:
            return time.time()
        if isinstance(now, (bool, np.bool_)) or not isinstance(now, numbers.Real) or not math.isfinite(now):
            raise ValueError(f"now must be a finite number of seconds or None, got {now!r}")
        return float(now)

    def _live(self, id: Any, now: float) -> bool:
        """Whether ``id`` is pending at ``now`` (not past ``pending_ttl``), changing nothing."""
        opened = self._open.get(id) if isinstance(id, str) else None
        ttl = self.pending_ttl
        return opened is not None and (ttl is None or opened.decision.created_at + ttl > now)

    def _pending_one(self, id: Any, now: float) -> _Open:
        if not self._live(id, now):
            raise KeyError(f"decision {id!r} is not pending: unknown, verified already or expired")
        return self._open[id]

    def _check_verified_action(self, action: str | int) -> None:
        """A verified action the memory can learn: a known name or index, or with ``grow=True`` any name."""
        if not (self.grow and isinstance(action, str) and action):
            check.lookup("action", action, self.action_names)

    def _verified_name(self, action: str | int) -> str:
        return action if isinstance(action, str) else self.action_names[int(action)]

    def _expire(self, now: float | None, also: str | None = None) -> None:
        """Drop the decisions past ``pending_ttl`` at ``now`` (from the oldest on, and ``also``
        if it is one: ``now`` given out of order can leave one behind a younger decision) and
        the oldest over ``max_pending``."""
        opened, ttl, gone = self._open, self.pending_ttl, []
        if ttl is not None and now is not None:
            while opened and next(iter(opened.values())).decision.created_at + ttl <= now:
                gone.append(opened.popitem(last=False)[0])
            if also is not None and also in opened and not self._live(also, now):
                gone.append(also)
                del opened[also]
        while len(opened) > self.max_pending:
            gone.append(opened.popitem(last=False)[0])
        if gone:
            self.__dict__["expired_decisions"] += len(gone)
            logger.info("%s: %d pending decision(s) expired unverified (first %s)", type(self).__name__, len(gone),
                        gone[0])

    # -- in the state_dict ---------------------------------------------------------------
    def _pending_state(self) -> dict[str, Any]:
        """The pending decisions as ``weights_only`` data: lists, the factors as lists of floats
        (exact for float32 and float64), the probabilities over today's actions (a decision made
        before a growth gives the new ones 0)."""
        decisions = [opened.decision for opened in self._open.values()]
        return {"pending": {
            "id": [d.id for d in decisions], "action": [d.action for d in decisions],
            "confidence": [d.confidence for d in decisions],
            "probs": [[d.probs.get(name, 0.0) for name in self.action_names] for d in decisions],
            "category": [d.category for d in decisions], "version": [d.version for d in decisions],
            "created_at": [d.created_at for d in decisions], "source_id": [d.source_id for d in decisions],
            "reasons": [list(d.reasons) for d in decisions],
            "factors": [opened.row.tolist() for opened in self._open.values()]},
            "expired_decisions": self.expired_decisions}

    def _load_pending_state(self, state: dict[str, Any]) -> None:
        """The pending decisions of a ``state_dict`` (none in one saved before they existed),
        checked whole before anything changes (ValueError naming the field)."""
        saved = state.get("pending")
        if saved is None:
            self.__dict__["_open"], self.__dict__["expired_decisions"] = OrderedDict(), 0
            return
        opened = self._checked_pending(saved)
        expired = state.get("expired_decisions", 0)
        if isinstance(expired, bool) or not isinstance(expired, int) or expired < 0:
            raise ValueError(f"state_dict's expired_decisions must be an int >= 0, got {expired!r}")
        self.__dict__["_open"], self.__dict__["expired_decisions"] = opened, expired

    def _checked_pending(self, saved: Any) -> OrderedDict[str, _Open]:
        fields = ("id", "action", "confidence", "probs", "category", "version", "created_at", "source_id", "factors")
        if not isinstance(saved, dict) or any(not isinstance(saved.get(f), list) for f in fields):
            raise ValueError(f"state_dict's pending decisions must be a dict of lists {list(fields)}, "
                             f"got {saved!r:.200}")
        n = len(saved["id"])
        if any(len(saved[f]) != n for f in fields):
            raise ValueError(f"state_dict's pending decisions hold lists of lengths "
                             f"{ {f: len(saved[f]) for f in fields} }, not {n} each")
        reasons = saved.get("reasons", [[] for _ in range(n)])  # (none in a state saved before referrals)
        if not isinstance(reasons, list) or len(reasons) != n or not all(
                isinstance(r, list) and all(code in REASONS for code in r) for r in reasons):
            raise ValueError(f"state_dict's pending decisions hold bad reasons: {reasons!r:.200}")
        names = self.action_names
        opened: OrderedDict[str, _Open] = OrderedDict()
        for i in range(n):
            key, action, confidence, probs, category, version, created, source, factors = (saved[f][i] for f in fields)
            problem = (
                "id" if not isinstance(key, str) or not key or key in opened else
                "action" if action is not None and action not in names else
                "confidence" if not _real(confidence) else
                "probs" if not isinstance(probs, list) or len(probs) != len(names) or not all(map(_real, probs)) else
                "category" if not isinstance(category, (str, int)) or isinstance(category, bool) else
                "version" if isinstance(version, bool) or not isinstance(version, int) or version < 0 else
                "created_at" if not _real(created) else
                "source_id" if source is not None and (isinstance(source, bool) or not isinstance(source, int)
                                                       or source < 0) else
                "factors" if not isinstance(factors, list) or len(factors) != self.n_factors
                or not all(map(_real, factors)) else None)
            if problem is not None:
                raise ValueError(f"state_dict's pending decision {i} has a bad {problem}: {saved[problem][i]!r:.200}")
            decision = Decision(key, action, float(confidence), dict(zip(names, map(float, probs), strict=True)),
                                category, version, float(created), source, bool(reasons[i]), tuple(reasons[i]))
            opened[key] = _Open(decision, np.array(factors, dtype=np.float64))
        return opened


def _real(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _source_id(value: Any) -> int | None:
    """A decision's source id: None, or an int >= 0 (a NumPy integer too)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"source_id must be an int >= 0 or None, got {value!r}")
    if value < 0:
        raise ValueError(f"source_id must be an int >= 0 or None, got {value!r}")
    return int(value)


def _plain_category(category: Any) -> str | int:
    """The category as a plain str or int (a NumPy scalar would not load with ``weights_only``)."""
    return str(category) if isinstance(category, str) else int(category)
