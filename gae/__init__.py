"""gae: decision memory for agents, in PyTorch.

The models (:mod:`gae.models`, :mod:`gae.judgment`) are ``nn.Module``s that score, learn, explain
and forget: ``JudgmentMemory`` learns prototypes per (category, action) from verified decisions
and scores new ones in microseconds; ``KNNMemory`` and ``RetrievalMemory`` are the retrieval
memories it is measured against. They share one API: ``forward`` (batched scoring),
``prequential_`` (exact score-before-learn), ``learn_``, and the single-decision ``score_one`` /
``learn_one``. :class:`Decider` serves any of them to agents: ``decide`` / ``verify``, act or
refer, and a durable ledger in a store (:mod:`gae.storage`). docs/architecture.md draws the layers.

Each name below is imported from its layer on first use, so a model used inside a larger one
loads the models' code alone: no storage, no ledger, no server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gae import kernel_cache as _kernel_cache
from gae import moved as _moved

_moved.install()
_kernel_cache.install()  # before any kernel is defined: where a read-only install caches them (gae.kernel_cache)

_HOMES = {  # public name -> the module that defines it
    "Admission": "gae.episodic.admission", "AdmissionPolicy": "gae.episodic.admission",
    "AuditRecord": "gae.episodic", "Decider": "gae.decider", "Decision": "gae.decider",
    "DecisionMemory": "gae.models", "EpisodicMemory": "gae.episodic", "GateLog": "gae.types",
    "JudgmentConfig": "gae.judgment", "JudgmentMemory": "gae.judgment", "KNNMemory": "gae.models",
    "LearnEvents": "gae.types", "MemoryOutput": "gae.types", "Retrieval": "gae.episodic",
    "RetrievalMemory": "gae.models", "RetrievalScorer": "gae.episodic.scorer", "StreamStep": "gae.types",
    "safe_load": "gae.loading",
}
__all__ = ["Admission", "AdmissionPolicy", "AuditRecord", "Decider", "Decision", "DecisionMemory", "EpisodicMemory",
           "GateLog", "JudgmentConfig", "JudgmentMemory", "KNNMemory", "LearnEvents", "MemoryOutput", "Retrieval",
           "RetrievalMemory", "RetrievalScorer", "StreamStep", "safe_load"]  # (_HOMES' names)
__version__ = "0.1.0"

if TYPE_CHECKING:  # what a type checker and the docs' reader see; at run time, __getattr__ below
    from gae.decider import Decider, Decision
    from gae.episodic import AuditRecord, EpisodicMemory, Retrieval
    from gae.episodic.admission import Admission, AdmissionPolicy
    from gae.episodic.scorer import RetrievalScorer
    from gae.judgment import JudgmentConfig, JudgmentMemory
    from gae.loading import safe_load
    from gae.models import DecisionMemory, KNNMemory, RetrievalMemory
    from gae.types import GateLog, LearnEvents, MemoryOutput, StreamStep


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gae' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups find it directly
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
