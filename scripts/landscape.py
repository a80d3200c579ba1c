"""The retrieval-score landscape of a simulated memory stream, as in the original design.

    python scripts/landscape.py                          # 200 events into a 30-memory store, D = 2
    python scripts/landscape.py --dim 16 --eviction fifo --out /tmp/landscape

Memories form every half second of simulated time around a few topics (clusters of directions),
with Beta-distributed importance. Each is added with the live query, which changes every few
seconds, so over capacity the lowest-scoring memory against it is forgotten. At the end a fresh
random query arrives. Writes ``landscape.png`` (that final view) and TensorBoard images
(``tensorboard/``, tag ``landscape``, one per snapshot, step = events seen) to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import EpisodicMemory  # noqa: E402
from gae.viz import landscape_figure  # noqa: E402
from training.cli import auto_cli  # noqa: E402

TOPICS = 4  # clusters of embeddings
TOPIC_SPREAD = 0.25  # noise around a topic's direction, before normalising
EVENTS_PER_QUERY = 10  # the live query changes every 5 s of simulated time
IMPORTANCE_BETA = (2.0, 3.0)  # Beta(a, b) importance: mostly middling, a few high


def landscape(seed: int = 0, events: int = 200, capacity: int = 30, dim: int = 2,
              eviction: Literal["lowest_score", "fifo", "importance_recency"] = "lowest_score",
              seconds_per_event: float = 0.5, snapshots: int = 4, k: int = 5,
              out: Path = Path("results/landscape")) -> dict[str, Path]:
    """Simulate the stream, then draw the store's landscape for a new query.

    Args:
        seed: seeds the topics, the embeddings, the importance and the queries.
        events: memories formed, one every ``seconds_per_event``.
        capacity: memories the store keeps.
        dim: embedding width D (2 draws the embeddings themselves, more a PCA projection).
        eviction: the store's eviction rule.
        seconds_per_event: simulated time between two memories.
        snapshots: TensorBoard images, evenly spaced over the stream (the last is the final view).
        k: memories retrieved (ringed).
        out: folder for landscape.png and tensorboard/.
    """
    if events < 1 or snapshots < 1 or seconds_per_event <= 0:
        raise ValueError(f"need events >= 1, snapshots >= 1, seconds_per_event > 0; got events={events}, "
                         f"snapshots={snapshots}, seconds_per_event={seconds_per_event}")
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(seed)
    topics = _unit(rng.standard_normal((TOPICS, dim)))
    if dim == 2:  # spread evenly round the circle, as in the original design
        angles = rng.uniform(0, 2 * np.pi) + 2 * np.pi * np.arange(TOPICS) / TOPICS
        topics = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    memory = EpisodicMemory(dim, capacity, eviction=eviction)
    snapshot_at = set(np.linspace(events / snapshots, events, snapshots).round().astype(int).tolist())
    out.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(out / "tensorboard"))
    query = _query(rng, dim)
    for event in range(1, events + 1):
        now = event * seconds_per_event
        if event % EVENTS_PER_QUERY == 1:
            query = _query(rng, dim)
        embedding = topics[rng.integers(TOPICS)] + TOPIC_SPREAD * rng.standard_normal(dim)
        memory.add(torch.tensor(embedding, dtype=torch.float32).unsqueeze(0),
                   torch.tensor([rng.beta(*IMPORTANCE_BETA)], dtype=torch.float32), query=query, now=now)
        if event in snapshot_at and event != events:
            writer.add_figure("landscape", landscape_figure(memory, query, now, k=k,
                                                            title=f"after {event} events"), event)
    now = events * seconds_per_event
    query = _query(rng, dim)  # a new question arrives
    evicted = sum(len(r.ids) for r in memory.audit_log if r.action == "evict")
    figure = landscape_figure(memory, query, now, k=k, title=f"a new query after {events} events "
                                                                f"({evicted} forgotten, {eviction} eviction)")
    png = out / "landscape.png"
    figure.savefig(png, dpi=110)
    writer.add_figure("landscape", figure, events)
    writer.close()
    print(f"{len(memory)} memories kept, {evicted} forgotten over {now:g} s of simulated time")
    print(f"wrote {png} and {out / 'tensorboard'} ({len(snapshot_at)} snapshots under tag 'landscape'; "
          f"tensorboard --logdir {out / 'tensorboard'})")
    return {"png": png, "tensorboard": out / "tensorboard"}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _query(rng: np.random.Generator, dim: int) -> torch.Tensor:
    return torch.tensor(_unit(rng.standard_normal(dim)), dtype=torch.float32)


if __name__ == "__main__":
    auto_cli(landscape)
