"""The Decider: a memory served to agents.

``decider.py`` holds :class:`Decider` (decide / verify / pending / forget_ / undo_ /
explain_decision, thread safety), ``decision.py`` the :class:`Decision` it answers and the book
of pending decisions, ``refer.py`` act or refer (:class:`~gae.decider.refer.Referral` and its
calibration), ``signals.py`` what a memory's state says about a decision (``novel``,
``recent_change``), and ``durable.py`` the ledger a Decider given a store writes every call to.
"""

from gae.decider.decider import Decider
from gae.decider.decision import Decision

__all__ = ["Decider", "Decision"]
