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
import threading
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
    descriptor per store object and its :meth:`~gae.storage.Store.writer`, which share it) and
    closed by :meth:`close`. Thread-safe: a ``flock`` excludes other open files, not the threads
    of one, so the threads sharing it queue on a thread lock first. Not re-entrant: a store takes
    it once per outermost write block."""

    def __init__(self, path: str) -> None:
        self.path = f"{path}.ledger-lock"
        self._file: IO[bytes] | None = None
        self._threads = threading.Lock()
        self._stranded = threading.Event()  # a wait given up is still blocked in the kernel (see _wait)

    @contextmanager
    def held(self, timeout: float = math.inf) -> Iterator[None]:
        """The exclusive lock, waited for up to ``timeout`` seconds (then TimeoutError, nothing
        taken). The kernel wakes the next waiter the moment it is released: no polling."""
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        deadline = time.monotonic() + timeout
        if not self._threads.acquire(timeout=-1 if math.isinf(timeout) else max(0.0, timeout)):
            raise self._timed_out(timeout)
        try:
            with self._flocked(deadline, timeout):
                yield
        finally:
            self._threads.release()

    @contextmanager
    def _flocked(self, deadline: float, timeout: float) -> Iterator[None]:
        """The ``flock`` itself, inside the thread lock: at once when it is free, else a blocking
        wait (the kernel hands it over the moment it is released), given up after ``timeout``."""
        if self._file is None:
            self._file = open(self.path, "a+b")  # noqa: SIM115 - held until close()
        file = self._file
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if math.isinf(timeout):
                fcntl.flock(file, fcntl.LOCK_EX)
            elif self._stranded.is_set():  # (at most one thread waits past its call: the others ask again)
                self._poll(file, deadline, timeout)
            else:
                self._wait(file, deadline, timeout)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)

    def _wait(self, file: IO[bytes], deadline: float, timeout: float) -> None:
        """A blocking ``flock`` in a thread of its own (it cannot be given up), waited for until
        ``deadline``. Given up, the waiting thread owns the file: it unlocks and closes it whenever
        the lock comes, and the next call opens the lock file again (a lock belongs to an open
        file, so the late one never counts as the next call's)."""
        taken, given_up, guard = threading.Event(), [False], threading.Lock()

        def wait() -> None:
            fcntl.flock(file, fcntl.LOCK_EX)
            with guard:
                if not given_up[0]:
                    taken.set()
                    return
            fcntl.flock(file, fcntl.LOCK_UN)
            file.close()
            self._stranded.clear()

        threading.Thread(target=wait, name="gae-sqlite-writer-queue", daemon=True).start()
        if taken.wait(max(0.0, deadline - time.monotonic())):
            return
        with guard:
            if taken.is_set():  # (it came as the wait ended)
                return
            given_up[0] = True
            self._file = None
            self._stranded.set()
        raise self._timed_out(timeout)

    def _poll(self, file: IO[bytes], deadline: float, timeout: float) -> None:
        """Ask for the lock again every 0.1 to 2 ms until ``deadline`` (while a wait given up is
        still blocked: one stranded thread and file at most)."""
        pause = 1e-4
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise self._timed_out(timeout) from None
                time.sleep(pause)
                pause = min(2 * pause, 2e-3)

    def _timed_out(self, timeout: float) -> TimeoutError:
        return TimeoutError(f"{self.path[:-len('.ledger-lock')]}: another writer held the write lock for more than "
                            f"{timeout:g} s; nothing of this call was written")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
