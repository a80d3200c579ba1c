"""What a memory's state says about one decision, for act or refer: ``novel`` and ``recent_change``.

A Decider reads these from the memory it serves through :meth:`gae.DecisionMemory.assess_one`
(its :class:`~gae.types.CaseState`), never changing it; the bounds that turn them into reasons are
act or refer's, here. A memory that keeps no spread, no change test and no judges (a k-NN, a
judgment memory of the gated rule without judges) gives no signal.

- ``novel``: the case lies farther from every prototype of its category than
  :func:`gae.decider.refer.novel_bound` allows, in units of the category's running variance per
  criterion (``learning='lvq'`` keeps it), once that spread rests on
  :data:`gae.decider.refer.NOVEL_AFTER` decisions.
- ``recent_change``: the category's change test (``drift_mode='adaptive'``) is at least halfway to
  its threshold, or its trust weights (judges) moved (:meth:`gae.decider.refer.Referral.trust_moved`).
"""

from __future__ import annotations

import math

from gae.decider.refer import NOVEL_AFTER, Referral, novel_bound
from gae.types import CaseState

CHANGE_HALFWAY = 0.5  # the change test this far to its threshold: recent_change


def signals(state: CaseState | None, c: int, referral: Referral, n_factors: int) -> tuple[str, ...]:
    """The memory's own reasons to refer a decision in category index ``c``, from what its state
    says of the case (:meth:`gae.DecisionMemory.assess_one`'s ``state``), in
    :data:`gae.decider.refer.REASONS` order."""
    if state is None:
        return ()
    found: tuple[str, ...] = ()
    if state.support >= NOVEL_AFTER and math.isfinite(state.novelty) and state.novelty > novel_bound(n_factors):
        found = ("novel",)
    if state.change >= CHANGE_HALFWAY or (state.trust is not None and referral.trust_moved(c, state.trust)):
        found += ("recent_change",)
    return found
