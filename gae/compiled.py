"""Calling a compiled kernel without numba's per-call type dispatch.

A numba dispatcher works out the types of its arguments on every call; with a dozen arrays
and records that costs several microseconds, more than a single decision's whole kernel.
:func:`entry_point` resolves the types once and returns the compiled function itself, for the
single-decision paths that call the same kernel with the same arrays again and again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba


def entry_point(kernel: Any, *args: Any) -> Callable[..., Any]:
    """The compiled ``kernel`` (a ``numba.njit`` dispatcher) for the types of ``args``, compiled
    or loaded from numba's cache now.

    The function returned does not check its arguments' types: every later call must pass
    values of exactly these types (the same arrays, or arrays of the same dtype, rank and
    C-contiguous layout, and Python ints, floats and bools where ``args`` had them).
    """
    return kernel.compile(tuple(numba.typeof(arg) for arg in args))
