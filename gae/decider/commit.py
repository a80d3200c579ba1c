"""Group commit: the writes of every thread of a process on one ledger, appended in one transaction.

A :class:`~gae.Decider` on a ledger builds a call's events on the state it holds (checking
everything a call can get wrong), hands them to its ledger's :class:`GroupCommit` and learns
them once they are committed, in commit order, without any lock of the store
(:mod:`gae.decider.durable`). The committer is the one place the ledger's write lock is taken
for that: a thread queues its :class:`Appended`; when no thread of the process is committing, it
leads: it appends everything queued by then (its own call and those that arrived while the
previous commit ran) in one transaction, one flush of the disk for all of them, and wakes each
call with its sequence numbers or its error. A call carried by another's commit returns when
that commit ends.

Under the write lock only what the ledger decides is checked, against its rows, never against a
process' memory: a verification needs its decision still pending (another process may have
verified, closed or forgotten it since), a decision given an id needs that id not pending, a
closing of a decision no longer pending is dropped, and a verification made without a source
id is given the ledger's next one. Nothing is learned there: the lock is held for the appends
and the commit alone, so a call waits for the others' writes, never for their learning.

Thread safety: one committer per ledger and store object (:func:`committer`), shared by every
Decider on them; :meth:`GroupCommit.commit` may be called from any thread.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gae.ledger import Ledger
from gae.ledger.events import CLOSE, DECIDE, GROW, LEARN, Event

KNOWN = 4096  # events of the latest commits a committer keeps: its Deciders apply them without reading them back
_COMMITTERS: weakref.WeakKeyDictionary[Any, dict[str, GroupCommit]] = weakref.WeakKeyDictionary()
_REGISTRY = threading.Lock()


def committer(store: Any, name: str) -> GroupCommit:
    """The :class:`GroupCommit` of ledger ``name`` on ``store`` (one per store object and name)."""
    with _REGISTRY:
        found = _COMMITTERS.setdefault(store, {})
        if name not in found:  # (appending on a connection of its own: the Deciders read on the store's meanwhile)
            found[name] = GroupCommit(Ledger(store.writer(), name))
        return found[name]


@dataclass(eq=False)
class Appended:
    """One call's events for the ledger, and what the committer answers.

    Args:
        link: the :class:`~gae.decider.durable.LedgerLink` whose call it is (it learns the events
            once they are committed, and gives the decisions it has not written yet).
        events: the call's events, built and checked on its Decider's state.
        next_source: the source id its memory would give next (None: a memory without source ids).
        fresh: decision ids given by the caller, which must not be pending.
        seen: the last event of the state the call was built on: a decision it verifies or closes
            must have been decided by then (a later one of the same id is another decision).
        unwritten: ids of its Decider's decisions made without writing, not committed when the
            call was built (they get their sequence numbers with it, so they are exempt from ``seen``).
    """

    link: Any
    events: list[Event]
    next_source: int | None = None
    fresh: tuple[str, ...] = ()
    seen: int | None = None
    unwritten: frozenset[str] = frozenset()
    built: list[Event] = field(default_factory=list)  # the events as built (a retry starts from them)

    def __post_init__(self) -> None:
        self.built = list(self.events)
    seqs: dict[int, int] = field(default_factory=dict)  # index in ``events`` -> its sequence number
    head: int = 0  # the ledger's head once the transaction landed, and its epoch then
    epoch: int = -1
    error: BaseException | None = None
    done: bool = False


class GroupCommit:
    """The write lock of one ledger for the threads of a process (see the module)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queue: list[Appended] = []
        self._state = threading.Condition()  # guards the queue and whether a thread is committing
        self._committing = False
        self._kept = threading.Lock()  # guards the events kept (_known)
        self._dropped: set[Any] = set()  # ids of decisions not written yet that this transaction dropped
        self._known: OrderedDict[int, Event] = OrderedDict()  # the latest events committed here, by seq
        self._counters: tuple[Any, ...] | None = None  # (head, epoch, sources) after this committer's last commit,
        # with the store's data_version and commit count then: still the ledger's while neither moved

    def known(self, after: int, through: int) -> list[Event] | None:
        """The events ``after < seq <= through`` when every one of them was committed through this
        committer and is still kept (then no other process wrote between them), else None."""
        with self._kept:
            found = [self._known.get(seq) for seq in range(after + 1, through + 1)]
        return None if any(event is None for event in found) else found  # type: ignore[return-value]

    def commit(self, call: Appended) -> None:
        """Append ``call``'s events with whatever else is queued, in one transaction, and return
        once they are committed (``call.seqs`` says where each landed; an event dropped as no
        longer needed has none). Raises what the ledger refused of this call (KeyError: a decision
        no longer pending; ValueError: an id pending already), or what made the transaction fail
        (then nothing of it landed, for every call in it)."""
        with self._state:  # the leader commits what is queued; the others wait for theirs to be done
            self._queue.append(call)
            while self._committing and not call.done:
                self._state.wait()
            leading = not call.done
            if leading:
                self._committing = True
                batch, self._queue = self._queue, []
        if leading:
            try:
                failed = self._commit(batch)
                if len(batch) > 1 and isinstance(failed, Exception) and not isinstance(failed, TimeoutError):
                    for alone in batch:  # one call's failure is not the others': each again, alone (a wait
                        alone.error = None  # for the lock, or an interrupt, is every call's: not again)
                        self._commit([alone])
            finally:
                with self._state:
                    for each in batch:
                        each.done = True
                    self._committing = False
                    self._state.notify_all()
        if call.error is not None:
            raise call.error

    def _commit(self, batch: list[Appended]) -> BaseException | None:
        """One transaction for ``batch``; what made it fail (every call of it holds it), or None."""
        ledger = self.ledger
        self._dropped = set()
        taken: list[tuple[Any, list[Event]]] = []  # (link, its decisions not written yet) taken into this batch
        given: list[tuple[Any, list[int]]] = []  # (link, the sequence numbers registered with it)
        try:
            with ledger.writing():
                head, epoch, sources = self._read_counters()
                landed: list[Event] = []
                names: dict[str, list[str]] | None = None
                for call in batch:
                    link = call.link
                    unflushed = link.take_unflushed(head, self._unclaimed)  # (registered in the same step)
                    if unflushed:
                        taken.append((link, unflushed))
                        given.append((link, list(range(head + 1, head + 1 + len(unflushed)))))
                        landed += [e._replace(seq=head + 1 + j) for j, e in enumerate(unflushed)]
                        head = ledger.append(unflushed, head, move_head=False)
                    try:
                        kept, sources = self._checked(call, sources)
                    except (KeyError, ValueError) as error:
                        call.error = error
                        continue
                    names = self._grown(call, kept, names)
                    events = [call.events[i] for i in kept]
                    call.seqs = {i: head + 1 + j for j, i in enumerate(kept)}
                    given.append((link, link.register(head, events)))
                    landed += [e._replace(seq=head + 1 + j) for j, e in enumerate(events)]
                    head = ledger.append(events, head, move_head=False)
                meta: dict[str, Any] = {"head": head}
                if sources is not None:
                    meta["sources"] = sources
                if names is not None:
                    meta.update({f"grown_{key}": value for key, value in names.items()})
                ledger.set_meta(meta)
                ledger.count_commit()
                commits = ledger.commits()
                counters = (head, epoch, sources, ledger.store.data_version(), commits)
        except BaseException as error:  # nothing of the batch landed: every call in it raises this
            self._counters = None
            for link, unflushed in taken:
                link.untake(unflushed)
            for link, seqs in given:
                link.unregister(seqs)
            for call in batch:
                if call.error is None:
                    call.error = error
                    call.seqs = {}
                call.events[:] = call.built  # (as built: a retry gives source ids again)
            return error
        else:
            self._counters = counters
            with self._kept:
                for event in landed:
                    self._known[event.seq] = event
                while len(self._known) > KNOWN:
                    self._known.popitem(last=False)
            for call in batch:
                call.head, call.epoch = head, epoch
            return None

    def _unclaimed(self, link: Any, events: list[Event]) -> list[Event]:
        """:func:`unclaimed` in this committer's transaction, noting the ids it drops (a
        verification of one of them in the same transaction is checked as anyone's)."""
        kept = unclaimed(self.ledger, link, events)
        written = {id(e) for e in kept}  # (by identity: events hold arrays)
        self._dropped.update(e.decision_id for e in events if e.kind == DECIDE and id(e) not in written)
        return kept

    def _read_counters(self) -> tuple[int, int, int | None]:
        """Inside the transaction: the ledger's head, epoch and next source id, as this committer
        left them when no other connection and no other user of its store object committed since
        (SQLite's ``data_version``; Postgres cannot tell, so they are read), else read."""
        cached, ledger = self._counters, self.ledger
        if cached is not None and cached[4] == ledger.commits():
            version = ledger.store.data_version()
            if version is not None and version == cached[3]:
                return cached[0], cached[1], cached[2]
        return ledger.counters()

    def _checked(self, call: Appended, sources: int | None) -> tuple[list[int], int | None]:
        """Which of ``call``'s events to append, checked against the ledger's rows in this
        transaction, and the ledger's next source id after them. A verification made without a
        source id is given one here (the larger of the ledger's next and its memory's)."""
        ledger, events = self.ledger, call.events
        wanted = [e.decision_id for e in events if e.kind in (LEARN, CLOSE) and e.decision_id is not None]
        open_now = ledger.open_decisions([*wanted, *call.fresh]) if wanted or call.fresh else {}
        seen = call.seen
        kept: list[int] = []
        for i, event in enumerate(events):
            if event.kind in (LEARN, CLOSE) and event.decision_id is not None:
                decided = open_now.get(event.decision_id)
                if decided is not None and seen is not None and decided > seen \
                        and (event.decision_id not in call.unwritten or event.decision_id in self._dropped):
                    decided = None  # another decision of the same id, made after the call's state: not the one it saw
                if decided is None:
                    if event.kind == CLOSE and event.detail.get("reason") == "expired":
                        continue  # closed already, or verified: nothing left to expire
                    raise KeyError(f"decision {event.decision_id!r} is not pending (another writer verified, closed "
                                   "or forgot it)")
                del open_now[event.decision_id]
            elif event.kind == DECIDE and event.decision_id is not None:
                if event.decision_id in open_now and event.decision_id in call.fresh:  # (after this call's closings)
                    raise ValueError(f"id {event.decision_id!r} is already pending: verify it first or give another id")
                open_now[event.decision_id] = -1  # (pending from here on, in this transaction)
            kept.append(i)
        if call.next_source is None:
            return kept, sources
        following = max(call.next_source, sources or 0)
        for i in kept:
            event = events[i]
            if event.kind == LEARN and event.source_id is None:
                events[i] = event = event._replace(source_id=following)
            if event.kind == LEARN and event.source_id is not None:  # (as a memory counts them: learned ones)
                following = max(following, event.source_id + 1)
        return kept, following

    def _grown(self, call: Appended, kept: list[int], names: dict[str, Any] | None) -> dict[str, Any] | None:
        """The ledger's names after ``call``'s kept events, where they bring one it lacks (read
        from its meta once per transaction): what a Decider opened later is checked against.
        None while no call of the transaction brought one."""
        memory = call.link.decider.memory
        actions: list[str] = []
        categories: list[str] = []
        for i in kept:
            event = call.events[i]
            if event.kind == GROW:
                actions += list(event.detail.get("actions") or ())
                categories += list(event.detail.get("categories") or ())
            elif event.kind == LEARN:
                actions += [event.action] if isinstance(event.action, str) else []
                categories += [event.category] if isinstance(event.category, str) else []
        if memory.category_names is None:
            categories = []
        if names is None:  # (the memory's names are the ledger's as of its state, or fewer)
            if set(actions) <= set(memory.action_names) and set(categories) <= set(memory.category_names or ()):
                return None
            meta = self.ledger.meta()
            names = {"actions": list(meta.get("grown_actions") or meta["actions"]),
                     "categories": None if meta["categories"] is None
                     else list(meta.get("grown_categories") or meta["categories"])}
        for key, found in (("actions", actions), ("categories", categories)):
            for name in found:
                if names[key] is not None and name not in names[key]:
                    names[key].append(name)
        return names


def unclaimed(ledger: Ledger, link: Any, events: list[Event]) -> list[Event]:
    """Inside a write of ``ledger``: of a Decider's decisions made without writing, those to write
    now. One given an id that another writer made pending since is dropped (its caller's decision
    is lost, as a crash loses one not written yet; the id names the other's, which the Decider
    applies as it reads it). Ids the Decider drew itself are unique and not looked up."""
    prefix = link.decider._ids.prefix
    given = [e.decision_id for e in events
             if e.kind == DECIDE and e.decision_id is not None and not e.decision_id.startswith(prefix)]
    claimed = ledger.open_decisions(given) if given else {}
    return [e for e in events if not (e.kind == DECIDE and e.decision_id in claimed)]
