"""Checksummed tables: what a table holds (:class:`Table` of typed :class:`Column` s), how a row is
normalised to its columns' types, and the checksum every row carries.

Every row a store writes through its table API (:meth:`~gae.storage.store.Store.insert`) carries
a ``checksum`` column: 64 bits of SHA-256, as a signed 64-bit integer, over the table's name and
the row's values, each hashed as its declared type (an ``int`` as 8 little-endian bytes, a
``real`` as the float64 ``float(x) + 0.0``, so -0.0 is 0.0 as SQLite reads it back, a ``text``
as UTF-8 and a ``blob`` as its bytes, each with its length). The name keys it: a row copied into
another table does not match there. Reads verify it (:meth:`~gae.storage.store.Store.select`) and
``check()`` verifies every row of every table the store's catalog (:data:`CATALOG`) lists.

Examples::

    >>> notes = Table("notes", (Column("id", INT, nullable=False), Column("text", TEXT)), key=("id",))
    >>> notes.Row(1, "hello")
    NotesRow(id=1, text='hello')
    >>> normalised(notes, (True, "hello")) == (1, "hello")
    True
    >>> row_checksum("notes", (1, "hello")) == row_checksum("other", (1, "hello"))
    False
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
import struct
from collections import namedtuple
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

INT, REAL, TEXT, BLOB = "int", "real", "text", "blob"  # the column types
TYPES = (INT, REAL, TEXT, BLOB)
NAME = re.compile(r"[a-z][a-z0-9_]*")
LONGEST = 22  # a Postgres store prefixes its table name (up to 40 characters and '_'): 63 bytes in all
INT64 = (-2**63, 2**63 - 1)

_NONE, _INT, _REAL, _TEXT, _BLOB, _OTHER = range(6)  # the tag hashed before each value
_TAGGED_INT = struct.Struct("<Bq")
_TAGGED_REAL = struct.Struct("<Bd")
_TAGGED_LENGTH = struct.Struct("<BQ")


class Column(NamedTuple):
    """One column of a :class:`Table`: its name, its type (:data:`INT`, :data:`REAL`,
    :data:`TEXT` or :data:`BLOB`) and whether it may hold None."""

    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class Table:
    """A checksummed table: its name, its columns in order, its primary key and its indexes.

    A store creates the table on first use with one more column, ``checksum``, and lists it in
    its catalog, so that ``check()`` verifies its rows without knowing what they mean.

    Args:
        name: lowercase letters, digits and ``_``, at most 22 characters (a Postgres store
            prefixes it with its own table name).
        columns: the :class:`Column` s, in the order rows give their values.
        key: the columns of the primary key (empty: none; an upsert needs one).
        indexes: ``(suffix, columns)`` pairs: an index named ``<table>_<suffix>`` on those columns.

    Attributes:
        Row: the NamedTuple class of a row (one field per column), what ``select`` returns.
        names: the column names, in order.
    """

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    indexes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    Row: type = field(init=False, repr=False, compare=False)
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name) or len(self.name) > LONGEST:
            raise ValueError(f"name must be lowercase letters, digits and '_' (a letter first), at most {LONGEST} "
                             f"characters, got {self.name!r}")
        columns = tuple(self.columns)
        if not columns or not all(isinstance(c, Column) for c in columns):
            raise ValueError(f"columns of table {self.name!r} must be a non-empty sequence of Column, got {columns!r}")
        names = [c.name for c in columns]
        for column in columns:
            if not isinstance(column.name, str) or not NAME.fullmatch(column.name) or column.name == "checksum":
                raise ValueError(f"table {self.name!r}: column names must be lowercase identifiers other than "
                                 f"'checksum', got {column.name!r}")
            if column.type not in TYPES:
                raise ValueError(f"table {self.name!r}: column {column.name!r} must have a type of {TYPES}, got "
                                 f"{column.type!r}")
            if not isinstance(column.nullable, bool):
                raise ValueError(f"table {self.name!r}: column {column.name!r} nullable must be a bool, got "
                                 f"{column.nullable!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name!r}: column names must be distinct, got {names}")
        key = tuple(self.key)
        if len(set(key)) != len(key) or any(k not in names for k in key):
            raise ValueError(f"table {self.name!r}: key must be distinct columns of {names}, got {self.key!r}")
        indexes = tuple((suffix, tuple(on)) for suffix, on in self.indexes)
        for suffix, on in indexes:
            if not isinstance(suffix, str) or not NAME.fullmatch(suffix) or len(self.name) + len(suffix) > LONGEST - 1:
                raise ValueError(f"table {self.name!r}: index suffix {suffix!r} must be a lowercase identifier of at "
                                 f"most {LONGEST - 1 - len(self.name)} characters")
            if not on or any(column not in names for column in on):
                raise ValueError(f"table {self.name!r}: index {suffix!r} must be on columns of {names}, got {on!r}")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "indexes", indexes)
        object.__setattr__(self, "names", tuple(names))
        title = "".join(part.capitalize() for part in self.name.split("_")) + "Row"
        object.__setattr__(self, "Row", namedtuple(title, names))  # noqa: PYI024 - fields known only here



CATALOG = Table("gae_tables", (Column("name", TEXT, nullable=False), Column("spec", TEXT, nullable=False)),
                key=("name",))
"""The store's catalog: one row per checksummed table (its name, and its :func:`spec_text`), itself checksummed."""


def normalised(table: Table, row: Sequence[Any]) -> tuple[Any, ...]:
    """``row`` as the store writes (and checksums) it: each value converted to its column's type
    (an integer of any kind to ``int``, a real number to ``float(x) + 0.0``, ``bytearray`` and
    ``memoryview`` to ``bytes``). Raises TypeError for a value of another type and ValueError for
    a missing value, None in a column that may not hold it, an int outside int64, a NaN (SQLite
    stores it as NULL) or a NUL character in text (Postgres refuses it)."""
    if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != len(table.columns):
        raise ValueError(f"a row of table {table.name!r} must be a sequence of {len(table.columns)} values "
                         f"{table.names}, got {row!r}")
    values = []
    for column, value in zip(table.columns, row, strict=True):
        kind = type(value)  # the common cases first, checked without the numbers ABCs
        if (kind is str and column.type == TEXT and "\x00" not in value) or (kind is bytes and column.type == BLOB) \
                or (kind is int and column.type == INT and INT64[0] <= value <= INT64[1]):
            values.append(value)
            continue
        if kind is float and column.type == REAL and value == value:  # (NaN != NaN)
            values.append(value + 0.0)
            continue
        where = f"table {table.name!r}, column {column.name!r}"
        if value is None:
            if not column.nullable:
                raise ValueError(f"{where} may not be None")
        elif column.type == INT:
            if not isinstance(value, numbers.Integral):
                raise TypeError(f"{where} holds ints, got {value!r}")
            value = int(value)
            if not INT64[0] <= value <= INT64[1]:
                raise ValueError(f"{where} holds int64 values, got {value}")
        elif column.type == REAL:
            if not isinstance(value, numbers.Real):
                raise TypeError(f"{where} holds real numbers, got {value!r}")
            value = float(value) + 0.0
            if math.isnan(value):
                raise ValueError(f"{where} may not hold NaN")
        elif column.type == TEXT:
            if not isinstance(value, str):
                raise TypeError(f"{where} holds str, got {value!r}")
            value = str(value)  # (numpy's str_ hashes as str)
            if "\x00" in value:
                raise ValueError(f"{where} may not hold a NUL character")
        else:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"{where} holds bytes, got {type(value).__name__}")
            value = bytes(value)
        values.append(value)
    return tuple(values)


def row_checksum(table: str, values: Sequence[Any]) -> int:
    """The checksum of a row of table ``table`` (see the module), ``values`` as the store reads
    them back. A value of a type the store never writes (only a damaged store holds one) is
    hashed by its ``repr`` under its own tag, so it never matches."""
    parts = [b"gae-table\x00", table.encode(), b"\x00"]  # hashed in one call: the row is the whole message
    for value in values:
        kind = type(value)
        if kind is str:
            data = value.encode("utf-8", "surrogatepass")
            parts += (_TAGGED_LENGTH.pack(_TEXT, len(data)), data)
        elif kind is float:
            parts.append(_TAGGED_REAL.pack(_REAL, value))
        elif kind is int and INT64[0] <= value <= INT64[1]:
            parts.append(_TAGGED_INT.pack(_INT, value))
        elif value is None:
            parts.append(b"\x00")
        elif kind is bytes:
            parts += (_TAGGED_LENGTH.pack(_BLOB, len(value)), value)
        else:
            data = repr(value).encode("utf-8", "surrogatepass")
            parts += (_TAGGED_LENGTH.pack(_OTHER, len(data)), data)
    return int.from_bytes(hashlib.sha256(b"".join(parts)).digest()[:8], "little", signed=True)


def describe(table: Table, values: Sequence[Any]) -> str:
    """A row as a problem names it: its key values (or its first two values, for a table without
    a key), long ones shortened."""
    shown = table.key or table.names[:2]

    def short(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    return "(" + ", ".join(f"{name}={short(values[table.names.index(name)])}" for name in shown) + ")"


def spec_text(table: Table) -> str:
    """The catalog's record of ``table``: its columns, key and indexes as JSON."""
    return json.dumps({"columns": [list(c) for c in table.columns], "key": list(table.key),
                       "indexes": [[suffix, list(on)] for suffix, on in table.indexes]}, sort_keys=True)


def spec_of(name: str, text: str) -> Table:
    """The :class:`Table` a catalog row records; ValueError (or TypeError) for a record no gae writes."""
    spec = json.loads(text)
    if not isinstance(spec, dict) or set(spec) != {"columns", "key", "indexes"}:
        raise ValueError(f"not a table record: {text[:80]!r}")
    return Table(name, tuple(Column(*c) for c in spec["columns"]), tuple(spec["key"]),
                 tuple((suffix, tuple(on)) for suffix, on in spec["indexes"]))
