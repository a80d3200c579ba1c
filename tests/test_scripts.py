"""The scripts run end to end (small sizes) and say what they promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=True)


def test_demo_reports_both_memories():
    out = run_script("scripts/demo.py").stdout
    assert "JudgmentMemory" in out and "KNNMemory" in out
    assert "weighted distance to each prototype" in out and "gate events" in out


def test_bench_quick_writes_every_measurement(tmp_path):
    out_file = tmp_path / "bench.json"
    result = run_script("scripts/bench.py", "--quick", "--repeats", "1", "--no-readme", "--out", str(out_file))
    record = json.loads(out_file.read_text())
    for key in ("online_gae", "online_gae_adaptive", "online_gae_prototypes", "online_numpy", "online_torch",
                "batch_no_grad", "batch_grad", "score_one_us",
                "numpy_score_one_us", "online_knn"):
        assert key in record["results"], key
    assert record["results"]["agreement"]["numpy_vs_gae"]["allclose"]
    assert record["results"]["agreement"]["torch_vs_gae"]["allclose"]
    assert "| measurement | result | target | verdict |" in result.stdout
