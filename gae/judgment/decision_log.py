"""The decision log: every decision a judgment memory learned, and the state before the first.

It is what :meth:`~gae.JudgmentMemory.trace`, ``undo_`` and ``forget_`` are built on
(:mod:`gae.judgment.history`), and it travels in the memory's ``state_dict``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

# -- the decision log: what every learning call did, enough to trace, undo and forget ------------------
EVENT_FIELDS = {  # name: dtype of the per-decision columns (x and before are (N, K))
    "seq": torch.int64, "source_id": torch.int64, "category": torch.int64, "action": torch.int64,
    "confirmed": torch.bool, "skipped": torch.bool, "eta": torch.float32, "displacement": torch.float32,
    "gated": torch.bool, "initialized": torch.bool, "prototype": torch.int64, "x": torch.float32,
    "before": torch.float32, "given": torch.bool,
}
EVENT_BYTES_PER_FACTOR = 8  # x and before: two float32 per criterion
EVENT_BYTES_FIXED = 5 * 8 + 5 * 1 + 2 * 4  # five int64, five bools, eta and displacement
JOIN_CALLS = 64  # learning calls whose logs are kept apart before they are joined (here and in the event logs)
_JOIN_ROWS = 4096  # decisions a joined chunk holds at most (max_log_events folds whole chunks)


class DecisionLog:
    """Every decision a :class:`~gae.JudgmentMemory` was taught, in stream order, with the state
    before the first of them (the *base*): the audit trail behind ``trace``, ``undo_`` and
    ``forget_``.

    Per decision it keeps the sequence number, the ``source_id``, category, action, the
    confirmed flag the rule used and whether it was given (else the memory derived it from its
    own recommendation, and a replay derives it again), whether it was skipped, eta,
    displacement, whether it was gated or created its prototype, the prototype slot it taught,
    the factors ``x`` and that prototype's row before the update: ``53 + 8 K`` bytes (117 at
    K = 8). Per learning call it keeps the attention logits in force (C x K floats; in the
    state_dict, once per run of calls with the same logits), so a replay scores exactly as the
    call did. Every 64 calls, runs of calls with the same logits are joined (up to 4,096
    decisions a chunk); calls whose attention changed in between (an optimizer step) stay apart
    and each costs some kilobytes of Python objects in memory: learn in batches where you can.

    Args:
        max_events: keep at most this many decisions (``JudgmentConfig.max_log_events``); when
            the log holds more, its oldest half is folded into the base (undo and forget cannot
            reach before it), and their gate, promotion and recycle events leave the event logs
            with them, so every log is bounded by this one setting and covers the same
            decisions. 0: no log at all. None: unbounded (the memory's default; the river and
            scikit-learn estimators bound it).
    """

    def __init__(self, max_events: int | None = None) -> None:
        self.max_events = max_events
        self.chunks: list[dict[str, Tensor]] = []  # one per learning call, with its attention "logits"
        self.base: dict[str, Tensor] = {}  # the memory's buffers before the first logged decision
        self.next_source = 0  # the next default source id (never reused, even after a forget)
        self._joined_upto = 0  # chunks before this index have been joined already

    def __len__(self) -> int:
        return sum(int(chunk["seq"].shape[0]) for chunk in self.chunks)

    def append(self, chunk: dict[str, Tensor]) -> None:
        self.chunks.append(chunk)
        if len(self.chunks) - self._joined_upto >= JOIN_CALLS:
            self._join_recent()

    def _join_recent(self) -> None:
        """Join runs of the recent calls that had the same attention, up to ``_JOIN_ROWS``
        decisions each: a replay learns such a run in one engine call anyway, and one chunk
        of 14 tensors costs some kilobytes of Python objects whatever its length."""
        upto = min(self._joined_upto, len(self.chunks))  # the owner may have cut or reset the list
        rows = _JOIN_ROWS if self.max_events is None else min(_JOIN_ROWS, self.max_events // 4)
        joined = self.chunks[:upto]
        for chunk in self.chunks[upto:]:
            last = joined[-1] if len(joined) > upto else None
            if (last is not None and torch.equal(last["logits"], chunk["logits"])
                    and int(last["seq"].shape[0]) + int(chunk["seq"].shape[0]) <= rows):
                joined[-1] = {**{name: torch.cat([last[name], chunk[name]]) for name in EVENT_FIELDS},
                              "logits": last["logits"]}
            else:
                joined.append(chunk)
        self.chunks = joined
        self._joined_upto = len(joined)

    def events(self) -> dict[str, Tensor]:
        """Every logged decision as one column per field (empty columns when none)."""
        if not self.chunks:
            return {name: torch.zeros(0, dtype=dtype) for name, dtype in EVENT_FIELDS.items()}
        return {name: torch.cat([chunk[name] for chunk in self.chunks]) for name in EVENT_FIELDS}

    def state(self) -> dict[str, Any]:
        """The log as plain tensors (it travels in the memory's extra state): one column per
        field, the length of each call, and each distinct run of attention logits once."""
        sizes = torch.tensor([int(chunk["seq"].shape[0]) for chunk in self.chunks], dtype=torch.int64)
        runs: list[Tensor] = []
        call_logits = []
        for chunk in self.chunks:
            if not runs or not torch.equal(runs[-1], chunk["logits"]):
                runs.append(chunk["logits"])
            call_logits.append(len(runs) - 1)
        return {"max_events": self.max_events, "next_source": self.next_source, "columns": self.events(),
                "call_sizes": sizes, "logits": torch.stack(runs) if runs else torch.zeros(0),
                "call_logits": torch.tensor(call_logits, dtype=torch.int64), "base": dict(self.base)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DecisionLog:
        log = cls(state.get("max_events"))
        log.next_source = int(state.get("next_source", 0))
        columns, sizes = state.get("columns", {}), state.get("call_sizes", torch.zeros(0, dtype=torch.int64))
        start = 0
        if "given" not in columns and "seq" in columns:  # a log written before derived flags were told apart
            columns = {**columns, "given": torch.ones_like(columns["seq"], dtype=torch.bool)}
        for call, size in enumerate(sizes.tolist()):
            chunk = {name: columns[name][start:start + size].cpu() for name in EVENT_FIELDS}
            chunk["logits"] = state["logits"][int(state["call_logits"][call])].cpu()
            log.chunks.append(chunk)
            start += size
        log.base = {k: v.cpu() for k, v in state.get("base", {}).items()}
        return log  # a state saved before every log was bounded may hold "base_logs", a copy of the event logs


class Trace(NamedTuple):
    """The decisions that shaped one prototype, heaviest first.

    Attributes:
        source_ids: (T,) int64, the decisions' source ids.
        weights: (T,) float, each one's weight in the prototype now: the eta of its update
            times ``1 - eta`` of every later update of the same prototype (a first touch or a
            spawn has eta 1, so it erases the weight of everything before it).
        seq: (T,) int64, their sequence numbers.
    """

    source_ids: Tensor
    weights: Tensor
    seq: Tensor
