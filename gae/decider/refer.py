"""Act or refer: a confidence threshold, calibrated online on verified decisions, under which a
decision goes to a person, so that the error among the decisions taken alone stays at most a target.

:class:`ReferralCalibrator` keeps the last ``window`` verified decisions' (confidence, correct)
pairs: the confidence the memory gave when it decided, and whether its recommendation was the
verified action. For each level ``l`` of a grid fixed before any data (:data:`GRID`) it tests the
hypothesis "the decisions at least ``l`` confident err more often than ``target_error``" with the
exact binomial p-value of the window's errors at that level (:func:`binomial_cdf`). The levels are
tested by the fallback procedure (Wiens, 2003), strictest first: ``delta`` is shared among the
levels where a chain starts (:data:`CHAIN_STARTS`, equal shares); a level is tested at its share
plus what the level above it was tested at when that one passed (nothing when it failed), so a run
of passing levels carries its budget down the grid, as fixed-sequence testing does, and a level
that fails (too few decisions as confident, as at the very top) costs only its share. The
threshold is the lowest level that passed: Learn then Test (Angelopoulos, Bates, Candès, Jordan
and Lei, 2021) with a fallback sequence in place of Bonferroni's ``delta / len(GRID)`` per level.

The guarantee: the fallback procedure controls the family-wise error at ``delta`` (every level it
passes truly errs at most the target, with probability at least ``1 - delta``: the first level
wrongly passed inherits only from the safe levels between it and the unsafe one before it, which
carried nothing on, and those stretches do not overlap, so a union bound over them is at most
``delta``), so if the
window's decisions and the next one are exchangeable (drawn alike, as in a stream that does not
drift), then with probability at least ``1 - delta`` the next decision taken alone is wrong with
probability at most ``target_error``. A first level passes after ``log(1 / share) / -log(1 -
target)`` right answers at least that confident (228 at 2% and ``delta`` 0.05 over five chains;
Bonferroni over the 27 levels needs 312). Until a level passes the threshold is ``inf``, every
decision is referred, and the reason is ``not_calibrated``, with :attr:`~ReferralCalibrator.needed`
the verified decisions it still needs at the least. After a drift the window holds the old regime
until ``window`` new verifications replace it; ``recent_change`` (the memory's own signal) says so.

:class:`Referral` is a decision memory's whole act-or-refer rule (``memory.referral``): the
reasons a decision goes to a person, each a plain word (:data:`REASONS`), the calibrator when the
memory has a ``target_error``, and what the reasons remember of the verified decisions. Every
entry it keeps is tagged with the sequence number of the learn that fed it, so ``undo_`` and
``forget_`` take out what they unlearn (:meth:`Referral.unlearned`).
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gae import validation as check

WINDOW = 2000  # verified decisions the calibration looks at, by default
DELTA = 0.05  # the probability that the bound fails, by default
GRID = (*(round(0.30 + 0.05 * i, 2) for i in range(12)), *(round(0.90 + 0.01 * i, 2) for i in range(10)),
        0.995, 0.999, 0.9999, 0.99999, 0.999999)  # the levels tested: fixed before any data
# (the top three for memories whose probabilities crowd next to 1, as a softmax of distances does)
CHAIN_STARTS = (0.999999, 0.999, 0.99, 0.95, 0.9)  # the levels delta is shared among, equally: one per
# decade of doubt where memories' confidences gather (a softmax of distances next to 1, a mixture of
# judges around 0.9 to 0.99, a vote of neighbours at 1), fixed before any data
SHARES = tuple(float(level in CHAIN_STARTS) / len(CHAIN_STARTS) for level in GRID)  # each level's share of delta
# why a decision goes to a person, in the order decide lists them
REASONS = ("unseen_category", "novel", "recent_change", "not_calibrated", "low_confidence", "small_margin")
THRESHOLD_ONLY = (("not_calibrated",), ("low_confidence",))  # the reasons of a decision the calibrator learns from
MIN_CONFIDENCE = 0.6  # without a target error: below this confidence, "low_confidence"
MIN_MARGIN = 0.1  # the best two probabilities closer than this: "small_margin"
RECENT = 20  # "recent_change" compares a category's trust now with its trust this many verifications ago
TRUST_MOVE = 0.25  # ... and reports a move of at least this much (total variation distance)
CHANGE_RATIO = 4.0  # the calibrator's change test: an error this many times the target ...
CHANGE_LEVEL = math.log(1000.0)  # ... made this much likelier than the target by the decisions taken alone
NOVEL_P = 0.999  # "novel": beyond this quantile of a chi-square over the criteria
NOVEL_AFTER = 30  # ... once the category's running spread rests on this many decisions


@functools.lru_cache(maxsize=256)  # per decide: computed once per number of criteria
def novel_bound(criteria: int) -> float:
    """The squared distance, in units of a category's running variance per criterion, past which a
    case over ``criteria`` criteria is ``novel``: the :data:`NOVEL_P` quantile of a chi-square with
    that many degrees of freedom, what a case drawn from a normal category exceeds once in a
    thousand measured to its mean (less often to its nearest prototype)."""
    k = check.check_int("criteria", criteria, low=1)
    low, high = 0.0, k + 10.0 * math.sqrt(2.0 * k) + 50.0  # P(chi2_k <= high) > NOVEL_P for every k
    for _ in range(100):  # bisection on the distribution function
        middle = (low + high) / 2
        low, high = (middle, high) if _chi2_cdf(middle, k) < NOVEL_P else (low, middle)
    return high


def _chi2_cdf(x: float, k: int) -> float:
    """P(chi-square with ``k`` degrees of freedom <= x): the regularised lower incomplete gamma
    P(k/2, x/2) by its power series, sum_n (x/2)^(a+n) e^(-x/2) / Gamma(a+n+1)."""
    a, half = k / 2.0, x / 2.0
    if half <= 0:
        return 0.0
    term = math.exp(a * math.log(half) - half - math.lgamma(a + 1.0))
    total, n = term, 0
    while term > 1e-17 * total:
        n += 1
        term *= half / (a + n)
        total += term
    return min(total, 1.0)


def binomial_cdf(errors: int, n: int, p: float) -> float:
    """P(K <= ``errors``) for K binomial of ``n`` draws at rate ``p``: the exact p-value of
    "these ``n`` decisions err at a rate of ``p`` or more" given ``errors`` of them wrong. Summed
    term by term from ``(1 - p) ** n`` (a few dozen terms where it matters: below ``p * n``)."""
    if errors >= n:
        return 1.0
    ratio = p / (1.0 - p)
    term = math.exp(n * math.log1p(-p))
    total = term
    for i in range(errors):
        term *= (n - i) / (i + 1) * ratio
        total += term
    return min(total, 1.0)


def passes(errors: int, n: int, target: float, level: float) -> bool:
    """Whether ``n`` decisions with ``errors`` wrong show an error rate below ``target`` at
    significance ``level``: ``binomial_cdf(errors, n, target) <= level`` (never without a decision,
    nor with an observed rate at the target or above)."""
    if n <= 0 or level <= 0.0 or errors >= target * n or n * math.log1p(-target) > math.log(level):
        return False  # (the last: not even n right answers would do)
    return binomial_cdf(errors, n, target) <= level


def needed(errors: int, n: int, target: float, level: float) -> int:
    """The fewest right answers to add to ``n`` decisions with ``errors`` wrong for them to pass
    (:func:`passes`) at ``level`` (0 when they pass): ``binomial_cdf`` falls as right answers come."""
    if passes(errors, n, target, level):
        return 0
    high = 1
    while not passes(errors, n + high, target, level):
        high *= 2
    low = high // 2  # fails at low (or low is 0), passes at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if passes(errors, n + middle, target, level) else (middle, high)
    return high


class _Locked:
    """An object guarded by its own ``_lock``: pickled and copied without it (a copy makes its own)."""

    _lock: threading.Lock

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class ReferralCalibrator(_Locked):
    """The act-or-refer threshold of one memory (see the module). Thread-safe.

    Beside the window it runs a change test on the decisions taken alone (Page's CUSUM of
    Bernoulli errors, :data:`CHANGE_RATIO` times the target against the target): when their
    errors pile up past what the target allows (:data:`CHANGE_LEVEL` nats of evidence), the window
    is emptied, so the threshold rests on the decisions after the change only (every decision is
    referred until they prove one again). That is no guarantee under drift, but it bounds how long
    a window of the old regime speaks for the new one.

    Args:
        target_error: the error allowed among the decisions taken alone, in (0, 1); None keeps
            the window (the evidence a memory with a target may load) with no threshold (``inf``)
            and no change test.
        window: the verified decisions it calibrates on (the newest).
        delta: the probability, in (0, 1), that the guarantee fails.
    """

    def __init__(self, target_error: float | None, *, window: int = WINDOW, delta: float = DELTA) -> None:
        self.target_error = None if target_error is None else check.check_real(
            "target_error", target_error, low=0.0, high=1.0, low_open=True, high_open=True)
        self.window = check.check_int("window", window, low=1)
        self.delta = check.check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
        self._evidence = (0.0, 0.0)  # nats an error and a right answer taken alone add to the change test
        if self.target_error is not None:
            target = self.target_error
            high = min(CHANGE_RATIO * target, (1.0 + target) / 2)  # the error the test looks for
            self._evidence = (math.log(high / target), math.log((1.0 - high) / (1.0 - target)))
        self._seen: deque[tuple[float, bool, bool, int]] = deque(maxlen=self.window)  # confidence, correct, alone, seq
        self._decided = [0] * (len(GRID) + 1)  # per level bucket: decisions (Python ints: one at a time is
        self._wrong = [0] * (len(GRID) + 1)  # cheaper than in a NumPy array), and the wrong ones
        self._change = 0.0  # the change test's statistic (nats)
        self.restarts = 0  # times the change test emptied the window
        self._threshold: float | None = math.inf  # None: to be computed again
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, confidence: float, correct: bool, seq: int = -1, *, alone: bool = False) -> None:
        """One verified decision: the confidence it was decided with, whether the memory's
        recommendation was the verified action, the sequence number of the learn that took it in
        (for :meth:`unlearned`; -1: none), and whether it was taken alone (the change test's)."""
        confidence = check.check_real("confidence", confidence, low=0.0, high=1.0)
        correct, alone = _flag("correct", correct, TypeError), _flag("alone", alone, TypeError)
        self._take(confidence, correct, alone, check.check_int("seq", seq, low=-1))

    def _take(self, confidence: float, correct: bool, alone: bool, seq: int) -> None:
        """:meth:`observe` of checked values."""
        with self._lock:  # (_count of the entry leaving and of the one coming, inline: once per verify)
            seen, decided, wrong = self._seen, self._decided, self._wrong
            if len(seen) == self.window:  # the oldest leaves the window
                oldest = seen[0]
                bucket = bisect.bisect_right(GRID, oldest[0])
                decided[bucket] -= 1
                if not oldest[1]:
                    wrong[bucket] -= 1
            seen.append((confidence, correct, alone, seq))
            bucket = bisect.bisect_right(GRID, confidence)
            decided[bucket] += 1
            if not correct:
                wrong[bucket] += 1
            if alone and self.target_error is not None:
                self._change = max(0.0, self._change + self._evidence[0 if not correct else 1])
                if self._change >= CHANGE_LEVEL:
                    self._seen.clear()
                    self._recount()
                    self._change, self.restarts = 0.0, self.restarts + 1
            self._threshold = None

    def _count(self, entry: tuple[float, bool, bool, int], sign: int) -> None:
        """Add (``sign`` 1) or take out (-1) one entry in the tally of its level bucket: bucket
        ``b`` holds the confidences in ``[GRID[b - 1], GRID[b])`` (0: below every level)."""
        bucket = bisect.bisect_right(GRID, entry[0])
        self._decided[bucket] += sign
        if not entry[1]:
            self._wrong[bucket] += sign

    def _recount(self) -> None:
        self._decided, self._wrong = [0] * (len(GRID) + 1), [0] * (len(GRID) + 1)
        for entry in self._seen:
            self._count(entry, 1)

    def unlearned(self, seqs: Sequence[int] | np.ndarray) -> None:
        """The learns of these sequence numbers were taken back (``undo_``, ``forget_``): their
        entries go, the later ones' numbers shift down as the memory's do, and the change
        statistic is that of the entries left."""
        with self._lock:
            kept = _renumbered(self._seen, seqs)
            removed = len(kept) != len(self._seen)
            self._seen = deque(kept, maxlen=self.window)
            if removed:  # (else only renumbered: the tally and the change test stand)
                self._recount()
                self._change, self._threshold = self._change_of_window(), None

    def _change_of_window(self) -> float:
        """The change statistic over the window's decisions taken alone, oldest first."""
        change = 0.0
        if self.target_error is not None:
            for _, correct, alone, _ in self._seen:
                if alone:
                    change = max(0.0, change + self._evidence[0 if not correct else 1])
        return min(change, math.nextafter(CHANGE_LEVEL, 0.0))  # (a restart happens at an observation)

    @property
    def threshold(self) -> float:
        """The lowest confidence a decision may be taken alone at (``inf``: refer every one)."""
        with self._lock:
            if self._threshold is None:
                self._threshold = self._calibrate()
            return self._threshold

    @property
    def needed(self) -> int:
        """While no level passes (``threshold`` is ``inf``, with a target): the fewest verified
        decisions that could make one pass, all right and as confident as a chain's start (the
        start that needs fewest); else 0. A lower bound: a wrong one, or one below the start,
        adds to it."""
        with self._lock:
            if self._threshold is None:
                self._threshold = self._calibrate()
            if self._threshold != math.inf or self.target_error is None:
                return 0
            tally = self._above()
            return min(needed(tally[j][1], tally[j][0], self.target_error, self.delta * share)
                       for j, share in enumerate(SHARES) if share > 0)

    def _above(self) -> list[tuple[int, int]]:
        """Per level of :data:`GRID`, the window's decisions at least that confident and the wrong
        ones among them, from the tally (bucket ``b`` holds ``[GRID[b - 1], GRID[b])``)."""
        above, decided, wrong = [], 0, 0
        for bucket in range(len(GRID), 0, -1):
            decided, wrong = decided + self._decided[bucket], wrong + self._wrong[bucket]
            above.append((decided, wrong))
        return above[::-1]

    def _calibrate(self) -> float:
        """The lowest level of :data:`GRID` the fallback procedure passes (see the module): from the
        strictest level down, each tested at its share of ``delta`` plus the level it follows
        when that one passed."""
        target = self.target_error
        if target is None:
            return math.inf
        threshold, carried = math.inf, 0.0
        for j, (n, errors) in reversed(list(enumerate(self._above()))):
            level = carried + self.delta * SHARES[j]
            if passes(errors, n, target, level):
                threshold, carried = GRID[j], level
            else:
                carried = 0.0
        return threshold

    def state(self) -> dict[str, Any]:
        """What :meth:`load_state` takes back: the settings, the window's entries (oldest first),
        the change statistic and the restarts."""
        with self._lock:
            seen = list(self._seen)
            return {"target_error": self.target_error, "window": self.window, "delta": self.delta,
                    "confidence": [e[0] for e in seen], "correct": [e[1] for e in seen],
                    "alone": [e[2] for e in seen], "seq": [e[3] for e in seen], "change": self._change,
                    "restarts": self.restarts}

    def load_state(self, state: dict[str, Any]) -> None:
        """Replace the window with ``state``'s newest ``window`` entries (checked first: a bad state
        changes nothing; one saved without the newer fields gets -1 for a sequence number, not
        alone, and a change statistic of 0)."""
        if not isinstance(state, dict):
            raise ValueError(f"a calibration state must be a dict, got {type(state).__name__}")
        confidence, correct = list(state.get("confidence", ())), list(state.get("correct", ()))
        seqs = list(state.get("seq", [-1] * len(confidence)))
        alone = list(state.get("alone", [False] * len(confidence)))
        if not len(confidence) == len(correct) == len(seqs) == len(alone):
            raise ValueError(f"a calibration state of {len(confidence)} confidences, {len(correct)} outcomes, "
                             f"{len(alone)} alone flags and {len(seqs)} sequence numbers does not line up")
        entries = [(check.check_real("confidence", c, low=0.0, high=1.0), _flag("correct", ok), _flag("alone", a),
                    check.check_int("seq", seq, low=-1))
                   for c, ok, a, seq in zip(confidence, correct, alone, seqs, strict=True)]
        change = check.check_real("change", state.get("change", 0.0), low=0.0)
        restarts = check.check_int("restarts", state.get("restarts", 0), low=0)
        with self._lock:
            self._seen = deque(entries, maxlen=self.window)
            self._recount()
            if state.get("target_error", self.target_error) != self.target_error:
                change = self._change_of_window()  # the statistic was of another target: this one's, of the window
            self._change, self.restarts, self._threshold = change, restarts, None


class Referral(_Locked):
    """A decision memory's act-or-refer rule (``memory.referral``; see the module). Thread-safe.

    A decision is referred, ``refer`` true, when any of its ``reasons`` applies:

    - ``unseen_category``: the memory has no opinion in the category yet (it abstained);
    - ``novel``: the memory says the case lies farther from every prototype of its category than
      the category's running spread allows (:mod:`gae.decider.signals`);
    - ``recent_change``: the category's change test is halfway to firing, or its trust weights
      moved by at least :data:`TRUST_MOVE` (total variation) over its last :data:`RECENT`
      verified decisions;
    - ``not_calibrated``: with a ``target_error``, no level has passed yet (too few verified
      decisions, or too many wrong), so every decision is referred; :attr:`needed` says how many
      verified decisions it needs at the least;
    - ``low_confidence``: the confidence is below :attr:`threshold`, the calibrator's with a
      ``target_error``, else ``min_confidence`` (the calibrator keeps its window either way, so
      a memory with a target that loads this one's state has the evidence);
    - ``small_margin``: the best two actions' probabilities are closer than ``min_margin``.

    The calibrator learns from the verified decisions no other reason than the threshold
    (``not_calibrated`` or ``low_confidence``) referred (``eligible``),
    so its guarantee is about exactly the decisions taken alone: those with no reason at all.

    Args:
        target_error: the error allowed among the decisions not referred (None: the fixed
            ``min_confidence``; the calibrator still keeps its window).
        min_confidence: the confidence below which a decision is referred without a target.
        min_margin: see ``small_margin``; 0 turns it off.
        window, delta: the calibrator's (:class:`ReferralCalibrator`).
    """

    def __init__(self, target_error: float | None = None, *, min_confidence: float = MIN_CONFIDENCE,
                 min_margin: float = MIN_MARGIN, window: int = WINDOW, delta: float = DELTA) -> None:
        self.calibrator = ReferralCalibrator(target_error, window=window, delta=delta)  # (None: evidence kept)
        self.min_confidence = check.check_real("min_confidence", min_confidence, low=0.0, high=1.0)
        self.min_margin = check.check_real("min_margin", min_margin, low=0.0, high=1.0)
        self._trust: dict[str | int, deque[tuple[int, tuple[float, ...]]]] = {}  # category -> (seq, trust row)
        self._lock = threading.Lock()

    @property
    def target_error(self) -> float | None:
        return self.calibrator.target_error

    def fresh(self) -> Referral:
        """A referral of the same options that has observed nothing."""
        calibrator = self.calibrator
        return Referral(calibrator.target_error, min_confidence=self.min_confidence, min_margin=self.min_margin,
                        window=calibrator.window, delta=calibrator.delta)

    @property
    def threshold(self) -> float:
        """The lowest confidence a decision is taken alone at (``inf``: every one referred, not
        calibrated yet)."""
        return self.min_confidence if self.calibrator.target_error is None else self.calibrator.threshold

    @property
    def needed(self) -> int:
        """The verified decisions the calibration still needs, at the least, before one may be taken
        alone (:attr:`ReferralCalibrator.needed`; 0 when calibrated or without a target)."""
        return self.calibrator.needed

    def reasons(self, confidence: float, probs: Iterable[float], *, unseen: bool,
                signals: Iterable[str] = ()) -> tuple[str, ...]:
        """The reasons to refer a decision of this ``confidence`` and these probabilities, with
        the memory's own ``signals`` (``novel``, ``recent_change``), in :data:`REASONS` order."""
        signals = tuple(signals)
        if len(signals) > 1 or (signals and signals[0] not in ("novel", "recent_change")):
            return self._reasons(confidence, probs, unseen, signals)  # (a Decider's signals come one or none)
        if unseen:
            return ("unseen_category", *signals)
        first = second = 0.0  # the best two probabilities
        for p in probs:
            if p > first:
                first, second = p, first
            elif p > second:
                second = p
        threshold = self.threshold
        low = confidence < threshold
        small = first - second < self.min_margin
        if not (low or small):
            return signals
        word = "not_calibrated" if threshold == math.inf else "low_confidence"
        return (*signals, *((word,) if low else ()), *(("small_margin",) if small else ()))

    def _reasons(self, confidence: float, probs: Iterable[float], unseen: bool,
                 signals: tuple[str, ...]) -> tuple[str, ...]:
        """:meth:`reasons` of any ``signals``, sorted into :data:`REASONS` order."""
        found = set(signals)
        if unseen:
            found.add("unseen_category")
        else:
            best = sorted(probs, reverse=True)[:2] + [0.0]
            threshold = self.threshold
            if confidence < threshold:
                found.add("not_calibrated" if threshold == math.inf else "low_confidence")
            if best[0] - best[1] < self.min_margin:
                found.add("small_margin")
        return tuple(reason for reason in REASONS if reason in found)

    def trust_moved(self, category: str | int, trust: Sequence[float]) -> bool:
        """Whether ``trust`` (the category's trust weights now) lies at least :data:`TRUST_MOVE`
        from the oldest of its last :data:`RECENT` verified decisions'."""
        with self._lock:
            rows = self._trust.get(category)
            if not rows:
                return False
            then = rows[0][1]
        moved = 0.0
        for now, before in zip(trust, then, strict=False):  # (a growth may have added a judge's column)
            moved += abs(now - before)
        return 0.5 * moved >= TRUST_MOVE

    def observe(self, category: str | int, confidence: float, correct: bool, *, eligible: bool, seq: int,
                alone: bool = False, trust: Sequence[float] | None = None) -> None:
        """One verified decision, learned as sequence number ``seq``: the calibrator takes
        ``(confidence, correct)`` when ``eligible`` (no reason but the threshold referred it)
        with whether it was taken ``alone`` (no reason at all), the category's trust history
        ``trust`` (its weights after learning it) when given."""
        if eligible:
            self.calibrator.observe(confidence, correct, seq, alone=alone)
        if trust is not None:
            with self._lock:
                self._trust.setdefault(category, deque(maxlen=RECENT)).append((int(seq), tuple(map(float, trust))))

    def observe_verified(self, category: int, confidence: float, correct: bool, decided: bool,
                         reasons: tuple[str, ...], seq: int, trust: tuple[float, ...] | None) -> None:
        """:meth:`observe` of a decision a Decider verified, from what it decided (whether the memory
        had an opinion and the reasons it gave, :func:`verified_detail`'s inputs), its values
        trusted as the Decider computed them: the checks of :meth:`observe` skipped."""
        alone = not reasons
        if decided and (alone or reasons in THRESHOLD_ONLY):  # eligible: the calibrator's population
            self.calibrator._take(confidence, correct, alone, seq)
        if trust is not None:
            with self._lock:
                rows = self._trust.get(category)
                if rows is None:
                    rows = self._trust[category] = deque(maxlen=RECENT)
                rows.append((seq, trust))

    def unlearned(self, seqs: Sequence[int] | np.ndarray) -> None:
        """The learns of these sequence numbers were taken back: what they fed goes (see the module)."""
        self.calibrator.unlearned(seqs)
        with self._lock:
            for category, rows in list(self._trust.items()):
                kept = [(seq, row) for row, seq in _renumbered([(row, seq) for seq, row in rows], seqs)]
                self._trust[category] = deque(kept, maxlen=RECENT)

    def state(self) -> dict[str, Any]:
        """What :meth:`load_state` takes back, as ``weights_only`` data (lists, numbers, names)."""
        with self._lock:
            trust = {"category": [c for c, rows in self._trust.items() for _ in rows],
                     "seq": [seq for rows in self._trust.values() for seq, _ in rows],
                     "row": [list(row) for rows in self._trust.values() for _, row in rows]}
        return {"calibration": self.calibrator.state(), "trust": trust}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """The state :meth:`state` wrote (None: one saved before referrals, nothing observed);
        checked whole first, ValueError naming the field."""
        state = {} if state is None else state
        if not isinstance(state, dict):
            raise ValueError(f"the referral state must be a dict, got {type(state).__name__}")
        trust = state.get("trust") or {"category": [], "seq": [], "row": []}
        if not isinstance(trust, dict) or not all(isinstance(trust.get(k), list) for k in ("category", "seq", "row")) \
                or not len(trust["category"]) == len(trust["seq"]) == len(trust["row"]):
            raise ValueError(f"the referral state's trust must be a dict of three lists of one length, "
                             f"got {trust!r:.200}")
        rows: dict[str | int, deque[tuple[int, tuple[float, ...]]]] = {}
        for category, seq, row in zip(trust["category"], trust["seq"], trust["row"], strict=True):
            if isinstance(category, bool) or not isinstance(category, (str, int)) or not isinstance(row, list):
                raise ValueError(f"the referral state's trust holds a bad entry: {category!r}, {row!r:.200}")
            values = tuple(check.check_real("trust", value, low=0.0, high=1.0) for value in row)
            rows.setdefault(category, deque(maxlen=RECENT)).append((check.check_int("seq", seq, low=-1), values))
        calibration = state.get("calibration") or {}  # (None: saved by a gae that kept none without a target)
        probe = ReferralCalibrator(self.calibrator.target_error, window=self.calibrator.window,
                                   delta=self.calibrator.delta)
        probe.load_state(calibration)  # raises before anything changes
        self.calibrator.load_state(calibration)
        with self._lock:
            self._trust = rows


def verified_detail(decided: bool, reasons: Iterable[str]) -> dict[str, bool]:
    """What :meth:`Referral.observe` takes from a verified decision besides its confidence and
    outcome: whether the memory had an opinion (``decided``) and no reason but the threshold
    (``not_calibrated`` or ``low_confidence``) referred it (``eligible``, the calibrator's
    population), and whether it was taken alone, no reason at all (``alone``, the change test's).
    A ledger's learn event carries it."""
    given = set(reasons)
    return {"eligible": bool(decided) and given <= {"not_calibrated", "low_confidence"}, "alone": not given}


def _renumbered(entries: Iterable[tuple[Any, ...]], seqs: Sequence[int] | np.ndarray) -> list[tuple[Any, ...]]:
    """``entries`` (tuples whose last field is a sequence number) without those of ``seqs``, the
    later numbers shifted down by how many of ``seqs`` came before them (untagged ones, -1, stay)."""
    gone = np.unique(np.asarray(seqs, dtype=np.int64))
    kept = []
    for entry in entries:
        seq = entry[-1]
        if seq < 0:
            kept.append(entry)
            continue
        at = int(np.searchsorted(gone, seq))
        if at < gone.size and gone[at] == seq:
            continue
        kept.append((*entry[:-1], seq - at))
    return kept


def _flag(name: str, value: Any, error: type[Exception] = ValueError) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be a bool, got {value!r}")
    return bool(value)
