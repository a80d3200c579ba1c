"""The batch every stream yields and every training step consumes."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from training.distributed import gather_batch, rank_and_world


class DecisionBatch(NamedTuple):
    """B verified decisions, in stream order.

    Attributes:
        x: (B, K) float32 factors.
        category: (B,) int64 category index.
        action: (B,) int64 the verified action (what the verifier accepted or chose).
        truth: (B,) int64 the ground-truth action (equal to ``action`` when a stream has no
            separate ground truth, as in files).
        overridden: (B,) bool, the verified action differs from the ground truth (label noise).
        confirmed: (B,) int8, 1 = the verifier confirmed the recommendation, 0 = overrode it,
            -1 = unknown: let the memory compare its own recommendation with ``action``.
        skip: (B,) bool, the outcome is uncertain and must not be learned.
        timestamp: (B,) float64 seconds.
        id: (B,) int64 decision id.
        position: (B,) int64 position of the decision in the stream (0-based).
    """

    x: Tensor
    category: Tensor
    action: Tensor
    truth: Tensor
    overridden: Tensor
    confirmed: Tensor
    skip: Tensor
    timestamp: Tensor
    id: Tensor
    position: Tensor


def gather_decisions(batch: DecisionBatch) -> DecisionBatch:
    """The global batch of a step: every rank's decisions, in rank order (:func:`training.distributed.gather_batch`).

    In one process it is ``batch`` itself. Under ``torch.distributed`` each rank serves its own
    consecutive part of the stream (rank r of W: the stream's batches r, r + W, ...; see
    :class:`~training.data.StreamLoader`), so the concatenation in rank order is a stretch of
    the stream in stream order, and every rank learns it whole.

    Raises:
        ValueError: the decisions are not in stream order (positions not increasing), e.g.
            because every rank served the same batch instead of its own part of the stream.
    """
    gathered = DecisionBatch(*gather_batch(*batch))
    position = gathered.position
    if position.shape[0] > 1 and not bool((position[1:] > position[:-1]).all()):
        _, world = rank_and_world()
        where = f"the batches of {world} ranks, gathered in rank order," if world > 1 else "a batch"
        raise ValueError(f"{where} must hold decisions in stream order (increasing positions), got positions "
                         f"{position.tolist()[:20]}{' ...' if position.shape[0] > 20 else ''}"
                         + ("; under torch.distributed each rank must serve its own part of the stream "
                            "(training.data.StreamLoader does), not the same batches" if world > 1 else ""))
    return gathered
