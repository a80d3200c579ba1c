"""Checks at the public boundary. Each raises with the argument's name and its value.

Public, for code that builds on gae (its training loop and stream readers use them): the same
messages for the same mistakes everywhere. ``Names`` is the type of a ``categories`` /
``actions`` / ``factors`` argument: a count, or a list of distinct non-empty names.
"""

from __future__ import annotations

import functools
import math
import numbers
import reprlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from gae.types import MemoryOutput

Names = int | Sequence[str]
_Init = TypeVar("_Init", bound=Callable[..., None])


def names_by_keyword(init: _Init) -> _Init:
    """Wrap the ``__init__`` of a memory whose ``factors`` and ``actions`` are keyword-only, so that
    a positional call is refused with a message that says why.

    :class:`~gae.JudgmentMemory` takes ``(categories, actions, factors)`` in that order. A k-NN or
    retrieval memory that took ``(factors, actions)`` positionally would read a call written in the
    judgment memory's order, ``KNNMemory(["approve", "reject"], 8)``, as two factors named approve
    and reject and eight actions, silently. So it takes no positional argument, and a positional
    call raises a TypeError naming the keywords, what was given and the judgment memory's order
    (Python's own "takes 1 positional argument" says none of that). ``functools.wraps`` keeps the
    signature that ``inspect.signature`` and the docs show: ``(*, factors, actions, ...)``.
    """
    owner = init.__qualname__.rpartition(".")[0] or init.__name__

    @functools.wraps(init)
    def refuse_positional(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            plural = "s" if len(args) > 1 else ""
            raise TypeError(f"{owner} takes factors= and actions= as keywords, e.g. {owner}(factors=8, "
                            f"actions=['approve', 'reject'], k=5), got {len(args)} positional argument{plural}: "
                            f"{reprlib.repr(args)[1:-1].rstrip(',')}. JudgmentMemory's order is (categories, "
                            "actions, factors): a positional call could swap them unnoticed")
        init(self, **kwargs)

    return cast(_Init, refuse_positional)


def resolve_names(argument: str, value: Names) -> tuple[str, ...]:
    """An int ``n`` names the items ``'0'..'n-1'``; a sequence of distinct strings names them."""
    if isinstance(value, bool):
        raise TypeError(f"{argument} must be an int or a list of names, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{argument} must be >= 1, got {value}")
        return tuple(str(i) for i in range(value))
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{argument} must be an int or a list of names, got {value!r}")
    return _distinct_names(argument, value)


def new_names(argument: str, value: str | Sequence[str], existing: tuple[str, ...]) -> tuple[str, ...]:
    """Names to add to ``existing``: one name or a sequence of them, non-empty strings, distinct
    from each other and from ``existing``."""
    if not isinstance(value, (str, Sequence)) or isinstance(value, (bytes, bytearray)):
        raise TypeError(f"{argument} must be a name or a list of names, got {value!r}")
    names = _distinct_names(argument, [value] if isinstance(value, str) else value)
    known = [name for name in names if name in existing]
    if known:
        raise ValueError(f"{argument} {known!r} already exist; known: {list(existing)}")
    return names


def _distinct_names(argument: str, value: Sequence[Any]) -> tuple[str, ...]:
    names = tuple(value)
    if not names:
        raise ValueError(f"{argument} must name at least one item, got {value!r}")
    if not all(isinstance(name, str) and name for name in names):
        raise TypeError(f"{argument} names must be non-empty strings, got {value!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{argument} names must be distinct, got {value!r}")
    return names


def check_real(argument: str, value: float, *, low: float, high: float = math.inf,
               low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number in the interval ``low..high`` (ends open or closed as given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a real number, got {value!r}")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        # (an infinite end is never in it: the number must be finite)
        opening = "(" if low_open or math.isinf(low) else "["
        interval = f"{opening}{low}, {high}{')' if high_open or math.isinf(high) else ']'}"
        raise ValueError(f"{argument} must be in {interval}, got {value!r}")
    return value


def check_text(argument: str, value: str) -> str:
    """Text a store can keep: UTF-8 encodes it and it holds no NUL (ValueError naming the value
    for a lone surrogate, which Python strings can hold and no file or database can, and for a
    NUL, which Postgres' text refuses and SQLite's C API cuts at)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{argument} must be text UTF-8 can encode (no lone surrogate), got {value!r}") from None
    if "\x00" in value:
        raise ValueError(f"{argument} must not hold a NUL character, got {value!r}")
    return value


def check_int(argument: str, value: int, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{argument} must be >= {low}, got {value}")
    return value


# the largest |value| learned or stored: K (2 x)^2 / tau stays finite in float32, and every mode of the judgment
# memory keeps its state finite for every value inside it (docs/inputs.md, "Extreme values")
LEARN_LIMIT = 1e15


def check_factors(x: Tensor, n_factors: int, device: torch.device, argument: str = "x", *,
                  dtype: torch.dtype = torch.float32, limit: float | None = None) -> Tensor:
    """A finite floating (B, K) tensor with B >= 1 on ``device``, returned contiguous in ``dtype``.

    Its values must fit ``dtype``, the precision the caller computes in (a float64 1e300 is
    finite but becomes inf in float32), and, given ``limit``, lie in ``[-limit, limit]``.
    Any floating dtype and layout is accepted: cast and made contiguous here, so that a
    float16 or a transposed input gives exactly the result of its float32, contiguous copy.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor of shape (B, {n_factors}), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{argument} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() != 2 or x.shape[1] != n_factors:
        raise ValueError(f"{argument} must have shape (B, {n_factors}), got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{argument} is an empty batch (shape {tuple(x.shape)}); pass at least one decision")
    if x.device != device:
        raise ValueError(f"{argument} is on {x.device} but the memory is on {device}")
    bound = torch.finfo(dtype).max if limit is None else min(limit, torch.finfo(dtype).max)
    # one cheap reduction: NaN and Inf propagate into the extremes; only then locate the culprit
    low, high = (float(v) for v in torch.stack(torch.aminmax(x.detach())).tolist())
    if not (-bound <= low and high <= bound):
        values = x.detach()
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{argument} must be finite, got {float(values[row, col])} at [{row}, {col}]")
        row, col = (int(i) for i in (values.abs() > bound).nonzero()[0])
        value = float(values[row, col])
        if bound < torch.finfo(dtype).max:
            raise ValueError(f"{argument} must lie in [-{bound:g}, {bound:g}] to be learned or stored (larger values "
                             f"overflow the float32 arithmetic of the memory's state), got {value:g} at [{row}, {col}]")
        raise ValueError(f"{argument} must fit in {dtype}, the precision the memory computes in, got {value:g} "
                         f"at [{row}, {col}]")
    return x.to(dtype).contiguous()


def check_index(value: Tensor, argument: str, size: int | None, batch: int, device: torch.device,
                names: tuple[str, ...] | None = None) -> Tensor:
    """An integer (B,) tensor with values in ``[0, size)`` (only ``>= 0`` when size is None)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor of shape ({batch},), got {type(value).__name__}")
    if value.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{argument} must be an integer tensor, got dtype {value.dtype}")
    if value.shape != (batch,):
        raise ValueError(f"{argument} must have shape ({batch},), got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{argument} is on {value.device} but the memory is on {device}")
    low, high = (int(v) for v in torch.aminmax(value))
    if low < 0 or (size is not None and high >= size):
        offender = low if low < 0 else high
        known = f" (known: {list(names)})" if names is not None else ""
        limit = f"[0, {size})" if size is not None else ">= 0"
        raise ValueError(f"{argument} must be in {limit}{known}, got {offender}")
    return value.long()


def check_flags(value: Tensor | None, argument: str, batch: int, device: torch.device) -> Tensor | None:
    """None, or a bool (B,) tensor."""
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        got = value.dtype if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(f"{argument} must be None or a bool tensor of shape ({batch},), got {got}")
    if value.shape != (batch,):
        raise ValueError(f"{argument} must have shape ({batch},), got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{argument} is on {value.device} but the memory is on {device}")
    return value


def lookup(argument: str, value: int | str, names: tuple[str, ...]) -> int:
    """Index of a name, or an int index checked against the number of names."""
    if isinstance(value, str):
        try:
            return names.index(value)
        except ValueError:
            raise ValueError(f"unknown {argument} {value!r}; known: {list(names)}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be a name or an int index, got {value!r}")
    if not 0 <= value < len(names):
        raise ValueError(f"{argument} index must be in [0, {len(names)}), got {value}")
    return int(value)


def plain_ids(argument: str, value: Any, ranks: Sequence[int] | None, *, names: bool = False) -> Any:
    """A torch tensor (any device) or numpy array or scalar of ids as Python values: an int (0-D),
    a list (1-D) or a list of lists (2-D). Any other value is returned as given, for the caller's
    own checks of lists and plain values.

    The tensor or array must hold integers (or, with ``names``, numpy strings: scope names) and
    have one of ``ranks`` dimensions (None: any); otherwise the error names ``argument`` and the
    values. A float, bool or complex tensor is refused even when its values are whole numbers.

    Examples::

        >>> plain_ids("scopes", torch.tensor([[3], [1]]), (1, 2))
        [[3], [1]]
        >>> plain_ids("scope", np.int64(5), (0, 1))
        5
    """
    if isinstance(value, Tensor):
        if value.device.type == "meta":
            raise TypeError(f"{argument} is a meta tensor (no values); pass its values on a real device")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{argument} must hold integers{' or names' if names else ''}, got {value.dtype} "
                            f"{_preview(value)}")
        dims = value.dim()
    elif isinstance(value, (np.ndarray, np.generic)) and not isinstance(value, (str, bytes)):
        value = np.asarray(value)
        if value.dtype.kind not in ("iuU" if names else "iu"):
            raise TypeError(f"{argument} must hold integers{' or names' if names else ''}, got numpy "
                            f"{value.dtype} {_preview(value)}")
        dims = value.ndim
    else:
        return value
    if ranks is not None and dims not in ranks:
        expected = " or ".join(f"{rank}-D" for rank in ranks)
        raise ValueError(f"{argument} must be a {expected} tensor or array, got shape {tuple(value.shape)}: "
                         f"{_preview(value)}")
    return value.tolist()


def _preview(values: Tensor | np.ndarray) -> str:
    """The first values of a tensor or array, for an error message."""
    flat = values.reshape(-1)
    return f"{flat[:6].tolist()}{' ...' if flat.shape[0] > 6 else ''}"


def source_id(value: Any) -> int | None:
    """One decision's source id: None, or an int in [0, 2**63) (a NumPy integer too).

    Raises:
        TypeError: not an integer (a bool, a float, text), naming the value.
        ValueError: out of range, naming the value.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"source_id must be an int >= 0 or None, got {value!r}")
    if not 0 <= int(value) < 2**63:
        raise ValueError(f"source_id must be an int in [0, 2**63) or None, got {value!r}")
    return int(value)


def source_ids(value: Any) -> Tensor:
    """The source ids of ``forget_`` as a 1-D int64 tensor: an int, a list of ints, or an integer
    tensor or array (0-D or 1-D, any device).

    Raises:
        ValueError: anything else (floats, bools, text, 2-D, empty, beyond int64), naming the value.
    """
    try:
        ids = plain_ids("source_ids", value, (0, 1))
        ids = [ids] if isinstance(ids, numbers.Integral) else list(ids)
        ids = [plain_ids("source_ids", i, (0,)) for i in ids]  # numpy and 0-D tensor elements of a list
        if not ids or any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in ids):
            raise ValueError
        return torch.tensor(ids, dtype=torch.int64)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        raise ValueError(f"source_ids must be a non-empty list of integers, got {value!r}") from None


def check_out(out: Any, x: Tensor, needs_grad: bool, n_actions: int, dtype: torch.dtype,
              device: torch.device) -> None:
    """An ``out=`` for a judgment memory's ``forward`` (see ``JudgmentMemory.forward``): a
    :class:`~gae.types.MemoryOutput` of contiguous (B, A) logits and probs, (B,) int64 action and
    (B,) confidence in ``dtype`` on ``device``, sharing no memory with ``x`` or each other, and
    only where no gradient is needed; else a TypeError / ValueError naming the field."""

    if not isinstance(out, MemoryOutput):
        raise TypeError(f"out must be a MemoryOutput or None, got {type(out).__name__}")
    if needs_grad:
        raise ValueError("out cannot hold a result that needs a gradient; score under torch.no_grad()")
    batch = x.shape[0]
    expected = {"logits": ((batch, n_actions), dtype), "probs": ((batch, n_actions), dtype),
                "action": ((batch,), torch.int64), "confidence": ((batch,), dtype)}
    for name, (shape, kind) in expected.items():
        tensor = getattr(out, name)
        if not isinstance(tensor, Tensor) or tensor.shape != shape or tensor.dtype != kind:
            got = (tuple(tensor.shape), tensor.dtype) if isinstance(tensor, Tensor) else type(tensor).__name__
            raise ValueError(f"out.{name} must be a {kind} tensor of shape {shape}, got {got}")
        if tensor.device != device or not tensor.is_contiguous() or tensor.requires_grad:
            raise ValueError(f"out.{name} must be contiguous, on {device} and not require grad")
    # the kernel writes a block of rows while reading later rows of x: nothing may share memory
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
                   for name, t in (("x", x), *zip(MemoryOutput._fields, out, strict=True)) if t.numel())
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            one, other = sorted((first, second), key=lambda name: name == "x")  # x named last
            raise ValueError(f"out.{one} overlaps {'x' if other == 'x' else 'out.' + other}: "
                             "give each output its own memory")


class ScopeLists(NamedTuple):
    """``retrieve``'s ``scopes`` as plain values: one list shared by every query, or one per query."""

    values: list[Any]  # names and ints; with per_query, one such list per query
    per_query: bool


def scope_lists(scopes: Any, n_queries: int) -> ScopeLists | None:
    """``scopes`` of a retrieval over ``n_queries`` queries: None (every scope), a list shared by
    every query (or a 1-D integer tensor or array), or one list per query (a list of lists or of
    1-D tensors, or a 2-D tensor or array, one row per query). Entries are checked by the caller."""
    if scopes is None:
        return None
    scopes = plain_ids("scopes", scopes, (1, 2), names=True)
    if isinstance(scopes, (str, bytes, bytearray)) or not isinstance(scopes, Sequence):
        raise TypeError(f"scopes must be None, a list of scopes or one list per query, got {scopes!r}")
    items = [plain_ids("scopes", s, (0, 1), names=True) for s in scopes]
    if not (items and all(isinstance(s, (list, tuple)) for s in items)):
        return ScopeLists(items, per_query=False)
    if len(items) != n_queries:
        raise ValueError(f"scopes must have one list per query ({n_queries}), got {len(items)}")
    return ScopeLists([[plain_ids("scopes", s, (0,), names=True) for s in row] for row in items], per_query=True)
