"""The exact online engine of the judgment memory: dispatch, private CPU copies, write-back.

A prequential pass scores decision ``t`` with the state left by decisions ``0..t-1`` and then
learns from it, which is inherently sequential. The state is tiny, so the loop runs as a
compiled kernel (:func:`gae.judgment.kernels.prequential`) on CPU copies of the state;
``backend='reference'`` runs the plain torch rule (:func:`gae.judgment.rule.prequential`)
that the tests hold it equal to. A batch lands whole: the copies are written back only after
the loop has finished, so a failure leaves the memory as it was.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from gae.judgment import kernels, rule
from gae.judgment.config import JudgmentConfig
from gae.judgment.state import JudgmentState
from gae.types import LearnEvents, MemoryOutput, PromotionLog, StreamStep

BACKENDS = ("compiled", "reference")


def private_copy(state: JudgmentState) -> JudgmentState:
    """CPU copies of every state tensor, contiguous (the empty buffers of a feature that is off
    are shared: nothing writes them)."""
    return JudgmentState(*(t if t.numel() == 0 and t.device.type == "cpu" else t.detach().to("cpu", copy=True)
                           .contiguous() for t in state))


def write_back(state: JudgmentState, learned: JudgmentState) -> None:
    """Copy the learned CPU state into the module's buffers, wherever they live."""
    for mine, new in zip(state, learned, strict=True):
        if mine is not new:
            mine.copy_(new)


def prequential(state: JudgmentState, config: JudgmentConfig, alpha: Tensor, x: Tensor, category: Tensor,
                action: Tensor, confirmed: Tensor | None, skip: Tensor, *, given: Tensor | None = None,
                backend: str = "compiled") -> tuple[StreamStep, PromotionLog]:
    """Score-before-learn over a batch, in stream order, updating the CPU ``state`` in place.

    Args:
        state: CPU tensors (:func:`private_copy`); alpha: (C, K) attention; x: (B, K) float32;
            category, action: (B,) int64; skip: (B,) bool.
        confirmed: (B,) bool, or None: the memory's own recommendation decides.
        given: (B,) bool, which of ``confirmed`` were given (the others are derived from the
            recommendation, as with ``confirmed=None``). Default: all of them.
        backend: ``'compiled'`` or ``'reference'``.

    Returns:
        the :class:`StreamStep` and the promotions it made (``step`` = position in the batch).
    """
    n, n_factors = x.shape
    if confirmed is None:
        confirmed, given = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    elif given is None:
        given = torch.ones(n, dtype=torch.bool)
    x, category, action, confirmed, given, skip, alpha = (
        t.to("cpu").contiguous() for t in (x, category, action, confirmed, given, skip, alpha))
    if backend == "reference":
        return rule.prequential(state, config, alpha, x, category, action, confirmed, given, skip)
    n_actions = state.centroids.shape[1]
    out = MemoryOutput(torch.empty(n, n_actions), torch.empty(n, n_actions), torch.empty(n, dtype=torch.int64),
                       torch.empty(n))
    sq_diff, nearest = torch.empty(n, n_actions, n_factors), torch.empty(n, n_actions, dtype=torch.int64)
    before, events = torch.zeros(n, n_factors), LearnEvents.empty(n)
    promotions = (torch.zeros(n), torch.zeros(n, 2, dtype=torch.int64), torch.zeros(n))
    arrays: Any = JudgmentState  # the same records, holding the tensors' numpy views
    kernels.prequential(
        arrays(*(t.numpy() for t in state)), kernels.Options.of(config), alpha.numpy(), x.numpy(),
        category.numpy(), action.numpy(), confirmed.numpy(), given.numpy(), skip.numpy(),
        (*(t.numpy() for t in out), sq_diff.numpy(), nearest.numpy(), before.numpy()),
        cast(Any, type(events))(*(t.numpy() for t in events)), tuple(t.numpy() for t in promotions), 0, n)
    step = StreamStep(out, events, sq_diff, nearest, before)
    return step, rule.promotions_of(events, category, *promotions)
