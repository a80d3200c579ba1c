"""Benchmark the durable stores: add throughput, retrieval latency and HNSW recall.

N memories (default 100,000) of width D (default 384): unit vectors in 2,000 clusters
(intra-cluster cosine about 0.8, like sentence embeddings of related traces), ``created_at``
spread over the last hour, importance uniform, 4 scopes. Queries are stored memories plus
noise, so each has near neighbours. The score is the hourly one of ``RetrievalScorer.hourly()``
(0.60 cos + 0.25 exp(-age / 1 h) + 0.15 importance), k=5, no scope filter.

1. Add throughput, memories/s, in batches of 1,000 through ``EpisodicMemory(..., store=...)``
   (every batch one transaction): the tensor index alone, ``SQLiteStore`` (WAL,
   ``synchronous=FULL``) and ``PostgresStore`` (a local pgserver: Postgres 16 + pgvector, HNSW
   index maintained on insert).
2. Retrieval latency, ms per call, Q=1 and Q=64 (median over repeats): the tensor index
   (``EpisodicMemory.retrieve``), ``SQLiteStore.retrieve`` (exact, ranked in this process),
   Postgres exact (every row scored in SQL) and Postgres through the HNSW index.
3. HNSW recall@5 of Postgres against the exact ranking, over ``hnsw.ef_search``.

With ``--integrity true`` it measures instead what the stores' integrity checks cost, on stores
of a few sizes (``--sizes``, ``--postgres_sizes``): the checksums a write computes, opening a
SQLite file (its header, ``PRAGMA quick_check``, the schema version) beside the snapshot that
opening reads anyway, and ``store.check()`` on both stores.

    python scripts/bench_store.py                        # N=100,000, D=384 (several minutes on 2 cores)
    python scripts/bench_store.py --quick true           # N=3,000, D=32: a smoke run
    python scripts/bench_store.py --readme docs/store.md   # also refresh the page's table
    python scripts/bench_store.py --integrity true --readme docs/store.md   # the integrity costs (a minute or two)

Writes every number to ``--out`` (JSON) and, with ``--readme``, puts the tables between
``<!-- bench-store:start -->`` and ``<!-- bench-store:end -->`` (with ``--integrity``,
``<!-- bench-store-integrity:start -->`` and its end) and commits the record they are rendered
from to docs/results/bench-store.json (bench-store-integrity.json).
"""

from __future__ import annotations

import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import EpisodicMemory, RetrievalScorer  # noqa: E402
from gae.storage import SQLiteStore  # noqa: E402
from gae.storage.base import dumps_ids, split_scope  # noqa: E402
from gae.storage.integrity import row_checksum  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.readme import markers, publish_section, record_path  # noqa: E402

START, END = markers("bench-store")
SCOPES = ["alpha", "beta", "gamma", "delta"]


def progress(message: str) -> None:
    print(f"[bench-store] {message}", file=sys.stderr, flush=True)


def make_data(n: int, dim: int, n_queries: int, seed: int = 0) -> dict[str, Any]:
    gen = np.random.default_rng(seed)
    clusters = max(1, n // 50)
    centres = gen.normal(size=(clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    spread = 0.5 / np.sqrt(dim)  # per-coordinate noise: cosine to the centre about 0.9
    x = centres[gen.integers(0, clusters, n)] + spread * gen.normal(size=(n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    picked = gen.integers(0, n, n_queries)
    queries = x[picked] + spread * gen.normal(size=(n_queries, dim))
    return {"x": x.astype(np.float32), "queries": queries.astype(np.float32),
            "created_at": 3600.0 * gen.random(n), "importance": gen.random(n).astype(np.float32),
            "scope": [SCOPES[i] for i in gen.integers(0, len(SCOPES), n)], "now": 3600.0}


def fill(memory: EpisodicMemory, data: dict[str, Any], batch: int, label: str) -> float:
    """Add every memory in batches; return memories per second."""
    n = data["x"].shape[0]
    began = time.perf_counter()
    for start in tqdm(range(0, n, batch), desc=f"add {label}", unit="batch", leave=False):
        stop = min(start + batch, n)
        memory.add(torch.from_numpy(data["x"][start:stop]), torch.from_numpy(data["importance"][start:stop]),
                   created_at=torch.from_numpy(data["created_at"][start:stop]), scope=data["scope"][start:stop],
                   now=data["now"])
    return n / (time.perf_counter() - began)


def timed(call: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``call`` in ms, after one untimed warm-up."""
    call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true top-k that was found."""
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / len(t) for f, t in zip(found, truth,
                                                                                           strict=True)]))


def index_similarity(index: EpisodicMemory, queries: np.ndarray, k: int) -> np.ndarray:
    """The exact top-k ids by cosine alone (the tensor index's embeddings, ties to the older)."""
    similarity = torch.from_numpy(queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ index.column(
        "embeddings").T
    return index.column("ids")[similarity.topk(k, dim=1).indices].numpy()


def start_postgres(folder: str) -> Any:
    import pgserver

    return pgserver.get_server(folder, cleanup_mode="stop")


def main(quick: bool = False, n: int = 100_000, dim: int = 384, queries: int = 64, k: int = 5, batch: int = 1000,
         repeats: int = 5, ef_search: list[int] | None = None, out: Path | None = None,
         readme: Path | None = None, integrity: bool = False, sizes: list[int] | None = None,
         postgres_sizes: list[int] | None = None) -> dict[str, Any]:
    """Run the store benchmark (see the module docstring).

    Args:
        quick: N=3,000, D=32, 2 repeats: a smoke run.
        n, dim: memories and their width.
        queries: Q of the batched retrieval.
        k: memories per query.
        batch: memories per add call (one transaction each).
        repeats: timed repeats per latency.
        ef_search: the HNSW ``ef_search`` values of the recall curve. Default: 10 .. 400.
        out: JSON file for every number. Default: results/bench/bench_store.json
            (bench_store_integrity.json with ``integrity``).
        readme: the page with bench-store markers to refresh, docs/store.md (with ``integrity``: a
            page with bench-store-integrity markers, docs/store.md too).
        integrity: measure the integrity checks' costs instead (see the module docstring).
        sizes, postgres_sizes: with ``integrity``, the SQLite and Postgres store sizes. Default:
            1,000, 10,000 and 100,000; 1,000 and 10,000 (Postgres adds are HNSW-bound).
    """
    if integrity:
        return integrity_main(sizes or [1_000, 10_000, 100_000], postgres_sizes or [1_000, 10_000], dim, batch,
                              repeats, out or Path("results/bench/bench_store_integrity.json"), readme)
    out = out or Path("results/bench/bench_store.json")
    if quick:
        n, dim, repeats = 3000, 32, 2
    ef_values = ef_search or [10, 20, 40, 80, 100, 200, 400]
    data = make_data(n, dim, queries)
    scorer = RetrievalScorer.hourly()
    weights = tuple(float(w) for w in scorer.weights)
    tau = float(scorer.tau)
    now = data["now"]
    results: dict[str, Any] = {"n": n, "dim": dim, "queries": queries, "k": k, "batch": batch, "repeats": repeats}
    folder = tempfile.mkdtemp(prefix="gae-bench-store-")

    progress(f"adding {n:,} memories of width {dim} to the tensor index, SQLite and Postgres")
    index = EpisodicMemory(dim, capacity=n, scorer=scorer)
    results["add_index"] = fill(index, data, batch, "tensor index")
    sqlite_store = SQLiteStore(Path(folder) / "memory.db")
    results["add_sqlite"] = fill(EpisodicMemory(dim, capacity=n, scorer=scorer, store=sqlite_store), data, batch,
                                 "SQLite")
    server = start_postgres(str(Path(folder) / "postgres"))
    from gae.storage import PostgresStore

    postgres = PostgresStore(server.get_uri())
    results["add_postgres"] = fill(EpisodicMemory(dim, capacity=n, scorer=scorer, store=postgres), data, batch,
                                   "Postgres")

    progress("retrieval latency")
    q64 = data["queries"]
    latency: dict[str, dict[str, float]] = {}
    calls: dict[str, Callable[[np.ndarray], Any]] = {
        "tensor index": lambda q: index.retrieve(torch.from_numpy(q), now=now, k=k),
        "SQLite (exact, in process)": lambda q: sqlite_store.retrieve(q, now, k, weights=weights, tau=tau),
        "Postgres exact": lambda q: postgres.retrieve(q, now, k, weights=weights, tau=tau, exact=True),
        "Postgres HNSW": lambda q: postgres.retrieve(q, now, k, weights=weights, tau=tau),
    }
    for name, call in calls.items():
        q64_repeats = max(1, repeats // 2) if "exact" in name else repeats  # an exact scan of N rows is slow
        latency[name] = {"q1": timed(lambda call=call: call(q64[:1]), repeats),
                         "q64": timed(lambda call=call: call(q64), q64_repeats)}
    results["latency_ms"] = latency

    progress("HNSW recall@5 over ef_search")
    exact = index.retrieve(torch.from_numpy(q64), now=now, k=k).ids.numpy()
    exact_pg = postgres.retrieve(q64, now, k, weights=weights, tau=tau, exact=True).ids
    results["postgres_exact_equals_index"] = recall(exact_pg, exact)
    similarity_only = (1.0, 0.0, 0.0)  # the index's own recall: nearest neighbours by cosine
    exact_similarity = index_similarity(index, q64, k)
    curve = []
    for ef in ef_values:
        store = PostgresStore(server.get_uri(), ef_search=ef)
        store.open(dim)
        found = store.retrieve(q64, now, k, weights=weights, tau=tau).ids
        fallbacks = store.exact_fallbacks
        nearest = store.retrieve(q64, now, k, weights=similarity_only, tau=tau).ids
        curve.append({"ef_search": ef, "recall_at_5": recall(found, exact), "exact_fallbacks": fallbacks,
                      "similarity_recall_at_5": recall(nearest, exact_similarity),
                      "q64_ms": timed(lambda store=store: store.retrieve(q64, now, k, weights=weights, tau=tau),
                                      max(1, repeats // 2)),
                      "similarity_q64_ms": timed(lambda store=store: store.retrieve(q64, now, k, tau=tau,
                                                                                    weights=similarity_only),
                                                 max(1, repeats // 2))})
        store.close()
    results["recall_curve"] = curve
    before = postgres.exact_fallbacks
    results["recall_default"] = recall(postgres.retrieve(q64, now, k, weights=weights, tau=tau).ids, exact)
    results["exact_fallbacks_default"] = postgres.exact_fallbacks - before
    results["similarity_recall_default"] = recall(
        postgres.retrieve(q64, now, k, weights=similarity_only, tau=tau).ids, exact_similarity)
    postgres.close()
    sqlite_store.close()
    server.cleanup()
    results["machine"] = (f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
                          f"Python {platform.python_version()}")

    text = tables(results)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    progress(f"wrote {out}")
    if readme is not None and publish_section(readme, "bench-store", results, tables):
        progress(f"updated the table in {readme} and {record_path(readme, 'bench-store')}")
    return results


def tables(results: dict[str, Any]) -> str:
    """docs/store.md's store-speed section, rendered from a ``bench_store.json`` record."""
    n, dim = results["n"], results["dim"]
    lines = [f"N = {n:,} memories, D = {dim}, k = {results['k']}, adds in batches of {results['batch']:,} "
             "(one transaction each):", "",
             "| store | add throughput | retrieve Q=1 | retrieve Q=64 |", "|---|---:|---:|---:|"]
    adds = {"tensor index": results["add_index"], "SQLite (exact, in process)": results["add_sqlite"],
            "Postgres exact": results["add_postgres"], "Postgres HNSW": None}
    for name, timing in results["latency_ms"].items():
        rate = adds.get(name)
        lines.append(f"| {name} | {'' if rate is None else f'{rate:,.0f} /s'} | {timing['q1']:.2f} ms | "
                     f"{timing['q64']:.1f} ms |")
    lines += ["", f"Postgres through HNSW at the default settings, recall@5 against the exact ranking: "
              f"{results['recall_default']:.3f} with the full score ({results['exact_fallbacks_default']} of "
              f"{results['queries']} queries fell back to exact ranking), {results['similarity_recall_default']:.3f} "
              f"by cosine alone (the index's own recall; target >= 0.95). Postgres exact agrees with the tensor "
              f"index on {results['postgres_exact_equals_index']:.3f} of the top 5.", "",
              "| hnsw.ef_search | recall@5, full score | queries ranked exactly | retrieve Q=64 | recall@5, cosine "
              "only | retrieve Q=64, cosine only |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {row['ef_search']} | {row['recall_at_5']:.3f} | {row['exact_fallbacks']} | {row['q64_ms']:.1f} ms "
              f"| {row['similarity_recall_at_5']:.3f} | {row['similarity_q64_ms']:.1f} ms |"
              for row in results["recall_curve"]]
    lines += ["", f"Measured on {results['machine']}; regenerate with `python scripts/bench_store.py --readme "
              "docs/store.md`."]
    return "\n".join(lines)


def checksum_us(data: dict[str, Any]) -> float:
    """Microseconds per row of the checksums a write computes (SQLiteStore's insert, over every
    column: the embedding's bytes, scope, content, provenance, validity, importance, time)."""
    records = [(i, *split_scope(scope), "episode", None, row.tobytes(), 1.0, "normal", dumps_ids(()), -np.inf,
                np.inf, float(importance), float(created), None, None)
               for i, (row, scope, importance, created) in enumerate(zip(
                   data["x"], data["scope"], data["importance"], data["created_at"], strict=True))]
    began = time.perf_counter()
    for values in records:
        row_checksum(values)
    return (time.perf_counter() - began) / len(records) * 1e6


def sqlite_costs(path: Path, data: dict[str, Any], batch: int, repeats: int) -> dict[str, Any]:
    """One SQLite store of ``data``'s memories: its add rate and checksums, opening it, checking it."""
    n, dim = data["x"].shape
    with SQLiteStore(path) as store:
        adds = fill(EpisodicMemory(dim, capacity=n, store=store), data, batch, f"SQLite {n:,}")
    raw = sqlite3.connect(path)
    store = SQLiteStore(path)
    costs = {"n": n, "mb": path.stat().st_size / 1e6, "adds_per_s": adds, "checksum_us": checksum_us(data),
             "construct_ms": timed(lambda: SQLiteStore(path).close(), repeats),
             "quick_check_ms": timed(lambda: raw.execute("PRAGMA quick_check").fetchall(), repeats),
             "open_ms": timed(lambda: store.open(dim), repeats),
             "integrity_check_ms": timed(lambda: raw.execute("PRAGMA integrity_check").fetchall(), repeats),
             "check_ms": timed(store.check, repeats)}
    store.close()
    raw.close()
    return costs


def integrity_main(sizes: list[int], postgres_sizes: list[int], dim: int, batch: int, repeats: int, out: Path,
                   readme: Path | None) -> dict[str, Any]:
    """What the integrity checks cost: on SQLite stores of ``sizes`` memories and Postgres
    tables of ``postgres_sizes``, the checksums' cost per written row beside the add rate,
    opening (medians of ``repeats``, warm page cache) and ``check()``."""
    began = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="gae-bench-integrity-")
    results: dict[str, Any] = {"dim": dim, "batch": batch, "repeats": repeats, "sqlite": [], "postgres": []}
    for n in sizes:
        progress(f"SQLite, {n:,} memories of width {dim}")
        data = make_data(n, dim, 1)
        path = Path(folder) / f"memory-{n}.db"
        results["sqlite"].append(sqlite_costs(path, data, batch, repeats))
        path.unlink()
    if postgres_sizes:
        from gae.storage import PostgresStore

        server = start_postgres(str(Path(folder) / "postgres"))
        for n in postgres_sizes:
            progress(f"Postgres, {n:,} memories of width {dim}")
            data = make_data(n, dim, 1)
            table = f"memories_{n}"
            with PostgresStore(server.get_uri(), table=table) as store:
                adds = fill(EpisodicMemory(dim, capacity=n, store=store), data, batch, f"Postgres {n:,}")

            def reopen(table: str = table) -> None:
                with PostgresStore(server.get_uri(), table=table) as opened:
                    opened.open(dim)

            store = PostgresStore(server.get_uri(), table=table)
            results["postgres"].append({"n": n, "adds_per_s": adds, "open_ms": timed(reopen, repeats),
                                        "check_ms": timed(store.check, repeats),
                                        "skipped": list(store.check().skipped)})
            store.close()
        server.cleanup()
    results["machine"] = (f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
                          f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}")
    results["seconds"] = time.perf_counter() - began
    text = integrity_tables(results)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    progress(f"wrote {out}")
    if readme is not None and publish_section(readme, "bench-store-integrity", results, integrity_tables):
        progress(f"updated the section in {readme} and {record_path(readme, 'bench-store-integrity')}")
    return results


def integrity_tables(results: dict[str, Any]) -> str:
    """docs/store.md's integrity section, rendered from a ``bench_store_integrity.json`` record."""
    lines = [f"D = {results['dim']}, adds in batches of {results['batch']:,}, times the median of "
             f"{results['repeats']} runs on a warm page cache:", "",
             "| SQLite store | file | adds/s | checksums per written row | `SQLiteStore(path)` (header, size, "
             "`quick_check`, version) | `quick_check` alone | `open(dim)` (reads the live rows) | `check()` | "
             "`integrity_check` alone |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['n']:,} | {r['mb']:,.1f} MB | {r['adds_per_s']:,.0f} | {r['checksum_us']:.1f} µs "
              f"({r['checksum_us'] * r['adds_per_s'] / 1e4:.0f}% of an add) | {r['construct_ms']:,.1f} ms | "
              f"{r['quick_check_ms']:,.1f} ms | {r['open_ms']:,.1f} ms | {r['check_ms']:,.1f} ms | "
              f"{r['integrity_check_ms']:,.1f} ms |" for r in results["sqlite"]]
    big = max(results["sqlite"], key=lambda r: r["n"])
    lines += ["", f"At {big['n']:,} memories, opening's checks (`SQLiteStore(path)`) take "
              f"{big['construct_ms'] / big['open_ms']:.0%} of the time `open(dim)` takes to read the rows, and "
              f"`check()` {big['check_ms'] / big['open_ms']:.1f} times as long."]
    if results["postgres"]:
        lines += ["", "| Postgres table | adds/s | `PostgresStore(dsn).open(dim)` | `check()` |",
                  "|---:|---:|---:|---:|"]
        lines += [f"| {r['n']:,} | {r['adds_per_s']:,.0f} | {r['open_ms']:,.1f} ms | {r['check_ms']:,.1f} ms |"
                  for r in results["postgres"]]
        lines += ["", "Postgres `check()` skipped, on this server: " + "; ".join(results["postgres"][0]["skipped"])
                  + "."]
    lines += ["", f"Measured on {results['machine']} in {results['seconds']:.0f} s; regenerate with "
              "`python scripts/bench_store.py --integrity true --readme docs/store.md`."]
    return "\n".join(lines)


if __name__ == "__main__":
    auto_cli(main)
