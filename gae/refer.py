"""Act or refer: a confidence threshold, calibrated online on verified decisions, under which a
decision goes to a person, so that the error among the decisions taken alone stays at most a target.

:class:`ReferralCalibrator` keeps the last ``window`` verified decisions' (confidence, correct)
pairs: the confidence the memory gave when it decided, and whether its recommendation was the
verified action. Its :attr:`~ReferralCalibrator.threshold` is the lowest level on a fixed grid
whose selective error, the error among the window's decisions at least that confident, has an
upper confidence bound (Chernoff's, in relative entropy) at most ``target_error``, every level
tested at ``delta / len(grid)`` (Bonferroni): Learn then Test (Angelopoulos, Bates, Candès,
Jordan and Lei, 2021). The guarantee: if the window's decisions and the next one are exchangeable
(drawn alike, as in a stream that does not drift), then with probability at least ``1 - delta``
the next decision taken alone is wrong with probability at most ``target_error``. Without enough
evidence (too few verified decisions, or too many wrong) no level passes, the threshold is
``inf`` and every decision is referred. After a drift the window holds the old regime until
``window`` new verifications replace it; ``recent_change`` (the memory's own signal) says so.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any

import numpy as np

from gae import validation as check

WINDOW = 2000  # verified decisions the calibration looks at, by default
DELTA = 0.05  # the probability that the bound fails, by default
GRID = (*(round(0.30 + 0.05 * i, 2) for i in range(12)), *(round(0.90 + 0.01 * i, 2) for i in range(10)),
        0.995, 0.999)  # the levels tested, 0.30 to 0.999: fixed before any data


def kl_upper_bound(errors: np.ndarray, n: np.ndarray, budget: float) -> np.ndarray:
    """The largest ``p`` with ``n * kl(errors / n, p) <= budget`` for each pair (1 where ``n`` is
    0): Chernoff's upper confidence bound on a binomial rate, ``P(rate > bound) <= exp(-budget)``."""
    errors, n = np.asarray(errors, dtype=np.float64), np.asarray(n, dtype=np.float64)
    observed = np.divide(errors, n, out=np.ones_like(n), where=n > 0)
    low, high = observed.copy(), np.ones_like(observed)
    for _ in range(50):  # bisection: kl(observed, p) grows in p above observed
        middle = (low + high) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = (np.where(observed > 0, observed * np.log(observed / middle), 0.0)
                  + np.where(observed < 1, (1 - observed) * np.log((1 - observed) / (1 - middle)), 0.0))
        inside = n * kl <= budget
        low, high = np.where(inside, middle, low), np.where(inside, high, middle)
    return np.where(n > 0, high, 1.0)


class ReferralCalibrator:
    """The act-or-refer threshold of one memory (see the module). Thread-safe.

    Args:
        target_error: the error allowed among the decisions taken alone, in (0, 1).
        window: the verified decisions it calibrates on (the newest).
        delta: the probability, in (0, 1), that the guarantee fails.
    """

    def __init__(self, target_error: float, *, window: int = WINDOW, delta: float = DELTA) -> None:
        self.target_error = check.check_real("target_error", target_error, low=0.0, high=1.0, low_open=True,
                                             high_open=True)
        self.window = check.check_int("window", window, low=1)
        self.delta = check.check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
        self._seen: deque[tuple[float, bool]] = deque(maxlen=self.window)
        self._threshold: float | None = math.inf  # None: to be computed again
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, confidence: float, correct: bool) -> None:
        """One verified decision: the confidence it was decided with, and whether the memory's
        recommendation was the verified action."""
        confidence = check.check_real("confidence", confidence, low=0.0, high=1.0)
        if not isinstance(correct, (bool, np.bool_)):
            raise TypeError(f"correct must be a bool, got {correct!r}")
        with self._lock:
            self._seen.append((confidence, bool(correct)))
            self._threshold = None

    @property
    def threshold(self) -> float:
        """The lowest confidence a decision may be taken alone at (``inf``: refer every one)."""
        with self._lock:
            if self._threshold is None:
                self._threshold = self._calibrate()
            return self._threshold

    def _calibrate(self) -> float:
        if not self._seen:
            return math.inf
        confidence = np.fromiter((c for c, _ in self._seen), dtype=np.float64, count=len(self._seen))
        wrong = np.fromiter((not ok for _, ok in self._seen), dtype=np.float64, count=len(self._seen))
        order = np.argsort(-confidence, kind="stable")
        confidence, errors = confidence[order], np.cumsum(wrong[order])
        levels = np.asarray(GRID)
        n = np.searchsorted(-confidence, -levels, side="right")  # decisions at least this confident
        k = np.where(n > 0, errors[np.maximum(n - 1, 0)], 0.0)
        bound = kl_upper_bound(k, n, math.log(len(GRID) / self.delta))
        passing = levels[bound <= self.target_error]
        return float(passing.min()) if passing.size else math.inf

    def state(self) -> dict[str, Any]:
        """What :meth:`load_state` takes back: the settings and the window's pairs, oldest first."""
        with self._lock:
            return {"target_error": self.target_error, "window": self.window, "delta": self.delta,
                    "confidence": [c for c, _ in self._seen], "correct": [ok for _, ok in self._seen]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Replace the window with ``state``'s (checked first: a bad state changes nothing)."""
        confidence, correct = list(state["confidence"]), list(state["correct"])
        if len(confidence) != len(correct) or len(confidence) > self.window:
            raise ValueError(f"a calibration state of {len(confidence)} confidences and {len(correct)} outcomes does "
                             f"not fit a window of {self.window}")
        pairs = [(check.check_real("confidence", c, low=0.0, high=1.0), bool(ok))
                 for c, ok in zip(confidence, correct, strict=True)]
        with self._lock:
            self._seen = deque(pairs, maxlen=self.window)
            self._threshold = None
