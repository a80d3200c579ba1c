"""scripts/tensorboard_screenshots.py against a real TensorBoard in headless Chromium (skipped without them)."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest
from lightning import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from scripts import tensorboard_screenshots as shots
from training.data import DecisionStream, DecisionStreamDataModule
from training.module import DecisionMemoryModule

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.is_file() or importlib.util.find_spec("playwright") is None,
                                reason="needs Debian's chromium and the playwright package (the docs extra)")


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", header[16:24])


def test_screenshots_of_a_short_run_show_every_view(tmp_path):
    data = DecisionStreamDataModule(DecisionStream(200, drift_at=100, seed=0), batch_size=50)
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, figure_every_n_steps=2)
    Trainer(max_epochs=1, accelerator="cpu", logger=TensorBoardLogger(tmp_path / "logs", name="default"),
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(model, data)
    written = shots.main(["--logdir", str(tmp_path / "logs" / "default"), "--out", str(tmp_path / "shots"),
                          "--chromium", str(CHROMIUM)])
    assert [path.name for path in written] == ["tensorboard-accuracy.png", "tensorboard-attention.png",
                                               "tensorboard-custom-scalars.png"]
    for path in written:
        width, height = png_size(path)
        assert width == shots.VIEWPORT["width"] and height >= 500 and path.stat().st_size > 20_000, path


def test_a_missing_browser_or_folder_is_refused_by_name(tmp_path, capsys):
    for argv, named in ((["--chromium", str(tmp_path / "nothing")], "--chromium"),
                        (["--logdir", str(tmp_path / "nowhere")], "--logdir")):
        with pytest.raises(SystemExit) as stopped:
            shots.main(argv)
        assert stopped.value.code == 2 and named in capsys.readouterr().err
