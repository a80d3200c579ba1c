r"""Keep an online memory identical on every rank of a ``torch.distributed`` job.

An online memory learns in stream order, one decision after another, from the state the
decisions before it left. Data parallelism splits the stream between processes, so no rank
sees the whole of it; averaging the ranks' states afterwards would not give the state of
any stream order. The scheme here keeps the exact semantics instead: every rank serves its
own part of a step's decisions, :func:`gather_batch` concatenates the parts of all ranks in
rank order, and every rank then runs the same exact loop (``prequential_``, ``learn_``,
``add``) over that global batch. The ranks end with identical state, equal to one process
that read the stream in that global order::

    rank 0 serves  d0 d1 d2 |          rank 1 serves  d3 d4 |
    every rank learns  d0 d1 d2 d3 d4   (the global batch, rank order)

It works for every memory of the package alike (:class:`~gae.JudgmentMemory` in every mode,
:class:`~gae.KNNMemory`, :class:`~gae.RetrievalMemory`, :class:`~gae.EpisodicMemory`), since
none of them needs to know it: they are fed the same global batch on every rank.

Whether a process group exists is asked at call time, never at construction (a Lightning or
torchrun job builds the model before it starts the process group). Without a process group,
or with a single process, every function here is the identity.

What it costs: one all-gather of the ranks' batch sizes and one of their bytes per step
(docs/scaling.md measures it), and every rank does the memory work of the whole global
batch, so the memory work per rank does not shrink as ranks are added.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["broadcast_gradients_hook", "gather_batch", "rank_and_world"]


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """``(rank, world size)`` of this process in ``group`` (default: the whole job); ``(0, 1)``
    when no process group is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def gather_batch(*tensors: Tensor, group: Any = None) -> tuple[Tensor, ...]:
    r"""The batches of every rank, concatenated along dim 0 in rank order.

    Each rank passes the same columns (same number, dtypes and trailing shapes) with any
    number of rows, zero included: rank sizes may differ. Every rank gets the same result,
    ``torch.cat([rank 0's rows, rank 1's rows, ...])`` for each column, on the device of its
    input. Without a process group (or with one process) the inputs themselves come back.

    Two collectives per call: an all-gather of each rank's row count and column layout, then
    one all-gather of all columns packed as bytes, padded to the largest rank and trimmed. On
    NCCL they run on the current CUDA device, on Gloo on the CPU. Nothing is differentiable:
    the result carries no gradient.

    A rank whose input is refused (not tensors, no rows dimension, unequal row counts,
    several devices) or that disagrees with the others on the layout makes *every* rank
    raise the same ``ValueError``, so a bad batch never leaves the other ranks waiting.

    Args:
        tensors: columns of this rank's batch, each ``(B_rank, *trailing)``.
        group: the process group. Default: the whole job.

    Returns:
        One tensor per input, ``(sum of B over ranks, *trailing)``.

    Examples::

        >>> x, category = torch.rand(3, 8), torch.tensor([0, 2, 1])
        >>> gathered = gather_batch(x, category)  # one process: the inputs themselves
        >>> gathered[0] is x and gathered[1] is category
        True
    """
    problem = _local_problem(tensors)
    rank, world = rank_and_world(group)
    if world == 1:
        if problem is not None:
            raise ValueError(problem)
        return tuple(tensors)
    device = tensors[0].device if problem is None else torch.device("cpu")
    comm = _comm_device(group, device)
    rows = 0 if problem is not None else tensors[0].shape[0]
    widths = [] if problem is not None else [_row_bytes(t) for t in tensors]
    layout = _layout_signature(tensors) if problem is None else 0
    meta = torch.tensor([problem is None, rows, sum(widths), layout], dtype=torch.int64, device=comm)
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta, group=group)
    table = torch.stack(metas).cpu()  # (world, 4): ok, rows, bytes per row, layout
    refused = [r for r in range(world) if not bool(table[r, 0])]
    if refused:
        raise ValueError(problem if problem is not None else
                         f"gather_batch: rank(s) {refused} passed a batch that was refused (see the error there)")
    if not (bool((table[:, 2] == table[0, 2]).all()) and bool((table[:, 3] == table[0, 3]).all())):
        raise ValueError("gather_batch: the ranks passed different columns (number, dtype or trailing shape "
                         f"differ); rank {rank} passed {_describe(tensors)}")
    sizes = table[:, 1].tolist()
    packed = _pack(tensors, rows, sum(widths)).to(comm)  # (B_rank, bytes per row)
    padded = packed.new_zeros(max(sizes), packed.shape[1])
    padded[:rows] = packed
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    whole = torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])  # (sum B, bytes per row)
    return _unpack(whole.to(device), tensors, widths)


def broadcast_gradients_hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """A DDP communication hook that gives every rank the gradients of rank 0.

    For a loss computed on the gathered global batch (see :func:`gather_batch`), every rank
    already holds the same gradient, and DDP's default average of identical values is exact
    only when the world size is 1 or 2 (``(g / W) * W`` rounds otherwise). Broadcasting rank
    0's gradient keeps the ranks bit-identical and equal to a one-process run for any world
    size, for the same communication. Register it before the first backward::

        ddp_model.register_comm_hook(state=None, hook=broadcast_gradients_hook)

    ``state`` is the process group (None: the whole job).
    """
    buffer = bucket.buffer()
    source = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    work = dist.broadcast(buffer, src=source, group=process_group, async_op=True)
    assert work is not None  # async_op=True always returns the work
    return work.get_future().then(lambda _: buffer)


# -- packing -----------------------------------------------------------------------------------

def _local_problem(tensors: tuple[Any, ...]) -> str | None:
    """Why this rank's columns cannot be gathered, or None."""
    if not tensors:
        return "gather_batch needs at least one tensor"
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            return f"gather_batch: argument {i} must be a tensor, got {type(t).__name__}"
        if t.dim() == 0:
            return f"gather_batch: argument {i} has no rows dimension (a 0-dim tensor); pass shape (B, ...)"
    rows = {t.shape[0] for t in tensors}
    if len(rows) != 1:
        return f"gather_batch: every column must have the same number of rows, got {[t.shape[0] for t in tensors]}"
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"gather_batch: every column must be on one device, got {sorted(str(d) for d in devices)}"
    return None


def _comm_device(group: Any, device: torch.device) -> torch.device:
    """Where the collectives run: CUDA for NCCL, the CPU for Gloo (and anything else)."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and (device.type == "cuda" or "gloo" not in backend):
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _row_bytes(t: Tensor) -> int:
    return _trailing_numel(t) * t.element_size()


def _trailing_numel(t: Tensor) -> int:
    n = 1
    for size in t.shape[1:]:
        n *= size
    return n


def _layout_signature(tensors: tuple[Tensor, ...]) -> int:
    """A number that differs when the columns' count, dtypes or trailing shapes differ."""
    return zlib.crc32(_describe(tensors).encode())


def _describe(tensors: tuple[Any, ...]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{tuple(t.shape[1:])}" if isinstance(t, Tensor)
                     else type(t).__name__ for t in tensors)


def _pack(tensors: tuple[Tensor, ...], rows: int, width: int) -> Tensor:
    """(rows, width) uint8: each row holds the bytes of every column's row, side by side."""
    columns = [t.detach().contiguous().reshape(rows, _trailing_numel(t)).view(torch.uint8) for t in tensors]
    return torch.cat(columns, dim=1) if columns else torch.empty(rows, width, dtype=torch.uint8)


def _unpack(whole: Tensor, like: tuple[Tensor, ...], widths: list[int]) -> tuple[Tensor, ...]:
    out, start = [], 0
    for t, width in zip(like, widths, strict=True):
        # fresh storage: a view of a column of bytes may start at an offset its dtype cannot
        raw = torch.empty(whole.shape[0], width, dtype=torch.uint8, device=whole.device)
        raw.copy_(whole[:, start:start + width])
        start += width
        out.append(raw.view(t.dtype).reshape(whole.shape[0], *t.shape[1:]))
    return tuple(out)
