"""The queue SQLite writers of one file wait in: an exclusive ``flock`` on ``<path>.ledger-lock``.

SQLite's own busy handler makes a waiting writer sleep (1, 2, 5, ... 100 ms) and retry, so under
contention one process starves the others and the lock sits idle between them; the kernel wakes
the next waiter of a file lock at once. A :class:`~gae.storage.SQLiteStore` takes this lock
before ``BEGIN IMMEDIATE`` and releases it after the commit. Writers that do not take it (a gae
older than the ledger) still serialize through SQLite's own lock. The file is named after the
ledger, whose writers took it first: processes of that gae queue with this one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: SQLite's own lock alone
    fcntl = None  # type: ignore[assignment]


class WriterQueue:
    """The lock file of the SQLite database at ``path``, opened on the first :meth:`held` (one
    descriptor per store object) and closed by :meth:`close`. Not re-entrant: the store takes it
    once per outermost write block, holding its own thread lock."""

    def __init__(self, path: str) -> None:
        self.path = f"{path}.ledger-lock"
        self._file: IO[bytes] | None = None

    @contextmanager
    def held(self, timeout: float = math.inf) -> Iterator[None]:
        """The exclusive lock, waited for up to ``timeout`` seconds (then TimeoutError, nothing
        taken). Without a finite timeout the kernel wakes the next waiter when it is released; with
        one, a waiter asks again every 0.1 to 2 ms, as a blocking wait cannot be given up."""
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        if self._file is None:
            self._file = open(self.path, "a+b")  # noqa: SIM115 - held until close()
        if math.isinf(timeout):
            fcntl.flock(self._file, fcntl.LOCK_EX)
        else:
            deadline, pause = time.monotonic() + timeout, 1e-4
            while True:
                try:
                    fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{self.path[:-len('.ledger-lock')]}: another writer held the write lock "
                                           f"for more than {timeout:g} s; nothing of this call was written") from None
                    time.sleep(pause)
                    pause = min(2 * pause, 2e-3)
        try:
            yield
        finally:
            fcntl.flock(self._file, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
