"""The bars the judgment memory's modes are held to, judged against the strongest baselines.

Every bar is a paired comparison by seed with a 95% bootstrap CI, against ``knn_best`` (k-NN
with the capacity, k and scope chosen per setting on the tuning seeds) and, for the drift
bars, ``knn_adwin`` (k-NN whose window ADWIN cuts) too. The original design's k-NN (capacity
200) is printed next to them, with no verdict. How a bar is read:

- "ahead of X (by >= m pp on average)": the CI's low end above zero, and the mean at least m;
- "no worse than X pp below Y" (non-inferiority): the CI's low end above -X pp; being better
  does not fail it;
- "recovers in at most a third of X's decisions": the ratio of mean recovery times, with a
  paired bootstrap CI whose high end is at most 1/3 (an infinite end, None in the record, is
  a k-NN that never needed a decision);
- "reported": no verdict (``met`` is None).

Input is :func:`training.report.summarize`'s summary (or the parts a saved report keeps). A bar
whose comparator did not run (left out of ``--contestants``) is left out, and so not counted.
"""

from __future__ import annotations

from typing import Any

from training.evaluation import CONTESTANTS, RECOVERY_AFTER, SETTINGS

STRONGEST = ("knn_best", "knn_adwin")  # every drift bar is judged against both
ORIGINAL = "knn"  # the original design's baseline (capacity 200): printed, no verdict
MARGIN_PP = 14.0  # the original page's "+14 pp at N=1,150", 150 decisions after its drift
AT = "at_recovery_point"


def drift_kind(setting: str) -> str:
    """What a setting's stream does at its middle: ``'permute'`` (the labels or prototypes
    permute at once), ``'shift'``, ``'gradual'``, ``'outliers'``, ``'rotating'`` (a boundary
    that turns all along) or ``'none'``."""
    options = SETTINGS[setting]
    if options.get("permute") or options.get("drift_kind") == "permute" and "drift_duration" not in options:
        return "permute"
    if options.get("drift_kind") == "shift":
        return "shift"
    if "drift_duration" in options:
        return "gradual"
    if "outliers" in options:
        return "outliers"
    if options.get("sklearn") == "rotating":
        return "rotating"
    return "none"


def labelled(name: str) -> str:
    """A k-NN contestant's name with its capacity, e.g. ``knn (cap 200)``, for the comparisons
    printed against the original's baseline."""
    return f"{name} (cap {CONTESTANTS[name].options['capacity']})"


def difference(summary: dict[str, Any], setting: str, a: str, b: str, key: str) -> dict[str, float] | None:
    pairs = summary["differences"].get(setting, {})
    if f"{a} - {b}" in pairs:
        return pairs[f"{a} - {b}"][key]
    if f"{b} - {a}" in pairs:
        flipped = pairs[f"{b} - {a}"][key]
        return {"mean": -flipped["mean"], "low": -flipped["high"], "high": -flipped["low"]}
    return None


class _Bars:
    """Collects the bars of one contestant (``a``), each appended when both sides ran."""

    def __init__(self, summary: dict[str, Any], a: str) -> None:
        self.summary, self.a = summary, a
        self.bars: list[dict[str, Any]] = []

    def paired(self, setting: str, text: str, b: str, key: str, *, margin: float = 0.0,
               no_worse_than: float | None = None, reported: bool = False) -> None:
        ci = difference(self.summary, setting, self.a, b, key)
        if ci is None:
            return
        pp = {name: 100 * value for name, value in ci.items()}
        met = pp["low"] > -no_worse_than if no_worse_than is not None else pp["low"] > 0 and pp["mean"] >= margin
        self.bars.append({"setting": setting, "bar": text, "comparison": f"{self.a} - {b}", "metric": key,
                          "value_pp": pp, "met": None if reported else bool(met)})

    def recovery(self, setting: str, b: str, *, reported: bool = False) -> None:
        ratio = self.summary.get("recovery_ratios", {}).get(setting, {}).get(f"{self.a} / {b}")
        if ratio is None:
            return
        metrics = self.summary["metrics"][setting]
        ours, theirs = (metrics[name]["recovery_decisions"]["mean"] for name in (self.a, b))
        self.bars.append({"setting": setting, "bar": ("reported: " if reported else "")
                          + f"decisions to recover <= 1/3 of {b}'s", "comparison": f"{self.a} / {b}",
                          "metric": "recovery_decisions", "ratio": ratio, "value": {self.a: ours, b: theirs},
                          "met": None if reported else ratio["high"] is not None and ratio["high"] <= 1 / 3})


def drift_bars(summary: dict[str, Any], subject: str = "jm_adaptive") -> list[dict[str, Any]]:
    """The bars ``drift_mode='adaptive'`` (or ``subject``) is held to in every setting, by the
    setting's :func:`drift_kind`, each with its measured value and verdict. The outlier bars
    against the gate's ablations are the adaptive mode's own."""
    bars = _Bars(summary, subject)
    at_n = f"{RECOVERY_AFTER} decisions after the drift"
    for setting in summary["metrics"]:
        kind = drift_kind(setting)
        if kind == "permute":
            for b in STRONGEST:
                bars.paired(setting, f"ahead of {b}, by >= {MARGIN_PP:g} pp on average, {at_n}", b, AT,
                            margin=MARGIN_PP)
            bars.paired(setting, f"reported: vs {labelled(ORIGINAL)} {at_n}", ORIGINAL, AT, reported=True)
            for b in STRONGEST:
                bars.recovery(setting, b)
            bars.recovery(setting, ORIGINAL, reported=True)
        elif kind == "shift":
            for b in (*STRONGEST, "jm"):
                bars.paired(setting, f"ahead of {b} {at_n}", b, AT)
            bars.paired(setting, f"reported: vs {labelled(ORIGINAL)} {at_n}", ORIGINAL, AT, reported=True)
        elif kind in ("gradual", "rotating"):
            key, where = (AT, at_n) if kind == "gradual" else ("cumulative", "(cumulative)")
            for b in (*STRONGEST, "jm"):
                bars.paired(setting, f"reported: vs {b} {where}", b, key, reported=True)
        else:  # no drift: what being drift-aware costs
            bars.paired(setting, "no worse than 1 pp below the seed rule (cumulative)", "jm", "cumulative",
                        no_worse_than=1.0)
            if kind == "outliers" and subject == "jm_adaptive":
                bars.paired(setting, "ahead of the ungated seed rule (cumulative)", "jm_no_gate", "cumulative")
                bars.paired(setting, "ahead of its shadow rule alone, ungated (cumulative)", "jm_fast", "cumulative")
            bars.paired(setting, "reported: vs knn_best (cumulative)", "knn_best", "cumulative", reported=True)
    return bars.bars


def prototype_bars(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The bars ``prototypes=4`` is held to (cumulative accuracy, paired by seed), and what it
    does in the other settings against ``knn_best`` and one prototype (reported, no verdict)."""
    bars = _Bars(summary, "jm_prototypes")
    key = "cumulative"
    bars.paired("multimodal", "no worse than 2 pp below knn_best", "knn_best", key, no_worse_than=2.0)
    bars.paired("multimodal", f"reported: vs {labelled('knn_scoped')}", "knn_scoped", key, reported=True)
    bars.paired("multimodal", "ahead of prototypes=1 by >= 20 pp", "jm", key, margin=20.0)
    bars.paired("none", "no worse than 1 pp below prototypes=1 (uni-modal)", "jm", key, no_worse_than=1.0)
    for setting in summary["metrics"]:
        if setting not in ("multimodal", "none"):
            for other in ("knn_best", "jm"):
                bars.paired(setting, f"reported: vs {other}", other, key, reported=True)
    return bars.bars


RECOMMENDED = "jm_recommended"  # JudgmentConfig.recommended(): the default of JudgmentMemory, gae.river, gae.sklearn


def recommended_bars(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The bars the recommended configuration is held to: the drift bars (:func:`drift_bars`,
    against ``knn_best`` and ``knn_adwin``; without drift, no worse than 1 pp below the seed rule)
    and the multimodal bar (no worse than 2 pp below ``knn_best``)."""
    bars = drift_bars(summary, RECOMMENDED)
    multimodal = _Bars(summary, RECOMMENDED)
    multimodal.paired("multimodal", "no worse than 2 pp below knn_best", "knn_best", "cumulative", no_worse_than=2.0)
    return bars + multimodal.bars


def count(*tables: list[dict[str, Any]]) -> dict[str, int]:
    """How many bars were tested (have a verdict), how many were met, and how many are only reported."""
    bars = [bar for table in tables for bar in table]
    return {"tested": sum(bar["met"] is not None for bar in bars), "met": sum(bar["met"] is True for bar in bars),
            "reported": sum(bar["met"] is None for bar in bars)}


STANDING = ("jm", "jm_adaptive", "jm_prototypes", RECOMMENDED)


def standing(summary: dict[str, Any], against: str = "knn_best", key: str = "cumulative") -> dict[str, Any]:
    """Per setting, each judgment contestant minus ``against`` (pp, paired 95% CI) with a plain
    word: ``'ahead'`` (CI above zero), ``'behind'`` (CI below zero) or ``'tied'``."""
    result: dict[str, Any] = {}
    for setting in summary["metrics"]:
        for name in STANDING:
            ci = difference(summary, setting, name, against, key)
            if ci is None:
                continue
            pp = {part: 100 * value for part, value in ci.items()}
            word = "ahead" if pp["low"] > 0 else "behind" if pp["high"] < 0 else "tied"
            result.setdefault(setting, {})[name] = {"value_pp": pp, "standing": word}
    return {"against": against, "metric": key, "settings": result}


def standing_table(record: dict[str, Any]) -> str:
    """Markdown: the :func:`standing` record, one row per setting."""
    names = [name for name in STANDING if any(name in entry for entry in record["settings"].values())]
    lines = ["| setting | " + " | ".join(f"{name} - {record['against']} (pp)" for name in names) + " |",
             "|---" + "|---:" * len(names) + "|"]
    for setting, entry in record["settings"].items():
        cells = []
        for name in names:
            if name not in entry:
                cells.append("—")
                continue
            pp, word = entry[name]["value_pp"], entry[name]["standing"]
            text = f"{pp['mean']:+.1f} [{pp['low']:+.1f}, {pp['high']:+.1f}]"
            cells.append(f"{text} **{word}**" if word == "behind" else f"{text} {word}")
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    behind = sum(entry["standing"] == "behind" for per in record["settings"].values() for entry in per.values())
    total = sum(len(per) for per in record["settings"].values())
    return "\n".join(lines) + f"\n\nBehind {record['against']} in {behind} of {total} comparisons."


def bars_table(bars: list[dict[str, Any]]) -> str:
    lines = ["| setting | bar | measured | verdict |", "|---|---|---|---|"]
    for bar in bars:
        if "ratio" in bar:
            (_, ours), (_, theirs) = bar["value"].items()
            low, mean, high = ("inf" if bar["ratio"][key] is None else f"{bar['ratio'][key]:.2f}"
                               for key in ("low", "mean", "high"))
            value = f"{ours:.0f} vs {theirs:.0f} decisions (ratio {mean} [{low}, {high}])"
        else:
            pp = bar["value_pp"]
            value = f"{pp['mean']:+.1f} [{pp['low']:+.1f}, {pp['high']:+.1f}] pp"
        verdict = "reported" if bar["met"] is None else "**met**" if bar["met"] else "**not met**"
        lines.append(f"| {bar['setting']} | {bar['bar']} | {value} | {verdict} |")
    return "\n".join(lines)
