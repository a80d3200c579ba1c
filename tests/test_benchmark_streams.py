"""scripts/benchmark_streams.py: the record, its agreement with river's own harness, its errors and its section."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

river = pytest.importorskip("river")

from river import datasets, evaluate, metrics, naive_bayes, neighbors, preprocessing  # noqa: E402
from river.datasets import synth  # noqa: E402

from gae import JudgmentConfig  # noqa: E402
from gae.river import JudgmentClassifier  # noqa: E402
from scripts.benchmark_streams import NAME, ROOT, benchmark_streams, figure, section, verdicts  # noqa: E402
from training import river_suite  # noqa: E402
from training.readme import as_saved, markers, publish, sections  # noqa: E402

STREAMS = ["phishing", "sine_abrupt", "gae_permute"]  # a real data set, a ConceptDriftStream, a gae setting
MODELS = ["jm_recommended", "knn_400", "gnb"]
SEEDS = [200, 201]
N = 300


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    return benchmark_streams(out=out, n_samples=N, streams=STREAMS, models=MODELS, seeds=SEEDS, workers=1), out


def accuracy_of(record, model, stream, seed):
    (run,) = [r for r in record["runs"] if (r["model"], r["stream"], r["seed"]) == (model, stream, seed)]
    return run["accuracy"]


def test_record_has_the_documented_schema(short):
    record, out = short
    assert json.loads((out / "benchmark-streams.json").read_text()) == as_saved(record)
    assert (out / "benchmark-streams.png").stat().st_size > 10_000
    assert set(record) == {"protocol", "streams", "models", "runs", "results", "means", "verdicts", "machine",
                           "workers", "seconds"}
    assert record["protocol"]["n_samples"] == N and record["protocol"]["seeds"] == SEEDS
    assert list(record["streams"]) == STREAMS and list(record["models"]) == MODELS
    assert record["streams"]["phishing"]["seeds"] == [200] and record["streams"]["sine_abrupt"]["seeds"] == SEEDS
    assert record["streams"]["sine_abrupt"]["n"] == N
    assert 0.9 * N < record["streams"]["gae_permute"]["n"] < N  # the uncertain outcomes are left out
    assert len(record["runs"]) == (1 + 2 + 2) * len(MODELS)
    for run in record["runs"]:
        assert set(run) == {"model", "stream", "seed", "accuracy", "us_per_decision", "state_bytes", "log_bytes", "n"}
        assert 0 <= run["accuracy"] <= 100 and run["us_per_decision"] > 0 and run["state_bytes"] > 0
        assert (run["log_bytes"] > run["n"] * 4 * 4) == (run["model"] == "jm_recommended")  # x logged as float32
    for model in MODELS:
        per_stream = [np.mean([accuracy_of(record, model, stream, seed) for seed in record["streams"][stream]["seeds"]])
                      for stream in STREAMS]
        assert record["means"][model]["accuracy"] == pytest.approx(np.mean(per_stream), abs=1e-12)
    # the k-NN windows and ARF did not run: those targets are not judged; the others are
    assert [row["met"] is None for row in record["verdicts"]] == [True, True, False, False, False]


def test_accuracy_is_river_harness_on_the_documented_stream(short):
    """The slow, obvious reference: each stream and model written out by hand from docs/benchmarks.md."""
    record, _ = short
    phishing = list(datasets.Phishing().take(N))
    model = preprocessing.MinMaxScaler() | JudgmentClassifier()
    expected = evaluate.progressive_val_score(phishing, model, metrics.Accuracy()).get()
    assert accuracy_of(record, "jm_recommended", "phishing", 200) == 100 * expected

    sine = synth.ConceptDriftStream(stream=synth.Sine(0, seed=201), drift_stream=synth.Sine(1, seed=1201),
                                    position=N // 2, width=3, seed=201)  # width: 1% of the stream
    model = preprocessing.MinMaxScaler() | neighbors.KNNClassifier(n_neighbors=5,
                                                                   engine=neighbors.LazySearch(window_size=400))
    expected = evaluate.progressive_val_score(list(sine.take(N)), model, metrics.Accuracy()).get()
    assert accuracy_of(record, "knn_400", "sine_abrupt", 201) == 100 * expected

    expected = evaluate.progressive_val_score(list(sine.take(N)), naive_bayes.GaussianNB(), metrics.Accuracy()).get()
    assert accuracy_of(record, "gnb", "sine_abrupt", 201) == 100 * expected


def test_a_gae_setting_gives_gae_its_category_and_river_models_one_hot():
    gae_x, gae_y = river_suite.samples("gae_permute", 200, 20, "gae")[0]
    river_x, river_y = river_suite.samples("gae_permute", 200, 20, "river")[0]
    assert gae_y == river_y and isinstance(gae_x[river_suite.CATEGORY], str)
    assert {k: v for k, v in gae_x.items() if k != river_suite.CATEGORY} == \
        {k: v for k, v in river_x.items() if not str(k).startswith("category_")}
    assert sorted(v for k, v in river_x.items() if str(k).startswith("category_")) == [0.0, 0.0, 0.0, 1.0]
    memory_model = river_suite.build("jm_recommended", 200, "gae_permute")
    assert list(memory_model.steps.values())[-1].category == river_suite.CATEGORY
    assert list(river_suite.build("jm_recommended", 200, "phishing").steps.values())[-1].category is None


def test_a_rerun_gives_the_same_accuracies_in_a_process_pool(short, tmp_path):
    record, _ = short
    again = benchmark_streams(out=tmp_path, n_samples=N, streams=["sine_abrupt"], models=["jm_recommended", "gnb"],
                              seeds=SEEDS, workers=2)
    for run in again["runs"]:
        assert run["accuracy"] == accuracy_of(record, run["model"], run["stream"], run["seed"])


@pytest.mark.parametrize(("options", "argument"), [
    ({"streams": ["phishing", "no_such_stream"]}, "streams"),
    ({"streams": []}, "streams"),
    ({"models": ["knn_7"]}, "models"),
    ({"models": ["gnb", "gnb"]}, "models"),
    ({"n_samples": 0}, "n_samples"),
    ({"n_samples": 2.5}, "n_samples"),
    ({"seeds": []}, "seeds"),
    ({"seeds": [-1]}, "seeds"),
    ({"workers": 0}, "workers"),
])
def test_bad_arguments_name_the_argument(options, argument, tmp_path):
    with pytest.raises(ValueError, match=f"^{argument} ") as error:
        benchmark_streams(out=tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()  # refused before anything ran
    assert argument in str(error.value)


def test_a_readme_without_the_markers_is_refused_before_running(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no section here\n")
    with pytest.raises(ValueError, match="readme .* no benchmark-streams section"):
        benchmark_streams(out=tmp_path / "out", readme=readme)
    assert readme.read_text() == "# no section here\n"


def test_readme_section_is_replaced_between_its_markers(short, tmp_path):
    record, _ = short
    start, end = markers("benchmark-streams")
    readme = tmp_path / "README.md"
    readme.write_text(f"# head\n\nbefore\n{start}\nstale table\n{end}\n\nafter\n")
    publish(record, figure(as_saved(record)), section, tmp_path / "out", NAME, readme)
    text = readme.read_text()
    assert text.startswith("# head\n\nbefore\n") and text.endswith(f"{end}\n\nafter\n")
    assert sections(text)["benchmark-streams"] == section(as_saved(record))
    assert "stale table" not in text
    assert json.loads((tmp_path / "docs" / "results" / "benchmark-streams.json").read_text()) == as_saved(record)
    assert (tmp_path / "docs" / "figures" / "benchmark-streams.png").exists()


def fake(accuracy: dict[str, list[float]], state: dict[str, list[float]] | None = None,
         time: dict[str, float] | None = None):
    """Results and means of two streams from per-model accuracies (state and time default to 1)."""
    streams = ["a", "b"]
    results = {s: {m: {"accuracy": values[i], "state_bytes": (state or {}).get(m, [1.0, 1.0])[i],
                       "us_per_decision": (time or {}).get(m, 1.0)} for m, values in accuracy.items()}
               for i, s in enumerate(streams)}
    means = {m: {key: float(np.mean([results[s][m][key] for s in streams]))
                 for key in ("accuracy", "state_bytes", "us_per_decision")} for m in accuracy}
    return results, means


def test_verdicts_against_a_slow_reading_of_the_targets():
    accuracy = {"jm_recommended": [80.0, 70.0], "knn_100": [90.0, 60.0], "knn_400": [85.0, 65.0],
                "knn_1000": [70.0, 75.0], "arf": [75.0, 75.0]}
    results, means = fake(accuracy, state={"jm_recommended": [10.0, 20.0], "knn_400": [100.0, 100.0]},
                          time={"jm_recommended": 1.0, "knn_400": 3.0})
    rows = verdicts(results, means)
    best_knn = (90.0 + 75.0) / 2
    assert [row["value"] for row in rows] == [75.0, 75.0, -5.0, 0.2, 1 / 3]
    assert [row["bar"] for row in rows] == [best_knn, 75.0, -5.0, 0.1, 1 / 3]
    assert [row["met"] for row in rows] == [False, True, True, False, True]  # the bars themselves are met
    assert rows[2]["note"] == "worst: a" and rows[3]["note"] == "worst: b"
    accuracy["jm_recommended"] = [96.0, 70.0]
    results, means = fake(accuracy)
    assert [row["met"] for row in verdicts(results, means)][:3] == [True, True, True]
    results, means = fake({"jm_recommended": [1.0, 1.0], "arf": [1.0, 1.0]})
    assert [row["met"] for row in verdicts(results, means)] == [None, True, None, None, None]


def test_the_gae_models_are_the_presets_and_the_prototypes_variant():
    assert river_suite.GAE_CONFIGS == {"jm_recommended": JudgmentConfig.recommended(), "jm_seed": JudgmentConfig.seed(),
                                       "jm_adaptive": JudgmentConfig.seed().replace(drift_mode="adaptive"),
                                       "jm_prototypes": JudgmentConfig.seed().replace(prototypes=4)}
    for name, config in river_suite.GAE_CONFIGS.items():  # each model is built with its config
        assert river_suite.MODELS[name].make(0, None)._config == config


def test_the_command_line_runs_a_short_suite(tmp_path):
    command = [sys.executable, "scripts/benchmark_streams.py", "--n_samples", "60", "--streams", "[stagger]",
               "--models", "[gnb]", "--seeds", "[3]", "--workers", "1", "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| stagger |" in result.stdout
    record = json.loads((tmp_path / "benchmark-streams.json").read_text())
    assert [(r["model"], r["stream"], r["seed"], r["n"]) for r in record["runs"]] == [("gnb", "stagger", 3, 60)]
