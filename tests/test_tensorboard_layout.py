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
MARKER = "drift/marker"
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


def read(log_dir: str) -> tuple[list[layout_pb2.Layout], dict[str, list[tuple[int, float]]]]:
    """Every layout written to the run, and every scalar as (step, value) pairs."""
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0, "tensors": 0})
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


def test_every_compared_metric_has_one_chart_with_every_memory_and_the_drift(drift_run):
    layouts, scalars = read(drift_run)
    assert len(layouts) == 1  # written once, at the first logged step
    (category, by_title), = charts(layouts[0]).items()
    assert category == "jm vs knn"
    curves = [tag for tag in scalars if not tag.startswith("final/")]  # final/: one value each, for the HParams tab
    per_memory = {name: {tag[:-len(name) - 1] for tag in curves if tag.endswith(f"_{name}")} for name in ("jm", "knn")}
    assert per_memory["jm"] == per_memory["knn"] == set(by_title)  # every metric both log, and nothing else
    assert {"acc/rolling", "acc/cumulative", "calibration/ece", "abstain/rate", "curve/rolling"} <= set(by_title)
    for title, regexes in by_title.items():
        assert matched(regexes, scalars) == [f"{title}_jm", f"{title}_knn", MARKER], title
    assert by_title["acc/rolling"] == ["acc/rolling_jm$", "acc/rolling_knn$", "drift/marker$"]


def test_the_drift_marker_steps_up_at_the_drift_wherever_the_curves_are_logged(drift_run):
    _, scalars = read(drift_run)
    marker = dict(scalars[MARKER])
    assert len(marker) == len(scalars[MARKER])  # one point per step
    assert marker == {step: float(step > DRIFT) for step in marker}  # step s has seen decisions 0 .. s - 1
    assert {DRIFT, DRIFT + 1} <= set(marker)  # both sides of the edge, so it is drawn vertical
    for tag in ("curve/rolling_jm", "acc/rolling_knn"):
        assert {step for step, _ in scalars[tag]} <= set(marker), tag
    assert min(marker) == BATCH // CURVE_POINTS and max(marker) == N


def test_the_custom_scalars_tab_serves_every_chart_with_its_series(drift_run):
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
    (category,) = json.loads(custom.layout_impl(request, ""))["category"]
    (run,) = multiplexer.Runs()
    for chart in category["chart"]:
        series = {}
        for regex in chart["multiline"]["tag"]:
            served = custom.scalars_impl(request, run, regex, "")
            assert served["regex_valid"], regex
            series.update(served["tag_to_events"])
        title = chart["title"]
        assert list(series) == [f"{title}_jm", f"{title}_knn", MARKER] and all(series.values()), title
        marker = series[MARKER]  # [wall time, step, value]
        assert [value for _, step, value in marker if step in (DRIFT, DRIFT + 1)] == [0.0, 1.0]


def test_a_stream_without_drift_has_no_marker(tmp_path):
    trainer = fit(tmp_path, DecisionStream(60, seed=1))
    (layout,), scalars = read(trainer.logger.log_dir)
    assert MARKER not in scalars
    (by_title,) = charts(layout).values()
    assert by_title and all(matched(regexes, scalars) == [f"{title}_jm", f"{title}_knn"]
                            for title, regexes in by_title.items())


def test_without_the_knn_each_chart_holds_the_judgment_memory_and_a_staircase_of_drifts(tmp_path):
    trainer = fit(tmp_path, DecisionStream(N, drift_at=[60, 140], seed=2), knn=False)
    (layout,), scalars = read(trainer.logger.log_dir)
    assert not any(tag.endswith("_knn") for tag in scalars)
    (category, by_title), = charts(layout).items()
    assert category == "jm" and {"acc/rolling", "curve/rolling"} <= set(by_title)
    assert all(matched(regexes, scalars) == [f"{title}_jm", MARKER] for title, regexes in by_title.items())
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
