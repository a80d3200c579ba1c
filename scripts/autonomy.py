"""Act or refer on the public suite: the share of decisions a memory may take alone at a target error.

For each stream of the public suite (``training/river_suite.py``, its seeds) and each model (the
recommended judgment, ``jm_recommended``, and river's k-NN with a window of 400, ``knn_400``, the
suite's reference, each behind its MinMaxScaler as the benchmark runs them), one prequential run:
for each sample the model's probabilities give its answer and confidence; the decision is taken
alone when the confidence reaches the :class:`gae.refer.ReferralCalibrator`'s threshold at that
moment, else referred; then the verified label arrives, the calibrator observes (confidence,
correct) and the model learns. The same rule, with the same settings, for both models.

Per stream and model: the autonomy rate (the share of decisions taken alone), the error realised
among them, and the accuracy; then the means over the suite.

    python scripts/autonomy.py                             # every stream, its seeds, 5,000 samples (minutes)
    python scripts/autonomy.py --quick                     # 500 samples, one seed
    python scripts/autonomy.py --readme docs/mcp.md      # also the page's section (docs/results/autonomy.json)
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gae.refer import DELTA, WINDOW, ReferralCalibrator  # noqa: E402
from training import cli  # noqa: E402
from training import river_suite as suite  # noqa: E402
from training.readme import publish_section  # noqa: E402

MODELS = ("jm_recommended", "knn_400")
TARGET = 0.02


def progress(message: str) -> None:
    print(f"[autonomy] {message}", file=sys.stderr, flush=True)


def run(task: tuple[str, str, int, int, float]) -> dict[str, Any]:
    """One prequential run with act-or-refer: counts of decisions, taken alone, wrong among them, right."""
    import torch

    torch.set_num_threads(1)
    model_name, stream, seed, n, target = task
    spec = suite.MODELS[model_name]
    data = suite.samples(stream, seed, n, spec.family)
    model = suite.build(model_name, seed, stream)
    calibrator = ReferralCalibrator(target)
    alone = wrong_alone = right = 0
    for x, y in data:
        probs = model.predict_proba_one(x)
        answer, confidence = max(probs.items(), key=lambda item: item[1]) if probs else (None, 0.0)
        correct = answer == y
        if answer is not None and confidence >= calibrator.threshold:
            alone += 1
            wrong_alone += not correct
        right += correct
        if answer is not None:
            calibrator.observe(min(max(float(confidence), 0.0), 1.0), bool(correct))
        model.learn_one(x, y)
    return {"model": model_name, "stream": stream, "seed": seed, "n": len(data), "alone": alone,
            "wrong_alone": wrong_alone, "right": right}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stream and model (pooled over seeds): autonomy, realised error, accuracy; and the suite means."""
    per_stream: dict[str, dict[str, dict[str, float | None]]] = {}
    for stream in dict.fromkeys(r["stream"] for r in runs):
        per_stream[stream] = {}
        for model in MODELS:
            mine = [r for r in runs if r["stream"] == stream and r["model"] == model]
            n, alone = sum(r["n"] for r in mine), sum(r["alone"] for r in mine)
            per_stream[stream][model] = {
                "autonomy": alone / n, "error_alone": sum(r["wrong_alone"] for r in mine) / alone if alone else None,
                "accuracy": sum(r["right"] for r in mine) / n}
    means = {model: {"autonomy": statistics.mean(s[model]["autonomy"] for s in per_stream.values()),
                     "accuracy": statistics.mean(s[model]["accuracy"] for s in per_stream.values()),
                     "streams_over_target": sum(1 for s in per_stream.values() if s[model]["error_alone"] is not None
                                                and s[model]["error_alone"] > TARGET)}
             for model in MODELS}
    return {"per_stream": per_stream, "means": means}


def section(record: dict[str, Any]) -> str:
    """The page's table: per stream, each model's autonomy and realised error; the means last."""
    per_stream, means = record["summary"]["per_stream"], record["summary"]["means"]

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.1f}%"

    lines = ["| stream | gae autonomy | gae error alone | k-NN autonomy | k-NN error alone |",
             "|---|---:|---:|---:|---:|"]
    for stream, models in per_stream.items():
        gae, knn = models["jm_recommended"], models["knn_400"]
        lines.append(f"| {stream} | {cell(gae['autonomy'])} | {cell(gae['error_alone'])} | {cell(knn['autonomy'])} | "
                     f"{cell(knn['error_alone'])} |")
    gae, knn = means["jm_recommended"], means["knn_400"]
    lines.append(f"| **mean over {len(per_stream)} streams** | **{cell(gae['autonomy'])}** | "
                 f"{gae['streams_over_target']} over the target | **{cell(knn['autonomy'])}** | "
                 f"{knn['streams_over_target']} over the target |")
    verdict = "met" if gae["autonomy"] > knn["autonomy"] else "missed"
    lines += ["", f"Target error {100 * record['target']:g}%, window {record['window']:,}, delta {record['delta']:g}; "
              f"up to {record['n']:,} samples a stream, prequential, every decision verified before the next. "
              f"The target, autonomy above the k-NN's on the suite's mean: {verdict} "
              f"({cell(gae['autonomy'])} against {cell(knn['autonomy'])}). Measured by `{record['command']}` on "
              f"{record['machine']} in {record['seconds']:.0f} s."]
    return "\n".join(lines)


def main() -> None:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 samples and one seed a stream: a smoke run")
    parser.add_argument("--n_samples", type=int, default=suite.N_SAMPLES, help="samples a stream")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--out", type=Path, default=Path("results/autonomy.json"), help="the JSON record")
    parser.add_argument("--readme", type=Path, help="the page with autonomy markers to refresh (docs/mcp.md)")
    args = parser.parse_args()
    n = 500 if args.quick else args.n_samples
    seeds = suite.SEEDS[:1] if args.quick else suite.SEEDS
    tasks = [(model, stream, seed, n, TARGET) for stream in suite.STREAMS for seed in suite.seeds_of(stream, seeds)
             for model in MODELS]
    began = time.perf_counter()
    runs = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for i, result in enumerate(pool.map(run, tasks), start=1):
            runs.append(result)
            if i % 10 == 0 or i == len(tasks):
                progress(f"{i} / {len(tasks)} runs")
    import torch

    record = {"command": " ".join(["python", "scripts/autonomy.py", *sys.argv[1:]]), "quick": args.quick, "n": n,
              "target": TARGET, "window": WINDOW, "delta": DELTA, "runs": runs, "summary": summarise(runs),
              "machine": f"{platform.machine()}, torch {torch.__version__}, Python {platform.python_version()}",
              "seconds": time.perf_counter() - began}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(section(json.loads(json.dumps(record))))
    if args.readme is not None and not args.quick:
        if publish_section(args.readme, "autonomy", record, section):
            progress(f"updated {args.readme} and docs/results/autonomy.json")


if __name__ == "__main__":
    main()
