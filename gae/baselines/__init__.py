"""The retrieval baselines the judgment memory is measured against.

``knn.py`` holds :class:`KNNMemory` (the original design's k-NN memory on tensors), with its
rule and engine in ``knn_engine.py`` and its compiled loop in ``knn_kernels.py``;
``retrieval_memory.py`` holds :class:`RetrievalMemory`, a decision memory over an
:class:`~gae.EpisodicMemory`.
"""

from gae.baselines.knn import KNNMemory
from gae.baselines.retrieval_memory import RetrievalMemory

__all__ = ["KNNMemory", "RetrievalMemory"]
