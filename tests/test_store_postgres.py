"""PostgresStore on a real Postgres 16 + pgvector server (pgserver, started once in a temporary folder).

Each test gets a database of its own; the property test a table of its own per example. The
rankings are checked against a slow numpy reference and against SQLiteStore.
"""

from __future__ import annotations

import itertools
import math
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pgserver = pytest.importorskip("pgserver")
psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402

from gae.storage import PostgresStore, SQLiteStore  # noqa: E402
from gae.storage.base import SCHEMA_VERSION, AuditEntry, Change, Rows, Snapshot, StoreRetrieval  # noqa: E402

DIM = 4
SCOPES: list[Any] = ["alpha", 0, "beta,gamma", 7]  # names (one with a comma) and ints
_tables = itertools.count()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The superuser DSN of a Postgres server that lives as long as the test session."""
    postgres = pgserver.get_server(tmp_path_factory.mktemp("pgdata"), cleanup_mode="stop")
    yield postgres.get_uri()
    postgres.cleanup()


def _create_database(server: str, owner: str | None = None) -> str:
    name = f"gae_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        statement = "CREATE DATABASE {}" + (" OWNER {}" if owner else "")
        admin.execute(sql.SQL(statement).format(*map(sql.Identifier, filter(None, (name, owner)))))
    return make_conninfo(server, dbname=name)


@pytest.fixture
def dsn(server: str) -> str:
    """A fresh, empty database."""
    return _create_database(server)


def unit_rows(rng: np.random.Generator, seqs: Any, *, dim: int = DIM, now: float = 100.0,
              scopes: list[Any] | None = None) -> Rows:
    """Random live rows: unit embeddings, random scopes, importance, ages and validity windows."""
    seq = np.asarray(seqs, dtype=np.int64)
    n = seq.shape[0]
    embedding = rng.normal(size=(n, dim)).astype(np.float32)
    embedding /= np.linalg.norm(embedding, axis=1, keepdims=True)
    keys = [f"#{s}" if isinstance(s, int) else s for s in (scopes or SCOPES)]
    return Rows(seq=seq, embedding=embedding, scope=[keys[i] for i in rng.integers(0, len(keys), n)],
                memory_type=[("episode", "semantic")[i] for i in rng.integers(0, 2, n)],
                importance=rng.random(n), confidence=rng.random(n), created_at=now - rng.random(n) * 60,
                valid_from=np.full(n, -np.inf), valid_until=np.full(n, np.inf),
                source_ids=[tuple(int(i) for i in rng.integers(0, 100, rng.integers(0, 3))) for _ in range(n)],
                content=[f"memory number {s}" for s in seq.tolist()])


def added(rows: Rows, version: int = 1, time: float = 1.0) -> Change:
    ids = tuple(int(s) for s in rows.seq)
    return Change(added=rows, audit=[AuditEntry("add", time, ids, "learn", version)], version=version,
                  next_id=int(rows.seq.max()) + 1 if len(rows) else 0, scope_names=["alpha", "beta,gamma"])


def assert_rows_equal(got: Rows, want: Rows) -> None:
    for name in ("seq", "embedding", "importance", "confidence", "created_at", "valid_from", "valid_until"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert got.embedding.dtype == np.float32
    for name in ("scope", "memory_type", "source_ids"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.contents() == want.contents() and got.sensitivities() == want.sensitivities()


def select(rows: Rows, keep: Any) -> Rows:
    index = [i for i, s in enumerate(rows.seq.tolist()) if s in keep]
    return Rows(seq=rows.seq[index], embedding=rows.embedding[index], scope=[rows.scope[i] for i in index],
                memory_type=[rows.memory_type[i] for i in index], importance=rows.importance[index],
                confidence=rows.confidence[index], created_at=rows.created_at[index],
                valid_from=rows.valid_from[index], valid_until=rows.valid_until[index],
                source_ids=[rows.source_ids[i] for i in index], content=[rows.contents()[i] for i in index],
                sensitivity=[rows.sensitivities()[i] for i in index])


def reference(rows: Rows, queries: np.ndarray, now: float, k: int, allowed: list[list[str] | None],
              weights: tuple[float, float, float] = (0.60, 0.25, 0.15), tau: float = 15.0) -> StoreRetrieval:
    """The ranking spelled out row by row in float64 (rows: the live rows)."""
    ids, scores = np.full((len(queries), k), -1), np.full((len(queries), k), -np.inf)
    for q, query in enumerate(queries.astype(np.float64)):
        unit = query / max(np.linalg.norm(query), 1e-12)
        scored = []
        for i, seq in enumerate(rows.seq.tolist()):
            if not rows.valid_from[i] <= now < rows.valid_until[i]:
                continue
            if (scopes := allowed[q]) is not None and rows.scope[i] not in scopes:
                continue
            score = (weights[0] * float(rows.embedding[i].astype(np.float64) @ unit)
                     + weights[1] * math.exp(-(now - rows.created_at[i]) / tau) + weights[2] * rows.importance[i])
            scored.append((-score, seq))
        for j, (negative, seq) in enumerate(sorted(scored)[:k]):
            ids[q, j], scores[q, j] = seq, -negative
    zeros = np.zeros_like(scores)
    return StoreRetrieval(ids, scores, zeros, zeros, zeros, zeros)


def assert_same_ranking(got: StoreRetrieval, want: StoreRetrieval) -> None:
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-5, rtol=0)


# -- lifecycle ---------------------------------------------------------------------------------
def test_create_commit_reopen_round_trip(dsn: str) -> None:
    rng = np.random.default_rng(0)
    rows = unit_rows(rng, range(6))
    rows.embedding[0] = np.array([1e-40, -0.0, 3.4e38, 0.1], dtype=np.float32)  # subnormal, -0, huge, inexact
    rows.valid_from[1], rows.valid_until[1] = 50.0, 150.0
    rows.valid_until[2] = np.inf
    rows.valid_from[3] = -np.inf
    rows.content[4] = None
    rows.sensitivity = ["normal", "pii", "normal", "normal", "secret", "normal"]
    store = PostgresStore(dsn, actor="writer")
    assert store.open(DIM) is None and store.dim == DIM
    store.commit(added(rows))
    store.close()

    other = PostgresStore(dsn, actor="remover")
    snapshot = other.open(DIM)
    assert isinstance(snapshot, Snapshot)
    assert_rows_equal(snapshot.rows, rows)
    assert (snapshot.dim, snapshot.version, snapshot.next_id, snapshot.scope_names) == (
        DIM, 1, 6, ["alpha", "beta,gamma"])
    other.commit(Change(removed=[("evict", 2.0, (5,))], audit=[AuditEntry("evict", 2.0, (5,), "capacity", 2)],
                        version=2, next_id=6, scope_names=["alpha", "beta,gamma"]))
    other.close()

    with PostgresStore(dsn) as reader:
        snapshot = reader.open(DIM)
        assert snapshot is not None
        assert_rows_equal(snapshot.rows, select(rows, range(5)))
        assert snapshot.audit == [AuditEntry("add", 1.0, tuple(range(6)), "learn", 1, "writer"),
                                  AuditEntry("evict", 2.0, (5,), "capacity", 2, "remover")]
        assert reader.audit() == snapshot.audit and snapshot.version == 2


def test_empty_store_reopens_empty(dsn: str) -> None:
    PostgresStore(dsn).open(DIM)
    snapshot = PostgresStore(dsn).open(DIM)
    assert snapshot is not None and len(snapshot.rows) == 0 and snapshot.rows.embedding.shape == (0, DIM)
    assert (snapshot.audit, snapshot.version, snapshot.next_id, snapshot.scope_names) == ([], 0, 0, [])


def test_tables_of_one_database_are_independent(dsn: str) -> None:
    first, second = PostgresStore(dsn, table="first_memory"), PostgresStore(dsn, table="second_memory")
    first.open(DIM)
    second.open(2 * DIM)
    first.commit(added(unit_rows(np.random.default_rng(1), range(3))))
    assert len(second.audit()) == 0 and len(first.audit()) == 1
    snapshot = PostgresStore(dsn, table="second_memory").open(2 * DIM)
    assert snapshot is not None and len(snapshot.rows) == 0


def test_reopen_with_another_dim_names_both(dsn: str) -> None:
    PostgresStore(dsn).open(DIM)
    with pytest.raises(ValueError, match=r"dim=4, not dim=8"):
        PostgresStore(dsn).open(8)


def test_newer_schema_version_is_refused(dsn: str) -> None:
    PostgresStore(dsn).open(DIM)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE memories_schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(ValueError, match="newer than this gae"):
        PostgresStore(dsn).open(DIM)


# -- atomic commits --------------------------------------------------------------------------------
def _state(dsn: str) -> tuple[Snapshot, list[tuple[Any, ...]]]:
    with PostgresStore(dsn) as store:
        snapshot = store.open(DIM)
    with psycopg.connect(dsn) as conn:
        everything = conn.execute("SELECT seq, deleted_at, deleted_reason, content FROM memories "
                                  "ORDER BY seq").fetchall()
    assert snapshot is not None
    return snapshot, everything


def _assert_unchanged(dsn: str, before: tuple[Snapshot, list[tuple[Any, ...]]]) -> None:
    snapshot, everything = _state(dsn)
    assert_rows_equal(snapshot.rows, before[0].rows)
    assert (snapshot.audit, snapshot.version, snapshot.next_id, snapshot.scope_names) == (
        before[0].audit, before[0].version, before[0].next_id, before[0].scope_names)
    assert everything == before[1]


def test_invalid_rows_are_refused_before_writing(dsn: str) -> None:
    rng = np.random.default_rng(2)
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(unit_rows(rng, range(3))))
    before = _state(dsn)
    bad_nan = unit_rows(rng, [3, 4])
    bad_nan.embedding[1, 2] = np.nan
    bad_width = unit_rows(rng, [3, 4], dim=DIM + 1)
    bad_type = unit_rows(rng, [3, 4])
    bad_type.memory_type[0] = "rumour"
    for rows, message in ((bad_nan, "finite"), (bad_width, r"\(2, 4\)"), (bad_type, "memory_type")):
        change = added(rows, version=2)
        change.removed = [("delete", 2.0, (0,))]
        with pytest.raises(ValueError, match=message):
            store.commit(change)
        _assert_unchanged(dsn, before)


def test_a_failing_commit_rolls_back_everything(dsn: str) -> None:
    rng = np.random.default_rng(3)
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(unit_rows(rng, range(3))))
    before = _state(dsn)
    duplicate = added(unit_rows(rng, [3, 1]), version=2)  # seq 1 exists: the COPY fails half-way
    duplicate.removed = [("delete", 2.0, (0,))]
    with pytest.raises(psycopg.errors.UniqueViolation):
        store.commit(duplicate)
    _assert_unchanged(dsn, before)
    bad_audit = added(unit_rows(rng, [3, 4]), version=2)  # the rows land, then the audit row fails
    bad_audit.removed = [("evict", 2.0, (2,))]
    bad_audit.audit.append(AuditEntry("forget", 2.0, (2,), "", 2))
    with pytest.raises(psycopg.errors.CheckViolation):
        store.commit(bad_audit)
    _assert_unchanged(dsn, before)
    store.commit(added(unit_rows(rng, [3]), version=2))  # the connection is still usable
    assert _state(dsn)[0].version == 2


# -- tombstones, validity -----------------------------------------------------------------------
def test_deleted_rows_lose_their_data_and_removed_rows_never_come_back(dsn: str) -> None:
    rng = np.random.default_rng(4)
    rows = unit_rows(rng, range(4), scopes=["alpha"])
    rows.content = ["refund damaged parcel"] * 4
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(rows))
    store.commit(Change(removed=[("delete", 5.0, (0,)), ("evict", 5.0, (1,)), ("expire", 5.0, (2,))],
                        version=2, next_id=4))
    with psycopg.connect(dsn) as conn:
        kept = conn.execute("SELECT seq, deleted_at, deleted_reason, content IS NULL, embedding IS NULL "
                            "FROM memories ORDER BY seq").fetchall()
    assert kept == [(0, 5.0, "delete", True, True), (1, 5.0, "evict", False, False),
                    (2, 5.0, "expire", False, False), (3, None, None, False, False)]
    snapshot = PostgresStore(dsn).open(DIM)
    assert snapshot is not None and snapshot.rows.seq.tolist() == [3]
    for exact in (False, True):
        found = store.retrieve(rows.embedding, 100.0, k=4, exact=exact, text="refund", w_text=1.0)
        assert (found.ids[:, 0] == 3).all() and (found.ids[:, 1:] == -1).all()
        assert (found.scores[:, 1:] == -np.inf).all() and (found.text[:, 0] == 1.0).all()


def test_validity_windows_are_applied_by_the_server(dsn: str) -> None:
    rows = unit_rows(np.random.default_rng(5), range(4))
    rows.valid_from[:] = [-np.inf, 10.0, -np.inf, 20.0]
    rows.valid_until[:] = [np.inf, 20.0, 10.0, np.inf]
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(rows))
    for now, valid in ((5.0, {0, 2}), (10.0, {0, 1}), (19.5, {0, 1}), (20.0, {0, 3})):
        for exact in (False, True):
            found = store.retrieve(rows.embedding, now, k=4, exact=exact).ids
            assert {int(i) for i in found.ravel() if i >= 0} == valid, (now, exact)


def test_recency_at_extreme_ages(dsn: str) -> None:
    """Postgres' exp() raises on underflow and overflow: the store returns numpy's 0 and inf."""
    rows = unit_rows(np.random.default_rng(6), range(2))
    rows.created_at[:] = [0.0, 3e6]
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(rows))
    found = store.retrieve(rows.embedding[:1], 1e6, k=2, exact=True)
    assert found.ids[0].tolist() == [1, 0]
    assert found.recency[0].tolist() == [np.inf, 0.0] and found.scores[0, 0] == np.inf


# -- ranking -----------------------------------------------------------------------------------
QUERY_SCOPES = st.one_of(st.none(), st.lists(st.sampled_from(SCOPES), max_size=4),
                         st.lists(st.lists(st.sampled_from(SCOPES), max_size=4), min_size=3, max_size=3))


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # a table per example, not a database
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 30), k=st.integers(1, 8), scopes=QUERY_SCOPES,
       removed=st.sets(st.integers(0, 29), max_size=8), windows=st.booleans(), exact=st.booleans())
def test_retrieve_stays_in_its_scopes_and_matches_the_reference(dsn: str, seed: int, n: int, k: int, scopes: Any,
                                                                removed: set[int], windows: bool,
                                                                exact: bool) -> None:
    rng = np.random.default_rng(seed)
    now = 100.0
    rows = unit_rows(rng, range(n), now=now)
    if windows:
        rows.valid_from[:] = np.where(rng.random(n) < 0.3, now - 30 + rng.random(n) * 40, -np.inf)
        rows.valid_until[:] = np.where(rng.random(n) < 0.3, now - 10 + rng.random(n) * 40, np.inf)
    rows.created_at[rng.random(n) < 0.1] = now - 1e5  # recency underflows to 0
    queries = rng.normal(size=(3, DIM)).astype(np.float32)
    store = PostgresStore(dsn, table=f"memories_{next(_tables)}")
    try:
        store.open(DIM)
        store.commit(added(rows))
        gone = sorted(r for r in removed if r < n)
        store.commit(Change(removed=[("delete", 1.0, tuple(gone[::2])), ("evict", 1.0, tuple(gone[1::2]))],
                            version=2, next_id=n))
        found = store.retrieve(queries, now, k=k, scopes=scopes, exact=exact)
    finally:
        store.close()
    live = select(rows, set(range(n)) - set(gone))
    keys: list[str] = [f"#{s}" if isinstance(s, int) else s for s in SCOPES]
    if scopes is None:
        allowed: list[list[str] | None] = [None] * 3
    elif scopes and isinstance(scopes[0], list):
        allowed = [[keys[SCOPES.index(s)] for s in per_query] for per_query in scopes]
    else:
        allowed = [[keys[SCOPES.index(s)] for s in scopes]] * 3
    scope_of = dict(zip(rows.seq.tolist(), rows.scope, strict=True))
    for ids, scopes_q in zip(found.ids, allowed, strict=True):
        assert scopes_q is None or all(scope_of[int(i)] in scopes_q for i in ids if i >= 0)
    assert_same_ranking(found, reference(live, queries, now, k, allowed))
    hit = found.ids >= 0
    np.testing.assert_allclose(found.scores[hit], (0.6 * found.similarity + 0.25 * found.recency
                                                   + 0.15 * found.importance)[hit], atol=1e-12, rtol=0)


def test_ranks_like_sqlite_store(dsn: str) -> None:
    rng = np.random.default_rng(7)
    rows = unit_rows(rng, range(300))
    rows.valid_until[::7] = 90.0
    changes = [added(rows), Change(removed=[("delete", 2.0, tuple(range(0, 300, 11))),
                                            ("expire", 2.0, tuple(range(5, 300, 13)))], version=2, next_id=300)]
    postgres, sqlite = PostgresStore(dsn), SQLiteStore(":memory:")
    for store in (postgres, sqlite):
        store.open(DIM)
        for change in changes:
            store.commit(change)
    queries = rng.normal(size=(20, DIM)).astype(np.float32)
    per_query = [[SCOPES[i % 4], SCOPES[(i + 1) % 4]] for i in range(20)]
    for kwargs in ({}, {"scopes": ["alpha", 7]}, {"scopes": per_query}, {"weights": (1.0, 0.0, 0.0), "tau": 3.0},
                   {"weights": (0.5, -0.2, 0.7)}):
        want = sqlite.retrieve(queries, 100.0, k=8, **kwargs)
        for exact in (False, True):
            got = postgres.retrieve(queries, 100.0, k=8, exact=exact, **kwargs)
            assert_same_ranking(got, want)
            for name in ("similarity", "recency", "importance"):
                np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-6, rtol=0, err_msg=name)


def test_hnsw_retrieval_recall(dsn: str) -> None:
    rng = np.random.default_rng(8)
    rows = unit_rows(rng, range(2000), dim=32)
    store = PostgresStore(dsn)
    store.open(32)
    store.commit(added(rows))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE memories")
        plan = conn.execute("EXPLAIN SELECT seq FROM memories WHERE deleted_at IS NULL "
                            "ORDER BY embedding <=> %s::vector LIMIT 100", (str(rows.embedding[0].tolist()),))
        assert "memories_embedding_hnsw" in "\n".join(line for (line,) in plan)
    queries = rng.normal(size=(100, 32)).astype(np.float32)
    for weights in ((1.0, 0.0, 0.0), (0.60, 0.25, 0.15)):
        approximate = store.retrieve(queries, 100.0, k=5, weights=weights).ids
        exact = store.retrieve(queries, 100.0, k=5, weights=weights, exact=True).ids
        recall = np.mean([len(set(a) & set(e)) / 5 for a, e in zip(approximate, exact, strict=True)])
        assert recall >= 0.95, (weights, recall)
        if weights[0] == 1.0:  # similarity alone: the index's pool always holds the top 5, no fallback
            assert store.exact_fallbacks == 0


def test_text_term_ranks_the_matching_memory_first(dsn: str) -> None:
    rows = unit_rows(np.random.default_rng(9), range(5), scopes=["alpha"])
    rows.content = ["the parcel arrived damaged", "refund for a damaged parcel", "invoice copy", None, "weather"]
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(rows))
    query = rows.embedding[4:5]  # nearest to the memory about the weather
    for exact in (False, True):
        plain = store.retrieve(query, 100.0, k=5, exact=exact)
        assert plain.ids[0, 0] == 4 and (plain.text == 0).all()
        found = store.retrieve(query, 100.0, k=5, exact=exact, text="Damaged refund?", w_text=5.0)
        assert found.ids[0, :2].tolist() == [1, 0]  # both words beat one
        text = dict(zip(found.ids[0].tolist(), found.text[0].tolist(), strict=True))
        assert text[1] == 1.0 and 0 < text[0] < 1 and text[2] == text[3] == text[4] == 0.0
        nothing = store.retrieve(query, 100.0, k=5, exact=exact, text="?!", w_text=5.0)
        assert_same_ranking(nothing, plain)


# -- row-level security -------------------------------------------------------------------------
def test_row_level_security_restricts_every_statement(server: str) -> None:
    role = f"gae_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(role)))
    database = _create_database(server, owner=role)
    with psycopg.connect(database, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION vector")  # a superuser's job; the role owns the tables
    app = make_conninfo(database, user=role)
    rows = unit_rows(np.random.default_rng(10), range(40))
    store = PostgresStore(app, row_level_security=True)
    store.open(DIM)
    store.commit(added(rows))
    scope_of = dict(zip(rows.seq.tolist(), rows.scope, strict=True))
    store.set_scopes(["alpha", 0])
    for exact in (False, True):
        found = store.retrieve(rows.embedding, 100.0, k=40, exact=exact)  # no scopes argument
        assert {scope_of[int(i)] for i in found.ids.ravel() if i >= 0} == {"alpha", "#0"}
    assert_same_ranking(store.retrieve(rows.embedding, 100.0, k=5), store.retrieve(rows.embedding, 100.0, k=5,
                                                                                   exact=True))
    reader = PostgresStore(app, row_level_security=True)
    reader.set_scopes([7])
    snapshot = reader.open(DIM)
    assert snapshot is not None and set(snapshot.rows.scope) == {"#7"}
    with psycopg.connect(app) as conn:
        assert conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
                            ).fetchone() == (False,)
        conn.execute("SELECT set_config('gae.scopes', %s, false)", ('["beta,gamma"]',))
        assert {s for (s,) in conn.execute("SELECT scope_id FROM memories")} == {"beta,gamma"}
        conn.execute("SELECT set_config('gae.scopes', '[]', false)")
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (0,)
    outside = unit_rows(np.random.default_rng(11), [40], scopes=["beta,gamma"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        store.commit(added(outside, version=2))
    store.set_scopes(None)
    assert len(store.retrieve(rows.embedding[:1], 100.0, k=40, exact=True).ids[0]) == 40
    assert PostgresStore(app).open(DIM).rows.seq.tolist() == list(range(40))


# -- integrity -----------------------------------------------------------------------------------
def _busy_table(dsn: str) -> None:
    """A table that has added, evicted, deleted and expired rows."""
    with PostgresStore(dsn) as store:
        store.open(DIM)
        store.commit(added(unit_rows(np.random.default_rng(3), range(8))))
        store.commit(Change(removed=[("evict", 2.0, (5,)), ("delete", 2.0, (6,)), ("expire", 3.0, (7,))],
                            audit=[AuditEntry("evict", 2.0, (5,), "capacity", 2),
                                   AuditEntry("delete", 2.0, (6,), "user asked", 3),
                                   AuditEntry("expire", 3.0, (7,), "expired", 4)],
                            version=4, next_id=8, scope_names=["alpha", "beta,gamma"]))


def test_check_passes_a_sound_table_and_finds_what_changed_behind_its_back(dsn: str) -> None:
    from gae.storage import StoreCorrupted
    from gae.storage.integrity import CHECKED, row_checksum
    from gae.storage.postgres_integrity import canonical

    _busy_table(dsn)
    store = PostgresStore(dsn)
    report = store.check()  # before open(dim) too
    assert report.ok and (report.rows, report.audit) == (8, 4) and report.where.startswith("table 'memories' of ")
    assert any("checksums" in c for c in report.checks) and any("amcheck" in s for s in report.skipped)
    with psycopg.connect(dsn, autocommit=True) as conn:  # the deleted row's checksum is of what is left
        record = conn.execute(f"SELECT {', '.join(CHECKED)}, checksum FROM memories WHERE seq = 6").fetchone()
        assert record[4] is None and record[5] is None and record[-1] == row_checksum(canonical(record[:-1]))
        conn.execute("UPDATE memories SET embedding = '[1, 0, 0, 0]' WHERE seq = 3")
        conn.execute("UPDATE memories SET deleted_at = NULL, deleted_reason = NULL WHERE seq = 5")  # revived
        conn.execute("UPDATE memories_audit SET reason = 'nothing to see' WHERE action = 'delete'")
    with pytest.raises(StoreCorrupted, match=r"table 'memories' of database '\w+' is damaged: row seq=3 ") as raised:
        store.check()
    assert raised.value.problems[1].startswith("row seq=5 does not match")
    assert raised.value.problems[2].startswith("audit record n=")
    assert store.check(raises=False).problems == tuple(raised.value.problems)
    with pytest.raises(ValueError, match="raises must be a bool"):
        store.check(raises="no")
    with psycopg.connect(dsn, autocommit=True) as conn:  # the counters are checked on every open
        conn.execute("UPDATE memories_meta SET value = '[]' WHERE key = 'scope_names'")
    with pytest.raises(StoreCorrupted, match="meta value 'scope_names' does not match its checksum"):
        PostgresStore(dsn).open(DIM)
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.check()


def test_check_covers_the_checksummed_tables_beside_the_memories(dsn: str) -> None:
    """One check of a table that holds memories and a ledger-like table: both verified."""
    from gae.storage import INT, TEXT, Column, StoreCorrupted, Table

    _busy_table(dsn)
    notes = Table("notes", (Column("n", INT, nullable=False), Column("body", TEXT)), key=("n",))
    store = PostgresStore(dsn)
    store.insert(notes, [(i, f"note {i}") for i in range(5)])
    report = store.check()
    assert report.ok and (report.rows, report.audit) == (8, 4) and report.tables == {"notes": 5}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE memories_notes SET body = 'changed' WHERE n = 3")
        conn.execute("UPDATE memories_audit SET reason = 'nothing to see' WHERE action = 'delete'")
    with pytest.raises(StoreCorrupted) as raised:
        store.check()
    assert raised.value.problems[0].startswith("audit record n=")
    assert raised.value.problems[1] == "table notes: row (n=3) does not match its checksum"
    store.close()


def test_a_schema_1_table_gains_the_checksums_it_would_have_written(dsn: str) -> None:
    from gae.storage import StoreCorrupted

    _busy_table(dsn)
    tables = ("memories", "memories_audit", "memories_meta")
    with psycopg.connect(dsn, autocommit=True) as conn:
        sums = {t: conn.execute(f"SELECT checksum FROM {t} ORDER BY 1").fetchall() for t in tables}
        for table in tables:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN checksum")
        conn.execute("UPDATE memories_schema_version SET version = 1")
    assert PostgresStore(dsn).check().skipped == ("checksums: schema version 1 has none (open(dim) adds them)",)
    store = PostgresStore(dsn)
    assert store.open(DIM) is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM memories_schema_version").fetchone() == (SCHEMA_VERSION,)
        assert {t: conn.execute(f"SELECT checksum FROM {t} ORDER BY 1").fetchall() for t in tables} == sums
    assert store.check().ok
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE memories_schema_version SET version = 0")
    with pytest.raises(StoreCorrupted, match=r"unknown schema version \[0\]"):
        PostgresStore(dsn).open(DIM)


# -- errors --------------------------------------------------------------------------------------
def test_argument_errors(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for kwargs, message in (({"table": "Memories"}, "table"), ({"table": "a;drop"}, "table"),
                            ({"actor": ""}, "actor"), ({"row_level_security": 1}, "row_level_security"),
                            ({"ef_search": 0}, "ef_search"), ({"ef_search": 1001}, "ef_search"),
                            ({"candidates": True}, "candidates")):
        with pytest.raises(ValueError, match=message):
            PostgresStore(dsn, **kwargs)
    with pytest.raises(ValueError, match="dsn"):
        PostgresStore("")
    store = PostgresStore(dsn)
    with pytest.raises(RuntimeError, match="open"):
        store.commit(Change())
    with pytest.raises(RuntimeError, match="open"):
        store.retrieve(np.ones((1, DIM)), 0.0)
    for dim in (0, True, 2001):
        with pytest.raises(ValueError, match="dim"):
            store.open(dim)
    store.open(DIM)
    with pytest.raises(ValueError, match="exact"):
        store.retrieve(np.ones((1, DIM)), 0.0, exact=1)
    with pytest.raises(ValueError, match="queries"):
        store.retrieve(np.ones((1, DIM + 1)), 0.0)
    with pytest.raises(ValueError, match="row_level_security"):
        store.set_scopes(["alpha"])
    with pytest.raises(ValueError, match="scopes"):
        PostgresStore(dsn, row_level_security=True).set_scopes("alpha")
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r"gae-torch\[store\]"):
        PostgresStore(dsn)


def test_repr_shows_no_credentials(dsn: str) -> None:
    store = PostgresStore(make_conninfo(dsn, password="hunter2"), table="support")
    assert "hunter2" not in repr(store) and "table='support'" in repr(store) and "dim=None" in repr(store)
    store.close()
    assert repr(store).startswith("PostgresStore(dbname='gae_")


def test_candidate_pools_rank_like_the_exact_ranking(dsn: str) -> None:
    """With 3 candidates the pool cannot prove its top 5 and every query falls back to the exact
    ranking; with 30 it proves it for these rows (and an index scan cut short by ef_search=10
    still bounds the rows it did not return)."""
    rng = np.random.default_rng(12)
    rows = unit_rows(rng, range(200))
    rows.embedding[17] = 0.0  # the HNSW index skips zero vectors
    queries = rng.normal(size=(10, DIM)).astype(np.float32)
    fallbacks = []
    for ef_search, candidates in ((None, 3), (40, 30), (10, 30)):
        store = PostgresStore(dsn, table=f"pool_{ef_search or 0}_{candidates}", ef_search=ef_search,
                              candidates=candidates)
        store.open(DIM)
        store.commit(added(rows))
        for kwargs in ({}, {"scopes": ["alpha"]}, {"text": "number 17 or 42", "w_text": 0.3}):
            assert_same_ranking(store.retrieve(queries, 100.0, k=5, **kwargs),
                                store.retrieve(queries, 100.0, k=5, exact=True, **kwargs))
            fallbacks.append(store.exact_fallbacks)
    assert fallbacks[:3] == [10, 20, 30] and fallbacks[3] == 0  # 3 candidates: always; 30: not for these


def test_ties_go_to_the_older_memory(dsn: str) -> None:
    rows = unit_rows(np.random.default_rng(13), [9, 4, 6, 1], scopes=["alpha"])
    rows.embedding[:] = rows.embedding[0]
    rows.importance[:], rows.created_at[:] = 0.5, 90.0
    store = PostgresStore(dsn)
    store.open(DIM)
    store.commit(added(rows))
    for exact in (False, True):
        found = store.retrieve(rows.embedding[:1], 100.0, k=3, exact=exact)
        assert found.ids[0].tolist() == [1, 4, 6] and len(set(found.scores[0].tolist())) == 1


# -- EpisodicMemory written through to Postgres ------------------------------------------------------
def test_episodic_memory_restores_exactly_from_postgres(dsn: str) -> None:
    import torch

    from gae import EpisodicMemory
    from tests.test_store import DIM as MEMORY_DIM
    from tests.test_store import assert_same_index, busy_memory

    memory = busy_memory(PostgresStore(dsn, actor="tester"))
    assert {"add", "evict", "delete", "expire", "reject"} <= {r.action for r in memory.audit_log}
    reopened = EpisodicMemory(MEMORY_DIM, capacity=12, store=PostgresStore(dsn))
    assert_same_index(memory, reopened)
    on_sqlite = busy_memory(SQLiteStore(":memory:"))  # the same calls give the same index on either store
    assert_same_index(memory, on_sqlite)
    queries = torch.randn(3, MEMORY_DIM, generator=torch.Generator().manual_seed(3))
    weights = tuple(float(w) for w in memory.scorer.weights)
    ours = memory.retrieve(queries, now=11.0, k=4, scopes=["alice", 3])
    theirs = reopened.store.retrieve(queries.numpy(), 11.0, 4, ["alice", 3], weights=weights,
                                     tau=float(memory.scorer.tau), exact=True)
    assert ours.ids.tolist() == theirs.ids.tolist()
    audit = reopened.store.audit()
    assert {entry.actor for entry in audit} == {"tester"}
    assert [(e.action, e.time, e.ids, e.reason, e.version) for e in audit] == [tuple(r) for r in memory.audit_log]
    mutations = [e for e in audit if e.action != "reject"]
    assert [e.version for e in mutations] == list(range(1, memory.version + 1))  # one row per mutation


def test_a_reopened_memory_keeps_the_newest_audit_records_and_postgres_all(dsn: str) -> None:
    from gae import EpisodicMemory
    from tests.test_episodic_audit import DIM as AUDIT_DIM
    from tests.test_episodic_audit import churn, records

    memory = EpisodicMemory(AUDIT_DIM, capacity=3, store=PostgresStore(dsn), max_audit=5)
    churn(memory, 25)
    full = memory.store.audit()
    assert len(full) > 25 and [(e.action, e.time, e.ids, e.reason, e.version) for e in full[-5:]] == records(memory)
    assert memory.store.audit(last=3) == full[-3:] and memory.store.audit(last=0) == []
    with pytest.raises(ValueError, match="last"):
        memory.store.audit(last=-1)
    reopened = EpisodicMemory(AUDIT_DIM, capacity=3, store=PostgresStore(dsn), max_audit=4)
    assert records(reopened) == records(memory)[-4:] and reopened.version == memory.version


def test_a_killed_writer_loses_nothing_on_postgres(dsn: str, tmp_path) -> None:
    import os
    import signal
    import subprocess

    import torch

    from gae import EpisodicMemory
    from tests.test_store import ROOT, assert_same_index

    script = tmp_path / "writer.py"
    script.write_text(
        "import sys, torch\n"
        "from gae import EpisodicMemory\n"
        "from gae.storage import PostgresStore\n"
        "memory = EpisodicMemory(4, capacity=30, store=PostgresStore(sys.argv[1]))\n"
        "gen = torch.Generator().manual_seed(0)\n"
        "for step in range(100000):\n"
        "    ids = memory.add(torch.randn(2, 4, generator=gen), torch.rand(2, generator=gen), now=float(step))\n"
        "    print(step, *ids.tolist(), flush=True)\n")
    process = subprocess.Popen([sys.executable, str(script), dsn], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None
    reported = 0
    for _ in process.stdout:
        reported += 1
        if reported == 60:
            os.kill(process.pid, signal.SIGKILL)
            break
    process.wait()
    reopened = EpisodicMemory(4, capacity=30, store=PostgresStore(dsn))
    steps = sum(r.action == "add" for r in reopened.audit_log)
    assert steps >= reported
    replay = EpisodicMemory(4, capacity=30)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        replay.add(torch.randn(2, 4, generator=gen), torch.rand(2, generator=gen), now=float(step))
    assert_same_index(replay, reopened)

