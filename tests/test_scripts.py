"""The scripts run end to end (small sizes) and say what they promise."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=True)


def test_demo_labels_each_memory_and_ends_with_its_conclusion():
    out = run_script("scripts/demo.py", "--decisions", "400").stdout
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()
            if line.startswith(("gae judgment, ", "k-NN (k=5")) and line.split()[-1].replace(",", "").isdigit()}
    assert list(rows) == ["gae judgment, recommended", "gae judgment, seed rule", "k-NN (k=5, last 400)"]
    assert "JudgmentConfig.recommended(), the default" in out and "config=JudgmentConfig.seed()" in out
    assert "each action's probability when the decision was scored" in out and "its gate damped" in out
    accuracy = {name: float(row[-6]) for name, row in rows.items()}  # the accuracy column, as the table prints it
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("In short: on 400 decisions, gae's recommended judgment was right")
    said = [float(value) for value in re.findall(r"(\d+\.\d)%", last)]  # recommended, k-NN, seed rule
    shown = [100 * accuracy[name] for name in ("gae judgment, recommended", "k-NN (k=5, last 400)",
                                               "gae judgment, seed rule")]
    assert all(abs(a - b) <= 0.051 for a, b in zip(said, shown, strict=True))  # the table's figures, rounded


def test_a_scripts_option_is_never_abbreviated():
    refused = subprocess.run([sys.executable, "scripts/demo.py", "--decis", "400"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2 and "unrecognized option --decis; did you mean --decisions?" in refused.stderr
    assert refused.stdout == ""  # nothing ran


def test_bench_quick_writes_every_measurement(tmp_path):
    out_file = tmp_path / "bench.json"
    result = run_script("scripts/bench.py", "--quick", "--repeats", "1", "--no-readme", "--out", str(out_file))
    record = json.loads(out_file.read_text())
    for key in ("online_gae", "online_gae_adaptive", "online_gae_prototypes", "online_numpy", "online_torch",
                "batch_no_grad", "batch_grad", "score_one_us",
                "numpy_score_one_us", "online_knn", "trace"):
        assert key in record["results"], key
    trace = record["results"]["trace"]
    assert trace["lines_per_seed"] > 0 and set(trace["overhead"]) >= {"jm", "knn", "retrieval"}
    assert record["results"]["agreement"]["numpy_vs_gae"]["allclose"]
    assert record["results"]["agreement"]["torch_vs_gae"]["allclose"]
    assert "| measurement | result | target | verdict |" in result.stdout


@pytest.mark.slow  # the revision's kernels compile from nothing: a minute and a half on a 2-core machine
@pytest.mark.skipif(subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0,
                    reason="needs the checkout's git history")
def test_bench_against_times_this_checkout_beside_a_revision():
    out = run_script("scripts/bench_against.py", "--rev", "HEAD", "--decisions", "400", "--repeats", "1",
                     "--memories", '["gae judgment, seed", "gae retrieval"]').stdout
    assert "against HEAD" in out
    lines = [line for line in out.splitlines() if line.startswith("gae ")]
    assert [line.split(" p50")[0].strip() for line in lines] == ["gae judgment, seed", "gae retrieval"]
    assert all(float(line.rsplit("ratio ", 1)[1]) > 0 for line in lines)
    refused = subprocess.run([sys.executable, "scripts/bench_against.py", "--rev", "HEAD", "--memories", '["nope"]'],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "unknown ['nope']" in refused.stderr


def test_prototype_sweep_writes_its_table(tmp_path):
    out = tmp_path / "sweep.md"
    run_script("scripts/sweep_prototypes.py", "--seeds", "1", "--n_decisions", "300", "--workers", "2",
               "--out", str(out))
    lines = out.read_text().splitlines()
    assert lines[0] == "| configuration | multimodal | none | classification | moons | permute |"
    assert len(lines) == 2 + 12 and lines[2].startswith("| KNNMemory scoped")
    for line in lines[2:]:
        values = [float(cell) for cell in line.strip("|").split("|")[1:]]
        assert len(values) == 5 and all(0.0 <= value <= 100.0 for value in values)


def test_bench_store_measures_every_store(tmp_path):
    pytest.importorskip("pgserver")
    out = tmp_path / "bench_store.json"
    run_script("scripts/bench_store.py", "--n", "600", "--dim", "16", "--repeats", "1", "--ef_search", "[10,40]",
               "--out", str(out))
    record = json.loads(out.read_text())
    assert {"add_index", "add_sqlite", "add_postgres", "latency_ms", "recall_curve", "recall_default"} <= set(record)
    assert set(record["latency_ms"]) == {"tensor index", "SQLite (exact, in process)", "Postgres exact",
                                         "Postgres HNSW"}
    assert record["postgres_exact_equals_index"] == 1.0  # the server's exact ranking is the tensor index's
    assert [row["ef_search"] for row in record["recall_curve"]] == [10, 40]
    assert all(0.0 <= row["similarity_recall_at_5"] <= 1.0 for row in record["recall_curve"])


def test_inspect_memory_reads_a_state_dict(tmp_path):
    import torch

    from gae import JudgmentConfig, JudgmentMemory
    from training.streams import DecisionStream

    stream = DecisionStream(400, categories=["invoice", "refund"], actions=["approve", "reject"], factors=3,
                            informative=2, seed=1)
    memory = JudgmentMemory(stream.category_names, stream.action_names, stream.factor_names,
                            config=JudgmentConfig.seed(), prototypes=2)
    data = stream.tensors()
    memory.learn_(data.x, data.category, data.action, skip=data.skip)
    path = tmp_path / "memory.pt"
    torch.save(memory.state_dict(), path)
    out = run_script("scripts/inspect_memory.py", str(path), "--category", "refund", "--explain", "0.2,0.5,0.9",
                     "--trace", "refund,approve").stdout
    assert "## refund" in out and "## invoice" not in out and "approve [0]" in out
    assert "decision 0 (refund): recommends" in out and "the decisions that shaped refund/approve most" in out
    bad = tmp_path / "bad.pt"
    bad.write_bytes(path.read_bytes()[:100])  # truncated
    failed = subprocess.run([sys.executable, "scripts/inspect_memory.py", str(bad)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert failed.returncode != 0 and "not a loadable checkpoint" in failed.stderr


def test_inspect_memory_reads_a_lightning_checkpoint(tmp_path):
    from tests.test_training import SMALL, fit

    cli = fit(tmp_path, *SMALL, "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
              "--trainer.callbacks.save_last=true")
    checkpoint = next(Path(cli.trainer.logger.log_dir).rglob("last.ckpt"), None) or next(tmp_path.rglob("*.ckpt"))
    out = run_script("scripts/inspect_memory.py", str(checkpoint), "--events", "2").stdout
    assert "400 decisions learned, 400 in the decision log" in out and "## invoice" in out


def test_inspect_memory_lists_the_events_asked_for_as_a_table(tmp_path):
    import torch

    from gae import JudgmentConfig, JudgmentMemory
    from scripts.inspect_memory import main
    from training.streams import DecisionStream

    stream = DecisionStream(300, categories=["invoice"], actions=["approve", "reject"], factors=3, informative=2,
                            seed=2)
    memory = JudgmentMemory(stream.category_names, stream.action_names, stream.factor_names,
                            config=JudgmentConfig.seed(), drift_threshold=0.05)
    data = stream.tensors()
    memory.learn_(data.x, data.category, data.action, skip=data.skip)
    path = tmp_path / "memory.pt"
    torch.save(memory.state_dict(), path)
    total = len(memory.gate_records())
    assert total > 3
    none = main([str(path), "--events", "0"]).splitlines()
    assert none[-1] == f"{total} learning events (gate, promotions, recycles); the last 0"
    table = main([str(path), "--events", "3"]).splitlines()[-4:]
    assert table[0].split() == list(dict.fromkeys(k for r in memory.gate_records()[-3:] for k in r))
    for line, record in zip(table[1:], memory.gate_records()[-3:], strict=True):  # rounded, one event a row
        assert f"{record['eta']:.4g}" in line.split() and f"{record['disp']:.4g}" in line.split()
    failed = subprocess.run([sys.executable, "scripts/inspect_memory.py", str(path), "--events", "-1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and "--events" in failed.stderr and "'-1'" in failed.stderr


def test_scaling_on_a_tiny_grid(tmp_path):
    run_script("scripts/scaling.py", "--grid", "[10,60]", "--seeds", "2", "--workers", "1", "--resamples", "50",
               "--memories", "[jm,jm_prototypes,knn,retrieval]", "--retrieval_max", "10", "--out", str(tmp_path))
    record = json.loads((tmp_path / "scaling.json").read_text())
    assert set(record) >= {"grid", "memories", "settings", "results"} and record["grid"] == [10, 60]
    assert set(record["results"]) == {"unimodal", "multimodal"}
    unimodal = record["results"]["unimodal"]
    assert set(unimodal["jm"]) == {"10", "60"} and set(unimodal["retrieval"]) == {"10"}  # capped by retrieval_max
    for entry in unimodal["jm"].values():
        assert entry["accuracy"]["low"] <= entry["accuracy"]["mean"] <= entry["accuracy"]["high"]
        assert entry["bytes"] == 792 and entry["latency_us"] > 0
    assert (tmp_path / "scaling.png").stat().st_size > 0
