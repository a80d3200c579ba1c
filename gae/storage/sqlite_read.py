"""The reading side of a SQLiteStore: the snapshot ``open`` returns, the audit records, the live
rows' retrieval columns and their ranking against a batch of queries (exact: every candidate is
scored, in this process). Each function takes the store's connection (or what it read from it);
the store wraps the reads so that a damaged file raises StoreCorrupted."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import numpy as np

from gae.storage.base import (
    SNAPSHOT_COLUMNS,
    AuditEntry,
    Snapshot,
    StoreCorrupted,
    StoreRetrieval,
    join_scope,
    padded,
    rows_from_records,
)
from gae.storage.integrity import checksum
from gae.storage.sqlite_integrity import AUDIT


def meta(conn: sqlite3.Connection, path: str, key: str) -> str:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    if row is None or not isinstance(row[0], str):
        raise StoreCorrupted(path, f"its meta table has no {key!r}")
    return row[0]


def audit(conn: sqlite3.Connection, limit: int) -> list[AuditEntry]:
    """The last ``limit`` audit records (-1: all), oldest first."""
    return [AuditEntry(a, t, tuple(json.loads(i)), r, v, actor) for a, t, i, r, v, actor, _ in
            conn.execute(f"SELECT * FROM (SELECT {AUDIT}, n FROM audit ORDER BY n DESC LIMIT ?) ORDER BY n",
                         (limit,))]


def snapshot(conn: sqlite3.Connection, path: str, dim: int, entries: Callable[[], list[AuditEntry]]) -> Snapshot:
    """The live rows, the meta values and ``entries()`` (the audit records, read last), in the
    caller's read transaction; a meta value that does not match its checksum, or an embedding of
    the wrong size, is refused."""
    values = {}
    for key, value, stored in conn.execute("SELECT key, value, checksum FROM meta"):
        if stored is None or checksum(b"meta", (key, value)) != stored:
            raise StoreCorrupted(path, f"meta value {key!r} does not match its checksum")
        values[key] = value
    records = conn.execute(f"SELECT {SNAPSHOT_COLUMNS} FROM memories WHERE deleted_at IS NULL "
                           "ORDER BY seq").fetchall()
    width = 4 * dim
    for r in records:
        if not isinstance(r[1], bytes) or len(r[1]) != width:
            raise StoreCorrupted(path, f"row seq={r[0]!r}: its embedding is not {width} bytes")
    live = rows_from_records([(r[0], np.frombuffer(r[1], dtype=np.float32), *r[2:10], json.loads(r[10]), *r[11:])
                              for r in records], dim)
    return Snapshot(dim, live, entries(), int(values["version"]), int(values["next_id"]),
                    json.loads(values["scope_names"]))


def live_columns(conn: sqlite3.Connection, dim: int) -> dict[str, Any]:
    """The live rows' retrieval columns, as arrays in ``seq`` order."""
    rows = conn.execute("SELECT seq, embedding, scope_type, scope_id, importance, created_at, valid_from, "
                        "valid_until FROM memories WHERE deleted_at IS NULL ORDER BY seq").fetchall()
    n = len(rows)
    return {"seq": np.array([r[0] for r in rows], dtype=np.int64),
            "embedding": np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(n, dim),
            "scope": np.array([join_scope(r[2], r[3]) for r in rows], dtype=object),
            **{name: np.array([r[j] for r in rows], dtype=np.float64)
               for j, name in enumerate(("importance", "created_at", "valid_from", "valid_until"), start=4)}}


def text_scores(conn: sqlite3.Connection, text: str) -> dict[int, float]:
    """FTS5 relevance (-bm25, higher is better) of each matching row; the caller scales it by the best
    match among the rows the query may see."""
    terms = [t for t in "".join(ch if ch.isalnum() else " " for ch in text).split() if t]
    if not terms:
        return {}
    query = " OR ".join(f'"{t}"' for t in terms)  # quoted: FTS5's operators in the text are plain words
    found = conn.execute("SELECT rowid, bm25(memories_text) FROM memories_text WHERE memories_text MATCH ?",
                         (query,)).fetchall()
    return {int(rowid): -score for rowid, score in found}


def rank(live: dict[str, Any], unit: np.ndarray, now: float, k: int, allowed: list[list[str] | None],
         texts: list[str | None], weights: tuple[float, float, float], tau: float, w_text: float,
         scores: Callable[[str], dict[int, float]]) -> StoreRetrieval:
    """The ``k`` best of the live rows for each (validated) query, ``scores`` giving a text's
    relevance by ``seq``."""
    result = padded(unit.shape[0], k)
    valid = (live["valid_from"] <= now) & (now < live["valid_until"])
    recency = np.exp(-(now - live["created_at"]) / tau)
    w_sim, w_rec, w_imp = weights
    groups: dict[tuple[str, ...] | None, list[int]] = {}  # queries that see the same rows share one matmul
    for q, keys in enumerate(allowed):
        groups.setdefault(None if keys is None else tuple(sorted(set(keys))), []).append(q)
    for group, members in groups.items():
        mask = valid if group is None else valid & np.isin(live["scope"], list(group))
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            continue
        every = rows.size == mask.size  # no copy of the embeddings when every row is visible
        embedding, seq = (live["embedding"], live["seq"]) if every else (live["embedding"][rows], live["seq"][rows])
        bias = w_rec * recency[rows] + w_imp * live["importance"][rows]
        similarities = unit[members] @ embedding.T  # (G, R)
        for i, q in enumerate(members):
            similarity = similarities[i].astype(np.float64)
            match = np.zeros(rows.size)
            query_text = texts[q]
            if query_text is not None and w_text != 0.0:
                scores_by_seq = scores(query_text)
                match = np.array([scores_by_seq.get(int(s), 0.0) for s in seq])
                best = match.max() if match.size else 0.0  # scaled among the rows this query may see
                match = np.where(match > 0, match / best, 0.0) if best > 0 else (match != 0).astype(float)
            score = w_sim * similarity + bias + w_text * match
            if score.size > k:  # the k best and everything tied with the k-th, then an exact sort
                kth = np.partition(score, score.size - k)[score.size - k]
                near = np.flatnonzero(score >= kth)
            else:
                near = np.arange(score.size)
            order = near[np.lexsort((seq[near], -score[near]))][:k]  # best first; ties: the older memory
            m = order.size
            result.ids[q, :m] = seq[order]
            result.scores[q, :m] = score[order]
            result.similarity[q, :m] = similarity[order]
            result.recency[q, :m] = recency[rows][order]
            result.importance[q, :m] = live["importance"][rows][order]
            result.text[q, :m] = match[order]
    return result
