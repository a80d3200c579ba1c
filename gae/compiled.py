"""Calling a compiled kernel cheaply, for the single-decision paths.

A numba dispatcher works out the types of its arguments on every call, and the compiled
function receives each array argument through Python's buffer machinery and reference
counts it: with a few dozen arrays that costs microseconds, more than one decision's whole
kernel. Two tools cut it:

- :func:`entry_point` resolves the argument types once and returns the compiled function
  itself;
- :class:`ArrayTable` hands a kernel many arrays as two small arrays (their addresses and
  shapes), from which :func:`view` rebuilds each one inside the kernel, unowned and
  uncounted. The table holds the arrays, so the addresses stay valid while it lives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

MAX_RANK = 4  # the largest rank an ArrayTable holds


def entry_point(kernel: Any, *args: Any) -> Callable[..., Any]:
    """The compiled ``kernel`` (a ``numba.njit`` dispatcher) for the types of ``args``, compiled
    or loaded from numba's cache now.

    The function returned does not check its arguments' types: every later call must pass
    values of exactly these types (the same arrays, or arrays of the same dtype, rank and
    C-contiguous layout, and Python ints, floats and bools where ``args`` had them).
    """
    return kernel.compile(tuple(numba.typeof(arg) for arg in args))


class ArrayTable:
    """The addresses and shapes of C-contiguous arrays, for a kernel that rebuilds them with
    :func:`view` (in order: ``view(addresses[i], (shapes[i, 0], ...), dtype)``, with the
    array's own rank and dtype, which the kernel states). Holds the arrays: the addresses are
    valid while the table lives, and the kernel must not keep a view past its call."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = tuple(arrays)
        self.addresses = np.zeros(len(self.arrays), np.int64)
        self.shapes = np.zeros((len(self.arrays), MAX_RANK), np.int64)
        for i, array in enumerate(self.arrays):
            if not array.flags.c_contiguous or array.ndim > MAX_RANK:
                raise ValueError(f"ArrayTable holds C-contiguous arrays of rank <= {MAX_RANK}, "
                                 f"got shape {array.shape} with strides {array.strides}")
            self.addresses[i] = array.__array_interface__["data"][0]
            self.shapes[i, :array.ndim] = array.shape


@intrinsic
def _pointer(typingctx: Any, address: Any, dtype: Any) -> Any:
    """The address (an integer) as a typed pointer to ``dtype``'s values."""
    target = dtype.dtype if isinstance(dtype, types.DType) else dtype.instance_type
    signature = types.CPointer(target)(types.int64, dtype)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return signature, codegen


@numba.njit(inline="always", nogil=True)
def view(address, shape, dtype):  # pragma: no cover
    """The C-contiguous array of ``shape`` and ``dtype`` at ``address``, unowned (see
    :class:`ArrayTable`)."""
    return numba.carray(_pointer(address, dtype), shape)
