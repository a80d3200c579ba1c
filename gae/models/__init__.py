"""The models: decision memories as ``nn.Module``s that score, learn, explain and forget.

``base.py`` holds :class:`DecisionMemory`, the one base of every model (names, boundary checks,
the batched and single-decision APIs, all-or-nothing loading). The judgment memory, the
product's own model, has a package of its own (:mod:`gae.judgment`); here are the retrieval
memories it is measured against: ``knn.py`` holds :class:`KNNMemory` (the original design's
k-NN memory on tensors), with its rule and engine in ``knn_engine.py`` and its compiled loop in
``knn_kernels.py``; ``retrieval.py`` holds :class:`RetrievalMemory`, a decision memory over an
in-RAM :class:`~gae.EpisodicMemory`, with its single-decision path in ``retrieval_engine.py``
and ``retrieval_kernels.py``. No model imports storage, pending decisions or act or refer:
serving a model is :class:`gae.Decider`'s. Each name is imported on first use, so that importing
one model (the base, with a judgment memory) loads no other.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {"DecisionMemory": "gae.models.base", "KNNMemory": "gae.models.knn", "RetrievalMemory": "gae.models.retrieval"}
__all__ = ["DecisionMemory", "KNNMemory", "RetrievalMemory"]  # (_HOMES' names)

if TYPE_CHECKING:
    from gae.models.base import DecisionMemory
    from gae.models.knn import KNNMemory
    from gae.models.retrieval import RetrievalMemory


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gae.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
