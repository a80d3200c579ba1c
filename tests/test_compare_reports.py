"""scripts/compare_reports.py: the check that a refactoring left the head-to-head unchanged."""

from __future__ import annotations

import copy
import json

from scripts.compare_reports import differences, main

REPORT = {"protocol": {"seeds": 20, "seconds": 63.1},
          "contestants": {"jm": {"options": {"tau": 0.1}}},
          "metrics": {"permute": {"jm": {"cumulative": {"mean": 0.45, "low": 0.44, "high": 0.46},
                                         "latency_us": {"mean": 3.0}}}},
          "drift_bars": [{"bar": "recovers", "value": 110.0, "met": True}]}


def test_identical_reports_have_no_difference_but_timings_and_descriptions_may_change(tmp_path):
    after = copy.deepcopy(REPORT)
    after["protocol"]["seconds"] = 70.0
    after["metrics"]["permute"]["jm"]["latency_us"]["mean"] = 4.0
    after["contestants"]["jm"]["options"]["win_decay"] = 0.05
    assert differences(REPORT, after) == []
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, report in zip(paths, (REPORT, after), strict=True):
        path.write_text(json.dumps(report))
    assert main([str(p) for p in paths]) == 0


def test_a_changed_accuracy_or_bar_is_named(tmp_path, capsys):
    after = copy.deepcopy(REPORT)
    after["metrics"]["permute"]["jm"]["cumulative"]["low"] = 0.43
    after["drift_bars"][0]["met"] = False
    assert differences(REPORT, after) == ["/drift_bars[0]/met: True -> False",
                                          "/metrics/permute/jm/cumulative/low: 0.44 -> 0.43"]
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, report in zip(paths, (REPORT, after), strict=True):
        path.write_text(json.dumps(report))
    assert main([str(p) for p in paths]) == 1
    assert "2 differences" in capsys.readouterr().out
