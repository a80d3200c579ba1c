"""The store under load: W writer and R reader processes sharing one store, on SQLite and on a real Postgres.

For every W and R in ``--grid`` (default 1, 2, 4, 8), W writer and R reader processes share a fresh
store for ``--seconds`` (``training/load_store.py``: writers add and delete in their own scopes,
readers retrieve within one writer's scope), then the store is reopened and checked: every
acknowledged add present exactly once, nothing deleted retrievable, one audit record per
acknowledged mutation, gap-free versions, no reader given a row outside its scope. The processes
are started once and reused for every cell of the grid, with a shared start time per cell.

    python scripts/load_store.py --out results/load-store               # both stores, a few minutes
    python scripts/load_store.py --stores '[sqlite]' --grid '[1,2]' --seconds 1
    python scripts/load_store.py --readme docs/store.md                 # also the section of docs/store.md

Writes ``load-store.json`` and ``load-store.png`` to ``--out``; with ``--readme docs/store.md``, the
page's ``load-store`` section is rendered from the record, which is
committed to docs/results/load-store.json. Postgres runs on pgserver (pip install pgserver), in a
temporary folder; without it, only SQLite runs and the record says so.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import load_store as L  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.readme import as_saved, markers, publish, publish_section  # noqa: E402

NAME = "load-store"
STORES = ("sqlite", "postgres")
START_DELAY = 1.0  # seconds between handing out a cell's tasks and their shared start (the processes are warm)


def load_store(out: Path = Path("results/load-store"), readme: Path | None = None, stores: list[str] | None = None,
               grid: list[int] | None = None, seconds: float = 3.0) -> dict[str, Any]:
    """Run every (store, W, R) cell and write the record, the figure and (with ``readme``) the sections.

    Args:
        out: folder for load-store.json and load-store.png.
        readme: the page with load-store markers to refresh (docs/store.md).
        stores: among ``sqlite``, ``postgres``. Default: both (Postgres only with pgserver installed).
        grid: the numbers of writers and of readers. Default: 1, 2, 4, 8.
        seconds: how long each cell runs.
    """
    grid = [1, 2, 4, 8] if grid is None else grid
    bad = any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in grid)
    if not grid or bad or len(set(grid)) != len(grid):
        raise ValueError(f"grid must be distinct ints >= 1, got {grid!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 600:
        raise ValueError(f"seconds must be in (0, 600], got {seconds!r}")
    chosen = list(STORES) if stores is None else stores
    unknown = [s for s in chosen if s not in STORES]
    if unknown or not chosen or len(set(chosen)) != len(chosen):
        raise ValueError(f"stores must be distinct names among {list(STORES)}, got {chosen!r}")
    if readme is not None and markers(NAME)[0] not in (readme.read_text() if readme.exists() else ""):
        raise ValueError(f"readme {readme} has no {NAME} section (its markers {markers(NAME)})")
    notes = []
    if "postgres" in chosen:
        try:
            import pgserver  # noqa: F401
        except ImportError:
            if stores is not None:
                raise
            chosen.remove("postgres")
            notes.append("Postgres left out: pgserver is not installed")
    began = time.perf_counter()
    cells = []
    most = max(grid) * 2
    with tempfile.TemporaryDirectory() as folder, multiprocessing.get_context("spawn").Pool(most) as pool:
        for _ in range(20):  # every process started and warm (each took a task), before the first timed cell
            if len(set(pool.map(L.ready, range(4 * most), chunksize=1))) == most:
                break
        server = None
        for kind in chosen:
            if kind == "postgres":
                import pgserver

                server = pgserver.get_server(Path(folder) / "pgdata", cleanup_mode="stop")
            for n, (writers, readers) in enumerate(itertools.product(grid, grid)):
                where = str(Path(folder) / f"cell{n}.db") if kind == "sqlite" else server.get_uri()
                table = f"load_{n}"
                first = L.prepare(kind, where, table)
                start = time.time() + START_DELAY
                tasks = [(kind, where, table, "writer", i, start, seconds) for i in range(writers)] + \
                        [(kind, where, table, "reader", j, start, seconds) for j in range(readers)]
                reports = [first, *pool.starmap(L.work, tasks)]
                cells.append({"store": kind, "writers": writers, "readers": readers, **L.summary(reports, seconds),
                              "checks": L.check(kind, where, table, reports)})
                print(f"{kind} W={writers} R={readers}: {cells[-1]['writes_per_s']:.0f} writes/s, "
                      f"{cells[-1]['retrieves_per_s']:.0f} retrieves/s, checks "
                      f"{'pass' if all(cells[-1]['checks'].values()) else cells[-1]['checks']}", flush=True)
        if server is not None:
            server.cleanup()
    record = {"protocol": {"seconds": seconds, "grid": grid, "dim": L.DIM, "read_scope": L.READ_SCOPE,
                           "writer": "one add per call (1 memory, its own scope), a delete of one of its own every "
                                     "tenth call",
                           "reader": f"retrieve k=5 of a random query, scopes=[{L.READ_SCOPE!r}]",
                           "latency": "wall time of each call in its process; percentiles over every call of the "
                                      "role in the cell"},
              "stores": chosen, "notes": notes, "cells": cells, "cpus": os.cpu_count(),
              "seconds": time.perf_counter() - began}
    publish(record, figure(as_saved(record)), section, out, NAME, readme)
    if readme is not None:  # the same section in docs/store.md (its figure is linked there, outside the section)
        publish_section(readme.parent / "docs" / "store.md", NAME, record, section)
    return record


def _table(record: dict[str, Any]) -> str:
    lines = ["| store | writers | readers | adds/s | writes/s (adds, deletes) | retrieves/s | write p50 / p99 (ms) | "
             "retrieve p50 / p99 (ms) | checks |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in record["cells"]:
        failed = [name for name, ok in c["checks"].items() if not ok]
        lines.append(f"| {c['store']} | {c['writers']} | {c['readers']} | {c['adds_per_s']:,.0f} | "
                     f"{c['writes_per_s']:,.0f} | "
                     f"{c['retrieves_per_s']:,.0f} | {c['write_p50_ms']:.2f} / {c['write_p99_ms']:.2f} | "
                     f"{c['retrieve_p50_ms']:.2f} / {c['retrieve_p99_ms']:.2f} | "
                     f"{'all pass' if not failed else 'FAILED: ' + ', '.join(failed)} |")
    return "\n".join(lines)


def _intro(record: dict[str, Any]) -> str:
    protocol = record["protocol"]
    notes = "".join(f" {note}." for note in record["notes"])
    return (f"W writer and R reader processes on one store for {protocol['seconds']:g} s per cell ("
            f"{protocol['writer']}; readers: {protocol['reader']}), on {record['cpus']} CPUs; then the store is "
            "reopened and checked (every acknowledged add present once, nothing deleted retrievable, one audit "
            "record per acknowledged mutation, gap-free versions, readers inside their scope)." + notes +
            f" {record['seconds']:.0f} s in all; regenerate with "
            "`python scripts/load_store.py --readme docs/store.md`.")


def section(record: dict[str, Any]) -> str:
    """The section of docs/store.md, rendered from a record (the figure, docs/figures/load-store.png,
    is linked by the page outside the section)."""
    return f"{_intro(record)}\n\n{_table(record)}"


def figure(record: dict[str, Any]) -> Any:
    """Write calls (adds and deletes) per second against the number of writers, one line per store
    and number of readers."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), layout="constrained")
    axes = fig.add_subplot()
    for store in record["stores"]:
        for readers in record["protocol"]["grid"]:
            cells = [c for c in record["cells"] if c["store"] == store and c["readers"] == readers]
            axes.plot([c["writers"] for c in cells], [c["writes_per_s"] for c in cells], marker="o",
                      linestyle="-" if store == "sqlite" else "--", label=f"{store}, {readers} readers")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("writer processes")
    axes.set_ylabel("acknowledged writes per second")
    axes.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    auto_cli(load_store)
