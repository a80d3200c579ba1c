"""Evaluation traces: one JSON line per scored decision, and an exact replay of every line.

A trace says why a memory answered what it did, and lets anyone check it later: each line
names the state the answer was computed on, the answer, what shaped it and what was learned
after it. :func:`replay` rebuilds every state from a checkpoint and recomputes every answer.

Records (JSON Lines, one object a line, all with ``kind`` and ``run``):

- ``header``: a run starts. ``memory`` (``judgment`` | ``knn`` | ``retrieval``), ``config``
  (the constructor's arguments), ``version`` of the state it starts from, ``checkpoint``.
- ``decision``: one scored decision. ``id`` (its source id, by which ``forget_`` removes it,
  or its sequence number), ``version``, the decision (``x``, ``category``), the ``answer``
  (action index or null for an abstention) and ``probs`` (the answer's is its confidence), ``shaped`` (what
  the answer came from, below), ``learned`` (the verified ``action``, ``confirmed`` and
  ``skip`` learned right after scoring, or null for a score-only call), ``call`` (the writer's
  call it came in, numbered from 0 in the run) and ``deleted`` (the decisions forgotten or
  memories deleted so far in the run).
- ``parameters``: the trainable parameters changed between calls (an optimizer step on the
  attention): their values and the ``version`` after.
- ``forget`` / ``delete``: ``JudgmentMemory.forget_(source_ids)`` /
  ``RetrievalMemory.delete(ids)`` went through the writer: the ids, how many went, the
  ``version`` after and ``deleted``.

``version`` is ``{"updates", "hash", "since"}``: the memory's monotonic update counter
(``memory.version``), the :func:`state_hash` of its parameters and buffers when the call
began, and how many decisions of that call were learned before this one (a batch is scored
decision by decision, each on the state the ones before it left; 0 for a score-only call).

``shaped``: JudgmentMemory: ``prototype`` (the slot each action scored with, -1 for none),
``distance`` (the weighted squared distance to it, ``JudgmentMemory.metric()``'s: the attention,
and with ``learning='lvq'`` the relevances over the running spread; null for none) and
``attention`` (the criterion weights of the decision's category). KNNMemory: ``ids`` (the
sequence numbers of the decisions whose traces voted, nearest first) and ``distance``.
RetrievalMemory: ``ids`` (EpisodicMemory ids), ``score``, ``similarity``, ``recency``,
``importance`` and ``store_version``, plus ``stored``, the id the decision was stored under.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import torch
from torch import Tensor, nn

from gae import validation as check
from gae.judgment import JudgmentConfig, JudgmentMemory
from gae.models.knn import KNNMemory
from gae.models.retrieval import RetrievalMemory
from gae.traces.lines import Decisions, Memory, encode, learn_and_shape, score_and_shape
from gae.types import MemoryOutput, StreamStep

FORMAT = 2  # 2: a judgment memory's state in layout 2 (gae/judgment/state.py), which its hashes name
FLUSH_DECISIONS = 4096  # decisions a writer keeps before it encodes and writes them
_KINDS: dict[str, type] = {"judgment": JudgmentMemory, "knn": KNNMemory, "retrieval": RetrievalMemory}
def memory_kind(memory: nn.Module) -> str:
    """``'judgment'``, ``'knn'`` or ``'retrieval'``; TypeError for anything else."""
    for kind, cls in _KINDS.items():
        if isinstance(memory, cls):
            return kind
    raise TypeError(f"memory must be a JudgmentMemory, KNNMemory or RetrievalMemory, got {type(memory).__name__}")


def _digest(named: Sequence[tuple[str, Tensor]]) -> bytes:
    if not named:
        return b""
    layout = ";".join(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}" for name, tensor in named)
    content = torch.cat([tensor.detach().reshape(-1).view(torch.uint8) if tensor.dtype != torch.bool
                         else tensor.detach().reshape(-1).to(torch.uint8) for _, tensor in named])
    digest = hashlib.blake2b(layout.encode(), digest_size=8)
    digest.update(content.to("cpu").numpy().tobytes())
    return digest.digest()


def _combine(memory: Memory, parameters: bytes, buffers: bytes) -> str:
    digest = hashlib.blake2b(parameters + buffers, digest_size=8)
    labels = getattr(memory, "labels", None)  # a RetrievalMemory's action of each stored memory
    if isinstance(labels, dict):
        digest.update(repr(sorted(labels.items())).encode())
    return digest.hexdigest()


def state_hash(memory: Memory) -> str:
    """A content hash (16 hex digits) of every parameter and buffer, by name, dtype, shape and
    bytes (and a RetrievalMemory's labels): equal states, equal hashes. Event logs and the
    decision log are history, not content, and are left out."""
    return _combine(memory, _digest(list(memory.named_parameters())), _digest(list(memory.named_buffers())))


def memory_config(memory: Memory) -> dict[str, Any]:
    """The constructor arguments that rebuild ``memory`` (its learned state aside), JSON-able."""
    kind = memory_kind(memory)
    names = {"factors": list(memory.factor_names), "actions": list(memory.action_names),
             "categories": None if memory.category_names is None else list(memory.category_names)}
    if isinstance(memory, JudgmentMemory):
        return {"kind": kind, **names, **memory.config.to_dict()}
    if isinstance(memory, KNNMemory):
        return {"kind": kind, **names, "k": memory.k, "capacity": memory.capacity, "scoped": memory.scoped,
                "respect_skip": memory.respect_skip}
    assert isinstance(memory, RetrievalMemory)
    scorer = memory.store.scorer
    weights = scorer.weights.detach().tolist()
    return {"kind": kind, **names, "k": memory.k, "capacity": memory.store.capacity, "scoped": memory.scoped,
            "respect_skip": memory.respect_skip, "seconds_per_decision": memory.seconds_per_decision,
            "center": memory.center,
            "scorer": {"w_sim": weights[0], "w_rec": weights[1], "w_imp": weights[2], "tau": float(scorer.tau),
                       "learnable": isinstance(scorer.weights, nn.Parameter)}}


def build_memory(config: dict[str, Any]) -> Memory:
    """A fresh memory from :func:`memory_config`'s output."""
    from gae.episodic.scorer import RetrievalScorer

    options = dict(config)
    kind = options.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"config['kind'] must be one of {sorted(_KINDS)}, got {kind!r}")
    factors, actions, categories = options.pop("factors"), options.pop("actions"), options.pop("categories")
    options.pop("target_error", None)  # a k-NN's act or refer, written before the Decider held it
    if kind == "judgment":  # a header written before an option existed: its default, which that memory used
        return JudgmentMemory(categories, actions, factors, JudgmentConfig.from_dict(options))
    if kind == "retrieval":
        options["scorer"] = RetrievalScorer(**options["scorer"])
        return RetrievalMemory(factors=factors, actions=actions, categories=categories, **options)
    return KNNMemory(factors=factors, actions=actions, categories=categories, **options)


def save_checkpoint(memory: Memory, path: str | Path) -> str:
    """Save ``memory``'s config and state (loadable with ``torch.load(weights_only=True)``);
    returns its :func:`state_hash`."""
    digest = state_hash(memory)
    torch.save({"format": FORMAT, "config": memory_config(memory), "state_dict": memory.state_dict(),
                "hash": digest, "updates": memory.version}, path)
    return digest


def load_checkpoint(path: str | Path) -> tuple[Memory, str]:
    """The memory saved by :func:`save_checkpoint` and its hash (checked against its content).

    Loads with ``weights_only=True``: a file that is not a checkpoint fails, never runs code.
    """
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path} is not a readable gae checkpoint: {error}") from error
    if not isinstance(saved, dict) or saved.get("format") not in (1, FORMAT):
        raise ValueError(f"{path} is not a gae trace checkpoint of format {FORMAT}")
    if saved["format"] == 1 and isinstance(saved.get("config"), dict) and saved["config"].get("kind") == "judgment":
        raise ValueError(f"{path} was written by a gae before the judgment memory's state layout 2: its hashes, and "
                         "those of its trace, name the old layout, so its trace cannot be replayed bit for bit here; "
                         "replay it with the gae that wrote it (the state itself loads: JudgmentMemory migrates it)")
    memory = build_memory(saved["config"])
    memory.load_state_dict(saved["state_dict"])
    if state_hash(memory) != saved["hash"]:
        raise ValueError(f"{path}: the loaded state does not hash to the checkpoint's {saved['hash']}")
    return memory, saved["hash"]


class TraceWriter:
    """Writes the trace of a memory's scored decisions; use it in place of the memory's own calls.

    Args:
        file: a path (appended to) or an open file (binary, or text).
        memory: a :class:`~gae.JudgmentMemory`, :class:`~gae.KNNMemory` or :class:`~gae.RetrievalMemory`.
        run: a name for this run, on every line (several runs can share a file).
        checkpoint: save the starting state here (see :func:`save_checkpoint`) for :func:`gae.traces.replay.replay`.

    Every state change must go through the writer (``prequential_``, ``forget_``, ``delete``)
    or be a parameter change (an optimizer step), which it records on its next call. The
    writer traces the memory's tensors as they were when it opened: after moving the memory
    to another device, open a new writer. Decision lines are encoded and written
    :data:`FLUSH_DECISIONS` at a time, before any other record, and on ``flush`` / ``close``.

    Examples::

        >>> import io, torch
        >>> from gae import KNNMemory
        >>> memory = KNNMemory(factors=2, actions=["approve", "reject"], k=1)
        >>> buffer = io.BytesIO()
        >>> with TraceWriter(buffer, memory, run="demo") as writer:
        ...     _ = writer.prequential_(torch.tensor([[0.9, 0.1], [0.8, 0.2]]), torch.zeros(2, dtype=torch.long),
        ...                             torch.zeros(2, dtype=torch.long))
        >>> [record["answer"] for record in read_trace(io.StringIO(buffer.getvalue().decode()))
        ...  if record["kind"] == "decision"]
        [None, 0]
    """

    def __init__(self, file: str | Path | IO[bytes] | IO[str], memory: Memory, *, run: str = "",
                 checkpoint: str | Path | None = None) -> None:
        self.kind = memory_kind(memory)
        self.memory = memory
        self.run = str(run)
        self.deleted = 0
        self.calls = 0
        self._owns = isinstance(file, (str, Path))
        self._file: IO[Any] = open(file, "ab") if isinstance(file, (str, Path)) else file
        self._text = isinstance(self._file, io.TextIOBase)
        self._closed = False
        self._pending: list[Decisions] = []
        self._pending_rows = 0
        self._parameter_list = list(memory.named_parameters())
        self._buffer_list = list(memory.named_buffers())
        self._seen_versions = self._parameter_versions()
        if checkpoint is not None:
            save_checkpoint(memory, checkpoint)
        self._parameters, self._buffers = _digest(self._parameter_list), _digest(self._buffer_list)
        saved_at = None if checkpoint is None else str(checkpoint)
        self._record({"kind": "header", "format": FORMAT, "memory": self.kind, "config": memory_config(memory),
                      "version": self._version(), "checkpoint": saved_at})

    @property
    def hash(self) -> str:
        """The :func:`state_hash` of the memory as the writer last saw it."""
        return _combine(self.memory, self._parameters, self._buffers)

    # -- the calls it stands in for -------------------------------------------------------
    def prequential_(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None = None,
                     skip: Tensor | None = None, source_ids: Tensor | None = None) -> StreamStep:
        """``memory.prequential_`` with one ``decision`` line per decision; returns its step."""
        memory = self.memory
        x, category, action, confirmed, skip = memory._check_stream(x, category, action, confirmed, skip)
        if source_ids is not None:
            source_ids = check.check_index(source_ids, "source_ids", None, x.shape[0], x.device)
        self._sync()
        digest, updates, first = self.hash, memory.version, int(memory.num_decisions)
        if source_ids is None and isinstance(memory, JudgmentMemory) and memory.decision_log.max_events != 0:
            first = memory.decision_log.next_source  # the source ids the memory gives them by default
        step, shaped = learn_and_shape(memory, x, category, action, confirmed, skip, source_ids)
        since = np.arange(x.shape[0])
        ids = since + first if source_ids is None else source_ids.cpu().numpy()
        counters = shaped["store_version"].numpy() if "store_version" in shaped else since + updates
        self._add(Decisions(ids, counters, since, self.calls, digest, self.deleted, x.cpu(), category.cpu(),
                            MemoryOutput(*(t.cpu() for t in step.output)),
                            shaped, (action.cpu(), None if confirmed is None else confirmed.cpu(), skip.cpu())))
        self._buffers = _digest(self._buffers_now())
        return step

    def _buffers_now(self) -> list[tuple[str, Tensor]]:
        """The memory's buffers: those it had, or, for a RetrievalMemory, whose store reallocates
        its columns as it grows, the current ones."""
        if isinstance(self.memory, RetrievalMemory):
            self._buffer_list = list(self.memory.named_buffers())
        return self._buffer_list


    @torch.no_grad()
    def score(self, x: Tensor, category: Tensor) -> MemoryOutput:
        """``memory(x, category)`` (nothing learned) with one ``decision`` line per decision."""
        memory = self.memory
        x, category = memory._check_query(x, category)
        self._sync()
        output, shaped = score_and_shape(memory, x, category)
        since = np.zeros(x.shape[0], dtype=np.int64)
        self._add(Decisions(since + int(memory.num_decisions), since + memory.version, since, self.calls, self.hash,
                            self.deleted, x.cpu(), category.cpu(), MemoryOutput(*(t.cpu() for t in output)), shaped,
                            None))
        return output

    def forget_(self, source_ids: Sequence[int] | Tensor) -> int:
        """``JudgmentMemory.forget_`` with a ``forget`` line; returns how many decisions went."""
        if not isinstance(self.memory, JudgmentMemory):
            raise TypeError(f"forget_ needs a JudgmentMemory, this writer traces a {type(self.memory).__name__}")
        self._sync()
        removed = self.memory.forget_(source_ids)
        self._removal("forget", "source_ids", check.source_ids(source_ids).tolist(), removed)
        return removed

    def delete(self, ids: Sequence[int] | Tensor) -> int:
        """``RetrievalMemory.delete`` with a ``delete`` line; returns how many memories went."""
        if not isinstance(self.memory, RetrievalMemory):
            raise TypeError(f"delete needs a RetrievalMemory, this writer traces a {type(self.memory).__name__}")
        self._sync()
        removed = self.memory.delete(ids)
        self._removal("delete", "ids", np.asarray(check.plain_ids("ids", ids, None), dtype=np.int64).reshape(-1)
                      .tolist(), removed)
        return removed

    def flush(self) -> None:
        """Encode and write the decisions kept so far."""
        self._write_pending()
        self._file.flush()

    def close(self) -> None:
        """Record the parameters if an optimizer step changed them after the last call (a writer
        resumed later then continues from the state this one ends on), flush, and close the
        file if the writer opened it. Closing again does nothing."""
        if self._closed:
            return
        self._sync()
        self.flush()
        self._closed = True
        if self._owns:
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records ------------------------------------------------------------------------------
    def _add(self, decisions: Decisions) -> None:
        self._pending.append(decisions)
        self._pending_rows += len(decisions.ids)
        self.calls += 1
        if self._pending_rows >= FLUSH_DECISIONS:
            self.flush()

    def _version(self) -> dict[str, Any]:
        version = {"updates": self.memory.version, "hash": self.hash, "since": 0}
        ledger = getattr(self.memory, "ledger_version", None)
        if ledger is not None:  # a memory on a durable ledger: the last ledger event its state holds
            version["ledger"] = ledger
        return version

    def _write(self, data: bytes) -> None:
        self._file.write(data.decode() if self._text else data)

    def _write_pending(self) -> None:
        if self._pending:
            self._write(encode(self.run, self.kind, self._pending))
            self._pending, self._pending_rows = [], 0

    def _record(self, record: dict[str, Any]) -> None:
        self._write_pending()  # the decisions before it come first
        self._write(orjson.dumps({"kind": record.pop("kind"), "run": self.run, **record}) + b"\n")

    def _parameter_versions(self) -> tuple[int, ...]:
        return tuple(parameter._version for _, parameter in self._parameter_list)

    def _sync(self) -> None:
        """Record the parameters if they changed since the last call (an optimizer step): their
        in-place version counters say whether to hash them again."""
        versions = self._parameter_versions()
        if versions == self._seen_versions:
            return
        self._seen_versions = versions
        parameters = _digest(self._parameter_list)
        if parameters != self._parameters:
            self._parameters = parameters
            values = {name: p.detach().cpu().tolist() for name, p in self._parameter_list}
            self._record({"kind": "parameters", "values": values, "version": self._version()})

    def _removal(self, kind: str, key: str, ids: list[int], removed: int) -> None:
        self.deleted += removed
        self._seen_versions = self._parameter_versions()
        self._parameters, self._buffers = _digest(self._parameter_list), _digest(self._buffers_now())
        self._record({"kind": kind, key: ids, "removed": removed, "version": self._version(),
                      "deleted": self.deleted})


def read_trace(file: str | Path | IO[str]) -> Iterator[dict[str, Any]]:
    """The records of a trace, in order, each with its 1-based ``line`` number added."""
    handle = open(file, encoding="utf-8") if isinstance(file, (str, Path)) else file
    try:
        for number, text in enumerate(handle, 1):
            if text.strip():
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as error:
                    raise ValueError(f"trace line {number} is not JSON: {error}") from None
                if not isinstance(record, dict) or "kind" not in record:
                    raise ValueError(f"trace line {number} is not a trace record: {text[:80]!r}")
                record["line"] = number
                yield record
    finally:
        if handle is not file:
            handle.close()
