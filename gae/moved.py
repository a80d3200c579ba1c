"""What a redesign moved: using it by its old name fails with one sentence naming the new home.

gae is grouped by layer (docs/architecture.md). A module that moved is not kept under its old
name as a copy or an alias; :class:`MovedFinder`, installed on ``sys.meta_path`` by ``import gae``,
answers an import of the old name with an :class:`ImportError` that says where it went. What a
memory served itself before the :class:`~gae.Decider` (:data:`SERVED` attributes, :data:`SERVING`
constructor arguments) answers the same way, from the memory.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

# old module -> where its names are now
MOVED = {
    "gae._base": "gae.models.base (DecisionMemory)",
    "gae._views": "gae.models.base (DecisionMemory)",
    "gae.lifecycle": "gae.decider (Decider, Decision): Decider(memory).decide(...)",
    "gae.durable": "gae.decider.durable (a Decider given a store): Decider(memory, store=...)",
    "gae.durable_calls": "gae.decider.durable (a Decider given a store): Decider(memory, store=...)",
    "gae.refer": "gae.decider.refer (Referral, ReferralCalibrator, REASONS)",
    "gae.baselines": "gae.models (KNNMemory, RetrievalMemory; also from gae import KNNMemory)",
    "gae.episodic.store": "gae.storage (SQLiteStore, PostgresStore, StoreCorrupted, ...)",
    "gae.judgment.history_api": "gae.judgment.memory (JudgmentMemory's undo_, forget_, trace, logs)",
    "gae.judgment.judges_api": "gae.judgment.judged (the judges' panel of a JudgmentMemory)",
    "gae.judgment.referring": "gae.decider.signals (act or refer's novel and recent_change)",
    "gae.judgment.online_judges": "gae.judgment.online (the single-decision path, judges included)",
}


# a memory's attributes that a Decider serves now: the sentence each old use answers with
SERVED = {name: f"Decider(memory).{name}" for name in (
    "decide", "verify", "verify_many", "pending", "explain_decision", "sync", "referral", "max_pending",
    "pending_ttl", "expired_decisions", "ledger_version")}
SERVED.update({name: f"Decider(memory, store=..., {name}=...)" for name in ("snapshot_every", "durable_decisions")})
SERVED.update({name: f"Decider(memory, store=...).{name}(...) (it replays the ledger without them)"
              for name in ("forget_", "undo_")})  # (the k-NN and retrieval memories forget and undo on a ledger)
# a memory's constructor arguments that configured serving, now the Decider's
SERVING = ("store", "ledger", "snapshot_every", "durable_decisions", "max_pending", "pending_ttl", "target_error",
           "refer_confidence", "refer_margin")


def refuse_serving(owner: str, given: Mapping[str, Any]) -> None:
    """TypeError for a constructor argument that configures serving (a store, act or refer, pending
    decisions): one sentence naming the Decider's call."""
    moved = [name for name in SERVING if name in given]
    if moved:
        named = ", ".join(f"{name}=..." for name in moved)
        raise TypeError(f"{owner}({named}): serving a memory moved to gae.Decider: Decider({owner}(...), {named})")


class MovedFinder:
    """A meta path finder that refuses the old names of :data:`MOVED` (and their submodules)."""

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        for old, new in MOVED.items():
            if name == old or name.startswith(old + "."):
                raise ImportError(f"{name} moved: its names are in {new}", name=name)
        return None


def install() -> None:
    """Put :class:`MovedFinder` first on ``sys.meta_path``, once."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
