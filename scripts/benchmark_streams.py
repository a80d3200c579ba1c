"""The public benchmark: gae's presets against river's classifiers under river's prequential harness.

Every model runs on every stream of the suite (``training/river_suite.py``): river's bundled real
data (Phishing, Bananas, ImageSegments), river's generators (RandomRBF with and without moving
centroids, Sine with an abrupt and a gradual function switch, STAGGER with a concept switch, Mixed,
RandomTree; one run per seed) and three of gae's own settings. Each run is
``evaluate.progressive_val_score`` (test, then train, one sample at a time) on up to 5,000 samples;
per model and stream: accuracy, wall time per decision and state bytes at the end, then the mean
over the suite and the targets ``jm_recommended`` is judged against. The protocol and the reason for
every choice are in ``docs/benchmarks.md``.

    python scripts/benchmark_streams.py --out results/benchmark-streams      # the suite (minutes on 2 CPUs)
    python scripts/benchmark_streams.py --quick true                         # 500 samples, one seed
    python scripts/benchmark_streams.py --n_samples 300 --streams '[phishing,stagger]' --models '[jm_seed,gnb]'
    python scripts/benchmark_streams.py --readme docs/benchmarks.md          # also the page's section

Writes ``benchmark-streams.json`` (the record) and ``benchmark-streams.png`` to ``--out`` and
prints the tables; with ``--readme``, the section between ``<!-- benchmark-streams:start -->`` and
``<!-- benchmark-streams:end -->`` is rendered from the record, which is committed to
docs/results/benchmark-streams.json, the figure is copied to docs/figures/, and the README's
headline is rendered again (``training/headline.py``).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training.cli import argument_check, auto_cli  # noqa: E402
from training.headline import publish_headline  # noqa: E402
from training.parallel import run_all  # noqa: E402
from training.readme import as_saved, markers, publish, with_figure  # noqa: E402

NAME = "benchmark-streams"  # the section, its record and its figure
SUBJECT = "jm_recommended"  # the model the targets judge
KNN_REFERENCE = "knn_400"
QUICK_SAMPLES = 500
MEASURES = ("accuracy", "us_per_decision", "state_bytes", "log_bytes")


def benchmark_streams(out: Path = Path("results/benchmark-streams"), readme: Path | None = None,
                      n_samples: int | None = None, streams: list[str] | None = None,
                      models: list[str] | None = None, seeds: list[int] | None = None, workers: int | None = None,
                      quick: bool = False) -> dict[str, Any]:
    """Run every model on every stream and write the record, the figure and (with ``readme``) the section.

    Args:
        out: folder for benchmark-streams.json and benchmark-streams.png.
        readme: the page with benchmark-streams markers to refresh, docs/benchmarks.md (the figure goes
            to docs/figures/, and the README's headline is rendered again from the new record).
        n_samples: samples per stream, a shorter real data set whole. Default: 5,000 (``--quick``: 500).
        streams: among ``training.river_suite.STREAMS``. Default: all.
        models: among ``training.river_suite.MODELS``. Default: all.
        seeds: generator seeds (a real data set runs once, with the first). Default: ``river_suite.SEEDS``
            (``--quick``: its first).
        workers: processes (default: the CPU count); 1 runs in this process.
        quick: a short run: 500 samples and one seed, unless given.
    """
    from training import river_suite as suite  # river is optional: rendering a record needs none of it

    streams = list(suite.STREAMS) if streams is None else streams
    models = list(suite.MODELS) if models is None else models
    seeds = list(suite.SEEDS[:1] if quick else suite.SEEDS) if seeds is None else seeds
    n = (QUICK_SAMPLES if quick else suite.N_SAMPLES) if n_samples is None else n_samples
    _check(streams, list(suite.STREAMS), "streams")
    _check(models, list(suite.MODELS), "models")
    if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ValueError(f"seeds must be distinct ints >= 0, at least one, got {seeds!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n_samples must be an int >= 1, got {n!r}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if readme is not None and markers(NAME)[0] not in (readme.read_text() if readme.exists() else ""):
        raise ValueError(f"readme {readme} has no {NAME} section (its markers {markers(NAME)})")
    began = time.perf_counter()
    tasks = [(model, stream, seed, n) for stream in streams for seed in suite.seeds_of(stream, seeds)
             for model in models]
    outputs = dict(zip(tasks, run_all(suite.run, tasks, workers, "benchmark"), strict=True))
    runs = [{"model": task[0], "stream": task[1], "seed": task[2], **outputs[task]._asdict()} for task in tasks]
    results = {stream: {model: _mean_of([r for r in runs if r["stream"] == stream and r["model"] == model])
                        for model in models} for stream in streams}
    means = {model: {key: float(np.mean([results[s][model][key] for s in streams])) for key in MEASURES}
             for model in models}
    record = {
        "protocol": {
            "harness": "river.evaluate.progressive_val_score(samples, model, metrics.Accuracy()): each sample "
                       "scored, then learned, one at a time",
            "n_samples": n, "seeds": seeds, "warm_up": suite.WARM_UP, "knn_windows": list(suite.KNN_WINDOWS),
            "drift_seed_offset": suite.DRIFT_SEED_OFFSET, "abrupt_width": suite.ABRUPT_WIDTH,
            "gradual_width": suite.GRADUAL_WIDTH,
            "scaler": "preprocessing.MinMaxScaler() in front of the gae and k-NN models, not the trees or NB",
            "time": "wall time of the whole harness call over the stream / its samples (scaler included), "
                    "after an untimed warm-up run on the first samples; mean over seeds, then over streams",
            "state": "gae: bytes of the memory's parameters and buffers; river: model._raw_memory_usage "
                     "(the scaler not counted)",
            "log": "gae only: bytes of the tensors of the memory's audit logs (its extra state), not in state",
            "mean": "per stream, the mean over its seeds; per model, the mean over the streams",
            "subject": SUBJECT, "knn_reference": KNN_REFERENCE},
        "streams": {s: {"kind": suite.STREAMS[s].kind, "description": suite.STREAMS[s].description,
                        "seeds": suite.seeds_of(s, seeds),
                        "n": next(r["n"] for r in runs if r["stream"] == s)} for s in streams},
        "models": {m: {"family": suite.MODELS[m].family, "description": suite.MODELS[m].description,
                       "scaled": suite.MODELS[m].scaled} for m in models},
        "runs": runs, "results": results, "means": means,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"river {_version('river')}, torch {_version('torch')}",
        "workers": workers, "seconds": time.perf_counter() - began}
    record["verdicts"] = verdicts(record["results"], record["means"])
    publish(record, figure(as_saved(record)), section, out, NAME, readme)
    if readme is not None:
        publish_headline(readme)
    saved = as_saved(record)
    for key, title in (("us_per_decision", "Time per decision (us), per stream"), ("state_bytes", "State, per stream")):
        print(f"\n{title}:\n\n{per_stream_table(saved, key)}")
    return record


@argument_check
def _check(given: list[str], known: list[str], argument: str) -> None:
    unknown = [name for name in given if name not in known]
    if unknown or not given or len(set(given)) != len(given):
        raise ValueError(f"{argument} must be distinct names among {known}, at least one; got {given!r} "
                         f"(unknown: {unknown})")


def _mean_of(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: float(np.mean([run[key] for run in runs])) for key in MEASURES}


def _version(module: str) -> str:
    from importlib.metadata import version

    return version(module)


def verdicts(results: dict[str, dict[str, dict[str, float]]], means: dict[str, dict[str, float]],
             subject: str = SUBJECT) -> list[dict[str, Any]]:
    """The targets ``subject`` is judged against: each a dict with the ``target``, the subject's
    ``value``, the ``bar`` it must reach, their ``unit`` (``'%'``, ``'pp'`` or ``'x'``), whether it is
    ``met`` (None: a model it needs did not run) and a ``note`` (the stream that decided it)."""
    windows = sorted((m for m in means if m.startswith("knn_")), key=lambda m: int(m.split("_")[1]))
    streams = list(results)

    def verdict(target: str, unit: str, needs: list[str], judge: Any) -> dict[str, Any]:
        if subject not in means or not all(m in means for m in needs) or not needs:
            return {"target": target, "value": None, "bar": None, "unit": unit, "met": None,
                    "note": "a model it needs did not run"}
        value, bar, met, note = judge()
        return {"target": target, "value": value, "bar": bar, "unit": unit, "met": bool(met), "note": note}

    def best_knn() -> tuple[float, float, bool, str]:
        bar = float(np.mean([max(results[s][w]["accuracy"] for w in windows) for s in streams]))
        mean = means[subject]["accuracy"]
        return mean, bar, mean >= bar, f"windows {', '.join(w[4:] for w in windows)}"

    def arf() -> tuple[float, float, bool, str]:
        mean, bar = means[subject]["accuracy"], means["arf"]["accuracy"]
        return mean, bar, mean >= bar, ""

    def worst_gap() -> tuple[float, float, bool, str]:
        gaps = {s: results[s][subject]["accuracy"] - results[s][KNN_REFERENCE]["accuracy"] for s in streams}
        worst = min(gaps, key=gaps.__getitem__)
        return gaps[worst], -5.0, gaps[worst] >= -5.0, f"worst: {worst}"

    def state() -> tuple[float, float, bool, str]:
        ratios = {s: results[s][subject]["state_bytes"] / results[s][KNN_REFERENCE]["state_bytes"] for s in streams}
        worst = max(ratios, key=ratios.__getitem__)
        return ratios[worst], 0.1, ratios[worst] <= 0.1, f"worst: {worst}"

    def speed() -> tuple[float, float, bool, str]:
        ratio = means[subject]["us_per_decision"] / means[KNN_REFERENCE]["us_per_decision"]
        return ratio, 1 / 3, ratio <= 1 / 3, ""

    return [
        verdict("mean accuracy >= the best k-NN window per stream (mean over streams of the best window)", "%",
                windows if len(windows) == 3 else [], best_knn),
        verdict("mean accuracy >= ARF's", "%", ["arf"], arf),
        verdict("on every stream, accuracy >= k-NN (window 400)'s - 5 pp (the smallest difference)", "pp",
                [KNN_REFERENCE], worst_gap),
        verdict("on every stream, state <= 10% of k-NN (window 400)'s (the largest ratio)", "x", [KNN_REFERENCE],
                state),
        verdict("time per decision <= 1/3 of k-NN (window 400)'s (ratio of the suite means)", "x", [KNN_REFERENCE],
                speed),
    ]


def _bytes(value: float) -> str:
    return f"{value / 1024:,.1f} KiB" if value >= 1024 else f"{value:,.0f} B"


def accuracy_table(record: dict[str, Any]) -> str:
    """Streams x models: accuracy (%), the best of each stream in bold, and the suite mean."""
    models = list(record["models"])
    lines = ["| stream | " + " | ".join(f"`{m}`" for m in models) + " |", "|---" + "|---:" * len(models) + "|"]
    rows = [(stream, [record["results"][stream][m]["accuracy"] for m in models]) for stream in record["results"]]
    rows.append(("**mean**", [record["means"][m]["accuracy"] for m in models]))
    for stream, values in rows:
        best = max(values)
        cells = [f"**{v:.1f}**" if v == best else f"{v:.1f}" for v in values]
        lines.append(f"| {stream} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def means_table(record: dict[str, Any]) -> str:
    """Per model: its description and the suite means of accuracy, time per decision and state."""
    lines = ["| model | what | accuracy (%) | time per decision | state | audit log |", "|---|---|---:|---:|---:|---:|"]
    for model, spec in record["models"].items():
        mean = record["means"][model]
        log = _bytes(mean["log_bytes"]) if spec["family"] == "gae" else "—"
        lines.append(f"| `{model}` | {spec['description']} | {mean['accuracy']:.1f} | "
                     f"{mean['us_per_decision']:.1f} us | {_bytes(mean['state_bytes'])} | {log} |")
    return "\n".join(lines)


def per_stream_table(record: dict[str, Any], key: str) -> str:
    """Streams x models: time per decision (us) or state, as printed after the run."""
    models = list(record["models"])
    show = (lambda v: f"{v:.1f}") if key == "us_per_decision" else _bytes
    lines = ["| stream | " + " | ".join(f"`{m}`" for m in models) + " |", "|---" + "|---:" * len(models) + "|"]
    lines += [f"| {stream} | " + " | ".join(show(record["results"][stream][m][key]) for m in models) + " |"
              for stream in record["results"]]
    return "\n".join(lines)


def verdict_table(record: dict[str, Any]) -> str:
    """The targets of ``jm_recommended`` with their verdicts."""
    subject = record["protocol"]["subject"]
    lines = [f"| target for `{subject}` | value | bar | verdict |", "|---|---:|---:|---|"]
    formats = {"%": "{:.1f}%", "pp": "{:+.1f} pp", "x": "{:.3g}x"}
    for row in record["verdicts"]:
        value, bar = ("—" if v is None else formats[row["unit"]].format(v) for v in (row["value"], row["bar"]))
        if row["met"] is None:
            verdict = f"not judged: {row['note']}"
        else:
            verdict = ("met" if row["met"] else "**not met**") + (f" ({row['note']})" if row["note"] else "")
        lines.append(f"| {row['target']} | {value} | {bar} | {verdict} |")
    return "\n".join(lines)


def section(record: dict[str, Any]) -> str:
    """docs/benchmarks.md's results section, rendered from a ``benchmark-streams.json`` record."""
    protocol = record["protocol"]
    intro = (f"Accuracy (%) under `progressive_val_score`, {protocol['n_samples']:,} samples per stream (a shorter "
             f"data set whole), each generator and gae setting the mean over seeds "
             f"{', '.join(map(str, protocol['seeds']))}; the best of each stream in bold:")
    return with_figure("\n\n".join([
        intro, accuracy_table(record), "Means over the suite (time: the harness's wall time per decision, "
        "scaler included; state: gae's parameters and buffers, river's `_raw_memory_usage`; audit log: the "
        "tensors of gae's decision and event logs, not counted in state, unbounded unless `max_log_events` "
        "is set):", means_table(record),
        "The targets, judged from this record:", verdict_table(record),
        f"Measured on {record['machine']} ({record['workers']} worker processes), {record['seconds']:.0f} s in all; "
        "the protocol is in the sections above. Regenerate with "
        "`python scripts/benchmark_streams.py --readme docs/benchmarks.md`."]), NAME, "figures")


def figure(record: dict[str, Any]) -> Any:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models, streams = list(record["models"]), list(record["results"])
    accuracy = np.array([[record["results"][s][m]["accuracy"] for m in models] for s in streams])
    fig, (heat, scatter) = plt.subplots(1, 2, figsize=(17, 0.45 * len(streams) + 3),
                                        gridspec_kw={"width_ratios": [1.6, 1]})
    image = heat.imshow(accuracy, cmap="viridis", vmin=min(40.0, accuracy.min()), vmax=100, aspect="auto")
    for i, row in enumerate(accuracy):
        for j, value in enumerate(row):
            heat.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8,
                      color="white" if value < 75 else "black", weight="bold" if value == row.max() else "normal")
    heat.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
    heat.set_yticks(range(len(streams)), streams, fontsize=8)
    heat.set_title("prequential accuracy (%) per stream (bold: the stream's best)", fontsize=10)
    fig.colorbar(image, ax=heat, fraction=0.03)
    for i, model in enumerate(models):
        mean = record["means"][model]
        scatter.scatter(mean["us_per_decision"], mean["accuracy"], s=40 + 30 * np.log10(max(mean["state_bytes"], 1)),
                        color=f"C{i}", alpha=0.8)
        scatter.annotate(f"{model}\n{_bytes(mean['state_bytes'])}", (mean["us_per_decision"], mean["accuracy"]),
                         fontsize=7, xytext=(5, 3), textcoords="offset points")
    times = [record["means"][m]["us_per_decision"] for m in models]
    scatter.set_xscale("log")
    scatter.set_xlim(min(times) / 1.5, max(times) * 3)  # room for the labels right of the points
    scatter.set_xticks([t for t in (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
                        if min(times) / 1.5 <= t <= max(times) * 3])
    scatter.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    scatter.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    scatter.set_xlabel("time per decision in the harness (us, mean over streams)")
    scatter.set_ylabel("accuracy (%), mean over streams")
    scatter.set_title("means over the suite (marker size: state bytes, log)", fontsize=10)
    scatter.grid(alpha=0.3)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    auto_cli(benchmark_streams)
