"""The ranking statement of PostgresStore.retrieve: filters, scores and top k in one SQL query.

Every query is ranked by ``w_sim cos + w_rec exp(-age/tau) + w_imp importance (+ w_text
text_match)`` in the server, over every row that passes the filters (the exact ranking) or over a
candidate pool: the union of the ``candidates`` best live rows by each term, similarity from the
HNSW index, recency, importance and text match from theirs. Each result row of a pooled query
carries ``bound``, the highest score a row outside the pool can reach (Fagin's threshold, for
non-negative weights): a k-th score below it means the pool may have missed a row. ``bound`` is
NULL when there is no pool or it holds every row that passes the filters, and +inf when the
index returned no row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gae.storage import postgres_schema as schema
from gae.storage.base import split_scope
from gae.storage.postgres_vector import Vector

if TYPE_CHECKING:
    import numpy as np
    from psycopg import sql


def text_query(text: str) -> str | None:
    """The words of ``text`` OR-ed as a tsquery (SQLiteStore's FTS5 query), None when it has none."""
    terms = "".join(ch if ch.isalnum() else " " for ch in text).split()
    return " | ".join(terms) if terms else None


def parameters(query: np.ndarray, now: float, k: int, scopes: list[Any] | None, text: str | None, *,
               weights: tuple[float, float, float], tau: float, w_text: float, candidates: int) -> dict[str, Any]:
    """The named parameters of one query's ranking statement (:func:`compose`); ``tsq``, the text
    query, is None when there is no text or its weight is 0 (the statement then has no text term)."""
    tsq = text_query(text) if text is not None and w_text != 0.0 else None
    keys = [split_scope(key) for key in scopes or []]
    return {"q": Vector(query), "now": float(now), "tau": float(tau), "k": k, "tsq": tsq,
            "candidates": candidates, "w_sim": float(weights[0]), "w_rec": float(weights[1]),
            "w_imp": float(weights[2]), "w_text": float(w_text),
            "ints": [i for kind, i in keys if kind == "int"],
            "names": [i for kind, i in keys if kind == "name"]}


def compose(q: Callable[..., sql.Composed], pooled: bool, scoped: bool, texted: bool) -> sql.Composed:
    """The ranking statement over a candidate pool (``pooled``) or every row, with a scope filter
    (``scoped``) and a text match term (``texted``) or not; ``q`` fills in the store's table names."""
    where = "m.deleted_at IS NULL AND m.valid_from <= %(now)s AND %(now)s < m.valid_until"
    if scoped:  # both arms can use the (scope_type, scope_id, ...) index
        where += (" AND ((m.scope_type = 'int' AND m.scope_id = ANY(%(ints)s::text[])) "
                  "OR (m.scope_type = 'name' AND m.scope_id = ANY(%(names)s::text[])))")
    # Postgres' exp() raises on underflow and overflow where numpy returns 0 and inf.
    age = "(m.created_at - %(now)s) / %(tau)s"
    recency = f"CASE WHEN {age} < -700 THEN 0 WHEN {age} > 709 THEN 'Infinity'::float8 ELSE exp({age}) END"
    ctes, joins, text, bound = [], "", "0::float8", "NULL::float8"
    if texted:  # every match the query may see (GIN index), scaled by the best of them, as SQLiteStore does
        ctes += [f"matches AS MATERIALIZED (SELECT m.seq, ts_rank_cd({schema.TSV}, {schema.TSQ})::float8 AS rank "
                 f"FROM {{t}} m WHERE {where} AND {schema.TSV} @@ {schema.TSQ})",
                 "best AS (SELECT max(rank) AS v FROM matches)"]
        joins = " LEFT JOIN matches x ON x.seq = m.seq CROSS JOIN best"
        text = "CASE WHEN x.rank IS NULL THEN 0 WHEN best.v > 0 THEN x.rank / best.v ELSE 1 END"
    if pooled:
        # The nearest live rows whether or not they pass the filters, so that the index returns
        # all it is asked for and the least similarity among them bounds every row outside.
        ctes.append(f"near AS (SELECT m.seq, 1 - (m.embedding <=> %(q)s) AS v, {where} AS ok FROM {{t}} m "
                    "WHERE m.deleted_at IS NULL ORDER BY m.embedding <=> %(q)s LIMIT %(candidates)s)")
        lists = {"recent": (recency, "m.created_at DESC"), "important": ("m.importance", "m.importance DESC")}
        if texted:
            lists["matching"] = (text, "x.rank DESC NULLS LAST")
        ctes += [f"{name} AS (SELECT m.seq, {value} AS v FROM {{t}} m{joins} WHERE {where} "
                 f"{'AND x.rank IS NOT NULL ' if name == 'matching' else ''}ORDER BY {order} LIMIT %(candidates)s)"
                 for name, (value, order) in lists.items()]
        ctes.append("pool AS (SELECT seq FROM near WHERE ok" + "".join(
            f" UNION SELECT seq FROM {name}" for name in lists) + ")")
        # with fewer matches than candidates every match is in the pool: the rows outside score 0
        text_bound = " + %(w_text)s * (SELECT CASE WHEN count(*) < %(candidates)s THEN 0 ELSE min(v) END " \
                     "FROM matching)" if texted else ""
        # The index scan returns its ef_search nearest rows, less those row-level security
        # hides: every row it did not return is farther than all it did. It skips zero vectors
        # (similarity 0), hence the greatest(.., 0).
        bound = ("CASE WHEN (SELECT count(*) FROM recent) < %(candidates)s THEN NULL "
                 "WHEN NOT EXISTS (SELECT FROM near) THEN 'Infinity'::float8 "
                 "ELSE %(w_sim)s * greatest((SELECT min(v) FROM near), 0) "
                 "+ %(w_rec)s * (SELECT min(v) FROM recent) "
                 f"+ %(w_imp)s * (SELECT min(v) FROM important){text_bound} END")
        where += " AND m.seq IN (SELECT seq FROM pool)"
    return q(
        ("WITH " + ", ".join(ctes) + " " if ctes else "")
        + "SELECT seq, %(w_sim)s * similarity + %(w_rec)s * recency + %(w_imp)s * importance "
        f"+ %(w_text)s * text AS score, similarity, recency, importance, text, {bound} AS bound FROM ("
        f"SELECT m.seq, -(m.embedding <#> %(q)s) AS similarity, {recency} AS recency, m.importance, "
        f"{text} AS text FROM {{t}} m{joins} WHERE {where}) scored ORDER BY score DESC, seq LIMIT %(k)s")
