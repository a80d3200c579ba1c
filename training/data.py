"""Decision streams for Lightning: whole batches in stream order, resumable mid-stream.

A stream is either synthetic (:class:`DecisionStream`) or read from a file
(:class:`FileDecisionStream`); :class:`DecisionStreamDataModule` serves either to a Trainer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from gae import validation as check
from training.batch import DecisionBatch
from training.distributed import rank_and_world
from training.streams import BaseDecisionStream, DecisionStream
from training.streams_file import FileDecisionStream

__all__ = ["BaseDecisionStream", "DecisionBatches", "DecisionStream", "DecisionStreamDataModule",
           "FileDecisionStream", "StreamLoader"]


class DecisionBatches(Dataset[DecisionBatch]):
    """A stream cut into consecutive batches: item ``i`` is decisions ``i * batch_size`` onwards.

    Items are whole batches, so a loader over it needs no collation (``batch_size=None``).
    The last batch is short when the stream length is not a multiple of ``batch_size``.
    """

    def __init__(self, stream: BaseDecisionStream, batch_size: int) -> None:
        self.stream = stream
        self.batch_size = check.check_int("batch_size", batch_size, low=1)

    def __len__(self) -> int:
        return -(-len(self.stream) // self.batch_size)

    def __getitem__(self, i: int) -> DecisionBatch:
        if not 0 <= i < len(self):
            raise IndexError(f"batch index must be in [0, {len(self)}), got {i}")
        start = i * self.batch_size
        return self.stream.batch(start, min(start + self.batch_size, len(self.stream)))


class _PaddedBatches(Dataset[DecisionBatch]):
    """The stream's batches, and an empty batch at every index past the last one."""

    def __init__(self, batches: DecisionBatches) -> None:
        self.batches = batches
        self._empty = DecisionBatch(*(column[:0] for column in batches[0]))

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> DecisionBatch:
        if i >= len(self.batches):
            return DecisionBatch(*(column.clone() for column in self._empty))
        return self.batches[i]


class _StreamOrder(DistributedSampler):
    """The batches this process serves, in stream order.

    One process serves 0, 1, ..., n - 1. Rank r of W (asked at each pass, never at
    construction) serves r, r + W, r + 2W, ...: every step the ranks together serve W
    consecutive batches, which the model gathers in rank order. Every rank takes ceil(n / W)
    steps; an index past the end is an empty batch. A pass after ``start = k`` (a batch of
    the stream) begins at the step that serves batch k (once). It is a DistributedSampler
    only so that Lightning, which otherwise swaps in its own sharding, leaves it alone.
    """

    def __init__(self, batches: DecisionBatches) -> None:
        super().__init__(batches, num_replicas=1, rank=0, shuffle=False)
        self.n = len(batches)
        self.start = 0

    def __len__(self) -> int:
        return -(-self.n // rank_and_world()[1])  # the whole pass: Lightning counts a resumed one from the steps done

    def __iter__(self) -> Iterator[int]:
        rank, world = rank_and_world()
        start, self.start = self.start, 0
        return iter(range(start // world * world + rank, -(-self.n // world) * world, world))


class StreamLoader(DataLoader):
    """Whole batches of a stream in order, never shuffled, resumable where a checkpoint left off.

    Lightning saves ``state_dict()`` in its checkpoints (the loader is ``Stateful``) and hands
    it back to ``load_state_dict()`` when a fit resumes from ``ckpt_path``, so a resumed pass
    starts at the first batch not yet served instead of replaying the stream from its start.
    The next pass (epoch) starts at batch 0 again.

    Under ``torch.distributed`` (decided at each pass) rank r of W serves the stream's batches
    r, r + W, r + 2W, ... and, when the batches run out before the last step, an empty batch,
    so that every rank takes the same ceil(n / W) steps. Gathered in rank order
    (:func:`~training.batch.gather_decisions`), step s is the stream's decisions from
    ``s * W * batch_size`` on: the global stream order is the stream order, in batches W times
    larger. The saved position is a batch of the stream, the same on every rank; resuming
    with another world size starts at the step that holds it (a few decisions may be served
    again, which the model skips by its ``stream_position``).

    Args:
        batches: the stream's batches.
        num_workers: worker processes; batches still arrive in order. Default: 0.
    """

    def __init__(self, batches: DecisionBatches, num_workers: int = 0) -> None:
        self._order = _StreamOrder(batches)
        super().__init__(_PaddedBatches(batches), batch_size=None, sampler=self._order,
                         num_workers=check.check_int("num_workers", num_workers, low=0))
        self._batch_size = batches.batch_size
        self._next = 0  # the batch of the stream the current pass serves next (in the next step, under DDP)

    def __iter__(self) -> Iterator[DecisionBatch]:  # type: ignore[override]  # counts what it hands out
        world = rank_and_world()[1]
        self._next = self._order.start // world * world
        return self._counted(super().__iter__(), world)

    def _counted(self, batches: Iterator[DecisionBatch], world: int) -> Iterator[DecisionBatch]:
        for batch in batches:
            self._next += world  # every rank served its batch of this step
            yield batch

    def state_dict(self) -> dict[str, int]:
        """``{'next_batch': ..., 'batch_size': ...}``: where a resumed pass starts (a batch of the
        stream, the same on every rank)."""
        return {"next_batch": self._next, "batch_size": self._batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["batch_size"] != self._batch_size:
            raise ValueError(f"cannot resume a stream served in batches of {state_dict['batch_size']} with "
                             f"batch_size={self._batch_size}")
        self._next = self._order.start = int(state_dict["next_batch"])


class DecisionStreamDataModule(L.LightningDataModule):
    """Serves a decision stream to a Trainer, batch after batch in stream order.

    One epoch is one pass over the stream; nothing is ever shuffled, and a fit resumed from a
    checkpoint continues where it stopped (see :class:`StreamLoader`). There is no validation
    set: an online memory is evaluated prequentially, on the batches it is trained on.

    Under DDP each rank serves its own part of the stream and the model gathers the parts in
    rank order, so that every rank learns the whole stream (see :class:`StreamLoader`); the
    loader shards itself, whatever ``Trainer(use_distributed_sampler=...)`` says.

    Args:
        stream: the decisions, a :class:`DecisionStream` or a :class:`FileDecisionStream`.
        batch_size: decisions per batch; the last batch is short when needed. Default: 100.
        num_workers: loader worker processes. Default: 0.

    Attributes:
        category_names, action_names, factor_names: the stream's names (the CLI links them into
            the model). n_categories, n_actions, n_factors: their counts.

    In a LightningCLI config the stream is named by its class (``training.data.FileDecisionStream``
    and its ``init_args`` work alike)::

        data:
          stream:
            class_path: training.data.DecisionStream
            init_args: {n_decisions: 2000, drift_at: 1000, seed: 0}
          batch_size: 100

    Examples::

        >>> data = DecisionStreamDataModule(DecisionStream(1050, seed=3), batch_size=100)
        >>> [len(batch.x) for batch in data.train_dataloader()][-2:]
        [100, 50]
    """

    def __init__(self, stream: DecisionStream | FileDecisionStream, *, batch_size: int = 100,
                 num_workers: int = 0) -> None:
        super().__init__()
        if not isinstance(stream, BaseDecisionStream):
            raise TypeError(f"stream must be a DecisionStream or a FileDecisionStream, got {type(stream).__name__}")
        self.stream = stream
        self.batches = DecisionBatches(stream, batch_size)
        self.num_workers = check.check_int("num_workers", num_workers, low=0)

    @property
    def batch_size(self) -> int:
        return self.batches.batch_size

    @property
    def category_names(self) -> tuple[str, ...]:
        return self.stream.category_names

    @property
    def action_names(self) -> tuple[str, ...]:
        return self.stream.action_names

    @property
    def factor_names(self) -> tuple[str, ...]:
        return self.stream.factor_names

    @property
    def n_categories(self) -> int:
        return self.stream.n_categories

    @property
    def n_actions(self) -> int:
        return self.stream.n_actions

    @property
    def n_factors(self) -> int:
        return self.stream.n_factors

    def train_dataloader(self) -> StreamLoader:
        return StreamLoader(self.batches, self.num_workers)
