"""Turn per-seed figures of the head-to-head into confidence intervals, claim verdicts and a report.

Input: ``runs[setting][contestant]`` = a list (one entry per stream seed, same seeds for every
contestant) of the dicts made by :func:`training.evaluation.figures`. Everything here is
deterministic given those numbers (the bootstrap is seeded).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from training.bars import MARGIN_PP, bars_table, difference, labelled, standing_table
from training.evaluation import ABLATIONS, CLAIM_SETTINGS, CONTESTANTS, RECOVERY_AFTER, VARIANTS
from training.stats import Interval, bootstrap_ci, paired_difference, ratio_of_means, recovery_decisions
from training.tuning import choices_table, sensitivity_table

METRICS = {  # key: (table label, unit); accuracies are fractions, shown in % / pp
    "cumulative": ("cumulative accuracy", "%"),
    "mean_rolling": ("mean rolling accuracy (w=50)", "%"),
    "before_drift": ("accuracy before the drift", "%"),
    "after_drift": ("accuracy after the drift", "%"),
    "at_recovery_point": (f"rolling accuracy {RECOVERY_AFTER} decisions after the drift", "%"),
    "recovery_decisions": ("decisions to regain 90% of the pre-drift level", "decisions"),
    "ece": ("expected calibration error", "%"),
    "latency_us": ("median latency per decision (us)", "us"),
    "promotions_before": ("promotions before the drift", "count"),
    "promotions_after": ("promotions after the drift", "count"),
    "state_bytes": ("state (bytes)", "bytes"),
}
# the ratio of mean recovery times (with a paired bootstrap CI) of these contestants to those
RECOVERING = ("jm_adaptive", "jm_recommended")
RECOVERY_BASELINES = ("knn", "knn_scoped", "knn_best", "knn_adwin")
CEILING = "ceiling"  # the pseudo-contestant of evaluation.ceiling: nearest true prototype
CEILING_LABEL = "ceiling: nearest true prototype (Bayes rule, not a memory)"
ABLATION_METRIC = "cumulative"
# the original page's figures, in percentage points
ORIGINAL_ABLATION = (9.2, 7.2, 11.3)  # mean, CI low, CI high


def per_seed(runs: dict[str, list[dict[str, Any]]], drift_at: int, n_decisions: int) -> dict[str, dict]:
    """Per-seed arrays of every metric, by contestant; the recovery time is censored at the stream end."""
    table: dict[str, dict] = {}
    for name, seeds in runs.items():
        rolling = np.stack([run["rolling"] for run in seeds])  # (S, T)
        # the pre-drift level is the mean rolling accuracy of the 200 decisions before the drift
        recovered = recovery_decisions(rolling, drift_at, fraction=0.9, baseline_window=min(200, drift_at))
        columns = {key: np.array([run[key] for run in seeds]) for key in METRICS if key != "recovery_decisions"}
        columns["recovery_decisions"] = np.where(np.isnan(recovered), n_decisions - drift_at, recovered)
        table[name] = {"columns": columns, "rolling": rolling, "censored": int(np.isnan(recovered).sum())}
    return table


def finite_or_none(ci: Interval) -> dict[str, float | None]:
    """:func:`interval`, with an infinite end (a ratio over a k-NN that never needed a decision)
    as None, so the record stays valid JSON."""
    return {key: value if np.isfinite(value) else None for key, value in interval(ci).items()}


def interval(ci: Interval) -> dict[str, float]:
    return {"mean": float(ci.mean), "low": float(ci.low), "high": float(ci.high)}


def summarize(runs: dict[str, dict[str, list]], drift_at: int, n_decisions: int,
              resamples: int) -> dict[str, Any]:
    """CIs of every figure, of every difference between contestants, and of every ablation."""
    metrics: dict[str, Any] = {}
    differences: dict[str, Any] = {}
    ablations: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for setting, by_contestant in runs.items():
        table = per_seed(by_contestant, drift_at, n_decisions)
        metrics[setting] = {name: {**{key: interval(bootstrap_ci(values, resamples=resamples))
                                      for key, values in entry["columns"].items()},
                                   "recovery_censored_seeds": entry["censored"]}
                            for name, entry in table.items()}
        curves[setting] = {name: bootstrap_ci(entry["rolling"], resamples=resamples)
                           for name, entry in table.items() if name in CONTESTANTS}
        pairs = [(a, b) for a, b in combinations([n for n in [*CONTESTANTS, *VARIANTS, CEILING] if n in table], 2)]
        differences[setting] = {f"{a} - {b}": {key: interval(paired_difference(table[a]["columns"][key],
                                                                                table[b]["columns"][key],
                                                                                resamples=resamples))
                                               for key in METRICS}
                                for a, b in pairs}
        ablations[setting] = {
            label: {"with": with_, "without": without, "metric": ABLATION_METRIC,
                    **interval(paired_difference(table[with_]["columns"][ABLATION_METRIC],
                                                 table[without]["columns"][ABLATION_METRIC], resamples=resamples))}
            for label, with_, without in ABLATIONS if with_ in table and without in table}
        ratios[setting] = {f"{a} / {b}": finite_or_none(ratio_of_means(table[a]["columns"]["recovery_decisions"],
                                                                table[b]["columns"]["recovery_decisions"],
                                                                resamples=resamples))
                           for a in RECOVERING if a in table for b in RECOVERY_BASELINES if b in table}
    return {"metrics": metrics, "differences": differences, "ablations": ablations, "curves": curves,
            "recovery_ratios": ratios}


def claims(summary: dict[str, Any], against: str = "knn_best", original: str = "knn") -> list[dict[str, Any]]:
    """The original page's three claims, each with our paired difference and a verdict per setting.

    A claim is judged against the strongest k-NN (``against``: capacity, k and scope tuned on
    the tuning seeds) and *reproduced* in a setting when the 95% CI of ``jm - against`` excludes
    zero in the claimed direction; whether the original magnitude lies inside our CI is reported
    apart. The same difference against the original design's k-NN (``original``, capacity 200)
    is printed next to it (``against_original``).
    """
    def entry(ci: dict[str, float], magnitude: float | None) -> dict[str, Any]:
        pp = {name: 100 * ci[name] for name in ("mean", "low", "high")}
        return {"difference_pp": pp, "verdict": "reproduced" if ci["low"] > 0 else "not reproduced",
                "original_magnitude_inside_ci": None if magnitude is None else pp["low"] <= magnitude <= pp["high"]}

    result = []
    specs = [
        ("Judgment memory has higher rolling accuracy than k-NN retrieval on the same stream",
         "higher", None, "mean_rolling"),
        (f"Judgment memory is +{MARGIN_PP:g} pp ahead of k-NN at N=1,150, {RECOVERY_AFTER} decisions after a drift",
         f"+{MARGIN_PP:g} pp", MARGIN_PP, "at_recovery_point"),
        ("Ablation, judgment memory present vs removed: +9.2 pp, 95% CI [+7.2, +11.3]",
         "+9.2 pp [+7.2, +11.3]", ORIGINAL_ABLATION[0], ABLATION_METRIC),
    ]
    for text, claimed, magnitude, key in specs:
        verdicts = {}
        for setting in summary["differences"]:
            judged = difference(summary, setting, "jm", against, key)
            if judged is None or setting not in CLAIM_SETTINGS:
                continue
            verdicts[setting] = entry(judged, magnitude)
            reference = difference(summary, setting, "jm", original, key)
            if reference is not None:
                verdicts[setting]["against_original"] = entry(reference, magnitude)
        result.append({"claim": text, "original": claimed, "comparison": f"jm - {against}",
                       "original_comparison": f"jm - {original}", "metric": key, "settings": verdicts})
    return result


def _fmt(ci: dict[str, float], unit: str) -> str:
    if unit in ("%", "pp"):
        return f"{100 * ci['mean']:.1f} [{100 * ci['low']:.1f}, {100 * ci['high']:.1f}]"
    if unit == "bytes":
        return f"{ci['mean']:,.0f}"
    return f"{ci['mean']:.1f} [{ci['low']:.1f}, {ci['high']:.1f}]"


def headline_table(summary: dict[str, Any], setting: str) -> str:
    """Markdown: one row per contestant, mean [95% CI] over seeds of the headline figures."""
    keys = ["cumulative", "before_drift", "after_drift", "at_recovery_point", "recovery_decisions", "ece",
            "latency_us", "state_bytes"]
    head = "| contestant | " + " | ".join(METRICS[k][0] for k in keys) + " |"
    lines = [head, "|---" + "|---:" * len(keys) + "|"]
    for name, figures in summary["metrics"][setting].items():
        if name not in CONTESTANTS and name != CEILING:
            continue
        label = CONTESTANTS[name].label if name in CONTESTANTS else f"*{CEILING_LABEL}*"
        lines.append(f"| {label} | " + " | ".join(_fmt(figures[k], METRICS[k][1]) for k in keys) + " |")
    return "\n".join(lines)


COST_CONTESTANTS = ("jm", "jm_prototypes", "jm_recommended", "knn", "knn_scoped", "knn_best")


def summary_of(report: dict[str, Any]) -> dict[str, Any]:
    """The parts of :func:`summarize` that a saved ``report.json`` keeps (all but the curves),
    which is all the tables need."""
    return {key: report[key] for key in ("metrics", "differences", "ablations", "recovery_ratios")}


def figures_table(summary: dict[str, Any], setting: str, names: tuple[str, ...], columns: dict[str, str]) -> str:
    """Markdown: the named contestants that ran in ``setting``, one row each, with the figures
    ``columns`` names (metric key: column label), mean [95% CI] over seeds."""
    metrics = summary["metrics"].get(setting, {})
    lines = ["| contestant | " + " | ".join(columns.values()) + " |", "|---" + "|---:" * len(columns) + "|"]
    for name in names:
        if name in metrics:
            label = CONTESTANTS[name].label if name in CONTESTANTS else f"*{CEILING_LABEL}*"
            lines.append(f"| {label} | " + " | ".join(_fmt(metrics[name][key], METRICS[key][1]) for key in columns)
                         + " |")
    return "\n".join(lines)


def cost_table(summary: dict[str, Any], setting: str) -> str:
    """Latency per decision and state size next to k-NN's, from the same run."""
    metrics = summary["metrics"].get(setting, {})
    lines = ["| memory | cumulative accuracy (%) | median latency per decision (us) | state (bytes) |",
             "|---|---:|---:|---:|"]
    for name in COST_CONTESTANTS:
        if name in metrics:
            entry = metrics[name]
            lines.append(f"| {CONTESTANTS[name].label} | {_fmt(entry['cumulative'], '%')} | "
                         f"{_fmt(entry['latency_us'], 'us')} | {_fmt(entry['state_bytes'], 'bytes')} |")
    return "\n".join(lines)


def headroom(summary: dict[str, Any], setting: str, at: str = "at_recovery_point") -> dict[str, float] | None:
    """Ceiling minus each k-NN variant at N=1,150, in pp: the most any memory could be ahead."""
    metrics = summary["metrics"].get(setting, {})
    if CEILING not in metrics:
        return None
    return {knn: 100 * (metrics[CEILING][at]["mean"] - metrics[knn][at]["mean"])
            for knn in ("knn", "knn_scoped", "knn_best", "knn_adwin") if knn in metrics}


def promotions_table(summary: dict[str, Any]) -> str:
    """How often the adaptive mode promoted, per setting: how it tells drift from outliers."""
    lines = ["| setting | promotions before the drift (or first half) | promotions after it (or second half) |",
             "|---|---:|---:|"]
    for setting, metrics in summary["metrics"].items():
        if "jm_adaptive" in metrics:
            entry = metrics["jm_adaptive"]
            lines.append(f"| {setting} | {_fmt(entry['promotions_before'], 'count')} | "
                         f"{_fmt(entry['promotions_after'], 'count')} |")
    return "\n".join(lines)


def ablation_table(summary: dict[str, Any], setting: str) -> str:
    lines = ["| ablation (with - without) | paired difference, cumulative accuracy (pp) |", "|---|---:|"]
    for label, ci in summary["ablations"][setting].items():
        lines.append(f"| {label} | {100 * ci['mean']:+.1f} [{100 * ci['low']:+.1f}, {100 * ci['high']:+.1f}] |")
    return "\n".join(lines)


def claims_table(claim_list: list[dict[str, Any]]) -> str:
    """Markdown: each claim's verdict against the strongest k-NN per setting, and the same
    difference against the original's k-NN (capacity 200), which decides nothing."""
    settings = sorted({s for claim in claim_list for s in claim["settings"]})
    against = claim_list[0]["comparison"].split(" - ")[1] if claim_list else "knn_best"
    original = claim_list[0]["original_comparison"].split(" - ")[1] if claim_list else "knn"
    head = [f"vs {against}, {s} drift (pp)" for s in settings] + [f"vs {labelled(original)}, {s} (pp)"
                                                                  for s in settings]
    lines = ["| original claim | " + " | ".join(head) + " |", "|---" + "|---" * len(head) + "|"]
    for claim in claim_list:
        cells, reference = [], []
        for setting in settings:
            entry = claim["settings"].get(setting)
            if entry is None:
                cells.append("—")
                reference.append("—")
                continue
            pp = entry["difference_pp"]
            cells.append(f"{pp['mean']:+.1f} [{pp['low']:+.1f}, {pp['high']:+.1f}]: **{entry['verdict']}**")
            other = entry.get("against_original")
            reference.append("—" if other is None else
                             "{mean:+.1f} [{low:+.1f}, {high:+.1f}]".format(**other["difference_pp"]))
        lines.append(f"| {claim['claim']} | " + " | ".join(cells + reference) + " |")
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    """The whole report.md, from the report's record (:func:`scripts.evaluate.evaluate`)."""
    summary, protocol = summary_of(report), report["protocol"]
    count = report["bars_tested"]
    parts = ["# Head-to-head: judgment memory vs k-NN retrieval", "",
             f"{len(protocol['report_seeds'])} report seeds ({seed_range(protocol['report_seeds'])}) x "
             f"{protocol['n_decisions']} decisions, drift (where there is one) at decision {protocol['drift_at']}; "
             f"every figure is the mean over seeds with a 95% bootstrap CI ({protocol['resamples']} resamples "
             "over seeds). Abstentions count as wrong. The tuned k-NN contestants chose their capacity, k and "
             f"scope on the tuning seeds ({seed_range(protocol['tuning_seeds'])}), which no report figure uses. "
             "Protocol: docs/protocol.md.", "",
             f"{count['tested']} bars tested, {count['met']} met; {count['reported']} comparisons reported "
             "without a verdict (the claims and the standing table below are not counted).", "",
             "## The original claims", "", claims_table(report["claims"]), "",
             f"## Where the judgment memory stands against {report['standing']['against']}", "",
             standing_table(report["standing"]), ""]
    if report["drift_bars"]:
        parts += ["## Drift-aware judgment (`drift_mode='adaptive'`)", "", bars_table(report["drift_bars"]), "",
                  "Promotions per stream (mean [95% CI]); outliers spoil the shadows, "
                  "so they rarely win the change test, while a drift makes them right where the prototypes "
                  "are wrong (docs/drift.md):", "", promotions_table(summary), ""]
        for setting in ("shift", "gradual"):
            room = headroom(summary, setting)
            if room:
                parts += [f"Headroom in the {setting} setting at N=1,150 (ceiling minus k-NN): "
                          + ", ".join(f"{name} {value:.1f} pp" for name, value in room.items())
                          + (f": the +{MARGIN_PP:g} pp claim is out of reach of any memory there."
                             if max(room.values()) < MARGIN_PP else "."), ""]
    if report["prototype_bars"]:
        parts += ["## Several prototypes per action (`prototypes=4`)", "", bars_table(report["prototype_bars"]), "",
                  "Cost, multi-modal setting (docs/prototypes.md):", "", cost_table(summary, "multimodal"), ""]
    if report.get("recommended_bars"):
        parts += ["## The recommended configuration (`learning='lvq'`)", "", bars_table(report["recommended_bars"]),
                  ""]
    if report["sensitivity"]:
        parts += ["## k-NN sensitivity (tuning seeds)", "", "The points the tuned contestants chose:", "",
                  choices_table(report["sensitivity"]), ""]
        for setting in report["sensitivity"]:
            parts += [f"Plain k-NN in {setting}, cumulative accuracy (%) over the tuning seeds:", "",
                      sensitivity_table(report["sensitivity"], setting), ""]
    for setting in summary["metrics"]:
        parts += [f"## {setting}", "", headline_table(summary, setting), "",
                  "Ablations:", "", ablation_table(summary, setting), ""]
    variants = ", ".join(f"`{name}` = {variant.label}" for name, variant in VARIANTS.items())
    parts += [f"Ablation variants: {variants}.", ""]
    return "\n".join(parts)


def seed_range(seeds: list[int]) -> str:
    """``"seeds 100-119"`` for a contiguous list, else the list."""
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return f"seeds {seeds}"
