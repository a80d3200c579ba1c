"""A decision as a :class:`~gae.Decider` made it, and the book of those still pending.

An agent scores a case, acts on it or hands it to a person, and learns the verified outcome
minutes or days later. :class:`Decision` is what ``decide`` answered; :class:`PendingBook` keeps
the open decisions, oldest first, bounded by ``max_pending`` (default 100,000) and
``pending_ttl`` (seconds, default none): past either the oldest expire, are counted in
``expired`` and logged (logger ``gae.decider``).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gae import validation as check
from gae.decider.refer import REASONS

logger = logging.getLogger("gae.decider")
MAX_PENDING = 100_000  # open decisions a Decider keeps by default


class Probs(dict):
    """A :class:`Decision`'s probabilities: a ``dict`` (JSON, ``==``, ``.items()`` as usual) that
    refuses changes, for a decision is kept by its Decider as it was made."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a Decision's probs are read-only: copy them first (dict(decision.probs))")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> Any:  # (pickle and copy give a Probs again, without calling update)
        return (Probs, (dict(self),))


@dataclass(frozen=True)
class Decision:
    """One decision as the :class:`~gae.Decider` made it, pending until verified.

    Attributes:
        id: its id (unique across processes unless the caller gave one).
        action: the recommended action's name, or None when the memory abstained.
        confidence: the recommendation's probability (0.0 when abstaining).
        probs: every action's name -> its probability (a read-only ``dict``, :class:`Probs`).
        category: the category, as given.
        version: the memory's ``version`` when it decided.
        created_at: when it decided (seconds, ``time.time()`` unless ``now`` was given).
        source_id: where the decision came from (``forget_`` removes by it), or None.
        refer: whether it should go to a person rather than be acted on alone (``reasons``
            is not empty).
        reasons: why, as :data:`gae.decider.refer.REASONS` words, in that order
            (:class:`gae.decider.refer.Referral`).
        verifications_needed: with ``not_calibrated`` among the reasons, the verified decisions
            the act-or-refer calibration still needs, at the least, before one is taken alone
            (:attr:`gae.decider.refer.Referral.needed`); else 0.
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
    verifications_needed: int = 0

    def __post_init__(self) -> None:
        reasons = tuple(self.reasons)
        if self.refer != bool(reasons) or reasons != tuple(r for r in REASONS if r in reasons):
            raise ValueError(f"a Decision refers exactly when it has reasons, each one of {list(REASONS)} once, in "
                             f"that order; got refer={self.refer!r}, reasons={self.reasons!r}")
        object.__setattr__(self, "reasons", reasons)  # frozen: a list given becomes the tuple it stands for
        needed = self.verifications_needed
        if isinstance(needed, (bool, np.bool_)) or not isinstance(needed, numbers.Integral) or needed < 0 or (
                needed and "not_calibrated" not in reasons):
            raise ValueError(f"a Decision's verifications_needed is an int >= 0, and 0 unless it is not_calibrated; "
                             f"got {needed!r} with reasons {reasons!r}")
        object.__setattr__(self, "verifications_needed", int(needed))
        if self.probs.__class__ is not Probs:
            object.__setattr__(self, "probs", Probs(self.probs))  # (a copy the caller's dict cannot change)

    @classmethod
    def made(cls, id: str, action: str | None, confidence: float, probs: dict[str, float], category: str | int,
             version: int, created_at: float, source_id: int | None, reasons: tuple[str, ...],
             verifications_needed: int = 0) -> Decision:
        """A decision whose fields the Decider computed and checked itself (``reasons`` a tuple
        in :data:`REASONS` order): built without the checks of ``__init__``, a microsecond less."""
        decision = _new(cls)
        probs = probs if probs.__class__ is Probs else Probs(probs)
        _set(decision, "__dict__", {"id": id, "action": action, "confidence": confidence, "probs": probs,
                                    "category": category, "version": version, "created_at": created_at,
                                    "source_id": source_id, "refer": bool(reasons), "reasons": reasons,
                                    "verifications_needed": verifications_needed})
        return decision


def recorded(event: Any) -> Decision:
    """The decision a ledger's decide event (:class:`gae.ledger.events.Event`) records, as it was made."""
    detail = event.detail
    reasons = tuple(detail.get("reasons", ()))  # (none in a ledger written before referrals)
    return Decision.made(event.decision_id, event.action, float(detail["confidence"]),
                         dict(zip(detail["names"], map(float, detail["probs"]), strict=True)), event.category,
                         int(event.decided_version), float(event.at), event.source_id, reasons,
                         int(detail.get("needed", 0)))


_new, _set = object.__new__, object.__setattr__  # (Decision.made: a frozen dataclass's fields, set at once)


class Pending(NamedTuple):
    """A pending decision and the factors it was made on, checked (:meth:`gae.DecisionMemory.factor_row`)."""

    decision: Decision
    row: np.ndarray  # (K,) float64


class Ids:
    """Decision ids unique across processes without a round trip: 16 random hex digits drawn once
    per Decider, then a counter (32 hex digits, as a uuid4's hex; a few hundred nanoseconds)."""

    def __init__(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count:016x}"

    def __getstate__(self) -> dict[str, Any]:  # a copy draws its own prefix: its ids never meet the original's
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class PendingBook:
    """The open decisions of one Decider, oldest first, with the rules that expire them (see the
    module). Not locked itself: its Decider holds its lock around every call."""

    def __init__(self, max_pending: int = MAX_PENDING, pending_ttl: float | None = None) -> None:
        self.open: OrderedDict[str, Pending] = OrderedDict()
        self.expired = 0  # decisions that expired unverified
        self.max_pending = check.check_int("max_pending", max_pending, low=1)
        self.ttl = None if pending_ttl is None else check.check_real("pending_ttl", pending_ttl, low=0.0,
                                                                     low_open=True)

    def __len__(self) -> int:
        return len(self.open)

    def live(self, id: Any, now: float) -> bool:
        """Whether ``id`` is pending at ``now`` (not past ``pending_ttl``), changing nothing."""
        opened = self.open.get(id) if isinstance(id, str) else None
        ttl = self.ttl
        return opened is not None and (ttl is None or opened.decision.created_at + ttl > now)

    def get(self, id: Any, now: float) -> Pending:
        """The pending decision ``id`` (KeyError when it is not pending at ``now``)."""
        if not self.live(id, now):
            raise KeyError(f"decision {id!r} is not pending: unknown, verified already or expired")
        return self.open[id]

    def expiring(self, now: float, keep: Any = None) -> list[str]:
        """The decisions past ``pending_ttl`` at ``now`` (not ``keep``), oldest first."""
        if self.ttl is None:
            return []
        return [key for key in self.open if key != keep and not self.live(key, now)]

    def crowded(self, expiring: list[str], adding: int = 1) -> list[str]:
        """The oldest decisions that ``adding`` more would push over ``max_pending`` (after ``expiring`` went)."""
        over = len(self.open) - len(expiring) + adding - self.max_pending
        if over <= 0:
            return []
        gone = set(expiring)
        return [key for key in self.open if key not in gone][:over]

    def add(self, decision: Decision, row: np.ndarray) -> None:
        self.open[decision.id] = tuple.__new__(Pending, (decision, row))  # (Pending(...) without its Python __new__)

    def close(self, id: str, expired: bool) -> None:
        """Take ``id`` out (verified, skipped, or ``expired``: counted and logged)."""
        if self.open.pop(id, None) is not None and expired:
            self.expired += 1
            logger.info("a pending decision expired unverified: %s", id)

    def decisions(self, now: float) -> list[Decision]:
        return [opened.decision for key, opened in self.open.items() if self.live(key, now)]

    # -- in a state_dict -----------------------------------------------------------------------
    def state(self, action_names: tuple[str, ...]) -> dict[str, Any]:
        """The pending decisions as ``weights_only`` data: lists, the factors as lists of floats
        (exact for float32 and float64), the probabilities over today's actions (a decision made
        before a growth gives the new ones 0)."""
        decisions = [opened.decision for opened in self.open.values()]
        return {"pending": {
            "id": [d.id for d in decisions], "action": [d.action for d in decisions],
            "confidence": [d.confidence for d in decisions],
            "probs": [[d.probs.get(name, 0.0) for name in action_names] for d in decisions],
            "category": [d.category for d in decisions], "version": [d.version for d in decisions],
            "created_at": [d.created_at for d in decisions], "source_id": [d.source_id for d in decisions],
            "reasons": [list(d.reasons) for d in decisions],
            "verifications_needed": [d.verifications_needed for d in decisions],
            "factors": [opened.row.tolist() for opened in self.open.values()]},
            "expired_decisions": self.expired}

    def load_state(self, state: dict[str, Any], action_names: tuple[str, ...], n_factors: int) -> None:
        """The pending decisions of :meth:`state` (none in one saved before they existed), checked
        whole before anything changes (ValueError naming the field)."""
        saved = state.get("pending")
        if saved is None:
            self.open, self.expired = OrderedDict(), 0
            return
        opened = _checked(saved, action_names, n_factors)
        expired = state.get("expired_decisions", 0)
        if isinstance(expired, bool) or not isinstance(expired, int) or expired < 0:
            raise ValueError(f"state_dict's expired_decisions must be an int >= 0, got {expired!r}")
        self.open, self.expired = opened, expired


def _checked(saved: Any, names: tuple[str, ...], n_factors: int) -> OrderedDict[str, Pending]:
    fields = ("id", "action", "confidence", "probs", "category", "version", "created_at", "source_id", "factors")
    if not isinstance(saved, dict) or any(not isinstance(saved.get(f), list) for f in fields):
        raise ValueError(f"state_dict's pending decisions must be a dict of lists {list(fields)}, got {saved!r:.200}")
    n = len(saved["id"])
    if any(len(saved[f]) != n for f in fields):
        raise ValueError(f"state_dict's pending decisions hold lists of lengths "
                         f"{ {f: len(saved[f]) for f in fields} }, not {n} each")
    reasons = saved.get("reasons", [[] for _ in range(n)])  # (none in a state saved before referrals)
    if not isinstance(reasons, list) or len(reasons) != n or not all(
            isinstance(r, list) and all(code in REASONS for code in r) for r in reasons):
        raise ValueError(f"state_dict's pending decisions hold bad reasons: {reasons!r:.200}")
    needs = saved.get("verifications_needed", [0] * n)  # (none in a state saved before it was kept)
    if not isinstance(needs, list) or len(needs) != n or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 and (v == 0 or "not_calibrated" in r)
            for v, r in zip(needs, reasons, strict=True)):
        raise ValueError(f"state_dict's pending decisions hold bad verifications_needed: {needs!r:.200}")
    opened: OrderedDict[str, Pending] = OrderedDict()
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
            "factors" if not isinstance(factors, list) or len(factors) != n_factors
            or not all(map(_real, factors)) else None)
        if problem is not None:
            raise ValueError(f"state_dict's pending decision {i} has a bad {problem}: {saved[problem][i]!r:.200}")
        decision = Decision(key, action, float(confidence), dict(zip(names, map(float, probs), strict=True)),
                            category, version, float(created), source, bool(reasons[i]), tuple(reasons[i]),
                            needs[i])
        opened[key] = Pending(decision, np.array(factors, dtype=np.float64))
    return opened


def _real(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def stamp(now: float | None) -> float:
    """``now`` checked (finite seconds), or ``time.time()``."""
    if now is None:
        return time.time()
    if isinstance(now, (bool, np.bool_)) or not isinstance(now, numbers.Real) or not math.isfinite(now):
        raise ValueError(f"now must be a finite number of seconds or None, got {now!r}")
    return float(now)


def plain_category(category: Any) -> str | int:
    """The category as a plain str or int (a NumPy scalar would not load with ``weights_only``)."""
    return str(category) if isinstance(category, str) else int(category)


def plain_action(action: Any) -> str | int:
    return str(action) if isinstance(action, str) else int(action)


def check_name_or_index(argument: str, value: Any) -> None:
    """A name or an int index (not a bool): what a category or action may be."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, numbers.Integral)):
        raise TypeError(f"{argument} must be a name or an int index, got {value!r}")
