"""The ledger's tables, as :class:`~gae.storage.Table` specs on the storage layer's checksummed-table API.

Five tables, each row under its ledger's name (several memories may share one store):
``ledger_meta`` (the head sequence number, the epoch, the names and settings the ledger was
created with, as JSON), ``ledger_events`` (every decision, verification, closing and growth, by
sequence number), ``ledger_pending`` (the decisions still open, pointing at their event),
``ledger_snapshots`` (the memory's state after a sequence number) and ``ledger_audit`` (who
forgot or undid what, when and why: counts, never content). Every row carries a checksum
(:mod:`gae.storage.tables`). The columns are those of the first ledger, so a store written
before the checksums is adopted as it is (:meth:`gae.storage.store.Store.create_tables`).
On Postgres each table is named after the store's table (``<table>_ledger_events``, ...).
"""

from __future__ import annotations

from gae.storage.tables import BLOB, INT, REAL, TEXT, Column, Table

META = Table("ledger_meta", (Column("ledger", TEXT, nullable=False), Column("key", TEXT, nullable=False),
                             Column("value", TEXT, nullable=False)), key=("ledger", "key"))

EVENTS = Table("ledger_events", (
    Column("ledger", TEXT, nullable=False), Column("seq", INT, nullable=False), Column("kind", TEXT, nullable=False),
    Column("decision_id", TEXT), Column("category", TEXT),  # category and action: JSON (a name or an index)
    Column("factors", BLOB),  # the row, float64 bytes
    Column("action", TEXT), Column("confirmed", INT), Column("outcome", TEXT), Column("source_id", INT),
    Column("decided_version", INT), Column("version", INT), Column("at", REAL),
    Column("detail", TEXT)),  # JSON
    key=("ledger", "seq"), indexes=(("decision", ("ledger", "decision_id")), ("source", ("ledger", "source_id"))))

PENDING = Table("ledger_pending", (Column("ledger", TEXT, nullable=False), Column("decision_id", TEXT, nullable=False),
                                   Column("seq", INT, nullable=False)), key=("ledger", "decision_id"))

SNAPSHOTS = Table("ledger_snapshots", (Column("ledger", TEXT, nullable=False), Column("seq", INT, nullable=False),
                                       Column("version", INT, nullable=False), Column("state", BLOB, nullable=False)),
                  key=("ledger", "seq"))  # state: torch.save of the snapshot's dict

AUDIT = Table("ledger_audit", (Column("ledger", TEXT, nullable=False), Column("at", REAL, nullable=False),
                               Column("actor", TEXT, nullable=False), Column("action", TEXT, nullable=False),
                               Column("reason", TEXT, nullable=False), Column("count", INT, nullable=False),
                               Column("seq", INT, nullable=False)))

TABLES = (META, EVENTS, PENDING, SNAPSHOTS, AUDIT)
ERASED = (EVENTS, PENDING, SNAPSHOTS)  # the tables whose deleted rows held a decision's content
