"""The durable-store interface behind :class:`~gae.EpisodicMemory`, and what travels through it.

A store is the source of truth of a memory: the tensor index is a cache of its live rows.
Every mutation of an :class:`~gae.EpisodicMemory` with a store becomes one :class:`Change`,
written by :meth:`MemoryStore.commit` in one transaction before the call returns; opening a
memory on an existing store reads a :class:`Snapshot` and rebuilds the index exactly.

Stores also answer retrieval themselves (:meth:`MemoryStore.retrieve`), with scope,
validity and tombstone filters applied by the store, so that a caller can never see
another scope's rows, and optionally with a full-text term (``w_text``).

Time is seconds, as everywhere in gae (the caller's clock: ``now`` is an argument).
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from gae.storage.errors import NewerSchema, StoreConflict, StoreCorrupted  # noqa: F401 - the interface's errors
from gae.storage.store import Store
from gae.validation import plain_ids, scope_lists

SCHEMA_VERSION = 2  # bump with a migration in each store's _migrate when the tables change (2: checksums)
MEMORY_TYPES = ("episode", "semantic")
AUDIT_ACTIONS = ("add", "evict", "delete", "expire", "reject")


@dataclass
class Rows:
    """A batch of memories as the store holds them (numpy columns of one length N).

    ``seq`` is the memory's stable integer id (EpisodicMemory's id); ``scope`` is the scope as
    text: a name, or ``'#<int>'`` for an integer scope (see :func:`scope_key`).
    """

    seq: np.ndarray  # (N,) int64
    embedding: np.ndarray  # (N, D) float32, unit norm
    scope: list[str]
    memory_type: list[str]
    importance: np.ndarray  # (N,) float64
    confidence: np.ndarray  # (N,) float64
    created_at: np.ndarray  # (N,) float64 seconds
    valid_from: np.ndarray  # (N,) float64, -inf: always
    valid_until: np.ndarray  # (N,) float64, +inf: forever
    source_ids: list[tuple[int, ...]]
    content: list[str | None] = field(default_factory=list)  # optional text, empty list: none
    sensitivity: list[str] = field(default_factory=list)  # empty list: 'normal' for all

    def __len__(self) -> int:
        return int(self.seq.shape[0])

    def contents(self) -> list[str | None]:
        return self.content if self.content else [None] * len(self)

    def sensitivities(self) -> list[str]:
        return self.sensitivity if self.sensitivity else ["normal"] * len(self)


class AuditEntry(NamedTuple):
    """One audit row: an add, evict, delete or expiry (a mutation), or a rejected admission."""

    action: str
    time: float
    ids: tuple[int, ...]
    reason: str
    version: int
    actor: str = "gae"


@dataclass
class Change:
    """One call's mutations, committed atomically: rows added, ids removed, audit rows, counters."""

    added: Rows | None = None
    removed: list[tuple[str, float, tuple[int, ...]]] = field(default_factory=list)  # (action, time, seqs)
    audit: list[AuditEntry] = field(default_factory=list)
    version: int = 0
    next_id: int = 0
    scope_names: list[str] = field(default_factory=list)
    erase: bool = False  # the deleted rows' content and embeddings must be unreadable from the files on return
    base_version: int | None = None  # the stored version this change was made on; None: do not check


@dataclass(frozen=True)
class StoreCheck:
    """What ``check()`` verified of a store, and what it found wrong (:attr:`ok`: nothing).

    Attributes:
        where: the SQLite file, or the Postgres table.
        rows, audit: memories rows (tombstoned ones too) and audit records whose checksums were verified.
        checks: what was verified, in words. skipped: what could not be, and why.
        problems: each problem found (empty: the store is sound as far as ``checks`` go).
        seconds: how long the check took.
        tables: the rows verified in each checksummed table the store's catalog lists, by name.
    """

    where: str
    rows: int
    audit: int
    checks: tuple[str, ...]
    skipped: tuple[str, ...]
    problems: tuple[str, ...]
    seconds: float
    tables: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


@dataclass
class Snapshot:
    """Everything needed to rebuild the tensor index: live rows in insertion order, and the log."""

    dim: int
    rows: Rows
    audit: list[AuditEntry]
    version: int
    next_id: int
    scope_names: list[str]


class StoreRetrieval(NamedTuple):
    """The ``k`` best memories of each query as ranked by the store (padded with -1 / ``-inf``).

    Attributes:
        ids: (Q, k) int64 memory ids (``seq``). scores: (Q, k) float64 full scores.
        similarity, recency, importance, text: (Q, k) float64 unweighted terms (0 where padded;
            ``text`` is 0 unless a text query was given).
    """

    ids: np.ndarray
    scores: np.ndarray
    similarity: np.ndarray
    recency: np.ndarray
    importance: np.ndarray
    text: np.ndarray


SNAPSHOT_COLUMNS = ("seq, embedding, scope_type, scope_id, memory_type, importance, confidence, created_at, "
                    "valid_from, valid_until, source_ids, content, sensitivity")


def rows_from_records(records: Sequence[Sequence[Any]], dim: int) -> Rows:
    """:class:`Rows` from database records in the order of :data:`SNAPSHOT_COLUMNS`, with the
    embedding already a float32 array and ``source_ids`` a sequence (each store decodes its own)."""
    def floats(j: int) -> np.ndarray:
        return np.array([r[j] for r in records], dtype=np.float64)

    embedding = np.stack([np.asarray(r[1], dtype=np.float32) for r in records]) if records else \
        np.zeros((0, dim), dtype=np.float32)
    return Rows(seq=np.array([r[0] for r in records], dtype=np.int64), embedding=embedding,
                scope=[join_scope(r[2], r[3]) for r in records], memory_type=[r[4] for r in records],
                importance=floats(5), confidence=floats(6), created_at=floats(7), valid_from=floats(8),
                valid_until=floats(9), source_ids=[tuple(r[10]) for r in records],
                content=[r[11] for r in records], sensitivity=[r[12] for r in records])


def split_scope(key: str) -> tuple[str, str]:
    """The table's (scope_type, scope_id) of a scope key: ('int', '5') for '#5', ('name', key) for a name."""
    return ("int", key[1:]) if key.startswith("#") else ("name", key)


def join_scope(scope_type: str, scope_id: str) -> str:
    """The scope key of a table's (scope_type, scope_id)."""
    return f"#{scope_id}" if scope_type == "int" else scope_id


def scope_key(scope: Any, argument: str = "scope") -> str:
    """The store's text form of a scope: a name as is, an int ``s >= 0`` (a 0-D integer tensor or
    numpy scalar too) as ``'#s'``."""
    scope = plain_ids(argument, scope, (0,), names=True)
    if isinstance(scope, str):
        if scope.startswith("#"):
            raise ValueError(f"scope names may not start with '#', got {scope!r}")
        return scope
    if isinstance(scope, bool) or not isinstance(scope, int) or scope < 0:
        raise ValueError(f"{argument} must hold names or ints >= 0, got {scope!r}")
    return f"#{scope}"


def scope_keys(scopes: Any, argument: str) -> list[str]:
    """The scope keys of one list of scopes: a list, or a 1-D integer tensor or numpy array."""
    values = plain_ids(argument, scopes, (1,), names=True)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{argument} must be a list of scopes, got {scopes!r}")
    return [scope_key(s, argument) for s in values]


def scope_filters(scopes: Any, n_queries: int) -> list[list[str] | None]:
    """Per query, the scope keys it may see (None: every scope), from EpisodicMemory's forms:
    None, a list shared by every query (or a 1-D integer tensor or array), or one list per query
    (or a 2-D integer tensor or array, one row per query)."""
    parsed = scope_lists(scopes, n_queries)
    if parsed is None:
        return [None] * n_queries
    if not parsed.per_query:
        keys = [scope_key(s, "scopes") for s in parsed.values]
        return [keys] * n_queries
    return [[scope_key(s, "scopes") for s in allowed] for allowed in parsed.values]


def check_rows(rows: Rows, dim: int) -> None:
    """Refuse rows a store must not write: wrong width, non-finite values, unknown types."""
    n = len(rows)
    if rows.embedding.ndim != 2 or rows.embedding.shape != (n, dim):
        raise ValueError(f"embedding must be ({n}, {dim}) for this store (dim={dim}), got {rows.embedding.shape}")
    if not np.isfinite(rows.embedding).all():
        raise ValueError("embedding must be finite (no NaN or Inf)")
    for name in ("importance", "confidence", "created_at"):
        values = getattr(rows, name)
        if values.shape != (n,) or not np.isfinite(values).all():
            raise ValueError(f"{name} must be ({n},) finite values, got {values!r}")
    for name in ("valid_from", "valid_until"):
        values = getattr(rows, name)
        if values.shape != (n,) or np.isnan(values).any():
            raise ValueError(f"{name} must be ({n},) values, not NaN")
    unknown = sorted({t for t in rows.memory_type if t not in MEMORY_TYPES})
    if unknown:
        raise ValueError(f"memory_type must be one of {MEMORY_TYPES}, got {unknown}")
    for column in ("scope", "memory_type", "source_ids"):
        if len(getattr(rows, column)) != n:
            raise ValueError(f"{column} must have {n} entries, got {len(getattr(rows, column))}")
    for column in ("content", "sensitivity"):
        if getattr(rows, column) and len(getattr(rows, column)) != n:
            raise ValueError(f"{column} must be empty or have {n} entries, got {len(getattr(rows, column))}")


def check_query(queries: Any, dim: int, now: float, k: int) -> np.ndarray:
    q = np.asarray(queries, dtype=np.float32)
    if q.ndim != 2 or q.shape[1] != dim or q.shape[0] == 0:
        raise ValueError(f"queries must be (Q, {dim}) with Q >= 1, got shape {q.shape}")
    if not np.isfinite(q).all():
        raise ValueError("queries must be finite (no NaN or Inf)")
    if not isinstance(now, (int, float)) or isinstance(now, bool) or not math.isfinite(now):
        raise ValueError(f"now must be a finite number of seconds, got {now!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    norms = np.linalg.norm(q, axis=1, keepdims=True)
    return q / np.maximum(norms, 1e-12)


def dumps_ids(ids: Sequence[int]) -> str:
    return json.dumps([int(i) for i in ids])


class MemoryStore(Store):
    """Where an :class:`~gae.EpisodicMemory` keeps its memories durably: a :class:`~gae.storage.store.Store`
    (connection, transactions, locks, checksummed tables) with the episodic tables.

    A store holds one memory of one embedding width (``dim``, fixed at the first
    :meth:`open`). Implementations: :class:`~gae.storage.SQLiteStore` (embedded, the default)
    and :class:`~gae.storage.PostgresStore` (a Postgres server with pgvector).
    """

    dim: int | None
    erases: bool = False  # commit honours Change.erase and purge() exists (MemoryStore.purge)

    @abc.abstractmethod
    def open(self, dim: int, audit_last: int | None = None) -> Snapshot | None:
        """Create the tables for width ``dim`` if the store is new (and return None), or check the
        width and return the stored :class:`Snapshot`, its audit the last ``audit_last`` records
        (all with None). Raises ValueError on another width."""

    def commit(self, change: Change) -> None:
        """Write one change in one transaction: all of it lands, or none of it. Writers are
        serialized by the store's write lock (:meth:`exclusive`; inside a caller's hold the change
        joins it, as a savepoint); with ``change.base_version`` set, a store at any other version
        raises :class:`StoreConflict` and writes nothing. With ``change.erase``, the deleted data
        is unreadable from the store's files when the hold ends (:meth:`_erase_now`)."""
        if self.dim is None:
            raise RuntimeError("open(dim) the store before committing to it")
        if change.added is not None:
            check_rows(change.added, self.dim)
        with self.exclusive():
            self._commit(change)
            self._erase_after |= change.erase

    @abc.abstractmethod
    def _commit(self, change: Change) -> None:
        """The change's statements inside the held write transaction, as a savepoint (a failure
        leaves the transaction as it was), after checking ``change.base_version``."""

    @abc.abstractmethod
    def stored_version(self) -> int:
        """The version counter as committed now (another writer's commits included)."""

    @abc.abstractmethod
    def retrieve(self, queries: Any, now: float, k: int = 5, scopes: Any = None, *,
                 weights: tuple[float, float, float] = (0.60, 0.25, 0.15), tau: float = 15.0,
                 text: str | Sequence[str] | None = None, w_text: float = 0.0) -> StoreRetrieval:
        """Rank the live, valid rows each query may see by ``w_sim cos + w_rec exp(-age/tau) +
        w_imp importance (+ w_text text_match)``, in the store. ``scopes`` takes the forms of
        :meth:`gae.EpisodicMemory.retrieve`: None, one list (or 1-D integer tensor or numpy array)
        shared by every query, or one list per query (or a 2-D tensor or array, one row per query)."""

    @abc.abstractmethod
    def audit(self, last: int | None = None) -> list[AuditEntry]:
        """Every audit row, in order; with ``last``, the last ``last`` of them (an int >= 0)."""

    @abc.abstractmethod
    def check(self, *, raises: bool = True) -> StoreCheck:
        """Verify the whole store: the database's own integrity check, and that every row, audit
        record and meta value is the one written (its checksum), the rows of every checksummed
        table (:meth:`~gae.storage.store.Store.create_tables`) included. Returns a :class:`StoreCheck`;
        with ``raises`` (default) a problem raises :class:`StoreCorrupted` naming it instead.
        Changes nothing."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection and everything else the store opened (the data stays)."""

    @abc.abstractmethod
    def purge(self) -> None:
        """Make everything deleted so far unreadable from the store's files, or raise saying why
        it cannot (then :attr:`erases` is False)."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_weights(weights: Any, tau: float, w_text: float, text: Any, n_queries: int) -> list[str | None]:
    """Validate the ranking arguments; return the text query of each query (None: no text term)."""
    if len(weights) != 3 or not all(isinstance(w, (int, float)) and math.isfinite(w) for w in weights):
        raise ValueError(f"weights must be three finite numbers (w_sim, w_rec, w_imp), got {weights!r}")
    if not isinstance(tau, (int, float)) or not tau > 0 or not math.isfinite(tau):
        raise ValueError(f"tau must be a positive number of seconds, got {tau!r}")
    if not isinstance(w_text, (int, float)) or not math.isfinite(w_text):
        raise ValueError(f"w_text must be a finite number, got {w_text!r}")
    if text is None:
        return [None] * n_queries
    texts = [text] * n_queries if isinstance(text, str) else list(text)
    if len(texts) != n_queries or not all(t is None or isinstance(t, str) for t in texts):
        raise ValueError(f"text must be one string or one per query ({n_queries}), got {text!r}")
    return texts


def padded(n_queries: int, k: int) -> StoreRetrieval:
    zeros = np.zeros((n_queries, k))
    return StoreRetrieval(np.full((n_queries, k), -1, dtype=np.int64), np.full((n_queries, k), -np.inf), zeros,
                          zeros.copy(), zeros.copy(), zeros.copy())
