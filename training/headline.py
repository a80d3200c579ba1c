"""The README's headline: the public benchmark and the head-to-head's verdicts in one table.

It is rendered by :func:`section`, a pure function of the two committed records
(``docs/results/benchmark-streams.json`` and ``docs/results/report.json``), and written by
:func:`publish_headline`, which ``scripts/benchmark_streams.py`` and ``scripts/evaluate.py`` call
after committing their record, so the headline never disagrees with the pages those scripts write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.readme import RESULTS, markers, replace_section, root_of

NAME = "headline"
SUBJECT = "jm_recommended"  # the recommended configuration, as both records name it
SEED_STREAMS, SEED_REPORT = "jm_seed", "jm"  # the seed rule in benchmark-streams.json and in report.json
RECORDS = ("benchmark-streams.json", "report.json")


def _standing(report: dict[str, Any], name: str) -> str:
    """``ahead in a, tied in t, behind in b`` over the settings of the head-to-head's standing table."""
    words = [entry[name]["standing"] for entry in report["standing"]["settings"].values() if name in entry]
    return ", ".join(f"{word} in {words.count(word)}" for word in ("ahead", "tied", "behind"))


def _cumulative(report: dict[str, Any], setting: str, name: str) -> str:
    figures = report["metrics"][setting][name]["cumulative"]
    return f"{figures['mean'] * 100:.1f}% [{figures['low'] * 100:.1f}, {figures['high'] * 100:.1f}]"


FORMATS = {"%": "{:.1f}%", "pp": "{:+.1f} pp", "x": "{:.3g}x",  # a verdict's value and bar, by its unit
           "moved": "{:.2f} pp"}


def _judged(row: dict[str, Any]) -> str:
    """A target with the value it was judged on and its bar: ``target (value; bar: bar)``."""
    value, bar = (FORMATS[row["unit"]].format(v) for v in (row["value"], row["bar"]))
    return f"{row['target']} ({value}; bar: {bar})"


def _targets(streams: dict[str, Any]) -> str:
    met = [_judged(row) for row in streams["verdicts"] if row["met"]]
    missed = [_judged(row) for row in streams["verdicts"] if row["met"] is False]
    return (f"{len(met)} of {len(met) + len(missed)} targets met" + (f" ({'; '.join(met)})" if met else "")
            + (f", not met: {'; '.join(missed)}" if missed else ""))


def section(streams: dict[str, Any], report: dict[str, Any]) -> str:
    """The headline section, from a ``benchmark-streams.json`` and a ``report.json`` record."""
    means, best_river = streams["means"], streams["best_river_mean"]
    reference = streams["protocol"]["knn_reference"]
    window = reference.removeprefix("knn_")
    claims = [verdict for claim in report["claims"] for verdict in claim["settings"].values()]
    reproduced = sum(verdict["verdict"] == "reproduced" for verdict in claims)
    bars = [bar for bar in report.get("recommended_bars", []) if bar["met"] is not None]
    protocol = report["protocol"]
    setting = protocol["settings"][0]
    rows = [
        "| | `JudgmentConfig.recommended()` | the seed rule, `JudgmentConfig()` | k-NN (public benchmark: and the "
        "best river model) |",
        "|---|---:|---:|---:|",
        (f"| public benchmark: mean accuracy over {len(streams['results'])} streams under river's harness | "
         f"{means[SUBJECT]['accuracy']:.1f}% | {means[SEED_STREAMS]['accuracy']:.1f}% | "
         f"{means[reference]['accuracy']:.1f}% (window {window}); the best river model per stream: "
         f"{best_river:.1f}% |"),
        (f"| public benchmark: mean state | {_kib(means[SUBJECT]['state_bytes'])} | "
         f"{_kib(means[SEED_STREAMS]['state_bytes'])} | {_kib(means[reference]['state_bytes'])} (window {window}) |"),
        (f"| head-to-head: settings where its cumulative accuracy is ahead of, tied with or behind the tuned k-NN "
         f"(`knn_best`), {len(report['standing']['settings'])} settings x {protocol['seeds']} seeds | "
         f"{_standing(report, SUBJECT)} | {_standing(report, SEED_REPORT)} | — |"),
        (f"| head-to-head: cumulative accuracy, {setting} drift at decision {protocol['drift_at']:,} | "
         f"{_cumulative(report, setting, SUBJECT)} | {_cumulative(report, setting, SEED_REPORT)} | "
         f"{_cumulative(report, setting, 'knn_best')} (`knn_best`) |"),
    ]
    return "\n".join([
        *rows, "",
        f"- Public benchmark, `JudgmentConfig.recommended()`: {_targets(streams)}.",
        f"- Head-to-head, `JudgmentConfig.recommended()`: {sum(bar['met'] for bar in bars)} of {len(bars)} bars met.",
        f"- The original page's claims, judged for the seed rule against `knn_best`: {reproduced} of {len(claims)} "
        "comparisons reproduced.",
        "",
        f"Rendered from `{RESULTS / RECORDS[0]}` and `{RESULTS / RECORDS[1]}`; "
        "[Public benchmark](docs/benchmarks.md#results) and [Head-to-head](docs/head_to_head.md) have the tables "
        "behind each figure."])


def _kib(value: float) -> str:
    return f"{value / 1024:,.1f} KiB" if value >= 1024 else f"{value:,.0f} B"


def render(results: Path) -> str:
    """:func:`section` of the records committed in the folder ``results``."""
    streams, report = (json.loads((results / name).read_text()) for name in RECORDS)
    return section(streams, report)


def publish_headline(doc: Path) -> bool:
    """Render the headline into the README of the checkout ``doc`` belongs to (``doc`` is the README
    or a page in ``docs/``), from the records committed there. False, writing nothing, when a record
    or the README's headline section is missing."""
    root = root_of(doc)
    results = root / RESULTS
    if not all((results / name).exists() for name in RECORDS):
        return False
    return replace_section(root / "README.md", *markers(NAME), render(results))
