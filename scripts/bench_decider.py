"""What serving a memory costs: a Decider's ``decide`` + ``verify`` against the model's own
``score_one`` + ``learn_one``, one decision at a time, in one run.

An agent holds one case: through a :class:`gae.Decider` it calls ``decide`` (the answer, every
action's probability, act or refer and why, the decision kept pending under an id) and later
``verify`` (the memory learns it, act or refer learns from it). A model used alone calls
``score_one`` then ``learn_one``. This script times both on the same stream, decision by
decision in turn (who goes first alternates, so both meet the same machine load), each pair on
fresh memories per repeat; per repeat the ratio of the p50s, reported as the median over
repeats. The target (issue 42): ``decide`` + ``verify`` in RAM at most 2x ``score_one`` +
``learn_one`` for the seed rule and for ``JudgmentConfig.recommended()``.

Also timed, for reference and without a target here: the same Decider with ``target_error``
(the calibrated threshold, gae-mcp's default) and on a SQLite ledger (every call committed,
``synchronous=NORMAL``; docs/ledger.md has the load test with several writers).

    python scripts/bench_decider.py [--decisions N] [--repeats R] [--readme docs/architecture.md]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # sized when torch and numba are imported: first

import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import Decider, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory  # noqa: E402
from scripts.bench_single import ACTIONS, CAPACITY, CATEGORIES, K, decisions  # noqa: E402
from training import cli  # noqa: E402
from training.readme import publish_section  # noqa: E402

TARGET = 2.0  # decide + verify in RAM at most this many times score_one + learn_one
TARGETED = ("seed rule", "recommended")  # the memories the target is about
MODELS: dict[str, Callable[[], Any]] = {
    "seed rule": lambda: JudgmentMemory(CATEGORIES, ACTIONS, K, JudgmentConfig.seed()),
    "recommended": lambda: JudgmentMemory(CATEGORIES, ACTIONS, K, JudgmentConfig.recommended()),
    "k-NN": lambda: KNNMemory(factors=K, actions=ACTIONS, k=5, capacity=CAPACITY),
    "retrieval": lambda: RetrievalMemory(factors=K, actions=ACTIONS, k=5, capacity=CAPACITY),
}
SERVINGS = ("in RAM", "in RAM, target_error=0.02", "SQLite ledger")


def serve(model: Callable[[], Any], serving: str, folder: str, i: int) -> Decider:
    if serving == "in RAM":
        return Decider(model())
    if serving == "in RAM, target_error=0.02":
        return Decider(model(), target_error=0.02)
    from gae.storage import SQLiteStore

    return Decider(model(), store=SQLiteStore(os.path.join(folder, f"ledger-{i}.db"), synchronous="NORMAL"))


def time_pair(memory: Any, decider: Decider, stream: list) -> tuple[np.ndarray, np.ndarray]:
    """Nanoseconds of each decision's ``score_one`` + ``learn_one`` on ``memory`` and of its
    ``decide`` + ``verify`` on ``decider``, in turn, who goes first alternating."""
    ns = (np.empty(len(stream)), np.empty(len(stream)))
    clock = time.perf_counter_ns
    for i, (row, category, action) in enumerate(stream):
        for who in ((0, 1) if i % 2 else (1, 0)):
            start = clock()
            if who == 0:
                memory.score_one(row, category)
                memory.learn_one(row, action, category)
            else:
                decider.verify(decider.decide(row, category).id, action)
            ns[who][i] = clock() - start
    return ns


def measure(n: int, repeats: int, ledger_decisions: int, progress: Callable[[str], None] = print) -> dict:
    """Per model and serving: the p50 (us) of the model's score + learn and of the Decider's decide +
    verify, per repeat, and the median ratio."""
    stream = decisions(n)
    record: dict[str, Any] = {"n": n, "ledger_n": ledger_decisions, "repeats": repeats, "target": TARGET,
                              "targeted": list(TARGETED), "cells": {}}
    with tempfile.TemporaryDirectory() as folder:
        made = 0
        for name, model in MODELS.items():
            for serving in SERVINGS:
                length = ledger_decisions if serving == "SQLite ledger" else n
                progress(f"{name}, {serving}: {length:,} decisions x {repeats} repeats")
                made += 1
                time_pair(model(), serve(model, serving, folder, made), stream[:200])  # compile and warm, untimed
                model_p50, decider_p50, ratios = [], [], []
                for _ in range(repeats):
                    made += 1
                    alone, served = (np.percentile(ns[length // 10:], 50) / 1e3 for ns in
                                     time_pair(model(), serve(model, serving, folder, made), stream[:length]))
                    model_p50.append(float(alone))
                    decider_p50.append(float(served))
                    ratios.append(float(served / alone))
                record["cells"][f"{name} | {serving}"] = {
                    "model": name, "serving": serving, "model_p50_us": model_p50, "decider_p50_us": decider_p50,
                    "ratios": ratios, "ratio": statistics.median(ratios)}
    return record


def section(record: dict) -> str:
    """The Markdown table of a :func:`measure` record (what ``--readme`` writes)."""
    lines = [f"`decide` + `verify` through a `Decider` against the model's `score_one` + `learn_one`, one decision "
             f"at a time in turn ({record['n']:,} decisions; {record['ledger_n']:,} on the ledger), p50 per repeat, "
             f"median of {record['repeats']} repeats, 4 categories x 4 actions x 8 factors. Target: at most "
             f"{record['target']:g}x in RAM for the seed rule and `recommended()`.", "",
             "| model | served | `score_one` + `learn_one` | `decide` + `verify` | ratio | target |",
             "|---|---|---:|---:|---:|---|"]
    for cell in record["cells"].values():
        targeted = cell["model"] in record["targeted"] and cell["serving"] == "in RAM"
        verdict = ("met" if cell["ratio"] <= record["target"] else "not met") if targeted else "—"
        lines.append(f"| {cell['model']} | {cell['serving']} | {statistics.median(cell['model_p50_us']):.1f} us | "
                     f"{statistics.median(cell['decider_p50_us']):.1f} us | {cell['ratio']:.2f}x | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=cli.int_at_least(100), default=5000, help="decisions per repeat")
    parser.add_argument("--ledger-decisions", type=cli.int_at_least(100), default=1000,
                        help="decisions per repeat on the SQLite ledger (each call commits)")
    parser.add_argument("--repeats", type=cli.int_at_least(1), default=5, help="timed repeats (median)")
    parser.add_argument("--readme", type=Path, default=None, help="the page with bench-decider markers to update")
    args = parser.parse_args()
    record = measure(args.decisions, args.repeats, args.ledger_decisions)
    print(section(record))
    if args.readme is not None and not publish_section(args.readme, "bench-decider", record, section):
        parser.error(f"--readme {args.readme}: no bench-decider markers")


if __name__ == "__main__":
    main()
