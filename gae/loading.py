"""Safe loading of everything gae writes: ``torch.load(weights_only=True)`` with checksums."""

from __future__ import annotations

import importlib
import os
import pickle
import pkgutil
import re
import zipfile
import zlib
from typing import Any

import torch

_RESULT_TYPES: list[Any] = []


def _result_types() -> list[Any]:
    """Every NamedTuple class gae defines, found by walking the package once: plain tuples of
    tensors and numbers, safe to rebuild from a file (a list of classes is what
    ``torch.serialization.safe_globals`` takes). A module whose optional dependency is missing
    is skipped: nothing saved from it can exist without it."""
    if not _RESULT_TYPES:  # the package's folder, walked by name: this module never imports the package it is in
        for info in pkgutil.walk_packages([os.path.dirname(__file__)], f"{__package__}."):
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                continue
            _RESULT_TYPES.extend(value for value in vars(module).values()
                                 if isinstance(value, type) and issubclass(value, tuple) and hasattr(value, "_fields")
                                 and value.__module__ == module.__name__)
    return _RESULT_TYPES


def safe_load(path: str | os.PathLike[str], map_location: Any = "cpu") -> Any:
    """Read a file written with ``torch.save`` (a memory's ``state_dict``, a Lightning checkpoint,
    saved results) without running anything in it, and refuse it if a byte of it changed.

    ``torch.load(weights_only=True)``, with gae's result NamedTuples (``StreamStep``,
    ``MemoryOutput``, ``Retrieval``, ...) allowed as well as tensors and plain containers. First,
    every entry of the archive is checked against the CRC-32 stored with it: ``torch.load``
    itself does not, and loads a tensor whose bytes were flipped on disk as if nothing happened.
    (Files in torch's legacy, non-zip format carry no checksum and are only unpickled safely.)

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file asks to import or call anything else (tampered: refused, nothing
            was run), or it is truncated, corrupted or not written by ``torch.save``; the
            message names the file.

    Examples::

        >>> import tempfile, gae
        >>> memory = gae.KNNMemory(factors=2, actions=["approve", "reject"], k=1)
        >>> path = tempfile.mkdtemp() + "/memory.pt"
        >>> torch.save(memory.state_dict(), path)
        >>> gae.KNNMemory(factors=2, actions=["approve", "reject"], k=1).load_state_dict(gae.safe_load(path))
        <All keys matched successfully>
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError,
                zlib.error) as error:  # a flipped byte can name an unknown compression method or encryption
            raise ValueError(f"{path} cannot be read: a damaged archive ({type(error).__name__}: {error})") from error
        if damaged is not None:
            raise ValueError(f"{path} is corrupted: its entry {damaged!r} does not match the checksum saved with it "
                             "(bytes changed on disk or in transit)")
    try:
        if hasattr(torch.serialization, "safe_globals"):
            with torch.serialization.safe_globals(_result_types()):
                return torch.load(path, map_location=map_location, weights_only=True)
        return torch.load(path, map_location=map_location, weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except pickle.UnpicklingError as error:
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        reason = re.search(r"WeightsUnpickler error:\s*([^\n]{1,120})", str(error))
        what = f"it asks for {refused.group(1)}" if refused else \
            f"it holds more than tensors ({reason.group(1) if reason else type(error).__name__})"
        raise ValueError(f"{path} is not a plain torch.save file: {what}, refused by torch.load(weights_only=True) "
                         "(nothing in it was run)") from error
    except Exception as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else "no further detail"
        raise ValueError(f"{path} cannot be read: truncated, corrupted or not written by torch.save "
                         f"({type(error).__name__}: {detail})") from error
