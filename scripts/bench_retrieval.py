"""Benchmark gae's batched retrieval (``EpisodicMemory.retrieve``) and its add path.

Retrieval: Q=64 queries, D=384, k=5, ``now`` fixed, N in {10k, 100k, 1M} random unit-norm float32
memories (``created_at`` spread over the last hour, importance uniform, 4 scopes), each batch
timed in ms (median over repeats, after one untimed warm-up; the contestants take turns inside
every repeat, so a load spike from another process hits them alike, each after a short untimed
pause so the previous library's spinning worker threads are idle) for

1. gae: ``EpisodicMemory.retrieve(queries, now=..., k=5, scopes=...)``, the full score
   (``RetrievalScorer.hourly()``: cos + recency + importance, validity, scope mask);
2. the floor: bare torch ``queries @ embeddings.T`` then ``topk(5)`` (similarity only, no scopes);
3. numpy: the same full score as gae, straightforwardly vectorised and chunked like gae
   (``argpartition`` top-5 per chunk, then a merge);
4. faiss ``IndexFlatIP`` similarity-only search (skipped, with a note, when faiss is missing).

Each N is measured without scopes and with a scope list shared by all queries (2 of the 4).
Target: gae within 1.5x of the floor and faster than numpy, at every N. Every implementation runs
with its library's default thread count (recorded). The extra memory of one gae retrieve at the
largest N is measured as the rise of the process's peak RSS (Linux: ``/proc/self/clear_refs``
resets the peak, after ``malloc_trim`` hands freed heap back), next to the floor's for scale, and
compared with the Q x N x 3 x 4 bytes of an unchunked score.

Add throughput (memories/s), ``'lowest_score'`` eviction: capacity 30 fed one memory per call
with a query (the original design's per-event use) and in batches of 100; capacity 100,000 fed
200,000 memories in batches of 1,000 (eviction in the second half).

Prints two Markdown tables, writes every raw number to ``--out`` as JSON and, with ``--readme``,
puts the tables between ``<!-- bench-retrieval:start -->`` and ``<!-- bench-retrieval:end -->``
and commits the record they are rendered from to docs/results/bench-retrieval.json.

    python scripts/bench_retrieval.py                       # full run, about 3 minutes on 2 cores
    python scripts/bench_retrieval.py --quick true          # N in {10k, 100k}, fewer repeats
    python scripts/bench_retrieval.py --readme docs/retrieval.md   # also refresh the page's table

On a machine shared with other busy processes, libgomp's idle threads spin (the default
``OMP_WAIT_POLICY``) and steal the cores the next small op needs; ``OMP_WAIT_POLICY=PASSIVE``
in front of the command measures the libraries rather than the scheduler. The load average
and these variables are recorded with the numbers.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae.episodic import EpisodicMemory  # noqa: E402
from gae.episodic import scorer as gae_retrieval  # noqa: E402
from gae.episodic.scorer import RetrievalScorer  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.readme import as_saved, markers, publish_section, record_path  # noqa: E402

try:
    import faiss  # benchmark-only dependency: pip install -e ".[bench]"
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None  # type: ignore[assignment]

START, END = markers("bench-retrieval")
SCOPES, ALLOWED = 4, [0, 1]
HOUR = 3600.0
NOW = 1_000_000.0  # the fixed "now", in seconds
TARGET_RATIO = 1.5
MIN_AGREEMENT = 0.99  # gae's top-k must match numpy's full score (float rounding may swap a near-tie)
BUILD_CHUNK = 100_000  # memories per add call when filling the store for the retrieval runs
SLOW_S = 5.0  # a contestant whose warm-up call takes longer is timed once (faiss's default path at 1M)
SETTLE_S = 0.2  # pause before each timed call: the previous library's idle threads stop spinning (untimed)


def progress(message: str) -> None:
    """One line of progress on stderr, so stdout stays the tables."""
    print(f"[bench-retrieval] {message}", file=sys.stderr, flush=True)


# -- data -----------------------------------------------------------------------------------------
def make_store(n: int, dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random memories: unit-norm float32 embeddings, ages over the last hour, importance, scopes."""
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.empty(n, dim)
    for start in range(0, n, BUILD_CHUNK):  # chunked: bounded temporaries
        block = torch.randn(min(BUILD_CHUNK, n - start), dim, generator=generator)
        embeddings[start:start + block.shape[0]] = nnf.normalize(block, dim=-1)
    return {"embeddings": embeddings,
            "created_at": NOW - HOUR * torch.rand(n, dtype=torch.float64, generator=generator),
            "importance": torch.rand(n, generator=generator),
            "scope": torch.randint(0, SCOPES, (n,), generator=generator)}


def make_queries(q: int, dim: int, seed: int = 1) -> torch.Tensor:
    """Seeded random unit-norm queries."""
    return nnf.normalize(torch.randn(q, dim, generator=torch.Generator().manual_seed(seed)), dim=-1)


def fill(memory: EpisodicMemory, store: dict[str, torch.Tensor], start: int, stop: int) -> float:
    """Add rows [start, stop) of the store in calls of BUILD_CHUNK; returns the seconds taken."""
    began = time.perf_counter()
    for lo in range(start, stop, BUILD_CHUNK):
        hi = min(lo + BUILD_CHUNK, stop)
        memory.add(store["embeddings"][lo:hi], store["importance"][lo:hi], created_at=store["created_at"][lo:hi],
                   scope=store["scope"][lo:hi].tolist(), now=NOW)
    return time.perf_counter() - began


# -- the contestants ------------------------------------------------------------------------------
def numpy_retrieve(queries: np.ndarray, embeddings: np.ndarray, created_at: np.ndarray, importance: np.ndarray,
                   scope: np.ndarray, *, now: float, k: int, scopes: list[int] | None, weights: np.ndarray,
                   tau: float, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """gae's full score in plain vectorised numpy, chunked over N; returns (Q, k) scores and rows, best first."""
    w_sim, w_rec, w_imp = (np.float32(w) for w in weights)
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    best = np.empty((queries.shape[0], 0), np.float32)
    best_rows = np.empty((queries.shape[0], 0), np.int64)
    for start in range(0, embeddings.shape[0], chunk):
        stop = min(start + chunk, embeddings.shape[0])
        recency = np.exp(-(now - created_at[start:stop]) / tau).astype(np.float32)
        score = w_sim * (unit @ embeddings[start:stop].T) + (w_rec * recency + w_imp * importance[start:stop])
        if scopes is not None:
            score = np.where(np.isin(scope[start:stop], scopes), score, np.float32(-np.inf))
        take = min(k, stop - start)
        part = np.argpartition(-score, take - 1, axis=1)[:, :take]
        best = np.concatenate([best, np.take_along_axis(score, part, axis=1)], axis=1)
        best_rows = np.concatenate([best_rows, part + start], axis=1)
        if best.shape[1] > k:
            keep = np.argpartition(-best, k - 1, axis=1)[:, :k]
            best, best_rows = np.take_along_axis(best, keep, axis=1), np.take_along_axis(best_rows, keep, axis=1)
    order = np.argsort(-best, axis=1, kind="stable")
    return np.take_along_axis(best, order, axis=1), np.take_along_axis(best_rows, order, axis=1)


def floor_retrieve(queries: torch.Tensor, embeddings: torch.Tensor, k: int) -> torch.Tensor:
    """The floor: similarity only, one matmul and one topk."""
    return (queries @ embeddings.T).topk(k, dim=1).indices


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean fraction of the top-k rows two answers share, per query."""
    return float(np.mean([len(set(x) & set(y)) / len(x) for x, y in zip(a.tolist(), b.tolist(), strict=True)]))


# -- timing and memory ----------------------------------------------------------------------------
def timed_turns(contestants: dict[str, Callable[[], Any]], repeats: int,
                slow_s: float = SLOW_S) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """ms per call of each contestant and its last answer.

    One untimed warm-up each, then ``repeats`` rounds in which they take turns (so a load spike
    from another process hits them alike), each timed call after an untimed ``SETTLE_S`` pause
    (OpenBLAS and OpenMP workers spin for a while after a call and would slow whoever comes
    next). A contestant whose warm-up took over ``slow_s`` seconds is timed once, to keep the
    run short."""
    answers, rounds = {}, {}
    for name, run in contestants.items():
        began = time.perf_counter()
        answers[name] = run()
        rounds[name] = repeats if time.perf_counter() - began <= slow_s else 1
    times: dict[str, list[float]] = {name: [] for name in contestants}
    for i in range(repeats):
        for name, run in contestants.items():
            if i < rounds[name]:
                time.sleep(SETTLE_S)
                began = time.perf_counter()
                answers[name] = run()
                times[name].append((time.perf_counter() - began) * 1e3)
    return times, answers


def _kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rise_mib(run: Callable[[], Any]) -> float | None:
    """How far one call of ``run`` lifts the process's peak RSS above its RSS before, in MiB (Linux only)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages back to the OS, so reuse cannot hide a peak
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS (VmHWM) := current RSS
    except OSError:
        return None
    before = _kib("VmRSS")
    run()
    peak = _kib("VmHWM")
    return None if before is None or peak is None else (peak - before) / 1024


# -- the retrieval runs -----------------------------------------------------------------------------
def measure_retrieval(sizes: list[int], q: int, dim: int, k: int, repeats: dict[int, int]) -> dict[str, Any]:
    """Grow one gae store (and one faiss index) through the sizes; time every contestant at each size."""
    largest = max(sizes)
    progress(f"generating {largest:,} x {dim} random unit-norm memories")
    store = make_store(largest, dim)
    queries = make_queries(q, dim)
    np_store = {name: tensor.numpy() for name, tensor in store.items()}
    np_queries = queries.numpy()
    scorer = RetrievalScorer.hourly()
    weights, tau = scorer.weights.detach().numpy().copy(), float(scorer.tau)
    chunk = int(getattr(gae_retrieval, "_CHUNK", 65536))
    memory = EpisodicMemory(dim, capacity=largest, scorer=scorer, eviction="lowest_score")
    index = faiss.IndexFlatIP(dim) if faiss is not None else None
    results: dict[str, Any] = {"sizes": {}, "build": [], "chunk": chunk}
    for n in sorted(sizes):
        held = len(memory)
        progress(f"N={n:,}: adding {n - held:,} memories to gae in calls of {BUILD_CHUNK:,}")
        seconds = fill(memory, store, held, n)
        results["build"].append({"from": held, "to": n, "seconds": seconds, "per_second": (n - held) / seconds})
        if index is not None:
            index.add(np_store["embeddings"][held:n])
        embeddings = store["embeddings"][:n]
        np_n = {name: array[:n] for name, array in np_store.items()}

        def numpy_run(scopes: list[int] | None, np_n: dict = np_n) -> tuple[np.ndarray, np.ndarray]:
            return numpy_retrieve(np_queries, np_n["embeddings"], np_n["created_at"], np_n["importance"],
                                  np_n["scope"], now=NOW, k=k, scopes=scopes, weights=weights, tau=tau, chunk=chunk)

        contestants: dict[str, Callable[[], Any]] = {
            "gae": lambda: memory.retrieve(queries, now=NOW, k=k),
            "gae_scoped": lambda: memory.retrieve(queries, now=NOW, k=k, scopes=ALLOWED),
            "floor": partial(floor_retrieve, queries, embeddings, k),
            "numpy": lambda: numpy_run(None),
            "numpy_scoped": lambda: numpy_run(ALLOWED),
        }
        if index is not None:
            contestants["faiss"] = partial(index.search, np_queries, k)
        progress(f"N={n:,}: timing {', '.join(contestants)} ({repeats[n]} repeats after a warm-up)")
        times, answers = timed_turns(contestants, repeats[n])

        # Speed means nothing unless the answers agree: gae vs numpy on the full score, floor vs faiss.
        # (gae's ids are its rows here: ids count from 0 and nothing was evicted.)
        agreement = {"gae_vs_numpy_no_scopes": overlap(answers["gae"].ids.numpy(), answers["numpy"][1]),
                     "gae_vs_numpy_shared_scopes": overlap(answers["gae_scoped"].ids.numpy(),
                                                           answers["numpy_scoped"][1])}
        if index is not None:
            agreement["floor_vs_faiss"] = overlap(answers["floor"].numpy(), answers["faiss"][1])
        progress(f"N={n:,}: medians (ms) " + ", ".join(f"{name} {statistics.median(values):,.1f}"
                                                        for name, values in times.items()))
        record = {"n": n, "repeats": {name: len(values) for name, values in times.items()}, "ms": times,
                  "median_ms": {name: statistics.median(values) for name, values in times.items()},
                  "agreement": agreement}
        if n == largest:
            progress(f"N={n:,}: peak-RSS rise of one call (gae, gae scoped, floor)")
            record["peak_rise_mib"] = {
                "gae": peak_rise_mib(contestants["gae"]),
                "gae_scoped": peak_rise_mib(contestants["gae_scoped"]),
                "floor": peak_rise_mib(contestants["floor"]),
                "bound_block_mib": q * chunk * 4 / 2**20,
                "unchunked_q_n_3_mib": q * n * 3 * 4 / 2**20,
            }
        results["sizes"][str(n)] = record
        del contestants
    return results


# -- the add runs ---------------------------------------------------------------------------------
def add_run(memory: EpisodicMemory, data: dict[str, torch.Tensor], probes: torch.Tensor, total: int,
            batch: int, with_query: bool) -> dict[str, float]:
    """Feed ``total`` memories in calls of ``batch``, one per second; seconds and memories of the
    calls that only filled the store and of those that evicted."""
    created = torch.arange(total, dtype=torch.float64)  # the newest memory is always "now"
    scopes = data["scope"][:total].tolist()
    split = {"filling_s": 0.0, "filling_n": 0, "evicting_s": 0.0, "evicting_n": 0}
    for call, lo in enumerate(range(0, total, batch)):
        hi = lo + batch
        began = time.perf_counter()
        memory.add(data["embeddings"][lo:hi], data["importance"][lo:hi], created_at=created[lo:hi],
                   scope=scopes[lo:hi], query=probes[call] if with_query else None, now=float(created[hi - 1]))
        phase = "filling" if hi <= memory.capacity else "evicting"
        split[f"{phase}_s"] += time.perf_counter() - began
        split[f"{phase}_n"] += batch
    assert len(memory) == min(total, memory.capacity)
    return split


def add_throughput(capacity: int, total: int, batch: int, dim: int, with_query: bool, repeats: int,
                   seed: int = 2) -> dict[str, Any]:
    """memories/s of ``add`` with 'lowest_score' eviction, ``batch`` memories per call.

    One untimed warm-up first, on a small store that also evicts (not a second full run)."""
    if total % batch:
        raise ValueError(f"total ({total}) must be a multiple of batch ({batch})")
    data = make_store(total, dim, seed=seed)
    probes = make_queries(total // batch, dim, seed=seed + 1)

    def fresh(cap: int) -> EpisodicMemory:
        return EpisodicMemory(dim, capacity=cap, scorer=RetrievalScorer.hourly(), eviction="lowest_score")

    warm_capacity = min(capacity, max(batch, 30))
    warm_total = min(total, (-(-warm_capacity // batch) + 3) * batch)  # fills, then evicts for 3 calls
    add_run(fresh(warm_capacity), data, probes, warm_total, batch, with_query)
    splits = [add_run(fresh(capacity), data, probes, total, batch, with_query) for _ in range(repeats)]
    seconds = [split["filling_s"] + split["evicting_s"] for split in splits]

    def phase_rate(phase: str) -> float | None:
        n = splits[0][f"{phase}_n"]
        return statistics.median(n / split[f"{phase}_s"] for split in splits) if n else None

    return {"capacity": capacity, "total": total, "batch": batch, "calls": total // batch, "query": with_query,
            "seconds": seconds, "splits": splits, "per_second": [total / s for s in seconds],
            "median": statistics.median(total / s for s in seconds),
            "filling_per_second": phase_rate("filling"), "evicting_per_second": phase_rate("evicting")}


# -- reporting ------------------------------------------------------------------------------------
def fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1e6:,.2f} M/s" if value >= 1e6 else f"{value / 1e3:,.1f} k/s"


def retrieval_rows(results: dict[str, Any]) -> list[list[str]]:
    """(measurement, N, gae, floor, numpy, faiss, gae/floor, verdict) per size and scope setting."""
    rows = []
    settings = (("no scopes", "gae", "numpy", "gae_vs_numpy_no_scopes"),
                (f"shared scopes ({len(ALLOWED)} of {SCOPES})", "gae_scoped", "numpy_scoped",
                 "gae_vs_numpy_shared_scopes"))
    for label, gae_key, numpy_key, check in settings:
        for record in results["sizes"].values():
            med = record["median_ms"]
            ratio = med[gae_key] / med["floor"]
            faster = med[gae_key] < med[numpy_key]
            agreement = record["agreement"][check]
            misses = ([f"> {TARGET_RATIO}x floor"] if ratio > TARGET_RATIO else []) + \
                ([] if faster else ["slower than numpy"]) + \
                ([f"top-k differs from numpy ({agreement:.0%} shared)"]
                 if agreement < MIN_AGREEMENT else [])
            verdict = "pass" if not misses else "miss: " + ", ".join(misses)
            rows.append([label, f"{record['n']:,}", fmt_ms(med[gae_key]), fmt_ms(med["floor"]),
                         fmt_ms(med[numpy_key]), fmt_ms(med.get("faiss")), f"{ratio:.2f}x", verdict])
    return rows


def add_rows(adds: dict[str, Any], build: list[dict[str, Any]]) -> list[list[str]]:
    """(run, capacity, memories, memories per call, memories/s, while filling, while evicting)."""
    rows = []
    for record in adds.values():
        rows.append([f"{record['capacity']:,}", f"{record['total']:,}", f"{record['batch']:,}",
                     fmt_rate(record["median"]), fmt_rate(record["filling_per_second"]),
                     fmt_rate(record["evicting_per_second"])])
    for step in build:
        rows.append([f"{step['to']:,} (no eviction)", f"{step['to'] - step['from']:,}", f"{BUILD_CHUNK:,}",
                     fmt_rate(step["per_second"]), fmt_rate(step["per_second"]), "—"])
    return rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _blas_call(prefix: str, *args: int) -> int | None:
    """Call numpy's OpenBLAS ``<prefix>_num_threads`` through ctypes (None when it cannot be found)."""
    try:
        path = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                    if "openblas" in line.lower() and "faiss" not in line.lower() and line.split()[-1].startswith("/"))
        lib = ctypes.CDLL(path)
        for name in (f"scipy_openblas_{prefix}_num_threads64_", f"openblas_{prefix}_num_threads64_",
                     f"openblas_{prefix}_num_threads"):
            if hasattr(lib, name):
                value = getattr(lib, name)(*args)
                return int(value) if prefix == "get" else 0
    except (OSError, StopIteration, ValueError):
        pass
    return None


def set_threads(count: int) -> None:
    """Pin every library to ``count`` threads (torch, numpy's OpenBLAS, faiss's OpenMP)."""
    torch.set_num_threads(count)
    if _blas_call("set", count) is None:
        progress("could not set numpy's OpenBLAS threads (set OPENBLAS_NUM_THREADS instead)")
    if faiss is not None:
        faiss.omp_set_num_threads(count)


THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_info() -> dict[str, Any]:
    return {"env": {name: os.environ[name] for name in THREAD_ENV if name in os.environ},
            "torch": torch.get_num_threads(), "torch_interop": torch.get_num_interop_threads(),
            "numpy_openblas": _blas_call("get"),
            "faiss_omp": faiss.omp_get_max_threads() if faiss is not None else None}


def machine(thread_counts: dict[str, Any], pinned: bool) -> str:
    """One line naming the machine, software and thread counts the numbers come from."""
    faiss_part = f", faiss {faiss.__version__}" if faiss is not None else ", faiss not installed"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
            f"({thread_counts['torch']} threads), numpy {np.__version__} (OpenBLAS "
            f"{thread_counts['numpy_openblas'] or '?'} threads){faiss_part}"
            f"{'' if faiss is None else ' (' + str(thread_counts['faiss_omp']) + ' threads)'}, "
            f"Python {platform.python_version()}; "
            f"{'thread counts pinned by --threads' if pinned else 'default thread counts, not pinned'}"
            + "".join(f", {name}={value}" for name, value in thread_counts["env"].items()))


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    return {"commit": git("rev-parse", "HEAD"), "gae_dirty": bool(git("status", "--porcelain", "gae"))}


def tables(record: dict[str, Any]) -> str:
    """docs/retrieval.md's retrieval-speed section, rendered from a ``retrieval.json`` record."""
    retrieval, shape = record["retrieval"], record["shape"]
    retrieval_table = markdown(["measurement", "N", "gae ms", "floor ms", "numpy ms", "faiss ms", "gae/floor",
                                "verdict"], retrieval_rows(retrieval))
    add_table = markdown(["capacity", "memories added", "per call", "memories/s", "while filling",
                          "while evicting"], add_rows(record["add"], retrieval["build"]))
    largest = retrieval["sizes"][str(max(int(n) for n in retrieval["sizes"]))]
    peak = largest.get("peak_rise_mib")
    notes = [f"Q={shape['queries']}, D={shape['dim']}, k={shape['k']}, median ms per batch of Q queries; floor = "
             f"torch `queries @ E.T` + `topk` (similarity only), faiss = `IndexFlatIP` (similarity only); gae and "
             f"numpy compute the full score. Target: gae <= {TARGET_RATIO}x floor and faster than numpy."]
    worst = {name: min(r["agreement"][name] for r in retrieval["sizes"].values())
             for name in next(iter(retrieval["sizes"].values()))["agreement"]}
    notes.append("Adds: `'lowest_score'` eviction, every call passing the current query and `now`; the "
                 "`(no eviction)` rows are the bulk adds that filled the retrieval store.")
    notes.append("Answers checked: top-k rows shared, worst over N: " +
                 ", ".join(f"{name.replace('_', ' ')} {value:.1%}" for name, value in worst.items()) + ".")
    if record["faiss"] is None:
        notes.append("faiss is not installed, so its column is empty (`pip install -e '.[bench]'`).")
    if peak is not None:
        def mib(v: float | None) -> str:
            return "n/a" if v is None else f"{v:,.0f} MiB"
        notes.append(f"Peak-RSS rise of one retrieve at N={largest['n']:,}: gae {mib(peak['gae'])}, "
                     f"gae scoped {mib(peak['gae_scoped'])} (chunk block Q x {retrieval['chunk']:,} x 4 B = "
                     f"{peak['bound_block_mib']:.0f} MiB, plus O(N) per-memory vectors); floor {mib(peak['floor'])}; "
                     f"an unchunked Q x N x 3 x 4 B score would take {peak['unchunked_q_n_3_mib']:,.0f} MiB.")
    notes.append(f"{record['machine']}; load average {record['load_average']['start'][0]:.2f} at start.")
    return "\n\n".join([retrieval_table, add_table, *notes])


def update_readme(path: Path, record: dict[str, Any]) -> None:
    """Replace the text between the bench-retrieval markers, if the page has them, and commit
    the record to docs/results/bench-retrieval.json."""
    if publish_section(path, "bench-retrieval", record, tables):
        progress(f"updated the tables in {path} and {record_path(path, 'bench-retrieval')}")
    else:
        progress(f"{path} has no {START} ... {END} markers; the page left alone")


def main(quick: bool = False, repeats: int = 5, repeats_1m: int = 3, add_repeats: int = 2, queries: int = 64,
         dim: int = 384, k: int = 5, threads: int | None = None, out: Path = Path("results/bench/retrieval.json"),
         readme: Path | None = None) -> dict[str, Any]:
    """Time gae's batched retrieval against a matmul+topk floor, numpy and faiss, and its add throughput.

    Args:
        quick: N in {10k, 100k} only, 3 repeats, smaller add runs; for smoke tests, never writes the README.
        repeats: timed repeats per contestant (median) at N = 10k and 100k.
        repeats_1m: timed repeats at N = 1M (each batch there takes about a second; a contestant
            whose warm-up takes over 5 s is timed once).
        add_repeats: timed repeats of the capacity-30 add runs (the 200k-memory run is timed once).
        queries: Q, queries per batch.
        dim: D, the embedding width.
        k: memories per query.
        threads: pin torch, numpy's OpenBLAS and faiss to this many threads. Default: each
            library's own default (the thread counts are recorded either way).
        out: JSON output.
        readme: the page with bench-retrieval markers to refresh (docs/retrieval.md).
    """
    if min(repeats, repeats_1m, add_repeats, queries, dim, k, threads or 1) < 1:
        raise ValueError("repeats, repeats_1m, add_repeats, queries, dim, k and threads must all be >= 1")
    began = time.perf_counter()
    threads_ = threads  # the name `threads` is the CLI's; keep it readable below
    if threads_ is not None:
        set_threads(threads_)
    thread_counts = thread_info()
    load_before = os.getloadavg()
    sizes = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    reps = {n: (3 if quick else repeats if n < 1_000_000 else repeats_1m) for n in sizes}
    retrieval = measure_retrieval(sizes, queries, dim, k, reps)
    if faiss is None:
        progress("faiss is not importable: the faiss column is skipped (pip install -e '.[bench]')")

    add_plan = {  # name: (capacity, total, batch, with_query, repeats)
        "cap30_single": (30, 2_000, 1, True, 1 if quick else add_repeats),
        "cap30_batch100": (30, 2_000, 100, True, 1 if quick else add_repeats),
        "cap100k_batch1000": (10_000, 20_000, 1_000, True, 1) if quick else (100_000, 200_000, 1_000, True, 1),
    }
    adds = {}
    for name, (capacity, total, batch, with_query, n_repeats) in add_plan.items():
        progress(f"add throughput: capacity {capacity:,}, {total:,} memories, {batch:,} per call")
        adds[name] = add_throughput(capacity, total, batch, dim, with_query, n_repeats)
    elapsed = time.perf_counter() - began

    verdict_rows = retrieval_rows(retrieval)
    verdicts = [row[-1] for row in verdict_rows]

    out.parent.mkdir(parents=True, exist_ok=True)
    faiss_config = None if faiss is None else {
        "version": faiss.__version__, "compile_options": faiss.get_compile_options(),
        "distance_compute_blas_threshold": int(faiss.cvar.distance_compute_blas_threshold)}
    record = {"machine": machine(thread_counts, threads_ is not None), "threads": thread_counts,
              "threads_pinned": threads_, "faiss": faiss_config, "git": git_state(),
              "command": " ".join(sys.argv), "quick": quick, "load_average": {"start": load_before,
                                                                             "end": os.getloadavg()},
              "shape": {"queries": queries, "dim": dim, "k": k, "scopes": SCOPES, "allowed": ALLOWED, "now": NOW,
                        "created_at": "uniform over the hour before now", "scorer": "RetrievalScorer.hourly()"},
              "total_seconds": elapsed, "retrieval": retrieval, "add": adds,
              "table": [dict(zip(("measurement", "n", "gae_ms", "floor_ms", "numpy_ms", "faiss_ms", "ratio", "verdict"),
                                 row, strict=True)) for row in verdict_rows]}
    print(tables(as_saved(record)))
    print(f"\n{sum(v == 'pass' for v in verdicts)}/{len(verdicts)} retrieval targets met; total {elapsed:.1f} s")
    out.write_text(json.dumps(record, indent=2))
    progress(f"wrote {out}")
    if readme is not None:
        if quick:
            progress("--quick numbers are for smoke tests only; README left alone")
        else:
            update_readme(readme, record)
    return {"total_seconds": elapsed, "verdicts": verdicts}


if __name__ == "__main__":
    auto_cli(main)
