"""The durable ledger of a decision memory (see :mod:`gae.durable`): its events, pending
decisions and snapshots in the tables of one of :mod:`gae.episodic.store`'s stores."""

from gae.ledger.ledger import CLOSE, DECIDE, GROW, LEARN, Event, Ledger, Snapshot, ledgers

__all__ = ["CLOSE", "DECIDE", "GROW", "LEARN", "Event", "Ledger", "Snapshot", "ledgers"]
