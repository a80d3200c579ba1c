"""gae: decision memory for agents, in PyTorch.

``JudgmentMemory`` learns one prototype per (category, action) from verified decisions and
scores new ones in microseconds; ``KNNMemory`` is the retrieval baseline it is measured
against. Both share one API: ``forward`` (batched scoring), ``prequential_`` (exact
score-before-learn), ``learn_``, and the single-decision ``score_one`` / ``learn_one``.
"""

from gae.baselines.knn import KNNMemory
from gae.baselines.retrieval_memory import RetrievalMemory
from gae.episodic import AuditRecord, EpisodicMemory, Retrieval
from gae.episodic.admission import Admission, AdmissionPolicy
from gae.episodic.scorer import RetrievalScorer
from gae.judgment import JudgmentConfig, JudgmentMemory
from gae.lifecycle import Decision
from gae.loading import safe_load
from gae.types import GateLog, LearnEvents, MemoryOutput, StreamStep

__all__ = ["Admission", "AdmissionPolicy", "AuditRecord", "Decision", "EpisodicMemory", "GateLog", "JudgmentConfig",
           "JudgmentMemory", "KNNMemory", "LearnEvents", "MemoryOutput", "Retrieval", "RetrievalMemory",
           "RetrievalScorer", "StreamStep", "safe_load"]
__version__ = "0.1.0"
