"""The head-to-head script: a small run produces every file, with the documented schema."""

from __future__ import annotations

import json

import pytest

from gae.traces.replay import replay
from scripts.evaluate import END, START, evaluate
from training import evaluation as E


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    readme = out / "README.md"
    readme.write_text(f"# title\n\n{START}\nold\n{END}\n\ntail\n")
    report = evaluate(seeds=2, n_decisions=300, resamples=50, out=out, readme=readme, trace=out / "trace.jsonl")
    return out, report


def test_every_file_is_written(small_report):
    out, _ = small_report
    for name in ("report.md", "report.json", "rolling_accuracy.png", "rolling_accuracy_shift.png",
                 "rolling_accuracy_outliers.png", "ablations.png"):
        assert (out / name).stat().st_size > 0, name
    assert list((out / "tensorboard" / "permute").rglob("events.out.tfevents.*"))
    assert list((out / "tensorboard" / "permute_adaptive").rglob("events.out.tfevents.*"))
    assert (out / "docs" / "figures" / "rolling_accuracy.png").exists()


def test_report_schema(small_report):
    out, report = small_report
    on_disk = json.loads((out / "report.json").read_text())
    assert set(on_disk) == {"protocol", "contestants", "metrics", "differences", "ablations", "claims",
                            "drift_bars", "prototype_bars", "trace"}
    assert on_disk["protocol"]["seeds"] == 2 and on_disk["protocol"]["drift_at"] == 150
    assert set(on_disk["contestants"]) == {*E.CONTESTANTS, *E.VARIANTS}
    assert set(on_disk["metrics"]) == set(E.SETTINGS)
    for setting in E.SETTINGS:
        for name in [n for n in E.CONTESTANTS if E.runs_in(n, setting)]:
            figures = on_disk["metrics"][setting][name]
            for key in ("cumulative", "before_drift", "after_drift", "at_recovery_point", "recovery_decisions",
                        "ece", "latency_us", "state_bytes"):
                low, mean, high = figures[key]["low"], figures[key]["mean"], figures[key]["high"]
                assert low <= mean <= high, (setting, name, key)
        assert len(on_disk["ablations"][setting]) == len(E.ABLATIONS)
        assert "jm - knn" in on_disk["differences"][setting]
        if not E.has_ceiling(setting):  # scikit-learn's streams do not know their true prototypes
            assert "ceiling" not in on_disk["metrics"][setting]
            continue
        ceiling = on_disk["metrics"][setting]["ceiling"]["cumulative"]["mean"]
        assert ceiling >= max(on_disk["metrics"][setting][name]["cumulative"]["mean"] for name in E.CONTESTANTS
                              if E.runs_in(name, setting)) - 0.05  # the Bayes rule, up to small-sample luck
    assert "retrieval" not in on_disk["metrics"]["none"] and "retrieval" in on_disk["metrics"]["permute"]
    assert len(on_disk["claims"]) == 3
    for claim in on_disk["claims"]:
        assert set(claim["settings"]) == set(E.CLAIM_SETTINGS)
        assert {entry["verdict"] for entry in claim["settings"].values()} <= {"reproduced", "not reproduced"}
    bars = on_disk["drift_bars"]
    assert {bar["setting"] for bar in bars} == {"permute", "shift", "gradual", "none", "outliers"}
    for bar in bars:
        assert (bar["met"] is None) == bar["bar"].startswith("reported") and bar["comparison"].startswith("jm_adaptive")
        assert bar["met"] is None or isinstance(bar["met"], bool)
        if "value_pp" in bar:
            assert bar["value_pp"]["low"] <= bar["value_pp"]["mean"] <= bar["value_pp"]["high"]
    promotions = [on_disk["metrics"][s]["jm_adaptive"]["promotions_after"]["mean"] for s in E.SETTINGS]
    assert all(p >= 0 for p in promotions) and on_disk["metrics"]["permute"]["jm"]["promotions_after"]["mean"] == 0
    several = on_disk["prototype_bars"]
    assert [bar["bar"] for bar in several if bar["met"] is not None] == [
        "within 2 pp of knn_scoped (cap 400)", "ahead of prototypes=1 by >= 20 pp",
        "within 1 pp of prototypes=1 (uni-modal)"]
    assert all(bar["comparison"].startswith("jm_prototypes") for bar in several)
    assert {bar["setting"] for bar in several} == {"multimodal", "none", "classification", "moons", "permute",
                                                  "shift"}
    sizes = {name: on_disk["metrics"]["multimodal"][name]["state_bytes"]["mean"] for name in ("jm", "jm_prototypes")}
    assert sizes["jm_prototypes"] > sizes["jm"] > 0  # four slots cost more, and every byte is counted


def test_trace_holds_every_decision_of_the_traced_seed_and_replays(small_report):
    out, report = small_report
    trace = report["trace"]
    records = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    decisions = [r for r in records if r["kind"] == "decision"]
    runs = {r["run"] for r in records if r["kind"] == "header"}
    memories = sum(E.runs_in(name, setting) for setting in E.SETTINGS for name in [*E.CONTESTANTS, *E.VARIANTS])
    assert len(runs) == memories and all(run.split("/")[1] == "0" for run in runs)  # seed 0 only
    assert len(decisions) == 300 * memories == trace["lines"] - len(runs) - sum(r["kind"] == "parameters"
                                                                                 for r in records)
    assert set(trace["overhead_by_contestant"]) == {*E.CONTESTANTS, *E.VARIANTS}
    assert not list((out / "trace.jsonl.checkpoints").glob("*.jsonl"))  # the parts were joined
    result = replay(out / "trace.jsonl", out / "trace.jsonl.checkpoints" / "permute-0-jm_attention.pt")
    assert result.ok and result.checked >= 300 and "permute/0/jm_attention" in result.runs


def test_state_bytes_counts_parameters_and_buffers():
    from gae import JudgmentMemory, KNNMemory

    memory = JudgmentMemory(4, 4, 8, prototypes=4)
    expected = 4 * (4 * 8) + 4 * (4 * 4 * 4 * 8) + (4 * 4 * 4) * (1 + 8 + 4) + 8  # logits, centroids, masks, num
    assert E.state_bytes(memory) == expected
    knn = KNNMemory(8, 4, categories=4, capacity=400)
    assert E.state_bytes(knn) >= 400 * 8 * 4  # the ring of stored decisions dominates


def test_readme_section_is_replaced(small_report):
    out, _ = small_report
    text = (out / "README.md").read_text()
    assert "old" not in text and "| original claim |" in text and text.endswith("tail\n")


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown names \\['sideways'\\]"):
        evaluate(seeds=2, n_decisions=300, settings=["sideways"], out=tmp_path)
