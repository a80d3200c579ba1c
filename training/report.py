"""Turn per-seed figures of the head-to-head into confidence intervals, claim verdicts and a report.

Input: ``runs[setting][contestant]`` = a list (one entry per stream seed, same seeds for every
contestant) of the dicts made by :func:`training.evaluation.figures`. Everything here is
deterministic given those numbers (the bootstrap is seeded).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from training.evaluation import ABLATIONS, CLAIM_SETTINGS, CONTESTANTS, RECOVERY_AFTER, VARIANTS
from training.stats import Interval, bootstrap_ci, paired_difference, recovery_decisions

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
CEILING = "ceiling"  # the pseudo-contestant of evaluation.ceiling: nearest true prototype
CEILING_LABEL = "ceiling: nearest true prototype (Bayes rule, not a memory)"
ABLATION_METRIC = "cumulative"
# the original page's figures, in percentage points
ORIGINAL_AHEAD_AT_RECOVERY_POINT = 14.0
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


def interval(ci: Interval) -> dict[str, float]:
    return {"mean": float(ci.mean), "low": float(ci.low), "high": float(ci.high)}


def summarize(runs: dict[str, dict[str, list]], drift_at: int, n_decisions: int,
              resamples: int) -> dict[str, Any]:
    """CIs of every figure, of every difference between contestants, and of every ablation."""
    metrics: dict[str, Any] = {}
    differences: dict[str, Any] = {}
    ablations: dict[str, Any] = {}
    curves: dict[str, Any] = {}
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
    return {"metrics": metrics, "differences": differences, "ablations": ablations, "curves": curves}


def claims(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The original page's three claims, each with our paired difference and a verdict per setting.

    A claim is *reproduced* in a setting when the 95% CI of our difference excludes zero in the
    claimed direction; whether the original magnitude lies inside our CI is reported apart.
    """
    result = []
    specs = [
        ("Judgment memory has higher rolling accuracy than k-NN retrieval on the same stream",
         "higher", None, "mean_rolling"),
        (f"Judgment memory is +14 pp ahead of k-NN at N=1,150, {RECOVERY_AFTER} decisions after a drift",
         "+14 pp", ORIGINAL_AHEAD_AT_RECOVERY_POINT, "at_recovery_point"),
        ("Ablation, judgment memory present vs removed: +9.2 pp, 95% CI [+7.2, +11.3]",
         "+9.2 pp [+7.2, +11.3]", ORIGINAL_ABLATION[0], ABLATION_METRIC),
    ]
    for text, original, magnitude, key in specs:
        verdicts = {}
        for setting, pairs in summary["differences"].items():
            if "jm - knn" not in pairs or setting not in CLAIM_SETTINGS:
                continue
            ci = pairs["jm - knn"][key]
            pp = {name: 100 * ci[name] for name in ("mean", "low", "high")}
            verdicts[setting] = {
                "difference_pp": pp,
                "verdict": "reproduced" if ci["low"] > 0 else "not reproduced",
                "original_magnitude_inside_ci": None if magnitude is None else pp["low"] <= magnitude <= pp["high"],
            }
        result.append({"claim": text, "original": original, "comparison": "jm - knn", "metric": key,
                       "settings": verdicts})
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


# -- the bars of the drift-aware mode --------------------------------------------------------
def _difference(summary: dict[str, Any], setting: str, a: str, b: str, key: str) -> dict[str, float] | None:
    pairs = summary["differences"].get(setting, {})
    if f"{a} - {b}" in pairs:
        return pairs[f"{a} - {b}"][key]
    if f"{b} - {a}" in pairs:
        flipped = pairs[f"{b} - {a}"][key]
        return {"mean": -flipped["mean"], "low": -flipped["high"], "high": -flipped["low"]}
    return None


def _bar_adder(summary: dict[str, Any], bars: list[dict[str, Any]]):
    """``add(setting, text, a, b, key, margin=0, non_inferior=None)``: append the bar on the paired
    difference ``a - b`` (pp, 95% CI) when both ran. "ahead" means the CI's low end is above zero
    (and, where a margin is named, the mean is at least that margin); "within X pp of" is read
    as non-inferiority: the CI's low end above -X pp (being better does not fail it)."""

    def add(setting: str, text: str, a: str, b: str, key: str, margin: float = 0.0,
            non_inferior: float | None = None) -> None:
        ci = _difference(summary, setting, a, b, key)
        if ci is None:
            return
        pp = {name: 100 * value for name, value in ci.items()}
        met = pp["low"] > -non_inferior if non_inferior is not None else pp["low"] > 0 and pp["mean"] >= margin
        bars.append({"setting": setting, "bar": text, "comparison": f"{a} - {b}", "metric": key,
                     "value_pp": pp, "met": bool(met)})

    return add


def drift_bars(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The bars ``drift_mode='adaptive'`` is held to, each with its measured value and verdict
    (paired differences, read as in :func:`_bar_adder`)."""
    bars: list[dict[str, Any]] = []
    add = _bar_adder(summary, bars)

    at = "at_recovery_point"
    for knn in ("knn", "knn_scoped"):
        add("permute", f"ahead of {knn} by >= 14 pp at N=1,150", "jm_adaptive", knn, at, margin=14.0)
    metrics = summary["metrics"].get("permute", {})
    for knn in ("knn", "knn_scoped"):
        if "jm_adaptive" in metrics and knn in metrics:
            ours, theirs = (metrics[n]["recovery_decisions"]["mean"] for n in ("jm_adaptive", knn))
            bars.append({"setting": "permute", "bar": f"decisions to recover <= 1/3 of {knn}'s",
                         "comparison": f"jm_adaptive / {knn}", "metric": "recovery_decisions",
                         "ratio": ours / theirs, "value": {"jm_adaptive": ours, knn: theirs},
                         "met": bool(ours <= theirs / 3)})
    for other in ("knn", "knn_scoped", "jm"):
        add("shift", f"ahead of {other} at N=1,150", "jm_adaptive", other, at)
    add("none", "within 1 pp of the seed rule (cumulative)", "jm_adaptive", "jm", "cumulative", non_inferior=1.0)
    add("outliers", "within 1 pp of the seed rule (cumulative)", "jm_adaptive", "jm", "cumulative",
        non_inferior=1.0)
    add("outliers", "ahead of the ungated seed rule (cumulative)", "jm_adaptive", "jm_no_gate", "cumulative")
    add("outliers", "ahead of its shadow rule alone, ungated (cumulative)", "jm_adaptive", "jm_fast", "cumulative")
    for other in ("knn", "knn_scoped", "jm"):
        add("gradual", f"reported: vs {other} at N=1,150", "jm_adaptive", other, at)
    return _reported(bars)


def prototype_bars(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The bars ``prototypes=4`` is held to (cumulative accuracy, paired by seed), and what it
    does on scikit-learn's streams and under drift (reported, no bar)."""
    bars: list[dict[str, Any]] = []
    add = _bar_adder(summary, bars)
    key = "cumulative"
    add("multimodal", "within 2 pp of knn_scoped (cap 400)", "jm_prototypes", "knn_scoped", key, non_inferior=2.0)
    add("multimodal", "ahead of prototypes=1 by >= 20 pp", "jm_prototypes", "jm", key, margin=20.0)
    add("none", "within 1 pp of prototypes=1 (uni-modal)", "jm_prototypes", "jm", key, non_inferior=1.0)
    for setting in ("classification", "moons", "permute", "shift"):
        for other in ("knn_scoped", "jm"):
            add(setting, f"reported: vs {other}", "jm_prototypes", other, key)
    return _reported(bars)


def _reported(bars: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A comparison that is only reported has no verdict: its ``met`` is None."""
    for bar in bars:
        if bar["bar"].startswith("reported"):
            bar["met"] = None
    return bars


COST_CONTESTANTS = ("jm", "jm_prototypes", "knn", "knn_scoped")


def summary_of(report: dict[str, Any]) -> dict[str, Any]:
    """The parts of :func:`summarize` that a saved ``report.json`` keeps (all but the curves),
    which is all the tables need."""
    return {key: report[key] for key in ("metrics", "differences", "ablations")}


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
            for knn in ("knn", "knn_scoped") if knn in metrics}


def bars_table(bars: list[dict[str, Any]]) -> str:
    lines = ["| setting | bar | measured | verdict |", "|---|---|---|---|"]
    for bar in bars:
        if "ratio" in bar:
            (name, ours), (other, theirs) = bar["value"].items()
            value = f"{ours:.0f} vs {theirs:.0f} decisions (ratio {bar['ratio']:.2f})"
        else:
            pp = bar["value_pp"]
            value = f"{pp['mean']:+.1f} [{pp['low']:+.1f}, {pp['high']:+.1f}] pp"
        verdict = "reported" if bar["met"] is None else "**met**" if bar["met"] else "**not met**"
        lines.append(f"| {bar['setting']} | {bar['bar']} | {value} | {verdict} |")
    return "\n".join(lines)


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
    settings = sorted({s for claim in claim_list for s in claim["settings"]})
    lines = ["| original claim | " + " | ".join(f"ours, {s} drift (pp)" for s in settings) + " |",
             "|---" + "|---" * len(settings) + "|"]
    for claim in claim_list:
        cells = []
        for setting in settings:
            entry = claim["settings"].get(setting)
            if entry is None:
                cells.append("—")
                continue
            pp = entry["difference_pp"]
            cells.append(f"{pp['mean']:+.1f} [{pp['low']:+.1f}, {pp['high']:+.1f}]: **{entry['verdict']}**")
        lines.append(f"| {claim['claim']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(summary: dict[str, Any], claim_list: list[dict[str, Any]], protocol: dict[str, Any]) -> str:
    """The whole report.md."""
    parts = ["# Head-to-head: judgment memory vs k-NN retrieval", "",
             f"{protocol['seeds']} stream seeds x {protocol['n_decisions']} decisions, drift at decision "
             f"{protocol['drift_at']}; every figure is the mean over seeds with a 95% bootstrap CI "
             f"({protocol['resamples']} resamples over seeds). Abstentions count as wrong. Protocol: "
             "docs/protocol.md.", "", "## The original claims", "", claims_table(claim_list), ""]
    bars = drift_bars(summary)
    if bars:
        parts += ["## Drift-aware judgment (`drift_mode='adaptive'`)", "", bars_table(bars), "",
                  "Promotions per stream (mean [95% CI]); outliers spoil the shadows, "
                  "so they rarely win the change test, while a drift makes them right where the prototypes "
                  "are wrong (docs/drift.md):", "", promotions_table(summary), ""]
        for setting in ("shift", "gradual"):
            room = headroom(summary, setting)
            if room:
                parts += [f"Headroom in the {setting} setting at N=1,150 (ceiling minus k-NN): "
                          + ", ".join(f"{name} {value:.1f} pp" for name, value in room.items())
                          + (": the +14 pp claim is out of reach of any memory there."
                             if max(room.values()) < 14 else "."), ""]
    several = prototype_bars(summary)
    if several:
        parts += ["## Several prototypes per action (`prototypes=4`)", "", bars_table(several), "",
                  "Cost, multi-modal setting (docs/prototypes.md):", "", cost_table(summary, "multimodal"), ""]
    for setting in summary["metrics"]:
        parts += [f"## {setting}", "", headline_table(summary, setting), "",
                  "Ablations:", "", ablation_table(summary, setting), ""]
    variants = ", ".join(f"`{name}` = {variant.label}" for name, variant in VARIANTS.items())
    parts += [f"Ablation variants: {variants}.", ""]
    return "\n".join(parts)
