"""Independent runs of a measurement in worker processes, with a progress bar, results in order.

The head-to-head, the scaling curves and the public benchmark each run many independent tasks
(a stream seed, a model on a stream). They share this: ``spawn``-started processes (a fresh
interpreter, so numba and torch state are never forked mid-use), a tqdm bar that moves as runs
finish in any order, and results returned in task order so nothing depends on the worker count.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tqdm import tqdm


def run_all(function: Callable[..., Any], arguments: Sequence[tuple[Any, ...]], workers: int, description: str,
            unit: str = "run") -> list[Any]:
    """``[function(*a) for a in arguments]``, in ``workers`` processes (1: in this process).

    Args:
        function: a module-level function (it is pickled by name to the workers).
        arguments: one tuple of positional arguments per task.
        workers: processes, an int >= 1.
        description, unit: the progress bar's label and unit.

    Returns:
        the results, in the order of ``arguments``, whatever order the runs finished in.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    with tqdm(total=len(arguments), desc=description, unit=unit) as progress:
        if workers == 1:
            results = []
            for argument in arguments:
                results.append(function(*argument))
                progress.update()
            return results
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(function, *argument) for argument in arguments]
            for future in futures:
                future.add_done_callback(lambda _: progress.update())
            return [future.result() for future in futures]
