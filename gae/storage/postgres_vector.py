"""pgvector's ``vector`` over psycopg in its binary form, so that embeddings come back exactly as written."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import psycopg


class Vector:
    """A float32 vector to send as pgvector's ``vector`` (a query parameter)."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


def register_vector(conn: psycopg.Connection[Any]) -> None:
    """Send and read pgvector's ``vector`` in its binary form (uint16 dim, uint16 0, big-endian
    float32s), so that embeddings come back exactly as written."""
    from psycopg.adapt import Dumper, Loader
    from psycopg.pq import Format
    from psycopg.types import TypeInfo

    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise RuntimeError("the pgvector extension's type 'vector' is missing from this database")
    info.register(conn)
    vector_oid = info.oid

    class VectorDumper(Dumper):
        format = Format.BINARY
        oid = vector_oid

        def dump(self, obj: Vector) -> bytes:
            values = np.asarray(obj.values, dtype=">f4")
            return struct.pack(">HH", values.size, 0) + values.tobytes()

    class VectorLoader(Loader):
        format = Format.BINARY

        def load(self, data: Any) -> np.ndarray:
            (dim,) = struct.unpack_from(">H", data)
            return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)

    conn.adapters.register_dumper(Vector, VectorDumper)
    conn.adapters.register_loader(vector_oid, VectorLoader)
