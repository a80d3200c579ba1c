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
from collections import OrderedDict
from typing import Any, cast

import numpy as np

from gae import validation as check
from gae.durable_calls import DurableCallsMixin
from gae.ledger import CLOSE, DECIDE, GROW, LEARN, Event, Ledger
from gae.lifecycle import Decision, _Open

SNAPSHOT_EVERY = 1000  # verifications between two snapshots, by default
_NAME_KEYS = ("categories", "actions", "factors")


def prepare(store: Any, name: str, kind: str, names: dict[str, Any], settings: dict[str, Any],
            grow: bool, defaults: dict[str, Any] | None = None) -> tuple[Ledger, dict[str, Any]]:
    """Before a memory is built on ``store``: its ledger, and the names to build it with (the
    ledger's own, when it exists). Raises ValueError naming what differs between the memory
    asked for and the ledger: its kind, factors or settings (a setting one of them lacks, as a
    ledger written before the setting existed, counts as its value in ``defaults``), or (without
    ``grow``) its names."""
    ledger = Ledger(store, name)
    with ledger.reading():
        meta = ledger.meta()
    if not meta:
        return ledger, names
    return ledger, _check_meta(meta, ledger, kind, names, settings, grow, defaults)


def _check_meta(meta: dict[str, Any], ledger: Ledger, kind: str, names: dict[str, Any], settings: dict[str, Any],
                grow: bool, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The names to build a memory with on a ledger of this ``meta`` (its first ones); ValueError
    naming what differs."""
    defaults = defaults or {}
    name, store = ledger.name, ledger.store
    differs = [f"kind ({meta['kind']!r} there, {kind!r} here)"] if meta["kind"] != kind else []
    stored: dict[str, Any] = {key: None if meta[key] is None else tuple(meta[key]) for key in _NAME_KEYS}
    if stored["factors"] != names["factors"]:
        differs.append(f"factors ({list(stored['factors'] or [])} there, {list(names['factors'] or [])} here)")
    for key in sorted(set(meta["settings"]) | set(settings)):
        there, here = meta["settings"].get(key, defaults.get(key)), settings.get(key, defaults.get(key))
        if there != here:
            differs.append(f"{key} ({there!r} there, {here!r} here)")
    for key in ("categories", "actions"):
        grown = meta.get(f"grown_{key}", meta[key])  # the ledger's names now (a growth appends to them)
        if stored[key] != names[key] and (None if grown is None else tuple(grown)) != names[key] and not grow:
            differs.append(f"{key} ({None if stored[key] is None else list(stored[key])} there, "
                           f"{None if names[key] is None else list(names[key])} here; grow=True adds names)")
    if (stored["categories"] is None) != (names["categories"] is None):
        differs.append("categories (one of the two ignores categories)")
    if differs:
        raise ValueError(f"ledger {name!r} in {store!r} was created for another memory: " + "; ".join(differs))
    return stored


class DurableMixin(DurableCallsMixin):
    """The memory side of the ledger, mixed into :class:`~gae.DecisionMemory`. A memory built
    without a store has none of it: its calls do not even test for one."""

    _ledger: Ledger | None = None
    _open: OrderedDict[str, _Open]

    # -- opening ----------------------------------------------------------------------------
    def _attach(self, ledger: Ledger, snapshot_every: int, durable_decisions: bool,
                wanted: dict[str, Any]) -> None:
        """Join ``ledger`` (see :func:`prepare`): write its meta if new, else rebuild from it and,
        with ``grow``, add the names ``wanted`` has that it lacks."""
        snapshot_every = check.check_int("snapshot_every", snapshot_every, low=1)
        if not isinstance(durable_decisions, (bool, np.bool_)):
            raise TypeError(f"durable_decisions must be a bool, got {durable_decisions!r}")
        d = self.__dict__
        d.update(_ledger=ledger, snapshot_every=snapshot_every, durable_decisions=bool(durable_decisions),
                 _seen=0, _epoch=0, _since_snapshot=0, _unflushed=[], _commits_seen=-1)
        for method in ("decide", "verify", "verify_many", "pending", "learn_one", "forget_", "undo_",
                       "add_actions_", "add_categories_", "prequential_", "learn_", "load_state_dict", "keep_newest_"):
            if hasattr(type(self), method) or method in ("forget_", "undo_"):  # shadows the class's, for this memory
                d[method] = getattr(self, f"_durable_{method.rstrip('_')}")
        with self._lock, ledger.writing():
            meta = ledger.meta()
            if meta:  # checked again under the lock: another process may have created it since prepare()
                _check_meta(meta, ledger, type(self).__name__, wanted, self._ledger_settings(),
                            bool(getattr(self, "grow", False)), self._ledger_defaults())
            if not meta:
                ledger.set_meta({"kind": type(self).__name__, "settings": self._ledger_settings(), "head": 0,
                                 "epoch": 0, **{k: None if v is None else list(v) for k, v in self._names().items()}})
            else:
                self._rebuild()
            new_actions = [n for n in wanted["actions"] or () if n not in self.action_names]
            new_categories = [n for n in wanted["categories"] or () if n not in (self.category_names or ())]
            if new_actions or new_categories:
                self._write_events(lambda: [Event(GROW, detail={"actions": new_actions,
                                                                "categories": new_categories})])

    @property
    def ledger_version(self) -> int | None:
        """The sequence number of the last ledger event this memory's state holds (None without a store)."""
        return None if self._ledger is None else self.__dict__["_seen"]

    def __getstate__(self) -> dict[str, Any]:
        if self.__dict__.get("_ledger") is not None:
            raise TypeError(f"a {type(self).__name__} on a store cannot be pickled or copied: open another memory "
                            "on the same store (it loads the same state), or copy its state_dict()")
        return cast(Any, super()).__getstate__()

    def _names(self) -> dict[str, tuple[str, ...] | None]:
        return {"categories": self.category_names, "actions": self.action_names, "factors": self.factor_names}

    def _ledger_settings(self) -> dict[str, Any]:
        """What must be the same for every memory on one ledger (JSON values). Subclasses add theirs."""
        return {}

    def _ledger_defaults(self) -> dict[str, Any]:
        """The value of each setting for a ledger written before it existed."""
        return {}

    def _blank(self, categories: tuple[str, ...] | None, actions: tuple[str, ...]) -> Any:
        """A memory with these names and this one's settings, nothing learned, in RAM."""
        raise NotImplementedError

    # -- reading and replaying --------------------------------------------------------------
    def _catch_up(self, force: bool = False) -> None:
        """Apply what other writers committed since this memory's last call (all of it again
        after a deletion: a rebuild). Inside the memory's lock and a read or write of the ledger.
        Unless ``force``, nothing is read when no other connection committed (SQLite's data
        version) and no other memory on this store object did."""
        ledger = self._ledger
        assert ledger is not None
        commits = ledger.commits()
        if not ledger.sql.changed() and not force and commits == self._commits_seen:
            return
        head, epoch = ledger.position()
        if epoch != self._epoch:
            self._rebuild()
        elif head != self._seen:
            for event in ledger.events(self._seen):
                self._apply_event(event)
                self.__dict__["_seen"] = event.seq  # one at a time: an event that fails is read again
            self.__dict__["_seen"] = head
        self.__dict__["_commits_seen"] = commits

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
            apply_event(fresh, event)
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
            cast(Any, type(self)).load_state_dict(self, fresh.state_dict())
        finally:
            d["_applying"] = False
        self._open.clear()
        for event in ledger.pending():
            self._apply_event(event)
        d["expired_decisions"] = ledger.count(CLOSE, "expired")
        d["_since_snapshot"] = fresh.__dict__["_replayed_count"]
        d["_seen"], d["_epoch"] = ledger.position()
        for event in self._unflushed:
            self._apply_event(event)

    def _apply_event(self, event: Any, own: bool = False) -> dict[str, Any] | None:
        """One :class:`~gae.ledger.Event` on this memory's state in RAM (the same function
        replays and learns live; its fields are set for its kind)."""
        d = self.__dict__
        if event.kind == DECIDE:
            detail = event.detail
            reasons = tuple(detail.get("reasons", ()))  # (none in a ledger written before referrals)
            decision = Decision(event.decision_id, event.action, float(detail["confidence"]),
                                dict(zip(detail["names"], map(float, detail["probs"]), strict=True)), event.category,
                                int(event.decided_version), float(event.at), event.source_id, bool(reasons), reasons)
            self._open[event.decision_id] = _Open(decision, event.row)
            return None
        if event.kind == CLOSE:
            if self._open.pop(event.decision_id, None) is not None and event.detail.get("reason") == "expired":
                d["expired_decisions"] += 1
            return None
        d["_applying"] = True
        try:
            result = apply_event(self, event, meet=not own)  # (this call's own learn raises on a name it lacks)
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
            applied = False
            try:
                with ledger.writing():
                    self._catch_up()
                    events, results = build(), []
                    for i, event in enumerate(events):
                        results.append(self._apply_event(event, own=True))
                        applied = True
                        if event.kind == LEARN:
                            events[i] = dataclasses.replace(event, version=self.version)
                    head = ledger.append([*self._unflushed, *events], self._seen)
                    self._write_names()
                    if self._since_snapshot >= self.snapshot_every:
                        ledger.write_snapshot(head, self.version, self._snapshot_state())
                        d["_since_snapshot"] = 0
                    ledger.count_commit()  # under the store's lock: no other memory on it commits in between
                    commits = ledger.commits()
            except BaseException:
                if applied:  # the state in RAM went ahead of a transaction that did not land
                    self._recover()
                raise
            d["_seen"], d["_unflushed"], d["_commits_seen"] = head, [], commits
            return results

    def _write_names(self) -> None:
        """Inside a write: the ledger's current names in its meta, when this call grew them (what
        a memory opened later with these names is checked against)."""
        names = (self.category_names, self.action_names)
        if names != self.__dict__.get("_names_written"):
            self._ledger.set_meta({"grown_categories": None if names[0] is None else list(names[0]),  # type: ignore[union-attr]
                                   "grown_actions": list(names[1])})
            self.__dict__["_names_written"] = names

    def _recover(self) -> None:
        """After a failed commit: this memory as the ledger holds it (best effort; the next call rebuilds otherwise)."""
        self.__dict__.update(_epoch=-1, _commits_seen=-2)  # whatever happens here, the next catch-up rebuilds
        try:
            with self._ledger.reading():  # type: ignore[union-attr]
                self._rebuild()
        except Exception:  # noqa: BLE001 - the original error is the one to raise
            pass

    def _snapshot_state(self) -> dict[str, Any]:
        """The ``state_dict`` without the pending decisions (the ledger's pending table holds them)
        and without the in-RAM logs (the ledger holds every event: a snapshot stays the size of
        the state, and a memory opened from it starts its logs there)."""
        state = cast(Any, type(self)).state_dict(self)
        extra = {key: value for key, value in state.get("_extra_state", {}).items()
                 if key not in ("pending", "expired_decisions") and not key.endswith("_log")}
        state["_extra_state"] = extra
        return state

    def sync(self) -> None:
        """Write the decisions not written yet (``durable_decisions=False``) and apply what other
        writers committed. A memory without a store has nothing to do."""
        if self._ledger is not None:
            self._write_events(list)

def replay(ledger: Ledger, memory: Any) -> Any:
    """``memory`` (in RAM, built with the ledger's first names and settings) fed every verification
    and growth of ``ledger`` in commit order: the serial replay every memory on the ledger equals."""
    for event in ledger.events(0, kinds=(LEARN, GROW)):
        apply_event(memory, event)
    return memory


def apply_event(memory: Any, event: Event, meet: bool = True) -> dict[str, Any] | None:
    """A learn or grow event on ``memory`` through its class's own methods (in RAM, not the ledger's)."""
    cls = type(memory)
    if event.kind == GROW:  # (only what is missing: a rebuild may have grown the memory to today's names first)
        _grow_to(memory, {"action_names": event.detail.get("actions"),
                          "category_names": event.detail.get("categories")})
        return None
    # a name the writer met with grow=True, added as its learn_one added it (the action, then the category),
    # so that a memory built with grow=False replays it too
    action, category = event.action, event.category
    if meet and isinstance(action, str) and action and action not in memory.action_names:
        cls.add_actions_(memory, [action])
    if (meet and isinstance(category, str) and category and memory.category_names is not None
            and category not in memory.category_names):
        cls.add_categories_(memory, [category])
    seq = int(memory.num_decisions)  # the sequence number this learn takes
    if event.source_id is None:  # as the call that learned it live: learn_one, or the checked path with its source
        result = cls.learn_one(memory, event.row, event.action, event.category, event.confirmed, event.outcome)
    else:
        result = cls._learn_checked(memory, event.row, event.action, event.category, event.confirmed, event.outcome,
                                    event.source_id)
    verified = event.detail.get("referral")  # a verified decision (verify), not a plain learn_one
    if verified is not None and not result.get("skipped", False):
        memory._observe_verified(event.category, float(verified["confidence"]), bool(event.confirmed), verified, seq)
    return result


def _grow_to(memory: Any, names: dict[str, Any]) -> None:
    """Append to ``memory`` the action and category names of ``names`` (a saved extra state) it lacks."""
    cls = type(memory)
    actions = [n for n in names.get("action_names") or () if n not in memory.action_names]
    categories = [n for n in names.get("category_names") or () if n not in (memory.category_names or ())]
    if actions:
        cls.add_actions_(memory, actions)
    if categories:
        cls.add_categories_(memory, categories)
