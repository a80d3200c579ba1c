"""gae's decision memories as `river <https://riverml.xyz>`_ classifiers.

:class:`JudgmentClassifier` wraps :class:`~gae.JudgmentMemory` and :class:`KNNClassifier` wraps
:class:`~gae.KNNMemory`, so either takes part in river pipelines, prequential evaluation and
model selection, one dict at a time::

    >>> from river import datasets, evaluate, metrics
    >>> evaluate.progressive_val_score(datasets.Phishing(), JudgmentClassifier(), metrics.Accuracy())
    Accuracy: 91.27%

No scaler is needed in front: the default configuration's answers are the same in any units
(docs/inputs.md, "Units").

How a river sample becomes a decision of the memory:

- Factors: the features of the first sample ``learn_one`` sees, in sorted order (so the order
  of a dict's keys never matters; names of several types by type, then ``repr``), the
  ``category`` field left out. A feature met later is ignored; a missing one is 0
  (``missing="zero"``) or a KeyError naming it (``missing="error"``). ``missing="zero"`` fills
  the factors a sample lacks, not a whole sample: ``learn_one`` refuses a sample that holds
  none of them (``{}``, only the category, only features met later) with a ValueError, since
  it would teach a decision of all zeros; scoring one scores the all-zero row. Values must be
  numbers (bool, int, float or a NumPy scalar).
- Category: ``category="field"`` reads each decision's category from that field (a str, or
  an int or bool converted with ``str``); ``category=None`` puts every decision in one
  category, ``"general"``. A sample without the field is a KeyError, whatever ``missing``.
- Labels: any hashable (bool, int, str, ...), learned on sight. None and NaN (of any numeric
  type) mark a missing label and are refused with a ValueError (``predict_one`` answers None
  before any learning, and each NaN would be a label of its own). The memory is built at the
  first ``learn_one`` and grows a new action (and category) the first time one is met. Each
  label is an action named ``str(label)`` (made distinct), and ``predict_one`` returns the
  label object itself.
- Learning: each sample is a verified decision learned with ``confirmed=None``: the memory
  reads it as confirmed when its own recommendation was the label.
- Abstention: where the memory has no evidence (a category with no prototype yet, fewer
  than ``k`` traces in reach), ``predict_proba_one`` gives the frequencies of the labels
  learned so far; ``predict_one`` is always its most probable label (ties: the label met
  first), so a judgment memory's ``min_confidence`` changes what it learns (the confirmed
  flag), not what is predicted. Before any learning: ``{}`` and None.

Bad input gets an error naming the feature and its value, and changes nothing.

Threads: a classifier can be shared. Each holds a re-entrant lock that every public method
holds from its checks to its last write (each class says what that covers).
"""

from __future__ import annotations

import inspect
import numbers
import pickle
import threading
from collections.abc import Hashable, Mapping
from typing import Any, NoReturn

import numpy as np
import torch
from river import base
from river.base.typing import ClfTarget, FeatureName

from gae import validation as check
from gae.judgment import JudgmentConfig, JudgmentMemory
from gae.models.base import DecisionMemory
from gae.models.knn import KNNMemory

GENERAL = "general"  # the one category of a classifier without a category field
_PLAIN_NUMBERS = frozenset((float, int, bool))  # checked by type, the common case, before any isinstance
_SCORE_LIMIT = float(np.finfo(np.float32).max)  # the memories score in float32
# an estimator learns an endless stream: it keeps the audit trail of its latest decisions only
_DEFAULTS = JudgmentConfig.recommended().replace(max_log_events=10_000)


class _Lock:
    """A re-entrant lock whose copy is a fresh lock: river's ``clone(include_attributes=True)``
    deep-copies every attribute, and a :func:`threading.RLock` cannot be copied."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __reduce__(self) -> tuple[type[_Lock], tuple[()]]:
        return _Lock, ()


class _MemoryClassifier(base.Classifier):
    """What both classifiers share: dict rows, the label and category vocabularies, the fallback."""

    memory: DecisionMemory | None

    def __init__(self, category: Hashable | None, missing: str) -> None:
        if category is not None and not isinstance(category, Hashable):
            raise TypeError(f"category must be None or the name of a feature, got {category!r}")
        if not isinstance(missing, str) or missing not in ("zero", "error"):
            raise ValueError(f"missing must be 'zero' or 'error', got {missing!r}")
        self.category = category
        self.missing = missing
        self.memory = None
        self._features: tuple[Hashable, ...] = ()  # the factors, in the memory's order
        self._labels: list[Any] = []  # in the memory's action order: any hashable (river's ClfTarget and more)
        self._label_index: dict[Any, int] = {}
        self._label_of: dict[str, Any] = {}  # action name -> label
        self._labels_names: list[str] = []  # the memory's action_names
        self._counts: list[int] = []  # decisions learned per label: the answer where the memory abstains
        self._categories: dict[str, int] = {}  # category name -> index in the memory
        self._lock = _Lock()  # held by every public method, from its checks to its last write

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:  # the state between two calls, even while other threads learn
            state = {name: value.copy() if isinstance(value, (list, dict)) else value
                     for name, value in self.__dict__.items() if name != "_lock"}
            if self.memory is not None:  # pickled here, under the lock, not after this returns
                state["memory"] = pickle.dumps(self.memory, pickle.HIGHEST_PROTOCOL)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("memory"), bytes):
            state = {**state, "memory": pickle.loads(state["memory"])}
        self.__dict__.update(state)
        self._lock = _Lock()

    def clone(self, new_params: dict[str, Any] | None = None, include_attributes: bool = False) -> Any:
        """river's :meth:`~river.base.Base.clone`, under the lock (with ``include_attributes``,
        the learned state between two calls)."""
        with self._lock:
            return super().clone(new_params, include_attributes)

    @property
    def _multiclass(self) -> bool:
        return True

    def _build(self, factors: list[str], action: str, category: str) -> DecisionMemory:
        raise NotImplementedError

    def _index_of_unknown_category(self) -> int | None:
        """The category index to score a category never learned with; None: abstain."""
        return None

    # -- learning --------------------------------------------------------------------
    def learn_one(self, x: dict[FeatureName, Any], y: Hashable) -> None:
        """Learn one verified decision: features ``x``, label ``y`` (any hashable but None and NaN)."""
        with self._lock:
            memory = self.memory
            features = self._first_features(x) if memory is None else self._features
            row = self._row(x, features, learn=True)
            category = self._category_name(x)
            try:
                index = self._label_index.get(y)
            except TypeError:
                raise TypeError(f"y must be a hashable label, got {y!r}") from None
            if index is None:  # a label met before is never missing
                _check_label(y)
            name = _distinct_name(y, self._label_of) if index is None else self._labels_names[index]
            first = memory is None
            if memory is None:
                memory = self._build(_distinct_names(features), name, category)
            try:
                memory.learn_one(row, name, category, confirmed=None)
            except (TypeError, ValueError) as error:
                _raise_for_values(row, features, check.LEARN_LIMIT, error)
            if first:  # only now: a rejected first sample leaves the classifier as it was
                self.memory, self._features = memory, features
            if index is None:
                index = len(self._labels)
                self._labels.append(y)
                self._label_index[y] = index
                self._label_of[name] = y
                self._labels_names.append(name)
                self._counts.append(0)
            self._counts[index] += 1
            if self.category is not None and category not in self._categories:
                self._categories[category] = len(self._categories)  # the memory appended it too

    # -- scoring ---------------------------------------------------------------------
    def predict_one(self, x: dict[FeatureName, Any], **kwargs: Any) -> ClfTarget | None:
        """The most probable label (the memory's recommendation); None before any learning."""
        with self._lock:
            if self.memory is None:
                return None
            row = self._row(x, self._features)
            index = self._score_index(x)
            if index is not None:
                try:
                    name, _ = self.memory.score_one(row, index)
                except (TypeError, ValueError) as error:
                    _raise_for_values(row, self._features, _SCORE_LIMIT, error)
                if name is not None:
                    return self._label_of[name]
            proba = self._proba(row, index)
            return max(proba, key=proba.__getitem__)

    def predict_proba_one(self, x: dict[FeatureName, Any], **kwargs: Any) -> dict[ClfTarget, float]:
        """The probability of every label learned so far (the label frequencies where the memory
        abstains); ``{}`` before any learning."""
        with self._lock:
            if self.memory is None:
                return {}
            return self._proba(self._row(x, self._features), self._score_index(x))

    def _proba(self, row: np.ndarray, index: int | None) -> dict[ClfTarget, float]:
        assert self.memory is not None
        if index is not None:
            try:
                with torch.no_grad():
                    probs = self.memory(torch.from_numpy(row).unsqueeze(0), torch.tensor([index])).probs[0].tolist()
            except (TypeError, ValueError) as error:
                _raise_for_values(row, self._features, _SCORE_LIMIT, error)
            total = sum(probs)  # float32 probabilities: summed again in float64, so they add up to 1
            if total > 0:
                return {label: p / total for label, p in zip(self._labels, probs, strict=True)}
        total = sum(self._counts)
        return {label: count / total for label, count in zip(self._labels, self._counts, strict=True)}

    def _score_index(self, x: dict[FeatureName, Any]) -> int | None:
        if self.category is None:
            return 0
        index = self._categories.get(self._category_name(x))
        return self._index_of_unknown_category() if index is None else index

    # -- reading a sample ------------------------------------------------------------
    def _first_features(self, x: dict[FeatureName, Any]) -> tuple[Hashable, ...]:
        if not isinstance(x, Mapping):
            raise TypeError(f"x must be a dict of features, got {type(x).__name__}")
        keys: list[Any] = [key for key in x if self.category is None or key != self.category]
        if not keys:
            raise ValueError(f"x must have at least one feature besides the category field, got {x!r}")
        try:
            return tuple(sorted(keys))
        except TypeError:  # names of several types (1 and 'a'): by type, then by repr
            return tuple(sorted(keys, key=lambda key: (type(key).__name__, repr(key))))

    def _row(self, x: dict[FeatureName, Any], features: tuple[Hashable, ...], learn: bool = False) -> np.ndarray:
        """(K,) float64: the factors of ``x`` in the memory's order."""
        if type(x) is not dict and not isinstance(x, Mapping):
            raise TypeError(f"x must be a dict of features, got {type(x).__name__}")
        if self.missing == "zero":
            values = [x.get(name, 0.0) for name in features]
            if learn and x.keys().isdisjoint(features):
                raise ValueError(f"x must hold at least one of the features {list(features)} to be learned "
                                 f"(missing='zero' fills the ones a sample lacks, not a whole sample), got {x!r}")
        else:
            try:
                values = [x[name] for name in features]
            except KeyError as error:
                raise KeyError(f"x has no feature {error.args[0]!r} (missing='error'; the features are "
                               f"{list(features)})") from None
        for value in values:
            if type(value) not in _PLAIN_NUMBERS:
                _check_numbers(values, features)
                break
        return np.array(values, dtype=np.float64)

    def _category_name(self, x: dict[FeatureName, Any]) -> str:
        field = self.category
        if field is None:
            return GENERAL
        try:
            value = x[field]
        except KeyError:
            raise KeyError(f"x has no category field {field!r}") from None
        if not isinstance(value, (str, bool, numbers.Integral, np.bool_)):
            raise TypeError(f"category field {field!r} must be a str, an int or a bool, got {value!r}")
        name = str(value)
        if not name:
            raise ValueError(f"category field {field!r} must not be an empty str, got {value!r}")
        return name


class JudgmentClassifier(_MemoryClassifier):
    """A :class:`~gae.JudgmentMemory` as a river classifier: one learned prototype per category
    and label, scored in microseconds.

    Args:
        category: the feature that holds each decision's category, or None for one category.
            Default: None.
        missing: a factor missing from a sample is ``"zero"`` or an ``"error"``. Default: "zero".
        **options: every option of :class:`~gae.JudgmentConfig` (``tau=0.2``,
            ``prototypes=3``, ...), documented there. The defaults are
            :meth:`JudgmentConfig.recommended` (``learning="lvq"``, docs/lvq.md), not the seed
            rule of a bare ``JudgmentMemory``, but for ``max_log_events=10_000`` (below);
            ``drift_mode="adaptive"`` needs ``learning="gated"``. An unknown option is a TypeError.

    Audit trail: the memory logs the decisions it learns (``memory.decision_log``, behind
    ``trace``, ``undo_`` and ``forget_``) and its gate, promotion and recycle events, all bounded
    by ``max_log_events``, so that on an endless stream the classifier's state stays flat. By
    default the log keeps at most about the latest 10,000 decisions: past that the oldest are
    folded into its base (after a fold it holds a few thousand), and ``undo_`` and ``forget_``
    reach back only as far as it does. ``max_log_events=None`` keeps every decision (the log grows
    without end), ``0`` keeps none (no ``undo_`` or ``forget_``).

    Thread safety: a classifier can be shared by threads. Its own lock serializes
    ``learn_one``, ``predict_one``, ``predict_proba_one``, ``clone`` and copies (pickle,
    ``copy.deepcopy``), so decisions are learned one after another, none lost, and every answer
    and copy comes from the state between two whole calls; a copy has a lock of its own. Not
    covered: setting attributes (options) while other threads call it, and calls on
    :attr:`memory` itself, which its own lock serializes apart from the classifier (an
    ``undo_`` there leaves the classifier's label counts as they were).

    Attributes:
        memory: the :class:`~gae.JudgmentMemory`, built at the first ``learn_one`` (None before).

    Examples::

        >>> model = JudgmentClassifier(category="desk", tau=0.2)
        >>> model.learn_one({"desk": "refunds", "amount": 0.9, "age": 0.1}, "approve")
        >>> model.learn_one({"desk": "refunds", "amount": 0.1, "age": 0.9}, "reject")
        >>> model.predict_one({"desk": "refunds", "amount": 0.8, "age": 0.2})
        'approve'
        >>> model.memory.factor_names, model.memory.config.rule.tau
        (('age', 'amount'), 0.2)
    """

    def __init__(self, category: Hashable | None = None, missing: str = "zero", **options: Any) -> None:
        values = JudgmentConfig.with_defaults(options, "JudgmentClassifier", _DEFAULTS)
        self._config = JudgmentConfig(**values)  # checks every value
        super().__init__(category, missing)
        for name, value in values.items():  # as given (river's clone passes them back); judges: config.parameter
            setattr(self, name, self._config.parameter(name) if name == "judges" and not isinstance(value, Mapping)
                    else value)

    def _build(self, factors: list[str], action: str, category: str) -> DecisionMemory:
        return JudgmentMemory([category], [action], factors, self._config, grow=True)


def _judgment_signature() -> inspect.Signature:
    """``__init__``'s signature with every JudgmentConfig option as a keyword, so that river's
    ``_get_params``, ``clone`` and ``repr`` see them all; the defaults are the recommended config's
    with a bounded log."""
    given = inspect.signature(JudgmentClassifier.__init__).parameters
    return inspect.Signature([given["self"], given["category"], given["missing"],
                              *JudgmentConfig.keyword_parameters(_DEFAULTS)])


JudgmentClassifier.__init__.__signature__ = _judgment_signature()  # type: ignore[attr-defined]


class KNNClassifier(_MemoryClassifier):
    """A :class:`~gae.KNNMemory` as a river classifier: the ``capacity`` latest decisions, voted
    by the ``k`` nearest (the baseline ``JudgmentClassifier`` is measured against).

    Args:
        category: the feature that holds each decision's category, or None. Default: None.
        missing: a factor missing from a sample is ``"zero"`` or an ``"error"``. Default: "zero".
        k: neighbours that vote. Default: 5.
        capacity: decisions kept (first in, first out). Default: 200.
        scoped: vote with the decisions of the sample's own category only (needs ``category``).
            Default: False.
        respect_skip: passed to the memory; river gives no uncertain outcomes, so every sample is
            stored either way. Default: False.

    The memory keeps no log: its state is the ring of ``capacity`` decisions.

    Thread safety: as :class:`JudgmentClassifier`, a classifier can be shared by threads: its
    lock serializes ``learn_one``, ``predict_one``, ``predict_proba_one``, ``clone`` and copies,
    so no decision is lost and every answer comes from the state between two whole calls.

    Attributes:
        memory: the :class:`~gae.KNNMemory`, built at the first ``learn_one`` (None before).

    Examples::

        >>> model = KNNClassifier(k=1)
        >>> model.learn_one({"amount": 0.9, "age": 0.1}, True)
        >>> model.learn_one({"amount": 0.1, "age": 0.9}, False)
        >>> model.predict_one({"amount": 0.2, "age": 0.7})
        False
    """

    def __init__(self, category: Hashable | None = None, missing: str = "zero", k: int = 5, capacity: int = 200,
                 scoped: bool = False, respect_skip: bool = False) -> None:
        check.check_int("k", k, low=1)
        check.check_int("capacity", capacity, low=1)
        if k > capacity:
            raise ValueError(f"k must be <= capacity ({capacity}), got {k}: the memory could never score")
        for name, flag in (("scoped", scoped), ("respect_skip", respect_skip)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if scoped and category is None:
            raise ValueError("scoped=True needs category (the field that holds each decision's category), "
                             "got category=None")
        super().__init__(category, missing)
        self.k = k
        self.capacity = capacity
        self.scoped = scoped
        self.respect_skip = respect_skip

    def _build(self, factors: list[str], action: str, category: str) -> DecisionMemory:
        return KNNMemory(factors=factors, actions=[action], k=self.k, capacity=self.capacity,
                         categories=None if self.category is None else [category], scoped=self.scoped,
                         respect_skip=self.respect_skip, grow=True)

    def _index_of_unknown_category(self) -> int | None:
        return None if self.scoped else 0  # unscoped, the category plays no part in the vote


def _check_label(y: Any) -> None:
    """None, and any value not equal to itself (NaN of any numeric type, NumPy's NaT), are no label."""
    try:
        missing = y is None or bool(y != y)
    except ArithmeticError:  # a signalling Decimal NaN refuses even to be compared
        missing = True
    except (TypeError, ValueError):  # a value whose comparison is no truth value is not missing
        missing = False
    if missing:
        raise ValueError(f"y must be a label, got {y!r} (None and NaN mark a missing label: learn_one learns "
                         "verified labels, and predict_one answers None before any learning)")


def _check_numbers(values: list[Any], features: tuple[Hashable, ...]) -> None:
    for name, value in zip(features, values, strict=True):
        if not isinstance(value, (numbers.Real, np.bool_)):
            raise TypeError(f"feature {name!r} must be a number (bool, int or float), got {value!r}")


def _raise_for_values(row: np.ndarray, features: tuple[Hashable, ...], limit: float, error: Exception) -> NoReturn:
    """Raise ``error`` again, as one naming the feature when a value of ``row`` caused it."""
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~(np.abs(row) <= limit))  # NaN is never <= limit
    if bad.size:
        column = int(bad[0])
        raise ValueError(f"feature {features[column]!r} must be a finite number in [-{limit:g}, {limit:g}], "
                         f"got {float(row[column])!r}") from error
    raise error


def _distinct_name(value: Hashable, taken: Mapping[str, Any]) -> str:
    """``str(value)`` (``repr`` when empty), with `` (2)``, `` (3)``, ... added while it is taken."""
    stem = str(value) or repr(value)
    name, copies = stem, 1
    while name in taken:
        copies += 1
        name = f"{stem} ({copies})"
    return name


def _distinct_names(values: tuple[Hashable, ...]) -> list[str]:
    names: dict[str, None] = {}
    for value in values:
        names[_distinct_name(value, names)] = None
    return list(names)
