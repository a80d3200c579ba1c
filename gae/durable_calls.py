"""The calls of a decision memory on a durable ledger (:mod:`gae.durable`): decide, verify,
verify_many, pending, learn_one, growth, forget_, undo_ and explain_decision, each written as the
events it appends, built on the caught-up state and applied by the one function replay uses."""

from __future__ import annotations

import numbers
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gae import validation as check
from gae.ledger import CLOSE, DECIDE, GROW, LEARN, Event, Ledger
from gae.lifecycle import Decision, _Open, _plain_category, _source_id
from gae.refer import verified_detail


class DurableCallsMixin:
    """The public calls of :class:`~gae.durable.DurableMixin`, bound over the class's own on a
    memory built with a store (``_durable_decide`` is that memory's ``decide``, and so on)."""

    _ledger: Ledger | None = None
    _open: OrderedDict[str, _Open]
    _unflushed: list[Event]

    if TYPE_CHECKING:  # provided by DurableMixin, LifecycleMixin and DecisionMemory
        def __getattr__(self, name: str) -> Any: ...

    # -- the lifecycle, durable ----------------------------------------------------------------
    def _durable_decide(self, factors: Any, category: str | int = "general", id: str | None = None,
                        source_id: int | None = None, *, now: float | None = None) -> Decision:
        stamp = self._stamp(now)
        if id is not None and (not isinstance(id, str) or not id):
            raise TypeError(f"id must be a non-empty str or None, got {id!r}")
        source = _source_id(source_id)
        _check_category(category)

        def build() -> list[Event]:
            if id is not None and self._live(id, stamp):
                raise ValueError(f"id {id!r} is already pending: verify it first or give another id")
            decision, row = self._decision_now(factors, category, id, source, stamp)
            expired = self._expiring(stamp)
            over = len(self._open) - len(expired) + 1 - self.max_pending
            oldest = [key for key in self._open if key not in expired][:max(over, 0)]
            return [*_closes(expired, stamp), Event(
                DECIDE, decision.id, decision.category, np.asarray(row, dtype=np.float64), decision.action,
                source_id=source, decided_version=decision.version, at=stamp,
                detail={"confidence": decision.confidence, "names": list(decision.probs),
                        "probs": list(decision.probs.values()), "reasons": list(decision.reasons)}),
                *_closes(oldest, stamp)]

        if self.durable_decisions:
            return self._decided(self._built(build))
        with self._lock:
            ledger = self._ledger
            assert ledger is not None
            if ledger.sql.changed() or self._commits_seen != ledger.commits():
                with ledger.reading():
                    self._catch_up(force=True)
            events = build()
            for event in events:
                self._apply_event(event)
            self._unflushed.extend(events)
            return self._decided(events)

    def _built(self, build: Any) -> list[Event]:
        """``_write_events`` of ``build``, returning the events it wrote (for decide's answer)."""
        holder: list[list[Event]] = []

        def keep() -> list[Event]:
            holder.append(build())
            return holder[0]

        self._write_events(keep)
        return holder[0]

    def _decided(self, events: list[Event]) -> Decision:
        key = next(e.decision_id for e in events if e.kind == DECIDE)
        return self._open[cast(str, key)].decision

    def _trim_pending(self, limit: int) -> None:
        """``max_pending = limit`` on a ledger: the oldest decisions over it closed there as expired."""

        stamp = self._stamp(None)
        self._write_events(lambda: _closes(list(self._open)[:max(len(self._open) - limit, 0)], stamp))
        self.__dict__["_max_pending"] = limit  # once the closings landed: a call that raises changes nothing

    def _expiring(self, stamp: float, keep: str | None = None) -> list[str]:
        """The pending decisions past ``pending_ttl`` at ``stamp`` (not ``keep``), oldest first."""
        if self.pending_ttl is None:
            return []
        return [key for key in self._open if key != keep and not self._live(key, stamp)]

    def _durable_verify(self, id: str, action: str | int, outcome: str | None = None, skip: bool = False, *,
                        now: float | None = None) -> dict[str, Any]:
        return self._verified([id], [action], [outcome], skip, now)[0]

    def _durable_verify_many(self, ids: Sequence[str], actions: Sequence[str | int],
                             outcomes: Sequence[str | None] | None = None, *,
                             now: float | None = None) -> list[dict[str, Any]]:
        return self._verified(ids, actions, outcomes, False, now)

    def _verified(self, ids: Sequence[str], actions: Sequence[str | int], outcomes: Sequence[str | None] | None,
                  skip: bool, now: float | None) -> list[dict[str, Any]]:
        """``verify`` of each decision in one write: checked whole, then learned (closed, with ``skip``) in order."""
        stamp = self._stamp(now)
        if not isinstance(skip, (bool, np.bool_)):
            raise TypeError(f"skip must be a bool, got {skip!r}")
        ids, actions = list(ids), list(actions)
        outcomes = [None] * len(ids) if outcomes is None else list(outcomes)
        if not len(ids) == len(actions) == len(outcomes):
            raise ValueError(f"ids, actions and outcomes must have one entry per decision, got {len(ids)}, "
                             f"{len(actions)} and {len(outcomes)}")

        def build() -> list[Event]:
            events, seen = [], set()
            for id_, action, outcome in zip(ids, actions, outcomes, strict=True):
                opened = self._pending_one(id_, stamp)
                if id_ in seen:
                    raise ValueError(f"ids names decision {id_!r} twice")
                seen.add(id_)
                self._check_verified_action(action)
                _check_action(action)
                if outcome is not None and not isinstance(outcome, str):
                    raise TypeError(f"outcome must be None or a string, got {outcome!r}")
                d = opened.decision
                if skip:
                    events.append(Event(CLOSE, d.id, at=stamp, detail={"reason": "skipped"}))
                    continue
                confirmed = d.action is not None and d.action == self._verified_name(action)
                events.append(Event(LEARN, d.id, d.category, np.asarray(opened.row, dtype=np.float64),
                                    _plain_action(action), confirmed, outcome, d.source_id, d.version, at=stamp,
                                    detail={"referral": {"confidence": d.confidence,
                                                         **verified_detail(d.action is not None, d.reasons)}}))
            return [*events, *_closes(self._expiring(stamp), stamp, exclude=seen)]

        results = self._write_events(build)
        return [{"skipped": True} if r is None else r for r in results[:len(ids)]]

    def _durable_pending(self, *, now: float | None = None) -> list[Decision]:
        stamp = self._stamp(now)
        ledger = self._ledger
        assert ledger is not None
        with self._lock:
            if self.pending_ttl is not None:  # the decisions past it are closed in the ledger, as expired
                self._write_events(lambda: _closes(self._expiring(stamp), stamp))
            else:
                with ledger.reading():
                    self._catch_up()
            return [opened.decision for key, opened in self._open.items() if self._live(key, stamp)]

    def _durable_learn_one(self, factors: Any, action: str | int, category: str | int = "general",
                           confirmed: bool | None = True, outcome: str | None = None) -> dict[str, Any]:
        if outcome is not None and not isinstance(outcome, str):
            raise TypeError(f"outcome must be None or a string, got {outcome!r}")
        if confirmed is not None and not isinstance(confirmed, (bool, np.bool_)):
            raise TypeError(f"confirmed must be a bool or None, got {confirmed!r}")
        _check_category(category)
        _check_action(action)

        def build() -> list[Event]:
            row = self._decided_row(factors)
            return [Event(LEARN, None, _plain_category(category), np.asarray(row, dtype=np.float64),
                          _plain_action(action), None if confirmed is None else bool(confirmed), outcome)]

        return self._write_events(build)[0]  # type: ignore[return-value]

    def _durable_add_actions(self, names: str | Sequence[str]) -> None:
        self._durable_grow(names, "actions")

    def _durable_add_categories(self, names: str | Sequence[str]) -> None:
        self._durable_grow(names, "categories")

    def _durable_grow(self, names: str | Sequence[str], key: str) -> None:
        raw = getattr(type(self), f"add_{key}_")
        if self.__dict__.get("_applying"):  # a replayed learn_one meeting a name (grow=True)
            raw(self, names)
            return
        if key == "categories" and self.category_names is None:
            raw(self, names)  # raises, naming the reason
        listed = [names] if isinstance(names, str) else list(names)

        def build() -> list[Event]:
            existing = self.action_names if key == "actions" else self.category_names
            check.new_names(key, listed, existing)  # raises, changing nothing
            return [Event(GROW, detail={"actions": listed if key == "actions" else [],
                                        "categories": listed if key == "categories" else []})]

        self._write_events(build)

    def _durable_load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"load_state_dict on a {type(self).__name__} on a store would part it from its ledger (the "
                        "other writers and a reopen would not see it): build a memory on a new ledger and feed it, "
                        "or load the state into a memory in RAM")

    def _durable_keep_newest(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"keep_newest_ on a {type(self).__name__} on a store is not in the ledger: build the "
                        "k-NN with the capacity it should keep")

    def _durable_prequential(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_applying"):  # the checked path of a learn event being applied
            return cast(Any, type(self)).prequential_(self, *args, **kwargs)
        raise TypeError(f"{type(self).__name__} on a store learns one committed call at a time (learn_one, "
                        "verify, verify_many): a batch through prequential_ / learn_ would not be in the ledger")

    def _durable_learn(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_applying"):
            return cast(Any, type(self)).learn_(self, *args, **kwargs)
        return self._durable_prequential(*args, **kwargs)

    # -- forgetting -------------------------------------------------------------------------
    def _durable_forget(self, source_ids: Any, *, erase: bool = False, reason: str = "") -> int:
        wanted = check.source_ids(source_ids).tolist()

        def seqs(ledger: Ledger) -> list[int]:
            found = ledger.sourced(sorted(set(wanted)))  # decisions pending, skipped and learned
            missing = sorted(set(wanted) - {source for _, source in found})
            if missing:
                raise ValueError(f"source_ids {missing} are not in the ledger (never decided or learned with that "
                                 "source_id, or forgotten already)")
            return [seq for seq, _ in found]

        return self._delete(seqs, "forget", erase, reason)

    def _durable_undo(self, n: int = 1, *, erase: bool = False, reason: str = "") -> None:
        n = check.check_int("n", n, low=1)

        def seqs(ledger: Ledger) -> list[int]:
            found = [seq for seq, _ in ledger.learned(last=n)]
            if len(found) < n:
                raise ValueError(f"undo_({n}): the ledger holds {len(found)} learned decision(s)")
            return found

        self._delete(seqs, "undo", erase, reason)

    def _delete(self, seqs_of: Any, action: str, erase: bool, reason: str) -> int:
        """Delete events (``seqs_of(ledger)``, which raises for a call that cannot be done) with
        the decisions they verified, rebuild from what remains (a snapshot at the head records it
        for every process), then erase when asked. Returns the verifications removed."""
        if not isinstance(erase, (bool, np.bool_)):
            raise TypeError(f"erase must be a bool, got {erase!r}")
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {reason!r}")
        ledger = self._ledger
        assert ledger is not None
        with self._lock:
            version, changed, flushed = self.version, False, list(self._unflushed)
            try:
                with ledger.writing():
                    self._catch_up()
                    head = ledger.append(flushed, self._seen)  # this memory's position moves once it commits
                    seqs = seqs_of(ledger)
                    changed = True
                    removed = ledger.delete(seqs, action, reason, getattr(ledger.store, "actor", "gae"))
                    self.__dict__["_unflushed"] = []  # (in the ledger now: the rebuild must not apply them twice)
                    self._rebuild()
                    self._after_delete(version)
                    ledger.write_snapshot(head, self.version, self._snapshot_state())
                    self.__dict__["_since_snapshot"] = 0
                    ledger.count_commit()
                    self.__dict__["_commits_seen"] = ledger.commits()
            except BaseException:
                if changed:
                    self.__dict__["_unflushed"] = flushed  # not written after all: kept for the next commit
                    self._recover()
                raise
        if erase:
            ledger.erase()
        return removed

    def _after_delete(self, version: int) -> None:
        """After a rebuild that forgot decisions: a memory whose version only grows moves it past ``version``."""

    # -- the past ---------------------------------------------------------------------------
    def explain_decision(self, id: str) -> Any:
        """Explain past decision ``id`` with the state it was made with: the ledger's state just
        before the decision (its snapshot and the verifications before it), asked to explain
        the decision's factors in its category (a judgment memory's :class:`~gae.judgment.explain.Explanation`;
        a k-NN's :class:`~gae.types.Retrieved` neighbours). Needs a store (KeyError for an id the ledger
        does not hold, or holds no more: forgotten)."""
        ledger = self._ledger
        if ledger is None:
            raise ValueError(f"explain_decision needs a {type(self).__name__} built with store=: a memory in RAM "
                             "keeps no past states")
        with self._lock, ledger.reading():
            self._catch_up()
            event = ledger.decision(id) if isinstance(id, str) else None
            if event is None:
                raise KeyError(f"decision {id!r} is not in the ledger")
            past = self._replayed(before=event.seq)
        return self._explain_past(past, event.row, event.category)

    def _explain_past(self, past: Any, row: Any, category: Any) -> Any:
        """The explanation of one decision by ``past`` (its state when it decided): its ``explain``.
        A category ``past`` had not met then (a growing memory abstained on it) is added to that
        copy, so the explanation says so: no prototype, no recommendation."""
        names = past.category_names
        if isinstance(category, str) and names is not None and category not in names:
            past.add_categories_([category])
        return past.explain(row, category)


def _closes(keys: Sequence[str], stamp: float, exclude: set[str] | None = None) -> list[Event]:
    return [Event(CLOSE, key, at=stamp, detail={"reason": "expired"}) for key in keys
            if not exclude or key not in exclude]


def _check_category(category: Any) -> None:
    if isinstance(category, (bool, np.bool_)) or not isinstance(category, (str, numbers.Integral)):
        raise TypeError(f"category must be a name or an int index, got {category!r}")


def _check_action(action: Any) -> None:
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (str, numbers.Integral)):
        raise TypeError(f"action must be a name or an int index, got {action!r}")


def _plain_action(action: str | int) -> str | int:
    return str(action) if isinstance(action, str) else int(action)
