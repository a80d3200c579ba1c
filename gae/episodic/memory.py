"""EpisodicMemory: a bounded tensor store of embedded traces with scopes, validity, deletes and audit."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor

from gae import validation as check
from gae.episodic.admission import Admission, AdmissionPolicy, add_arguments
from gae.episodic.audit import AuditedPersistence
from gae.episodic.columns import (
    memory_type_column,
    per_memory,
    scope_column,
    source_rows,
)
from gae.episodic.persistence import write_call
from gae.episodic.records import COLUMNS, AuditTrail
from gae.episodic.retrieving import SUBSET_FROM, RetrievingMixin
from gae.episodic.scorer import RetrievalScorer
from gae.episodic.text import TextMixin
from gae.storage.base import Change, MemoryStore

__all__ = ["EVICTIONS", "MAX_AUDIT", "SUBSET_FROM", "EpisodicMemory"]
EVICTIONS = ("lowest_score", "fifo", "importance_recency")
MAX_AUDIT = 10_000  # memory ids the audit records an EpisodicMemory keeps name, by default (a store keeps all)


class EpisodicMemory(TextMixin, RetrievingMixin, AuditedPersistence):
    r"""A bounded store of embedded traces, retrieved by :class:`~gae.RetrievalScorer`.

    Every memory has a unit-norm embedding, ``created_at`` and validity window (seconds), an
    importance in [0, 1], a scope (an int or a name), a type (episode | semantic), a
    confidence, provenance (``source_ids``) and a stable id. Retrieval ranks, for each query,

    .. math:: w_{sim} \cos(q, m) + w_{rec} e^{-(now - t_m)/\tau} + w_{imp}\, importance_m

    over the memories the query may see: scope in its allowed scopes, ``valid_from <= now <
    valid_until``, not deleted. Over ``capacity`` the eviction rule removes memories:
    ``'lowest_score'`` (the original rule: the lowest score against the current query),
    ``'fifo'`` (oldest inserted) or ``'importance_recency'`` (lowest ``importance * recency``,
    query-independent). Given ``query`` and ``now``, a batch added at once evicts exactly what
    adding its memories one by one with that query and time would (their scores do not change
    between them); without them each call defaults to its own last embedding and latest time.

    ``version`` increases by one on every mutation (add, eviction, delete, expiry) and the
    audit log holds one record per mutation and per refused admission. Deletes are physical
    in this index; the audit keeps their record. Time is explicit: ``now`` is an argument.
    ``audit_log`` (a copy, oldest first) keeps the newest records that name at most
    ``max_audit`` memory ids in all (10,000 by default, about 2 MB when memories are added one
    at a time and less in batches; a record naming none counts as one; the newest record
    always stays; ``None`` keeps every record). :meth:`state_dict` carries them, and a
    ``store`` also writes every record to its audit table, which keeps the whole trail
    (``store.audit()``) while a memory reopened on it holds the newest.

    With a ``store`` (:class:`~gae.storage.SQLiteStore`, :class:`~gae.storage.PostgresStore`) the
    store is the source of truth: each call that mutates the memory (``add``, ``delete``,
    ``expire``, ``admit_and_add``, evictions included) writes all it did, rows, tombstones,
    audit records and counters, in one transaction before it returns. If that write fails,
    the index is rebuilt from the store (so it never runs ahead of it) and the error is
    raised. Building a memory on a store that already holds one restores its index exactly:
    rows in insertion order, ids, version, scope names, provenance and audit.

    Thread safety: one memory may be shared by threads. Every public call (``add``, ``delete``,
    ``expire``, ``admit_and_add``, ``retrieve``, ``column``, ``state_dict``, ``load_state_dict``)
    holds the memory's lock (a :class:`threading.RLock`) from its checks to its last write, the
    store's write-through included (taken before the store's write lock, so one store connection
    serves one call at a time), so calls apply one after another in the order the lock was taken:
    ids are unique, every add a call acknowledged is there until deleted or evicted, ``version``
    only grows, the audit log lists the mutations in that order, and a retrieval sees the state
    before or after each write, never half of one. ``column`` returns a copy; ``copy.deepcopy``
    and pickle copy one state and give the copy a lock of its own. Not covered: writing the
    buffers directly, moving the memory (``to``) while other threads call it, and one store
    object shared by several memories in several threads (give each memory its own store, on
    one file or database: the store serializes their writers).

    Args:
        dim: embedding width D.
        capacity: memories kept. Default: 30 (the original design).
        scorer: the :class:`~gae.RetrievalScorer`; default weights 0.60/0.25/0.15, tau 15 s.
        eviction: one of ``'lowest_score'``, ``'fifo'``, ``'importance_recency'``.
        device: where the tensor index lives.
        store: a :class:`~gae.storage.MemoryStore` to write through to and restore from. Default:
            None (in-process only).
        max_audit: the memory ids the audit records kept in memory may name in all, the newest
            records kept (an int >= 1), or None for every record. Default: 10,000.
        embedder: what :meth:`remember` and :meth:`recall` embed texts with
            (:mod:`gae.episodic.embedders`); default: all-MiniLM-L6-v2 on first use (``dim=384``).

    Examples::

        >>> memory = EpisodicMemory(2, capacity=2)
        >>> memory.add(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0.9, 0.1]), now=0.0).tolist()
        [0, 1]
        >>> memory.retrieve(torch.tensor([[1.0, 0.1]]), now=1.0, k=1).ids.tolist()
        [[0]]
    """

    embeddings: Tensor
    size: Tensor
    version_counter: Tensor
    next_id: Tensor

    def __init__(self, dim: int, capacity: int = 30, *, scorer: RetrievalScorer | None = None,
                 eviction: str = "lowest_score", device: torch.device | str | None = None,
                 store: MemoryStore | None = None, max_audit: int | None = MAX_AUDIT, embedder: Any = None) -> None:
        super().__init__()
        self.__dict__["_lock"] = threading.RLock()  # every public call holds it (see the class)
        self.dim = check.check_int("dim", dim, low=1)
        self.__dict__["_max_audit"] = None if max_audit is None else check.check_int("max_audit", max_audit, low=1)
        self.capacity = check.check_int("capacity", capacity, low=1)
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")
        self.eviction = eviction
        self.scorer = scorer if scorer is not None else RetrievalScorer()
        self.register_buffer("embeddings", torch.zeros(0, dim, device=device))
        for name, dtype in COLUMNS.items():
            self.register_buffer(name, torch.zeros(0, dtype=dtype, device=device))
        self.register_buffer("size", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("version_counter", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("next_id", torch.zeros((), dtype=torch.int64, device=device))
        self.scope_names: list[str] = []
        self.source_ids: list[tuple[int, ...]] = []  # provenance, row-aligned with the columns
        self.contents: list[str | None] = []  # each memory's text or None, row-aligned with the columns
        self._audit = AuditTrail(self.max_audit)  # read through audit_log
        if device is not None:
            self.scorer.to(device)
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a gae.storage.MemoryStore or None, got {type(store).__name__}")
        self.store = store
        self.embedder = embedder
        self._pending: Change | None = None  # the mutations of the call under way, for the store
        self._depth = 0
        self._stale = False  # a failed write could not be rolled back from the store yet
        if store is not None:
            snapshot = store.open(dim, audit_last=self.max_audit)
            if snapshot is not None:
                self._restore(snapshot)

    def __len__(self) -> int:
        return int(self.size)

    def column(self, name: str) -> Tensor:
        """The live rows of one column, oldest first: ``'embeddings'`` (N, D, unit norm) or a
        per-memory column (``ids``, ``created_at``, ``importance``, ``scope``, ``memory_type``,
        ``confidence``, ``valid_from``, ``valid_until``, ``inserted``), each (N,). A copy, taken
        under the memory's lock: writing it changes nothing, and calls of other threads after it
        do not change it (writes go through ``add`` / ``delete``).

        Raises:
            ValueError: an unknown column name.
        """
        if name != "embeddings" and name not in COLUMNS:
            raise ValueError(f"name must be 'embeddings' or one of {list(COLUMNS)}, got {name!r}")
        with self._lock:  # the size and the rows of one state
            return self._column(name).clone()

    def _column(self, name: str) -> Tensor:
        """The live rows of a column (the module's dict directly: ``getattr`` costs a microsecond)."""
        buffers = self._buffers
        return cast(Tensor, buffers[name])[: int(cast(Tensor, buffers["size"]))]

    # -- adding -----------------------------------------------------------------------------
    @torch.no_grad()
    @write_call
    def add(self, embeddings: Tensor, importance: Tensor | float, *, created_at: Tensor | float | None = None,
            scope: Any = 0, memory_type: str | Sequence[str] = "episode", confidence: Any = 1.0,
            source_ids: Sequence[Sequence[int]] | Tensor | np.ndarray | None = None, valid_from: Any = None,
            valid_until: Any = None, query: Tensor | None = None, now: float | None = None,
            content: Sequence[str | None] | None = None) -> Tensor:
        """Store B memories, then evict down to ``capacity``; returns their (B,) ids.

        Args:
            embeddings: (B, D) float, normalised here.
            importance: (B,) or one value, in [0, 1].
            created_at: (B,) or one time in seconds. Default: ``now``, else 0.
            scope: one scope (int or name) or one per memory: a list, or a 1-D integer tensor (any
                device) or numpy array (of ints or names); one scope may be a 0-D tensor or numpy
                scalar. Names are registered on first use.
            memory_type: ``'episode'`` or ``'semantic'``, one or one per memory.
            confidence: (B,) or one float. Default: 1.
            source_ids: per memory, the ids of the episodes it came from: a list of lists (or of
                1-D integer tensors or arrays), or a (B, S) integer tensor or array. Default: none.
            valid_from, valid_until: (B,) or one time. Default: always valid.
            query: (D,) the current query, for ``'lowest_score'`` eviction. Default: the last
                embedding added (the most recent context).
            now: the current time in seconds, for eviction scores. Default: the latest ``created_at``.
            content: per memory, its text (or None), kept by the store for full-text search
                (``w_text``); the tensor index does not hold it. Default: none.
        """
        self._fresh()
        device = self.embeddings.device
        x = check.check_factors(embeddings, self.dim, device, "embeddings", dtype=self.embeddings.dtype,
                                limit=check.LEARN_LIMIT)
        n = x.shape[0]
        importance = per_memory("importance", importance, n, device, low=0.0, high=1.0)
        now = None if now is None else check.check_real("now", now, low=-float("inf"))  # before it defaults created_at
        created = per_memory("created_at", created_at if created_at is not None else
                             (now if now is not None else 0.0), n, device, dtype=torch.float64)
        now_value = float(created.max()) if now is None else now
        scopes_of_new, new_scope_names = scope_column(scope, n, self.scope_names, device)
        columns = {
            "created_at": created, "importance": importance,
            "scope": scopes_of_new, "memory_type": memory_type_column(memory_type, n, device),
            "confidence": per_memory("confidence", confidence, n, device, low=0.0, high=1.0),
            "valid_from": per_memory("valid_from", -float("inf") if valid_from is None else valid_from, n, device,
                                           dtype=torch.float64, finite=False),
            "valid_until": per_memory("valid_until", float("inf") if valid_until is None else valid_until, n, device,
                                            dtype=torch.float64, finite=False),
        }
        inverted = (columns["valid_from"] > columns["valid_until"]).nonzero()
        if inverted.numel():
            i = int(inverted[0])
            raise ValueError(f"valid_from must be <= valid_until, got {float(columns['valid_from'][i])} > "
                             f"{float(columns['valid_until'][i])} for memory {i}")
        sources = source_rows(source_ids, n)
        if query is not None:
            query = check.check_factors(query.reshape(1, -1) if isinstance(query, Tensor) else query,
                                        self.dim, device, "query", dtype=self.embeddings.dtype)
        if isinstance(content, str):
            raise TypeError(f"content must be one string (or None) per memory ({n}), got the single string {content!r}")
        texts = list(content) if content is not None else []
        if content is not None and (len(texts) != n or not all(t is None or isinstance(t, str) for t in texts)):
            raise ValueError(f"content must be one string (or None) per memory ({n}), got {content!r}")
        with self._transaction():
            self.scope_names.extend(new_scope_names)  # only now: a refused add registers nothing
            ids = torch.arange(int(self.next_id), int(self.next_id) + n, device=device)
            columns["ids"] = ids
            columns["inserted"] = ids  # insertion order, for FIFO
            unit = nnf.normalize(x.to(self.embeddings.dtype), dim=-1)
            self._append(unit, columns, sources, texts)
            if self._pending is not None:
                self._pending.added = self._rows(unit, columns, sources, texts)
            self.next_id += n
            self._record("add", now_value, ids, "")
            overflow = int(self.size) - self.capacity
            if overflow > 0:
                probe = query.to(self.embeddings.dtype) if query is not None else \
                    self.embeddings[int(self.size) - 1: int(self.size)]
                self._evict(overflow, probe, now_value)
        return ids

    def _append(self, unit: Tensor, columns: dict[str, Tensor], sources: list[tuple[int, ...]],
                texts: list[str | None]) -> None:
        start, n = int(self.size), unit.shape[0]
        needed = start + n
        self._reserve(needed)
        self.embeddings[start:needed] = unit
        for name, values in columns.items():
            getattr(self, name)[start:needed] = values
        self.source_ids.extend(sources)
        self.contents.extend(texts or [None] * n)
        self.size.fill_(needed)

    def _reserve(self, needed: int) -> None:
        """Room for ``needed`` rows: the buffers grow by doubling (amortised O(1) per memory) into
        new zero tensors holding the live rows; the single-decision path writes into them in place."""
        if needed > self.embeddings.shape[0]:
            start = int(self.size)
            rows = max(needed, 2 * self.embeddings.shape[0], 16)
            for name in ("embeddings", *COLUMNS):
                old = getattr(self, name)
                grown = old.new_zeros((rows, *old.shape[1:]))
                grown[:start] = old[:start]
                setattr(self, name, grown)

    def _eviction_scores(self, query: Tensor, now: float) -> Tensor:
        age = (now - self._column("created_at")).float()
        if self.eviction == "fifo":
            return self._column("inserted").double()
        if self.eviction == "importance_recency":
            return (self._column("importance") * torch.exp(-age / self.scorer.tau)).double()
        return self.scorer._scores(query, self._column("embeddings"), age, self._column("importance"))[0].double()

    def _evict(self, count: int, query: Tensor, now: float) -> None:
        scores = self._eviction_scores(query, now)
        # the lowest scores go; ties: the older (lower row) first, like one-by-one eviction
        order = torch.argsort(scores, stable=True)
        rows = order[:count]
        evicted = self._column("ids")[rows]
        self._remove(rows)
        self._record("evict", now, evicted, self._eviction_reason())

    def _remove(self, rows: Tensor) -> None:
        keep = torch.ones(int(self.size), dtype=torch.bool, device=rows.device)
        keep[rows] = False
        survivors = keep.nonzero().squeeze(1)  # in row order: insertion order is kept
        kept = survivors.numel()
        for name in ("embeddings", *COLUMNS):
            column = self._buffers[name]
            assert column is not None
            column[:kept] = column.index_select(0, survivors)  # a new tensor: no overlap with the target
        removed = set(rows.tolist())
        self.source_ids = [s for i, s in enumerate(self.source_ids) if i not in removed]
        self.contents = [t for i, t in enumerate(self.contents) if i not in removed]
        self.size.fill_(kept)

    # -- deleting -----------------------------------------------------------------------------
    @torch.no_grad()
    @write_call
    def delete(self, ids: Sequence[int] | Tensor | np.ndarray, *, now: float = 0.0, reason: str = "deleted",
               erase: bool = False) -> int:
        """Remove the memories with these ids; unknown ids are an error. Returns how many went.

        ``ids``: a list, or an integer tensor (any device) or numpy array, of any shape (flattened).
        A deleted memory's content and embedding leave the store's row at once (the audit keeps
        who, when, why and the ids, never the content). ``erase=True`` also guarantees that, when
        the call returns, they cannot be read back from any of the store's files (write-ahead log
        and full-text index included; docs/store.md): a store that cannot promise it
        (``store.erases`` False) refuses, changing nothing. Without a store there are no files."""
        self._fresh()
        now = check.check_real("now", now, low=-float("inf"))
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a string, got {reason!r}")
        if not isinstance(erase, bool):
            raise TypeError(f"erase must be a bool, got {erase!r}")
        if erase and self.store is not None and not self.store.erases:
            why = "; ".join(getattr(self.store, "erasure_problems", list)()) or "docs/store.md"
            raise ValueError(f"erase=True: {type(self.store).__name__} cannot guarantee that deleted data leaves its "
                             f"files when the call returns ({why}); delete without erase, or fix that first")
        plain = check.plain_ids("ids", ids, None)
        try:
            raw = torch.as_tensor(plain, device=self.embeddings.device).reshape(-1)
        except (TypeError, ValueError, RuntimeError, OverflowError):  # None, text, ragged lists, > int64
            raise TypeError(f"ids must be a list or tensor of integer memory ids, got {ids!r}") from None
        if raw.numel() and (raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool):
            raise TypeError(f"ids must be integers, got {raw.tolist()[:5]} ({raw.dtype})")
        wanted = raw.long()
        wanted = torch.tensor(list(dict.fromkeys(wanted.tolist())), dtype=torch.int64, device=wanted.device)
        present = torch.isin(wanted, self._column("ids"))
        if not bool(present.all()):
            raise ValueError(f"ids not in the memory: {wanted[~present].tolist()}")
        if wanted.numel() == 0:
            return 0
        rows = torch.isin(self._column("ids"), wanted).nonzero().squeeze(1)
        with self._transaction():
            self._remove(rows)
            self._record("delete", now, wanted, reason)
            if erase and self._pending is not None:
                self._pending.erase = True
        return int(wanted.numel())

    @torch.no_grad()
    @write_call
    def expire(self, now: float) -> int:
        """Remove every memory whose validity has ended (``valid_until <= now``)."""
        self._fresh()
        now = check.check_real("now", now, low=-float("inf"))
        rows = (self._column("valid_until") <= now).nonzero().squeeze(1)
        if rows.numel() == 0:
            return 0
        expired = self._column("ids")[rows]
        with self._transaction():
            self._remove(rows)
            self._record("expire", now, expired, "valid_until <= now")
        return int(rows.numel())

    # -- admission ----------------------------------------------------------------------------
    @write_call
    def admit_and_add(self, traces: Sequence[dict[str, Any]], policy: AdmissionPolicy, *, now: float,
                      query: Tensor | None = None) -> Tensor:
        """Store the traces the policy accepts (one batch), log a 'reject' record for each refusal.

        A trace is a dict with ``embedding`` (D,), ``importance`` and the fields the policy reads
        (``outcome``, ``quality``, ``scope``); ``confidence``, ``source_ids``, ``memory_type``,
        ``created_at``, ``valid_from`` and ``valid_until`` are optional and stored as given.
        """
        self._fresh()
        now = check.check_real("now", now, low=-float("inf"))
        if not callable(getattr(policy, "admit", None)):
            raise TypeError(f"policy must be an AdmissionPolicy, got {policy!r}")
        if isinstance(traces, (str, bytes, Mapping)) or not isinstance(traces, Sequence):
            raise TypeError(f"traces must be a list of dicts, got {type(traces).__name__}")
        for i, trace in enumerate(traces):
            if not isinstance(trace, Mapping):
                raise TypeError(f"traces[{i}] must be a dict, got {trace!r}")
        device = self.embeddings.device
        accepted: list[dict[str, Any]] = []
        refusals: list[str] = []
        for trace in traces:
            verdict: Admission = policy.admit(trace)
            if verdict.accepted:
                accepted.append(trace)
            else:
                refusals.append(verdict.reason)
        ids = torch.zeros(0, dtype=torch.int64, device=device)
        with self._transaction():  # the adds and the refusals land in the store together
            ids = self._admit(accepted, refusals, ids, now, query)
        return ids

    def _admit(self, accepted: list[dict[str, Any]], refusals: list[str], ids: Tensor, now: float,
               query: Tensor | None) -> Tensor:
        if accepted:  # a bad accepted trace raises here, before any refusal is logged
            ids = self.add(**add_arguments(accepted, now, self.embeddings.device), query=query, now=now)
        for reason in refusals:
            self._record("reject", now, (), reason)
        return ids
