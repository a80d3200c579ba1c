"""The memory inside larger models: gradients, attention learning and torch.compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as nnf
from torch import nn

from gae import JudgmentConfig, JudgmentMemory

ROOT = Path(__file__).resolve().parents[1]


class Agent(nn.Module):
    """An encoder that turns raw features into criteria, followed by the memory."""

    def __init__(self, raw: int = 32, criteria: int = 8, categories: int = 2, actions: int = 3) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(raw, criteria), nn.Sigmoid())
        self.memory = JudgmentMemory(categories, actions, criteria, config=JudgmentConfig.seed())

    def forward(self, raw: torch.Tensor, category: torch.Tensor):
        return self.memory(self.encoder(raw), category)


def raw_stream(seed: int, n: int, raw: int = 32, categories: int = 2, actions: int = 3):
    gen = torch.Generator().manual_seed(seed)
    centres = 2 * torch.randn(categories, actions, raw, generator=gen)
    category = torch.randint(0, categories, (n,), generator=gen)
    action = torch.randint(0, actions, (n,), generator=gen)
    return centres[category, action] + torch.randn(n, raw, generator=gen), category, action


def masked_cross_entropy(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the decisions whose verified action already had a prototype."""
    known = torch.isfinite(logits.gather(1, action.unsqueeze(1))).squeeze(1)
    return nnf.cross_entropy(logits[known], action[known]) if known.any() else logits.sum() * 0


def test_end_to_end_training_of_encoder_and_attention():
    torch.manual_seed(0)
    agent = Agent()
    encoder_before = agent.encoder[0].weight.detach().clone()
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.02)
    raw, category, action = raw_stream(0, 3000)
    accuracy = []
    for start in range(0, 3000, 100):
        batch = raw[start:start + 100], category[start:start + 100], action[start:start + 100]
        out = agent(*batch[:2])  # scored before learning: prequential
        accuracy.append((out.action == batch[2]).float().mean().item())
        loss = masked_cross_entropy(out.logits, batch[2])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # the prototypes learn online, outside autograd
            agent.memory.learn_(agent.encoder(batch[0]), batch[1], batch[2])
    assert not torch.equal(agent.encoder[0].weight, encoder_before)
    assert agent.memory.criterion_logits.abs().max() > 0.01
    assert agent.memory.centroids.grad is None
    assert sum(accuracy[-5:]) / 5 > 0.9 > sum(accuracy[:3]) / 3


def test_attention_learns_informative_criteria():
    """Criteria that separate the actions gain weight; pure-noise criteria lose it."""
    gen = torch.Generator().manual_seed(1)
    n, informative = 4000, 4
    centres = torch.rand(2, 4, informative, generator=gen)
    category = torch.randint(0, 2, (n,), generator=gen)
    action = torch.randint(0, 4, (n,), generator=gen)
    x = torch.cat([centres[category, action] + 0.08 * torch.randn(n, informative, generator=gen),
                   torch.rand(n, 8 - informative, generator=gen)], dim=1)
    memory = JudgmentMemory(2, 4, 8, config=JudgmentConfig.seed())
    optimizer = torch.optim.Adam(memory.parameters(), lr=0.05)
    for start in range(0, n, 100):
        sl = slice(start, start + 100)
        step = memory.prequential_(x[sl], category[sl], action[sl])
        loss = memory.attention_loss(step, category[sl], action[sl])
        torch.testing.assert_close(loss, masked_cross_entropy(memory.attention_logits(step, category[sl]), action[sl]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    attention = memory.criterion_attention().detach()
    assert (attention[:, :informative].min(dim=1).values > attention[:, informative:].max(dim=1).values).all()
    assert torch.allclose(attention.sum(1), torch.full((2,), 8.0))


def test_attention_logits_equal_forward_logits_before_learning():
    raw, category, action = raw_stream(2, 200, raw=8)
    x = torch.sigmoid(raw)
    memory = JudgmentMemory(2, 3, 8, config=JudgmentConfig.seed())
    memory.learn_(x[:100], category[:100], action[:100])
    with torch.no_grad():
        memory.criterion_logits.normal_()
    expected = memory(x[100:], category[100:]).logits
    step = memory.prequential_(x[100:], category[100:], action[100:])
    got = memory.attention_logits(step, category[100:])
    torch.testing.assert_close(got[:1], expected[:1])  # the first one sees the same state
    assert got.requires_grad


def test_torch_compile_of_a_model_with_the_memory(tmp_path):
    """In a fresh process with a cache of its own: run after the rest of the suite in one process,
    inductor's compiled forward crashed with 'double free or corruption' on an AVX-512 Xeon (at
    362a626 too), and an inductor cache shared with runs under other kernel settings may hold
    code for another CPU. The check itself is :func:`check_torch_compile`."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", "from tests.test_embedding import check_torch_compile; "
                           "check_torch_compile()"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def check_torch_compile() -> None:
    torch.manual_seed(0)
    agent = Agent()
    raw, category, action = raw_stream(3, 256)
    with torch.no_grad():
        agent.memory.learn_(agent.encoder(raw), category, action)
    compiled = torch.compile(agent, fullgraph=True)  # fullgraph: no graph break anywhere in forward
    eager_out, compiled_out = agent(raw, category), compiled(raw, category)
    torch.testing.assert_close(compiled_out.logits, eager_out.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(compiled_out.action, eager_out.action)
    masked_cross_entropy(compiled_out.logits, action).backward()
    assert agent.encoder[0].weight.grad is not None and agent.memory.criterion_logits.grad is not None
