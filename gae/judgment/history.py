"""The judgment memory's history: every decision it learned and every event of its rule.

:class:`DecisionLog` keeps the decisions with the state before the first of them (its base);
:class:`History` adds the gate, promotion and recycle logs and what is built from them: a
prototype's :class:`Trace`, ``undo_`` and ``forget_`` by replaying the log. A replay learns
through a function the memory hands in (``relearn``), so this module never imports the memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from gae.types import GateLog, LearnEvents, PromotionLog, RecycleLog, StreamStep

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
        max_events: keep at most this many decisions; older ones are folded into the base
            (undo and forget cannot reach before it). None: unbounded.
    """

    def __init__(self, max_events: int | None = None) -> None:
        self.max_events = max_events
        self.chunks: list[dict[str, Tensor]] = []  # one per learning call, with its attention "logits"
        self.base: dict[str, Tensor] = {}  # the memory's buffers before the first logged decision
        self.base_logs: dict[str, Any] = {}  # the event logs (gate, promotion, recycle) of the folded decisions
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
                "call_logits": torch.tensor(call_logits, dtype=torch.int64), "base": dict(self.base),
                "base_logs": self.base_logs}

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
        log.base_logs = state.get("base_logs", {})
        return log


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


EVENT_LOGS: dict[str, Any] = {"gate": GateLog, "promotion": PromotionLog, "recycle": RecycleLog}
_FLOAT_FIELDS = {"gate": ("displacement", "eta"), "promotion": ("statistic", "shift"), "recycle": ("displacement",)}

# relearn(columns, logits): learn logged decisions again in one call, with the attention logits they had
Relearn = Callable[[dict[str, Tensor], Tensor], None]


def buffer_state(module: nn.Module) -> dict[str, Tensor]:
    """CPU copies of every buffer of ``module``."""
    return {name: buffer.detach().to("cpu", copy=True) for name, buffer in module.named_buffers()}


def load_buffers(module: nn.Module, buffers: dict[str, Tensor]) -> None:
    for name, buffer in module.named_buffers():
        buffer.copy_(buffers[name].to(buffer.device))


class History:
    """The decision log and the event logs of one memory, and the replays built on them.

    Args:
        module: the memory whose buffers a replay rebuilds.
        max_events: see :class:`DecisionLog`.
        relearn: how the memory learns logged decisions again (``relearn(columns, logits)``: one
            engine call over the columns of :data:`RELEARNED`, under those attention logits).
    """

    def __init__(self, module: nn.Module, max_events: int | None, relearn: Relearn) -> None:
        self.module = module
        self.relearn = relearn
        self.log = DecisionLog(max_events)
        self.log.base = buffer_state(module)
        self.chunks: dict[str, list[Any]] = {name: [] for name in EVENT_LOGS}
        self.replaying = False  # a replay relearns logged decisions: they are logged again, never folded
        self.replay_logits: Tensor | None = None  # the attention logits of the call being replayed

    # -- the event logs --------------------------------------------------------------------
    def joined(self, name: str) -> Any:
        """One log from the chunks appended call by call (joined once, in place); empty when none."""
        chunks, log_type = self.chunks[name], EVENT_LOGS[name]
        if not chunks:
            return log_type(*(torch.zeros(0) if field in _FLOAT_FIELDS[name] else torch.zeros(0, dtype=torch.int64)
                              for field in log_type._fields))
        if len(chunks) > 1:
            chunks[:] = [log_type(*(torch.cat(parts) for parts in zip(*chunks, strict=True)))]
        return chunks[0]

    def logs_state(self) -> dict[str, list[dict[str, Tensor]]]:
        """The event logs as plain dicts of tensors (``weights_only`` loads them)."""
        return {name: [dict(chunk._asdict()) for chunk in chunks] for name, chunks in self.chunks.items()}

    def set_logs(self, logs: dict[str, list[dict[str, Tensor]]]) -> None:
        self.chunks = {name: [log_type(**{k: v.cpu() for k, v in chunk.items()}) for chunk in logs.get(name, [])]
                       for name, log_type in EVENT_LOGS.items()}

    # -- recording a learning call ----------------------------------------------------------
    def record(self, first: int, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor, given: Tensor,
               step: StreamStep, promotions: PromotionLog, source_ids: Tensor | None, logits: Tensor) -> None:
        """Log one learning call of decisions ``first, first + 1, ...`` (CPU tensors)."""
        events = step.events
        self._append_events(first, category, action, events)
        if promotions.step.numel():
            self.chunks["promotion"].append(promotions._replace(step=promotions.step + first))
        log = self.log
        if log.max_events == 0:  # the log is off
            return
        n = x.shape[0]
        if source_ids is None:  # never reused, even after a forget_ shifts the sequence numbers
            source_ids = torch.arange(log.next_source, log.next_source + n)
        source_ids = source_ids.to("cpu").long()
        if not self.replaying:  # a replay learns logged ids again: nothing new to count
            log.next_source = max(log.next_source, int(source_ids.max()) + 1)
        assert step.before is not None
        logits = self.replay_logits if self.replay_logits is not None else logits
        log.append({  # copies: the caller may change the step's tensors in place
            "seq": torch.arange(first, first + n), "source_id": source_ids.clone(), "category": category.clone(),
            "action": action.clone(), "confirmed": confirmed.clone(), "given": given.clone(),
            "skipped": events.skipped.clone(), "eta": events.eta.clone(), "displacement": events.displacement.clone(),
            "gated": events.gated.clone(), "initialized": events.initialized.clone(),
            "prototype": events.prototype.clone(), "x": x.detach().to("cpu", torch.float32, copy=True),
            "before": step.before.clone(), "logits": logits.detach().to("cpu", copy=True)})
        if log.max_events is not None and len(log) > log.max_events and not self.replaying:
            self._fold(len(log) - log.max_events // 2)

    def _append_events(self, first: int, category: Tensor, action: Tensor, events: LearnEvents) -> None:
        where = events.gated.nonzero().squeeze(-1)
        if where.numel():
            self.chunks["gate"].append(GateLog(where + first, category[where], action[where],
                                               events.displacement[where], events.eta[where]))
        where = events.recycled.nonzero().squeeze(-1)
        if where.numel():
            self.chunks["recycle"].append(RecycleLog(where + first, category[where], action[where],
                                                     events.prototype[where], events.displacement[where]))
        for name, chunks in self.chunks.items():  # a few small tensors a call add up: join them
            if len(chunks) >= JOIN_CALLS:
                self.joined(name)

    # -- replays ---------------------------------------------------------------------------
    def check_covers(self, num_decisions: int) -> None:
        learned = int(self.log.base.get("num_decisions", torch.zeros(()))) + len(self.log)
        if learned != num_decisions:
            raise ValueError(f"the decision log does not cover this memory's state: its base and log account for "
                             f"{learned} decisions but the memory has learned {num_decisions} (a state loaded "
                             "without its log, or learned with max_log_events=0); it cannot undo or forget")

    def replay(self, keep: Tensor | None = None, stop: int | None = None) -> None:
        """Rebuild the state from the log's base by re-learning its decisions (the first ``stop``,
        those in ``keep``) call by call, each with the attention it had; given confirmed flags are
        kept, derived ones derived again. All of it or nothing: a failure restores the state."""
        self.check_covers(int(self.module.get_buffer("num_decisions")))
        saved = (buffer_state(self.module), self.logs_state(), list(self.log.chunks))
        chunks, self.log.chunks = self.log.chunks, []
        self.replaying = True
        try:
            load_buffers(self.module, self.log.base)
            self.set_logs(self.log.base_logs)
            position = 0
            batch: list[dict[str, Tensor]] = []  # consecutive calls with the same attention: one engine call
            for chunk in chunks:
                n = int(chunk["seq"].shape[0])
                rows = torch.arange(position, position + n)
                chosen = torch.ones(n, dtype=torch.bool) if stop is None else rows < stop
                if keep is not None:
                    chosen &= keep[position:position + n]
                position += n
                if not bool(chosen.any()):
                    continue
                if batch and not torch.equal(batch[-1]["logits"], chunk["logits"]):
                    self._relearn(batch)
                    batch = []
                batch.append({**{name: chunk[name][chosen] for name in RELEARNED}, "logits": chunk["logits"]})
            if batch:
                self._relearn(batch)
        except BaseException:
            buffers, logs, self.log.chunks = saved
            load_buffers(self.module, buffers)
            self.set_logs(logs)
            raise
        finally:
            self.replaying = False

    def _relearn(self, calls: list[dict[str, Tensor]]) -> None:
        columns = {name: torch.cat([call[name] for call in calls]) for name in RELEARNED}
        self.replay_logits = calls[0]["logits"]
        try:
            self.relearn(columns, calls[0]["logits"])
        finally:
            self.replay_logits = None

    def _fold(self, count: int) -> None:
        """Fold the oldest whole calls holding at least ``count`` decisions into the base."""
        sizes = [int(chunk["seq"].shape[0]) for chunk in self.log.chunks]
        folded, calls = 0, 0
        while calls < len(sizes) and folded < count:
            folded += sizes[calls]
            calls += 1
        current = (buffer_state(self.module), self.logs_state(), list(self.log.chunks))
        self.replay(stop=folded)  # the state right after the folded decisions
        self.log.base, self.log.base_logs = buffer_state(self.module), self.logs_state()
        buffers, logs, chunks = current
        load_buffers(self.module, buffers)
        self.set_logs(logs)
        self.log.chunks = chunks[calls:]

    def undo(self, n: int) -> Tensor:
        """Replay all but the last ``n`` applied decisions; returns the attention logits in force
        when the first undone decision came (the caller restores them)."""
        applied = (~self.log.events()["skipped"]).nonzero().squeeze(-1)
        if n > applied.numel():
            folded = " (older decisions were folded into the log's base by max_log_events)" \
                if self.log.max_events is not None else ""
            raise ValueError(f"undo_({n}) reaches before the start of the decision log: it holds "
                             f"{applied.numel()} applied decisions{folded}")
        stop = int(applied[-n])
        sizes = torch.tensor([int(chunk["seq"].shape[0]) for chunk in self.log.chunks])
        call = int(torch.searchsorted(torch.cumsum(sizes, 0), stop, right=True))
        logits = self.log.chunks[call]["logits"]
        self.replay(stop=stop)
        return logits

    def forget(self, wanted: Tensor) -> int:
        """Replay the log without the decisions whose source id is in ``wanted``; returns how many."""
        logged = self.log.events()["source_id"]
        missing = wanted[~torch.isin(wanted, logged)]
        if missing.numel():
            raise ValueError(f"source_ids not in the decision log: {missing.tolist()[:10]}"
                             + (" (older decisions may have been folded into its base by max_log_events)"
                                if self.log.max_events is not None else ""))
        keep = ~torch.isin(logged, wanted)
        self.replay(keep=keep)
        return int((~keep).sum())

    def trace(self, c: int, a: int, prototype: int, top: int) -> Trace:
        """The decisions that moved prototype ``prototype`` of (c, a) most, heaviest first."""
        events = self.log.events()
        mine = ((events["category"] == c) & (events["action"] == a) & ~events["skipped"]
                & (events["prototype"] == prototype)).nonzero().squeeze(-1)
        eta = events["eta"][mine].double()
        # weight_i = eta_i * prod_{j > i} (1 - eta_j): a reversed cumulative product
        keep_after = torch.cat([torch.flip(torch.cumprod(torch.flip(1.0 - eta, [0]), 0), [0])[1:],
                                torch.ones(min(1, eta.numel()), dtype=torch.float64)])
        weights = eta * keep_after
        order = torch.argsort(weights, descending=True, stable=True)[:top]
        return Trace(events["source_id"][mine][order], weights[order].float(), events["seq"][mine][order])


RELEARNED = ("x", "category", "action", "confirmed", "given", "skipped", "source_id")  # what a replay learns again
