"""Decider: a memory served to agents. Decide now, verify later, act or refer, on a durable ledger
when given a store.

An agent scores a case, acts on it or hands it to a person, and learns the verified outcome
minutes or days later. :class:`Decider` holds the memory (``decider.memory``, any of
:class:`~gae.JudgmentMemory`, :class:`~gae.KNNMemory`, :class:`~gae.RetrievalMemory`) and adds
what serving it takes: the decisions still pending (:class:`~gae.decider.decision.PendingBook`),
act or refer (:class:`~gae.decider.refer.Referral`), one lock for every call, and, given a store,
the durable ledger (:mod:`gae.decider.durable`).

Every change a Decider makes is an event (:mod:`gae.ledger.events`): a decision, a
verification learned, a decision closed unlearned, names added. Building a call's events checks
everything first (a call that raises changes nothing); :meth:`Decider._apply` then applies each,
the one function that learns live, replays a ledger on open and applies other writers' commits.
In RAM the events are applied and dropped; on a ledger they are appended and committed first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from gae import validation as check
from gae.decider import signals
from gae.decider.decision import (
    MAX_PENDING,
    Decision,
    Ids,
    Pending,
    PendingBook,
    Probs,
    check_name_or_index,
    plain_action,
    plain_category,
    recorded,
    stamp,
)
from gae.decider.refer import MIN_CONFIDENCE, MIN_MARGIN, Referral, verified_detail
from gae.decider.verified import learned, verified_of
from gae.ledger.events import CLOSE, DECIDE, GROW, LEARN, Event, apply_event
from gae.models.base import DecisionMemory
from gae.state_dicts import locked_deepcopy

SNAPSHOT_EVERY = 1000  # verifications between two snapshots of a ledger, by default


class Decider:
    """A decision memory served to agents: ``decide`` / ``verify``, act or refer, and a durable ledger.

    ``decide`` scores one case and keeps the decision pending under an id; ``verify(id, action)``
    learns it when its outcome arrives, with ``confirmed`` meaning that the person accepted what
    the memory recommended *then*, whatever it would recommend now. Verifications learn in the
    order they arrive, each with its own recorded recommendation.

    Each decision says whether to act on it or refer it to a person, and why
    (:class:`~gae.decider.refer.Referral`): with ``target_error``, a threshold calibrated online on
    the verified decisions keeps the error among those not referred at most the target.

    Given a ``store`` (:class:`~gae.storage.SQLiteStore` or :class:`~gae.storage.PostgresStore`),
    every decide and verify is committed to the ledger named ``ledger`` before it returns, and
    every process that opens a Decider on that ledger holds the same memory: the latest snapshot
    plus the verifications after it, replayed exactly (``docs/ledger.md``). The memory is then the
    ledger's: change it through the Decider only (a change made to ``decider.memory`` directly is
    refused at the next call).

    Thread safety: every public call holds the memory's lock (``memory.lock``, a
    :class:`threading.RLock`) from its checks to its last write, so the Decider's calls and those
    other threads make on ``decider.memory`` directly (scoring; in RAM, learning too) apply one
    after another, each whole.

    Args:
        memory: the model (``decider.memory``). On a ledger that exists, its names must be the
            ledger's or a start of them (it grows to the ledger's), or with ``memory.grow`` more
            (they are added to the ledger); it must not have learned anything the ledger lacks.
        store: a durable store for the ledger. Default: none, the Decider is in RAM.
        ledger: the ledger's name in the store. Default: ``'judgment'`` for a judgment memory,
            ``'knn'`` for a k-NN, ``'retrieval'`` for a retrieval memory.
        target_error: the error allowed among the decisions not referred, calibrated online on
            the verified ones. Default: None (refer below ``refer_confidence``).
        refer_confidence: without ``target_error``, refer a decision less confident than this. Default: 0.6.
        refer_margin: refer a decision whose best two probabilities are closer than this. Default: 0.1.
        max_pending: at most this many decisions stay pending; one more expires the oldest. Default: 100,000.
        pending_ttl: seconds a decision stays pending. Default: None (until verified or pushed out).
        snapshot_every: on a ledger, verifications between two snapshots. Default: 1,000.
        durable_decisions: on a ledger, whether ``decide`` commits before it returns (default
            True); False: a decision goes out with the next commit (any write, or :meth:`sync`),
            and a crash loses the decisions not written yet, never a verification.

    Examples::

        >>> from gae import Decider, JudgmentMemory
        >>> decider = Decider(JudgmentMemory(["invoice"], ["approve", "reject"], 2), target_error=0.05)
        >>> decider.verify(decider.decide([0.9, 0.1], "invoice").id, "approve")["initialized"]
        True
        >>> decision = decider.decide([0.8, 0.2], "invoice")
        >>> decision.action, decision.refer, decision.reasons, decision.verifications_needed
        ('approve', True, ('not_calibrated',), 90)
    """

    def __init__(self, memory: DecisionMemory, *, store: Any = None, ledger: str | None = None,
                 target_error: float | None = None, refer_confidence: float = MIN_CONFIDENCE,
                 refer_margin: float = MIN_MARGIN, max_pending: int = MAX_PENDING,
                 pending_ttl: float | None = None, snapshot_every: int | None = None,
                 durable_decisions: bool | None = None) -> None:
        if not isinstance(memory, DecisionMemory):
            raise TypeError(f"memory must be a JudgmentMemory, KNNMemory or RetrievalMemory, got "
                            f"{type(memory).__name__}")
        if store is None and (ledger is not None or snapshot_every is not None or durable_decisions is not None):
            given = [name for name, value in (("ledger", ledger), ("snapshot_every", snapshot_every),
                                              ("durable_decisions", durable_decisions)) if value is not None]
            raise ValueError(f"{', '.join(given)} configure a ledger: give the Decider a store too")
        self.memory = memory
        if target_error is not None:  # checked under the Decider's names for them
            check.check_real("target_error", target_error, low=0.0, high=1.0, low_open=True, high_open=True)
        self.referral = Referral(target_error, min_confidence=check.check_real("refer_confidence", refer_confidence,
                                                                               low=0.0, high=1.0),
                                 min_margin=check.check_real("refer_margin", refer_margin, low=0.0, high=1.0))
        self._book = PendingBook(max_pending, pending_ttl)
        self._lock = memory.lock  # one lock for the memory and what serves it: a call of either is one step
        self._ids = Ids()
        self._made: dict[str, tuple[Decision, Any]] = {}  # this call's decisions, for its DECIDE events
        self._durable: Any = None
        if store is not None:
            from gae.decider.durable import LedgerLink  # the ledger's tables: only a Decider with a store needs them

            self._durable = LedgerLink(self, store, default_ledger(memory) if ledger is None else ledger,
                                       SNAPSHOT_EVERY if snapshot_every is None else snapshot_every,
                                       True if durable_decisions is None else durable_decisions)

    def __repr__(self) -> str:
        where = "in RAM" if self._durable is None else f"ledger={self._durable.ledger.name!r}"
        return f"Decider({type(self.memory).__name__}, {where}, pending={len(self._book)})"

    # -- settings --------------------------------------------------------------------------------
    @property
    def target_error(self) -> float | None:
        """The error allowed among the decisions not referred (None: a fixed ``refer_confidence``)."""
        return self.referral.target_error

    @property
    def max_pending(self) -> int:
        """At most this many decisions stay pending; a decision over it expires the oldest."""
        return self._book.max_pending

    @max_pending.setter
    def max_pending(self, value: int) -> None:
        value = check.check_int("max_pending", value, low=1)
        with self._lock:
            when = stamp(None)
            self._write(lambda: _closes(list(self._book.open)[:max(len(self._book) - value, 0)], when))
            self._book.max_pending = value  # once the closings landed: a call that raises changes nothing

    @property
    def pending_ttl(self) -> float | None:
        """Seconds a decision stays pending (None: until verified or pushed out by ``max_pending``)."""
        return self._book.ttl

    @pending_ttl.setter
    def pending_ttl(self, value: float | None) -> None:
        self._book.ttl = None if value is None else check.check_real("pending_ttl", value, low=0.0, low_open=True)

    @property
    def expired_decisions(self) -> int:
        """Decisions that expired unverified (``max_pending``, ``pending_ttl``)."""
        return self._book.expired

    @property
    def version(self) -> int:
        """The memory's ``version``: what a decision records of the state it was made on."""
        return self.memory.version

    @property
    def ledger_version(self) -> int | None:
        """The sequence number of the last ledger event this Decider's state holds (None in RAM)."""
        return None if self._durable is None else self._durable.seen

    # -- decide and verify -------------------------------------------------------------------------
    def decide(self, factors: Sequence[float] | Tensor | np.ndarray, category: str | int = "general",
               id: str | None = None, source_id: int | None = None, *, now: float | None = None) -> Decision:
        """Score one decision and keep it pending under ``id`` until :meth:`verify`.

        The factors are checked as ``learn_one`` checks them (a decision that could never be
        learned is refused now, not at its verification). A category the memory has no opinion
        in yet (nothing learned there; with ``grow=True`` one it has not met) abstains, referred as
        ``unseen_category``. ``now`` (seconds) stamps ``created_at`` and ages the pending decisions
        (default: ``time.time()``). On a ledger, the decision is committed before it returns
        (unless ``durable_decisions=False``) and scored on every verification committed before.

        Raises:
            ValueError / TypeError: bad factors, category, id (empty, or already pending),
                ``source_id`` or ``now``, or a memory that cannot learn as it is; nothing changes.
        """
        when = time.time() if now is None else stamp(now)
        if id is not None:
            if not isinstance(id, str) or not id:
                raise TypeError(f"id must be a non-empty str or None, got {id!r}")
            id = check.check_text("id", str(id))  # (a NumPy string would not load with weights_only)
        source = None if source_id is None else _source(source_id)
        if category.__class__ is not str:
            check_name_or_index("category", category)
        elif self.memory.grow:  # (a name met for the first time is kept: in the memory, on a ledger)
            check.check_text("category", category)

        if self._durable is not None:
            return self._durable_decide(factors, category, id, source, when)
        with self._lock:
            book = self._book  # in RAM: no events to build, the decision goes straight into the book
            if id is not None and (book.live(id, when) or id in self._made):  # (or being decided by another thread)
                raise ValueError(f"id {id!r} is already pending: verify it first or give another id")
            decision, row = self._decision(factors, category, id, source, when)
            if book.ttl is not None:
                for key in book.expiring(when):  # (an expired decision of this id among them)
                    book.close(key, expired=True)
            if len(book.open) >= book.max_pending:
                for key in book.crowded([]):
                    book.close(key, expired=True)
            book.open[decision.id] = tuple.__new__(Pending, (decision, row))  # (book.add, in short)
            return decision

    def _durable_decide(self, factors: Any, category: Any, id: str | None, source: int | None,
                        when: float) -> Decision:
        """``decide`` on a ledger: the decision's events (those it expires, itself, those it
        pushes out) built on the caught-up state and written (:meth:`gae.decider.durable.LedgerLink.write`)."""
        made: list[Decision] = []
        durable = self._durable
        assert durable is not None

        def build() -> list[Event]:
            book = self._book
            if id is not None and (book.live(id, when) or id in self._made):  # (or being decided by another thread)
                raise ValueError(f"id {id!r} is already pending: verify it first or give another id")
            decision, row = self._decision(factors, category, id, source, when)
            expiring = book.expiring(when)  # (an expired decision of this id among them)
            crowded = book.crowded(expiring)
            self._made[decision.id] = (decision, row)
            made.append(decision)
            return [*_closes(expiring, when), Event(
                DECIDE, decision.id, decision.category, row, decision.action, source_id=source,
                decided_version=decision.version, at=when,
                detail={"confidence": decision.confidence, "names": list(decision.probs),
                        "probs": list(decision.probs.values()), "reasons": list(decision.reasons),
                        "needed": decision.verifications_needed,
                        "after": durable.seen}),  # the last event of the state it was made on
                *_closes(crowded, when)]

        self._write(build, decision=True, fresh=() if id is None else (id,))
        return made[-1]

    def _decision(self, factors: Any, category: Any, id: str | None, source: int | None,
                  when: float) -> tuple[Decision, Any]:
        """What ``decide`` answers and the factors' checked row, computed on the memory as it is,
        changing nothing (a decision that could never be learned is refused here)."""
        memory = self.memory
        index, confidence, probs, row, state = memory.assess_one(factors, category, True)
        names = memory.action_names
        unseen = index < 0  # no opinion in the category yet
        found = () if unseen or state is None else signals.signals(state, memory.category_index(category),
                                                                   self.referral, memory.n_factors)
        reasons = self.referral.reasons(confidence, probs, unseen=unseen, signals=found)
        decision = Decision.made(self._ids.next() if id is None else id, None if unseen else names[index],
                                 confidence, Probs(zip(names, probs, strict=False)),  # (strict=True costs per decide)
                                 category if category.__class__ is str else plain_category(category),
                                 memory.version, when, source, reasons,
                                 self.referral.needed if "not_calibrated" in reasons else 0)
        return decision, row

    def verify(self, id: str, action: str | int, outcome: str | None = None, skip: bool = False, *,
               now: float | None = None) -> dict[str, Any]:
        """Learn pending decision ``id``: the verified ``action``, with ``confirmed`` = (the
        action it recommended when it decided == ``action``), ``outcome`` as ``learn_one`` takes
        it (``'__incorrect__'``: uncertain, not learned). ``skip=True`` closes it without
        learning. Returns what ``learn_one`` returns (``{'skipped': True}`` when skipped); the
        decision is no longer pending, and act or refer has learned from it.

        Raises:
            KeyError: ``id`` is not pending (unknown, verified already, or expired).
            ValueError / TypeError: a bad action, outcome or ``skip``. Either way nothing changes.
        """
        if skip.__class__ is not bool:
            if not isinstance(skip, np.bool_):
                raise TypeError(f"skip must be a bool, got {skip!r}")
            skip = bool(skip)
        when = time.time() if now is None else stamp(now)
        if skip or self._durable is not None:
            return self._verified([id], [action], [outcome], skip, when)[0]
        with self._lock:  # in RAM: learned straight away, the checks of _verified's build first
            book, memory = self._book, self.memory
            opened = book.open.get(id) if id.__class__ is str else None
            if opened is None or book.ttl is not None:
                opened = book.get(id, when)  # (raises, naming the id, when it is not pending)
            if action.__class__ is not str and isinstance(action, str):
                action = str(action)  # (a NumPy string: a name, as learn_one and a ledger take it)
            if action.__class__ is str:
                if not (memory.grow and action):  # (with grow=True a new name is added when learned)
                    memory.action_index(action)  # raises, naming the actions
                elif action not in memory.action_names:
                    check.check_text("action", action)
                name = action
            else:
                check_name_or_index("action", action)
                name = memory.action_names[check.lookup("action", action, memory.action_names)]
            if outcome is not None:
                if outcome.__class__ is not str:
                    raise TypeError(f"outcome must be None or a string, got {outcome!r}")
                check.check_text("outcome", outcome)
            d = opened.decision
            decided = d.action is not None
            result = learned(memory, self.referral, opened.row, action, d.category, decided and d.action == name,
                             outcome, d.source_id, (d.confidence, decided, d.reasons), meet=False)
            del book.open[id]  # (book.close of a verified decision, in short)
            if book.ttl is not None:
                for key in book.expiring(when):
                    book.close(key, expired=True)
            return result

    def verify_many(self, ids: Sequence[str], actions: Sequence[str | int],
                    outcomes: Sequence[str | None] | None = None, *, now: float | None = None) -> list[dict[str, Any]]:
        """:meth:`verify` of each ``(id, action[, outcome])`` in order, checked as a whole first
        (every id pending and given once, every action and outcome valid, so a call that raises
        learns nothing), and on a ledger committed as one. Returns the list of ``verify``'s answers."""
        return self._verified(ids, actions, outcomes, False, stamp(now))

    def _verified(self, ids: Sequence[str], actions: Sequence[str | int], outcomes: Sequence[str | None] | None,
                  skip: bool, when: float) -> list[dict[str, Any]]:
        ids, actions = list(ids), list(actions)
        outcomes = [None] * len(ids) if outcomes is None else list(outcomes)
        if not len(ids) == len(actions) == len(outcomes):
            raise ValueError(f"ids, actions and outcomes must have one entry per decision, got {len(ids)}, "
                             f"{len(actions)} and {len(outcomes)}")

        def build() -> list[Event]:
            book, memory, seen = self._book, self.memory, set()
            events: list[Event] = []
            for id_, action, outcome in zip(ids, actions, outcomes, strict=True):
                opened = book.get(id_, when)
                if id_ in seen:
                    raise ValueError(f"ids names decision {id_!r} twice")
                seen.add(id_)
                check_name_or_index("action", action)
                if not (memory.grow and isinstance(action, str) and action):  # a new name, with grow=True
                    check.lookup("action", action, memory.action_names)
                elif action not in memory.action_names:
                    check.check_text("action", action)
                if outcome is not None:
                    if not isinstance(outcome, str):
                        raise TypeError(f"outcome must be None or a string, got {outcome!r}")
                    check.check_text("outcome", outcome)
                d = opened.decision
                if skip:
                    events.append(Event(CLOSE, d.id, at=when, detail={"reason": "skipped"}))
                    continue
                name = action if isinstance(action, str) else memory.action_names[int(action)]
                confirmed = d.action is not None and d.action == name
                events.append(Event(LEARN, d.id, d.category, opened.row, plain_action(action), confirmed, outcome,
                                    d.source_id, d.version, at=when,  # (on a ledger, None: its next id, there)
                                    detail={"referral": {"confidence": d.confidence, "decided": d.action is not None,
                                                         "reasons": list(d.reasons),
                                                         **verified_detail(d.action is not None, d.reasons)}}))
            return [*events, *_closes([key for key in book.expiring(when) if key not in seen], when)]

        results = self._write(build)
        return [{"skipped": True} if result is None else result for result in results[:len(ids)]]

    def pending(self, *, now: float | None = None) -> list[Decision]:
        """The decisions not verified yet, oldest first (those past ``pending_ttl`` expire first)."""
        when = stamp(now)
        if self._book.ttl is not None:  # those past it closed as expired (on a ledger: there)
            self._write(lambda: _closes(self._book.expiring(when), when))
        with self._lock:
            if self._durable is not None:
                self._durable.refresh()
            return self._book.decisions(when)

    # -- learning without a decision, and growth ----------------------------------------------------
    def learn_one(self, factors: Sequence[float] | Tensor | np.ndarray, action: str | int,
                  category: str | int = "general", confirmed: bool | None = True, outcome: str | None = None, *,
                  source_id: int | None = None) -> dict[str, Any]:
        """The memory's ``learn_one`` of a decision verified without ``decide`` (on a ledger:
        recorded and committed as a verification is). Returns what ``learn_one`` returns."""
        if outcome is not None and not isinstance(outcome, str):
            raise TypeError(f"outcome must be None or a string, got {outcome!r}")
        if outcome is not None:
            check.check_text("outcome", outcome)
        if confirmed is not None and not isinstance(confirmed, (bool, np.bool_)):
            raise TypeError(f"confirmed must be a bool or None, got {confirmed!r}")
        check_name_or_index("category", category)
        check_name_or_index("action", action)
        source = _source(source_id)

        def build() -> list[Event]:
            memory = self.memory
            row = memory.factor_row(factors)
            if not (memory.grow and isinstance(action, str) and action):  # (with grow=True a new name is added)
                check.lookup("action", action, memory.action_names)
            elif action not in memory.action_names:
                check.check_text("action", action)
            if memory.category_names is not None:
                if not (memory.grow and isinstance(category, str) and category):
                    memory.category_index(category)  # raises, naming the categories
                elif category not in memory.category_names:
                    check.check_text("category", category)
            # (on a ledger, a verification without a source id is given the ledger's next one when committed)
            return [Event(LEARN, None, plain_category(category), row, plain_action(action),
                          None if confirmed is None else bool(confirmed), outcome, source)]

        return self._write(build)[0]  # type: ignore[no-any-return]

    def add_actions_(self, names: str | Sequence[str]) -> None:
        """The memory's ``add_actions_`` (on a ledger: recorded for every process)."""
        self._grow(names, "actions")

    def add_categories_(self, names: str | Sequence[str]) -> None:
        """The memory's ``add_categories_`` (on a ledger: recorded for every process)."""
        self._grow(names, "categories")

    def _grow(self, names: str | Sequence[str], key: str) -> None:
        memory = self.memory
        if key == "categories" and memory.category_names is None:
            memory.add_categories_(names)  # raises, naming the reason
        try:
            listed = [names] if isinstance(names, str) else list(names)
        except TypeError:
            raise TypeError(f"names must be a name or a sequence of names, got {names!r}") from None
        for name in listed:
            if isinstance(name, str):
                check.check_text("names", name)

        def build() -> list[Event]:
            check.new_names(key, listed, memory.action_names if key == "actions" else memory.category_names or ())
            return [Event(GROW, detail={"actions": listed if key == "actions" else [],
                                        "categories": listed if key == "categories" else []})]

        self._write(build)

    # -- forgetting --------------------------------------------------------------------------------
    def forget_(self, source_ids: Sequence[int] | Tensor | np.ndarray, *, erase: bool = False,
                reason: str = "") -> int:
        """Remove every decision with these source ids, learned or pending, as if it had never
        been made: the memory relearns the rest (its own ``forget_`` in RAM; on a ledger the
        ledger's rows are deleted and every process replays what remains) and act or refer loses
        what they fed. ``erase=True`` also makes the deleted rows unreadable from the store's
        files; ``reason`` goes into the ledger's audit (who, when, why, how many; never what).
        Returns how many verified decisions were removed.

        Raises:
            ValueError: an id was never decided or learned with that source id (or is forgotten
                already); in RAM, a memory that keeps no log to replay (a k-NN: give the Decider
                a store). Nothing changes.
        """
        wanted = check.source_ids(source_ids).tolist()
        _check_deletion(erase, reason)
        with self._lock:
            if self._durable is not None:
                return self._durable.forget(wanted, bool(erase), reason)
            return self._forget_in_ram(wanted)

    def _forget_in_ram(self, wanted: list[int]) -> int:
        memory = self.memory
        pending = [key for key, opened in self._book.open.items() if opened.decision.source_id in set(wanted)]
        log = getattr(memory, "decision_log", None)
        if log is None:
            raise ValueError(f"forget_ in RAM needs a memory that keeps a log to replay; a {type(memory).__name__} "
                             "keeps none: give the Decider a store (its ledger replays any memory)")
        events = log.events()
        learned = torch.isin(events["source_id"], torch.tensor(wanted, dtype=torch.int64))
        found = set(events["source_id"][learned].tolist()) | {self._book.open[key].decision.source_id
                                                               for key in pending}
        missing = sorted(set(wanted) - found)
        if missing:
            raise ValueError(f"source_ids {missing} were never decided or learned here (or are forgotten already)")
        removed = 0
        if bool(learned.any()):
            seqs = events["seq"][learned]
            removed = memory.forget_([s for s in wanted if s in set(events["source_id"][learned].tolist())])
            self.referral.unlearned(seqs.numpy())
        for key in pending:
            self._book.close(key, expired=False)
        return removed

    def undo_(self, n: int = 1, *, erase: bool = False, reason: str = "") -> None:
        """Take back the last ``n`` verified decisions (and what act or refer learned from them):
        the memory's own ``undo_`` in RAM; on a ledger their rows are deleted and every process
        replays the rest (``erase`` and ``reason`` as in :meth:`forget_`).

        Raises:
            ValueError: fewer than ``n`` to take back, or in RAM a memory that keeps no log.
        """
        n = check.check_int("n", n, low=1)
        _check_deletion(erase, reason)
        with self._lock:
            if self._durable is not None:
                self._durable.undo(n, bool(erase), reason)
                return
            memory = self.memory
            if getattr(memory, "undo_", None) is None:
                raise ValueError(f"undo_ in RAM needs a memory that keeps a log to replay; a {type(memory).__name__} "
                                 "keeps none: give the Decider a store (its ledger replays any memory)")
            before = int(memory.num_decisions)
            memory.undo_(n)
            self.referral.unlearned(np.arange(int(memory.num_decisions), before))

    # -- the past ----------------------------------------------------------------------------------
    def explain_decision(self, id: str) -> Any:
        """Explain past decision ``id`` with the state it was made with: the ledger's state just
        before the decision, asked to ``explain`` its factors in its category (a judgment
        memory's :class:`~gae.judgment.explain.Explanation`; a k-NN's or retrieval memory's
        :class:`~gae.types.Retrieved` neighbours). Needs a store: a Decider in RAM keeps no past
        states (ValueError). KeyError for an id the ledger does not hold (or holds no more)."""
        if self._durable is None:
            raise ValueError("explain_decision needs a Decider with a store: in RAM no past state is kept "
                             "(explain the decision's factors now with decider.memory.explain)")
        with self._lock:
            return self._durable.explain(id)

    def decision(self, id: str) -> Decision:
        """Decision ``id`` as it was made (its answer, ``refer``, ``reasons`` and
        ``verifications_needed``): a pending one from this Decider, a past one from its ledger.
        KeyError for an id neither holds (in RAM, one verified or expired)."""
        with self._lock:
            pending = self._book.open.get(id) if isinstance(id, str) else None
            if pending is not None:
                return pending.decision
            if self._durable is None:
                raise KeyError(f"decision {id!r} is not pending, and a Decider in RAM keeps no past decisions")
            return self._durable.decision(id)

    # -- the ledger --------------------------------------------------------------------------------
    def sync(self) -> None:
        """On a ledger: write the decisions not written yet (``durable_decisions=False``) and apply
        what other writers committed. In RAM: nothing to do."""
        if self._durable is not None:
            self._durable.write(list)

    def close(self) -> None:
        """Write what is not written yet and leave the ledger: later calls raise. The store stays
        open (its owner closes it). In RAM: nothing to do."""
        if self._durable is not None:
            self._durable.close()

    def __enter__(self) -> Decider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The memory's ``state_dict`` (under ``'memory'``), the pending decisions, the expired
        count and the referral, as ``weights_only`` data."""
        with self._lock:
            return {"memory": self.memory.state_dict(), **self._book.state(self.memory.action_names),
                    "referral": self.referral.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state :meth:`state_dict` wrote, or a memory's ``state_dict`` saved by a gae before the
        Decider, whose pending decisions and referral it takes (checked whole first: a bad state
        changes nothing). Refused on a ledger: the ledger is the state."""
        if self._durable is not None:
            raise TypeError("load_state_dict on a Decider with a store would part it from its ledger (the other "
                            "writers and a reopen would not see it): load the state into a Decider in RAM")
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        if "memory" in state:
            memory_state, own = state["memory"], state
        else:  # a memory's state_dict from before the Decider: its decisions are in the extra state
            memory_state, own = state, state.get("_extra_state") or {}
        with self._lock:
            book = PendingBook(self._book.max_pending, self._book.ttl)
            referral = Referral(self.referral.target_error, min_confidence=self.referral.min_confidence,
                                min_margin=self.referral.min_margin)
            before = self.memory.state_dict()  # the memory first (its names, sizes and mode, checked whole: the
            self.memory.load_state_dict(memory_state, quiet=True)  # clearest error), put back if the rest is refused
            try:
                book.load_state(own, self.memory.action_names, self.memory.n_factors)
                referral.load_state(own.get("referral"))
            except BaseException:
                self.memory.load_state_dict(before, quiet=True)
                raise
            self._book, self.referral = book, referral

    def __getstate__(self) -> dict[str, Any]:
        if self._durable is not None:
            raise TypeError("a Decider on a store cannot be pickled or copied: open another Decider on the same "
                            "store (it loads the same state), or copy its state_dict()")
        with self._lock:
            return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __deepcopy__(self, memo: dict[int, Any]) -> Decider:
        """A deep copy made whole under the lock (deepcopy reads the attributes after ``__getstate__``
        returns, when another thread may be deciding). Pickle a Decider while no other thread uses it."""
        return locked_deepcopy(self, self._lock, memo)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = self.memory.lock  # (the copy's memory has a lock of its own)

    # -- applying events -------------------------------------------------------------------------
    def _write(self, build: Any, decision: bool = False, fresh: tuple[str, ...] = ()) -> list[Any]:
        """Build this call's events (raising there changes nothing) and apply them, under the
        Decider's lock; on a ledger, committed first and applied in commit order
        (:meth:`gae.decider.durable.LedgerLink.write`, which takes the lock itself: never held
        while the commit waits). Returns what applying each returned (a DECIDE's, the event itself)."""
        if self._durable is not None:
            return self._durable.write(build, decision, fresh)
        with self._lock:
            return [self._apply(event, own=True) for event in build()]

    def _apply(self, event: Event, own: bool = False) -> Any:
        """One event on the memory, the pending book and the referral: the same function learns
        live, replays on open and applies what other writers committed."""
        kind = event.kind
        if kind == DECIDE:
            decision_id = cast(str, event.decision_id)  # (a decide event has each of these: the ledger checks it)
            made = self._made.pop(decision_id, None) if own else None
            if made is None:
                made = (recorded(event), event.row)
            self._book.add(*made)
            return event
        if kind == CLOSE:
            self._book.close(cast(str, event.decision_id), expired=event.detail.get("reason") == "expired")
            return None
        if kind == GROW:
            apply_event(self.memory, event)
            return None
        result = learned(self.memory, self.referral, event.row, event.action, event.category, event.confirmed,
                         event.outcome, event.source_id, verified_of(event), meet=not own)  # (own: raises on a
        if event.decision_id is not None:  # name it lacks)
            self._book.close(event.decision_id, expired=False)
        return result


def default_ledger(memory: Any) -> str:
    """A memory's default ledger name: its kind (``'judgment'``, ``'knn'``, ``'retrieval'``)."""
    name = type(memory).__name__
    return {"JudgmentMemory": "judgment", "KNNMemory": "knn", "RetrievalMemory": "retrieval"}.get(name, name)


def _closes(keys: Sequence[str], when: float) -> list[Event]:
    return [Event(CLOSE, key, at=when, detail={"reason": "expired"}) for key in keys]


def _source(value: Any) -> int | None:
    return check.source_id(value)


def _check_deletion(erase: Any, reason: Any) -> None:
    if not isinstance(erase, (bool, np.bool_)):
        raise TypeError(f"erase must be a bool, got {erase!r}")
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, got {reason!r}")
    check.check_text("reason", reason)


