"""Checks and column builders of :class:`~gae.EpisodicMemory`: one value or one per memory, validated."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gae.validation import plain_ids

MEMORY_TYPES = ("episode", "semantic")


def per_memory(name: str, value: Any, n: int, device: torch.device, *, low: float = -math.inf,
               high: float = math.inf, dtype: torch.dtype = torch.float32, finite: bool = True) -> Tensor:
    """An (n,) column from one value or n values, each checked to lie in ``[low, high]``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # one plain number, the common case of per-event adds: check it in Python, no tensor passes
        number = float(value)
        if math.isnan(number) or (finite and math.isinf(number)) or not low <= number <= high:
            raise ValueError(f"{name} must be {'finite and ' if finite else ''}in [{low}, {high}], got {number}")
        return torch.full((n,), number, dtype=dtype, device=device)
    if isinstance(value, Tensor) and value.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (no values); pass it on the memory's device ({device})")
    try:
        tensor = torch.as_tensor(value, dtype=dtype, device=device)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        raise TypeError(f"{name} must be one number or one per memory, got {value!r} ({error})") from None
    if tensor.dim() == 0:
        tensor = tensor.expand(n)
    if tensor.shape != (n,):
        raise ValueError(f"{name} must be one value or ({n},), got shape {tuple(tensor.shape)}")
    bad = torch.isnan(tensor) | (~torch.isfinite(tensor) if finite else torch.zeros_like(tensor, dtype=torch.bool))
    bad |= (tensor < low) | (tensor > high)
    if bool(bad.any()):
        raise ValueError(f"{name} must be {'finite and ' if finite else ''}in [{low}, {high}], "
                         f"got {float(tensor[bad][0])}")
    return tensor


def scope_index(scope: Any, names: Sequence[str], argument: str) -> int:
    """Int scopes are stored as given (>= 0); the name ``names[i]`` is stored as ``-1 - i``."""
    if isinstance(scope, str):
        if scope not in names:
            raise ValueError(f"unknown scope {scope!r} in {argument}; known: {list(names)}")
        return -1 - list(names).index(scope)
    if isinstance(scope, bool) or not isinstance(scope, int) or not 0 <= scope < 2**63:
        raise ValueError(f"{argument} must be a name or an int in [0, 2**63), got {scope!r}")
    return scope


def scope_column(scope: Any, n: int, known: Sequence[str], device: torch.device) -> tuple[Tensor, list[str]]:
    """The (n,) scope column, and the new names it uses (registered by the caller once the add is valid).

    ``scope``: one name or int (a 0-D integer tensor or numpy scalar too), or one per memory (a
    list, or a 1-D integer tensor or array, or a numpy array of names)."""
    scope = plain_ids("scope", scope, (0, 1), names=True)
    if isinstance(scope, (bytes, bytearray)) or not isinstance(scope, (str, int, Sequence)):
        raise TypeError(f"scope must be a name, an int or one per memory (a list, 1-D tensor or array), "
                        f"got {scope!r}")
    values = [scope] * n if isinstance(scope, (str, int)) else [plain_ids("scope", s, (0,), names=True)
                                                                 for s in scope]
    if len(values) != n:
        raise ValueError(f"scope must be one value or one per memory ({n}), got {len(values)}")
    new_names = [name for name in dict.fromkeys(v for v in values if isinstance(v, str)) if name not in known]
    reserved = [name for name in new_names if name.startswith("#")]
    if reserved:  # '#5' is how stores write the integer scope 5
        raise ValueError(f"scope names may not start with '#' (reserved for integer scopes), got {reserved[0]!r}")
    names = [*known, *new_names]
    column = torch.tensor([scope_index(s, names, "scope") for s in values], dtype=torch.int64, device=device)
    return column, new_names


def source_rows(source_ids: Any, n: int) -> list[tuple[int, ...]]:
    """``add``'s provenance: one tuple of int64 ids per memory, from one list of ids per memory (or
    a list of 1-D integer tensors or arrays), or a 2-D integer tensor or array (one row per memory)."""
    if source_ids is None:
        return [() for _ in range(n)]
    source_ids = plain_ids("source_ids", source_ids, (2,))
    if isinstance(source_ids, (str, bytes)) or not isinstance(source_ids, Sequence):
        raise TypeError(f"source_ids must be one list of integer ids per memory, got {source_ids!r}")
    rows = []
    for i, row in enumerate(source_ids):
        values = plain_ids(f"source_ids[{i}]", row, (1,))
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"source_ids[{i}] must be a list of integer ids, got {row!r}")
        values = [plain_ids(f"source_ids[{i}]", v, (0,)) for v in values]
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
        if bad:
            raise TypeError(f"source_ids[{i}] must hold integer ids, got {bad[0]!r}")
        if any(not -2**63 <= v < 2**63 for v in values):
            raise ValueError(f"source_ids[{i}] must hold int64 ids, got {values!r}")
        rows.append(tuple(int(v) for v in values))
    if len(rows) != n:
        raise ValueError(f"source_ids must have one entry per memory ({n}), got {len(rows)}")
    return rows


def memory_type_column(memory_type: Any, n: int, device: torch.device) -> Tensor:
    """The (n,) memory-type column (indices into :data:`MEMORY_TYPES`)."""
    if not isinstance(memory_type, (str, Sequence)):
        raise TypeError(f"memory_type must be one of {MEMORY_TYPES}, once or per memory, got {memory_type!r}")
    values = [memory_type] * n if isinstance(memory_type, str) else list(memory_type)
    unknown = [v for v in values if v not in MEMORY_TYPES]
    if unknown or len(values) != n:
        raise ValueError(f"memory_type must be one of {MEMORY_TYPES}, once or per memory, got {memory_type!r}")
    return torch.tensor([MEMORY_TYPES.index(v) for v in values], device=device)
