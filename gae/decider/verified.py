"""What a verified decision teaches: the memory learns it, and act or refer learns from its outcome.

:func:`learned` is the one function a :class:`~gae.Decider` learns through, live, in a replay
of its ledger and from another writer's commit: the memory's ``learn_one``, then, for a decision
that was verified (not a plain ``learn_one``), its outcome told to the referral, tagged with the
sequence number its learn took. :func:`verified_of` reads what a ledger's learn event says of it.
"""

from __future__ import annotations

from typing import Any

from gae.decider.refer import Referral
from gae.ledger.events import LEARN, Event, learn


def learned(memory: Any, referral: Referral, row: Any, action: Any, category: Any, confirmed: bool | None,
            outcome: str | None, source: int | None, verified: tuple[float, bool, tuple[str, ...]] | None,
            meet: bool = True) -> dict[str, Any]:
    """One learn on ``memory`` (:func:`gae.ledger.events.apply_event`'s learn) and, for a verified
    decision (``verified``: the confidence it was decided with, whether the memory had an opinion,
    and its reasons), its outcome told to ``referral``, tagged with the sequence number its learn
    took. The one function a Decider learns through: live, in a replay, from another writer."""
    seq = memory.next_seq
    result = (learn(memory, row, action, category, confirmed, outcome, source, meet) if meet else
              memory.learn_one(row, action, category, confirmed, outcome, source_id=source))  # (learn's, in short)
    if verified is not None and not result["skipped"]:
        confidence, decided, reasons = verified
        if memory.inspects:  # the category's trust after learning it: recent_change's history
            c = memory.category_index(category)
            referral.observe_verified(c, confidence, bool(confirmed), decided, reasons, seq, memory.trust_one(category))
        else:
            referral.observe_verified(-1, confidence, bool(confirmed), decided, reasons, seq, None)
    return result


def verified_of(event: Event) -> tuple[float, bool, tuple[str, ...]] | None:
    """What a learn event says of the verified decision it learned (None: a plain ``learn_one``):
    the confidence it was decided with, whether the memory had an opinion, and its reasons. A
    ledger written before the reasons were recorded has ``eligible`` and ``alone`` instead: the
    reasons are read back as the fewest that give them (none, or ``low_confidence`` alone, or
    another one)."""
    verified = event.detail.get("referral") if event.kind == LEARN else None
    if verified is None:
        return None
    confidence = min(max(float(verified["confidence"]), 0.0), 1.0)
    if "reasons" in verified:
        return confidence, bool(verified["decided"]), tuple(verified["reasons"])
    eligible, alone = bool(verified.get("eligible")), bool(verified.get("alone"))
    reasons = () if alone else ("low_confidence",) if eligible else ("small_margin",)
    return confidence, eligible or alone, reasons
