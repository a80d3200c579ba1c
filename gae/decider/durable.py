"""A Decider on a durable ledger: every decide and verify committed before it returns.

:class:`LedgerLink` is what a :class:`~gae.Decider` built with a store holds: the ledger
(:class:`gae.ledger.Ledger`, its rows in the store's tables) and the write protocol. Each
decision, verification, closing and growth is an event with a sequence number; the state is
the latest snapshot (one every ``snapshot_every`` verifications) plus the verifications after
it. Opening a Decider on an existing ledger loads the snapshot and replays the rest with the
memory's fast engine: it equals the Decider that never stopped, bit for bit.

Many writers, one ledger: a write call builds its events on the state its process holds (after
reading what others committed, when the store says they did: a read, no lock), checking
everything it can get wrong; its ledger's group commit (:mod:`gae.decider.commit`) appends them
under the ledger's write lock with those of the process' other threads, checked there only
against the ledger's rows (the decision still pending, the id free), and commits. Then, without
any lock of the store, the process applies every event up to its own in commit order: the
others' as it reads them, its own as built. So the write lock is held for appends and a
commit, never for learning; every process and thread on one ledger ends with the state of one
memory replaying the ledger in commit order; and a ``decide`` is scored on every verification
committed before it started, its process' own included.

With ``durable_decisions=False`` a decide writes nothing (microseconds): its event goes out
with the next commit (any write call, or ``sync``). A crash then loses the pending decisions
not yet written, never a verification.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from gae import validation as check
from gae.decider.commit import Appended, committer, unclaimed
from gae.decider.decision import recorded
from gae.decider.refer import Referral
from gae.decider.verified import learned, verified_of
from gae.ledger import Ledger
from gae.ledger.events import CLOSE, DECIDE, GROW, LEARN, Event, apply_event, grow_to, snapshot_parts
from gae.ledger.ledger import snapshot_data


class LedgerLink:
    """The ledger side of one :class:`~gae.Decider` (see the module): it holds the Decider and
    applies events through the Decider's own ``_apply``."""

    def __init__(self, decider: Any, store: Any, name: str, snapshot_every: int, durable_decisions: bool) -> None:
        self.snapshot_every = check.check_int("snapshot_every", snapshot_every, low=1)
        if not isinstance(durable_decisions, (bool, np.bool_)):
            raise TypeError(f"durable_decisions must be a bool, got {durable_decisions!r}")
        self.durable_decisions = bool(durable_decisions)
        self.decider = decider
        self.ledger = Ledger(store, name)
        self.seen = 0  # the sequence number of the last event the state holds
        self.epoch = 0  # the ledger's deletions the state has seen
        self.since_snapshot = 0  # verifications learned since the latest snapshot
        self.unflushed: list[Event] = []  # decisions made without the write lock, not written yet
        self.mine: dict[int, tuple[Event, bool]] = {}  # this link's events committed, not applied yet (seq ->
        self.results: dict[int, Any] = {}  # (event, applied already)); what applying each of them returned
        self.due: list[tuple[int, int, int, bytes]] = []  # snapshots to write: (seq, version, epoch, state)
        self.registry = threading.Lock()  # guards mine and unflushed (the committer's thread touches them)
        self.committer = committer(store, name)
        self.commits_seen = -1  # the store object's commit count the state has seen
        self.names_written: tuple | None = None
        self.closed = False
        self.marked: tuple[int, ...] | None = None  # the memory as the ledger left it (see check_memory)
        memory = decider.memory
        ledger = self.ledger
        with decider._lock, ledger.writing():
            meta = ledger.meta()
            names = _names(memory)
            ledger.require_meta(meta, ("kind", "settings", "head", "epoch", *names))
            if not meta:
                ledger.set_meta({"kind": type(memory).__name__, "settings": memory.settings(), "head": 0, "epoch": 0,
                                 "deleted": 0,
                                 **{key: None if value is None else list(value) for key, value in names.items()}})
                self.names_written = (memory.category_names, memory.action_names)
                if int(memory.num_decisions):  # a memory that learned before: the ledger starts from its state
                    ledger.write_snapshot(0, memory.version, self.snapshot_state())
            else:
                ledger.check_rows(adopt=True)
                extra = _check_meta(meta, ledger, memory)
                if int(memory.num_decisions):
                    raise ValueError(f"ledger {name!r} in {store!r} holds its own state, but the memory has learned "
                                     f"{int(memory.num_decisions)} decisions: give the Decider a memory that has "
                                     "learned nothing (it loads the ledger's state), or open a new ledger")
                if extra["actions"] or extra["categories"]:  # grow=True: names the ledger lacks, added there
                    head = ledger.append([Event(GROW, detail=extra)], ledger.position()[0])
                    del head
                self.rebuild()
                self.write_names()
            ledger.count_commit()
        self.commits_seen = ledger.commits()
        self.mark()

    # -- the memory as the ledger left it -------------------------------------------------------------
    def mark(self) -> None:
        """Note the memory as the ledger left it (:attr:`gae.DecisionMemory.state_mark`)."""
        self.marked = self.decider.memory.state_mark

    def check_memory(self, closing: bool = False) -> None:
        """Refuse to go on when ``decider.memory`` was changed outside the Decider since its last
        call (the ledger no longer describes it), or after :meth:`close` (unless ``closing``)."""
        if self.closed and not closing:
            raise RuntimeError(f"this Decider left ledger {self.ledger.name!r} (close()): open a new Decider")
        now = self.decider.memory.state_mark
        if now != self.marked:
            raise RuntimeError(f"decider.memory was changed outside its Decider (it learned, loaded, grew or had a "
                               f"parameter updated in place: version {now[0]}, the ledger's "
                               f"{self.marked[0] if self.marked else None}): on a ledger, learn and grow through the "
                               "Decider, or every process would hold another state; open a new Decider on the "
                               "store to get the ledger's state back")

    # -- reading and replaying ----------------------------------------------------------------------
    def refresh(self) -> None:
        """Apply what other writers committed (a read, no write lock)."""
        self.check_memory()
        with self.ledger.reading():
            self.catch_up()
        self.mark()

    def catch_up(self, force: bool = False) -> None:
        """Apply what was committed since this Decider's last call, in commit order (all of it
        again after a deletion: a rebuild). Inside the Decider's lock and a read or write of the
        ledger. Unless ``force``, nothing is read when no other connection committed and no other
        Decider on this store object did."""
        ledger = self.ledger
        commits = ledger.commits()
        if not ledger.changed() and not force and commits == self.commits_seen:
            return
        head, epoch = ledger.position()
        if epoch != self.epoch:
            if self.mine:  # this Decider's own events, committed and not applied: their answers first
                self.advance_through(ledger.events(self.seen))
            self.rebuild()
        elif head != self.seen:
            self.advance_through(ledger.events(self.seen))
            self.seen = head
        self.commits_seen = commits
        self.mark()  # (what was committed is the ledger's: a call that raises after this keeps it)

    def advance_through(self, events: list[Event]) -> None:
        """Apply ``events`` (read from the ledger, in order) past :attr:`seen`: this Decider's own
        as it built them, keeping what applying each returned for its caller (:attr:`results`),
        the others' as read. A snapshot falls due on the learn event that completes
        ``snapshot_every`` verifications; the Decider whose event it is writes it
        (:meth:`write_due`)."""
        for event in events:
            if event.seq <= self.seen:
                continue
            with self.registry:
                own = self.mine.pop(event.seq, None)
            try:
                if own is None:
                    self.apply(event)
                elif not own[1]:  # (a decision made without writing is applied already)
                    self.results[event.seq] = self.apply(own[0], own=True)
            except BaseException:
                self.epoch = -1  # an event that cannot be applied: the next call rebuilds from the ledger
                raise
            self.seen = event.seq  # one at a time: an event that fails is read again
            if event.kind == LEARN and self.since_snapshot >= self.snapshot_every:
                self.since_snapshot = 0
                if own is not None:  # (saved now: the memory moves on)
                    self.due.append((event.seq, int(self.decider.memory.version), self.epoch,
                                     snapshot_data(self.snapshot_state())))

    def write_due(self, due: list[tuple[int, int, int, bytes]]) -> None:
        """Write the snapshots that fell due on this Decider's events (taken from :attr:`due`
        under its lock), outside that lock, through the group commit's connection: each in a
        write transaction of its own, unless a deletion moved the epoch since (its state would
        bring deleted decisions back). A snapshot that fails to write is skipped (a reopen
        replays a little more)."""
        ledger = self.committer.ledger
        for seq, version, epoch, state in due:
            try:
                with ledger.writing():
                    if ledger.position()[1] == epoch:
                        ledger.write_snapshot_data(seq, version, state)
            except Exception:  # noqa: BLE001 - a snapshot shortens a replay; the events are the state
                pass

    def apply(self, event: Event, own: bool = False) -> Any:
        result = self.decider._apply(event, own)
        if event.kind == LEARN:
            self.since_snapshot += 1
        return result

    # -- this Decider's events in flight ----------------------------------------------------------
    def register(self, head: int, events: list[Event]) -> list[int]:
        """The committer's thread, inside the transaction: this call's ``events`` go under
        ``head + 1, ...`` (the decisions made without writing register in :meth:`take_unflushed`).
        Returns their sequence numbers."""
        seqs = list(range(head + 1, head + 1 + len(events)))
        with self.registry:
            for seq, event in zip(seqs, events, strict=True):
                self.mine[seq] = (event, False)
        return seqs

    def unregister(self, seqs: list[int]) -> None:
        """The committer's thread: the transaction that gave ``seqs`` did not land."""
        with self.registry:
            for seq in seqs:
                self.mine.pop(seq, None)

    def take_unflushed(self, head: int | None = None, keep: Any = None) -> list[Event]:
        """The decisions made without writing, to append now: with ``head`` (the committer's
        thread, inside its transaction), registered under ``head + 1, ...`` in the same step, so
        that a rebuild meanwhile finds each of them, in :attr:`unflushed` or in flight; ``keep(link,
        events)`` says which to write (the others are dropped)."""
        with self.registry:
            taken = self.unflushed
            if keep is not None and taken:
                taken = keep(self, taken)  # (raising, it takes nothing)
            self.unflushed = []
            if head is not None:
                for seq, event in enumerate(taken, start=head + 1):
                    self.mine[seq] = (event, True)
        return taken

    def untake(self, events: list[Event]) -> None:
        """The committer's thread: ``events`` were not written after all; kept for the next commit."""
        with self.registry:
            self.unflushed[:0] = events

    def replayed(self, before: int | None = None) -> tuple[Any, Referral, int]:
        """A memory and a referral in RAM holding the ledger's state just before event ``before``
        (default: all of it): the latest snapshot before it, then the verifications and growths
        after it; and how many verifications that replayed."""
        ledger, decider = self.ledger, self.decider
        meta = ledger.meta()
        fresh = decider.memory.empty_like(None if meta["categories"] is None else tuple(meta["categories"]),
                                          tuple(meta["actions"]))
        referral = decider.referral.fresh()
        snapshot = ledger.snapshot(before)
        start = 0
        if snapshot is not None:
            state, referral_state = snapshot_parts(snapshot.state)
            extra = state.get("_extra_state", {})
            grow_to(fresh, extra.get("action_names") or (), extra.get("category_names") or ())
            fresh.load_state_dict(state, quiet=True)
            referral.load_state(referral_state)
            start = snapshot.seq
        if before is None:  # names only grow: the memory keeps those it met in events deleted since
            grow_to(fresh, decider.memory.action_names, decider.memory.category_names or ())
        count = 0
        for event in ledger.events(start, before, kinds=(LEARN, GROW)):
            if event.kind == GROW:
                apply_event(fresh, event)
                continue
            learned(fresh, referral, event.row, event.action, event.category, event.confirmed, event.outcome,
                    event.source_id, verified_of(event))
            count += 1
        return fresh, referral, count

    def rebuild(self) -> None:
        """The Decider as the ledger holds it now: the replayed state and referral, its pending
        decisions, the expired count, and the decisions this Decider has not written yet."""
        decider, ledger = self.decider, self.ledger
        ledger.check_rows()
        following = decider.memory.next_source_id()  # (ids given before the rebuild are never given again)
        fresh, referral, count = self.replayed()
        pending, expired, position = ledger.pending(), ledger.count(CLOSE, "expired"), ledger.position()
        memory = decider.memory  # (every read done: a damaged row refused above leaves the Decider as it was)
        grow_to(memory, fresh.action_names, fresh.category_names or ())
        memory.load_state_dict(fresh.state_dict(), quiet=True)
        if following is not None:  # nor any the ledger holds (one written before they were recorded restarts low)
            largest = ledger.largest_source()
            memory.note_sources_(max(following, -1 if largest is None else largest + 1))
        decider.referral = referral
        book = decider._book
        book.open.clear()
        for event in pending:
            decider._apply(event)
        book.expired = expired
        self.since_snapshot = count
        self.seen, self.epoch = position
        with self.registry:  # this Decider's events the replay holds: applied, their answers unknown
            for seq in [seq for seq in self.mine if seq <= self.seen]:
                if not self.mine[seq][1]:
                    self.results.setdefault(seq, None)
                del self.mine[seq]
            # its decisions made without writing: kept, or in a commit in flight (applied again when it lands: no)
            unwritten = [event for _, (event, applied) in sorted(self.mine.items()) if applied] + list(self.unflushed)
        for event in unwritten:
            decider._apply(event)
        self.mark()

    # -- writing --------------------------------------------------------------------------------
    def look(self) -> None:
        """Inside the Decider's lock: apply what was committed since its last call, when the store
        says something may have been (SQLite's ``data_version``, this store object's commits) and
        the ledger's head or epoch moved (one read of its meta, no transaction, never waiting for
        a commit in progress). Events committed through this process' committer are applied as
        built, others' read in one read transaction."""
        ledger = self.ledger
        commits = ledger.commits()
        if not ledger.changed() and self.commits_seen == commits:
            return
        head, epoch = ledger.position()
        if epoch == self.epoch and head >= self.seen:
            known = self.committer.known(self.seen, head) if head > self.seen else []
            if known is not None:
                self.advance_through(known)
                self.commits_seen = commits
                self.mark()  # (what was committed is the ledger's)
                return
        with ledger.reading():
            self.catch_up(force=True)

    def close(self) -> None:
        """Leave the ledger: later calls raise at once, then what is not written yet is written
        (a decision made while this runs is refused, never left unwritten). If that write fails,
        the Decider stays open and this raises."""
        with self.decider._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self.write(list, closing=True)
        except BaseException:
            with self.decider._lock:
                self.closed = False
            raise

    def write(self, build: Any, decision: bool = False, fresh: tuple[str, ...] = (),
              closing: bool = False) -> list[Any]:
        """The write protocol (see the module): under the Decider's lock, apply what others
        committed and ``build()`` this call's events on that state (it raises, changing nothing,
        on bad input); outside it, append them with the process' other calls (the group commit:
        the write lock, one transaction); then, under the Decider's lock again, apply every event
        up to this call's in commit order. A decision with ``durable_decisions=False`` is applied
        and kept for the next commit instead. Returns what applying each event returned (None for
        an event the ledger dropped: an expiry of a decision no longer pending). ``fresh``: ids the
        caller gave its decisions, which the ledger must not hold pending."""
        decider = self.decider
        with decider._lock:
            self.check_memory(closing)
            self.look()
            events = build()
            if decision and not self.durable_decisions:
                results = [self.apply(event, own=True) for event in events]
                with self.registry:
                    self.unflushed.extend(events)
                self.mark()
                return results
            with self.registry:  # (nothing to write: a sync or an expiry check that found none is a read; not
                idle = not events and not self.unflushed and not any(  # while another call's commit carries
                    applied for _, applied in self.mine.values())  # decisions not written before: it may fail)
            if idle:
                self.mark()
                return []
            with self.registry:  # (its decisions not committed yet: they land with this call or before it)
                unwritten = frozenset([e.decision_id for e in self.unflushed if e.decision_id is not None]
                                      + [e.decision_id for e, applied in self.mine.values()
                                         if applied and e.decision_id is not None])
            call = Appended(self, events, decider.memory.next_source_id(), fresh, self.seen, unwritten)
        try:
            self.committer.commit(call)
        except BaseException:
            with decider._lock:
                for event in events:
                    if event.kind == DECIDE:
                        decider._made.pop(event.decision_id, None)
            raise
        with decider._lock:
            if self.seen < call.head:  # every event up to the transaction's, in commit order
                known = self.committer.known(self.seen, call.head) if self.epoch == call.epoch else None
                if known is None:  # another process wrote in between (or a deletion): read it
                    with self.ledger.reading():
                        self.catch_up(force=True)
                else:  # all of them committed here: applied as built, nothing read back
                    self.advance_through(known)
            self.mark()
            results = [self.results.pop(call.seqs[i], None) if i in call.seqs else None for i in range(len(events))]
            for event in events:
                if event.kind == DECIDE:
                    decider._made.pop(event.decision_id, None)
            due, self.due = self.due, []
        if due:
            self.write_due(due)
        return results

    def write_names(self) -> None:
        """Inside a write: the ledger's current names in its meta, when this call grew them (what a
        Decider opened later with these names is checked against)."""
        memory = self.decider.memory
        names = (memory.category_names, memory.action_names)
        if names != self.names_written:
            self.ledger.set_meta({"grown_categories": None if names[0] is None else list(names[0]),
                                  "grown_actions": list(names[1])})
            self.names_written = names

    def recover(self, version: int) -> None:
        """After a failed deletion: the Decider as the ledger holds it (best effort; the next call
        rebuilds otherwise), its memory's :attr:`version` as it was before the call (``version``)
        where the replay counted fewer steps (names it grew at once that the events grew one by one)."""
        self.epoch, self.commits_seen = -1, -2  # whatever happens here, the next catch-up rebuilds
        try:
            with self.ledger.reading():
                self.rebuild()
            memory = self.decider.memory
            if memory.version < version:
                memory.note_rebuilt_(version - 1)  # (moves it to version: it only grows)
        except Exception:  # noqa: BLE001 - the original error is the one to raise
            pass
        self.mark()

    def snapshot_state(self) -> dict[str, Any]:
        """The memory's ``state_dict`` without its in-RAM logs (the ledger holds every event: a
        snapshot stays the size of the state, and a Decider opened from it starts its logs there)
        and the referral's state. The pending decisions are the ledger's pending table."""
        memory = self.decider.memory
        state = memory.state_dict()
        extra = state.get("_extra_state")
        if isinstance(extra, dict):
            state["_extra_state"] = {key: value for key, value in extra.items() if not key.endswith("_log")}
            following = memory.next_source_id()
            if following is not None:  # a log of no decisions, whose next default source id goes on from here
                state["_extra_state"]["decision_log"] = {"max_events": extra["decision_log"]["max_events"],
                                                         "next_source": following}
        return {"memory": state, "referral": self.decider.referral.state()}

    # -- forgetting -----------------------------------------------------------------------------
    def forget(self, wanted: list[int], erase: bool, reason: str) -> int:
        def seqs(ledger: Ledger) -> list[int]:
            found = ledger.sourced(sorted(set(wanted)))  # decisions pending, skipped and learned
            missing = sorted(set(wanted) - {source for _, source in found})
            if missing:
                raise ValueError(f"source_ids {missing} are not in the ledger (never decided or learned with that "
                                 "source_id, or forgotten already)")
            return [seq for seq, _ in found]

        return self.delete(seqs, "forget", erase, reason)

    def undo(self, n: int, erase: bool, reason: str) -> None:
        def seqs(ledger: Ledger) -> list[int]:
            found = [seq for seq, _ in ledger.learned(last=n)]
            if len(found) < n:
                raise ValueError(f"undo_({n}): the ledger holds {len(found)} learned decision(s)")
            return found

        self.delete(seqs, "undo", erase, reason)

    def delete(self, seqs_of: Any, action: str, erase: bool, reason: str) -> int:
        """Delete events (``seqs_of(ledger)``, which raises for a call that cannot be done) with
        the decisions they verified, rebuild from what remains (a snapshot at the head records it
        for every process), then erase when asked. Returns the verifications removed."""
        self.check_memory()
        ledger, memory = self.ledger, self.decider.memory
        version, changed, flushed = memory.version, False, []
        try:
            with ledger.writing():
                self.catch_up(force=True)
                flushed = self.take_unflushed(  # (in the ledger now: the rebuild must not apply them twice)
                    None, lambda link, events: unclaimed(ledger, link, events))
                head = ledger.append(flushed, self.seen)  # this Decider's position moves once it commits
                seqs = seqs_of(ledger)
                changed = True
                removed = ledger.delete(seqs, action, reason, getattr(ledger.store, "actor", "gae"))
                self.rebuild()
                memory.note_rebuilt_(version)
                ledger.write_snapshot(head, memory.version, self.snapshot_state())
                self.since_snapshot = 0
                ledger.count_commit()
                self.commits_seen = ledger.commits()
        except BaseException:
            self.untake(flushed)  # not written after all: kept for the next commit
            if changed:
                self.recover(version)
            raise
        self.mark()
        if erase:
            ledger.erase()
        return removed

    # -- the past -------------------------------------------------------------------------------
    def decision(self, id: str) -> Any:
        """Past decision ``id`` as its decide event records it (KeyError: not in the ledger)."""
        with self.ledger.reading():
            event = self.ledger.decision(id) if isinstance(id, str) else None
        if event is None:
            raise KeyError(f"decision {id!r} is not in the ledger")
        return recorded(event)

    def explain(self, id: str) -> Any:
        """Past decision ``id`` explained by the ledger's state just before it (see ``explain_decision``).
        A category that state had not met (a growing memory abstained on it) is added to that copy,
        so the explanation says so: no prototype, no recommendation."""
        self.check_memory()
        ledger = self.ledger
        with ledger.reading():
            self.catch_up()
            event = ledger.decision(id) if isinstance(id, str) else None
            if event is None:
                raise KeyError(f"decision {id!r} is not in the ledger")
            # the state it was made on: the ledger up to the last event its Decider had seen (a decision kept
            # for a later commit, durable_decisions=False, is written after others' commits; a ledger written
            # before "after" was recorded: just before the decision)
            after = event.detail.get("after")
            past = self.replayed(before=after + 1 if type(after) is int and 0 <= after < event.seq else event.seq)[0]
        self.mark()
        category, names = event.category, past.category_names
        if isinstance(category, str) and names is not None and category not in names:
            past.add_categories_([category])
        return past.explain(event.row, category)


def _names(memory: Any) -> dict[str, tuple[str, ...] | None]:
    return {"categories": memory.category_names, "actions": memory.action_names, "factors": memory.factor_names}


def _check_meta(meta: dict[str, Any], ledger: Ledger, memory: Any) -> dict[str, list[str]]:
    """Check a memory against the ledger it is opened on: its kind, factors and settings (a setting
    the ledger lacks, written before the setting existed, counts as its default) and its names (the
    ledger's, or a start of them, or with ``memory.grow`` more). Grows the memory to the ledger's
    names where it has a start of them; returns the names the ledger lacks (to add). ValueError
    naming every difference."""
    kind = type(memory).__name__
    differs = [f"kind ({meta['kind']!r} there, {kind!r} here)"] if meta["kind"] != kind else []
    stored_factors = None if meta["factors"] is None else tuple(meta["factors"])
    if stored_factors != memory.factor_names:
        differs.append(f"factors ({list(stored_factors or [])} there, {list(memory.factor_names)} here)")
    settings, defaults = memory.settings(), type(memory).default_settings()
    for key in sorted(settings):
        there, here = meta["settings"].get(key, defaults.get(key)), settings[key]
        if there != here:
            differs.append(f"{key} ({there!r} there, {here!r} here)")
    if (meta["categories"] is None) != (memory.category_names is None):
        differs.append("categories (one of the two ignores categories)")
    extra: dict[str, list[str]] = {"actions": [], "categories": []}
    mine = {"actions": memory.action_names, "categories": memory.category_names}
    for key in ("categories", "actions"):
        if meta[key] is None or mine[key] is None:
            continue
        now = tuple(meta.get(f"grown_{key}") or meta[key])  # the ledger's names today (a growth appends to them)
        here = tuple(mine[key])
        if now[:len(here)] == here:
            continue  # the memory grows to the ledger's names when it loads the ledger's state
        if here[:len(now)] == now and memory.grow:
            extra[key] = list(here[len(now):])
            continue
        differs.append(f"{key} ({list(now)} there, {list(here)} here: give the memory the ledger's names, or a "
                       f"start of them{'' if memory.grow else ', or build it with grow=True to add names'})")
    if differs:
        raise ValueError(f"ledger {ledger.name!r} in {ledger.store!r} was created for another memory: "
                         + "; ".join(differs))
    return extra
