"""The head-to-head report: judgment memory vs the strongest k-NN, drift recovery, ablations with CIs.

    python scripts/evaluate.py                       # the protocol of docs/protocol.md
    python scripts/evaluate.py --readme docs/head_to_head.md   # ... and refresh the docs' sections (make report)
    python scripts/evaluate.py --seeds 5 --tuning-seeds 3 --settings '[permute,moons_permute]'   # in short
    python scripts/evaluate.py --seeds 40 --seed-offset 200   # other report seeds, still none a tuning seed

First the k-NN grid (capacity x k x scope, plain and with an ADWIN window cut) runs on the
tuning seeds and ``knn_best`` / ``knn_adwin`` take each setting's best point
(training/tuning.py); then every contestant runs on the report seeds. Writes report.md,
report.json, rolling_accuracy.png (and one per further setting), ablations.png, sensitivity.png
and the TensorBoard logs of one seed (tensorboard/) to ``--out``; with ``--readme``, also the
``report`` section of that page (docs/head_to_head.md), the ``report-drift``, ``report-prototypes``,
``report-tuning`` and ``report-lvq`` sections of docs/drift.md, docs/prototypes.md, docs/protocol.md
and docs/lvq.md, the README's headline, and the record they are rendered from,
docs/results/report.json (``tests/test_generated_docs.py`` renders them from it again). Options
may be spelled with dashes or underscores (``--tuning-seeds``, ``--tuning_seeds``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import bars as B  # noqa: E402
from training import evaluation as E  # noqa: E402
from training import report as R  # noqa: E402
from training import tuning as T  # noqa: E402
from training.cli import argument_check, auto_cli  # noqa: E402
from training.headline import publish_headline  # noqa: E402
from training.parallel import run_all  # noqa: E402
from training.readme import as_saved, docs_of, markers, publish_section, record_path, replace_section  # noqa: E402
from training.report_plots import ablations_figure, rolling_accuracy_figure, sensitivity_figure  # noqa: E402
from training.report_sections import DOC_SECTIONS, readme_section  # noqa: E402
from training.stats import Interval  # noqa: E402

START, END = markers("report")


def evaluate(seeds: int = 20, n_decisions: int = 2000, settings: list[str] | None = None,
             contestants: list[str] | None = None, resamples: int = 500, out: Path = Path("results"),
             readme: Path | None = None, tensorboard: bool = True, workers: int | None = None,
             trace: Path | None = None, trace_seeds: int = 1, tuning_seeds: int = 20,
             seed_offset: int = 100) -> dict[str, Any]:
    """Run the head-to-head and write the report.

    Args:
        seeds: report seeds (``seed_offset .. seed_offset + seeds - 1``); every figure is a mean
            over them with a bootstrap CI.
        n_decisions: stream length; the drift is at its middle (1,000 in the protocol).
        settings: among ``permute`` (the harshest drift), ``shift``, ``gradual`` (the permutation
            over 500 decisions), ``none`` (no drift), ``outliers`` (no drift, 5% outliers),
            ``multimodal`` (no drift, 3 clusters per action), scikit-learn's ``classification``
            (3 clusters per class), ``classification_1`` / ``classification_2`` (1 / 2 clusters),
            ``moons``, ``circles``, and ``rotating`` (a boundary turning all along), each of the
            last five also as ``<name>_permute`` (its labels permuted at the middle). Default: all.
        contestants: among jm, jm_attention, jm_adaptive, jm_prototypes, knn, knn_scoped, knn_best,
            knn_adwin, retrieval. Default: all; ablation variants run whenever an ablation's two
            sides are available. The retrieval memory runs in the permute and shift settings only
            (it is 200x slower).
        resamples: bootstrap resamples over seeds.
        out: folder for the report files.
        readme: the page with report markers to refresh, docs/head_to_head.md (table and figures
            under docs/figures/, the record under docs/results/, the sections of docs/drift.md,
            docs/prototypes.md, docs/protocol.md and docs/lvq.md, and the README's headline).
        tensorboard: also write the Lightning loop's TensorBoard logs of the first report seed.
        workers: processes running streams in parallel (results do not depend on it; latencies
            are measured under that much load). Default: the CPU count, at most 8.
        trace: write the evaluation trace of the first ``trace_seeds`` report seeds here (JSONL, one
            line per scored decision of every memory, see gae/traces/writer.py), with each run's
            starting checkpoint in ``<trace>.checkpoints/`` for ``scripts/replay_trace.py``.
        trace_seeds: how many seeds are traced (each adds about 60 MB of trace at the defaults).
        tuning_seeds: the seeds ``0 .. tuning_seeds - 1`` on which ``knn_best`` and ``knn_adwin``
            choose their capacity, k and scope per setting (the sensitivity table), and on which
            every constant of the judgment memory chosen from evaluation runs was chosen.
        seed_offset: the first report seed; the report seeds must not overlap the tuning seeds.
    """
    settings, chosen = check_arguments(settings, contestants, seeds, n_decisions, resamples, workers, trace_seeds,
                                       tuning_seeds, seed_offset)
    roster = {name: E.CONTESTANTS[name] for name in chosen}
    roster.update({name: variant for name, variant in E.VARIANTS.items()
                   if any(without == name and with_ in roster for _, with_, without in E.ABLATIONS)})
    drift_at = E.middle(n_decisions)
    tuning, report_seeds = list(range(tuning_seeds)), list(range(seed_offset, seed_offset + seeds))
    began = time.perf_counter()
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    grid = [name for name, point in E.GRID.items() if point.kind in {E.TUNED[t] for t in chosen if t in E.TUNED}]
    sensitivity: dict[str, Any] = {}
    if grid:
        tuning_tasks = [(setting, seed) for setting in settings for seed in tuning]
        results = run_tasks("tuning k-NN", tuning_tasks, workers, n_decisions,
                            {task: grid for task in tuning_tasks})
        by_point: dict[str, dict[str, list]] = {setting: {name: [] for name in grid} for setting in settings}
        for (setting, _), by_name in zip(tuning_tasks, results, strict=True):
            for name, figures in by_name.items():
                by_point[setting][name].append(figures)
        sensitivity = T.sensitivity(by_point, resamples)
    options = T.chosen_options(sensitivity)
    runs: dict[str, dict[str, list]] = {
        setting: {name: [] for name in [*roster, R.CEILING]
                  if (E.has_ceiling(setting) if name == R.CEILING else E.runs_in(name, setting))}
        for setting in settings}
    tasks = [(setting, seed) for setting in settings for seed in report_seeds]
    parts = None if trace is None else Path(f"{trace}.checkpoints")
    if parts is not None:
        parts.mkdir(parents=True, exist_ok=True)
    traced = {task: None if parts is None or task[1] >= seed_offset + trace_seeds else str(parts) for task in tasks}
    results = run_tasks("head-to-head", tasks, workers, n_decisions, {task: list(runs[task[0]]) for task in tasks},
                        traced, {task: {n: o for n, o in options.get(task[0], {}).items() if n in roster}
                                 for task in tasks})
    for (setting, _), by_name in zip(tasks, results, strict=True):  # in seed order, whatever finished first
        for name, figures in by_name.items():
            runs[setting][name].append(figures)
    trace_report = None if trace is None else gather_trace(trace, tasks, traced, results)
    summary = R.summarize(runs, drift_at, n_decisions, resamples)
    drift, several, recommended = B.drift_bars(summary), B.prototype_bars(summary), B.recommended_bars(summary)
    protocol = {"seeds": seeds, "tuning_seeds": tuning, "report_seeds": report_seeds, "n_decisions": n_decisions,
                "drift_at": drift_at, "settings": settings,
                "stream": {**E.STREAM, "n_decisions": n_decisions, "drift_at": drift_at},
                "drift_settings": {s: E.SETTINGS[s] for s in settings}, "window": E.WINDOW,
                "batch": E.BATCH, "recovery_after": E.RECOVERY_AFTER, "resamples": resamples, "level": 0.95,
                "ablation_metric": R.ABLATION_METRIC, "tuning_metric": T.CHOICE_METRIC,
                "knn_grid": {"capacity": list(E.KNN_CAPACITIES), "k": list(E.KNN_KS), "scoped": [False, True]},
                "workers": workers, "cpus": os.cpu_count(), "seconds": time.perf_counter() - began}
    report = {"protocol": protocol,
              "contestants": {name: {"label": c.label, "kind": c.kind,
                                     "options": ({s: options[s][name] for s in options if name in options[s]}
                                                 if name in E.TUNED else c.options),
                                     "options_per_setting": name in E.TUNED,
                                     "learn_attention": c.learn_attention, "skip_uncertain": c.skip_uncertain}
                              for name, c in roster.items()},
              "metrics": summary["metrics"], "differences": summary["differences"],
              "ablations": summary["ablations"], "recovery_ratios": summary["recovery_ratios"],
              "claims": R.claims(summary), "drift_bars": drift, "prototype_bars": several,
              "recommended_bars": recommended, "bars_tested": B.count(drift, several, recommended),
              "standing": B.standing(summary),
              "sensitivity": sensitivity, "trace": trace_report}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))  # strict JSON
    (out / "report.md").write_text(R.markdown(report))
    figures = write_figures(summary, sensitivity, settings, drift_at, out)
    if tensorboard:
        knn = options.get(settings[0], {}).get("knn_best", E.CONTESTANTS["knn"].options)
        print(f"\nThe Lightning loop on report seed {seed_offset} of {settings[0]}, each memory a TensorBoard run "
              f"({out / 'tensorboard' / settings[0]}):")
        log_tensorboard(settings[0], seed_offset, n_decisions, out / "tensorboard", knn)
    print(f"\n{legend(roster)}")
    if report["claims"]:
        print(f"\nThe original page's claims, judged for jm ({E.CONTESTANTS['jm'].label}):\n"
              f"{R.claims_table(report['claims'])}")
    for name, table in ((B.RECOMMENDED, recommended), ("jm_adaptive", drift), ("jm_prototypes", several)):
        if table:
            print(f"\nThe bars of {name} ({roster[name].label}):\n{B.bars_table(table)}")
    count = report["bars_tested"]
    print(f"\n{count['tested']} bars tested, {count['met']} met, {count['reported']} reported")
    if report["standing"]["settings"]:
        print(f"\nEach judgment contestant's cumulative accuracy minus {report['standing']['against']}'s:\n"
              f"{B.standing_table(report['standing'])}")
    print(f"\n{settings[0]} drift, every contestant:\n{R.headline_table(summary, settings[0])}")
    if trace_report is not None:
        print(f"\n{trace_table(trace_report)}")
    print(f"\nwrote {out / 'report.md'}, {out / 'report.json'}, {', '.join(str(f) for f in figures)}"
          + (f", {out / 'tensorboard'}" if tensorboard else "") + f" in {time.perf_counter() - began:.0f} s")
    if readme is not None:
        update_readme(readme, report, figures)
    line = conclusion(report, settings[0])
    if line:
        print(f"\n{line}")
    return report


@argument_check
def check_arguments(settings: list[str] | None, contestants: list[str] | None, seeds: int, n_decisions: int,
                    resamples: int, workers: int | None, trace_seeds: int, tuning_seeds: int,
                    seed_offset: int) -> tuple[list[str], list[str]]:
    """The settings and contestants to run (all by default), after checking every argument of
    :func:`evaluate` before anything runs; a ValueError names the first bad one and its value."""
    settings = list(E.SETTINGS) if settings is None else list(settings)
    chosen = list(E.CONTESTANTS) if contestants is None else list(contestants)
    for name, values, known in (("settings", settings, E.SETTINGS), ("contestants", chosen, E.CONTESTANTS)):
        unknown = [value for value in values if value not in known]
        if unknown or not values or len(set(values)) < len(values):
            raise ValueError(f"{name} must be distinct names among {list(known)}, got {values} "
                             f"(unknown names {unknown})")
    for name, value, low in (("seeds", seeds, 2), ("n_decisions", n_decisions, 200), ("resamples", resamples, 1),
                             ("workers", 1 if workers is None else workers, 1), ("trace_seeds", trace_seeds, 0),
                             ("tuning_seeds", tuning_seeds, 2 if any(n in E.TUNED for n in chosen) else 0),
                             ("seed_offset", seed_offset, tuning_seeds)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            why = {"tuning_seeds": f" with a tuned contestant ({', '.join(E.TUNED)})",
                   "seed_offset": ": the report seeds must not be tuning seeds"}.get(name, "")
            raise ValueError(f"{name} must be an int >= {low}{why}, got {value!r}")
    if trace_seeds > seeds:
        raise ValueError(f"trace_seeds must be at most seeds={seeds}, got {trace_seeds}")
    if "knn_adwin" in chosen and importlib.util.find_spec("river") is None:  # its detector is river's ADWIN
        if contestants is not None:
            raise ImportError("the knn_adwin contestant needs river (pip install river, Python >= 3.11): "
                              f"install it or leave knn_adwin out of contestants={contestants}")
        print("river is not installed: the knn_adwin contestant is left out (pip install river, Python >= 3.11)")
        chosen.remove("knn_adwin")
    return settings, chosen


def run_tasks(description: str, tasks: list[tuple[str, int]], workers: int, n_decisions: int,
              names: dict[tuple[str, int], list[str]], traced: dict[tuple[str, int], str | None] | None = None,
              tuned: dict[tuple[str, int], dict[str, dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """:func:`training.evaluation.run_stream` on every (setting, seed) task, in ``workers``
    processes; the results in task order."""
    arguments = [(setting, seed, n_decisions, names[setting, seed], (traced or {}).get((setting, seed)),
                  (tuned or {}).get((setting, seed))) for setting, seed in tasks]
    return run_all(E.run_stream, arguments, workers, description, unit="stream")


def gather_trace(trace: Path, tasks: list[tuple[str, int]], traced: dict[tuple[str, int], str | None],
                 results: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Join the traced runs' parts into ``trace`` (in task order) and measure what tracing cost:
    each traced run's wall time against the median of the same contestant's untraced seeds in
    the same setting, from this run."""
    lines, ratios = 0, {}
    traced_seconds, untraced_seconds = 0.0, 0.0
    with open(trace, "w", encoding="utf-8") as joined:
        for task, by_name in zip(tasks, results, strict=True):
            if traced[task] is None:
                continue
            setting, seed = task
            for name in by_name:
                part = Path(f"{traced[task]}/{setting}-{seed}-{name}.jsonl")
                if not part.exists():  # the ceiling is not a memory
                    continue
                with open(part, encoding="utf-8") as source:
                    for text in source:
                        joined.write(text)
                        lines += 1
                part.unlink()
                plain = [other[name]["seconds"] for t, other in zip(tasks, results, strict=True)
                         if t[0] == setting and traced[t] is None]
                if plain:
                    reference = float(np.median(plain))
                    ratios.setdefault(name, []).append(by_name[name]["seconds"] / reference)
                    traced_seconds += by_name[name]["seconds"]
                    untraced_seconds += reference
    overhead = {name: float(np.median(values)) - 1.0 for name, values in ratios.items()}
    return {"file": str(trace), "checkpoints": f"{trace}.checkpoints", "lines": lines,
            "bytes": trace.stat().st_size, "overhead_by_contestant": overhead,
            "overhead_total": traced_seconds / untraced_seconds - 1.0 if untraced_seconds else None}


def trace_table(report: dict[str, Any]) -> str:
    """The trace's size and what writing it cost, as a markdown table."""
    rows = [f"| {name} | {value * 100:+.0f}% |" for name, value in report["overhead_by_contestant"].items()]
    total = report["overhead_total"]
    return (f"Evaluation trace: {report['lines']:,} lines, {report['bytes'] / 1e6:.1f} MB in {report['file']}.\n\n"
            "| memory | trace writing, extra wall time per stream (median over settings) |\n|---|---:|\n"
            + "\n".join(rows)
            + (f"\n| all traced streams | {total * 100:+.0f}% |" if total is not None else ""))


def write_figures(summary: dict[str, Any], sensitivity: dict[str, Any], settings: list[str], drift_at: int,
                  out: Path) -> list[Path]:
    paths = []
    for i, setting in enumerate(settings):
        curves = {E.CONTESTANTS[name].label: ci for name, ci in summary["curves"][setting].items()}
        figure = rolling_accuracy_figure(curves, drift_at, mark_at=drift_at + E.RECOVERY_AFTER,
                                         title=f"rolling accuracy (w={E.WINDOW}), {setting} drift, "
                                               "mean and 95% CI over seeds")
        paths.append(out / ("rolling_accuracy.png" if i == 0 else f"rolling_accuracy_{setting}.png"))
        figure.savefig(paths[-1], dpi=110)
    paths.append(ablations_png(summary["ablations"], settings, out))
    if sensitivity:
        paths.append(out / "sensitivity.png")
        sensitivity_figure(sensitivity).savefig(paths[-1], dpi=90)
    return paths


def ablations_png(ablations: dict[str, Any], settings: list[str], out: Path) -> Path:
    """``out/ablations.png``: the forest plot of the ablations in the settings the original claims
    are about (every setting's are in report.md), the original claim drawn beside ours."""
    shown = [setting for setting in settings if setting in E.CLAIM_SETTINGS] or settings[:1]
    differences = {f"{label} ({setting})": Interval(ci["mean"], ci["low"], ci["high"], 0, 0.95)
                   for setting in shown for label, ci in ablations[setting].items()}
    original = R.ORIGINAL_ABLATION
    reference = {label: Interval(original[0] / 100, original[1] / 100, original[2] / 100, 500, 0.95)
                 for label in differences if label.startswith(E.ABLATIONS[0][0])}
    figure = ablations_figure(differences, reference=reference, reference_label="original claim",
                              title="ablations: paired difference in cumulative accuracy, 95% CI")
    figure.savefig(out / "ablations.png", dpi=110)
    return out / "ablations.png"


# the judgment memories of the TensorBoard run, by run name: the recommended default and the seed rule's modes
TENSORBOARD_RUNS = {"recommended": "jm_recommended", "seed": "jm", "adaptive": "jm_adaptive"}


def log_tensorboard(setting: str, seed: int, n_decisions: int, folder: Path, knn: dict[str, Any]) -> None:
    """One seed through the Lightning loop, so its TensorBoard logs sit next to the report: the
    judgment memories of :data:`TENSORBOARD_RUNS` and a k-NN with the ``knn`` options (``k``,
    ``capacity``, ``scoped``: the setting's ``knn_best``), each a TensorBoard run of one version."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    from training.data import DecisionStreamDataModule
    from training.module import DecisionMemoryModule

    data = DecisionStreamDataModule(E.make_stream(setting, seed, n_decisions), batch_size=E.BATCH)
    judgments = {run: E.CONTESTANTS[name].options for run, name in TENSORBOARD_RUNS.items()}
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, judgments=judgments,
                                 curve_points_per_batch=E.BATCH, knn_k=knn["k"], knn_capacity=knn["capacity"],
                                 knn_scoped=knn.get("scoped", False))
    logger = TensorBoardLogger(folder, name=setting, default_hp_metric=False)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(model, datamodule=data)


def legend(roster: dict[str, E.Contestant]) -> str:
    """One line per contestant of the run: the name the tables use and what it is."""
    return "The contestants:\n" + "\n".join(f"  {name:<16}{contestant.label}" for name, contestant in roster.items()
                                            if name in E.CONTESTANTS)


def conclusion(report: dict[str, Any], setting: str) -> str:
    """The run in one plain sentence, from its numbers: in ``setting``, how often the recommended
    judgment (or the first judgment contestant that ran), the strongest k-NN that ran and the seed
    rule were right, and in how many settings the judgment is ahead of, tied with or behind that
    k-NN. Empty when no judgment or no k-NN ran."""
    metrics = report["metrics"][setting]
    judgment = next((name for name in (B.RECOMMENDED, *B.STANDING) if name in metrics), None)
    knn = next((name for name in ("knn_best", "knn_adwin", "knn_scoped", "knn") if name in metrics), None)
    if judgment is None or knn is None:
        return ""
    words = {B.RECOMMENDED: "gae's recommended judgment (the JudgmentMemory default)", "jm": "gae's seed rule",
             "jm_adaptive": "gae's seed rule with drift_mode='adaptive'",
             "jm_prototypes": "gae's seed rule with 4 prototypes", "knn_best": "the tuned k-NN",
             "knn_adwin": "the tuned k-NN with ADWIN", "knn_scoped": "the k-NN (cap 200, scoped)",
             "knn": "the k-NN (cap 200)"}
    shown = [name for name in (judgment, knn, "jm") if name in metrics and (name != "jm" or judgment != "jm")]
    right = [f"{100 * metrics[name]['cumulative']['mean']:.1f}%" for name in shown]
    others = [f"{words[name]} {value}" for name, value in zip(shown[1:], right[1:], strict=True)]
    at = f"{report['protocol']['drift_at']:,}"
    drift = {"permute": f" (the actions permuted at decision {at})", "shift": f" (a shift at decision {at})",
             "gradual": f" (a gradual permutation from decision {at})"}.get(B.drift_kind(setting), "")
    where = "the stream without drift (none)" if setting == "none" else f"the {setting} stream{drift}"
    line = (f"In short: on {where}, {words[judgment]} was right {right[0]} of the time, "
            + " and ".join([", ".join(others[:-1]), others[-1]] if len(others) > 1 else others) + ".")
    standing = report["standing"]
    standings = [entry[judgment]["standing"] for entry in standing["settings"].values() if judgment in entry]
    if standings and standing["against"] == knn:
        line = (line[:-1] + f"; over the {len(standings)} settings it is ahead of {words[knn]} in "
                f"{standings.count('ahead')}, tied in {standings.count('tied')} and behind in "
                f"{standings.count('behind')} (cumulative accuracy, paired 95% CI).")
    return line


def update_readme(path: Path, report: dict[str, Any], figures: list[Path]) -> None:
    """Put the report's tables between the report markers of ``path`` (docs/head_to_head.md),
    commit the record they come from to docs/results/report.json, refresh the sections of
    docs/drift.md, docs/prototypes.md, docs/protocol.md and docs/lvq.md drawn from it and the
    README's headline, and copy the figures to docs/figures/."""
    if not publish_section(path, "report", report, readme_section):
        print(f"{path} has no {START} ... {END} markers; the page left alone")
        return
    docs, saved = docs_of(path), as_saved(report)
    for name, (page, render) in DOC_SECTIONS.items():
        replace_section(docs / page, *markers(name), render(saved))
    publish_headline(path)
    target = docs / "figures"
    target.mkdir(parents=True, exist_ok=True)
    for figure in figures:
        shutil.copyfile(figure, target / figure.name)
    print(f"updated {path}, {record_path(path, 'report')}, its doc sections, the README's headline and {target}")


def cli_arguments(argv: list[str]) -> list[str]:
    """Options spelled with dashes (``--tuning-seeds 20``) as the underscores jsonargparse knows."""
    return [argument.split("=", 1)[0].replace("-", "_").replace("__", "--", 1)
            + (argument[len(argument.split("=", 1)[0]):]) if argument.startswith("--") else argument
            for argument in argv]


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # the memories' work is tiny: thread hand-offs would cost more than they save
    auto_cli(evaluate, args=cli_arguments(sys.argv[1:]))
