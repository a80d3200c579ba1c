"""The public benchmark: gae's presets against river's classifiers under river's prequential harness.

Every model runs on every stream of the suite (``training/river_suite.py``): river's bundled real
data (Phishing, Bananas, ImageSegments) and scikit-learn's (digits, breast cancer, wine, shuffled),
river's generators (RandomRBF still and with slowly and quickly moving centroids, Hyperplane rotating
slowly and quickly, LED with and without a switch, Sine, STAGGER and Agrawal with abrupt and
gradual concept switches, Mixed, RandomTree; one run per seed) and three of gae's own settings, each
stream in a family (``StreamSpec.family``). Each run is ``evaluate.progressive_val_score`` (test,
then train, one sample at a time) on up to 5,000 samples; per model and stream: accuracy, wall time
per decision and state bytes at the end; then the means over the suite, the best river model of each
stream (among :data:`BEST_RIVER`), the means per family and the targets ``jm_recommended`` is judged
against. The protocol and the reason for every choice are in ``docs/benchmarks.md``.

    python scripts/benchmark_streams.py --out results/benchmark-streams      # the suite (minutes on 2 CPUs)
    python scripts/benchmark_streams.py --quick true                         # 500 samples, one seed
    python scripts/benchmark_streams.py --n_samples 300 --streams '[phishing,stagger]' --models '[jm_seed,gnb]'
    python scripts/benchmark_streams.py --readme docs/benchmarks.md          # also the page's section
    python scripts/benchmark_streams.py --reuse docs/results/benchmark-streams.json --readme docs/benchmarks.md
                                                      # gae's models again, river's runs taken from the record

Writes ``benchmark-streams.json`` (the record) and ``benchmark-streams.png`` to ``--out`` and
prints the tables; with ``--readme``, the section between ``<!-- benchmark-streams:start -->`` and
``<!-- benchmark-streams:end -->`` is rendered from the record, which is committed to
docs/results/benchmark-streams.json, the figure is copied to docs/figures/, and the README's
headline is rendered again (``training/headline.py``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from collections import Counter
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
# The river models a stream's best is taken among. lb (Leveraging Bagging) runs and is in the tables, as a
# contestant, but is not one of them: the targets are set against these.
BEST_RIVER = ("knn_100", "knn_400", "knn_1000", "hat", "arf", "srp", "gnb")
GAP_BAR = -3.0  # pp: on no stream more than this below the stream's best river model
TIME_BAR = 0.5  # the subject's mean time per decision over knn_400's
STATE_BAR = 0.1  # the subject's mean state over knn_400's
# the invariance check: the subject again behind each front (training.river_suite.FRONTS), and the most its accuracy
# may move on any stream: in random units (each feature scaled by 1e-3 to 1e3 and shifted), behind either scaler
INVARIANCE_BARS = {"jm_units": 0.5, "jm_minmax": 1.0, "jm_standard": 1.0}
QUICK_SAMPLES = 500
MEASURES = ("accuracy", "us_per_decision", "state_bytes", "log_bytes")


def benchmark_streams(out: Path = Path("results/benchmark-streams"), readme: Path | None = None,
                      n_samples: int | None = None, streams: list[str] | None = None,
                      models: list[str] | None = None, seeds: list[int] | None = None, workers: int | None = None,
                      quick: bool = False, reuse: Path | None = None) -> dict[str, Any]:
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
        reuse: the record of an earlier run (a ``benchmark-streams.json``): the runs of its river models
            are taken as they are, not run again, where the model, the stream, the seed, the samples per
            stream and river's version are this run's (:func:`reusable`). gae's models and the k-NN
            reference (:data:`KNN_REFERENCE`) always run, so the time target stays a ratio measured in
            one run. A river model takes hours on the suite; gae's run in minutes.
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
    before = None if reuse is None else _read_record(reuse)
    earlier = {} if before is None else reusable(before, tasks)
    fresh = [task for task in tasks if task not in earlier]
    outputs = {**earlier, **{task: output._asdict() for task, output in
                             zip(fresh, run_all(suite.run, fresh, workers, "benchmark"), strict=True)}}
    runs = [{"model": task[0], "stream": task[1], "seed": task[2], **outputs[task]} for task in tasks]
    results = {stream: {model: _mean_of([r for r in runs if r["stream"] == stream and r["model"] == model])
                        for model in models} for stream in streams}
    means = {model: {key: float(np.mean([results[s][model][key] for s in streams])) for key in MEASURES}
             for model in models}
    described = {s: {"kind": suite.STREAMS[s].kind, "family": suite.STREAMS[s].family,
                      "description": suite.STREAMS[s].description, "seeds": suite.seeds_of(s, seeds),
                      "n": next(r["n"] for r in runs if r["stream"] == s)} for s in streams}
    record = {
        "protocol": {
            "harness": "river.evaluate.progressive_val_score(samples, model, metrics.Accuracy()): each sample "
                       "scored, then learned, one at a time",
            "n_samples": n, "seeds": seeds, "warm_up": suite.WARM_UP, "knn_windows": list(suite.KNN_WINDOWS),
            "drift_seed_offset": suite.DRIFT_SEED_OFFSET, "abrupt_width": suite.ABRUPT_WIDTH,
            "gradual_width": suite.GRADUAL_WIDTH,
            "scaler": "preprocessing.MinMaxScaler() in front of the k-NN models and gae's presets that measure plain "
                      "distances; none in front of the trees, NB and gae's units-free models (jm_recommended, "
                      "jm_lvq); jm_units, jm_minmax and jm_standard are jm_recommended in random units, behind "
                      "MinMaxScaler and behind StandardScaler (the invariance check)",
            "time": "wall time of the whole harness call over the stream / its samples (scaler included), "
                    "after an untimed warm-up run on the first samples; mean over seeds, then over streams",
            "state": "gae: bytes of the memory's parameters and buffers; river: model._raw_memory_usage "
                     "(the scaler not counted)",
            "log": "gae only: bytes of the tensors of the memory's audit logs (its extra state), not in state",
            "mean": "per stream, the mean over its seeds; per model, the mean over the streams",
            "subject": SUBJECT, "knn_reference": KNN_REFERENCE, "best_river_models": list(BEST_RIVER)},
        "streams": described,
        "models": {m: {"family": suite.MODELS[m].family, "description": suite.MODELS[m].description,
                       "scaled": suite.MODELS[m].scaled, "scaler": suite.MODELS[m].scaler} for m in models},
        "runs": runs, "results": results, "means": means,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"river {_version('river')}, torch {_version('torch')}",
        "workers": workers, "seconds": time.perf_counter() - began,
        "versions": versions(),
        "reused": None if before is None else {
            "runs": len(earlier), "models": sorted({task[0] for task in earlier}),
            "origins": origins(before, str(reuse), sorted({task[0] for task in earlier})),
            "note": "these runs were measured in the runs their origins name, whose machine and load their times "
                    "reflect"}}
    best = best_river(results)
    record["best_river"] = best
    record["best_river_mean"] = float(np.mean([b["accuracy"] for b in best.values()])) if best else None
    record["families"] = families(described, results, best)
    record["verdicts"] = verdicts(results, means)
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


@argument_check
def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"reuse must be a benchmark-streams.json record, got {str(path)!r} ({error})") from None
    if not isinstance(record, dict) or not {"protocol", "runs", "models", "streams", "machine"} <= set(record):
        raise ValueError(f"reuse must be a benchmark-streams.json record, got {str(path)!r} (not one)")
    return record


PROTOCOL_CONSTANTS = ("warm_up", "drift_seed_offset", "abrupt_width", "gradual_width")  # what a run depends on


def versions() -> dict[str, str]:
    """The versions of what the streams and river's models depend on: river, scikit-learn, numpy."""
    return {name: _version(name) for name in ("river", "scikit-learn", "numpy")}


def reusable(record: dict[str, Any], tasks: list[tuple[str, str, int, int]]) -> dict[tuple[str, str, int, int],
                                                                                    dict[str, Any]]:
    """The runs of an earlier ``record`` that ``tasks`` (``(model, stream, seed, n)``) may take as they are:
    a river model's other than :data:`KNN_REFERENCE`'s, where the record ran that model (its description
    and scaling the same), that stream (its description the same) with that seed, as many samples per
    stream, the same protocol constants (:data:`PROTOCOL_CONSTANTS`) and the same versions of river,
    scikit-learn and numpy (river's alone for a record from before the versions were kept). ``task ->
    run`` (the run's measures)."""
    from training import river_suite as suite

    protocol = record["protocol"]
    mine = {"warm_up": suite.WARM_UP, "drift_seed_offset": suite.DRIFT_SEED_OFFSET,
            "abrupt_width": suite.ABRUPT_WIDTH, "gradual_width": suite.GRADUAL_WIDTH}
    same = (all(protocol.get(key) == value for key, value in mine.items())
            and (record["versions"] == versions() if "versions" in record
                 else _river_version(record["machine"]) == _version("river")))
    runs = {(run["model"], run["stream"], run["seed"]): run for run in record["runs"]}
    out = {}
    for task in tasks:
        model, stream, seed, n = task
        spec, run, theirs = suite.MODELS[model], runs.get((model, stream, seed)), record["models"].get(model, {})
        if (run is None or spec.family != "river" or model == KNN_REFERENCE or not same or protocol["n_samples"] != n
                or (theirs.get("description"), theirs.get("scaled")) != (spec.description, spec.scaled)
                or record["streams"].get(stream, {}).get("description") != suite.STREAMS[stream].description):
            continue
        out[task] = {key: run[key] for key in (*MEASURES, "n")}
    return out


def origins(record: dict[str, Any], path: str, models: list[str]) -> list[dict[str, Any]]:
    """Where the runs of ``models`` taken from ``record`` (read from ``path``) were measured: the runs
    ``record`` took from earlier records themselves carry those records' origins, the others the
    machine, workers and wall time of the run that wrote ``record``."""
    earlier = record.get("reused") or {}
    kept = earlier.get("origins", [{key: earlier.get(key) for key in ("from", "machine", "workers", "seconds",
                                                                       "models")}] if earlier else [])
    carried = [origin for origin in kept if set(origin["models"]) & set(models)]
    own = sorted(set(models) - set(earlier.get("models", [])))
    return [*({**origin, "models": sorted(set(origin["models"]) & set(models))} for origin in carried),
            *([{"from": path, "machine": record["machine"], "workers": record.get("workers"),
                "seconds": record.get("seconds"), "models": own}] if own else [])]


def _river_version(machine: str) -> str | None:
    """River's version in a record's ``machine`` line (``..., river 0.22.0, torch ...``)."""
    found = re.search(r"river ([^,\s]+)", machine)
    return found.group(1) if found else None


def _mean_of(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: float(np.mean([run[key] for run in runs])) for key in MEASURES}


def _version(module: str) -> str:
    from importlib.metadata import version

    return version(module)


def best_river(results: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Per stream, the most accurate of the :data:`BEST_RIVER` models that ran (a tie: the first of them):
    ``{'model': name, 'accuracy': %}``; empty when none of them ran."""
    best = {}
    for stream, models in results.items():
        ran = [model for model in BEST_RIVER if model in models]
        if ran:
            model = max(ran, key=lambda m: models[m]["accuracy"])
            best[stream] = {"model": model, "accuracy": models[model]["accuracy"]}
    return best


def families(streams: dict[str, dict[str, Any]], results: dict[str, dict[str, dict[str, float]]],
             best: dict[str, dict[str, Any]], subject: str = SUBJECT) -> dict[str, dict[str, Any]]:
    """Per family of the streams (in their order): its ``streams``, the mean over them of the subject's
    accuracy (``subject_accuracy``) and of the best river model's (``best_river_accuracy``); None where
    the subject or the best's models did not run."""
    groups: dict[str, list[str]] = {}
    for stream, spec in streams.items():
        groups.setdefault(spec["family"], []).append(stream)
    return {family: {"streams": members,
                     "subject_accuracy": float(np.mean([results[s][subject]["accuracy"] for s in members]))
                     if subject in results[members[0]] else None,
                     "best_river_accuracy": float(np.mean([best[s]["accuracy"] for s in members]))
                     if best else None}
            for family, members in groups.items()}


def verdicts(results: dict[str, dict[str, dict[str, float]]], means: dict[str, dict[str, float]],
             subject: str = SUBJECT) -> list[dict[str, Any]]:
    """The targets ``subject`` is judged against: each a dict with its ``name`` (``mean_vs_best_river``,
    ``worst_gap``, ``time_vs_knn_400``, ``state_vs_knn_400``), the ``target`` in words, the subject's
    ``value``, the ``bar`` it must reach, their ``unit`` (``'%'``, ``'pp'`` or ``'x'``), whether it is
    ``met`` (None: not judged, a model it needs did not run) and a ``note`` (what decided it, or the
    models that did not run)."""
    streams = list(results)
    best = best_river(results)

    def verdict(name: str, target: str, unit: str, needs: tuple[str, ...], judge: Any) -> dict[str, Any]:
        missing = [model for model in (subject, *needs) if model not in means]
        if missing:
            return {"name": name, "target": target, "value": None, "bar": None, "unit": unit, "met": None,
                    "note": f"{', '.join(missing)} did not run"}
        value, bar, met, note = judge()
        return {"name": name, "target": target, "value": value, "bar": bar, "unit": unit, "met": bool(met),
                "note": note}

    def mean_vs_best_river() -> tuple[float, float, bool, str]:
        mean, bar = means[subject]["accuracy"], float(np.mean([best[s]["accuracy"] for s in streams]))
        counts = Counter(best[s]["model"] for s in streams).most_common()
        return mean, bar, mean >= bar, "best: " + ", ".join(f"{model} on {count}" for model, count in counts)

    def worst_gap() -> tuple[float, float, bool, str]:
        gaps = {s: results[s][subject]["accuracy"] - best[s]["accuracy"] for s in streams}
        worst = min(gaps, key=gaps.__getitem__)
        return gaps[worst], GAP_BAR, gaps[worst] >= GAP_BAR, f"worst: {worst} ({best[worst]['model']})"

    def moved(front: str) -> Any:
        def judge() -> tuple[float, float, bool, str]:
            moves = {s: abs(results[s][front]["accuracy"] - results[s][subject]["accuracy"]) for s in streams}
            worst = max(moves, key=moves.__getitem__)
            return moves[worst], INVARIANCE_BARS[front], moves[worst] <= INVARIANCE_BARS[front], f"most: {worst}"
        return judge

    def ratio(key: str, bar: float) -> Any:
        def judge() -> tuple[float, float, bool, str]:
            value = means[subject][key] / means[KNN_REFERENCE][key]
            return value, bar, value <= bar, ""
        return judge

    return [
        verdict("mean_vs_best_river", "mean accuracy >= the mean over streams of the best river model's "
                f"({', '.join(BEST_RIVER)}; not lb)", "%", BEST_RIVER, mean_vs_best_river),
        verdict("worst_gap", f"on every stream, accuracy >= the best river model's {GAP_BAR:+g} pp "
                "(the smallest difference)", "pp", BEST_RIVER, worst_gap),
        verdict("time_vs_knn_400", f"time per decision <= {TIME_BAR:g}x k-NN (window 400)'s (ratio of the suite "
                "means, scaler included)", "x", (KNN_REFERENCE,), ratio("us_per_decision", TIME_BAR)),
        verdict("state_vs_knn_400", f"state <= {STATE_BAR:.0%} of k-NN (window 400)'s (ratio of the suite means)",
                "x", (KNN_REFERENCE,), ratio("state_bytes", STATE_BAR)),
        *(verdict(f"invariance_{front[3:]}", f"on every stream, {suite_words(front)} the accuracy moves by at most "
                  f"{bar:g} pp (the largest move)", "moved", (front,), moved(front))
          for front, bar in INVARIANCE_BARS.items()),
    ]


def suite_words(front: str) -> str:
    """How the targets name a front of the invariance check."""
    return {"jm_units": "in random units (each feature x 10^U(-3, 3), shifted)",
            "jm_minmax": "behind MinMaxScaler", "jm_standard": "behind StandardScaler"}[front]


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


def _accuracy(value: float | None, signed: bool = False) -> str:
    return "—" if value is None else f"{value:+.1f}" if signed else f"{value:.1f}"


def _gap(subject: float | None, best: float | None) -> float | None:
    return None if subject is None or best is None else subject - best


def best_river_table(record: dict[str, Any]) -> str:
    """Per stream: its family, the subject's accuracy, the best river model with its accuracy, and the gap."""
    subject = record["protocol"]["subject"]
    lines = [f"| stream | family | `{subject}` | best river model | its accuracy | gap (pp) |",
             "|---|---|---:|---|---:|---:|"]
    for stream, models in record["results"].items():
        mine = models[subject]["accuracy"] if subject in models else None
        best = record["best_river"].get(stream)
        name, accuracy = (f"`{best['model']}`", best["accuracy"]) if best else ("—", None)
        lines.append(f"| {stream} | {record['streams'][stream]['family']} | {_accuracy(mine)} | {name} | "
                     f"{_accuracy(accuracy)} | {_accuracy(_gap(mine, accuracy), signed=True)} |")
    return "\n".join(lines)


def family_table(record: dict[str, Any]) -> str:
    """Per family: its streams, the subject's mean accuracy over them, the best river models' and the gap."""
    subject = record["protocol"]["subject"]
    lines = [f"| family | streams | `{subject}` | best river model's | gap (pp) |", "|---|---|---:|---:|---:|"]
    for family, row in record["families"].items():
        mine, best = row["subject_accuracy"], row["best_river_accuracy"]
        lines.append(f"| {family} | {', '.join(row['streams'])} | {_accuracy(mine)} | {_accuracy(best)} | "
                     f"{_accuracy(_gap(mine, best), signed=True)} |")
    return "\n".join(lines)


def invariance_table(record: dict[str, Any]) -> str:
    """Per stream, each front's accuracy less the subject's (pp); "—" where a model did not run."""
    subject = record["protocol"]["subject"]
    fronts = [front for front in INVARIANCE_BARS if front in record["models"]]
    lines = [f"| stream | `{subject}` | " + " | ".join(f"`{front}`" for front in fronts) + " |",
             "|---|---:|" + "---:|" * len(fronts)]
    for stream, models in record["results"].items():
        mine = models.get(subject, {}).get("accuracy")
        moves = [_gap(models.get(front, {}).get("accuracy"), mine) for front in fronts]
        cells = ["—" if move is None else f"{move:+.2f}" for move in moves]
        lines.append(f"| {stream} | {_accuracy(mine)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict_table(record: dict[str, Any]) -> str:
    """The targets of ``jm_recommended`` with their verdicts."""
    subject = record["protocol"]["subject"]
    lines = [f"| target for `{subject}` | value | bar | verdict |", "|---|---:|---:|---|"]
    formats = {"%": "{:.1f}%", "pp": "{:+.1f} pp", "x": "{:.3g}x", "moved": "{:.2f} pp"}
    for row in record["verdicts"]:
        value, bar = ("—" if v is None else formats[row["unit"]].format(v) for v in (row["value"], row["bar"]))
        if row["met"] is None:
            verdict = f"not judged: {row['note']}"
        else:
            verdict = ("met" if row["met"] else "**not met**") + (f" ({row['note']})" if row["note"] else "")
        lines.append(f"| `{row['name']}`: {row['target']} | {value} | {bar} | {verdict} |")
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
        f"Per stream, `{protocol['subject']}` against the stream's best river model, the most accurate of "
        f"{', '.join(f'`{m}`' for m in protocol['best_river_models'])} (not `lb`, a contestant in the tables "
        "only); gap: the subject's accuracy minus the best's:", best_river_table(record),
        "Per family of streams, the means over its streams of the accuracy and of each stream's best river "
        "model's:", family_table(record),
        "The invariance check: per stream, the subject's accuracy in random units and behind each scaler, less "
        "its accuracy as it runs in the suite (with no scaler):", invariance_table(record),
        "The targets, judged from this record:", verdict_table(record),
        f"Measured on {record['machine']} ({record['workers']} worker processes), {record['seconds']:.0f} s in all"
        f"{_reused(record)}; the protocol is in the sections above. Regenerate with "
        "`python scripts/benchmark_streams.py --readme docs/benchmarks.md` (add "
        "`--reuse docs/results/benchmark-streams.json` to run gae's models and the k-NN reference only)."]),
        NAME, "figures")


def _reused(record: dict[str, Any]) -> str:
    reused = record.get("reused")
    if not reused:
        return ""
    measured = "; ".join(f"{origin['machine']}, {origin['workers']} worker processes, {origin['seconds']:.0f} s"
                         for origin in reused["origins"])
    return (f"; the {reused['runs']} runs of {', '.join(f'`{m}`' for m in reused['models'])} were taken from an "
            f"earlier run's record (`--reuse`), their times measured in the run that made them ({measured})")


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
