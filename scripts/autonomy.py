"""Act or refer on the public suite: the share of decisions a memory may take alone at a target error.

For each stream of the public suite (``training/river_suite.py``, its seeds) one prequential run
of each contestant, as the benchmark builds it (gae's judgment with no scaler, the k-NN behind its
MinMaxScaler):

- ``jm_recommended`` and ``knn_400`` (the recommended judgment and river's k-NN with a window of
  400, the suite's reference) under river's harness: for each sample the model's probabilities
  give its answer and confidence; a :class:`gae.decider.refer.Referral` with the target error and
  no margin rule takes the decision alone when the confidence reaches its calibrated threshold,
  else refers it; then the verified label arrives, the referral observes (confidence, correct)
  and the model learns. The same rule, with the same settings, on each model's confidence.
- ``jm_decide``: a :class:`gae.JudgmentMemory` of the recommended configuration served by a
  :class:`gae.Decider` with ``target_error`` (and ``refer_margin=0``), driven as an agent drives
  it: ``decide`` (refer when it answers ``refer``, for any reason: its confidence, ``novel``,
  ``recent_change``, ``not_calibrated``), then ``verify`` with the label.

Per stream and contestant: the autonomy rate (the share of decisions taken alone), the error
realised among them, the verified decisions before the first one taken alone, and the accuracy;
then the means over the suite, and the target: gae's mean autonomy at least :data:`RATIO` times
the k-NN's under the same rule, with no stream over the target error.

    python scripts/autonomy.py                             # every stream, its seeds, 5,000 samples (minutes)
    python scripts/autonomy.py --quick                     # 500 samples, one seed
    python scripts/autonomy.py --readme docs/mcp.md      # also the page's section (docs/results/autonomy.json)
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gae import Decider, JudgmentConfig, JudgmentMemory  # noqa: E402
from gae.decider.refer import DELTA, REASONS, WINDOW, Referral  # noqa: E402
from training import cli  # noqa: E402
from training import river_suite as suite  # noqa: E402
from training.readme import publish_section  # noqa: E402

MODELS = ("jm_recommended", "jm_decide", "knn_400")
TARGET = 0.02
RATIO = 1.5  # the target: gae's mean autonomy at least this many times the k-NN's under the same rule


def progress(message: str) -> None:
    print(f"[autonomy] {message}", file=sys.stderr, flush=True)


def run(task: tuple[str, str, int, int, float]) -> dict[str, Any]:
    """One prequential run with act-or-refer: counts of decisions, taken alone, wrong among them, right."""
    import torch

    torch.set_num_threads(1)
    model_name, stream, seed, n, target = task
    if model_name == "jm_decide":
        return run_decide(stream, seed, n, target)
    spec = suite.MODELS[model_name]
    data = suite.samples(stream, seed, n, spec.family)
    model = suite.build(model_name, seed, stream)
    referral = Referral(target, min_margin=0.0)  # the rule on the confidence alone
    alone = wrong_alone = right = 0
    first = None  # verified decisions before the first one taken alone
    for i, (x, y) in enumerate(data):
        probs = model.predict_proba_one(x)
        answer, confidence = max(probs.items(), key=lambda item: item[1]) if probs else (None, 0.0)
        confidence = min(max(float(confidence), 0.0), 1.0)
        correct = answer == y
        taken = not referral.reasons(confidence, probs.values(), unseen=answer is None)
        if taken:
            alone += 1
            wrong_alone += not correct
            first = i if first is None else first
        right += correct
        referral.observe(0, confidence, bool(correct), eligible=answer is not None, alone=taken, seq=i)
        model.learn_one(x, y)
    return {"model": model_name, "stream": stream, "seed": seed, "n": len(data), "alone": alone,
            "wrong_alone": wrong_alone, "right": right, "first_alone": first}


def run_decide(stream: str, seed: int, n: int, target: float) -> dict[str, Any]:
    """``jm_decide``: a Decider's decide and verify on the memory (see the module), its reasons counted."""
    data = suite.samples(stream, seed, n, "gae")
    decider, names = None, None
    alone = wrong_alone = right = 0
    first = None
    reasons: dict[str, int] = {}
    for i, (x, y) in enumerate(data):
        category = str(x.get(suite.CATEGORY, "general"))
        factors = {key: value for key, value in x.items() if key != suite.CATEGORY}
        names = sorted(factors, key=str) if names is None else names  # the first sample's features, in order
        row = [float(factors.get(name, 0.0)) for name in names]  # in the data's own units: no scaler
        label = str(y)
        if decider is None:
            memory = JudgmentMemory([category], [label], len(names), JudgmentConfig.recommended(), grow=True)
            decider = Decider(memory, target_error=target, refer_margin=0.0)
        decision = decider.decide(row, category)
        correct = decision.action == label
        if not decision.refer:
            alone += 1
            wrong_alone += not correct
            first = i if first is None else first
        for reason in decision.reasons:
            reasons[reason] = reasons.get(reason, 0) + 1
        right += correct
        decider.verify(decision.id, label)
    return {"model": "jm_decide", "stream": stream, "seed": seed, "n": len(data), "alone": alone,
            "wrong_alone": wrong_alone, "right": right, "first_alone": first, "reasons": reasons}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stream and model (pooled over seeds): autonomy, realised error, accuracy; the suite
    means; and how often ``jm_decide`` gave each reason."""
    per_stream: dict[str, dict[str, dict[str, float | None]]] = {}
    for stream in dict.fromkeys(r["stream"] for r in runs):
        per_stream[stream] = {}
        for model in MODELS:
            mine = [r for r in runs if r["stream"] == stream and r["model"] == model]
            n, alone = sum(r["n"] for r in mine), sum(r["alone"] for r in mine)
            firsts = [r["first_alone"] for r in mine if r.get("first_alone") is not None]
            per_stream[stream][model] = {
                "autonomy": alone / n, "error_alone": sum(r["wrong_alone"] for r in mine) / alone if alone else None,
                "accuracy": sum(r["right"] for r in mine) / n,
                # the median over the seeds that took one alone (None: no seed did)
                "first_alone": statistics.median(firsts) if firsts else None}
    means = {model: {"autonomy": statistics.mean(s[model]["autonomy"] for s in per_stream.values()),
                     "accuracy": statistics.mean(s[model]["accuracy"] for s in per_stream.values()),
                     "streams_over_target": sum(1 for s in per_stream.values() if s[model]["error_alone"] is not None
                                                and s[model]["error_alone"] > TARGET)}
             for model in MODELS}
    decided = [r for r in runs if r["model"] == "jm_decide"]
    total = sum(r["n"] for r in decided)
    reasons = {reason: sum(r["reasons"].get(reason, 0) for r in decided) / total for reason in REASONS}
    return {"per_stream": per_stream, "means": means, "reasons": reasons}


def section(record: dict[str, Any]) -> str:
    """The page's table: per stream, each contestant's autonomy and realised error; the means last."""
    per_stream, means = record["summary"]["per_stream"], record["summary"]["means"]

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.1f}%"

    def first(value: float | None) -> str:
        return "—" if value is None else f"{value:,.0f}"

    heads = {"jm_recommended": "gae", "jm_decide": "gae `decide`", "knn_400": "k-NN"}
    lines = ["| stream | " + " | ".join(f"{heads[m]} autonomy | {heads[m]} error alone | {heads[m]} first alone"
                                       for m in MODELS) + " |",
             "|---|" + "---:|---:|---:|" * len(MODELS)]
    for stream, models in per_stream.items():
        lines.append(f"| {stream} | " + " | ".join(
            f"{cell(models[m]['autonomy'])} | {cell(models[m]['error_alone'])} | {first(models[m].get('first_alone'))}"
            for m in MODELS) + " |")
    lines.append(f"| **mean over {len(per_stream)} streams** | " + " | ".join(
        f"**{cell(means[m]['autonomy'])}** | {means[m]['streams_over_target']} over the target |" for m in MODELS)
        + " |")
    gae, decide, knn = means["jm_recommended"], means["jm_decide"], means["knn_400"]
    ratio = gae["autonomy"] / knn["autonomy"] if knn["autonomy"] else math.inf
    held = all(means[m]["streams_over_target"] == 0 for m in MODELS)
    verdict = (f"{'met' if ratio >= RATIO else 'missed'}: {ratio:.2f}x ({cell(gae['autonomy'])} against "
               f"{cell(knn['autonomy'])}){'' if ratio >= RATIO else f', short of {RATIO:g}x by {RATIO - ratio:.2f}'}")
    given = ", ".join(f"`{reason}` {cell(share)}" for reason, share in record["summary"]["reasons"].items())
    lines += ["", f"Target error {100 * record['target']:g}%, window {record['window']:,}, delta {record['delta']:g}; "
              f"up to {record['n']:,} samples a stream, prequential, every decision verified before the next; "
              "*first alone*: the verified decisions before the first one taken alone (the median over the seeds "
              f"that took one). The target, gae's mean autonomy at least {RATIO:g}x the k-NN's under the same rule: "
              f"{verdict}; no stream over the target error: {'held' if held else 'broken'}. With every reason "
              f"of its own (`decide`), the memory took {cell(decide['autonomy'])} alone "
              f"({decide['autonomy'] / knn['autonomy'] if knn['autonomy'] else math.inf:.2f}x the k-NN's); the "
              f"share of its decisions each reason was given for: {given}. Measured by `{record['command']}` on "
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
