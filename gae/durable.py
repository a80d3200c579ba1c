"""A decision memory on a durable ledger: every decide and verify committed before it returns.

``JudgmentMemory(..., store=SQLiteStore(path))`` (or a :class:`~gae.episodic.store.PostgresStore`,
and the same for :class:`~gae.KNNMemory`) keeps its ledger in the store's tables
(:mod:`gae.ledger`): each decision, verification, closing and growth is an event with a
sequence number; the state is the latest snapshot (one every ``snapshot_every``
verifications) plus the verifications after it. Opening a memory on an existing ledger loads
the snapshot and replays the rest with the fast engine: it equals the memory that never
stopped, bit for bit.

Many writers, one memory: each write call holds the memory's lock and the store's write lock,
first applies what other writers committed since its last call (in their commit order), then
applies and appends its own events, and commits before it returns. So every process and thread
on one ledger ends with the state of one memory replaying the ledger in commit order, and a
``decide`` sees every verification committed before it started.

With ``durable_decisions=False`` a decide takes no write lock (microseconds): its event goes
out with the memory's next commit (any write call, or :meth:`DurableMixin.sync`). A crash
then loses the pending decisions not yet written, never a verification.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from gae import validation as check
from gae.ledger import CLOSE, DECIDE, GROW, LEARN, Event, Ledger
from gae.lifecycle import Decision, _Open, _plain_category, _source_id

SNAPSHOT_EVERY = 1000  # verifications between two snapshots, by default
_NAME_KEYS = ("categories", "actions", "factors")


def prepare(store: Any, name: str, kind: str, names: dict[str, tuple[str, ...] | None], settings: dict[str, Any],
            grow: bool) -> tuple[Ledger, dict[str, tuple[str, ...] | None]]:
    """Before a memory is built on ``store``: its ledger, and the names to build it with (the
    ledger's own, when it exists). Raises ValueError naming what differs between the memory
    asked for and the ledger: its kind, factors or settings, or (without ``grow``) its names."""
    ledger = Ledger(store, name)
    with ledger.reading():
        meta = ledger.meta()
    if not meta:
        return ledger, names
    differs = [f"kind ({meta['kind']!r} there, {kind!r} here)"] if meta["kind"] != kind else []
    stored = {key: None if meta[key] is None else tuple(meta[key]) for key in _NAME_KEYS}
    if stored["factors"] != names["factors"]:
        differs.append(f"factors ({list(stored['factors'] or [])} there, {list(names['factors'] or [])} here)")
    for key in sorted(set(meta["settings"]) | set(settings)):
        if meta["settings"].get(key) != settings.get(key):
            differs.append(f"{key} ({meta['settings'].get(key)!r} there, {settings.get(key)!r} here)")
    for key in ("categories", "actions"):
        if stored[key] != names[key] and not grow:
            differs.append(f"{key} ({None if stored[key] is None else list(stored[key])} there, "
                           f"{None if names[key] is None else list(names[key])} here; grow=True adds names)")
    if (stored["categories"] is None) != (names["categories"] is None):
        differs.append("categories (one of the two ignores categories)")
    if differs:
        raise ValueError(f"ledger {name!r} in {store!r} was created for another memory: " + "; ".join(differs))
    return ledger, stored


class DurableMixin:
    """The memory side of the ledger, mixed into :class:`~gae.DecisionMemory`. A memory built
    without a store has none of it: its calls do not even test for one."""

    _ledger: Ledger | None = None
    _open: OrderedDict[str, _Open]

    # -- opening ----------------------------------------------------------------------------
    def _attach(self, ledger: Ledger, snapshot_every: int, durable_decisions: bool,
                wanted: dict[str, tuple[str, ...] | None]) -> None:
        """Join ``ledger`` (see :func:`prepare`): write its meta if new, else rebuild from it and,
        with ``grow``, add the names ``wanted`` has that it lacks."""
        snapshot_every = check.check_int("snapshot_every", snapshot_every, low=1)
        if not isinstance(durable_decisions, (bool, np.bool_)):
            raise TypeError(f"durable_decisions must be a bool, got {durable_decisions!r}")
        d = self.__dict__
        d.update(_ledger=ledger, snapshot_every=snapshot_every, durable_decisions=bool(durable_decisions),
                 _seen=0, _epoch=0, _since_snapshot=0, _unflushed=[], _commits_seen=-1)
        for method in ("decide", "verify", "verify_many", "pending", "learn_one", "forget_", "undo_",
                       "add_actions_", "add_categories_", "prequential_", "learn_"):
            d[method] = getattr(self, f"_durable_{method.rstrip('_')}")  # shadows the class's, for this memory only
        with self._lock, ledger.writing():
            if not ledger.meta():
                ledger.set_meta({"kind": type(self).__name__, "settings": self._ledger_settings(), "head": 0,
                                 "epoch": 0, **{k: None if v is None else list(v) for k, v in self._names().items()}})
            else:
                self._rebuild()
            new_actions = [n for n in wanted["actions"] or () if n not in self.action_names]
            new_categories = [n for n in wanted["categories"] or () if n not in (self.category_names or ())]
            if new_actions or new_categories:
                self._write_events(lambda: [Event(GROW, detail={"actions": new_actions,
                                                                "categories": new_categories})])

    def _names(self) -> dict[str, tuple[str, ...] | None]:
        return {"categories": self.category_names, "actions": self.action_names, "factors": self.factor_names}

    def _ledger_settings(self) -> dict[str, Any]:
        """What must be the same for every memory on one ledger (JSON values). Subclasses add theirs."""
        return {}

    def _blank(self, categories: tuple[str, ...] | None, actions: tuple[str, ...]) -> Any:
        """A memory with these names and this one's settings, nothing learned, in RAM."""
        raise NotImplementedError

    # -- reading and replaying --------------------------------------------------------------
    def _catch_up(self) -> None:
        """Apply what other writers committed since this memory's last call (all of it again
        after a deletion: a rebuild). Inside the memory's lock and a read or write of the ledger."""
        ledger = self._ledger
        assert ledger is not None
        head, epoch = ledger.position()
        if epoch != self._epoch:
            self._rebuild()
        elif head != self._seen:
            for event in ledger.events(self._seen):
                self._apply(event)
            self.__dict__["_seen"] = head

    def _replayed(self, before: int | None = None) -> Any:
        """A memory in RAM holding the ledger's state just before event ``before`` (default: all
        of it): the latest snapshot before it, then the verifications and growths after it."""
        ledger = self._ledger
        assert ledger is not None
        meta = ledger.meta()
        fresh = self._blank(None if meta["categories"] is None else tuple(meta["categories"]), tuple(meta["actions"]))
        snapshot = ledger.snapshot(before)
        start = 0
        if snapshot is not None:
            _grow_to(fresh, snapshot.state.get("_extra_state", {}))
            fresh.load_state_dict(snapshot.state)
            start = snapshot.seq
        if before is None:  # names only grow: the memory keeps those it met in events deleted since
            _grow_to(fresh, {"action_names": self.action_names, "category_names": self.category_names})
        replayed = 0
        for event in ledger.events(start, before, kinds=(LEARN, GROW)):
            _apply_to(fresh, event)
            replayed += event.kind == LEARN
        fresh.__dict__["_replayed_count"] = replayed
        return fresh

    def _rebuild(self) -> None:
        """This memory as the ledger holds it now: the replayed state, its pending decisions, the
        expired count, and the decisions this memory has not written yet."""
        ledger = self._ledger
        assert ledger is not None
        fresh = self._replayed()
        d = self.__dict__
        d["_applying"] = True
        try:
            _grow_to(self, {"action_names": fresh.action_names, "category_names": fresh.category_names})
            type(self).load_state_dict(self, fresh.state_dict())
        finally:
            d["_applying"] = False
        self._open.clear()
        for event in ledger.pending():
            self._apply(event)
        d["expired_decisions"] = ledger.count(CLOSE, "expired")
        d["_since_snapshot"] = fresh.__dict__["_replayed_count"]
        d["_seen"], d["_epoch"] = ledger.position()
        for event in self._unflushed:
            self._apply(event)

    def _apply(self, event: Event) -> dict[str, Any] | None:
        """One event on this memory's state in RAM (the same function replays and learns live)."""
        d = self.__dict__
        if event.kind == DECIDE:
            detail = event.detail
            decision = Decision(event.decision_id, event.action, float(detail["confidence"]),
                                dict(zip(detail["names"], map(float, detail["probs"]), strict=True)), event.category,
                                int(event.decided_version), float(event.at), event.source_id)
            self._open[event.decision_id] = _Open(decision, event.row)
            return None
        if event.kind == CLOSE:
            if self._open.pop(event.decision_id, None) is not None and event.detail.get("reason") == "expired":
                d["expired_decisions"] += 1
            return None
        d["_applying"] = True
        try:
            result = _apply_to(self, event)
        finally:
            d["_applying"] = False
        if event.kind == LEARN:
            if event.decision_id is not None:
                self._open.pop(event.decision_id, None)
            d["_since_snapshot"] += 1
        return result

    # -- writing ----------------------------------------------------------------------------
    def _write_events(self, build: Any) -> list[dict[str, Any] | None]:
        """The write protocol: under the locks, catch up; ``build()`` this call's events on the
        caught-up state (it raises, changing nothing, on bad input); apply them (a learn that
        raises changes nothing either); append them with the decisions not written yet, a
        snapshot when due; commit. Returns what applying each event returned."""
        ledger = self._ledger
        assert ledger is not None
        d = self.__dict__
        with self._lock:
            try:
                with ledger.writing():
                    self._catch_up()
                    events, results, applied = build(), [], False
                    for i, event in enumerate(events):
                        results.append(self._apply(event))
                        applied = True
                        if event.kind == LEARN:
                            events[i] = dataclasses.replace(event, version=self.version)
                    head = ledger.append([*self._unflushed, *events], self._seen)
                    if self._since_snapshot >= self.snapshot_every:
                        ledger.write_snapshot(head, self.version, self._snapshot_state())
                        d["_since_snapshot"] = 0
            except BaseException:
                if applied:  # the state in RAM went ahead of a transaction that did not land
                    self._recover()
                raise
            d["_seen"], d["_unflushed"] = head, []
            _count_commit(ledger)
            d["_commits_seen"] = _commits(ledger)  # (what other memories on this store object committed was caught up)
            return results

    def _recover(self) -> None:
        """After a failed commit: this memory as the ledger holds it (best effort; the next call rebuilds otherwise)."""
        self.__dict__["_epoch"] = -1  # whatever happens here, the next catch-up rebuilds
        try:
            with self._ledger.reading():  # type: ignore[union-attr]
                self._rebuild()
        except Exception:  # noqa: BLE001 - the original error is the one to raise
            pass

    def _snapshot_state(self) -> dict[str, Any]:
        """The ``state_dict`` without the pending decisions (the ledger's pending table holds them)."""
        state = type(self).state_dict(self)
        extra = dict(state.get("_extra_state", {}))
        extra.pop("pending", None)
        extra.pop("expired_decisions", None)
        state["_extra_state"] = extra
        return state

    def sync(self) -> None:
        """Write the decisions not written yet (``durable_decisions=False``) and apply what other
        writers committed. A memory without a store has nothing to do."""
        if self._ledger is not None:
            self._write_events(list)

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
                        "probs": list(decision.probs.values())}), *_closes(oldest, stamp)]

        if self.durable_decisions:
            return self._decided(self._built(build))
        with self._lock:
            ledger = self._ledger
            assert ledger is not None
            if ledger.sql.changed() or self._commits_seen != _commits(ledger):
                with ledger.reading():
                    self._catch_up()
                self.__dict__["_commits_seen"] = _commits(ledger)
            events = build()
            for event in events:
                self._apply(event)
            self._unflushed.extend(events)
            return self._open[next(e for e in events if e.kind == DECIDE).decision_id].decision

    def _built(self, build: Any) -> list[Event]:
        """``_write_events`` of ``build``, returning the events it wrote (for decide's answer)."""
        holder: list[list[Event]] = []

        def keep() -> list[Event]:
            holder.append(build())
            return holder[0]

        self._write_events(keep)
        return holder[0]

    def _decided(self, events: list[Event]) -> Decision:
        key = next(e for e in events if e.kind == DECIDE).decision_id
        return self._open[key].decision

    def _decision_now(self, factors: Any, category: Any, id: str | None, source: int | None,
                      stamp: float) -> tuple[Decision, Any]:
        """What ``decide`` answers and the factors' checked row, computed on the state as it is, changing nothing."""
        import uuid

        self._check_learnable()
        row = self._decided_row(factors)
        names = self.action_names
        if self._unseen(category):
            action, confidence, probs = None, 0.0, dict.fromkeys(names, 0.0)
        else:
            chosen, confidence, scores = self._scores_one(row, category)
            action, probs = self._action_name(chosen), dict(zip(names, scores, strict=True))
        key = uuid.uuid4().hex if id is None else str(id)
        return Decision(key, action, confidence, probs, _plain_category(category), self.version, stamp, source), row

    def _expiring(self, stamp: float, keep: str | None = None) -> list[str]:
        """The pending decisions past ``pending_ttl`` at ``stamp`` (not ``keep``), oldest first."""
        if self.pending_ttl is None:
            return []
        return [key for key in self._open if key != keep and not self._live(key, stamp)]

    def _durable_verify(self, id: str, action: str | int, outcome: str | None = None, skip: bool = False, *,
                        now: float | None = None) -> dict[str, Any]:
        return self._durable_verify_many([id], [action], [outcome], skip=skip, now=now)[0]

    def _durable_verify_many(self, ids: Sequence[str], actions: Sequence[str | int],
                             outcomes: Sequence[str | None] | None = None, *, skip: bool = False,
                             now: float | None = None) -> list[dict[str, Any]]:
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
                                    _plain_action(action), confirmed, outcome, d.source_id, d.version, at=stamp))
            return [*events, *_closes(self._expiring(stamp), stamp, exclude=seen)]

        results = self._write_events(build)
        return [{"skipped": True} if r is None else r for r in results[:len(ids)]]

    def _durable_pending(self, *, now: float | None = None) -> list[Decision]:
        stamp = self._stamp(now)
        ledger = self._ledger
        assert ledger is not None
        with self._lock:
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

    def _durable_prequential(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_applying"):  # the checked path of a learn event being applied
            return type(self).prequential_(self, *args, **kwargs)
        raise TypeError(f"{type(self).__name__} on a store learns one committed call at a time (learn_one, "
                        "verify, verify_many): a batch through prequential_ / learn_ would not be in the ledger")

    def _durable_learn(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_applying"):
            return type(self).learn_(self, *args, **kwargs)
        return self._durable_prequential(*args, **kwargs)

    # -- forgetting -------------------------------------------------------------------------
    def _durable_forget(self, source_ids: Any, *, erase: bool = False, reason: str = "") -> int:
        wanted = check.source_ids(source_ids).tolist()
        return self._delete(lambda ledger: _all_of(ledger.learned(sorted(set(wanted))), wanted), "forget", erase,
                            reason)

    def _durable_undo(self, n: int = 1, *, erase: bool = False, reason: str = "") -> None:
        n = check.check_int("n", n, low=1)

        def seqs(ledger: Ledger) -> list[int]:
            found = [seq for seq, _ in ledger.learned(last=n)]
            if len(found) < n:
                raise ValueError(f"undo_({n}): the ledger holds {len(found)} learned decision(s)")
            return found

        self._delete(seqs, "undo", erase, reason)

    def _delete(self, seqs_of: Any, action: str, erase: bool, reason: str) -> int:
        """Delete learn events (``seqs_of(ledger)``) and their decisions, rebuild from what
        remains (a snapshot at the head records it for every process), then erase when asked."""
        if not isinstance(erase, (bool, np.bool_)):
            raise TypeError(f"erase must be a bool, got {erase!r}")
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {reason!r}")
        ledger = self._ledger
        assert ledger is not None
        with self._lock:
            version = self.version
            try:
                with ledger.writing():
                    self._catch_up()
                    head = ledger.append(self._unflushed, self._seen)
                    self.__dict__["_seen"], self.__dict__["_unflushed"] = head, []
                    seqs = seqs_of(ledger)
                    ledger.delete(seqs, action, reason, getattr(ledger.store, "actor", "gae"))
                    self._rebuild()
                    self._after_delete(version)
                    ledger.write_snapshot(head, self.version, self._snapshot_state())
                    self.__dict__["_since_snapshot"] = 0
            except BaseException:
                self._recover()
                raise
            _count_commit(ledger)
        if erase:
            ledger.erase()
        return len(seqs)

    def _after_delete(self, version: int) -> None:
        """After a rebuild that forgot decisions: a memory whose version only grows moves it past ``version``."""

    # -- the past ---------------------------------------------------------------------------
    def explain_decision(self, id: str) -> Any:
        """Explain past decision ``id`` with the state it was made with: the ledger's state just
        before the decision (its snapshot and the verifications before it), asked to explain
        the decision's factors in its category. Needs a store (KeyError for an id the ledger
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
        return past.explain(event.row, event.category)


def _apply_to(memory: Any, event: Event) -> dict[str, Any] | None:
    """A learn or grow event on ``memory`` through its class's own methods (in RAM, not the ledger's)."""
    cls = type(memory)
    if event.kind == GROW:
        if event.detail.get("actions"):
            cls.add_actions_(memory, event.detail["actions"])
        if event.detail.get("categories"):
            cls.add_categories_(memory, event.detail["categories"])
        return None
    if event.source_id is None:  # as the call that learned it live: learn_one, or the checked path with its source
        return cls.learn_one(memory, event.row, event.action, event.category, event.confirmed, event.outcome)
    return cls._learn_checked(memory, event.row, event.action, event.category, event.confirmed, event.outcome,
                              event.source_id)


def _grow_to(memory: Any, names: dict[str, Any]) -> None:
    """Append to ``memory`` the action and category names of ``names`` (a saved extra state) it lacks."""
    cls = type(memory)
    actions = [n for n in names.get("action_names") or () if n not in memory.action_names]
    categories = [n for n in names.get("category_names") or () if n not in (memory.category_names or ())]
    if actions:
        cls.add_actions_(memory, actions)
    if categories:
        cls.add_categories_(memory, categories)


def _closes(keys: Sequence[str], stamp: float, exclude: set[str] | None = None) -> list[Event]:
    return [Event(CLOSE, key, at=stamp, detail={"reason": "expired"}) for key in keys
            if not exclude or key not in exclude]


def _all_of(learned: list[tuple[int, int]], wanted: list[int]) -> list[int]:
    """The sequence numbers of ``learned`` ((seq, source id) pairs), after checking that every
    wanted source id has one (ValueError naming those that do not)."""
    missing = sorted(set(wanted) - {source for _, source in learned})
    if missing:
        raise ValueError(f"source_ids {missing} are not in the ledger (never learned with that source_id, "
                         "or forgotten already)")
    return [seq for seq, _ in learned]


def _check_category(category: Any) -> None:
    if isinstance(category, (bool, np.bool_)) or not isinstance(category, (str, numbers.Integral)):
        raise TypeError(f"category must be a name or an int index, got {category!r}")


def _check_action(action: Any) -> None:
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (str, numbers.Integral)):
        raise TypeError(f"action must be a name or an int index, got {action!r}")


def _plain_action(action: str | int) -> str | int:
    return str(action) if isinstance(action, str) else int(action)


def _commits(ledger: Ledger) -> int:
    """Ledger commits made through this store object (a memory sharing it sees the others' this way)."""
    return ledger.store.__dict__.get("_ledger_commits", 0)


def _count_commit(ledger: Ledger) -> None:
    ledger.store.__dict__["_ledger_commits"] = _commits(ledger) + 1


