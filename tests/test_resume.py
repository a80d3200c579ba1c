"""A training run killed with SIGKILL mid-stream resumes to exactly the end of an uninterrupted one.

The run is a real ``scripts/train.py`` process, killed at an arbitrary moment after its 4th
checkpoint: in the middle of learning a batch, or of writing a checkpoint. Every checkpoint it
left behind must hold a whole number of batches (bit-identical to the uninterrupted run's
checkpoint of the same step), and resuming from its ``last.ckpt`` must end with the
uninterrupted run's memory state, optimizer state and metrics.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback
from torchmetrics import Metric

from scripts.train import main
from tests.test_ddp import assert_identical

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
N, BATCH, EVERY = 3000, 50, 5  # 60 steps, a checkpoint every 5
RUN = [f"--config={CONFIGS / 'default.yaml'}", f"--data.stream.init_args.n_decisions={N}",
       "--data.stream.init_args.drift_at=1500", f"--data.batch_size={BATCH}", "--model.figure_every_n_steps=1000",
       "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.callbacks=[]",
       "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
       f"--trainer.callbacks.every_n_train_steps={EVERY}", "--trainer.callbacks.save_last=true",
       "--trainer.callbacks.save_top_k=-1"]


class SaveRankState(Callback):
    """Each rank of a run in other processes saves what it served and how it ended (``rank{r}.pt``).

    Used by tests/test_ddp.py through ``--trainer.callbacks+=tests.test_resume.SaveRankState``; it
    lives here because test_ddp's spawned workers must not import Lightning. The metrics are also
    synchronised across ranks, as torchmetrics does under DDP, which checks that every rank holds
    the same states (``training.metrics.same_on_every_rank``).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.served: list[tuple[int, int]] = []  # (first position, decisions) of each batch this rank served

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.served.append((int(batch.position[0]) if len(batch.position) else -1, len(batch.position)))

    def on_train_end(self, trainer, pl_module) -> None:
        synced: dict[str, Any] = {}
        for name, metric in pl_module.named_modules():
            if isinstance(metric, Metric):
                metric.sync(should_sync=True)  # raises unless every rank holds the same states
                synced[name] = {state: getattr(metric, state).clone() for state in metric._defaults}
                metric.unsync()
        hooks = getattr(trainer.strategy.model, "_comm_hooks", [])
        torch.save({"state": pl_module.state_dict(), "metrics": pl_module.metric_values(), "synced": synced,
                    "world": trainer.world_size, "grad_hooks": len(hooks), "served": self.served,
                    "loader": trainer.train_dataloader.state_dict()}, f"{self.directory}/rank{trainer.global_rank}.pt")


def fit(root: Path, *extra: str):
    return main(["fit", *RUN, f"--trainer.default_root_dir={root}",
                 *extra])


def checkpoints(root: Path) -> dict[str, Path]:
    return {path.name: path for path in root.rglob("*.ckpt")}


def kill_mid_stream(root: Path, after: str) -> subprocess.Popen:
    """Start a run and SIGKILL it as soon as the checkpoint ``after`` exists."""
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), "fit", *RUN,
               f"--trainer.default_root_dir={root}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = root / "stderr.txt"  # a file, not a pipe: a full pipe would stall the run
    with log.open("wb") as stderr:
        run = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 240
    while after not in checkpoints(root):
        if run.poll() is not None:
            pytest.fail(f"the run ended before it was killed:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            run.kill()
            pytest.fail("no checkpoint after 240 s")
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.communicate()
    assert run.returncode == -signal.SIGKILL
    return run


def comparable(checkpoint: dict) -> dict:
    """What must match between two runs: the model, the optimizer, the loop and loader positions."""
    loops = checkpoint["loops"]["fit_loop"]
    return {"state_dict": checkpoint["state_dict"], "optimizer_states": checkpoint["optimizer_states"],
            "global_step": checkpoint["global_step"], "loader": loops["state_dict"]["combined_loader"],
            "progress": loops["epoch_loop.batch_progress"]}


def test_a_run_killed_with_sigkill_resumes_to_the_end_of_an_uninterrupted_one(tmp_path):
    killed, whole, resumed = tmp_path / "killed", tmp_path / "whole", tmp_path / "resumed"
    killed.mkdir()
    kill_mid_stream(killed, after=f"epoch=0-step={4 * EVERY}.ckpt")
    left = checkpoints(killed)
    last = torch.load(left.pop("last.ckpt"), weights_only=True)
    position = int(last["state_dict"]["stream_position"])
    # killed in the middle of the stream; last.ckpt is the 4th checkpoint, or still the 3rd when the kill
    # came between the two files of a save (last.ckpt is written after epoch=0-step=20.ckpt)
    assert 3 * EVERY * BATCH <= position < N

    uninterrupted = fit(whole)
    reference = checkpoints(whole)
    # a checkpoint holds whole batches only: each equals the uninterrupted run's at the same step
    assert left and set(left) <= set(reference)
    for name, path in left.items():
        saved = torch.load(path, weights_only=True)
        step = saved["global_step"]
        assert int(saved["state_dict"]["stream_position"]) == step * BATCH
        for memory in ("seed", "recommended"):
            assert int(saved["state_dict"][f"memories.{memory}.num_decisions"]) == step * BATCH
        loader = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert loader == [{"next_batch": step, "batch_size": BATCH}]
        assert_identical(comparable(saved), comparable(torch.load(reference[name], weights_only=True)), name)
    assert_identical(comparable(last), comparable(torch.load(reference[f"epoch=0-step={last['global_step']}.ckpt"],
                                                             weights_only=True)), "last.ckpt")

    cli = fit(resumed, f"--ckpt_path={next(killed.rglob('last.ckpt'))}")
    assert int(cli.model.stream_position) == N and int(cli.model.memory.num_decisions) == N
    assert cli.trainer.global_step == uninterrupted.trainer.global_step == N // BATCH
    assert_identical(cli.model.state_dict(), uninterrupted.model.state_dict(), "final state")
    assert cli.model.metric_values() == uninterrupted.model.metric_values()
    optimizer, expected = cli.trainer.optimizers[0].state_dict(), uninterrupted.trainer.optimizers[0].state_dict()
    assert_identical(optimizer, expected, "optimizer")


# default.yaml's recommended memory (lvq, up to 32 prototypes) runs beside the seed memory in each mode
@pytest.mark.parametrize("mode", [["--model.judgments.seed.drift_mode=adaptive"],
                                  ["--model.judgments.seed.prototypes=3"]])
def test_resume_in_every_learning_mode_ends_where_an_uninterrupted_run_ends(tmp_path, mode):
    short = [f"--data.stream.init_args.n_decisions={N // 3}", "--data.stream.init_args.drift_at=500", *mode]
    whole = fit(tmp_path / "whole", *short)
    fit(tmp_path / "cut", *short, f"--trainer.max_steps={2 * EVERY + 2}")
    last = next((tmp_path / "cut").rglob("last.ckpt"))
    assert torch.load(last, weights_only=True)["global_step"] == 2 * EVERY  # the steps after it are lost
    resumed = fit(tmp_path / "resumed", *short, f"--ckpt_path={last}")
    assert int(resumed.model.stream_position) == N // 3
    assert_identical(resumed.model.state_dict(), whole.model.state_dict(), "final state")
    assert resumed.model.metric_values() == whole.model.metric_values()
