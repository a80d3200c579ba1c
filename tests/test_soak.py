"""The soak benchmark on a tiny stream: its record, its checks and its table (the real run is a script)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from scripts import soak as soak_script

SUMMARY_KEYS = {"rss_start", "rss_warm", "rss_end", "rss_peak", "warm_decisions", "rss_growth", "held_growth",
                "unexplained_growth", "unexplained_per_call", "rss_slope_per_decision", "flat", "log", "state_bytes",
                "state_constant_after_warm_up", "log_bytes", "event_log_bytes", "log_base_bytes", "audit_bytes",
                "finite", "state_dict"}
SAMPLE_KEYS = {"decisions", "rss", "rss_trimmed", "state_tensor_bytes", "log_bytes", "log_decisions", "log_calls",
               "log_formula", "event_log_bytes", "gate_events", "gate_log_bytes", "log_base_bytes", "audit_bytes",
               "state_dict_bytes"}


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("soak")
    doc = out / "soak.md"
    doc.write_text(f"# Soak\n\n{soak_script.START}\nstale table\n{soak_script.END}\n")
    with pytest.MonkeyPatch.context() as patch:  # a log bound the tiny stream reaches, so it folds
        patch.setitem(soak_script.MEMORIES, "jm_bounded", {**soak_script.MEMORIES["jm_bounded"],
                                                           "options": {"max_log_events": 1000}})
        soak_script.soak(n_decisions=3000, chunk=1000, sample_every=500, retrieval_decisions=200, workers=0,
                         out=out, doc=doc)
    return out, doc


def test_record_has_every_memory_and_every_sample(record):
    out, _ = record
    data = json.loads((out / "soak.json").read_text())
    assert set(data["memories"]) == set(soak_script.MEMORIES)
    assert data["formula"] == {"bytes_per_decision": 117, "bytes_per_call": 128}  # 53 + 8 K and 4 C K at K=8, C=4
    for name, entry in data["memories"].items():
        assert SUMMARY_KEYS == set(entry["summary"]), name
        assert SAMPLE_KEYS == set(entry["samples"]), name
        samples = entry["samples"]
        expected = 200 if name == "retrieval" else 3000
        assert entry["decisions"] == expected and samples["decisions"][0] == 0 and samples["decisions"][-1] == expected
        assert all(len(column) == len(samples["decisions"]) for column in samples.values())
        assert all(rss > 0 for rss in samples["rss"]) and entry["summary"]["rss_peak"] >= max(samples["rss"])
        assert entry["nonfinite"] == {"batches": 0, "first": None} and entry["summary"]["finite"], name
    assert (out / "soak.png").stat().st_size > 0


def test_decision_log_bytes_match_the_documented_cost(record):
    out, _ = record
    memories = json.loads((out / "soak.json").read_text())["memories"]
    for name, entry in memories.items():
        log = entry["summary"]["log"]
        if name == "river":  # a JudgmentMemory learning one decision a call: its calls are staged batches
            saved = entry["summary"]["state_dict"]
            assert log is not None and 0 < saved["bytes_warm"] <= saved["bytes_end"], saved
            assert all(size == 0 for size in memories["jm"]["samples"]["state_dict_bytes"])  # measured for river only
            continue
        if not name.startswith("jm"):
            assert log is None, name
            continue
        batch = entry["batch"]
        assert log["calls"] == math.ceil(log["decisions"] / batch)
        assert log["formula"] == 117 * log["decisions"] + 128 * log["calls"]
        assert log["ratio_range"][0] == pytest.approx(1.0) and log["ratio_range"][1] == pytest.approx(1.0), name
        assert log["gate_events"] > 0 and log["gate_log_bytes_per_event"] == 32  # the README's 5 numbers an event
    assert memories["jm"]["summary"]["log"]["decisions"] == 3000
    assert memories["jm_bounded"]["summary"]["log"]["decisions"] <= 1000  # folded into the base, not dropped
    assert memories["episodic"]["summary"]["audit_bytes"] > 0


def test_doc_section_is_refreshed(record):
    out, doc = record
    text = doc.read_text()
    assert "stale table" not in text and "| JudgmentMemory, seed rule | 3,000 |" in text
    assert (out / "figures" / "soak.png").exists()


def test_nonfinite_names_the_tensor():
    memory = JudgmentMemory(2, 2, 3, config=JudgmentConfig.seed())
    assert soak_script.nonfinite(memory) == []
    with torch.no_grad():
        memory.centroids[1, 0, 0, 2] = float("nan")  # (C, A, P, K)
        memory.criterion_logits[0, 0] = float("inf")
    assert soak_script.nonfinite(memory) == ["criterion_logits", "centroids"]


def test_open_validity_windows_are_not_flagged():
    memory = soak_script.build("episodic")
    memory.add(torch.ones(2, 8), 1.0)  # valid from -inf until inf by default
    assert soak_script.nonfinite(memory) == []


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown memories"):
        soak_script.soak(n_decisions=10, memories=["nope"], out=tmp_path)
    with pytest.raises(ValueError, match="batch=0"):
        soak_script.soak(n_decisions=10, batch=0, out=tmp_path)
