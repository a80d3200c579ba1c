"""The judgment memory's public face of its history: undo, forget, trace and the logs, by name.

:class:`HistoryMixin` holds the memory's lock in each call and hands the memory itself and its
``relearn`` to :class:`~gae.judgment.history.History`, which does the work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from gae import validation as check
from gae.judgment.config import REFER_OPTIONS, JudgmentConfig
from gae.judgment.decision_log import DecisionLog, Trace
from gae.judgment.history import History, Relearn
from gae.types import GateLog, PromotionLog, RecycleLog


def ledger_defaults() -> dict[str, Any]:
    """Each option's default, as a ledger written before the option existed is read."""
    return cast(dict, JudgmentConfig.seed().to_dict())


class HistoryMixin:
    """The public face of a :class:`History` on the memory that owns it (``history``): undo,
    forget, trace and the logs, with the memory's names. Mixed into
    :class:`~gae.JudgmentMemory`, which provides ``history``, ``_updates``, the names,
    ``criterion_logits`` and ``config``."""

    history: History
    _lock: Any
    referral: Any  # gae.refer.Referral
    num_decisions: Tensor
    _updates: int
    category_names: tuple[str, ...]
    action_names: tuple[str, ...]
    criterion_logits: Tensor
    config: Any
    _category_index: Callable[[str | int], int]
    _relearn: Relearn

    def _flushed(self) -> History:
        """The history with the staged decisions in its logs, folded if that puts the decision
        log over ``max_log_events`` (a reader must not keep the bound from holding)."""
        self.history.flush(cast(nn.Module, self), self._relearn)
        return self.history

    def undo_(self, n: int = 1) -> None:
        """Revert the last ``n`` applied decisions exactly: the buffers, the event logs and the
        attention logits are bit for bit what they were before them (skipped decisions among
        them go too; an optimizer's own state, such as Adam's moments, is the caller's to
        restore). The referral (``decide``'s act or refer) loses the entries the undone
        verifications fed (:meth:`gae.refer.Referral.unlearned`; it is not replayed). Raises
        ValueError, changing nothing, when the log holds fewer (``max_log_events`` folds older
        decisions into its base)."""
        n = check.check_int("n", n, low=1)
        with self._lock:
            before = int(self.num_decisions)
            logits = self.history.undo(cast(nn.Module, self), self._relearn, n)
            with torch.no_grad():
                self.criterion_logits.copy_(logits.to(self.criterion_logits.device))
            self._updates += 1
            self.referral.unlearned(np.arange(int(self.num_decisions), before))  # what the undone verifications fed

    def forget_(self, source_ids: Sequence[int] | Tensor | np.ndarray) -> int:
        """Remove every decision with these source ids, as if they had never been learned.

        The state is rebuilt from the log's base by re-learning the other decisions in order
        with the fast engine: gating, first touches, spawns and promotions are recomputed, and
        so are the confirmed flags the memory derived from its own recommendation (a flag the
        caller gave is a fact and is kept). The result equals a fresh memory fed the stream
        without them (the attention, a parameter trained outside the memory, is not unlearned).
        Sequence numbers after the first forgotten decision shift down. Returns how many
        decisions were removed.

        What remains: the forgotten decisions' rows leave the decision log and its event logs,
        the state no longer holds their influence, and the referral loses the entries they fed
        (:meth:`gae.refer.Referral.unlearned`); checkpoints and traces written before
        the call still hold them, and are the caller's to delete.

        Raises:
            ValueError: an id is not in the log (never learned, or folded into its base by
                ``max_log_events``), or ``source_ids`` is not a list of integers.
        """
        wanted = check.source_ids(source_ids)
        with self._lock:
            events = self._flushed().log.events()
            seqs = events["seq"][torch.isin(events["source_id"], wanted.to(events["source_id"].device))]
            removed = self.history.forget(cast(nn.Module, self), self._relearn, wanted)
            self._updates += 1
            self.referral.unlearned(seqs.numpy())  # what the forgotten verifications fed
        return removed

    # -- on a ledger (gae/durable.py) -------------------------------------------------
    def _ledger_settings(self) -> dict[str, Any]:
        return {key: value for key, value in self.config.to_dict().items() if key not in REFER_OPTIONS}

    def _ledger_defaults(self) -> dict[str, Any]:
        return ledger_defaults()

    def _blank(self, categories: tuple[str, ...] | None, actions: tuple[str, ...]) -> Any:
        memory: Any = self
        blank: Any = type(memory)(categories, actions, memory.factor_names, self.config, grow=memory.grow,
                                  max_pending=memory.max_pending, pending_ttl=memory.pending_ttl)
        blank.backend = memory.backend
        return blank

    def _after_delete(self, version: int) -> None:
        self._updates = max(self._updates, version) + 1  # the version only grows, as forget_ in RAM moves it

    def trace(self, category: str | int, action: str | int, top: int = 10, prototype: int = 0) -> Trace:
        """The decisions that moved prototype ``prototype`` of (``category``, ``action``) most,
        with their current weight in it (heaviest first, at most ``top``).

        A decision's weight is the eta of its update times ``1 - eta`` of every later update of
        the same prototype; the weights of all its decisions sum to 1 once it exists. Only the
        prototype's own updates count: a promotion (``drift_mode='adaptive'``) or a push
        (``push_rate``) moves it without being one of them.
        """
        c = self._category_index(category)
        a = check.lookup("action", action, self.action_names)
        top = check.check_int("top", top, low=1)
        prototype = check.check_int("prototype", prototype, low=0)
        if prototype >= self.config.prototypes:
            raise ValueError(f"prototype must be in [0, {self.config.prototypes}), got {prototype}")
        with self._lock:
            return self.history.trace(c, a, prototype, top)

    # -- the logs ---------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The update counter: +1 for every decision passed to ``prequential_`` / ``learn_``
        (learned or skipped) and +1 for every ``undo_`` / ``forget_``: it only grows as the
        memory learns and forgets, and with :func:`gae.traces.writer.state_hash` (the content of the
        buffers and the attention) it names the state an answer was computed on. It travels
        in the ``state_dict``: loading a state brings back the counter that state had."""
        return self._updates

    @property
    def decision_log(self) -> DecisionLog:
        """The :class:`~gae.judgment.history.DecisionLog`: every decision learned since its base state."""
        with self._lock:
            return self._flushed().log

    @property
    def gate_log(self) -> GateLog:
        """Every drift-gate event so far, in stream order (1-D CPU tensors)."""
        with self._lock:
            return self._flushed().joined("gate")

    @property
    def promotion_log(self) -> PromotionLog:
        """Every promotion of the change test so far (``drift_mode='adaptive'``), in stream order."""
        with self._lock:
            return self._flushed().joined("promotion")

    @property
    def recycle_log(self) -> RecycleLog:
        """Every recycled prototype so far (``prototypes > 1``), in stream order."""
        with self._lock:
            return self._flushed().joined("recycle")

    def gate_records(self) -> list[dict[str, Any]]:
        """Every learning event, in stream order, as dicts with names: the drift gate's damped steps
        (``event='gated'``: ``action``, ``disp``, ``eta``), in ``drift_mode='adaptive'`` the
        promotions with their evidence (``event='promoted'``: ``statistic``, ``shadow_right``,
        ``main_right``, ``shift``), and with ``prototypes > 1`` the recycled prototypes
        (``event='recycled'``: ``action``, ``prototype``, ``disp``)."""
        with self._lock:
            return self._flushed().records(self.category_names, self.action_names)

    def promotion_records(self, last: int | None = None) -> list[dict[str, Any]]:
        """The promotions of :meth:`gate_records` alone (the ``last`` ones, or all), without
        building the records of every gate event."""
        with self._lock:
            return self._flushed().promotion_records(self.category_names, last)
