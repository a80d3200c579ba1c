"""Soak: a million decisions through every memory, watching resident memory, state sizes and NaNs.

Each memory learns the same stream online, in its own process (so its peak RSS is its own). The
stream is drawn ``--chunk`` decisions at a time, never held whole; each chunk is a fresh world
with a drift at its middle. Every ``--sample_every`` decisions: the RSS, the bytes of every
parameter and buffer and of every log (the decision log against its documented ``53 + 8 K``
bytes a decision plus ``4 C K`` a call); after every batch: NaN and Inf in the state.
docs/soak.md says what is measured and what it found.

    python scripts/soak.py                                  # 1,000,000 decisions, every memory (~4 minutes)
    python scripts/soak.py --doc docs/soak.md               # and refresh the table in docs/soak.md
    python scripts/soak.py --n_decisions 20000 --memories '[jm,knn]' --out /tmp/soak

Writes ``soak.json`` and ``soak.png`` to ``--out`` (default ``results/soak/``) and prints the
table; with ``--doc``, the table goes between ``<!-- soak:start -->`` and ``<!-- soak:end -->``,
the figure to figures/soak.png next to the doc and the record to docs/results/soak.json.
RetrievalMemory costs ~1 ms a decision, so it learns ``--retrieval_decisions`` (20,000);
``episodic`` is the million-decision run of its store, fed in batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import io
import multiprocessing
import re
import resource
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import EpisodicMemory, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory  # noqa: E402
from gae.judgment.decision_log import EVENT_BYTES_FIXED, EVENT_BYTES_PER_FACTOR  # noqa: E402
from training.batch import DecisionBatch  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.evaluation import STREAM, learn_batch  # noqa: E402
from training.readme import markers, publish, with_figure  # noqa: E402
from training.streams import DecisionStream  # noqa: E402

START, END = markers("soak")
C, A, K = STREAM["categories"], STREAM["actions"], STREAM["factors"]
CHUNK_OPTIONS = {key: value for key, value in STREAM.items() if key not in ("n_decisions", "drift_at")} | {
    "drift_kind": "permute", "outliers": 0.02}
WARM_UP = 0.1  # growth is measured from the first sample at or after this fraction of the stream
MB = 2 ** 20
MEMORIES: dict[str, dict[str, Any]] = {  # label, kind and constructor options of every memory
    "jm": {"label": "JudgmentMemory, seed rule", "kind": "judgment", "options": {}},
    "jm_attention": {"label": "JudgmentMemory, attention learned", "kind": "judgment", "options": {},
                     "learn_attention": True},
    "jm_adaptive": {"label": "JudgmentMemory, adaptive", "kind": "judgment", "options": {"drift_mode": "adaptive"}},
    "jm_prototypes": {"label": "JudgmentMemory, prototypes=4", "kind": "judgment", "options": {"prototypes": 4}},
    "jm_bounded": {"label": "JudgmentMemory, max_log_events=100,000", "kind": "judgment",
                   "options": {"max_log_events": 100_000}},
    "jm_batch50": {"label": "JudgmentMemory, calls of 50", "kind": "judgment", "options": {}, "batch": 50},
    "river": {"label": "gae.river.JudgmentClassifier() (defaults), predict_one + learn_one", "kind": "river",
              "options": {}},
    "knn": {"label": "KNNMemory (k=5, capacity 400)", "kind": "knn", "options": {"k": 5, "capacity": 400}},
    "episodic": {"label": "EpisodicMemory (capacity 10,000, D=8)", "kind": "episodic",
                 "options": {"capacity": 10_000}},
    "retrieval": {"label": "RetrievalMemory (capacity 400, scoped)", "kind": "retrieval",
                  "options": {"k": 5, "capacity": 400, "scoped": True}},
}
EPISODIC_CENTER = 0.5  # subtracted from the factors to make the embedding, as RetrievalMemory does
ALWAYS_VALID = ("valid_from", "valid_until")  # EpisodicMemory's default validity window is (-inf, inf)
LOG_KEYS = ("log_bytes", "log_decisions", "log_calls", "log_formula", "event_log_bytes", "gate_events",
            "gate_log_bytes", "log_base_bytes", "audit_bytes")
HELD_KEYS = ("log_bytes", "event_log_bytes", "log_base_bytes", "audit_bytes")  # bytes the logs hold


def decision_chunks(n_decisions: int, chunk: int, seed: int) -> Iterator[DecisionBatch]:
    """The soak stream, drawn ``chunk`` decisions at a time (seed ``seed * 10**6 + i`` for chunk i),
    with global timestamps and ids."""
    for index, start in enumerate(range(0, n_decisions, chunk)):
        size = min(chunk, n_decisions - start)
        yield DecisionStream(size, drift_at=size // 2 if size > 1 else None, seed=seed * 10 ** 6 + index,
                             start_time=float(start), id_offset=start, **CHUNK_OPTIONS).tensors()


def build(name: str) -> Any:
    spec = MEMORIES[name]
    if spec["kind"] == "river":
        from gae.river import JudgmentClassifier

        return JudgmentClassifier(**spec["options"])
    if spec["kind"] == "judgment":
        return JudgmentMemory(C, A, K, JudgmentConfig.seed(), **spec["options"])
    if spec["kind"] == "episodic":
        return EpisodicMemory(K, **spec["options"])
    cls = KNNMemory if spec["kind"] == "knn" else RetrievalMemory
    return cls(factors=K, actions=A, categories=C, **spec["options"])


def feed_episodic(memory: EpisodicMemory, batch: DecisionBatch) -> None:
    """RetrievalMemory's step, a batch at a time: each decision retrieves its top 5 within its
    category, then the batch's verified decisions are stored (with their ids as provenance)."""
    x = batch.x - EPISODIC_CENTER
    if len(memory):
        for category in range(C):
            mine = batch.category == category
            if bool(mine.any()):
                memory.retrieve(x[mine], now=float(batch.timestamp[0]), k=5, scopes=[category])
    keep = ~batch.skip
    if bool(keep.any()):
        memory.add(x[keep], 1.0, created_at=batch.timestamp[keep], scope=batch.category[keep].tolist(),
                   source_ids=[(i,) for i in batch.id[keep].tolist()], query=x[-1], now=float(batch.timestamp[-1]))


def feed_river(classifier: Any, batch: DecisionBatch) -> None:
    """What a river user writes: per decision a dict of named features, ``predict_one``, then
    ``learn_one`` of the verified label (uncertain outcomes are not learned, as elsewhere here)."""
    names = [f"factor {k}" for k in range(K)]
    for row, action, skip in zip(batch.x.tolist(), batch.action.tolist(), batch.skip.tolist(), strict=True):
        x = dict(zip(names, row, strict=True))
        classifier.predict_one(x)
        if not skip:
            classifier.learn_one(x, f"action {action}")


def state_dict_bytes(memory: Any) -> int:
    """Bytes of ``torch.save(memory.state_dict())``: what a checkpoint of it costs."""
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    return buffer.tell()


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def release_free_memory() -> None:
    """Hand the C allocator's free pages back to the OS (glibc's ``malloc_trim``; elsewhere nothing),
    so that the RSS sampled next is memory in use, not memory the allocator keeps for later."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resident_bytes() -> tuple[int, int]:
    """(current, peak) resident set size of this process: VmRSS and VmHWM from /proc on Linux,
    else the peak from getrusage for both."""
    try:
        status = Path("/proc/self/status").read_text()
        current, peak = (int(re.search(rf"{key}:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
                         for key in ("VmRSS", "VmHWM"))
        return current, peak
    except (OSError, AttributeError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return peak, peak


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples (NamedTuple logs included)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_in(value)


def held_bytes(obj: Any) -> int:
    """Bytes of the storages behind every tensor in ``obj``, each storage counted once."""
    storages = {}
    for tensor in tensors_in(obj):
        storage = tensor.untyped_storage()
        storages[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
    return sum(storages.values())


def audit_bytes(log: list) -> int:
    """Python bytes of an EpisodicMemory's audit log (records, id tuples, ints, times, reasons),
    counted whole at every sample: the log keeps its newest records, so old ones leave it."""
    return sum(sys.getsizeof(record) + sys.getsizeof(record.ids) + sum(map(sys.getsizeof, record.ids))
               + sys.getsizeof(record.time) + sys.getsizeof(record.version)
               + (sys.getsizeof(record.reason) if record.reason else 0)  # '' and the actions are shared
               for record in log)


def log_figures(memory: Any) -> dict[str, int]:
    """What the memory's logs hold now: the decision log's tensors and its formula, the gate,
    promotion and recycle logs (``event_log_bytes``; the gate log's share and events apart), the decision log's
    base (the buffers and those event logs as they were at its first decision) and an
    EpisodicMemory's audit log. The event logs are read from their chunk lists: the public
    ``gate_log`` joins them in place, which would change what is measured."""
    figures = dict.fromkeys(LOG_KEYS, 0)
    if isinstance(memory, JudgmentMemory):
        log = memory.decision_log
        figures.update(log_bytes=held_bytes(log.chunks), log_decisions=len(log), log_calls=len(log.chunks),
                       log_formula=(EVENT_BYTES_FIXED + EVENT_BYTES_PER_FACTOR * K) * len(log)
                       + 4 * C * K * len(log.chunks),
                       event_log_bytes=held_bytes(list(memory.history.chunks.values())),
                       gate_events=sum(int(chunk.step.shape[0]) for chunk in memory.history.chunks["gate"]),
                       gate_log_bytes=held_bytes(memory.history.chunks["gate"]),
                       log_base_bytes=held_bytes([log.base]))
    store = memory.store if isinstance(memory, RetrievalMemory) else memory
    if isinstance(store, EpisodicMemory):
        figures["audit_bytes"] = audit_bytes(store.audit_log)
    return figures


def nonfinite(memory: Any) -> list[str]:
    """Names of the floating-point parameters and buffers (and the decision log's newest entries)
    holding NaN or Inf (NaN only for the validity windows, whose open ends are infinite)."""
    named = [*memory.named_parameters(), *memory.named_buffers()]
    if isinstance(memory, JudgmentMemory) and memory.decision_log.chunks:
        newest = memory.decision_log.chunks[-1]
        named += [(f"decision_log.{key}", newest[key]) for key in ("eta", "displacement", "x", "before", "logits")]
    bad = []
    for name, tensor in named:
        if tensor.is_floating_point():
            ok = ~tensor.isnan() if name.rsplit(".", 1)[-1] in ALWAYS_VALID else tensor.isfinite()
            if not bool(ok.all()):
                bad.append(name)
    return bad


def soak_memory(task: tuple[str, int, int, int, int, int, bool]) -> dict[str, Any]:
    """Stream ``n_decisions`` through one memory; returns its samples and checks."""
    name, n_decisions, batch, chunk, sample_every, seed, progress = task
    torch.set_num_threads(1)
    spec = MEMORIES[name]
    batch = spec.get("batch", batch)
    built = build(name)
    river = spec["kind"] == "river"
    memory = built.memory if river else built  # a river classifier builds its memory on its first sample
    optimizer = torch.optim.Adam([memory.criterion_logits], lr=0.05) if spec.get("learn_attention") else None
    samples: dict[str, list] = {key: [] for key in ("decisions", "rss", "rss_trimmed", "state_tensor_bytes",
                                                    "state_dict_bytes", *LOG_KEYS)}
    first_bad: dict[str, Any] | None = None
    bad_batches = 0

    def sample(done: int) -> None:
        samples["decisions"].append(done)
        samples["rss"].append(resident_bytes()[0])
        release_free_memory()
        samples["rss_trimmed"].append(resident_bytes()[0])
        samples["state_tensor_bytes"].append({} if memory is None else {
            key: t.numel() * t.element_size() for key, t in [*memory.named_parameters(), *memory.named_buffers()]})
        samples["state_dict_bytes"].append(state_dict_bytes(memory) if river and memory is not None else 0)
        for key, value in (dict.fromkeys(LOG_KEYS, 0) if memory is None else log_figures(memory)).items():
            samples[key].append(value)

    began, learning = time.perf_counter(), 0.0
    sample(0)
    done, next_sample = 0, sample_every
    tqdm.set_lock(threading.RLock())  # tqdm's default lock leaves a semaphore behind in a pool worker
    bar = tqdm(total=n_decisions, desc=name, unit="dec", unit_scale=True, mininterval=1.0, disable=not progress)
    for data in decision_chunks(n_decisions, chunk, seed):
        for start in range(0, data.x.shape[0], batch):
            part = DecisionBatch(*(column[start:start + batch] for column in data))
            step_began = time.perf_counter()
            if river:
                feed_river(built, part)
                memory = built.memory
            elif isinstance(memory, EpisodicMemory):
                feed_episodic(memory, part)
            else:
                learn_batch(memory, part.x, part.category, part.action, part.skip, optimizer)
            learning += time.perf_counter() - step_began
            done += part.x.shape[0]
            bad = nonfinite(memory)
            if bad:
                bad_batches += 1
                first_bad = first_bad or {"decisions": done, "tensors": bad}
            if done >= next_sample or done == n_decisions:
                sample(done)
                next_sample += sample_every
            bar.update(part.x.shape[0])
    bar.close()
    return {"name": name, "label": spec["label"], "decisions": done, "batch": batch,
            "seconds": time.perf_counter() - began, "learn_us_per_decision": learning * 1e6 / max(done, 1),
            "rss_peak": max(resident_bytes()[1], *samples["rss"]),  # VmHWM can lag VmRSS by a few pages
            "nonfinite": {"batches": bad_batches, "first": first_bad}, "samples": samples}


def summarise(result: dict[str, Any], tolerance_mb: float) -> dict[str, Any]:
    """Growth after warm-up (RSS after ``malloc_trim``), what the state and the logs explain of it,
    and the decision log against its documented cost."""
    s = result["samples"]
    n = np.array(s["decisions"])
    warm = int(np.searchsorted(n, WARM_UP * n[-1]))
    state = [sum(sizes.values()) for sizes in s["state_tensor_bytes"]]
    held = sum(np.array(s[key], dtype=np.float64) for key in HELD_KEYS) + np.array(state)
    rss = np.array(s["rss_trimmed"], dtype=np.float64)
    rss_growth, held_growth = rss[-1] - rss[warm], float(held[-1] - held[warm])
    unexplained = rss_growth - held_growth
    calls = max((n[-1] - n[warm]) / result["batch"], 1.0)
    slope = float(np.polyfit(n[warm:], rss[warm:], 1)[0]) if len(n) - warm > 2 else float("nan")
    log = None
    if s["log_formula"][-1]:
        ratios = [b / f for b, f in zip(s["log_bytes"], s["log_formula"], strict=True) if f]
        logged = s["log_decisions"][-1]
        log = {"bytes": s["log_bytes"][-1], "formula": s["log_formula"][-1], "decisions": logged,
               "calls": s["log_calls"][-1], "ratio": s["log_bytes"][-1] / s["log_formula"][-1],
               "ratio_range": [min(ratios), max(ratios)], "bytes_per_decision": s["log_bytes"][-1] / logged,
               "formula_per_decision": s["log_formula"][-1] / logged,
               "gate_events": s["gate_events"][-1], "gate_log_bytes_per_event":
                   s["gate_log_bytes"][-1] / s["gate_events"][-1] if s["gate_events"][-1] else None}
    state_constant = len(set(state[warm:])) == 1
    saved = s["state_dict_bytes"]
    checkpoint = None if not saved[-1] else {  # the river classifier's: its state_dict, after warm-up
        "bytes_warm": saved[warm], "bytes_end": saved[-1], "growth": saved[-1] / saved[warm] - 1,
        "rss_growth": float(rss[-1] / rss[warm] - 1)}
    return {"state_dict": checkpoint, "rss_start": rss[0], "rss_warm": rss[warm], "rss_end": rss[-1],
            "rss_peak": result["rss_peak"],
            "warm_decisions": int(n[warm]), "rss_growth": rss_growth, "held_growth": held_growth,
            "unexplained_growth": unexplained, "unexplained_per_call": unexplained / calls,
            "rss_slope_per_decision": slope, "flat": bool(unexplained <= tolerance_mb * MB and state_constant),
            "log": log, "state_bytes": state[-1], "state_constant_after_warm_up": state_constant,
            **{key: s[key][-1] for key in HELD_KEYS}, "finite": result["nonfinite"]["batches"] == 0}


def soak(n_decisions: int = 1_000_000, memories: list[str] | None = None, batch: int = 1000, chunk: int = 50_000,
         sample_every: int = 10_000, seed: int = 0, retrieval_decisions: int = 20_000, workers: int = 1,
         tolerance_mb: float = 16.0, out: Path = Path("results/soak"), doc: Path | None = None) -> dict[str, Any]:
    """Soak every memory on one stream; write soak.json and soak.png, print the table.

    Args:
        n_decisions: decisions per memory (RetrievalMemory: at most ``retrieval_decisions``).
        memories: among the keys of ``MEMORIES``. Default: all.
        batch: decisions per learning call (``jm_batch50`` uses 50).
        chunk: decisions drawn at once; each chunk is a fresh world with a drift at its middle.
        sample_every: decisions between samples of RSS, state and log sizes (a shorter run samples
            at least 100 times).
        seed: stream seed (every memory sees the same stream).
        retrieval_decisions: the most decisions RetrievalMemory learns (it costs ~1 ms each).
        workers: processes at once, a fresh one per memory; 0 runs them all in this process
            (RSS is then shared, so only for tests).
        tolerance_mb: the most RSS growth after warm-up, beyond what the state and logs hold, still called flat.
        out: folder for soak.json and soak.png.
        doc: a Markdown file with soak markers to refresh (the figure goes to figures/ next to it).
    """
    names = memories or list(MEMORIES)
    unknown = [m for m in names if m not in MEMORIES]
    if unknown or min(n_decisions, batch, chunk, sample_every, retrieval_decisions) < 1 or workers < 0:
        raise ValueError(f"bad arguments: unknown memories {unknown}, n_decisions={n_decisions}, batch={batch}, "
                         f"chunk={chunk}, sample_every={sample_every}, retrieval_decisions={retrieval_decisions} "
                         f"(all >= 1), workers={workers} (>= 0)")
    began = time.perf_counter()
    tasks = []
    for name in names:
        n = min(n_decisions, retrieval_decisions) if MEMORIES[name]["kind"] == "retrieval" else n_decisions
        tasks.append((name, n, batch, chunk, min(sample_every, max(n // 100, 1)), seed, workers <= 1))
    if workers == 0:
        results = [soak_memory(task) for task in tasks]
    else:  # a fresh process per memory: its RSS and peak are its own
        with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
            results = list(tqdm(pool.imap(soak_memory, tasks), total=len(tasks), desc="soak", unit="memory",
                                disable=workers <= 1))
    record = {"n_decisions": n_decisions, "batch": batch, "chunk": chunk, "sample_every": sample_every, "seed": seed,
              "retrieval_decisions": retrieval_decisions, "stream": CHUNK_OPTIONS, "workers": workers,
              "tolerance_mb": tolerance_mb, "warm_up": WARM_UP,
              "formula": {"bytes_per_decision": EVENT_BYTES_FIXED + EVENT_BYTES_PER_FACTOR * K,
                          "bytes_per_call": 4 * C * K},
              "memories": {r["name"]: {**r, "summary": summarise(r, tolerance_mb)} for r in results}}
    record["seconds"] = time.perf_counter() - began
    publish(record, figure(record), section, out, "soak", doc, figures="figures")
    return record


def table(record: dict[str, Any]) -> str:
    options = "" if record["n_decisions"] == 1_000_000 else f" --n_decisions {record['n_decisions']}"
    options += "" if record["batch"] == 1000 else f" --batch {record['batch']}"
    options += "" if record["seed"] == 0 else f" --seed {record['seed']}"
    columns = ["memory", "decisions", "learning (us a decision)", "peak RSS (MB)", f"RSS at {WARM_UP:.0%} (MB)",
               "RSS growth (MB)", "state + logs (MB)", "other (MB)", "flat",
               "decision log, bytes a decision: held / documented", "NaN or Inf"]
    lines = [f"`python scripts/soak.py{options}`: {record['seconds']:.0f} s in all on this machine, one process "
             "per memory, one after the other ('learning' leaves out the sampling). Growth runs from "
             f"{WARM_UP:.0%} of the stream to its end (RSS after `malloc_trim`); 'state + logs' is how much more "
             "the state tensors and the logs hold over the same span; 'other' is the rest of the growth, and "
             f"'flat' means it stays under {record['tolerance_mb']:g} MB with state tensors of a constant size.", "",
             "| " + " | ".join(columns) + " |", "|---|" + "---:|" * 7 + "---|" * 3]
    for entry in record["memories"].values():
        s = entry["summary"]
        log = s["log"]
        held = "—" if log is None else (f"{log['bytes_per_decision']:.1f} / {log['formula_per_decision']:.1f} "
                                        f"({log['decisions']:,} kept)")
        lines.append(f"| {entry['label']} | {entry['decisions']:,} | {entry['learn_us_per_decision']:.1f} | "
                     f"{s['rss_peak'] / MB:.0f} | {s['rss_warm'] / MB:.0f} | {s['rss_growth'] / MB:+.1f} | "
                     f"{s['held_growth'] / MB:+.1f} | {s['unexplained_growth'] / MB:+.1f} | "
                     f"{'yes' if s['flat'] else 'no'} | {held} | "
                     f"{'none' if s['finite'] else entry['nonfinite']['first']} |")
    for entry in record["memories"].values():
        saved = entry["summary"].get("state_dict")
        if saved is not None:
            lines += ["", f"{entry['label']}: its `state_dict` is {saved['bytes_warm'] / MB:.2f} MB at "
                      f"{entry['summary']['warm_decisions']:,} decisions and {saved['bytes_end'] / MB:.2f} MB at "
                      f"{entry['decisions']:,} ({saved['growth']:+.1%}); its RSS after `malloc_trim` grows by "
                      f"{saved['rss_growth']:+.1%} over the same span."]
    return "\n".join(lines)


def section(record: dict[str, Any]) -> str:
    """docs/soak.md's results section, rendered from a ``soak.json`` record."""
    return with_figure(table(record), "soak", "figures")


def figure(record: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for i, entry in enumerate(record["memories"].values()):
        s = entry["samples"]
        n = np.array(s["decisions"])
        held = sum(np.array(s[key], dtype=np.float64) for key in HELD_KEYS)
        axes[0].plot(n, np.array(s["rss_trimmed"]) / MB, color=f"C{i}", label=entry["label"])
        axes[1].plot(n, held / MB, color=f"C{i}", label=entry["label"])
        if entry["summary"]["log"] is not None:
            axes[1].plot(n, np.array(s["log_formula"]) / MB, ":", color=f"C{i}")
    axes[0].set_title("resident set size after malloc_trim (MB), one process per memory", fontsize=9)
    axes[1].set_title("bytes the logs hold (MB); dotted: the decision log's documented cost", fontsize=9)
    for ax in axes:
        ax.set_xlabel("decisions")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    auto_cli(soak)
