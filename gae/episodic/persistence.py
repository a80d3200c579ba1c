"""Persistence of an episodic memory: write-through to its store, and its state_dict.

:class:`Persistence` is mixed into :class:`~gae.EpisodicMemory`: every public call that changes
the memory runs inside :meth:`Persistence._transaction`, which commits its changes to the store
in one transaction (or rebuilds the index from the store when the call or the commit fails),
and the state_dict hooks refuse a state that does not fit before anything is copied.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from gae.episodic.columns import MEMORY_TYPES
from gae.episodic.records import COLUMNS, AuditRecord, AuditTrail
from gae.state_dicts import check_state_dict, load_all_or_nothing
from gae.storage.base import Change, MemoryStore, Rows, Snapshot

Call = TypeVar("Call", bound=Callable[..., Any])


def write_call(method: Call) -> Call:
    """A public call that changes the memory. With a store, the call runs holding the store's
    write lock (:meth:`~gae.storage.base.MemoryStore.exclusive`): it starts from the
    store's latest state (:meth:`Persistence._fresh` reloads when another writer committed since)
    and no other writer commits until it has, so ids never collide, the version counts every
    writer's mutations in order, and each call lands whole or not at all. A writer that cannot get
    the lock within the store's ``timeout`` raises TimeoutError with nothing written. Should the
    lock's transaction not land after the call committed into it (its own end failed, or the
    caller's enclosing ``exclusive()`` block raised), the store's rollback hook marks the index
    stale and the next call reloads it. A closed store refuses writes before anything changes.
    The whole call holds the memory's lock (threads sharing the memory take turns), outside the
    store's write lock: the store's connection serves one call at a time."""

    @functools.wraps(method)
    def call(self: Persistence, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            store = self.store
            if store is None or self._depth > 0:
                return method(self, *args, **kwargs)
            if store.closed:
                raise RuntimeError(f"{method.__name__}: the store is closed; open a memory on a new store to write")
            with store.exclusive():
                return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


class Persistence(nn.Module):
    """The store and state_dict side of :class:`~gae.EpisodicMemory` (see the module)."""

    store: MemoryStore | None
    dim: int
    capacity: int
    embeddings: Tensor
    size: Tensor
    version_counter: Tensor
    next_id: Tensor
    scope_names: list[str]
    source_ids: list[tuple[int, ...]]
    contents: list[str | None]
    audit_log: list[AuditRecord]
    max_audit: int | None
    _audit: AuditTrail  # the records audit_log copies
    _pending: Change | None
    _depth: int
    _stale: bool
    _lock: threading.RLock  # every public call holds it (EpisodicMemory)

    if TYPE_CHECKING:  # provided by EpisodicMemory
        @property
        def version(self) -> int: ...

        def _append(self, unit: Tensor, columns: dict[str, Tensor], sources: list[tuple[int, ...]],
                    texts: list[str | None]) -> None: ...

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Collect the mutations of one public call and write them to the store in one commit
        (the outermost call does; nested ones add to it). Without a store: nothing to do."""
        if self.store is None:
            yield
            return
        if self._depth == 0:  # the call reloaded at its start (_fresh): a store that moved since is a conflict
            self._pending = Change(base_version=self.version)
        self._depth += 1
        try:
            yield
        except BaseException:
            if self._depth == 1:  # the call failed half-way: the store still holds the truth
                self._pending = None
                self._reload()
            raise
        finally:
            self._depth -= 1
        if self._depth == 0:
            change, self._pending = self._pending, None
            assert change is not None
            change.version, change.next_id, change.scope_names = self.version, int(self.next_id), self.scope_names
            try:
                self.store.commit(change)
            except BaseException:
                self._reload()
                raise
            self.store.on_rollback(self._mark_stale)  # inside a hold: should it roll back, the index is ahead

    def _rows(self, unit: Tensor, columns: dict[str, Tensor], sources: list[tuple[int, ...]],
              content: list[str | None]) -> Rows:
        """New memories as the store holds them."""

        def numpy(name: str) -> np.ndarray:
            return columns[name].detach().cpu().double().numpy()

        keys = [f"#{code}" if code >= 0 else self.scope_names[-1 - code] for code in columns["scope"].tolist()]
        return Rows(seq=columns["ids"].cpu().numpy().astype(np.int64), embedding=unit.detach().float().cpu().numpy(),
                    scope=keys, memory_type=[MEMORY_TYPES[t] for t in columns["memory_type"].tolist()],
                    importance=numpy("importance"), confidence=numpy("confidence"), created_at=numpy("created_at"),
                    valid_from=numpy("valid_from"), valid_until=numpy("valid_until"), source_ids=list(sources),
                    content=content)

    def _reload(self) -> None:
        """Rebuild the index from the store (after a failed call). If the store cannot be read
        either, the memory is marked stale and every later call retries this first, so the
        index never serves or builds on changes the store did not accept."""
        assert self.store is not None
        self._stale = True
        snapshot = self.store.open(self.dim, audit_last=self.max_audit)
        self._clear()
        if snapshot is not None:
            self._restore(snapshot)
        self._stale = False

    def _mark_stale(self) -> None:
        self._stale = True

    def _fresh(self) -> None:
        """Before a call: reload from the store if a failed write left the index stale, or if
        another writer committed since this memory last read or wrote it (the stored version
        moved). A nested call (one public call made inside another) works on its caller's state."""
        if self.store is None or self._depth > 0:
            return
        if self._stale:  # a failed write: the store holds the truth (raises if it cannot be read, closed too)
            self._reload()
        elif not self.store.closed and self.store.stored_version() != self.version:  # closed: the index serves
            self._reload()

    def _clear(self) -> None:
        device = self.embeddings.device
        self.embeddings = self.embeddings.new_zeros((0, self.dim))
        for name, dtype in COLUMNS.items():
            setattr(self, name, torch.zeros(0, dtype=dtype, device=device))
        self.size.zero_()
        self.version_counter.zero_()
        self.next_id.zero_()
        self.scope_names, self.source_ids, self.contents, self.audit_log = [], [], [], []

    def _restore(self, snapshot: Snapshot) -> None:
        """The index of a store's live rows, exactly as the memory that wrote them had it."""
        rows = snapshot.rows
        if len(rows) > self.capacity:
            raise ValueError(f"the store holds {len(rows)} live memories but this memory has "
                             f"capacity={self.capacity}")
        device = self.embeddings.device
        self.scope_names = list(snapshot.scope_names)
        if len(rows):
            unknown = sorted({key for key in rows.scope if not key.startswith("#") and key not in self.scope_names})
            if unknown:
                raise ValueError(f"the store holds rows of scopes it has no name for: {unknown[:5]}")
            codes = [int(key[1:]) if key.startswith("#") else -1 - self.scope_names.index(key) for key in rows.scope]
            seq = torch.as_tensor(rows.seq, dtype=torch.int64, device=device)
            columns = {
                "ids": seq, "inserted": seq, "scope": torch.tensor(codes, dtype=torch.int64, device=device),
                "memory_type": torch.tensor([MEMORY_TYPES.index(t) for t in rows.memory_type], device=device),
                **{name: torch.as_tensor(getattr(rows, name), device=device).to(COLUMNS[name])
                   for name in ("importance", "confidence", "created_at", "valid_from", "valid_until")}}
            unit = torch.as_tensor(rows.embedding, device=device).to(self.embeddings.dtype)
            self._append(unit, columns, [tuple(s) for s in rows.source_ids], list(rows.content))
        self.version_counter.fill_(snapshot.version)
        self.next_id.fill_(snapshot.next_id)
        self.audit_log = [AuditRecord(e.action, e.time, tuple(e.ids), e.reason, e.version) for e in snapshot.audit]

    def get_extra_state(self) -> dict[str, Any]:
        return {"scope_names": list(self.scope_names), "source_ids": [list(s) for s in self.source_ids],
                "contents": list(self.contents),
                "audit_log": [[r.action, r.time, list(r.ids), r.reason, r.version] for r in self._audit]}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.scope_names = list(state["scope_names"])
        self.source_ids = [tuple(s) for s in state["source_ids"]]
        self.contents = list(state.get("contents", [None] * len(self.source_ids)))  # saved before texts: none
        self.audit_log = [AuditRecord(a, t, tuple(i), r, v) for a, t, i, r, v in state["audit_log"]]

    _resizable_rows = ("embeddings", *COLUMNS)  # allocated rows: the checkpoint's, not ours

    def _check_state(self, state_dict: Mapping[str, Any], prefix: str) -> None:
        """Refuse, before anything is copied, a state of another width, more memories than
        ``capacity``, or columns that disagree with each other (a tampered file)."""
        if self.store is not None:
            raise RuntimeError("this EpisodicMemory is backed by a store, its source of truth: loading a state_dict "
                               "would replace the index without the store; open a new memory on the store instead")
        incoming_embeddings, incoming_size = state_dict.get(prefix + "embeddings"), state_dict.get(prefix + "size")
        if isinstance(incoming_embeddings, Tensor) and tuple(incoming_embeddings.shape[1:]) != (self.dim,):
            raise ValueError(f"state_dict holds embeddings of width {tuple(incoming_embeddings.shape[1:])} "
                             f"but this memory has dim={self.dim}")
        if not isinstance(incoming_size, Tensor) or incoming_size.numel() != 1:
            return  # missing or misshapen: the generic check names it
        size = int(incoming_size)
        if size > self.capacity:
            raise ValueError(f"state_dict holds {size} memories but this memory has capacity={self.capacity}")
        rows = {name: state_dict[prefix + name].shape[0] for name in self._resizable_rows
                if isinstance(state_dict.get(prefix + name), Tensor) and state_dict[prefix + name].dim() > 0}
        short = {name: n for name, n in rows.items() if n < size}
        extra = state_dict.get(prefix + "_extra_state")
        sources = extra.get("source_ids") if isinstance(extra, dict) else None
        given = isinstance(extra, dict) and "contents" in extra  # absent: saved before texts (all None)
        texts = extra["contents"] if isinstance(extra, dict) and given else None
        if size < 0 or short or len(set(rows.values())) > 1 or (sources is not None and len(sources) != size) or (
                given and (not isinstance(texts, list) or len(texts) != size
                           or not all(t is None or isinstance(t, str) for t in texts))):
            raise ValueError(f"state_dict is inconsistent: size={size} but the columns hold rows {rows}"
                             + ("" if sources is None else f" and source_ids {len(sources)} entries")
                             + ("" if not given else f" and contents {_count(texts)}"))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, *args, **kwargs) -> None:
        check_state_dict(self, state_dict, prefix, strict)
        for name in ("embeddings", *COLUMNS):  # the store's size is the checkpoint's, not ours
            incoming = state_dict.get(prefix + name)
            if incoming is not None and incoming.shape != getattr(self, name).shape:
                setattr(self, name, getattr(self, name).new_zeros(incoming.shape))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """:meth:`torch.nn.Module.load_state_dict`, all or nothing (see
        :meth:`gae.JudgmentMemory.load_state_dict`); refused on a store-backed memory."""
        with self._lock:
            if self.store is not None:
                self._check_state(state_dict, "")  # raises: the store is the source of truth
            return load_all_or_nothing(self, super().load_state_dict, state_dict, strict, assign)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`torch.nn.Module.state_dict`, of one state: taken under the memory's lock (the
        tensors are the memory's own, as in torch: copy them before the next call changes them)."""
        with self._lock:
            return super().state_dict(*args, **kwargs)


def _count(texts: Any) -> str:
    """How a state's ``contents`` is described in its refusal."""
    return f"{len(texts)} entries" if isinstance(texts, list) else repr(texts)
