"""A Decider on a ledger killed (SIGKILL) at many points loses nothing it acknowledged.

A child process decides and verifies in a loop on a Decider given a store, printing an
acknowledgement line after each call returns; the parent kills it after a varying number of
acknowledgements (so the kill lands somewhere inside the next call: its learning, its commit, a
snapshot), reopens the ledger and checks: every acknowledged verification is one learn event,
every acknowledged skip one close event, every acknowledged decision is pending, learned or
closed; at most the one call in flight landed unacknowledged; the reopened Decider equals the
ledger's serial replay (its memory and its referral); and a new verification of a decision left
pending works. The same on a
real Postgres (pgserver). Then kills aimed inside a snapshot write and inside a ``forget_`` (the
child wraps the ledger's method to announce it and wait there), on both stores.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from gae import Decider
from gae.ledger import CLOSE, DECIDE, LEARN, Ledger
from tests.test_ledger_concurrency import close, make_store, new_memory, replay, same

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES, ACTIONS, FACTORS = ["a", "b"], ["approve", "reject"], 4
LINE_TIMEOUT = 120.0  # seconds to wait for one line of the child (its start imports torch)


# -- the Decider, its state, the serial replay ----------------------------------------------------
def open_memory(kind: str, where: str, snapshot_every: int) -> Decider:
    """A Decider on the ledger ``judgment`` of the store at ``where`` (tests.test_ledger_concurrency's memory)."""
    return Decider(new_memory(), store=make_store(kind, where), snapshot_every=snapshot_every)


def assert_replays(decider: Decider, ref: Decider, what: str, version: bool = True) -> None:
    """``decider``'s state is ``ref``'s: every tensor of the memory, its extra state but the in-RAM
    logs (a Decider opened from a snapshot starts its logs there, by design), and the referral.
    The pending decisions are compared apart."""
    assert decider.referral.state() == ref.referral.state(), f"{what}: the referral differs from the serial replay's"
    got, want = decider.memory.state_dict(), ref.memory.state_dict()
    bad = [k for k, v in want.items() if isinstance(v, torch.Tensor) and not torch.equal(got[k], v)]
    assert not bad, f"{what}: tensors differ from the serial replay: {bad}"

    def extra(state: dict[str, Any]) -> dict[str, Any]:  # (after a forget the version moves past the old one)
        return {k: v for k, v in state["_extra_state"].items()
                if k not in ("pending", "expired_decisions", *(() if version else ("updates",)))
                and not k.endswith("_log")}

    assert same(extra(got), extra(want)), f"{what}: the extra state differs from the serial replay's"
    if version:
        assert decider.version == ref.version


# -- the child -----------------------------------------------------------------------------------
def say(line: str) -> None:
    """One line in one write (print writes its pieces apart when unbuffered: a kill could cut a line)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def child_main(kind: str, where: str, run: str, snapshot_every: str, hook: str = "none", at: str = "1") -> None:
    """Decide and verify until killed, printing ``ack <call> <id>`` once each call has returned
    (``call verify <id>`` before each verification). ``hook``: ``snapshot`` / ``delete`` / ``erase``
    wrap that Ledger method so that its ``at``-th call prints ``inside <hook>`` and waits to be
    killed (after writing, before the commit, for the first two; before erasing for the last);
    with ``delete`` or ``erase`` the child forgets one of its learned decisions every few calls."""
    torch.set_num_threads(1)
    calls, wanted = [0], int(at)
    if hook != "none":
        original = getattr(Ledger, {"snapshot": "write_snapshot_data"}.get(hook, hook))

        def wrapped(self: Ledger, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if hook == "erase" and calls[0] == wanted:
                say("inside erase")
                time.sleep(600)
            result = original(self, *args, **kwargs)
            if calls[0] == wanted:
                say(f"inside {hook}")
                time.sleep(600)
            return result

        setattr(Ledger, original.__name__, wrapped)
    memory = open_memory(kind, where, int(snapshot_every))
    rng = random.Random(int(run))
    learned: list[int] = []
    say("ready")
    for i in range(100_000):
        source = int(run) * 100_000 + i
        decision = memory.decide([rng.random() for _ in range(FACTORS)], rng.choice(CATEGORIES), id=f"r{run}-{i}",
                                 source_id=source)
        say(f"ack decide {decision.id}")
        pending = memory.pending()
        if pending and rng.random() < 0.75:
            pick = pending[rng.randrange(len(pending))]
            skip = rng.random() < 0.15
            say(f"call verify {pick.id}")
            memory.verify(pick.id, rng.choice(ACTIONS), skip=skip)
            say(f"ack {'skip' if skip else 'verify'} {pick.id}")
            if not skip and pick.source_id is not None:
                learned.append(pick.source_id)
        if hook in ("delete", "erase") and i % 4 == 3 and learned:
            victim = learned.pop(0)
            say(f"call forget {victim}")
            memory.forget_([victim], erase=hook == "erase")
            say(f"ack forget {victim}")


CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from tests.test_ledger_crash import child_main; " \
        "child_main(*sys.argv[2:])"


class Child:
    """A child process whose stdout lines the parent reads with a timeout (a reader thread)."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.err = folder / f"child-{uuid.uuid4().hex[:8]}.err"
        self._log = open(self.err, "w")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), *args], stdout=subprocess.PIPE,
                                        stderr=self._log, text=True, cwd=ROOT)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.endswith("\n"):  # (a line cut by the kill was never said)
                self.lines.put(line.strip())
        self.lines.put(None)

    def line(self) -> str:
        try:
            line = self.lines.get(timeout=LINE_TIMEOUT)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"the child said nothing for {LINE_TIMEOUT} s:\n{self.err.read_text()[-4000:]}") \
                from None
        if line is None:
            self.process.wait()
            raise AssertionError(f"the child ended ({self.process.returncode}):\n{self.err.read_text()[-4000:]}")
        return line

    def kill(self) -> list[str]:
        """SIGKILL; the lines it printed before dying that were not read yet."""
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(timeout=60) == -signal.SIGKILL
        self._log.close()
        rest = []
        while (line := self.lines.get(timeout=LINE_TIMEOUT)) is not None:
            rest.append(line)
        return rest


class Acked:
    """What the children (and the parent) were told, and what may have landed untold."""

    def __init__(self) -> None:
        self.decided: set[str] = set()
        self.verified: set[str] = set()
        self.skipped: set[str] = set()
        self.forgotten: set[str] = set()  # decision ids whose source the child was told it forgot
        self.unacked_learned: set[str] = set()  # the calls in flight at a kill that landed anyway
        self.unacked_closed: set[str] = set()
        self.unacked_decided: set[str] = set()

    def take(self, line: str) -> None:
        words = line.split()
        if words[0] == "ack":
            {"decide": self.decided, "verify": self.verified, "skip": self.skipped}.get(words[1], set()).add(words[2])


def check_after_kill(kind: str, where: str, acked: Acked, snapshot_every: int,
                     in_flight: str | None = None, version: bool = True) -> Decider:
    """The ledger against what was acknowledged, the reopened Decider against its serial replay;
    then one acknowledged pending decision verified on it. Returns the reopened Decider (open)."""
    store = make_store(kind, where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        events = ledger.events(0)
        pending = [e.decision_id for e in ledger.pending()]
    learn_ids = Counter(e.decision_id for e in events if e.kind == LEARN)
    close_ids = Counter(e.decision_id for e in events if e.kind == CLOSE)
    decide_ids = Counter(e.decision_id for e in events if e.kind == DECIDE)
    assert max([*learn_ids.values(), *close_ids.values(), *decide_ids.values(), 1]) == 1, "an event landed twice"
    assert not set(learn_ids) & set(close_ids)
    assert acked.verified - acked.forgotten <= set(learn_ids), "an acknowledged verification was lost"
    assert acked.skipped <= set(close_ids), "an acknowledged skip was lost"
    assert acked.decided - acked.forgotten <= set(pending) | set(learn_ids) | set(close_ids), \
        "an acknowledged decision was lost"
    assert set(pending) == set(decide_ids) - set(learn_ids) - set(close_ids)
    # what landed without an acknowledgement: at most the call in flight at each kill
    new_learned = set(learn_ids) - acked.verified - acked.unacked_learned
    new_closed = set(close_ids) - acked.skipped - acked.unacked_closed
    new_decided = set(decide_ids) - acked.decided - acked.unacked_decided
    assert len(new_learned | new_closed) + len(new_decided) <= 1, (new_learned, new_closed, new_decided)
    assert not (new_learned | new_closed) or new_learned | new_closed == {in_flight}
    acked.unacked_learned |= new_learned
    acked.unacked_closed |= new_closed
    acked.unacked_decided |= new_decided
    ref = replay(ledger)
    store.close()

    reopened = open_memory(kind, where, snapshot_every)
    assert_replays(reopened, ref, "the reopened memory", version)
    assert [d.id for d in reopened.pending()] == pending == [d.id for d in ref.pending()]
    survivors = [i for i in pending if i in acked.decided]
    if survivors:  # the Decider goes on after the crash: a decision acknowledged before it is verified
        assert reopened.verify(survivors[0], "reject")["skipped"] is False
        acked.verified.add(survivors[0])
        ledger = reopened._durable.ledger
        with ledger.reading():
            assert ledger.count(LEARN) == sum(learn_ids.values()) + 1
    return reopened


def crash_loop(kind: str, where: str, folder: Path, kill_points: list[int], snapshot_every: int) -> Acked:
    """One child per kill point on one ledger, each killed after printing that many lines."""
    acked = Acked()
    for run, kill_after in enumerate(kill_points):
        child = Child(folder, kind, where, str(run), str(snapshot_every))
        assert child.line() == "ready"
        said = [child.line() for _ in range(kill_after)]  # acks, and "call verify" lines before each verify
        time.sleep(run % 4 * 0.003)  # (where in the next call the kill lands: any point is correct)
        said += child.kill()  # somewhere inside the call after the last line read (or a later one)
        for line in said:
            acked.take(line)
        in_flight = said[-1].split()[2] if said[-1].startswith("call verify") else None
        close(check_after_kill(kind, where, acked, snapshot_every, in_flight))
    return acked


def check_snapshots_were_crossed(kind: str, where: str, acked: Acked, snapshot_every: int) -> None:
    store = make_store(kind, where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        snapshot, (head, _) = ledger.snapshot(), ledger.position()
        learned = ledger.count(LEARN)
    store.close()
    assert learned >= 2 * snapshot_every and snapshot is not None and 0 < snapshot.seq <= head
    assert acked.verified and acked.decided - acked.verified - acked.skipped, "nothing was left pending"


# -- SIGKILL at many points ----------------------------------------------------------------------
def test_sqlite_ledger_killed_at_a_few_points_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "ledger.db")
    # a last kill late enough that two snapshot periods of verifications land without counting on how far
    # the child ran past the last line read (13 left 9 or 10 learned, by timing)
    acked = crash_loop("sqlite", path, tmp_path, [3, 8, 19], snapshot_every=5)
    check_snapshots_were_crossed("sqlite", path, acked, 5)


@pytest.mark.slow
def test_sqlite_ledger_killed_at_many_points_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "ledger.db")
    points = [1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 14, 17, 23]  # around and across the snapshots (one every 5 learns)
    acked = crash_loop("sqlite", path, tmp_path, points, snapshot_every=5)
    check_snapshots_were_crossed("sqlite", path, acked, 5)


# -- Postgres (pgserver) -----------------------------------------------------------------------
def test_postgres_ledger_killed_at_a_few_points_loses_nothing_acknowledged(dsn, tmp_path):
    acked = crash_loop("postgres", dsn, tmp_path, [4, 7, 10, 15], snapshot_every=5)
    check_snapshots_were_crossed("postgres", dsn, acked, 5)


# -- kills aimed inside a snapshot write and a forget ------------------------------------------
def aimed_kill(kind: str, where: str, folder: Path, hook: str, at: int, snapshot_every: int) -> tuple[Acked, str]:
    """A child killed inside the ``at``-th call of the hooked Ledger method; what it was told,
    and the line of the call in flight (``call verify <id>`` or ``call forget <source>``)."""
    acked, in_flight = Acked(), ""
    child = Child(folder, kind, where, "0", str(snapshot_every), hook, str(at))
    while (line := child.line()) != f"inside {hook}":
        acked.take(line)
        if line.startswith("call "):
            in_flight = line
    assert child.kill() == []
    return acked, in_flight


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_kill_inside_a_snapshot_write_keeps_the_committed_verification_and_the_snapshot_before(kind, tmp_path,
                                                                                                request):
    # a snapshot is written once the verification it follows has committed and been learned (its own
    # transaction: learning is never under the write lock), so a kill there finds the verification in
    # the ledger, unacknowledged, and the snapshot not written: a reopen replays it from the one before
    where = str(tmp_path / "ledger.db") if kind == "sqlite" else request.getfixturevalue("dsn")
    acked, in_flight = aimed_kill(kind, where, tmp_path, "snapshot", at=4, snapshot_every=1)
    assert in_flight.startswith("call verify")
    victim = in_flight.split()[2]
    store = make_store(kind, where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        snapshot = ledger.snapshot()
        learned = ledger.events(0, kinds=(LEARN,))
        pending = [e.decision_id for e in ledger.pending()]
    store.close()
    assert len(acked.verified) == 3 and [e.decision_id for e in learned[:3]] == sorted(acked.verified)
    assert len(learned) == 4 and learned[-1].decision_id == victim, "the fourth verification committed"
    assert victim not in pending
    assert snapshot is not None and snapshot.seq == learned[-2].seq and snapshot.version == 3, \
        "the latest snapshot is the third verification's: the fourth's never landed"
    reopened = check_after_kill(kind, where, acked, 1, in_flight=victim)
    assert victim not in [d.id for d in reopened.pending()]
    close(reopened)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_kill_inside_a_forget_forgets_nothing_and_the_forget_can_be_made_again(kind, tmp_path, request):
    where = str(tmp_path / "ledger.db") if kind == "sqlite" else request.getfixturevalue("dsn")
    acked, in_flight = aimed_kill(kind, where, tmp_path, "delete", at=2, snapshot_every=3)
    assert in_flight.startswith("call forget")
    victim = int(in_flight.split()[2])
    store = make_store(kind, where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        _, epoch = ledger.position()
        sources = [e.source_id for e in ledger.events(0, kinds=(LEARN,))]
        forgotten_one = ledger.audit()
    store.close()
    assert epoch == 1 and len(forgotten_one) == 1, "the first forget committed, the second did not"
    assert victim in sources, "the forget in flight deleted nothing"
    acked.forgotten = {i for i in acked.verified if int(i.split("-")[1]) not in sources}
    assert len(acked.forgotten) == 1
    reopened = check_after_kill(kind, where, acked, 3, version=False)
    assert reopened.forget_([victim]) == 1
    close(reopened)
    store = make_store(kind, where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        assert victim not in [e.source_id for e in ledger.events(0, kinds=(LEARN,))]
        assert ledger.position()[1] == 2
    ref = replay(ledger)
    store.close()
    again = open_memory(kind, where, 3)
    assert_replays(again, ref, "reopened after the forget", version=False)
    close(again)


def test_a_kill_after_a_forget_committed_before_its_erase_keeps_it_forgotten(tmp_path):
    where = str(tmp_path / "ledger.db")
    acked, in_flight = aimed_kill("sqlite", where, tmp_path, "erase", at=1, snapshot_every=3)
    assert in_flight.startswith("call forget")
    victim = int(in_flight.split()[2])
    store = make_store("sqlite", where)
    ledger = Ledger(store, "judgment")
    with ledger.reading():
        _, epoch = ledger.position()
        sources = [e.source_id for e in ledger.events(0, kinds=(LEARN,))]
        decided = {e.decision_id for e in ledger.events(0, kinds=(DECIDE,))}
    ref = replay(ledger)
    store.close()
    assert epoch == 1 and victim not in sources, "the forget was committed before its erase began"
    assert f"r0-{victim}" not in decided, "the forgotten decision's decide event went with it"
    reopened = open_memory("sqlite", where, 3)
    assert_replays(reopened, ref, "reopened after the forget", version=False)
    close(reopened)
