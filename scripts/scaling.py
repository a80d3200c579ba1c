"""Memory scaling, measured: held-out accuracy, calibration, state size and scoring latency against n.

For each setting and stream seed, one stream of ``max(grid) + 2,000`` decisions is drawn. Every
memory learns the first decisions online (prequential, in batches of 50, uncertain outcomes
skipped) and, each time it has learned n of them (n in the grid), is scored without learning on
the last 2,000 (the held-out decisions: same prototypes, fresh draws). Per memory and n:
held-out accuracy and expected calibration error (mean and 95% bootstrap CI over seeds), the
bytes of its parameters and buffers, and its median scoring latency per decision (batched
``forward``, this machine, same run).

    python scripts/scaling.py                          # 10 seeds, n up to 30,000 (a few minutes on 2 cores)
    python scripts/scaling.py --grid '[10,100,1000]' --seeds 2 --out /tmp/scaling

Writes ``scaling.png`` (three panels against log n) and ``scaling.json`` (keys ``grid``,
``memories``, ``settings``, ``results``) to ``--out`` (default ``results/scaling/``); with
``--readme docs/memory_scaling.md``, the summary table goes between ``<!-- scaling:start -->`` and
``<!-- scaling:end -->``, the figure to docs/figures/ and the record to docs/results/scaling.json.

RetrievalMemory costs about 1 ms a decision to learn, so it learns at most ``--retrieval_max``
(3,000) decisions; larger n are not reported for it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.evaluation import STREAM, learn_batch, state_bytes  # noqa: E402
from training.metrics_functional import calibration_error, correctness  # noqa: E402
from training.parallel import run_all  # noqa: E402
from training.readme import markers, publish, with_figure  # noqa: E402
from training.stats import bootstrap_ci  # noqa: E402
from training.streams import DecisionStream  # noqa: E402

START, END = markers("scaling")
HELD_OUT = 2000
LATENCY_PROBE = 256  # held-out decisions timed for the latency (an unbounded k-NN scores slowly)
BATCH = 50
GRID = [10, 30, 100, 300, 1000, 3000, 10000, 30000]
MEMORIES: dict[str, dict[str, Any]] = {  # label and constructor of every memory
    "jm": {"label": "JudgmentMemory (seed rule)", "kind": "judgment", "options": {}},
    "jm_adaptive": {"label": "JudgmentMemory, adaptive", "kind": "judgment", "options": {"drift_mode": "adaptive"}},
    "jm_prototypes": {"label": "JudgmentMemory, prototypes=4", "kind": "judgment", "options": {"prototypes": 4}},
    "jm_attention": {"label": "JudgmentMemory, attention learned", "kind": "judgment", "options": {},
                     "learn_attention": True},
    "knn": {"label": "KNNMemory, capacity 400", "kind": "knn", "options": {"capacity": 400}},
    "knn_unbounded": {"label": "KNNMemory, capacity 100,000", "kind": "knn", "options": {"capacity": 100_000}},
    "retrieval": {"label": "RetrievalMemory, capacity 400", "kind": "retrieval", "options": {"capacity": 400}},
}
SETTINGS = {"unimodal": {}, "multimodal": {"modes": 3}}


def build(name: str, stream: DecisionStream) -> Any:
    spec = MEMORIES[name]
    names = stream.category_names, stream.action_names, stream.factor_names
    if spec["kind"] == "judgment":
        # the seed rule and its options (the recommended configuration is the constructor's default); no audit trail
        return JudgmentMemory(*names, JudgmentConfig.seed(), max_log_events=BATCH, **spec["options"])
    cls = KNNMemory if spec["kind"] == "knn" else RetrievalMemory
    return cls(factors=names[2], actions=names[1], categories=names[0], k=5, scoped=True, **spec["options"])


def held_out(memory: Any, x: torch.Tensor, category: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """Accuracy and calibration error on the held-out set, and the median scoring latency (us per
    decision, batched, 3 repeats over its first ``LATENCY_PROBE`` decisions)."""
    with torch.no_grad():
        out = memory(x, category)
        probe = x[:LATENCY_PROBE], category[:LATENCY_PROBE]
        times = []
        for _ in range(3):
            began = time.perf_counter()
            memory(*probe)
            times.append((time.perf_counter() - began) * 1e6 / len(probe[0]))
    correct = correctness(out.action, truth)
    return {"accuracy": float(correct.float().mean()),
            "ece": float(calibration_error(out.confidence.double(), correct)),
            "latency_us": float(np.median(times)), "bytes": float(state_bytes(memory))}


def run(task: tuple[str, str, int, list[int], int]) -> dict[int, dict[str, float]]:
    """One memory on one stream: the held-out figures at every n of the grid it reaches."""
    name, setting, seed, grid, retrieval_max = task
    torch.set_num_threads(1)
    n_train = max(grid)
    spec = {**STREAM, "drift_at": None, **SETTINGS[setting], "n_decisions": n_train + HELD_OUT, "seed": seed}
    stream = DecisionStream(**spec)
    data = stream.tensors()
    test = slice(n_train, n_train + HELD_OUT)
    memory = build(name, stream)
    optimizer = torch.optim.Adam([memory.criterion_logits], lr=0.05) \
        if MEMORIES[name].get("learn_attention") else None
    limit = min(n_train, retrieval_max) if MEMORIES[name]["kind"] == "retrieval" else n_train
    figures: dict[int, dict[str, float]] = {}
    learned = 0
    for n in sorted(grid):
        if n > limit:
            break
        while learned < n:
            stop = min(learned + BATCH, n)
            part = slice(learned, stop)
            learn_batch(memory, data.x[part], data.category[part], data.action[part], data.skip[part], optimizer)
            learned = stop
        figures[n] = held_out(memory, data.x[test], data.category[test], data.truth[test])
    return figures


def scaling(grid: list[int] | None = None, seeds: int = 10, memories: list[str] | None = None,
            settings: list[str] | None = None, out: Path = Path("results/scaling"), resamples: int = 500,
            retrieval_max: int = 3000, workers: int | None = None, readme: Path | None = None) -> dict[str, Any]:
    """Measure every memory at every n of the grid over ``seeds`` streams per setting.

    Args:
        grid: numbers of learned decisions. Default: 10, 30, ..., 30,000.
        seeds: stream seeds per setting (0..seeds-1).
        memories: among the keys of ``MEMORIES``. Default: all.
        settings: ``unimodal`` (the default stream, no drift) and ``multimodal`` (3 modes per action).
        out: folder for scaling.png and scaling.json.
        resamples: bootstrap resamples over seeds.
        retrieval_max: the most decisions RetrievalMemory learns (it costs ~1 ms each).
        workers: processes (default: the CPU count, at most 8).
        readme: the page with scaling markers to refresh, docs/memory_scaling.md (the figure goes to
            docs/figures/).
    """
    grid = sorted(grid or GRID)
    names = memories or list(MEMORIES)
    chosen = settings or list(SETTINGS)
    unknown = [m for m in names if m not in MEMORIES] + [s for s in chosen if s not in SETTINGS]
    if unknown or seeds < 1 or not grid or grid[0] < 1:
        raise ValueError(f"bad arguments: unknown names {unknown}, seeds={seeds} (>= 1), grid={grid} (n >= 1)")
    began = time.perf_counter()
    tasks = [(name, setting, seed, grid, retrieval_max) for setting in chosen for name in names
             for seed in range(seeds)]
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    outputs = run_all(run, [(task,) for task in tasks], max(1, workers), "scaling")
    results: dict[str, dict[str, dict[str, Any]]] = {s: {m: {} for m in names} for s in chosen}
    by_run = {(task[0], task[1], task[2]): figures for task, figures in zip(tasks, outputs, strict=True)}
    for setting in chosen:
        for name in names:
            for n in grid:
                runs = [by_run[(name, setting, seed)][n] for seed in range(seeds) if n in by_run[(name, setting, seed)]]
                if not runs:
                    continue
                entry = {}
                for key in ("accuracy", "ece"):
                    ci = bootstrap_ci(np.array([r[key] for r in runs]), resamples=resamples)
                    entry[key] = {"mean": float(ci.mean), "low": float(ci.low), "high": float(ci.high)}
                entry["bytes"] = float(np.median([r["bytes"] for r in runs]))
                entry["latency_us"] = float(np.median([r["latency_us"] for r in runs]))
                results[setting][name][str(n)] = entry
    record = {"grid": grid, "memories": {name: MEMORIES[name]["label"] for name in names}, "settings": {
        s: {**STREAM, "drift_at": None, **SETTINGS[s], "held_out": HELD_OUT} for s in chosen}, "results": results,
        "seeds": seeds, "seconds": time.perf_counter() - began, "retrieval_max": retrieval_max}
    publish(record, figure(record), section, out, "scaling", readme)
    return record


def plateau(points: dict[str, Any], margin: float = 0.01) -> int | None:
    """The smallest n whose accuracy is within ``margin`` of the best accuracy at any n."""
    if not points:
        return None
    best = max(entry["accuracy"]["mean"] for entry in points.values())
    return min(int(n) for n, entry in points.items() if entry["accuracy"]["mean"] >= best - margin)


def summary(record: dict[str, Any]) -> str:
    grid = record["grid"]
    lines = [f"Held-out accuracy (%) after learning n decisions, mean over {record['seeds']} seeds "
             f"({HELD_OUT:,} held-out decisions each); 'plateau' is the smallest n within 1 pp of the best, "
             "'bytes' and 'latency' at the largest n:", ""]
    for setting, memories in record["results"].items():
        lines += [f"**{setting}**", "",
                  "| memory | " + " | ".join(f"{n:,}" for n in grid) + " | plateau | bytes | latency (us) |",
                  "|---" + "|---:" * (len(grid) + 3) + "|"]
        for name, points in memories.items():
            cells = [f"{100 * points[str(n)]['accuracy']['mean']:.1f}" if str(n) in points else "—" for n in grid]
            last = points[str(max(int(n) for n in points))] if points else None
            level = plateau(points)
            size = "—" if last is None else f"{last['bytes']:,.0f}"
            latency = "—" if last is None else f"{last['latency_us']:.2f}"
            lines.append(f"| {record['memories'][name]} | " + " | ".join(cells) +
                         f" | {'—' if level is None else f'{level:,}'} | {size} | {latency} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def section(record: dict[str, Any]) -> str:
    """docs/memory_scaling.md's section, rendered from a ``scaling.json`` record."""
    return with_figure(summary(record), "scaling", "figures")


def figure(record: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    styles = {"unimodal": "-", "multimodal": "--"}
    colours = {name: f"C{i}" for i, name in enumerate(record["memories"])}
    for setting, memories in record["results"].items():
        for name, points in memories.items():
            if not points:
                continue
            n = np.array([int(k) for k in points])
            accuracy = np.array([[points[k]["accuracy"][f] for f in ("mean", "low", "high")] for k in points])
            label = f"{record['memories'][name]} ({setting})"
            axes[0].plot(n, 100 * accuracy[:, 0], styles.get(setting, "-"), color=colours[name], label=label,
                         marker="o", markersize=3)
            axes[0].fill_between(n, 100 * accuracy[:, 1], 100 * accuracy[:, 2], color=colours[name], alpha=0.12)
            if setting == next(iter(record["results"])):  # size and latency do not depend on the setting much
                axes[1].plot(n, [points[k]["bytes"] for k in points], color=colours[name], marker="o", markersize=3,
                             label=record["memories"][name])
                axes[2].plot(n, [points[k]["latency_us"] for k in points], color=colours[name], marker="o",
                             markersize=3, label=record["memories"][name])
    titles = ("held-out accuracy (%), mean and 95% CI (solid: uni-modal, dashed: multi-modal)",
              "state: parameters and buffers (bytes)", "scoring latency per decision (us, batched)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("decisions learned (n)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=6, loc="lower right")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    auto_cli(scaling)
