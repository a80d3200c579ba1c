"""Sensitivity of several prototypes per action: P, spawn threshold and support across streams.

    python scripts/sweep_prototypes.py                      # 10 seeds x 2,000 decisions (~1 min on 2 cores)
    python scripts/sweep_prototypes.py --seeds 2 --n_decisions 400 --out /tmp/sweep.md
    python scripts/sweep_prototypes.py --out docs/results/sweep-prototypes.md --readme docs/prototypes.md

Prints (and writes to ``--out``) a Markdown table of cumulative prequential accuracy, mean
over seeds, for each configuration of the seed rule (``JudgmentConfig.seed()`` with the options
named) in each evaluation setting of ``training.evaluation``, with scoped k-NN as the reference;
``--readme`` also puts it in that page's ``sweep-prototypes`` section (docs/prototypes.md).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import evaluation as E  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.readme import markers, replace_section  # noqa: E402

KNN = "knn_scoped"
# the sweep's k-NN reference, pinned: the scoped k-NN at capacity 400 its committed table measured
# (the head-to-head's knn_scoped is the original's capacity 200, and its knn_best is tuned per setting)
KNN_REFERENCE = E.Contestant("KNNMemory scoped (cap 400)", "knn", {"k": 5, "capacity": 400, "scoped": True})
CONFIGURATIONS: list[Any] = [
    KNN, {}, {"prototypes": 2}, {"prototypes": 4}, {"prototypes": 8},
    *({"prototypes": 4, "spawn_threshold": t} for t in (0.3, 0.4, 0.6, 0.8)),
    *({"prototypes": 4, "spawn_support": s} for s in (1.0, 2.5)),
    {"prototypes": 4, "drift_mode": "adaptive"},
]
SETTINGS = ["multimodal", "none", "classification", "moons", "permute"]
SECTION = "sweep-prototypes"  # docs/prototypes.md's section that shows the table


def accuracy(task: tuple[str, Any, int, int]) -> float:
    setting, options, seed, n_decisions = task
    import torch

    torch.set_num_threads(1)
    contestant = KNN_REFERENCE if options == KNN else E.Contestant("sweep", "judgment", options)
    return float(E.run(contestant, E.make_stream(setting, seed, n_decisions))["correct"].mean())


def label(options: Any) -> str:
    if options == KNN:
        return KNN_REFERENCE.label
    return "JudgmentMemory(" + ", ".join(["config=JudgmentConfig.seed()",
                                          *(f"{key}={value!r}" for key, value in options.items())]) + ")"


def sweep(seeds: int = 10, n_decisions: int = 2000, out: Path | None = None, workers: int | None = None,
          readme: Path | None = None) -> str:
    """Run every configuration in every setting over ``seeds`` stream seeds; return the table.

    Args:
        seeds: stream seeds 0..seeds-1 per (configuration, setting).
        n_decisions: stream length.
        out: also write the table to this file.
        workers: processes (default: the CPU count, at most 8).
        readme: also put the table in this page's ``sweep-prototypes`` section (docs/prototypes.md).
    """
    page = readme.read_text() if readme is not None and readme.is_file() else ""
    if readme is not None and not all(marker in page for marker in markers(SECTION)):  # before the minutes of work
        raise ValueError(f"readme must be a page with {SECTION} markers, got {str(readme)!r}")
    tasks = [(setting, options, seed, n_decisions) for options in CONFIGURATIONS for setting in SETTINGS
             for seed in range(seeds)]
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    with ProcessPoolExecutor(workers) as pool:
        results = list(tqdm(pool.map(accuracy, tasks, chunksize=max(1, seeds)), total=len(tasks),
                            desc="sweep", unit="stream"))
    means = np.array(results).reshape(len(CONFIGURATIONS), len(SETTINGS), seeds).mean(-1)
    lines = ["| configuration | " + " | ".join(SETTINGS) + " |", "|---" + "|---:" * len(SETTINGS) + "|"]
    for options, row in zip(CONFIGURATIONS, means, strict=True):
        lines.append(f"| {label(options)} | " + " | ".join(f"{100 * value:.1f}" for value in row) + " |")
    table = "\n".join(lines)
    print(table)
    if out is not None:
        out.write_text(table + "\n")
    if readme is not None:
        replace_section(readme, *markers(SECTION), table)
    return table


if __name__ == "__main__":
    auto_cli(sweep)
