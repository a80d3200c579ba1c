"""Checks at the public boundary. Each raises with the argument's name and its value."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

Names = int | Sequence[str]


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
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{argument} must be in {interval}, got {value!r}")
    return value


def check_int(argument: str, value: int, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{argument} must be >= {low}, got {value}")
    return value


def check_factors(x: Tensor, n_factors: int, device: torch.device, argument: str = "x") -> Tensor:
    """A finite floating (B, K) tensor with B >= 1 on ``device``."""
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
    # one cheap reduction: NaN and Inf propagate into the sum; only then locate the culprit
    # (a sum can also overflow on huge finite values, which the exact check then lets through)
    if not bool(torch.isfinite(x.detach().sum())):
        bad = ~torch.isfinite(x.detach())
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{argument} must be finite, got {float(x[row, col])} at [{row}, {col}]")
    return x


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
