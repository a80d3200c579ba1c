"""The synthetic decision stream and the data module that serves streams in order (files: test_data_files.py)."""

from __future__ import annotations

import doctest
import importlib.util
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from training import data as data_module
from training import streams, streams_file
from training.batch import DecisionBatch
from training.data import DecisionStream, DecisionStreamDataModule, StreamLoader

ROOT = Path(__file__).resolve().parents[1]
KINDS = ["permute", "redraw", "shift"]


def load_example_script():
    spec = importlib.util.spec_from_file_location("make_example_data", ROOT / "scripts" / "make_example_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = load_example_script()


def assert_batches_equal(a: DecisionBatch, b: DecisionBatch) -> None:
    for name, left, right in zip(DecisionBatch._fields, a, b, strict=True):
        assert left.dtype == right.dtype and torch.equal(left, right), name


# -- the synthetic stream ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_gives_identical_tensors_and_other_seeds_differ(kind):
    make = lambda seed: DecisionStream(3000, drift_at=[1000, 2000], drift_kind=kind, seed=seed)  # noqa: E731
    first, again, other = make(5), make(5), make(6)
    assert_batches_equal(first.tensors(), again.tensors())
    assert torch.equal(first.prototypes, again.prototypes)
    assert not torch.equal(first.tensors().x, other.tensors().x)
    assert not torch.equal(first.prototypes, other.prototypes)


def test_dtypes_shapes_and_names():
    stream = DecisionStream(500, categories=["invoice", "refund"], actions=3, factors=5, informative=2)
    data = stream.tensors()
    assert (stream.category_names, stream.action_names) == (("invoice", "refund"), ("0", "1", "2"))
    assert stream.factor_names == ("0", "1", "2", "3", "4") and len(stream) == 500
    assert (stream.n_categories, stream.n_actions, stream.n_factors) == (2, 3, 5)
    expected = {"x": torch.float32, "category": torch.int64, "action": torch.int64, "truth": torch.int64,
                "overridden": torch.bool, "confirmed": torch.int8, "skip": torch.bool, "timestamp": torch.float64,
                "id": torch.int64, "position": torch.int64}
    assert {name: t.dtype for name, t in zip(DecisionBatch._fields, data, strict=True)} == expected
    assert data.x.shape == (500, 5) and all(t.shape == (500,) for t in data[1:])
    assert 0 <= data.x.min() and data.x.max() <= 1 and bool((data.confirmed == -1).all())
    assert int(data.category.max()) == 1 and int(data.truth.max()) == 2


def test_clip_off_lets_factors_leave_the_unit_interval():
    data = DecisionStream(2000, factor_noise=0.5, clip=False).tensors()
    assert data.x.min() < 0 and data.x.max() > 1


@pytest.mark.parametrize("kind", KINDS)
def test_noise_factors_share_one_prototype_value_across_actions(kind):
    stream = DecisionStream(1000, categories=3, actions=4, factors=8, informative=3, drift_at=[300, 600],
                            drift_kind=kind, seed=2)
    mask = stream.informative_mask
    assert mask.shape == (3, 8) and mask.sum(1).tolist() == [3, 3, 3]
    assert len({tuple(row.tolist()) for row in mask}) > 1  # the informative factors differ per category
    spread = stream.prototypes.amax(dim=2) - stream.prototypes.amin(dim=2)  # (D + 1, C, K) across actions
    assert bool((spread[:, ~mask] == 0).all())
    assert bool((spread[:, mask] > 0).all())


@pytest.mark.parametrize("kind", KINDS)
def test_drift_changes_only_the_drifting_categories_from_drift_at(kind):
    n, at = 40_000, 20_000
    stream = DecisionStream(n, categories=["a", "b", "c", "d"], drift_at=at, drift_categories=["b", 3],
                            drift_kind=kind, seed=1)
    assert stream.drift_categories == (1, 3) and stream.prototypes.shape == (2, 4, 4, 8)
    before, after = stream.prototypes
    moved = (after - before).abs().amax(dim=(1, 2))
    assert moved.tolist()[0] == 0 and moved.tolist()[2] == 0 and bool((moved[[1, 3]] > 0.05).all())
    # what a learner sees: the mean factors of each (category, truth) before and after drift_at
    data = stream.tensors()
    for c in range(4):
        for a in range(4):
            cell = (data.category == c) & (data.truth == a)
            early, late = data.x[cell & (data.position < at)].mean(0), data.x[cell & (data.position >= at)].mean(0)
            change = float((late - early).abs().max())
            assert change > 0.05 if c in (1, 3) else change < 0.03, (c, a, change)


def test_permute_moves_every_action_to_the_next_prototype_and_shift_moves_by_drift_shift():
    permuted = DecisionStream(100, drift_at=[30, 60], drift_kind="permute")
    assert torch.equal(permuted.prototypes[1], permuted.prototypes[0].roll(-1, dims=1))
    assert torch.equal(permuted.prototypes[2], permuted.prototypes[0].roll(-2, dims=1))
    shifted = DecisionStream(100, drift_at=50, drift_kind="shift", drift_shift=0.2, seed=4)
    distance = (shifted.prototypes[1] - shifted.prototypes[0]).norm(dim=-1)
    assert bool((distance > 0).all()) and bool((distance <= 0.2 + 1e-6).all())
    assert bool(((distance - 0.2).abs() < 1e-6).any())  # moves that stay inside [0, 1] go the full distance


@pytest.mark.parametrize("kind", KINDS)
def test_drift_leaves_the_decisions_before_it_unchanged(kind):
    plain = DecisionStream(2000, seed=3).tensors()
    drifted = DecisionStream(2000, seed=3, drift_at=1200, drift_kind=kind).tensors()
    assert_batches_equal(DecisionBatch(*(t[:1200] for t in plain)), DecisionBatch(*(t[:1200] for t in drifted)))
    for name in ("category", "truth", "action", "skip"):
        assert torch.equal(getattr(plain, name), getattr(drifted, name)), name
    assert not torch.equal(plain.x[1200:], drifted.x[1200:])


def test_a_gradual_drift_blends_the_prototypes_over_its_duration():
    abrupt = DecisionStream(600, drift_at=200, seed=4, factor_noise=0.0, clip=False)
    gradual = DecisionStream(600, drift_at=200, drift_duration=100, seed=4, factor_noise=0.0, clip=False)
    a, g = abrupt.tensors(), gradual.tensors()
    assert torch.equal(a.x[:200], g.x[:200]) and torch.equal(a.x[300:], g.x[300:])
    assert torch.equal(gradual.prototypes, abrupt.prototypes)
    before, after = abrupt.prototypes[0, g.category, g.truth], abrupt.prototypes[1, g.category, g.truth]
    for i in (200, 249, 299):  # decision i carries the blend (i - 200 + 1) / 100 of the way
        weight = (i - 200 + 1) / 100
        torch.testing.assert_close(g.x[i], torch.lerp(before[i], after[i], weight))
    torch.testing.assert_close(gradual.prototypes_in_force()[torch.arange(600), g.truth], g.x)


def test_outliers_are_far_random_and_marked():
    clean = DecisionStream(4000, seed=5)
    dirty = DecisionStream(4000, seed=5, outliers=0.05)
    mask = dirty.outlier_mask
    assert 0.04 < float(mask.float().mean()) < 0.06 and not clean.outlier_mask.any()
    c, d = clean.tensors(), dirty.tensors()
    for field in ("category", "skip", "timestamp", "id"):
        assert torch.equal(getattr(c, field), getattr(d, field)), field
    assert torch.equal(c.x[~mask], d.x[~mask]) and torch.equal(c.action[~mask], d.action[~mask])
    assert torch.equal(d.action[mask], d.truth[mask]) and not d.overridden[mask].any()
    nearest = (d.x[:, None, :] - dirty.prototypes_in_force()).norm(dim=-1).amin(-1)
    assert float(nearest[mask].median()) > 3 * float(nearest[~mask].median())
    counts = torch.bincount(d.action[mask], minlength=4)
    assert counts.min() > 0.5 * counts.float().mean()  # random actions


def test_label_noise_and_uncertain_rates():
    data = DecisionStream(100_000, label_noise=0.2, uncertain=0.07, seed=9).tensors()
    assert abs(float(data.overridden.float().mean()) - 0.2) < 0.01
    assert abs(float(data.skip.float().mean()) - 0.07) < 0.01
    assert torch.equal(data.overridden, data.action != data.truth)
    offsets = ((data.action - data.truth) % 4)[data.overridden]  # the wrong action is any other, uniformly
    assert torch.allclose(torch.bincount(offsets, minlength=4)[1:] / offsets.numel(), torch.tensor(1 / 3), atol=0.02)
    clean = DecisionStream(5000, label_noise=0.0, uncertain=0.0).tensors()
    assert not clean.overridden.any() and not clean.skip.any() and torch.equal(clean.action, clean.truth)


def test_timestamps_ids_and_index():
    data = DecisionStream(50, start_time=100.0, interval=0.5, id_offset=7).tensors()
    assert torch.equal(data.timestamp, 100.0 + 0.5 * torch.arange(50, dtype=torch.float64))
    assert torch.equal(data.id, torch.arange(7, 57)) and torch.equal(data.position, torch.arange(50))


def test_batch_slices_equal_the_full_tensors_and_are_fresh():
    stream = DecisionStream(1000, drift_at=500)
    full = stream.tensors()
    for start, stop in [(0, 1000), (0, 1), (999, 1000), (137, 642)]:
        assert_batches_equal(stream.batch(start, stop), DecisionBatch(*(t[start:stop] for t in full)))
    batch = stream.batch(0, 10)
    batch.x.zero_()
    assert full.x[:10].sum() > 0


@pytest.mark.parametrize(("start", "stop", "error"), [
    (5, 5, ValueError), (6, 5, ValueError), (0, 1001, ValueError), (-1, 5, ValueError), (0.0, 5, TypeError)])
def test_batch_rejects_bad_bounds(start, stop, error):
    with pytest.raises(error, match="start|stop"):
        DecisionStream(1000).batch(start, stop)


@pytest.mark.parametrize(("kwargs", "error", "argument"), [
    ({"n_decisions": 0}, ValueError, "n_decisions"),
    ({"informative": 0}, ValueError, "informative"),
    ({"informative": 9}, ValueError, "informative"),
    ({"factor_noise": -0.1}, ValueError, "factor_noise"),
    ({"label_noise": 1.5}, ValueError, "label_noise"),
    ({"label_noise": 0.1, "actions": 1}, ValueError, "label_noise"),
    ({"uncertain": -0.1}, ValueError, "uncertain"),
    ({"drift_at": 0}, ValueError, "drift_at"),
    ({"drift_at": 100}, ValueError, "drift_at"),
    ({"drift_at": [50, 20]}, ValueError, "drift_at"),
    ({"drift_at": "50"}, TypeError, "drift_at"),
    ({"drift_at": 50, "drift_categories": ["nope"]}, ValueError, "drift_categories"),
    ({"drift_at": 50, "drift_categories": [4]}, ValueError, "drift_categories"),
    ({"drift_at": 50, "drift_categories": [1, 1]}, ValueError, "drift_categories"),
    ({"drift_kind": "flip"}, ValueError, "drift_kind"),
    ({"drift_shift": -1.0}, ValueError, "drift_shift"),
    ({"drift_duration": -1}, ValueError, "drift_duration"),
    ({"drift_at": 60, "drift_duration": 50}, ValueError, "drift_duration"),
    ({"drift_at": [20, 40], "drift_duration": 30}, ValueError, "drift_duration"),
    ({"outliers": -0.1}, ValueError, "outliers"),
    ({"outliers": 1.0}, ValueError, "outliers"),
    ({"seed": -1}, ValueError, "seed"),
    ({"clip": 1}, TypeError, "clip"),
    ({"interval": -1.0}, ValueError, "interval"),
    ({"categories": 0}, ValueError, "categories"),
])
def test_bad_arguments_name_the_argument(kwargs, error, argument):
    with pytest.raises(error, match=argument):
        DecisionStream(**{"n_decisions": 100, **kwargs})


# -- the data module --------------------------------------------------------------------------
def test_datamodule_serves_every_decision_once_in_order_with_a_short_last_batch():
    stream = DecisionStream(1050, drift_at=500)
    data = DecisionStreamDataModule(stream, batch_size=100)
    loader = data.train_dataloader()
    assert isinstance(loader, StreamLoader) and len(loader) == 11 and data.batch_size == 100
    batches = list(loader)
    assert [len(b.x) for b in batches] == [100] * 10 + [50]
    assert_batches_equal(DecisionBatch(*(torch.cat(ts) for ts in zip(*batches, strict=True))), stream.tensors())
    assert [int(b.position[0]) for b in loader] == list(range(0, 1050, 100))  # a second pass starts over


def test_datamodule_with_workers_keeps_stream_order():
    stream = DecisionStream(2000)
    loader = DecisionStreamDataModule(stream, batch_size=300, num_workers=2).train_dataloader()
    assert torch.equal(torch.cat([b.position for b in loader]), torch.arange(2000))


def test_datamodule_exposes_the_stream_names_and_sizes():
    stream = DecisionStream(10, categories=["a", "b"], actions=["x", "y", "z"], factors=5, informative=2)
    data = DecisionStreamDataModule(stream)
    assert (data.category_names, data.action_names, data.factor_names) == (
        ("a", "b"), ("x", "y", "z"), ("0", "1", "2", "3", "4"))
    assert (data.n_categories, data.n_actions, data.n_factors) == (2, 3, 5)


@pytest.mark.parametrize(("stream", "kwargs", "error", "argument"), [
    (None, {}, TypeError, "stream"),
    (DecisionStream(10), {"batch_size": 0}, ValueError, "batch_size"),
    (DecisionStream(10), {"num_workers": -1}, ValueError, "num_workers"),
])
def test_datamodule_rejects_bad_arguments(stream, kwargs, error, argument):
    with pytest.raises(error, match=argument):
        DecisionStreamDataModule(stream, **kwargs)


def test_loader_state_resumes_a_pass_where_it_stopped():
    data = DecisionStreamDataModule(DecisionStream(1000), batch_size=100)
    loader = data.train_dataloader()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    assert state == {"next_batch": 3, "batch_size": 100}
    resumed = data.train_dataloader()
    resumed.load_state_dict(state)
    assert [int(b.position[0]) for b in resumed] == list(range(300, 1000, 100))
    assert [int(b.position[0]) for b in resumed] == list(range(0, 1000, 100))  # the next pass is whole
    with pytest.raises(ValueError, match="batch_size=50"):
        DecisionStreamDataModule(DecisionStream(1000), batch_size=50).train_dataloader().load_state_dict(state)


class RecordingModule(L.LightningModule):
    """Records the first decision index of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, int]] = []

    def training_step(self, batch: DecisionBatch, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, int(batch.position[0])))
        return (self.weight * batch.x.mean()).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_resume_from_a_mid_stream_checkpoint_skips_the_batches_already_seen(tmp_path):
    options = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu"}
    make_data = lambda: DecisionStreamDataModule(DecisionStream(1050), batch_size=100)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few workers, few batches: Lightning's advice for real runs
        first = RecordingModule()
        checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}")
        L.Trainer(max_steps=6, callbacks=[checkpoint], **options).fit(first, make_data())
        resumed = RecordingModule()
        L.Trainer(max_epochs=2, enable_checkpointing=False, **options).fit(
            resumed, make_data(), ckpt_path=tmp_path / "step=4.ckpt")
    assert first.seen == [(0, i) for i in range(0, 600, 100)]
    assert resumed.seen == [(0, i) for i in range(400, 1050, 100)] + [(1, i) for i in range(0, 1050, 100)]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


CONFIG = """
data:
  stream:
    class_path: training.data.{kind}
    init_args:
{init_args}
  batch_size: 50
trainer:
  logger: false
"""
SYNTHETIC_ARGS = """      n_decisions: 2000
      categories: [invoice, refund, vendor, payroll]
      actions: [approve, review, escalate, reject]
      drift_at: 1000
      drift_kind: shift
"""
FILE_ARGS = f"""      path: {ROOT / "data" / "example_decisions.csv"}
      factors: [amount, vendor_age, mismatch, urgency, history, region, weekday, channel]
      truth_column: truth
"""


@pytest.mark.parametrize(("kind", "init_args", "length"), [
    ("DecisionStream", SYNTHETIC_ARGS, 2000), ("FileDecisionStream", FILE_ARGS, 200)])
def test_lightning_cli_builds_the_stream_from_yaml(tmp_path, kind, init_args, length):
    config = write(tmp_path, "config.yaml", CONFIG.format(kind=kind, init_args=init_args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LightningCLI(RecordingModule, DecisionStreamDataModule, run=False, args=["--config", str(config)],
                           save_config_callback=None)
    assert type(cli.datamodule.stream).__name__ == kind and len(cli.datamodule.stream) == length
    assert cli.datamodule.batch_size == 50 and cli.datamodule.n_factors == 8


def test_a_large_stream_generates_and_iterates_in_big_batches():
    stream = DecisionStream(200_000, drift_at=[50_000, 150_000], drift_kind="redraw")
    loader = DecisionStreamDataModule(stream, batch_size=10_000).train_dataloader()
    assert sum(len(batch.x) for batch in loader) == 200_000 and len(loader) == 20


def test_docstring_examples_run(monkeypatch):
    monkeypatch.chdir(ROOT)  # the FileDecisionStream example reads the shipped file
    for module in (streams, streams_file, data_module):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
