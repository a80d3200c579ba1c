"""The judges on the single-decision path: ``score_one`` and ``learn_one`` of a memory with judges.

:class:`JudgeHost` keeps NumPy views of the judges' and the trust's buffers and each judge
kernel's entry point (:func:`gae.compiled.entry_point`), rebuilt when a buffer is replaced. After
the prototypes scored (or learned, on :mod:`gae.judgment.online`'s staged row), it scores the
decision with every judge, mixes the votes (:func:`gae.judgment.kernels.trust.judge_one`) and,
when learning, teaches each judge and steps the trust: the numbers the batched pass
(:mod:`gae.judgment.judged`) computes, one decision at a time. It does all of that in one
compiled call (:mod:`gae.judgment.kernels.judges.fused`, the judges' buffers in an
:class:`~gae.compiled.ArrayTable`); with ``JudgeHost.one_call`` off, in one call per judge and
one to mix, as the batched pass's kernels do (the tests hold the two bit-equal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor
from torch._C import TensorBase

from gae.compiled import ArrayTable, entry_point
from gae.judgment import judged, judges, kernels
from gae.judgment.config import JudgmentConfig
from gae.judgment.kernels import trust as trust_kernels
from gae.judgment.kernels.judges import fused


class JudgeHost:
    """Views and entry points for one memory's judges (see the module)."""

    one_call = True  # one compiled call per decision (kinds fused.KINDS holds); off: the per-judge calls

    def __init__(self, config: JudgmentConfig) -> None:
        self.config = config
        self.names = judged.names(config)
        layout = judges.layout(config.judged(), 0, 0, 0)  # the dtypes do not depend on the sizes
        self.dtypes = tuple(layout[name][1] for name in self.names)  # as the kernels read them
        self.tensors: tuple[Tensor, ...] = ()
        self.pointers: tuple[int, ...] = (-1,)

    def fresh(self) -> JudgeHost:
        """A holder of no views for the same config (a copy, or after a tensor was replaced)."""
        return JudgeHost(self.config)

    def get(self, buffers: dict[str, Any]) -> JudgeHost | None:
        """Itself while its views are valid, else built again; None when a buffer is not a
        contiguous CPU tensor of its layout's dtype (the caller takes the checked path)."""
        # a replaced buffer drops the views (DecisionMemory._drop_views): what is left to see is data that moved
        if self.tensors and tuple(map(TensorBase.data_ptr, self.tensors)) == self.pointers:
            return self
        tensors = tuple(buffers[name] for name in self.names)
        if any(t.device.type != "cpu" or not t.is_contiguous() or t.dtype != dtype
               for t, dtype in zip(tensors, self.dtypes, strict=True)):
            return None
        self.pointers = (-1,)  # invalid until the build below completes: one interrupted is built again
        self._build(buffers)
        self.tensors, self.pointers = tensors, tuple(map(TensorBase.data_ptr, tensors))
        return self

    def _build(self, buffers: dict[str, Any]) -> None:
        """The views, scratch arrays and entry points of :meth:`get`."""
        members = self.config.judged()
        n_actions = buffers[judges.buffer_name(members[0], "weights")].shape[1]
        self.scores = np.zeros((1 + len(members), n_actions), np.float32)
        self.vote = np.zeros_like(self.scores)
        self.logits = np.zeros(n_actions, np.float32)
        self.probs = np.zeros(n_actions, np.float32)
        self.trust = buffers["trust_weights"].detach().numpy()
        row = np.zeros(buffers[judges.buffer_name(members[0], "means")].shape[2])
        states = [tuple(t.detach().numpy() for t in judges.state_of(judge, buffers).values()) for judge in members]
        options = [judge.options.params() for judge in members]
        config = self.config
        self.mixing = (config.trust_rate, config.trust_share, config.trust_floor, config.min_confidence)
        self.fused_call: Callable[..., Any] | None = None
        if self.one_call and all(judge.kind in fused.KINDS for judge in members):  # else the per-judge calls
            self.table = ArrayTable((self.trust, self.scores, self.vote, self.logits, self.probs)
                                    + tuple(array for arrays in states for array in arrays))
            self.layout = np.zeros((len(members), 2), np.int64)  # each judge's kind code and first buffer
            self.params = np.zeros((len(members), max(map(len, options))))
            first = len(fused.TABLE_HEAD)
            for j, judge in enumerate(members):
                self.layout[j] = fused.KINDS.index(judge.kind), first
                self.params[j, :len(options[j])] = options[j]
                first += len(states[j])
            self.fused_call = entry_point(fused.decide, row, 0, 0, self.logits, False, self.table.addresses,
                                          self.table.shapes, self.layout, self.params, *self.mixing)
            return
        self.calls = []
        for j, (judge, arrays, params) in enumerate(zip(members, states, options, strict=True), start=1):
            kernel = judged.kernel_of(judge.kind)
            score = entry_point(kernel.log_scores, row, 0, *arrays, *params, self.scores[j])
            learn = entry_point(kernel.learn, row, 0, 0, *arrays, *params)
            self.calls.append((score, learn, arrays + params, self.scores[j]))
        self.mix = entry_point(trust_kernels.judge_one, self.scores, False, 0, 0, False, self.trust, *self.mixing,
                               self.vote, self.logits, self.probs)

    def decide(self, row: np.ndarray, c: int, own: np.ndarray, own_logits: bool, a: int = -1) -> tuple[int, float]:
        """The mixture's ``(action, confidence)`` for one decision (``probs`` holds its
        probabilities) from the prototypes' (A,) float32 ``own`` probabilities, or ``own_logits``;
        with ``a >= 0`` every judge then learns it as verified ``a``, and the trust. One compiled
        call (:func:`gae.judgment.kernels.judges.fused.decide`), or with ``one_call`` off one per
        judge and one to mix, the same numbers."""
        if self.fused_call is not None:
            table = self.table
            return self.fused_call(row, c, a, own, own_logits, table.addresses, table.shapes, self.layout,
                                   self.params, *self.mixing)
        self.scores[0] = own
        for score, _, args, out in self.calls:
            score(row, c, *args, out)
        action, confidence = self.mix(self.scores, own_logits, c, max(a, 0), a >= 0, self.trust, *self.mixing,
                                      self.vote, self.logits, self.probs)
        if a >= 0:
            for _, learn, args, _ in self.calls:
                learn(row, c, a, *args)
        return action, confidence


class JudgedOneMixin:
    """``score_one`` / ``learn_one`` of a memory with judges on the single-decision path, the part
    :class:`~gae.judgment.online.SingleDecisionMixin` (its subclass) calls once the prototypes'
    views (its ``HostState``) are at hand."""

    _judge_host: JudgeHost
    _buffers: dict[str, Any]
    _options: Any
    history: Any
    _relearn: Any
    _stage: Any

    def _judged_one(self, host: Any, row: np.ndarray, c: int) -> tuple[int, float, np.ndarray] | None:
        """The judges' mixture for one decision (:mod:`gae.judgment.online_judges`), after the
        prototypes scored it: ``(action, confidence, probs)``, or None for the checked path (``probs``
        is the host's scratch, valid until its next decision)."""
        judge_host = self._judge_host.get(self._buffers)
        if judge_host is None:
            return None
        action, _ = host.score_row(row, c, self._options)
        if action == kernels.NOT_FINITE:
            return None
        assert host.score_table is not None  # bound by the score just taken
        # score_one_at's scratch: this row's logits, the prototypes' vote's
        action, confidence = judge_host.decide(row, c, host.score_table.arrays[8], True)
        return action, confidence, judge_host.probs

    def _stage_judged(self, host: Any, row: np.ndarray, c: int, a: int, confirmed: bool | None,
                      skip: bool) -> tuple | None:
        """:meth:`_stage` for a memory with judges: the prototypes learn the staged row, then the
        judges and the trust learn the decision from the prototypes' vote on that row."""
        judge_host = self._judge_host.get(self._buffers)
        if judge_host is None:
            return None
        learned = self._stage(host, row, c, a, confirmed, skip)
        if learned is None:
            return None
        staged = self.history.staged
        if not learned[1]:  # not skipped
            judge_host.decide(row, c, staged.arrays[5][1, staged.n - 1], False, a)  # the row's probs
        if staged.n == staged.capacity:
            self.history.flush(self, self._relearn)
        return learned
