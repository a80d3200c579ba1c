"""The sections of docs/ that the head-to-head writes, each rendered from its record.

``scripts/evaluate.py --readme docs/head_to_head.md`` writes them from the report it measured, and
``tests/test_generated_docs.py`` renders them again from the committed record,
``docs/results/report.json``; each is a pure function of that record.
"""

from __future__ import annotations

from typing import Any

from training import bars as B
from training import evaluation as E
from training import report as R
from training import tuning as T


def _verdict_bars(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The bars with a verdict (docs/head_to_head.md shows these; the topical pages show the reported ones too)."""
    return [bar for bar in report["drift_bars"] + report["prototype_bars"] + report.get("recommended_bars", [])
            if bar["met"] is not None]


def _count(report: dict[str, Any]) -> str:
    count = report["bars_tested"]
    return (f"{count['tested']} bars tested, {count['met']} met, {count['tested'] - count['met']} not met "
            f"({count['reported']} further comparisons reported without a verdict; the claims and the table "
            "above are tests of their own, not counted here).")


def _seeds(report: dict[str, Any]) -> str:
    protocol = report["protocol"]
    return (f"{len(protocol['report_seeds'])} report seeds ({R.seed_range(protocol['report_seeds'])}) x "
            f"{protocol['n_decisions']:,} decisions, mean [95% CI] over seeds; `knn_best` and `knn_adwin` chose "
            f"their capacity, k and scope per setting on the tuning {R.seed_range(protocol['tuning_seeds'])}")


def readme_section(report: dict[str, Any]) -> str:
    """docs/head_to_head.md's section, rendered from a ``report.json`` record."""
    summary, setting = R.summary_of(report), report["protocol"]["settings"][0]
    protocol = report["protocol"]
    took = (f"The whole run took {protocol['seconds'] / 60:.0f} minutes"
            + (f" in {protocol['workers']} processes on {protocol['cpus']} CPUs" if "workers" in protocol else ""))
    parts = [f"{_seeds(report)}. {took}. The original page's claims, judged against the strongest k-NN:",
             R.claims_table(report["claims"])]
    if report["standing"]["settings"]:
        parts += ["Where the judgment memory stands against `knn_best` (cumulative accuracy, paired by seed):",
                  B.standing_table(report["standing"])]
    if report["drift_bars"] or report["prototype_bars"]:
        parts += [f"The drift-aware mode (`drift_mode='adaptive'`, [drift.md](drift.md)), several prototypes per "
                  f"action (`prototypes=4`, [prototypes.md](prototypes.md)) and the recommended configuration "
                  f"(`learning='lvq'`, [lvq.md](lvq.md)) against their bars. {_count(report)} The comparisons "
                  "without a verdict are in [drift.md](drift.md#what-it-achieves), "
                  "[prototypes.md](prototypes.md#results) and [lvq.md](lvq.md#results).",
                  B.bars_table(_verdict_bars(report))]
    if "multimodal" in summary["metrics"]:
        parts += ["Cost in the multi-modal setting, from the same run:", R.cost_table(summary, "multimodal")]
    parts += [f"{setting} drift, mean [95% CI] over seeds:", R.headline_table(summary, setting),
              R.ablation_table(summary, setting), "![rolling accuracy](figures/rolling_accuracy.png)",
              "![ablations](figures/ablations.png)"]
    if report["sensitivity"]:
        parts += ["k-NN's accuracy over capacity and k on the tuning seeds (the choices and every table: "
                  "[protocol.md](protocol.md#the-k-nns-sensitivity)):", "![k-NN sensitivity](figures/sensitivity.png)"]
    return "\n\n".join([*parts, f"Regenerate with `{REGENERATE}`."])


def _provenance(report: dict[str, Any]) -> str:
    return (f"From the head-to-head's record (`docs/results/report.json`: {_seeds(report)}); "
            f"regenerate with `{REGENERATE}`.")


def drift_section(report: dict[str, Any]) -> str:
    """docs/drift.md's results: the adaptive mode's recovery, bars, promotions and the headroom."""
    summary, protocol = R.summary_of(report), report["protocol"]
    parts = [_provenance(report)]
    if "permute" in summary["metrics"]:
        columns = {key: R.METRICS[key][0] for key in ("before_drift", "at_recovery_point", "recovery_decisions")}
        parts += [f"Permute drift at decision {protocol['drift_at']:,}:",
                  R.figures_table(summary, "permute", ("jm", "jm_adaptive", "knn", "knn_scoped", "knn_best",
                                                       "knn_adwin", R.CEILING), columns)]
    if report["drift_bars"]:
        parts += ["The bars of `drift_mode='adaptive'`, paired differences by seed (recovery: the ratio of mean "
                  "recovery times with a paired bootstrap CI):", B.bars_table(report["drift_bars"]),
                  "Promotions per stream:", R.promotions_table(summary)]
    for setting in ("shift", "gradual"):
        room = R.headroom(summary, setting)
        if room:
            parts.append(f"Headroom in the {setting} setting at N={protocol['drift_at'] + E.RECOVERY_AFTER:,} "
                         "(ceiling minus k-NN): " + ", ".join(f"{name} {value:.1f} pp" for name, value in room.items())
                         + ".")
    return "\n\n".join(parts)


def prototypes_section(report: dict[str, Any]) -> str:
    """docs/prototypes.md's results: the bars of ``prototypes=4`` and the multi-modal setting's halves and cost."""
    summary, protocol = R.summary_of(report), report["protocol"]
    parts = [_provenance(report)]
    if report["prototype_bars"]:
        parts += ["The bars of `prototypes=4`, paired differences in cumulative accuracy by seed:",
                  B.bars_table(report["prototype_bars"])]
    if "multimodal" in summary["metrics"]:
        split, n = protocol["drift_at"], protocol["n_decisions"]
        columns = {"cumulative": "cumulative accuracy", "before_drift": f"accuracy, decisions 1-{split:,}",
                   "after_drift": f"accuracy, decisions {split + 1:,}-{n:,}",
                   "latency_us": R.METRICS["latency_us"][0], "state_bytes": R.METRICS["state_bytes"][0]}
        parts += ["Multi-modal setting (no drift):",
                  R.figures_table(summary, "multimodal", R.COST_CONTESTANTS, columns)]
    return "\n\n".join(parts)


def lvq_section(report: dict[str, Any]) -> str:
    """docs/lvq.md's results: the bars of ``JudgmentConfig.recommended()`` and where it stands."""
    summary, protocol = R.summary_of(report), report["protocol"]
    parts = [_provenance(report)]
    if report.get("recommended_bars"):
        parts += ["The bars of `JudgmentConfig.recommended()` (`jm_recommended`), paired differences by seed "
                  "(recovery: the ratio of mean recovery times with a paired bootstrap CI):",
                  B.bars_table(report["recommended_bars"])]
    if "permute" in summary["metrics"]:
        columns = {key: R.METRICS[key][0] for key in ("before_drift", "at_recovery_point", "recovery_decisions")}
        parts += [f"Permute drift at decision {protocol['drift_at']:,}:",
                  R.figures_table(summary, "permute", ("jm", "jm_adaptive", "jm_recommended", "knn_best",
                                                       "knn_adwin"), columns)]
    return "\n\n".join(parts)


def tuning_section(report: dict[str, Any]) -> str:
    """docs/protocol.md's results: the points ``knn_best`` and ``knn_adwin`` chose, and every
    setting's sensitivity table."""
    protocol, table = report["protocol"], report["sensitivity"]
    parts = [f"From the head-to-head's record (`docs/results/report.json`), tuning "
             f"{R.seed_range(protocol['tuning_seeds'])}, mean [95% CI] over them; regenerate with `{REGENERATE}`."]
    if table:
        parts += ["The points chosen (best mean cumulative accuracy over the tuning seeds):", T.choices_table(table),
                  "![k-NN sensitivity](figures/sensitivity.png)"]
        for setting in table:
            parts += [f"Plain k-NN in `{setting}`, cumulative accuracy (%) / rolling accuracy {E.RECOVERY_AFTER} "
                      "decisions after the middle (%), tuning seeds; the chosen point in bold:",
                      T.sensitivity_table(table, setting, metric="cumulative"),
                      T.sensitivity_table(table, setting, metric="at_recovery_point")]
    return "\n\n".join(parts)


DOC_SECTIONS = {"report-drift": ("drift.md", drift_section), "report-prototypes": ("prototypes.md", prototypes_section),
                "report-tuning": ("protocol.md", tuning_section), "report-lvq": ("lvq.md", lvq_section)}
REGENERATE = "python scripts/evaluate.py --readme docs/head_to_head.md"


