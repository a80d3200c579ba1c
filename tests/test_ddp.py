"""DDP: every rank ends with the memory state of one process reading the same global stream.

Real process groups throughout (Gloo on the CPU): the library helper with 3 spawned processes
for every memory, the Lightning loop with 2 DDP processes launched by ``scripts/train.py``.
The spawned workers import this module, so it imports Lightning only inside the tests that use
it (several seconds per worker otherwise).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gae import EpisodicMemory, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from tests.conftest import ACTIONS, CATEGORIES, FACTORS, clustered_stream
from training.batch import DecisionBatch, gather_decisions
from training.distributed import broadcast_gradients_hook, gather_batch, rank_and_world

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# DDP broadcasts rank 0's buffers before every forward unless told not to (torch >= 2.13 renamed the flag);
# the test keeps each rank's own buffers, so that only the scheme can make them agree
NO_BUFFER_SYNC = {"forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
                  else "broadcast_buffers": False}
WORLD = 3  # the library test: a world size whose gradient average would not be exact
# rows each rank serves at each step of the library test: unequal, some ranks empty, never all
SHARES = [(5, 0, 3), (0, 7, 1), (2, 2, 2), (1, 0, 0), (4, 6, 0), (0, 0, 9)] * 6
MEMORIES = {
    "judgment": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed()),
    "judgment_adaptive": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed(),
                                                drift_mode="adaptive",
                                                promotion_threshold=2.0),
    "judgment_prototypes": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed(),
                                                  prototypes=3, spawn_threshold=0.3),
    "knn": lambda: KNNMemory(factors=FACTORS, actions=ACTIONS, k=5, capacity=50, categories=CATEGORIES),
    "retrieval": lambda: RetrievalMemory(factors=FACTORS, actions=ACTIONS, k=5, capacity=50, categories=CATEGORIES,
                                         scoped=True),
}


def assert_identical(got: Any, expected: Any, where: str = "state") -> None:
    """Bit for bit: every tensor (dtype, shape, values, NaN where NaN), every nested container and value."""
    assert type(got) is type(expected), where
    if isinstance(got, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape, where
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(got, dict):
        assert list(got) == list(expected), where
        for key in got:
            assert_identical(got[key], expected[key], f"{where}.{key}")
    elif isinstance(got, (list, tuple)):
        assert len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_identical(a, b, f"{where}[{i}]")
    else:
        assert got == expected, where


# -- the library helper: 3 processes, every memory ---------------------------------------------

class AttentionStep(nn.Module):
    """What the Lightning module does with the attention: a loss on the prequential step."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed())

    def forward(self, x, category, action, skip):
        step = self.memory.prequential_(x, category, action, skip=skip)
        return self.memory.attention_loss(step, category, action, skip)


def episodic_columns(x, category):
    """An EpisodicMemory fed the decisions as traces: embedding, importance, time, scope."""
    return x - 0.5, x[:, 0], category.double() * 0.25, category


def learn_everything(memories, episodic, attention, optimizer, x, category, action, skip, first) -> None:
    for memory in memories.values():
        memory.prequential_(x, category, action, skip=skip)
    embedding, importance, created_at, scope = episodic_columns(x, category)
    if x.shape[0]:
        episodic.add(embedding, importance, created_at=created_at, scope=scope.tolist(), now=float(first))
    loss = attention(x, category, action, skip)
    if loss is not None:
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def library_states(memories, episodic, attention) -> dict[str, Any]:
    return {**{name: memory.state_dict() for name, memory in memories.items()},
            "episodic": episodic.state_dict(), "attention": attention.state_dict()}


def library_worker(rank: int, directory: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{directory}/group", rank=rank, world_size=WORLD)
    try:
        assert rank_and_world() == (rank, WORLD)
        stream = clustered_stream(11, sum(map(sum, SHARES)), drift_at=120)
        memories = {name: factory() for name, factory in MEMORIES.items()}
        episodic = EpisodicMemory(FACTORS, capacity=30)
        attention = DDP(AttentionStep(), **NO_BUFFER_SYNC)
        attention.register_comm_hook(state=None, hook=broadcast_gradients_hook)
        optimizer = torch.optim.Adam(attention.parameters(), lr=0.05)
        start = 0
        for shares in SHARES:
            mine = slice(start + sum(shares[:rank]), start + sum(shares[:rank + 1]))
            x, category, action, skip = gather_batch(stream.x[mine], stream.category[mine], stream.action[mine],
                                                     stream.skip[mine])
            whole = slice(start, start + sum(shares))
            assert torch.equal(x, stream.x[whole]) and torch.equal(skip, stream.skip[whole])  # rank order
            learn_everything(memories, episodic, attention, optimizer, x, category, action, skip, start)
            start += sum(shares)
        states = library_states(memories, episodic, attention.module)
        # a rank with other columns, or a refused batch, fails every rank instead of leaving them waiting
        odd = stream.category[:2].int() if rank == 1 else stream.category[:2]
        with pytest.raises(ValueError, match="different columns"):
            gather_batch(stream.x[:2], odd)
        short = stream.category[:1] if rank == 2 else stream.category[:2]
        with pytest.raises(ValueError, match="same number of rows" if rank == 2 else r"rank\(s\) \[2\]"):
            gather_batch(stream.x[:2], short)
        torch.save(states, f"{directory}/rank{rank}.pt")
        # every rank is past its last collective, and the DDP wrapper (whose reducer holds the group) is
        # gone, before any rank tears the group down: a worker once aborted in gloo's teardown here
        dist.barrier()
        del attention, optimizer
    finally:
        dist.destroy_process_group()


def test_gather_batch_keeps_every_memory_identical_to_one_process(tmp_path):
    # spawned, not forked: a fork of a process whose earlier tests started OpenMP / torch thread pools
    # deadlocks in the child (the full suite hung here), and a forked worker that finalises an inherited
    # DataLoader iterator sends SIGTERM to worker pids the system may have given to another process
    mp.start_processes(library_worker, args=(str(tmp_path),), nprocs=WORLD, join=True, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    stream = clustered_stream(11, sum(map(sum, SHARES)), drift_at=120)
    memories = {name: factory() for name, factory in MEMORIES.items()}
    episodic = EpisodicMemory(FACTORS, capacity=30)
    attention = AttentionStep()
    optimizer = torch.optim.Adam(attention.parameters(), lr=0.05)
    start = 0
    for shares in SHARES:
        whole = slice(start, start + sum(shares))
        learn_everything(memories, episodic, attention, optimizer, stream.x[whole], stream.category[whole],
                         stream.action[whole], stream.skip[whole], start)
        start += sum(shares)
    expected = library_states(memories, episodic, attention)
    assert int(memories["judgment_adaptive"].promotion_log.step.numel()) > 0  # the modes did their thing
    assert int(memories["judgment_prototypes"].initialized[..., 1:].sum()) > 0
    assert not torch.equal(attention.memory.criterion_logits, torch.zeros(CATEGORIES, FACTORS))
    for rank, state in enumerate(ranks):
        assert_identical(state, expected, f"rank {rank}")


def test_gather_batch_without_a_process_group_is_the_identity_and_checks_its_input():
    x, flags = torch.rand(4, 3), torch.tensor([True, False, True, True])
    gathered = gather_batch(x, flags)
    assert gathered[0] is x and gathered[1] is flags
    assert rank_and_world() == (0, 1)
    for bad, message in [((), "at least one tensor"), ((x, [1, 2, 3, 4]), "argument 1 must be a tensor"),
                         ((torch.tensor(1.0),), "no rows dimension"), ((x, flags[:3]), "same number of rows")]:
        with pytest.raises(ValueError, match=message):
            gather_batch(*bad)


def test_a_batch_out_of_stream_order_is_refused():
    from training.data import DecisionStream

    batch = DecisionStream(200, seed=1).batch(0, 100)
    assert gather_decisions(batch) is not batch and torch.equal(gather_decisions(batch).position, batch.position)
    twice = DecisionBatch(*(torch.cat([column, column]) for column in batch))
    with pytest.raises(ValueError, match=r"stream order \(increasing positions\), got positions \[0, 1, 2"):
        gather_decisions(twice)


# -- the Lightning loop: 2 DDP processes -----------------------------------------------------------

DDP_RUN = ["--data.stream.init_args.n_decisions=3030", "--data.stream.init_args.drift_at=1500",
           "--model.judgments.seed.drift_mode=adaptive", "--model.judgments.seed.prototypes=2",
           "--model.figure_every_n_steps=1000",
           "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"] if tag.split("/")[0] in ("acc", "gate", "drift", "calibration")}


def test_lightning_ddp_ranks_end_identical_and_equal_to_one_process(tmp_path):
    from scripts.train import main

    ddp, single = tmp_path / "ddp", tmp_path / "single"
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), "fit", f"--config={CONFIGS / 'default.yaml'}",
               f"--config={CONFIGS / 'ddp.yaml'}", *DDP_RUN, "--data.batch_size=50",
               f"--trainer.default_root_dir={ddp}",
               "--trainer.callbacks+=tests.test_resume.SaveRankState", f"--trainer.callbacks.directory={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["grad_hooks"] for r in ranks] == [1, 1]
    # rank r served the stream's batches r, r + 2, ... of 50 (61 of them: rank 1's last batch is empty)
    for rank, saved in enumerate(ranks):
        served = saved["served"]
        assert len(served) == 31 and served[-1] == ((3000, 30) if rank == 0 else (-1, 0))
        assert served[:-1] == [((2 * step + rank) * 50, 50) for step in range(30)]
        assert saved["loader"] == {"next_batch": 62, "batch_size": 50}
    # one process over the same global order: every step gathered 2 x 50 consecutive decisions
    cli = main(["fit", f"--config={CONFIGS / 'default.yaml'}", *DDP_RUN, "--data.batch_size=100",
                f"--trainer.default_root_dir={single}"])
    expected = cli.model.state_dict()
    memory = cli.model.memory
    assert int(cli.model.stream_position) == 3030 and int(memory.num_decisions) == 3030
    assert memory.promotion_log.step.numel() > 0 and int(memory.initialized[..., 1].sum()) > 0
    assert not torch.equal(memory.criterion_logits, torch.zeros_like(memory.criterion_logits))
    for rank, saved in enumerate(ranks):
        assert_identical(saved["state"], expected, f"rank {rank}")
        assert saved["metrics"] == cli.model.metric_values()
    assert_identical(ranks[0]["synced"], ranks[1]["synced"], "synced metrics")
    # only rank 0 writes TensorBoard; what it writes is the one-process run's, at the same decisions
    versions = [root / "lightning_logs" / "default" / "version_0" for root in (ddp, single)]
    assert len(list(ddp.rglob("events.out.tfevents.*"))) == 4  # the root run and one per memory, all rank 0's
    for run in ("seed", "recommended", "knn"):
        logged = [scalars(version / run) for version in versions]
        assert logged[0] == logged[1] and len(logged[0]["acc/rolling"]) == 31, run
    assert (ddp / "lightning_logs" / "default" / "version_0" / "checkpoints" / "last.ckpt").exists()
