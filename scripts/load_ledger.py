"""The ledger under load: W processes x T threads deciding and verifying on one ledger, on SQLite and on Postgres.

For every W in ``--grid`` (default 1, 2, 4), with durable decisions and without
(``--durable_decisions``, default both), W processes of T threads (``--threads``, default 2)
share one fresh ledger for ``--seconds`` (``training/load_ledger.py``: each thread decides a
random case and verifies it after a random delay of 0 to ``--delay_ms`` ms, one decision in four
verified by the next process), then the ledger is checked: every acknowledged verification
present exactly once as a learn event, no acknowledged decision lost, each process's final state
equal bit for bit to a serial replay of the ledger, and a fresh reopen equal to it too. The
processes are started once and reused for every cell, with a shared start time per cell.

    python scripts/load_ledger.py --out results/load-ledger              # both stores, a few minutes
    python scripts/load_ledger.py --stores '[sqlite]' --grid '[1,2]' --seconds 1
    python scripts/load_ledger.py --readme docs/ledger.md                # also the section of docs/ledger.md

Writes ``load-ledger.json`` and ``load-ledger.png`` to ``--out``; with ``--readme docs/ledger.md``, the
page's ``load-ledger`` section is rendered from the record, which
is committed to docs/results/load-ledger.json, with the issue's targets marked pass or fail.
Postgres runs on pgserver (pip install pgserver), in a temporary folder; without it, only SQLite
runs and the record says so.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import load_ledger as L  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.readme import as_saved, markers, publish, publish_section  # noqa: E402

NAME = "load-ledger"
STORES = ("sqlite", "sqlite-normal", "postgres")  # sqlite-normal: SQLiteStore(synchronous="NORMAL")
START_DELAY = 1.5  # seconds between handing out a cell's tasks and their shared start (each process opens the ledger)
TARGET_PROCESSES = 4
TARGETS = (  # the issue's, on this machine: (what, store, metric, at most / at least, bound, unit); a "scaling"
    # metric is the verifications/s at TARGET_PROCESSES over those at 1 process, in the same run
    ("SQLite decide p50", "sqlite", "decide_p50_ms", "<=", 1.0, "ms"),
    ("SQLite verifications/s summed over the processes", "sqlite", "verifications_per_s", ">=", 1500.0, "/s"),
    ("SQLite verifications/s at 4 processes over 1 process", "sqlite", "scaling", ">=", 1.0, "x"),
    ("Postgres decide p50", "postgres", "decide_p50_ms", "<=", 2.0, "ms"),
    ("Postgres verifications/s summed over the processes", "postgres", "verifications_per_s", ">=", 1000.0, "/s"),
    ("Postgres verifications/s at 4 processes over 1 process", "postgres", "scaling", ">=", 1.0, "x"),
)


def load_ledger(out: Path = Path("results/load-ledger"), readme: Path | None = None, stores: list[str] | None = None,
                grid: list[int] | None = None, threads: int = 2, seconds: float = 8.0, delay_ms: float = 10.0,
                durable_decisions: list[bool] | None = None) -> dict[str, Any]:
    """Run every (store, durable_decisions, W) cell and write the record, the figure and (with ``readme``) the sections.

    Args:
        out: folder for load-ledger.json and load-ledger.png.
        readme: the page with load-ledger markers to refresh (docs/ledger.md).
        stores: among ``sqlite``, ``sqlite-normal`` (``synchronous="NORMAL"``), ``postgres``. Default: all
            (Postgres only with pgserver installed).
        grid: the numbers of processes. Default: 1, 2, 4.
        threads: threads per process, sharing its Decider.
        seconds: how long each cell runs.
        delay_ms: the longest delay between a decision and its verification (each drawn from 0 to it).
        durable_decisions: the Deciders' ``durable_decisions``, each a cell of its own. Default: True, False.
    """
    grid = [1, 2, 4] if grid is None else grid
    bad = any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in grid)
    if not grid or bad or len(set(grid)) != len(grid):
        raise ValueError(f"grid must be distinct ints >= 1, got {grid!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
        raise ValueError(f"threads must be an int in [1, 64], got {threads!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 600:
        raise ValueError(f"seconds must be in (0, 600], got {seconds!r}")
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, (int, float)) or not 0 <= delay_ms <= 60_000:
        raise ValueError(f"delay_ms must be in [0, 60000], got {delay_ms!r}")
    modes = [True, False] if durable_decisions is None else durable_decisions
    if not modes or any(not isinstance(m, bool) for m in modes) or len(set(modes)) != len(modes):
        raise ValueError(f"durable_decisions must be distinct bools, got {durable_decisions!r}")
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
    cells: list[dict[str, Any]] = []
    most = max(grid)
    plan = [(kind, mode, n) for kind in chosen for mode, n in itertools.product(modes, grid)]
    context = multiprocessing.get_context("spawn")
    inboxes = [context.Queue() for _ in range(most)]
    with tempfile.TemporaryDirectory() as folder, context.Pool(most, L.init, (inboxes,)) as pool:
        for _ in range(20):  # every process started and warm (each took a task), before the first timed cell
            if len(set(pool.map(L.ready, range(4 * most), chunksize=1))) == most:
                break
        server: Any = None
        for number, (kind, mode, processes) in enumerate(plan):
            if kind == "postgres" and server is None:
                import pgserver

                server = pgserver.get_server(Path(folder) / "pgdata", cleanup_mode="stop")
            where = server.get_uri() if kind == "postgres" else str(Path(folder) / f"cell{number}.db")
            table = f"load_{number}"
            print(f"[{number + 1}/{len(plan)}] {kind}, durable_decisions={mode}, {processes} x {threads} ...",
                  file=sys.stderr, flush=True)
            L.prepare(kind, where, table)
            start = time.time() + START_DELAY
            tasks = [(kind, where, table, mode, i, processes, threads, start, seconds, delay_ms, number, folder)
                     for i in range(processes)]
            reports = pool.starmap(L.work, tasks, chunksize=1)
            for inbox in inboxes:  # what was handed over too late for its cell
                _drain(inbox)
            cells.append({"store": kind, "durable_decisions": mode, "processes": processes, "threads": threads,
                          **L.summary(reports, seconds), "checks": L.check(kind, where, table, reports)})
            cell = cells[-1]
            failed = [name for name, ok in cell["checks"].items() if not ok]
            print(f"[{number + 1}/{len(plan)}] {kind}, durable_decisions={mode}, {processes} x {threads}: "
                  f"{cell['verifications_per_s']:.0f} verifications/s, {cell['decisions_per_s']:.0f} decisions/s, "
                  f"decide p50 {cell['decide_p50_ms']:.2f} ms, verify p50 {cell['verify_p50_ms']:.2f} ms, checks "
                  f"{'pass' if not failed else 'FAILED: ' + ', '.join(failed)}"
                  + (f" (a process started {cell['latest_start_s']:.2f} s late)" if cell["latest_start_s"] > 0.1
                     else "")
                  + "".join(f"\n  {e}" for r in reports for e in r["errors"][:3]), file=sys.stderr, flush=True)
        if server is not None:
            server.cleanup()
    record = {"protocol": {"seconds": seconds, "grid": grid, "threads": threads, "delay_ms": delay_ms,
                           "durable_decisions": modes, "queue": L.QUEUE, "handoff": L.HANDOFF,
                           "snapshot_every": L.SNAPSHOT_EVERY,
                           "memory": f"JudgmentMemory, JudgmentConfig.recommended(), {len(L.CATEGORIES)} categories, "
                                     f"{len(L.ACTIONS)} actions, {L.FACTORS} factors",
                           "latency": "wall time of each call in its thread; percentiles over every call of the "
                                      "kind in the cell"},
              "stores": chosen, "notes": notes, "cells": cells, "cpus": os.cpu_count(),
              "seconds": time.perf_counter() - began}
    record["targets"] = targets(as_saved(record))
    publish(record, figure(as_saved(record)), section, out, NAME, readme)
    if readme is not None:  # the same section in docs/ledger.md (its figure is linked there, outside the section)
        publish_section(readme.parent / "docs" / "ledger.md", NAME, record, section)
    return record


def _drain(inbox: Any) -> None:
    while True:
        try:
            inbox.get_nowait()
        except queue.Empty:
            return


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each measured in the cell of its store with durable decisions and
    ``TARGET_PROCESSES`` processes: its value and whether it passes (None when not measured)."""
    found = []

    def cell_of(store: str, processes: int) -> dict[str, Any] | None:
        return next((c for c in record["cells"] if c["store"] == store and c["durable_decisions"] is True
                     and c["processes"] == processes), None)

    for what, store, metric, sense, bound, unit in TARGETS:
        cell = cell_of(store, TARGET_PROCESSES)
        if metric == "scaling":
            one = cell_of(store, 1)
            value = None if cell is None or one is None or not one["verifications_per_s"] else \
                cell["verifications_per_s"] / one["verifications_per_s"]
        else:
            value = None if cell is None else cell[metric]
        passed = None if value is None else (value <= bound if sense == "<=" else value >= bound)
        found.append({"what": what, "store": store, "metric": metric, "sense": sense, "bound": bound, "unit": unit,
                      "value": value, "passed": passed})
    return found


def _amount(value: float, unit: str) -> str:
    return f"{value:.2f} ms" if unit == "ms" else f"{value:.2f}x" if unit == "x" else f"{value:,.0f}/s"


def _targets(record: dict[str, Any]) -> str:
    lines = [f"The issue's targets, at {TARGET_PROCESSES} processes with durable decisions:", ""]
    for t in targets(record):
        measured = "not measured" if t["value"] is None else \
            f"{_amount(t['value'], t['unit'])}, {'pass' if t['passed'] else 'FAIL'}"
        lines.append(f"- {t['what']} {t['sense']} {_amount(t['bound'], t['unit'])}: {measured}")
    return "\n".join(lines)


def _table(record: dict[str, Any]) -> str:
    lines = ["| store | durable decisions | processes | decisions/s | verifications/s | decide p50 / p99 (ms) | "
             "verify p50 / p99 (ms) | verified by another process | calls per process (fewest / most) | checks |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in record["cells"]:
        failed = [name for name, ok in c["checks"].items() if not ok]
        lines.append(f"| {c['store']} | {'yes' if c['durable_decisions'] else 'no'} | {c['processes']} | "
                     f"{c['decisions_per_s']:,.0f} | {c['verifications_per_s']:,.0f} | "
                     f"{c['decide_p50_ms']:.2f} / {c['decide_p99_ms']:.2f} | "
                     f"{c['verify_p50_ms']:.2f} / {c['verify_p99_ms']:.2f} | {c['verified_elsewhere']:,} | "
                     f"{c['fewest_calls']:,} / {c['most_calls']:,} | "
                     f"{'all pass' if not failed else 'FAILED: ' + ', '.join(failed)} |")
    return "\n".join(lines)


def _intro(record: dict[str, Any]) -> str:
    protocol = record["protocol"]
    notes = "".join(f" {note}." for note in record["notes"])
    return (f"W processes x {protocol['threads']} threads on one ledger for {protocol['seconds']:g} s per cell "
            f"({protocol['memory']}, a snapshot every {protocol['snapshot_every']} verifications; each thread "
            f"decides a random case and verifies it after 0 to {protocol['delay_ms']:g} ms, keeping at most "
            f"{protocol['queue']} waiting, and hands one decision in {protocol['handoff']} to the next process to "
            f"verify), on {record['cpus']} CPUs; then the ledger is checked (no call failed, every acknowledged "
            "verification learned exactly once, no acknowledged decision lost, gap-free sequence numbers, each "
            "process's final state equal bit for bit to a serial replay of the ledger, and a fresh reopen equal "
            "to it with the same pending decisions). Calls per process: the fewest and the most decides and "
            "verifies one process of the cell made (how evenly the store's write lock went round). sqlite is "
            "SQLiteStore's default, synchronous=FULL: each commit is flushed to the disk, and survives a power cut; "
            "sqlite-normal is synchronous=NORMAL: a commit survives a killed process (SIGKILL loses no acknowledged "
            "call), while a power cut may take the last ones." + notes +
            f" {record['seconds']:.0f} s in all; regenerate with "
            "`python scripts/load_ledger.py --readme docs/ledger.md`.")


def section(record: dict[str, Any]) -> str:
    """The section of docs/ledger.md, rendered from a record (the figure, docs/figures/load-ledger.png,
    is linked by the page outside the section)."""
    return f"{_intro(record)}\n\n{_table(record)}\n\n{_targets(record)}"


def figure(record: dict[str, Any]) -> Any:
    """Verifications per second, and the p50 / p99 latency of decide and of verify, against the
    number of processes, one line per store and ``durable_decisions``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4), layout="constrained")
    throughput, decide, verify = fig.subplots(1, 3)
    colours = iter(f"C{i}" for i in range(10))
    for store in record["stores"]:
        for mode in record["protocol"]["durable_decisions"]:
            cells = [c for c in record["cells"] if c["store"] == store and c["durable_decisions"] == mode]
            if not cells:
                continue
            x, colour = [c["processes"] for c in cells], next(colours)
            label = f"{store}, durable decisions {'on' if mode else 'off'}"
            throughput.plot(x, [c["verifications_per_s"] for c in cells], marker="o", color=colour, label=label)
            throughput.plot(x, [c["decisions_per_s"] for c in cells], marker=".", color=colour, linestyle=":")
            for axes, kind in ((decide, "decide"), (verify, "verify")):
                axes.plot(x, [c[f"{kind}_p50_ms"] for c in cells], marker="o", color=colour, label=f"{label}, p50")
                axes.plot(x, [c[f"{kind}_p99_ms"] for c in cells], marker="x", color=colour, linestyle="--",
                          label=f"{label}, p99")
    throughput.set_ylabel("per second (solid: verifications, dotted: decisions)")
    throughput.set_title("throughput, summed over processes", fontsize=9)
    for axes, kind in ((decide, "decide"), (verify, "verify")):
        axes.set_yscale("log")
        axes.set_ylabel(f"{kind} latency (ms)")
        axes.set_title(f"{kind}: p50 (solid) and p99 (dashed)", fontsize=9)
    for axes in (throughput, decide, verify):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("processes")
    throughput.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    auto_cli(load_ledger)
