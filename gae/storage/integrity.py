"""What a store checks of itself: a checksum on every row, audit record and meta value, written
with it and verified by ``check()``, and the cheap checks of a SQLite file before it is opened.

A checksum is 64 bits of SHA-256 over the values a row holds, as the store reads them back (the
embedding as little-endian float32 bytes, ``source_ids`` as its JSON text; the stores write -0.0
as 0.0, which is how SQLite reads it back), stored as a signed 64-bit integer in the row's
``checksum`` column. A row's tombstone is part of it: evicting or expiring a row recomputes it
from the row as stored, but only if the stored row still matched its checksum (otherwise the new
checksum is NULL, which ``check()`` reports), so a row damaged before it was tombstoned is not
passed as sound. A delete takes the content and the embedding, and the new checksum is of the
row without them: nothing derived from deleted data stays behind.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from gae.storage.base import split_scope

# the memories columns a row checksum covers, in its order (every column but the uuid)
CHECKED = ("seq", "scope_type", "scope_id", "memory_type", "content", "embedding", "confidence", "sensitivity",
           "source_ids", "valid_from", "valid_until", "importance", "created_at", "deleted_at", "deleted_reason")
EMBEDDING = CHECKED.index("embedding")
CONTENT = CHECKED.index("content")
AUDIT_CHECKED = ("action", "time", "ids", "reason", "version", "actor")
SQLITE_HEADER = b"SQLite format 3\x00"


_NUMBERS = struct.Struct("<q5d")  # seq, confidence, valid_from, valid_until, importance, created_at
assert [CHECKED.index(name) for name in ("seq", "scope_type", "scope_id", "memory_type", "content", "embedding",
                                         "confidence", "sensitivity", "source_ids", "valid_from", "valid_until",
                                         "importance", "created_at", "deleted_at", "deleted_reason")] == list(range(15))


def _digest(kind: bytes, data: bytes, blob: bytes = b"") -> int:
    """64 bits of SHA-256 (hardware-accelerated where the CPU has it) of ``kind``, ``data`` and ``blob``."""
    digest = hashlib.sha256(b"gae-" + kind + b"\x00" + data)
    digest.update(blob)
    return int.from_bytes(digest.digest()[:8], "little", signed=True)


def checksum(kind: bytes, values: Sequence[Any]) -> int:
    """The checksum of an audit record or meta value (``kind``: b'audit', b'meta'): 64 bits of
    SHA-256 over ``repr`` of ``values`` (None, ints, floats, strings), as a signed 64-bit int. A
    store writes every float as ``float(x) + 0.0``: SQLite reads -0.0 back as 0.0."""
    return _digest(kind, repr(tuple(values)).encode("utf-8", "surrogatepass"))


def row_checksum(values: Sequence[Any]) -> int:
    """The checksum of one memories row, ``values`` in the order of :data:`CHECKED`: its numbers
    packed, its texts, and the embedding's bytes. Values of other types than a store writes
    (only a damaged store has them) are hashed by ``repr``, so they never match."""
    values = tuple(values)
    embedding = values[EMBEDDING]
    if isinstance(embedding, (bytearray, memoryview)):
        embedding = bytes(embedding)
    blob = embedding if type(embedding) is bytes else b""
    try:
        v = values  # CHECKED's order: the indices below
        head = (_NUMBERS.pack(v[0], v[6], v[9], v[10], v[11], v[12])
                + "\x00".join((v[1], v[2], v[3], v[7], v[8])).encode("utf-8", "surrogatepass"))
    except (struct.error, TypeError):
        return _digest(b"row?", repr(values).encode("utf-8", "surrogatepass"))
    rest = (v[4], v[13], v[14], len(blob) if blob else embedding)
    return _digest(b"row", head + repr(rest).encode("utf-8", "surrogatepass"), blob)


def reals(values: Any) -> list[float]:
    """Floats as a store writes them: Python floats, -0.0 as 0.0 (how SQLite reads it back)."""
    return (np.asarray(values, dtype=np.float64) + 0.0).tolist()


def written_columns(rows: Any) -> tuple[Any, ...]:
    """The columns of new rows as both stores write (and checksum) them: ``(scopes, contents,
    sensitivities, memory_types, embedding, confidence, valid_from, valid_until, importance,
    created_at)``, scopes as (kind, name) pairs, text as plain str, the embedding little-endian
    float32 and the numbers as :func:`reals`."""
    scopes = [split_scope(str(key)) for key in rows.scope]  # plain str (numpy's str_ has another repr)
    contents = [None if text is None else str(text) for text in rows.contents()]
    sensitivities, memory_types = [str(s) for s in rows.sensitivities()], [str(t) for t in rows.memory_type]
    embedding = np.ascontiguousarray(rows.embedding, dtype="<f4")
    numbers = (reals(getattr(rows, name)) for name in ("confidence", "valid_from", "valid_until", "importance",
                                                         "created_at"))
    return (scopes, contents, sensitivities, memory_types, embedding, *numbers)


def embedding_bytes(embedding: Any) -> bytes | None:
    """An embedding as the checksum sees it: little-endian float32 bytes (None stays None)."""
    if embedding is None or isinstance(embedding, (bytes, bytearray, memoryview)):
        return None if embedding is None else bytes(embedding)
    return np.ascontiguousarray(embedding, dtype="<f4").tobytes()


def tombstoned(values: Sequence[Any], stored: int | None, deleted_at: float, reason: str, erase: bool) -> int | None:
    """The checksum of a row (``values`` as stored, :data:`CHECKED` order) after its tombstone:
    for a delete (``erase``), of the row without its content and embedding; otherwise of the row
    with the tombstone, or None if the row as stored no longer matched its checksum ``stored``."""
    new = list(values)
    new[-2:] = [float(deleted_at) + 0.0, reason]
    if erase:
        new[CONTENT] = new[EMBEDDING] = None
        return row_checksum(new)
    if stored is None or row_checksum(values) != stored:
        return None
    return row_checksum(new)


def row_problem(seq: Any, values: Sequence[Any], stored: int | None) -> str | None:
    """What is wrong with one stored row (``values`` in :data:`CHECKED` order), or None."""
    if stored is None:
        return f"row seq={seq!r} has no checksum (it did not match its checksum when it was evicted or expired)"
    if row_checksum(values) != stored:
        return f"row seq={seq!r} does not match its checksum (its embedding, content or metadata changed)"
    return None


def sqlite_file_problems(path: str) -> list[str]:
    """What the first 100 bytes and the size of a SQLite file show is wrong: not a SQLite file,
    a header SQLite or gae never writes, or fewer bytes than the header's page count (truncated).
    Empty for a sound (or empty, new) file. Reads the file, never writes it."""
    size = os.path.getsize(path)
    if size == 0:
        return []
    if size < 100:
        return [f"it is {size} bytes, too short for a SQLite database (truncated?)"]
    with open(path, "rb") as file:
        header = file.read(100)
    if header[:16] != SQLITE_HEADER:
        return ["not a SQLite database: its first 16 bytes are not SQLite's header"]
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return [f"bad header: page size {page_size} is not a power of two from 512 to 65536"]
    problems = []
    if header[18] not in (1, 2) or header[19] not in (1, 2):
        problems.append(f"bad header: file format versions {header[18]}, {header[19]} (SQLite writes 1 or 2)")
    if header[21:24] != b"\x40\x20\x20":
        problems.append(f"bad header: payload fractions {tuple(header[21:24])}, not (64, 32, 32)")
    if page_size - header[20] < 480:
        problems.append(f"bad header: {header[20]} reserved bytes per page of {page_size}")
    # 0: not set yet (a new file's first page, its schema still in the write-ahead log)
    if int.from_bytes(header[44:48], "big") not in (0, 1, 2, 3, 4):
        problems.append(f"bad header: schema format {int.from_bytes(header[44:48], 'big')}, not 1 to 4")
    if int.from_bytes(header[56:60], "big") not in (0, 1):
        problems.append(f"bad header: text encoding {int.from_bytes(header[56:60], 'big')}, not UTF-8 (1)")
    if size % page_size:
        problems.append(f"it is {size:,} bytes, not a whole number of {page_size:,}-byte pages: truncated or damaged")
    pages = int.from_bytes(header[28:32], "big")
    counted = pages > 0 and header[24:28] == header[92:96]  # SQLite's rule for a valid in-header size
    # with a write-ahead log or a hot journal, the file may lag its header until they are replayed
    logged = any(_size(path + suffix) > 0 for suffix in ("-wal", "-journal"))
    if counted and not logged and size < pages * page_size:
        problems.append(f"it is {size:,} bytes, but its header counts {pages:,} pages of {page_size:,} bytes "
                        f"({pages * page_size:,}): truncated")
    return problems


def _size(path: str) -> int:
    """A file's size, 0 when it is not there (a log another connection deletes as it closes may go
    between a check of its existence and a read of its size)."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0
