"""Rerun the choice of ``JudgmentConfig.recommended()``: its constants and their neighbours on the tuning streams.

Each candidate (the recommended configuration, then each constant moved to its neighbours one at a
time, each judge left out, the judges all left out, ``training/lvq_tuning.py``) runs on river's
tuning streams (generator seeds 0-2, the real data sets shuffled with seed 0) through river's
harness and on gae's settings (seeds 0-4) through ``prequential_``; none of them is a stream or
seed the benchmark or the head-to-head reports. The table shows the mean accuracy on each family
and the accuracy 100-200 decisions after a change, so a rerun shows what each constant buys.

    python scripts/tune_lvq.py --out results/tune-lvq                # about 15 minutes on 2 CPUs
    python scripts/tune_lvq.py --readme docs/lvq.md                  # also the section in docs/lvq.md

Writes ``tune-lvq.json`` and ``tune-lvq.png`` to ``--out``; with ``--readme``, the section between
``<!-- tune-lvq:start -->`` and ``<!-- tune-lvq:end -->`` is rendered from the record, which is
committed to docs/results/tune-lvq.json.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import lvq_tuning as T  # noqa: E402
from training.cli import auto_cli  # noqa: E402
from training.parallel import run_all  # noqa: E402
from training.readme import as_saved, markers, publish, with_figure  # noqa: E402

NAME = "tune-lvq"


def tune_lvq(out: Path = Path("results/tune-lvq"), readme: Path | None = None, candidates: list[str] | None = None,
             workers: int | None = None) -> dict[str, Any]:
    """Run the candidates on the tuning streams and write the record, the figure and (with ``readme``) the section.

    Args:
        out: folder for tune-lvq.json and tune-lvq.png.
        readme: a page of docs/ with tune-lvq markers to refresh (docs/lvq.md; the figure goes to docs/figures/).
        candidates: among ``training.lvq_tuning.neighbourhood()``'s names. Default: all.
        workers: processes (default: the CPU count); 1 runs in this process.
    """
    every = T.neighbourhood()
    names = list(every) if candidates is None else candidates
    unknown = [name for name in names if name not in every]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"candidates must be distinct names among {list(every)}, got {names!r} (unknown: {unknown})")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if readme is not None and markers(NAME)[0] not in (readme.read_text() if readme.exists() else ""):
        raise ValueError(f"readme {readme} has no {NAME} section (its markers {markers(NAME)})")
    from gae import JudgmentConfig

    began = time.perf_counter()
    streams = T.streams()
    tasks = [(name, stream) for name in names for stream in streams]
    outputs = run_all(T.run, [(every[name], *stream) for name, stream in tasks], workers, "tuning")
    results: dict[str, dict[tuple[str, str, int], dict[str, float]]] = {name: {} for name in names}
    for (name, stream), figures in zip(tasks, outputs, strict=True):
        results[name][stream] = figures
    record = {"protocol": {"river_seeds": list(T.RIVER_SEEDS), "gae_seeds": list(T.GAE_SEEDS),
                           "n_river": T.N_RIVER, "n_gae": T.N_GAE, "gae_settings": list(T.GAE_SETTINGS),
                           "recovery": list(T.RECOVERY),
                           "accuracy": "river: progressive_val_score accuracy, no scaler in front; gae: against "
                                       "the ground truth, as the head-to-head scores"},
              "chosen": JudgmentConfig.recommended().to_dict(),
              "candidates": {name: every[name] for name in names}, "results": T.summarize(results),
              "workers": workers, "seconds": time.perf_counter() - began}
    publish(record, figure(as_saved(record)), section, out, NAME, readme, figures="figures")  # a page in docs/
    return record


def section(record: dict[str, Any]) -> str:
    """The docs section, rendered from a record."""
    protocol, results = record["protocol"], record["results"]
    lines = ["| candidate | river's tuning streams (%) | gae's settings (%) | 100-200 decisions after a change (%) |",
             "|---|---:|---:|---:|"]
    for name, row in results.items():
        label = "**chosen**" if name == "chosen" else f"`{name}`"
        lines.append(f"| {label} | {row['river']:.1f} | {row['gae']:.1f} | {row['recovery']:.1f} |")
    text = (f"Mean accuracy of each candidate on the tuning streams (river's generators on seeds "
            f"{protocol['river_seeds'][0]}-{protocol['river_seeds'][-1]} and the real data sets shuffled with seed "
            f"{protocol['river_seeds'][0]}, {protocol['n_river']:,} samples; gae's {len(protocol['gae_settings'])} "
            f"settings on seeds {protocol['gae_seeds'][0]}-{protocol['gae_seeds'][-1]}, {protocol['n_gae']:,} "
            f"decisions), and the accuracy {protocol['recovery'][0]}-{protocol['recovery'][1]} decisions after the "
            "middle of the settings that permute or shift there. Each neighbour moves one constant of the chosen "
            "configuration (`<judge>.<option>`: one judge's), leaves one judge out, or all of them (`judges=none`). "
            f"{record['seconds']:.0f} s in {record['workers']} processes; regenerate with "
            "`python scripts/tune_lvq.py --readme docs/lvq.md`.\n\n" + "\n".join(lines))
    return with_figure(text, NAME, "figures")


def figure(record: dict[str, Any]) -> Any:
    """Each candidate's three means as horizontal bars, the chosen one first."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    results = record["results"]
    names = list(results)
    fig = Figure(figsize=(11, 0.3 * len(names) + 1.5), layout="constrained")
    for i, (key, title) in enumerate((("river", "river's tuning streams"), ("gae", "gae's settings"),
                                      ("recovery", "after a change"))):
        axes = fig.add_subplot(1, 3, i + 1)
        values = [results[name][key] for name in names]
        axes.barh(range(len(names)), values, color=["tab:red" if n == "chosen" else "tab:blue" for n in names])
        axes.axvline(results["chosen"][key] if "chosen" in results else values[0], color="black", lw=0.8)
        axes.set_yticks(range(len(names)), names if i == 0 else [""] * len(names))
        axes.invert_yaxis()
        axes.set_xlim(min(values) - 2, max(values) + 1)
        axes.set_title(f"{title} (%)")
    return fig


if __name__ == "__main__":
    auto_cli(tune_lvq)
