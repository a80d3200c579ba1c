"""Retrieval-style memory: embedded traces scored by similarity, recency and importance.

``memory.py`` holds :class:`EpisodicMemory` (scopes, validity, deletes, versions, audit),
``retrieving.py`` its retrieval, ``text.py`` its text memories (``remember`` / ``recall``) and
``embedders.py`` what embeds them, ``persistence.py`` its write-through to a store and its
state_dict, ``records.py`` what it returns and keeps, ``scorer.py`` the :class:`RetrievalScorer`
and the chunked top-k,
``admission.py`` the :class:`AdmissionPolicy`, ``columns.py`` the per-memory column parsing,
and ``store/`` the durable stores (SQLite by default, Postgres + pgvector).
"""

from gae.episodic.admission import Admission, AdmissionPolicy
from gae.episodic.memory import EVICTIONS, EpisodicMemory
from gae.episodic.records import AuditRecord, Retrieval
from gae.episodic.scorer import RetrievalScorer, ScoreComponents, top_k

__all__ = ["EVICTIONS", "Admission", "AdmissionPolicy", "AuditRecord", "EpisodicMemory", "Retrieval",
           "RetrievalScorer", "ScoreComponents", "top_k"]
