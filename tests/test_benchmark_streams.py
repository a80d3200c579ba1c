"""scripts/benchmark_streams.py: the record, its agreement with river's own harness, its errors and its section."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

river = pytest.importorskip("river")

from river import datasets, evaluate, metrics, naive_bayes, neighbors, preprocessing, tree  # noqa: E402
from river.datasets import synth  # noqa: E402
from river.ensemble import LeveragingBaggingClassifier, SRPClassifier  # noqa: E402
from sklearn.datasets import load_wine  # noqa: E402

from gae import JudgmentConfig  # noqa: E402
from gae.river import JudgmentClassifier  # noqa: E402
from scripts.benchmark_streams import (  # noqa: E402
    BEST_RIVER,
    NAME,
    ROOT,
    benchmark_streams,
    best_river,
    families,
    figure,
    section,
    verdicts,
)
from training import river_suite  # noqa: E402
from training.readme import as_saved, markers, publish, sections  # noqa: E402

STREAMS = ["phishing", "wine", "sine_abrupt", "gae_permute"]  # river's and scikit-learn's real data, a
# ConceptDriftStream, a gae setting
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
    assert set(record) == {"protocol", "streams", "models", "runs", "results", "means", "best_river",
                           "best_river_mean", "families", "verdicts", "machine", "workers", "seconds", "reused",
                           "versions"}
    assert record["protocol"]["n_samples"] == N and record["protocol"]["seeds"] == SEEDS
    assert list(record["streams"]) == STREAMS and list(record["models"]) == MODELS
    assert record["streams"]["phishing"]["seeds"] == [200] and record["streams"]["sine_abrupt"]["seeds"] == SEEDS
    assert record["streams"]["wine"]["seeds"] == [200] and record["streams"]["wine"]["n"] == 178  # whole, once
    assert record["streams"]["sine_abrupt"]["n"] == N
    assert 0.9 * N < record["streams"]["gae_permute"]["n"] < N  # the uncertain outcomes are left out
    assert len(record["runs"]) == (1 + 1 + 2 + 2) * len(MODELS)
    for run in record["runs"]:
        assert set(run) == {"model", "stream", "seed", "accuracy", "us_per_decision", "state_bytes", "log_bytes", "n"}
        assert 0 <= run["accuracy"] <= 100 and run["us_per_decision"] > 0 and run["state_bytes"] > 0
        assert (run["log_bytes"] > run["n"] * 4 * 4) == (run["model"] == "jm_recommended")  # x logged as float32
    for model in MODELS:
        per_stream = [np.mean([accuracy_of(record, model, stream, seed) for seed in record["streams"][stream]["seeds"]])
                      for stream in STREAMS]
        assert record["means"][model]["accuracy"] == pytest.approx(np.mean(per_stream), abs=1e-12)
    # only knn_400 and gnb of the best river models ran: the accuracy targets are not judged, nor the invariance
    # (its fronts did not run); the others are
    assert [(row["name"], row["met"] is None) for row in record["verdicts"]] == [
        ("mean_vs_best_river", True), ("worst_gap", True), ("time_vs_knn_400", False), ("state_vs_knn_400", False),
        ("invariance_units", True), ("invariance_minmax", True), ("invariance_standard", True)]
    assert record["verdicts"][0]["note"] == "knn_100, knn_1000, hat, arf, srp did not run"
    for stream in STREAMS:  # the best among those that ran
        accuracies = {m: record["results"][stream][m]["accuracy"] for m in ("knn_400", "gnb")}
        assert record["best_river"][stream]["accuracy"] == max(accuracies.values())
        assert accuracies[record["best_river"][stream]["model"]] == max(accuracies.values())
    assert record["best_river_mean"] == pytest.approx(np.mean([b["accuracy"] for b in record["best_river"].values()]))


def test_the_record_gives_each_stream_its_family_and_the_means_per_family(short):
    record, _ = short
    assert {s: record["streams"][s]["family"] for s in STREAMS} == {
        "phishing": "real", "wine": "real", "sine_abrupt": "rules", "gae_permute": "gae"}
    assert list(record["families"]) == ["real", "rules", "gae"]  # in the order of the streams
    real = record["families"]["real"]
    assert real["streams"] == ["phishing", "wine"]
    assert real["subject_accuracy"] == pytest.approx(np.mean([record["results"][s]["jm_recommended"]["accuracy"]
                                                              for s in ("phishing", "wine")]), abs=1e-12)
    assert real["best_river_accuracy"] == pytest.approx(np.mean([record["best_river"][s]["accuracy"]
                                                                 for s in ("phishing", "wine")]), abs=1e-12)


def test_every_stream_has_a_family_of_the_documented_ones():
    documented = {"linear", "noisy prototypes", "rules", "fast drift", "multimodal", "real", "gae"}
    assert {spec.family for spec in river_suite.STREAMS.values()} == documented
    assert [s for s, spec in river_suite.STREAMS.items() if spec.family == "linear"] == ["hyperplane_slow",
                                                                                         "hyperplane_fast"]


def test_accuracy_is_river_harness_on_the_documented_stream(short):
    """The slow, obvious reference: each stream and model written out by hand from docs/benchmarks.md."""
    record, _ = short
    phishing = list(datasets.Phishing().take(N))
    model = JudgmentClassifier()  # no scaler: the recommended judgment is units-free
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

    features, labels = load_wine(return_X_y=True)  # the whole of it, shuffled with the first seed
    wine = [({f"f{k}": float(v) for k, v in enumerate(features[row])}, int(labels[row]))
            for row in np.random.default_rng(200).permutation(len(labels))]
    expected = evaluate.progressive_val_score(wine, naive_bayes.GaussianNB(), metrics.Accuracy()).get()
    assert accuracy_of(record, "gnb", "wine", 200) == 100 * expected


def test_a_scikit_learn_data_set_is_shuffled_by_its_seed_and_runs_once():
    features, labels = load_wine(return_X_y=True)
    first = river_suite.samples("wine", 200, 10_000, "river")
    assert first == river_suite.samples("wine", 200, 10_000, "river")  # deterministic for a seed
    assert first != river_suite.samples("wine", 201, 10_000, "river")  # another order for another seed
    order = np.random.default_rng(200).permutation(len(labels))
    assert first == [({f"f{k}": float(v) for k, v in enumerate(features[row])}, int(labels[row])) for row in order]
    assert [y for _, y in first] != sorted(y for _, y in first)  # the file's runs of one class are broken up
    assert all(type(y) is int and all(type(v) is float for v in x.values()) for x, y in first)
    assert river_suite.samples("wine", 200, 50, "river") == first[:50]
    assert river_suite.STREAMS["wine"].kind == "real" and river_suite.seeds_of("wine", [200, 201]) == [200]


def test_a_river_data_set_is_shuffled_only_when_asked():
    phishing = [(dict(x), y) for x, y in datasets.Phishing()]
    assert river_suite.samples("phishing", 7, 100, "river") == phishing[:100]  # as the benchmark reports it
    shuffled = river_suite.samples("phishing", 7, 10_000, "river", shuffled=True)
    assert shuffled == [phishing[row] for row in np.random.default_rng(7).permutation(len(phishing))]
    assert river_suite.samples("phishing", 7, 100, "river", shuffled=True) == shuffled[:100]
    assert river_suite.samples("sine_abrupt", 7, 50, "river", shuffled=True) == \
        river_suite.samples("sine_abrupt", 7, 50, "river")  # a generator's samples are its own order


def test_reuse_takes_river_runs_from_the_record_and_runs_gae_and_the_reference_again(short, tmp_path):
    record, out = short
    earlier = json.loads((out / "benchmark-streams.json").read_text())
    for run in earlier["runs"]:  # marked, so a run taken from the record shows
        run["accuracy"] = -1.0
    marked = tmp_path / "earlier.json"
    marked.write_text(json.dumps(earlier))
    again = benchmark_streams(out=tmp_path / "again", n_samples=N, streams=STREAMS, models=MODELS, seeds=SEEDS,
                              workers=1, reuse=marked)
    for run in again["runs"]:
        fresh = accuracy_of(record, run["model"], run["stream"], run["seed"])
        assert run["accuracy"] == (-1.0 if run["model"] == "gnb" else fresh), run
    assert again["reused"]["models"] == ["gnb"]
    assert again["reused"]["origins"] == [{"from": str(marked), "machine": record["machine"],
                                           "workers": record["workers"], "seconds": record["seconds"],
                                           "models": ["gnb"]}]
    assert again["reused"]["runs"] == sum(r["model"] == "gnb" for r in record["runs"])
    assert "taken from an earlier run's record" in section(as_saved(again))
    assert record["reused"] is None and "earlier run" not in section(as_saved(record))
    # reused again, the runs keep the origin of the run that measured them, not of the record that passed them on
    (tmp_path / "again.json").write_text(json.dumps(as_saved(again)))
    third = benchmark_streams(out=tmp_path / "third", n_samples=N, streams=STREAMS, models=MODELS, seeds=SEEDS,
                              workers=1, reuse=tmp_path / "again.json")
    assert third["reused"]["origins"] == again["reused"]["origins"]
    assert [r["accuracy"] for r in third["runs"]] == [r["accuracy"] for r in again["runs"]]


@pytest.mark.parametrize("change", ["n_samples", "model", "scaled", "stream", "protocol", "versions", "river"])
def test_reuse_leaves_a_run_whose_protocol_differs(short, change):
    import scripts.benchmark_streams as B

    record, _ = short
    earlier = json.loads(json.dumps(as_saved(record)))
    tasks = [("gnb", "sine_abrupt", 200, N)]
    assert B.reusable(earlier, tasks) == {tasks[0]: {key: next(
        r for r in record["runs"] if (r["model"], r["stream"], r["seed"]) == ("gnb", "sine_abrupt", 200))[key]
        for key in (*B.MEASURES, "n")}}
    if change == "n_samples":
        earlier["protocol"]["n_samples"] = N + 1
    elif change == "model":
        earlier["models"]["gnb"]["description"] = "another GaussianNB"
    elif change == "scaled":
        earlier["models"]["gnb"]["scaled"] = True
    elif change == "stream":
        earlier["streams"]["sine_abrupt"]["description"] = "another Sine"
    elif change == "protocol":
        earlier["protocol"]["warm_up"] += 1
    elif change == "versions":
        earlier["versions"]["scikit-learn"] = "0.0.0"
    else:  # a record from before the versions were kept: river's version from its machine line
        del earlier["versions"]
        assert B.reusable(earlier, tasks)
        earlier["machine"] = earlier["machine"].replace("river ", "river 0.0.0-")
    assert B.reusable(earlier, tasks) == {}


def test_reuse_refuses_what_is_not_a_record(tmp_path):
    (tmp_path / "notes.json").write_text('{"runs": []}')
    for path in (tmp_path / "missing.json", tmp_path / "notes.json"):
        with pytest.raises(ValueError, match="^reuse must be a benchmark-streams.json record"):
            benchmark_streams(out=tmp_path / "out", n_samples=N, streams=["wine"], models=["gnb"], reuse=path)
    assert not (tmp_path / "out").exists()


def test_srp_and_leveraging_bagging_are_built_unscaled_and_seeded():
    srp, lb = river_suite.build("srp", 3, "wine"), river_suite.build("lb", 3, "wine")
    assert isinstance(srp, SRPClassifier) and (srp.n_models, srp.seed) == (10, 3)
    assert isinstance(lb, LeveragingBaggingClassifier) and (lb.n_models, lb.seed) == (10, 3)
    assert isinstance(lb.model, tree.HoeffdingTreeClassifier)
    data = river_suite.samples("wine", 200, 40, "river")
    for model in (srp, lb):
        evaluate.progressive_val_score(data, model, metrics.Accuracy())
        assert model.predict_one(data[0][0]) in {0, 1, 2} and river_suite.model_bytes(model) > 0


def test_a_gae_setting_gives_gae_its_category_and_river_models_one_hot():
    gae_x, gae_y = river_suite.samples("gae_permute", 200, 20, "gae")[0]
    river_x, river_y = river_suite.samples("gae_permute", 200, 20, "river")[0]
    assert gae_y == river_y and isinstance(gae_x[river_suite.CATEGORY], str)
    assert {k: v for k, v in gae_x.items() if k != river_suite.CATEGORY} == \
        {k: v for k, v in river_x.items() if not str(k).startswith("category_")}
    assert sorted(v for k, v in river_x.items() if str(k).startswith("category_")) == [0.0, 0.0, 0.0, 1.0]
    for model in ("jm_recommended", "jm_seed", "jm_units"):  # with no scaler in front, and behind one
        built = river_suite.build(model, 200, "gae_permute")
        assert river_suite._classifier(built).category == river_suite.CATEGORY
        assert river_suite._classifier(river_suite.build(model, 200, "phishing")).category is None
        data = river_suite.samples("gae_permute", 200, 30, "gae")
        evaluate.progressive_val_score(data, built, metrics.Accuracy())  # the category passes every front by
        assert river_suite._classifier(built).memory.category_names is not None


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


def test_the_section_shows_each_stream_against_its_best_river_model_and_the_families(short):
    record, _ = short
    body = section(as_saved(record))
    for stream in STREAMS:
        best, mine = record["best_river"][stream], record["results"][stream]["jm_recommended"]["accuracy"]
        assert (f"| {stream} | {record['streams'][stream]['family']} | {mine:.1f} | `{best['model']}` | "
                f"{best['accuracy']:.1f} | {mine - best['accuracy']:+.1f} |") in body
    real = record["families"]["real"]
    assert (f"| real | phishing, wine | {real['subject_accuracy']:.1f} | {real['best_river_accuracy']:.1f} | "
            f"{real['subject_accuracy'] - real['best_river_accuracy']:+.1f} |") in body
    assert "| `mean_vs_best_river`: " in body and "not judged: knn_100, knn_1000, hat, arf, srp did not run" in body


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


# two streams: the best river model is knn_100 on a (90) and knn_1000 on b (75), never lb (99)
ACCURACY = {"jm_recommended": [80.0, 70.0], "knn_100": [90.0, 60.0], "knn_400": [85.0, 65.0],
            "knn_1000": [70.0, 75.0], "hat": [60.0, 60.0], "arf": [75.0, 74.0], "srp": [88.0, 72.0],
            "gnb": [50.0, 50.0], "lb": [99.0, 99.0]}


def test_the_best_river_model_leaves_lb_out():
    results, _ = fake(ACCURACY)
    assert best_river(results) == {"a": {"model": "knn_100", "accuracy": 90.0},
                                   "b": {"model": "knn_1000", "accuracy": 75.0}}
    assert "lb" not in BEST_RIVER and set(BEST_RIVER) < set(river_suite.MODELS)
    results, _ = fake({"gnb": [70.0, 70.0], "hat": [70.0, 80.0], "lb": [99.0, 99.0]})
    assert best_river(results) == {"a": {"model": "hat", "accuracy": 70.0},  # a tie: the first of BEST_RIVER
                                   "b": {"model": "hat", "accuracy": 80.0}}
    assert best_river(fake({"jm_recommended": [1.0, 1.0], "lb": [2.0, 2.0]})[0]) == {}


def test_families_are_the_means_over_their_streams():
    results = {s: {"jm_recommended": {"accuracy": value}} for s, value in (("a", 60.0), ("b", 70.0), ("c", 90.0))}
    best = {"a": {"model": "gnb", "accuracy": 64.0}, "b": {"model": "hat", "accuracy": 80.0},
            "c": {"model": "arf", "accuracy": 91.0}}
    streams = {"a": {"family": "x"}, "b": {"family": "y"}, "c": {"family": "x"}}
    assert families(streams, results, best) == {
        "x": {"streams": ["a", "c"], "subject_accuracy": 75.0, "best_river_accuracy": 77.5},
        "y": {"streams": ["b"], "subject_accuracy": 70.0, "best_river_accuracy": 80.0}}
    assert families(streams, results, {}, subject="jm_seed") == {
        "x": {"streams": ["a", "c"], "subject_accuracy": None, "best_river_accuracy": None},
        "y": {"streams": ["b"], "subject_accuracy": None, "best_river_accuracy": None}}


def test_verdicts_against_a_slow_reading_of_the_targets():
    results, means = fake(ACCURACY, state={"jm_recommended": [10.0, 30.0], "knn_400": [100.0, 300.0]},
                          time={"jm_recommended": 1.0, "knn_400": 2.0})
    rows = verdicts(results, means)
    assert [row["name"] for row in rows[4:]] == ["invariance_units", "invariance_minmax", "invariance_standard"]
    assert [row["met"] for row in rows[4:]] == [None, None, None]  # the fronts did not run
    rows = rows[:4]
    assert [row["name"] for row in rows] == ["mean_vs_best_river", "worst_gap", "time_vs_knn_400",
                                             "state_vs_knn_400"]
    assert [row["value"] for row in rows] == [75.0, -10.0, 0.5, 0.1]
    assert [row["bar"] for row in rows] == [82.5, -3.0, 0.5, 0.1]
    assert [row["unit"] for row in rows] == ["%", "pp", "x", "x"]
    assert [row["met"] for row in rows] == [False, False, True, True]  # the bars themselves are met
    assert [row["note"] for row in rows] == ["best: knn_100 on 1, knn_1000 on 1", "worst: a (knn_100)", "", ""]

    accuracy = {**ACCURACY, "jm_recommended": [88.0, 72.0]}  # 2 and 3 pp below the best: the bar met on b
    rows = verdicts(*fake(accuracy))
    assert [(row["value"], row["met"]) for row in rows[:2]] == [(80.0, False), (-3.0, True)]
    assert rows[1]["note"] == "worst: b (knn_1000)"
    accuracy = {**ACCURACY, "jm_recommended": [95.0, 70.0]}
    assert [(row["value"], row["met"]) for row in verdicts(*fake(accuracy))[:2]] == [(82.5, True), (-5.0, False)]
    rows = verdicts(*fake(ACCURACY, time={"jm_recommended": 1.01, "knn_400": 2.0},
                          state={"jm_recommended": [11.0, 30.0], "knn_400": [100.0, 300.0]}))
    assert [row["met"] for row in rows[2:4]] == [False, False]


def test_invariance_verdicts_against_a_slow_reading():
    """Each front's largest move from the subject's accuracy over the streams, against its bar (0.5 pp in
    random units, 1 pp behind either scaler); a move of exactly the bar meets it."""
    accuracy = {**ACCURACY, "jm_units": [80.5, 69.75], "jm_minmax": [81.0, 68.5], "jm_standard": [79.0, 70.0]}
    rows = {row["name"]: row for row in verdicts(*fake(accuracy))}
    assert (rows["invariance_units"]["value"], rows["invariance_units"]["bar"], rows["invariance_units"]["met"]) == \
        (0.5, 0.5, True)
    assert rows["invariance_units"]["note"] == "most: a"
    assert (rows["invariance_minmax"]["value"], rows["invariance_minmax"]["met"]) == (1.5, False)
    assert rows["invariance_minmax"]["note"] == "most: b"
    assert (rows["invariance_standard"]["value"], rows["invariance_standard"]["met"]) == (1.0, True)
    assert rows["invariance_units"]["unit"] == "moved"


def test_a_target_whose_models_did_not_run_is_not_judged():
    without_hat = {m: values for m, values in ACCURACY.items() if m != "hat"}
    rows = verdicts(*fake(without_hat, time={"jm_recommended": 1.0, "knn_400": 4.0},
                          state={"jm_recommended": [1.0, 1.0], "knn_400": [20.0, 20.0]}))
    assert [row["met"] for row in rows[:4]] == [None, None, True, True]
    assert [(row["value"], row["bar"]) for row in rows[:2]] == [(None, None), (None, None)]
    assert rows[0]["note"] == rows[1]["note"] == "hat did not run"
    without_knn = {m: values for m, values in ACCURACY.items() if m != "knn_400"}
    assert [row["met"] for row in verdicts(*fake(without_knn))][:4] == [None, None, None, None]
    rows = verdicts(*fake({m: values for m, values in ACCURACY.items() if m != "jm_recommended"}))
    assert [row["met"] for row in rows] == [None] * 7 and rows[2]["note"] == "jm_recommended did not run"
    assert [row["name"] for row in rows] == ["mean_vs_best_river", "worst_gap", "time_vs_knn_400",
                                             "state_vs_knn_400", "invariance_units", "invariance_minmax",
                                             "invariance_standard"]


def test_the_gae_models_are_the_presets_and_the_prototypes_variant():
    assert river_suite.GAE_CONFIGS == {"jm_recommended": JudgmentConfig.recommended(),
                                       "jm_lvq": JudgmentConfig.recommended().replace(judges=None),
                                       "jm_seed": JudgmentConfig.seed(),
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
    assert "| stagger | rules | — | `gnb` |" in result.stdout  # the subject did not run: its cells are empty
    record = json.loads((tmp_path / "benchmark-streams.json").read_text())
    assert [(r["model"], r["stream"], r["seed"], r["n"]) for r in record["runs"]] == [("gnb", "stagger", 3, 60)]
