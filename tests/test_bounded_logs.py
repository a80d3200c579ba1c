"""One setting bounds every log: with ``max_log_events`` the state stays flat on an endless stream.

The decision log and the gate, promotion and recycle logs cover the same decisions (the last
N to N/2), each is stored once in the ``state_dict``, and ``max_log_events=0`` keeps none.
``scripts/soak.py`` measures the same over a million decisions (docs/soak.md).
"""

from __future__ import annotations

import io

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory

MODES = {"seed": JudgmentConfig.seed(), "adaptive": JudgmentConfig(drift_mode="adaptive"),
         "prototypes": JudgmentConfig(prototypes=4), "recommended": JudgmentConfig.recommended()}


def saved_bytes(memory: JudgmentMemory) -> int:
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    return buffer.tell()


def feed(memory: JudgmentMemory, decisions: int, seed: int) -> None:
    """Uniform decisions (the drift gate fires on a good share of them) in batches and one by one."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(decisions, 6, generator=generator)
    category = torch.randint(0, 3, (decisions,), generator=generator)
    action = torch.randint(0, 3, (decisions,), generator=generator)
    half = decisions // 2
    memory.learn_(x[:half], category[:half], action[:half])
    for i in range(half, decisions):
        memory.learn_one(x[i], int(action[i]), int(category[i]), confirmed=None)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_log_is_bounded_by_max_log_events(mode: str) -> None:
    memory = JudgmentMemory(3, 3, 6, MODES[mode], max_log_events=500)
    feed(memory, 4_000, seed=0)
    early = saved_bytes(memory)
    for seed in range(1, 4):
        feed(memory, 4_000, seed=seed)
    assert saved_bytes(memory) <= 1.1 * early  # flat: 16,000 decisions cost what 4,000 did
    first = int(memory.decision_log.events()["seq"][0])
    assert 250 <= len(memory.decision_log) <= 500 and first + len(memory.decision_log) == 16_000
    for log in (memory.gate_log, memory.promotion_log, memory.recycle_log):  # the same decisions, no older
        assert bool((log.step >= first).all())
    if mode == "seed":
        assert memory.gate_log.step.numel() > 0


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_event_logs_are_stored_once(mode: str) -> None:
    memory = JudgmentMemory(3, 3, 6, MODES[mode], max_log_events=200)
    feed(memory, 2_000, seed=0)
    extra = memory.state_dict()["_extra_state"]
    assert set(extra["decision_log"]) >= {"columns", "base"} and "base_logs" not in extra["decision_log"]
    twin = JudgmentMemory(3, 3, 6, MODES[mode], max_log_events=200)
    twin.load_state_dict(memory.state_dict())
    for mine, theirs in zip(twin.gate_log, memory.gate_log, strict=True):
        assert torch.equal(mine, theirs)
    memory.undo_(10)  # a replay regenerates the events of what it learns again, and only those
    twin.undo_(10)
    assert memory.gate_records() == twin.gate_records()


def test_no_log_at_all_with_zero() -> None:
    memory = JudgmentMemory(3, 3, 6, config=JudgmentConfig.seed(), max_log_events=0)
    feed(memory, 2_000, seed=0)
    assert len(memory.decision_log) == 0 and memory.gate_log.step.numel() == 0
    assert int(memory.num_decisions) == 2_000


def test_the_default_keeps_everything() -> None:
    memory = JudgmentMemory(3, 3, 6, config=JudgmentConfig.seed())
    feed(memory, 2_000, seed=0)
    assert len(memory.decision_log) == 2_000 and memory.gate_log.step.numel() > 0


@pytest.mark.parametrize("reader", ["state_dict", "decision_log", "gate_log"])
def test_a_frequent_reader_does_not_keep_the_log_from_folding(reader: str) -> None:
    memory = JudgmentMemory(3, 3, 6, config=JudgmentConfig.seed(), max_log_events=400)
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(5_000, 6, generator=generator)
    for i in range(5_000):
        memory.learn_one(x[i], i % 3, (i // 3) % 3, confirmed=None)
        if i % 50 == 0:  # more often than a staged batch fills
            getattr(memory, reader)() if reader == "state_dict" else getattr(memory, reader)
        assert len(memory.history._log) <= 400 + 100  # the staged rows join it at most a batch at a time


def test_a_call_larger_than_the_bound_folds_whole() -> None:
    memory = JudgmentMemory(3, 3, 6, config=JudgmentConfig.seed(), max_log_events=100)
    generator = torch.Generator().manual_seed(2)
    x = torch.rand(1_000, 6, generator=generator)
    category, action = torch.randint(0, 3, (1_000,), generator=generator), torch.randint(0, 3, (1_000,))
    memory.learn_(x, category, action)
    unbounded = JudgmentMemory(3, 3, 6, config=JudgmentConfig.seed())
    unbounded.learn_(x, category, action)
    assert len(memory.decision_log) == 0 and memory.gate_log.step.numel() == 0
    for name, buffer in unbounded.named_buffers():
        assert torch.equal(buffer, memory.get_buffer(name)), name
    assert torch.equal(memory.decision_log.base["centroids"], unbounded.centroids)
