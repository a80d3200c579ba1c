"""The judges' pass of a learning call and of a scoring call: the judges beside the prototypes
score (and learn), and the trust mixes their votes into the memory's answer.

The judges never read one another's state nor the prototypes', and the trust reads only their
votes, so after the prototypes' loop (:mod:`gae.judgment.engine`) each judge runs its own loop
over the batch, then the trust runs one over their votes: the same numbers as one loop over the
decisions interleaving them all. ``backend='reference'`` runs the plain torch of
:mod:`gae.judgment.judges` and :mod:`gae.judgment.trust` one decision at a time; ``'compiled'``
their mirrors in :mod:`gae.judgment.kernels`. The judges learn on private copies, written back
by the caller with the prototypes' (a failure leaves the memory as it was).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from types import ModuleType

import torch
from torch import Tensor

from gae.judgment import judges, trust
from gae.judgment.config import JudgmentConfig
from gae.judgment.kernels import trust as trust_kernels
from gae.types import MemoryOutput


@functools.cache
def kernel_of(kind: str) -> ModuleType:
    """The compiled mirror of judge kind ``kind``: ``gae.judgment.kernels.judges.<kind>``."""
    return importlib.import_module(f"gae.judgment.kernels.judges.{kind}")


def names(config: JudgmentConfig) -> tuple[str, ...]:
    """The names of every buffer of the judges and the trust (what :func:`private_copy` copies)."""
    return tuple(judges.layout(config.judged(), 0, 0, 0))  # the names do not depend on the sizes


def private_copy(buffers: Mapping[str, Tensor], config: JudgmentConfig) -> dict[str, Tensor]:
    """CPU copies of the judges' and the trust's buffers, contiguous."""
    return {name: buffers[name].detach().to("cpu", copy=True).contiguous() for name in names(config)}


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
            trust.trust_step(vote[b], c, a, weights, config.trust_rate, config.trust_share, config.trust_floor)
        return trust.output(probs, config.min_confidence), vote
    scores = torch.zeros(n, 1 + len(members), n_actions)
    for j, judge in enumerate(members, start=1):
        column = torch.empty(n, n_actions)
        kernel_of(judge.kind).prequential(x.numpy(), category.numpy(), action.numpy(), skip.numpy(),
                                          *_arrays(judge, buffers), *judge.options.params(), column.numpy())
        scores[:, j] = column
    out = MemoryOutput(torch.empty(n, n_actions), torch.empty(n, n_actions), torch.empty(n, dtype=torch.int64),
                       torch.empty(n))
    trust_kernels.prequential(scores.numpy(), category.numpy(), action.numpy(), skip.numpy(), weights.numpy(),
                              config.trust_rate, config.trust_share, config.trust_floor, config.min_confidence,
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
        return trust.output(trust.mixture(vote, weights), config.min_confidence), vote
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
                        config.min_confidence, vote.numpy(), *(t.numpy() for t in out))
    return out, vote
