"""How a judgment memory's judges take part: the judges beside the prototypes score (and learn),
and the trust mixes their votes into the memory's answer, in a batch or one decision at a time.

The judges never read one another's state nor the prototypes', and the trust reads only their
votes, so after the prototypes' loop (:mod:`gae.judgment.engine`) each judge runs its own loop
over the batch, then the trust runs one over their votes: the same numbers as one loop over the
decisions interleaving them all. ``backend='reference'`` runs the plain torch of
:mod:`gae.judgment.judges` and :mod:`gae.judgment.trust` one decision at a time; ``'compiled'``
their mirrors in :mod:`gae.judgment.kernels`. The judges learn on private copies, written back
by the caller with the prototypes' (a failure leaves the memory as it was).

One decision at a time, :class:`JudgeHost` keeps NumPy views of the judges' and the trust's
buffers and each judge kernel's entry point (:func:`gae.compiled.entry_point`), rebuilt when a
buffer is replaced. After the prototypes scored (or learned, on :mod:`gae.judgment.online`'s
staged row), it scores the decision with every judge, mixes the votes
(:func:`gae.judgment.kernels.trust.judge_one`) and, when learning, teaches each judge and steps the
trust: the numbers the batched pass computes. It does all of that in one compiled call
(:mod:`gae.judgment.kernels.judges.fused`, the judges' buffers in an
:class:`~gae.compiled.ArrayTable`); with ``JudgeHost.one_call`` off, in one call per judge and one
to mix, as the batched pass's kernels do (the tests hold the two bit-equal).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor
from torch._C import TensorBase

from gae.compiled import ArrayTable, entry_point
from gae.judgment import judges, trust
from gae.judgment.config import JudgmentConfig
from gae.judgment.explain import Threshold
from gae.judgment.judges import bins
from gae.judgment.kernels import trust as trust_kernels
from gae.judgment.kernels.judges import fused
from gae.types import MemoryOutput


@functools.cache
def kernel_of(kind: str) -> ModuleType:
    """The compiled mirror of judge kind ``kind``: ``gae.judgment.kernels.judges.<kind>``."""
    return importlib.import_module(f"gae.judgment.kernels.judges.{kind}")


def names(config: JudgmentConfig) -> tuple[str, ...]:
    """The names of every buffer of the judges and the trust (what :func:`private_copy` copies)."""
    return tuple(judges.layout(config.judged(), 0, 0, 0))  # the names do not depend on the sizes


def private_copy(buffers: Mapping[str, Tensor | None], config: JudgmentConfig) -> dict[str, Tensor]:
    """CPU copies of the judges' and the trust's buffers, contiguous."""
    return {name: cast(Tensor, buffers[name]).detach().to("cpu", copy=True).contiguous() for name in names(config)}


def _arrays(judge: judges.Judge, buffers: Mapping[str, Tensor]) -> list:
    return [tensor.numpy() for tensor in judges.state_of(judge, buffers).values()]


def prequential(buffers: dict[str, Tensor], config: JudgmentConfig, x: Tensor, category: Tensor, action: Tensor,
                skip: Tensor, own_probs: Tensor, backend: str = "compiled") -> tuple[MemoryOutput, Tensor]:
    """Score-before-learn of the judges and the trust over a batch, in stream order, updating
    the CPU ``buffers`` (:func:`private_copy`) in place.

    Args:
        x: (B, K) float32; category, action: (B,) int64; skip: (B,) bool.
        own_probs: (B, A) the prototypes' pre-learning probabilities (their vote).

    Returns:
        the memory's pre-learning :class:`MemoryOutput` (the mixture) and the (B, J, A) votes
        (judge 0: the prototypes).
    """
    members = config.judged()
    n, n_actions = own_probs.shape
    vote = torch.zeros(n, 1 + len(members), n_actions)
    vote[:, 0] = own_probs
    weights = buffers["trust_weights"]
    if backend == "reference":
        probs = torch.zeros(n, n_actions)
        for b in range(n):
            c, a = int(category[b]), int(action[b])
            for j, judge in enumerate(members, start=1):
                vote[b, j] = trust.votes(judges.log_scores(judge, x[b:b + 1], category[b:b + 1], buffers)[0])
            probs[b] = trust.mixture(vote[b:b + 1], trust.weights_of(weights[c])[None])[0]
            if skip[b]:
                continue
            for judge in members:
                judges.learn(judge, x[b], c, a, buffers)
            trust.trust_step(vote[b], c, a, weights, config.trust.rate, config.trust.share, config.trust.floor)
        return trust.output(probs, config.rule.min_confidence), vote
    scores = torch.zeros(n, 1 + len(members), n_actions)
    for j, judge in enumerate(members, start=1):
        column = torch.empty(n, n_actions)
        kernel_of(judge.kind).prequential(x.numpy(), category.numpy(), action.numpy(), skip.numpy(),
                                          *_arrays(judge, buffers), *judge.options.params(), column.numpy())
        scores[:, j] = column
    out = MemoryOutput(torch.empty(n, n_actions), torch.empty(n, n_actions), torch.empty(n, dtype=torch.int64),
                       torch.empty(n))
    trust_kernels.prequential(scores.numpy(), category.numpy(), action.numpy(), skip.numpy(), weights.numpy(),
                              config.trust.rate, config.trust.share, config.trust.floor, config.rule.min_confidence,
                              vote.numpy(), *(t.numpy() for t in out))
    return out, vote


def score(buffers: Mapping[str, Tensor], config: JudgmentConfig, x: Tensor, category: Tensor,
          own_probs: Tensor, compiled: bool) -> tuple[MemoryOutput, Tensor]:
    """The mixture's :class:`MemoryOutput` for a batch and the (B, J, A) votes, nothing learned.
    The reference (``compiled=False``) is differentiable in ``x`` and ``own_probs``."""
    members = config.judged()
    weights = trust.weights_of(buffers["trust_weights"])[category]  # (B, J)
    if not compiled:
        columns = [own_probs] + [trust.votes(judges.log_scores(judge, x, category, buffers)) for judge in members]
        vote = torch.stack(columns, 1)
        return trust.output(trust.mixture(vote, weights), config.rule.min_confidence), vote
    n, n_actions = own_probs.shape
    x32, category = x.detach().to(torch.float32).contiguous(), category.contiguous()
    scores = torch.zeros(n, 1 + len(members), n_actions)
    for j, judge in enumerate(members, start=1):
        column = torch.empty(n, n_actions)
        arrays = [tensor.detach().contiguous().numpy() for tensor in judges.state_of(judge, buffers).values()]
        kernel_of(judge.kind).score(x32.numpy(), category.numpy(), *arrays, *judge.options.params(), column.numpy())
        scores[:, j] = column
    vote = torch.zeros(n, 1 + len(members), n_actions)
    vote[:, 0] = own_probs.detach()
    out = MemoryOutput(torch.empty(n, n_actions), torch.empty(n, n_actions), torch.empty(n, dtype=torch.int64),
                       torch.empty(n))
    trust_kernels.score(scores.numpy(), category.numpy(), buffers["trust_weights"].detach().contiguous().numpy(),
                        config.rule.min_confidence, vote.numpy(), *(t.numpy() for t in out))
    return out, vote


def thresholds(buffers: Mapping[str, Tensor], config: JudgmentConfig, x: Tensor, category: Tensor,
               action_names: tuple[str, ...], factor_names: tuple[str, ...]) -> tuple[tuple[Threshold, ...], ...]:
    """Per decision, the bins that decided each ``bins`` judge's answer
    (:func:`gae.judgment.judges.bins.evidence`), named: the explanation's ``thresholds``."""
    found: list[list[Threshold]] = [[] for _ in range(x.shape[0])]
    for judge in config.judged():
        if judge.kind != "bins":
            continue
        for row, reasons in zip(found, bins.evidence(x, category, judges.state_of(judge, buffers), judge.options),
                                strict=True):
            row += [Threshold(judge.name, factor_names[e.factor], e.low, e.high, action_names[e.action],
                              action_names[e.rival], e.nats) for e in reasons]
    return tuple(tuple(row) for row in found)


def check_state(saved: Mapping[str, Any], config: JudgmentConfig) -> None:
    """Refuse a state saved with other judges than ``config``'s (``saved``: the config it was saved with)."""
    value = {name: spec.get("kind", name) for name, spec in (saved.get("judges") or {}).items()}
    mine = {judge.name: judge.kind for judge in config.judged()}
    if value != mine:
        raise ValueError(f"state_dict was saved with the judges {value!r} but this memory has {mine!r}; "
                         f"build the memory with the config it was saved with to load it")


class JudgeHost:
    """Views and entry points for one memory's judges (see the module)."""

    one_call = True  # one compiled call per decision (kinds fused.KINDS holds); off: the per-judge calls

    def __init__(self, config: JudgmentConfig) -> None:
        self.config = config
        self.names = names(config)
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
        row = np.zeros(0)  # for its type: entry_point compiles for the arguments' types
        states = [tuple(t.detach().numpy() for t in judges.state_of(judge, buffers).values()) for judge in members]
        options = [judge.options.params() for judge in members]
        config = self.config
        self.mixing = (config.trust.rate, config.trust.share, config.trust.floor, config.rule.min_confidence)
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
            kernel = kernel_of(judge.kind)
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
