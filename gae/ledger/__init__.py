"""The durable ledger of a decision memory: its events, pending decisions and snapshots in the
checksummed tables of one of :mod:`gae.storage`'s stores (:class:`Ledger`), and how its events
are applied to a memory (:mod:`gae.ledger.events`)."""

from gae.ledger.events import CLOSE, DECIDE, GROW, LEARN, Event, apply_event, grow_to, replay, snapshot_parts
from gae.ledger.ledger import Ledger, Snapshot, ledgers

__all__ = ["CLOSE", "DECIDE", "GROW", "LEARN", "Event", "Ledger", "Snapshot", "apply_event", "grow_to", "ledgers",
           "replay", "snapshot_parts"]
