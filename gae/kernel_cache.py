"""Where gae's compiled kernels are cached, on any install and for any user.

gae's kernels are numba functions compiled on first use and cached on disk
(``@numba.njit(cache=True)``): a later process loads the machine code instead of compiling it
again (docs/deploy.md measures both). numba caches a function in the first of these folders it
can write to:

1. ``NUMBA_CACHE_DIR``, when it is set;
2. the ``__pycache__`` folder beside the function's source file;
3. numba's folder in the user's cache (``~/.cache/numba``).

When none is writable (a read-only install run by a service user whose home is not writable,
the usual container), numba refuses to define the function at all, and ``import`` fails with
``cannot cache function 'knn_loop': no locator available``. For gae's own kernels the list
reads, first to last:

0. ``GAE_CACHE_DIR``, when it is set: gae's kernels alone, ahead of numba's list as the more
   specific setting (one that cannot be written to is passed over with a warning);
1-3. numba's list, unchanged: a writable install caches exactly where it always has;
4. this user's own folder in the temporary folder, ``<tmp>/gae-kernels-<uid>``, made private
   (mode 0700). One that is not this user's own and private is not used: numba's cache files
   are pickles, which run code when loaded;
5. nowhere: each process compiles the kernels in memory, as with ``cache=False``, with a
   warning that says what it costs and how to avoid it.

Other packages' numba functions are left to numba. :func:`install`, called by ``import gae``
before any kernel is defined, wraps numba's ``Dispatcher.enable_caching`` (which
``njit(cache=True)`` calls as it defines each function): the wrapper hands a kernel of gae a
numba cache whose locators (numba's word for the folders it tries) are this list.
"""

from __future__ import annotations

import getpass
import os
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from typing import Any

from numba.core import caching, config
from numba.core.dispatcher import Dispatcher

CACHE_DIR_VARIABLE = "GAE_CACHE_DIR"
IN_MEMORY_WARNING = (
    "gae: no folder is writable for its compiled kernels (GAE_CACHE_DIR, NUMBA_CACHE_DIR, the install's "
    "__pycache__, ~/.cache/numba, the temporary folder): they compile in memory, again in each process, which "
    "slows its first decisions by seconds; set GAE_CACHE_DIR to a writable folder to keep them (docs/deploy.md)")
_installing = threading.Lock()


def configured_folder() -> str | None:
    """The folder ``GAE_CACHE_DIR`` names; None when it is unset or empty."""
    return os.environ.get(CACHE_DIR_VARIABLE) or None


def private_temp_folder() -> str | None:
    """``<tmp>/gae-kernels-<uid>``, made if need be with only its owner allowed in (mode 0700).

    None when there is no writable temporary folder, or when the folder there is not one this
    user owns and no one else may enter: another user could have put compiled code in it.
    """
    owner = os.getuid() if hasattr(os, "getuid") else None  # (Windows: the temporary folder is the user's own)
    try:
        folder = os.path.join(tempfile.gettempdir(), f"gae-kernels-{getpass.getuser() if owner is None else owner}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        status = os.lstat(folder)
    except (OSError, KeyError):  # (gettempdir: FileNotFoundError when none is writable; getuser: KeyError)
        return None
    private = owner is None or (status.st_uid == owner and not status.st_mode & 0o077)
    return folder if stat.S_ISDIR(status.st_mode) and private else None


class FolderLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):  # type: ignore[misc]
    """numba's locator for a folder of the list, laid out as numba lays out ``NUMBA_CACHE_DIR``
    (a subfolder per source folder). Subclasses say which folder; numba's ``from_function`` makes
    it and declines it (None) when it is not writable."""

    folder: Callable[[], str | None]

    def __init__(self, py_func: Any, py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(self.folder() or "", self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        return None if cls.folder() is None else super().from_function(py_func, py_file)


class ConfiguredLocator(FolderLocator):
    """``GAE_CACHE_DIR``: a warning when it is set and cannot be written to."""

    folder = staticmethod(configured_folder)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        locator = super().from_function(py_func, py_file)
        if locator is None and configured_folder() is not None:
            warnings.warn(f"{CACHE_DIR_VARIABLE}={configured_folder()!r} is not a folder gae can write to: its "
                          "kernels are cached where numba's own rule finds a place", RuntimeWarning, stacklevel=2)
        return locator


class PrivateTempLocator(FolderLocator):
    """This user's private folder in the temporary folder (:func:`private_temp_folder`)."""

    folder = staticmethod(private_temp_folder)


class KernelCacheImpl(caching.CompileResultCacheImpl):  # type: ignore[misc]
    _locator_classes = [ConfiguredLocator, *caching.CompileResultCacheImpl._locator_classes, PrivateTempLocator]


class KernelCache(caching.FunctionCache):  # type: ignore[misc]
    """numba's cache of one compiled function, its folder found by the list of this module."""

    _impl_class = KernelCacheImpl


def install() -> None:
    """Wrap numba's ``Dispatcher.enable_caching`` so that gae's kernels are cached by the list
    above (once; numba's own behaviour for every other function)."""
    with _installing:
        numba_enable_caching = Dispatcher.enable_caching
        if getattr(numba_enable_caching, "gae_kernel_cache", False):
            return

        def enable_caching(dispatcher: Any) -> None:
            chosen: Any = getattr(config, "CACHE_LOCATOR_CLASSES", "")  # numba's own variable: its list as it is
            if not (dispatcher.py_func.__module__ or "").startswith("gae.") or chosen:
                numba_enable_caching(dispatcher)
                return
            try:
                dispatcher._cache = KernelCache(dispatcher.py_func)
            except RuntimeError:  # numba's "no locator available": no folder of the list is writable
                warnings.warn(IN_MEMORY_WARNING, RuntimeWarning, stacklevel=2)  # numba's NullCache stays

        enable_caching.gae_kernel_cache = True  # type: ignore[attr-defined]
        setattr(Dispatcher, "enable_caching", enable_caching)  # noqa: B010 (mypy refuses assigning to a method)
