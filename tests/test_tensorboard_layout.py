"""TensorBoard compares the memories on shared charts: the Custom Scalars layout and the drift marker,
read back from the event files a short fit writes, and served the way the Custom Scalars tab asks."""

from __future__ import annotations

import doctest
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from training import tensorboard_layout
from training.data import DecisionStream, DecisionStreamDataModule
from training.module import DecisionMemoryModule
from training.tensorboard_layout import drift_points

CONFIG_TAG = "custom_scalars__config__"  # where TensorBoard's Custom Scalars plugin reads a run's layout
MARKER = tensorboard_layout.DRIFT_MARKER
RUNS = ("seed", "recommended", "knn")
COMPARED = ["abstain/rate", "acc/cumulative", "acc/rolling", "calibration/ece", "curve/rolling"]
N, DRIFT, BATCH, CURVE_POINTS = 200, 100, 20, 4


def fit(root: Path, stream: DecisionStream, *, knn: bool = True, max_steps: int = -1,
        checkpoint: ModelCheckpoint | None = None, ckpt_path: Path | None = None) -> Trainer:
    data = DecisionStreamDataModule(stream, batch_size=BATCH)
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, knn=knn,
                                 curve_points_per_batch=CURVE_POINTS, figure_every_n_steps=1000)
    trainer = Trainer(max_epochs=1, max_steps=max_steps, accelerator="cpu", log_every_n_steps=1,
                      logger=TensorBoardLogger(root, name="run", default_hp_metric=False),
                      callbacks=[checkpoint] if checkpoint else None, enable_checkpointing=checkpoint is not None,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return trainer


def read(log_dir: str | Path) -> tuple[list[layout_pb2.Layout], dict[str, list[tuple[int, float]]]]:
    """Every layout written to the run (one folder), and every scalar as (step, value) pairs."""
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    layouts = [layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
               for event in (events.Tensors(CONFIG_TAG) if CONFIG_TAG in tags["tensors"] else [])]
    scalars = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in tags["scalars"]}
    return layouts, scalars


def charts(layout: layout_pb2.Layout) -> dict[str, dict[str, list[str]]]:
    """{category: {chart title: the chart's tag regexes}}, every chart a multiline one."""
    assert all(chart.WhichOneof("content") == "multiline" for category in layout.category for chart in category.chart)
    return {category.title: {chart.title: list(chart.multiline.tag) for chart in category.chart}
            for category in layout.category}


def matched(regexes: list[str], logged: dict[str, object]) -> list[str]:
    """The logged tag each regex selects, matched as the Custom Scalars plugin does (``re.match``);
    each must select exactly one."""
    tags = []
    for regex in regexes:
        hits = [tag for tag in logged if re.match(regex, tag)]
        assert len(hits) == 1, (regex, hits)
        tags.extend(hits)
    return tags


@pytest.fixture(scope="module")
def drift_run(tmp_path_factory) -> str:
    trainer = fit(tmp_path_factory.mktemp("drift"), DecisionStream(N, drift_at=DRIFT, seed=0))
    return str(trainer.logger.log_dir)


def test_each_memory_logs_into_its_own_run_under_the_same_tags(drift_run):
    runs = {name: read(Path(drift_run) / name)[1] for name in RUNS}
    for name, scalars in runs.items():
        assert set(COMPARED) <= set(scalars), name
        assert not any(tag.startswith(("final/", "stream/")) for tag in scalars), name  # those are the root run's
    assert {"gate/rate", "drift/shift"} <= set(runs["seed"]) & set(runs["recommended"])
    assert not {"gate/rate", "drift/shift"} & set(runs["knn"])  # the k-NN has no gate and no prototypes
    assert [step for step, _ in runs["knn"]["curve/rolling"]] == [step for step, _ in runs["seed"]["curve/rolling"]]


def test_every_compared_metric_has_one_chart_and_the_drift_its_own(drift_run):
    layouts, scalars = read(drift_run)
    assert len(layouts) == 1  # written once, at the first logged step, to the root run
    by_category = charts(layouts[0])
    assert list(by_category) == ["memories", "stream"]
    assert sorted(by_category["memories"]) == COMPARED  # every metric all three log, and nothing else
    for title, regexes in by_category["memories"].items():
        for name in RUNS:  # the chart's regex selects that tag in every memory's run
            assert matched(regexes, read(Path(drift_run) / name)[1]) == [title], (title, name)
    assert by_category["stream"] == {MARKER: ["stream/drift$"]}
    assert matched(by_category["stream"][MARKER], scalars) == [MARKER]  # the marker on no rate's axis


def test_the_drift_marker_steps_up_at_the_drift_wherever_the_curves_are_logged(drift_run):
    _, scalars = read(drift_run)
    marker = dict(scalars[MARKER])
    assert len(marker) == len(scalars[MARKER])  # one point per step
    assert marker == {step: float(step > DRIFT) for step in marker}  # step s has seen decisions 0 .. s - 1
    assert {DRIFT, DRIFT + 1} <= set(marker)  # both sides of the edge, so it is drawn vertical
    for name, tag in (("seed", "curve/rolling"), ("knn", "acc/rolling")):
        assert {step for step, _ in read(Path(drift_run) / name)[1][tag]} <= set(marker), tag
    assert min(marker) == BATCH // CURVE_POINTS and max(marker) == N


def test_the_custom_scalars_tab_serves_every_chart_with_a_series_per_run(drift_run):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin
    from tensorboard.plugins.scalar.scalars_plugin import ScalarsPlugin

    logdir = str(Path(drift_run).parent)
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    plugins: dict[str, base_plugin.TBPlugin] = {}
    tb = base_plugin.TBContext(logdir=logdir, multiplexer=multiplexer, plugin_name_to_instance=plugins,
                               data_provider=data_provider.MultiplexerDataProvider(multiplexer, logdir))
    plugins["scalars"] = ScalarsPlugin(tb)
    custom = CustomScalarsPlugin(tb)
    request = context.RequestContext()
    memories, stream = json.loads(custom.layout_impl(request, ""))["category"]
    version = Path(drift_run).name
    assert sorted(multiplexer.Runs()) == sorted([version, *(f"{version}/{name}" for name in RUNS)])
    for chart in memories["chart"]:
        (regex,) = chart["multiline"]["tag"]
        served = {run: custom.scalars_impl(request, run, regex, "") for run in multiplexer.Runs()}
        assert all(answer["regex_valid"] for answer in served.values()), regex
        lines = {run for run, answer in served.items() if any(answer["tag_to_events"].values())}
        assert lines == {f"{version}/{name}" for name in RUNS}, chart["title"]  # one line (colour) per memory
    (chart,) = stream["chart"]
    marker = custom.scalars_impl(request, version, chart["multiline"]["tag"][0], "")["tag_to_events"][MARKER]
    assert [value for _, step, value in marker if step in (DRIFT, DRIFT + 1)] == [0.0, 1.0]


def test_a_stream_without_drift_has_no_marker(tmp_path):
    trainer = fit(tmp_path, DecisionStream(60, seed=1))
    (layout,), scalars = read(trainer.logger.log_dir)
    assert MARKER not in scalars
    assert list(charts(layout)) == ["memories"] and sorted(charts(layout)["memories"]) == COMPARED


def test_without_the_knn_the_charts_hold_the_judgment_memories_and_a_staircase_of_drifts(tmp_path):
    trainer = fit(tmp_path, DecisionStream(N, drift_at=[60, 140], seed=2), knn=False)
    (layout,), scalars = read(trainer.logger.log_dir)
    assert not (Path(trainer.logger.log_dir) / "knn").exists()
    by_category = charts(layout)
    assert {"acc/rolling", "curve/rolling", "gate/rate"} <= set(by_category["memories"])  # both judgments log the gate
    marker = dict(scalars[MARKER])
    assert marker == {step: (step > 60) / 2 + (step > 140) / 2 for step in marker}
    assert {60, 61, 140, 141} <= set(marker)


def test_a_resumed_fit_writes_the_layout_to_its_own_run_and_marks_the_drift_on(tmp_path):
    stream = DecisionStream(N, drift_at=DRIFT, seed=0)
    saved = tmp_path / "checkpoints"
    cut = fit(tmp_path, stream, max_steps=3, checkpoint=ModelCheckpoint(saved, "cut", every_n_train_steps=3))
    resumed = fit(tmp_path, stream, ckpt_path=saved / "cut.ckpt")
    assert resumed.logger.log_dir != cut.logger.log_dir
    (before,), _ = read(cut.logger.log_dir)
    (after,), scalars = read(resumed.logger.log_dir)
    assert charts(after) == charts(before)
    marker = dict(scalars[MARKER])
    assert min(marker) > 3 * BATCH and marker == {step: float(step > DRIFT) for step in marker}
    curve = read(Path(resumed.logger.log_dir) / "recommended")[1]["curve/rolling"]
    assert min(step for step, _ in curve) > 3 * BATCH  # the resumed runs go on from the checkpoint


@pytest.mark.parametrize(("stream", "points"), [
    (SimpleNamespace(drift_at=(500,)), (500,)),
    (SimpleNamespace(drift_at=np.int64(300)), (300,)),
    (SimpleNamespace(drift_at=(), permute_at=0), ()),  # a permutation at the start is no change inside the stream
    (SimpleNamespace(drift_at=[900, 100]), (100, 900)),
    (SimpleNamespace(drift_at=None), ()),
    (SimpleNamespace(), ()),
    (None, ()),
])
def test_drift_points_read_every_kind_of_stream(stream, points):
    assert drift_points(stream) == points


def test_docstring_examples_run():
    result = doctest.testmod(tensorboard_layout)
    assert result.attempted > 0 and result.failed == 0
