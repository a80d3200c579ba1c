"""The judgment memory's history: every decision it learned and every event of its rule.

:class:`~gae.judgment.decision_log.DecisionLog` keeps the decisions with the state before the
first of them (its base); :class:`History` adds the gate, promotion and recycle logs and what
is built from them: a prototype's trace, ``undo_`` and ``forget_`` by replaying the log. A
replay learns through a function the memory hands in (``relearn``), so this module never
imports the memory. :class:`~gae.JudgmentMemory`'s ``undo_``, ``forget_``, ``trace`` and logs are its public face.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from gae.judgment.decision_log import JOIN_CALLS, DecisionLog, Trace
from gae.judgment.online import Staged
from gae.judgment.state import grown
from gae.types import GateLog, LearnEvents, PromotionLog, RecycleLog, StreamStep

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

    The memory hands itself (``module``, whose buffers a replay rebuilds) and ``relearn`` (how it
    learns logged decisions again: one engine call over the columns of :data:`RELEARNED`, under
    the attention logits they had) to each call that needs them; the history keeps no reference
    to the memory, so a memory no longer used is freed at once, with its log.

    Args:
        max_events: see :class:`DecisionLog`.
        base: the memory's buffers before its first decision (:func:`buffer_state`).
    """

    def __init__(self, max_events: int | None, base: dict[str, Tensor]) -> None:
        self._log = DecisionLog(max_events)
        self._log.base = base
        self._chunks: dict[str, list[Any]] = {name: [] for name in EVENT_LOGS}
        self.staged: Staged | None = None  # decisions learned one at a time, not yet in the logs
        self.replaying = False  # a replay relearns logged decisions: they are logged again, never folded
        self.replay_logits: Tensor | None = None  # the attention logits of the call being replayed

    @property
    def log(self) -> DecisionLog:
        """The :class:`DecisionLog`, with every staged decision in it."""
        self.flush()
        return self._log

    @log.setter
    def log(self, log: DecisionLog) -> None:
        self._log = log

    def next_source(self) -> int:
        """The source id the next decision learned without one gets: one past the largest given so
        far, the staged decisions counted row by row as :func:`default_sources` will number them,
        without taking them into the log (counted once: a run of calls costs one row each)."""
        following, staged = self._log.next_source, self.staged
        if staged is not None and staged.n:
            counted, after = staged.counted
            if counted:
                following = after
            for source in staged.sources[counted:staged.n].tolist():
                following = following + 1 if source < 0 else max(following, source + 1)
            staged.counted = (staged.n, following)
        return following

    @property
    def chunks(self) -> dict[str, list[Any]]:
        """The gate, promotion and recycle logs as the chunks appended call by call, with every
        staged decision's events in them."""
        self.flush()
        return self._chunks

    @chunks.setter
    def chunks(self, chunks: dict[str, list[Any]]) -> None:
        self._chunks = chunks

    def flush(self, module: nn.Module | None = None, relearn: Relearn | None = None) -> None:
        """Take the staged decisions (:mod:`gae.judgment.online`) into the logs as one learning
        call; with the memory and its ``relearn``, fold the log if it is over ``max_events``."""
        staged = self.staged
        if staged is not None and staged.n:
            r = staged.take()
            self._append(r.first, r.x, r.category, r.action, r.confirmed, r.given, r.step, r.promotions, r.logits,
                         source_ids=r.source_ids)
        if module is not None and relearn is not None:
            self._fold_if_full(module, relearn)

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

    def _keep_events(self, before: int | None = None, since: int | None = None) -> None:
        """Keep only the events of decisions ``< before`` or ``>= since`` (sequence numbers)."""
        for name in EVENT_LOGS:
            log = self.joined(name)
            keep = torch.ones_like(log.step, dtype=torch.bool)
            if before is not None:
                keep &= log.step < before
            if since is not None:
                keep &= log.step >= since
            if not bool(keep.all()):
                self._chunks[name][:] = [type(log)(*(field[keep] for field in log))] if bool(keep.any()) else []

    def records(self, names: tuple[str, ...], actions: tuple[str, ...]) -> list[dict[str, Any]]:
        """Every gate, promotion and recycle event as a dict with names, in stream order
        (:meth:`gae.JudgmentMemory.gate_records`)."""
        records = [{"step": int(s), "event": "gated", "category": names[int(c)], "action": actions[int(a)],
                    "disp": float(d), "eta": float(e)} for s, c, a, d, e in zip(*self.joined("gate"), strict=True)]
        records += self.promotion_records(names)
        records += [{"step": int(s), "event": "recycled", "category": names[int(c)], "action": actions[int(a)],
                     "prototype": int(p), "disp": float(d)}
                    for s, c, a, p, d in zip(*self.joined("recycle"), strict=True)]
        return sorted(records, key=lambda record: (record["step"], record["event"]))

    def promotion_records(self, names: tuple[str, ...], last: int | None = None) -> list[dict[str, Any]]:
        """The promotions alone (the ``last`` ones, or all) as dicts with names."""
        promotions = self.joined("promotion")
        if last is not None:
            promotions = type(promotions)(*(field[len(field) - min(last, len(field)):] for field in promotions))
        return [{"step": int(s), "event": "promoted", "category": names[int(c)], "statistic": float(t),
                 "shadow_right": int(w), "main_right": int(m), "shift": float(d)}
                for s, c, t, w, m, d in zip(*promotions, strict=True)]

    # -- the state_dict ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The decision log and the event logs, for the memory's extra state (plain tensors)."""
        extra: dict[str, Any] = {"decision_log": self.log.state()}
        for name in EVENT_LOGS:
            extra[f"{name}_log"] = dict(self.joined(name)._asdict())
        return extra

    def load_state(self, module: nn.Module, extra: dict[str, Any]) -> None:
        """The logs of :meth:`state`; a state saved before the decision log existed (or into a
        memory that keeps none) starts the log from the loaded buffers. Staged decisions are
        dropped: the state they were learned into is being replaced."""
        if self.staged is not None:
            self.staged.discard()
        max_events = self.log.max_events  # this memory's setting, not the saved one
        self.set_logs({name: [extra[f"{name}_log"]] if extra.get(f"{name}_log") and max_events != 0 else []
                       for name in EVENT_LOGS})
        if "decision_log" in extra and max_events != 0:
            self.log = DecisionLog.from_state(extra["decision_log"])
            if not self.log.base and not self.log.chunks:  # a log of no decisions (a ledger's snapshot): from here
                self.log.base = buffer_state(module)
        else:
            self.log = DecisionLog(max_events)
            self.log.base = buffer_state(module)
        self.log.max_events = max_events

    # -- growing vocabularies ----------------------------------------------------------------
    def grow(self, n_categories: int, n_actions: int, n_factors: int, config: Any) -> None:
        """The log's base and each call's attention logits for a memory grown to ``n_categories``
        x ``n_actions`` (:func:`gae.judgment.state.grown`; new categories: zero logits), so that
        a replay after the growth learns the logged decisions as before."""
        log = self.log
        if log.base:
            log.base = grown(log.base, n_categories, n_actions, n_factors, config)
        for chunk in log.chunks:
            logits = chunk["logits"]
            if logits.shape[0] < n_categories:
                chunk["logits"] = torch.cat([logits, logits.new_zeros(n_categories - logits.shape[0], n_factors)])

    # -- recording a learning call ----------------------------------------------------------
    def record(self, module: nn.Module, relearn: Relearn, first: int, x: Tensor, category: Tensor, action: Tensor,
               confirmed: Tensor, given: Tensor, step: StreamStep, promotions: PromotionLog,
               source_ids: Tensor | None, logits: Tensor) -> None:
        """Log one learning call of decisions ``first, first + 1, ...`` (CPU tensors), after the
        staged ones, and fold the log if it is over ``max_events``."""
        self.flush()
        self._append(first, x, category, action, confirmed, given, step, promotions, logits, source_ids=source_ids)
        self._fold_if_full(module, relearn)

    def _fold_if_full(self, module: nn.Module, relearn: Relearn) -> None:
        log = self._log
        if log.max_events is not None and len(log) > log.max_events and not self.replaying:
            self._fold(module, relearn, len(log) - log.max_events // 2)

    def _append(self, first: int, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor, given: Tensor,
                step: StreamStep, promotions: PromotionLog, logits: Tensor, *, source_ids: Tensor | None) -> None:
        log = self._log
        if log.max_events == 0:  # every log is off
            return
        events = step.events
        self._append_events(first, category, action, events)
        if promotions.step.numel():
            self._chunks["promotion"].append(promotions._replace(step=promotions.step + first))
        n = x.shape[0]
        if source_ids is None:  # never reused, even after a forget_ shifts the sequence numbers
            source_ids = torch.arange(log.next_source, log.next_source + n)
        source_ids = source_ids.to("cpu").long()
        if bool((source_ids < 0).any()):  # staged rows learned without one among rows given one
            source_ids = default_sources(source_ids, log.next_source)
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

    def _append_events(self, first: int, category: Tensor, action: Tensor, events: LearnEvents) -> None:
        where = events.gated.nonzero().squeeze(-1)
        if where.numel():
            self._chunks["gate"].append(GateLog(where + first, category[where], action[where],
                                               events.displacement[where], events.eta[where]))
        where = events.recycled.nonzero().squeeze(-1)
        if where.numel():
            self._chunks["recycle"].append(RecycleLog(where + first, category[where], action[where],
                                                     events.prototype[where], events.displacement[where]))
        for name, chunks in self._chunks.items():  # a few small tensors a call add up: join them
            if len(chunks) >= JOIN_CALLS:
                self.joined(name)

    # -- replays ---------------------------------------------------------------------------
    def check_covers(self, num_decisions: int) -> None:
        learned = int(self.log.base.get("num_decisions", torch.zeros(()))) + len(self.log)
        if learned != num_decisions:
            raise ValueError(f"the decision log does not cover this memory's state: its base and log account for "
                             f"{learned} decisions but the memory has learned {num_decisions} (a state loaded "
                             "without its log, or learned with max_log_events=0); it cannot undo or forget")

    def replay(self, module: nn.Module, relearn: Relearn, keep: Tensor | None = None, stop: int | None = None) -> None:
        """Rebuild the state from the log's base by re-learning its decisions (the first ``stop``,
        those in ``keep``) call by call, each with the attention it had; given confirmed flags are
        kept, derived ones derived again. All of it or nothing: a failure restores the state."""
        self.check_covers(int(module.get_buffer("num_decisions")))
        saved = (buffer_state(module), self.logs_state(), list(self.log.chunks))
        chunks, self.log.chunks = self.log.chunks, []
        self.replaying = True
        try:
            load_buffers(module, self.log.base)
            self._keep_events(before=self._base_seq())  # the replay logs the events of what it learns again
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
                    self._relearn(relearn, batch)
                    batch = []
                batch.append({**{name: chunk[name][chosen] for name in RELEARNED}, "logits": chunk["logits"]})
            if batch:
                self._relearn(relearn, batch)
        except BaseException:
            buffers, logs, self.log.chunks = saved
            load_buffers(module, buffers)
            self.set_logs(logs)
            raise
        finally:
            self.replaying = False

    def _relearn(self, relearn: Relearn, calls: list[dict[str, Tensor]]) -> None:
        columns = {name: torch.cat([call[name] for call in calls]) for name in RELEARNED}
        self.replay_logits = calls[0]["logits"]
        try:
            relearn(columns, calls[0]["logits"])
        finally:
            self.replay_logits = None

    def _base_seq(self) -> int:
        """The sequence number of the log's first decision (decisions before it are in the base)."""
        return int(self._log.base.get("num_decisions", torch.zeros((), dtype=torch.int64)))

    def _fold(self, module: nn.Module, relearn: Relearn, count: int) -> None:
        """Fold the oldest whole calls holding at least ``count`` decisions into the base; their
        events leave the event logs with them, so every log covers the same decisions."""
        sizes = [int(chunk["seq"].shape[0]) for chunk in self.log.chunks]
        folded, calls = 0, 0
        while calls < len(sizes) and folded < count:
            folded += sizes[calls]
            calls += 1
        if calls == len(sizes):  # every call folds: the base is the state as it is, no replay needed
            self.log.base, self.log.chunks = buffer_state(module), []
            self._keep_events(since=int(module.get_buffer("num_decisions")))
            return
        current = (buffer_state(module), self.logs_state(), list(self.log.chunks))
        self.replay(module, relearn, stop=folded)  # the state right after the folded decisions
        self.log.base = buffer_state(module)
        buffers, logs, chunks = current
        load_buffers(module, buffers)
        self.set_logs(logs)
        self.log.chunks = chunks[calls:]
        self._keep_events(since=self._base_seq())

    def undo(self, module: nn.Module, relearn: Relearn, n: int) -> Tensor:
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
        self.replay(module, relearn, stop=stop)
        return logits

    def forget(self, module: nn.Module, relearn: Relearn, wanted: Tensor) -> int:
        """Replay the log without the decisions whose source id is in ``wanted``; returns how many."""
        logged = self.log.events()["source_id"]
        missing = wanted[~torch.isin(wanted, logged)]
        if missing.numel():
            raise ValueError(f"source_ids not in the decision log: {missing.tolist()[:10]}"
                             + (" (older decisions may have been folded into its base by max_log_events)"
                                if self.log.max_events is not None else ""))
        keep = ~torch.isin(logged, wanted)
        self.replay(module, relearn, keep=keep)
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


def default_sources(source_ids: Tensor, next_source: int) -> Tensor:
    """``source_ids`` with each -1 (a row learned without one) given the next default id, row by row:
    each given id moves the next default past it, as learning the rows one call at a time would."""
    filled = source_ids.tolist()
    for i, source in enumerate(filled):
        if source < 0:
            filled[i] = next_source
        next_source = max(next_source, filled[i] + 1)
    return torch.tensor(filled, dtype=torch.int64)


RELEARNED = ("x", "category", "action", "confirmed", "given", "skipped", "source_id")  # what a replay learns again
