"""The judgment memory's own reasons to refer a decision (:class:`gae.refer.Referral`): ``novel``,
from the category's running spread (``learning='lvq'`` keeps it), and ``recent_change``, from the
change test (``drift_mode='adaptive'``) and the trust weights (judges)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from gae.judgment.float32 import VARIANCE_FLOOR
from gae.refer import NOVEL_AFTER, Referral, novel_bound


class ReferringMixin:
    """``_refer_signals`` and ``_trust_row`` of :class:`~gae.JudgmentMemory` (see the module)."""

    referral: Referral
    n_factors: int
    config: Any
    trust_weights: Tensor
    centroids: Tensor
    initialized: Tensor
    input_counts: Tensor
    input_variances: Tensor
    promotion_statistic: Tensor

    if TYPE_CHECKING:  # provided by DecisionMemory
        def _category_index(self, category: str | int) -> int: ...

    def _refer_signals(self, row: np.ndarray | Tensor, category: str | int) -> tuple[str, ...]:
        """``novel``: the case lies farther from every prototype of its category than
        :func:`gae.refer.novel_bound` allows, in units of the category's running variance per
        criterion (``learning='lvq'``, once it rests on :data:`gae.refer.NOVEL_AFTER` decisions).
        ``recent_change``: the change test is at least halfway to its threshold, or the trust
        weights moved (:meth:`gae.refer.Referral.trust_moved`). Read on NumPy views of the
        buffers (microseconds a decision, once per decide)."""
        config, c = self.config, self._category_index(category)
        signals = []
        if config.lvq and int(_host(self.input_counts)[c]) >= NOVEL_AFTER:
            used = _host(self.initialized)[c]  # (A, P)
            if used.any():
                x = row.detach().cpu().numpy() if isinstance(row, Tensor) else row
                spread = _host(self.input_variances)[c].astype(np.float64) + VARIANCE_FLOOR
                nearest = ((((x - _host(self.centroids)[c][used]) ** 2) / spread).sum(-1)).min()
                if nearest > novel_bound(self.n_factors):
                    signals.append("novel")
        moved = config.adaptive and float(_host(self.promotion_statistic)[c]) >= config.promotion_threshold / 2
        trust = self._trust_row(category)
        if moved or (trust is not None and self.referral.trust_moved(c, trust)):
            signals.append("recent_change")
        return tuple(signals)

    def _trust_row(self, category: str | int) -> list[float] | None:
        """The category's trust weights in force (None without judges): uniform before it learned
        (:func:`gae.judgment.trust.weights_of`)."""
        if not self.config.judges:
            return None
        row = _host(self.trust_weights)[self._category_index(category)]
        return [1.0 / row.size] * row.size if not row.any() else row.tolist()


def _host(tensor: Tensor) -> np.ndarray:
    """A NumPy view of a buffer (a copy when it is not on the CPU)."""
    return tensor.detach().numpy() if tensor.device.type == "cpu" else tensor.detach().cpu().numpy()
