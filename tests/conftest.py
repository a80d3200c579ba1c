"""Shared fixtures: seeded decision streams and factories for every memory."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from tests.postgres_fixtures import dsn, server  # noqa: F401 - Postgres for the tests that take dsn (a module may define its own)

CATEGORIES, ACTIONS, FACTORS = 4, 4, 8


class Stream(NamedTuple):
    x: torch.Tensor  # (N, K)
    category: torch.Tensor  # (N,)
    action: torch.Tensor  # (N,)
    skip: torch.Tensor  # (N,)


def clustered_stream(seed: int, n: int, *, noise: float = 0.12, skip_rate: float = 0.05,
                     label_noise: float = 0.1, drift_at: int | None = None) -> Stream:
    """Decisions clustered around a centre per (category, action), optional prototype permutation."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.rand(CATEGORIES, ACTIONS, FACTORS, generator=gen)
    category = torch.randint(0, CATEGORIES, (n,), generator=gen)
    action = torch.randint(0, ACTIONS, (n,), generator=gen)
    source = action.clone()
    if drift_at is not None:
        source[drift_at:] = (action[drift_at:] + 1) % ACTIONS  # the world's mapping changes
    x = (centres[category, source] + noise * torch.randn(n, FACTORS, generator=gen)).clamp(0, 1)
    flip = torch.rand(n, generator=gen) < label_noise
    action = torch.where(flip, torch.randint(0, ACTIONS, (n,), generator=gen), action)
    skip = torch.rand(n, generator=gen) < skip_rate
    return Stream(x, category, action, skip)


def make_judgment(**kwargs) -> JudgmentMemory:
    return JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, **{"config": JudgmentConfig.seed(), **kwargs})


def make_knn(**kwargs) -> KNNMemory:
    kwargs = {"k": 5, "capacity": 50, "categories": CATEGORIES, **kwargs}
    return KNNMemory(factors=FACTORS, actions=ACTIONS, **kwargs)


def make_retrieval(**kwargs) -> RetrievalMemory:
    kwargs = {"k": 5, "capacity": 50, "categories": CATEGORIES, **kwargs}
    return RetrievalMemory(factors=FACTORS, actions=ACTIONS, **kwargs)


MEMORY_FACTORIES = {
    "judgment": make_judgment,
    "judgment_options": lambda: make_judgment(clip=(0.0, 1.0), push_rate=0.02, min_confidence=0.3),
    "judgment_adaptive": lambda: make_judgment(drift_mode="adaptive"),
    "judgment_adaptive_options": lambda: make_judgment(drift_mode="adaptive", clip=(0.0, 1.0), push_rate=0.02,
                                                       min_confidence=0.3, shadow_eta=0.5,
                                                       promotion_threshold=2.0),
    "judgment_prototypes": lambda: make_judgment(prototypes=3),
    "judgment_prototypes_options": lambda: make_judgment(prototypes=4, drift_mode="adaptive", clip=(0.0, 1.0),
                                                         push_rate=0.02, min_confidence=0.3, promotion_threshold=2.0,
                                                         spawn_threshold=0.45, spawn_support=2.0),
    "judgment_lvq": lambda: make_judgment(learning="lvq", prototypes=3, push_rate=0.5, relevance_rate=0.05,
                                          miss_penalty=0.5),
    "judgment_lvq_options": lambda: make_judgment(learning="lvq", prototypes=4, push_rate=1.0, relevance_rate=0.2,
                                                  clip=(0.0, 1.0), min_confidence=0.3, spawn_threshold=0.05,
                                                  spawn_support=0.0, rate_floor=0.1, units="criterion",
                                                  miss_penalty=0.5),
    # the memory-wide units and the step size that follows the recent errors (the recommended prototypes' rule)
    "judgment_lvq_memory": lambda: make_judgment(learning="lvq", prototypes=3, push_rate=0.5, relevance_rate=0.05,
                                                 miss_penalty=0.5, units="memory", spawn_support=0.25,
                                                 rate_per_error=1.0),
    # the judges beside the prototypes, and the recommended preset (lvq, 32 prototypes, four judges)
    "judgment_judges": lambda: make_judgment(judges={"gauss": {}, "lda": {"kind": "lda", "rate_floor": 0.05}}),
    "judgment_recommended": lambda: make_judgment(config=JudgmentConfig.recommended()),
    "knn": make_knn,
    "knn_scoped": lambda: make_knn(scoped=True, respect_skip=True),
    "retrieval": lambda: make_retrieval(scoped=True),
}
# the memories whose online loop has a compiled kernel and a torch reference
ENGINE_FACTORIES = {name: MEMORY_FACTORIES[name] for name in ("judgment", "judgment_options", "judgment_adaptive",
                                                               "judgment_adaptive_options", "judgment_prototypes",
                                                               "judgment_prototypes_options", "judgment_lvq",
                                                               "judgment_lvq_options", "knn", "knn_scoped")}


@pytest.fixture(params=sorted(MEMORY_FACTORIES))
def memory_factory(request):
    return MEMORY_FACTORIES[request.param]


@pytest.fixture
def stream() -> Stream:
    return clustered_stream(0, 300, drift_at=150)
