"""The judgment memory as a scikit-learn classifier: ``fit``, ``partial_fit``, ``predict_proba``.

:class:`JudgmentClassifier` wraps a :class:`~gae.JudgmentMemory` so that it drops into
scikit-learn's tools (``Pipeline``, ``cross_val_score``, ``GridSearchCV``, ``clone``). Each row
of ``X`` is a decision's factors, each label of ``y`` the verified action; ``fit`` learns the
rows in order with the exact batched engine (:meth:`~gae.JudgmentMemory.learn_`), so the fitted
memory is the one a stream of those decisions would leave. ``partial_fit`` keeps learning
online. Its parameters are the :class:`~gae.JudgmentConfig` options, with the defaults of
:meth:`~gae.JudgmentConfig.recommended` (not the seed rule: ``learning='lvq'``, docs/lvq.md),
and ``category``, the column of ``X`` that holds each row's category id, if any.

The default configuration measures each criterion in its own running spread
(``units='memory'``), so its answers are the same in any units and it needs no scaler in front
(docs/inputs.md, "Units"); in a ``Pipeline`` a step cannot be named "memory": that is a parameter
of ``Pipeline``. Needs scikit-learn >= 1.6.

Examples::

    >>> from sklearn.datasets import load_iris
    >>> from sklearn.model_selection import cross_val_score
    >>> X, y = load_iris(return_X_y=True)
    >>> bool(cross_val_score(JudgmentClassifier(), X, y, cv=5).mean() > 0.8)
    True
"""

from __future__ import annotations

import inspect
import numbers
import pickle
import threading
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets, unique_labels
from sklearn.utils.validation import check_is_fitted, check_X_y, validate_data

from gae.judgment import JudgmentConfig, JudgmentMemory
from gae.validation import LEARN_LIMIT

__all__ = ["JudgmentClassifier"]

_SCORE_LIMIT = float(np.finfo(np.float32).max)  # the memory scores in float32
# an estimator learns an endless stream: it keeps the audit trail of its latest decisions only
_DEFAULTS = JudgmentConfig.recommended().replace(max_log_events=10_000)


class JudgmentClassifier(ClassifierMixin, BaseEstimator):
    """A :class:`~gae.JudgmentMemory` as a scikit-learn classifier.

    Args:
        category: None (default): every row is in one category. An int: the column of ``X``
            that holds each row's category id, a whole number >= 0; that column is not a factor,
            and the memory keeps prototypes and attention per category.
        **options: every :class:`~gae.JudgmentConfig` option (``tau``, ``eta_confirmed``,
            ``drift_mode``, ``prototypes``, ...: documented there), each a keyword parameter of
            this estimator with the default of :meth:`JudgmentConfig.recommended`, but for
            ``max_log_events=10_000`` (the audit trail, below). They are stored as given and
            checked when the memory is built (``fit``, or the first ``partial_fit``): a bad
            value raises there, naming the option.

    What the estimator decides:

    - **Learning.** The rows are learned in the order given, each as a verified decision whose
      "confirmed" flag is whether the memory's own recommendation (before that row) was the
      label: ``learn_(x, category, action, confirmed=None)``.
    - **Abstention.** Where the memory has nothing to score with (a category no training row
      had, or a row so far from every prototype that the float32 distances overflow) it
      abstains; ``predict_proba`` then answers the class frequencies of the training labels
      (:attr:`class_count_` normalised) and ``predict`` the most frequent class. Otherwise the
      memory's probabilities. ``min_confidence`` does not make ``predict`` abstain (a
      classifier answers every row); the memory's own ``action`` of -1 is in ``memory_``.
    - **partial_fit.** The scikit-learn convention: the first call (unless ``fit`` came first)
      needs ``classes``, every label the memory will learn (``partial_fit(X, y,
      classes=np.unique(y_all))``), and raises without it; labels outside them are refused.
      A category id met for the first time is added to the memory (``add_categories_``). The
      options and the category column are those the memory was built with: changing them with
      ``set_params`` and calling ``partial_fit`` raises; call ``fit`` to build anew.
    - **Inputs.** Anything :func:`~sklearn.utils.check_array` takes (lists, arrays, DataFrames),
      dense and finite. The factors are learned in float32 and must lie in
      ``[-1e15, 1e15]`` (scored: within float32's range). Labels are any scikit-learn takes but
      None and NaN (of any numeric type), which mark a missing label: a ValueError naming the
      first one and its position in ``y`` (or ``classes``). A rejected call changes nothing.
    - **Audit trail.** The memory logs the decisions it learns (``memory_.decision_log``, behind
      ``trace``, ``undo_`` and ``forget_``) and its gate, promotion and recycle events, all
      bounded by ``max_log_events``, so that ``partial_fit`` on an endless stream keeps the
      state flat. By default the log keeps at most the latest 10,000 decisions: past that the
      oldest calls are folded into its base (whole: a ``fit`` or ``partial_fit`` of more rows
      than that keeps none of them), and ``undo_`` and ``forget_`` reach back only as far as it
      does. ``max_log_events=None`` keeps every decision (the log grows without end), ``0``
      none.
    - **Threads.** An estimator can be shared by threads: its own lock serializes ``fit``,
      ``partial_fit``, ``predict``, ``predict_proba``, ``predict_log_proba`` (and ``score``,
      through ``predict``) and copies (pickle, ``copy.deepcopy``), so calls learn one after
      another, none lost, and every answer and copy comes from the state between two whole
      calls; a copy or :func:`~sklearn.base.clone` has a lock of its own. Not covered:
      ``set_params`` while other threads call it, and calls on ``memory_`` itself, which its
      own lock serializes apart from the estimator.

    Attributes:
        memory_: the fitted :class:`~gae.JudgmentMemory`; actions are the classes (named
            ``str(label)`` when those names are distinct, else ``str(index)``), factors the
            non-category columns (named by ``feature_names_in_`` when there are some).
        classes_: (n_classes,) the class labels, sorted; column order of ``predict_proba``.
        class_count_: (n_classes,) float64, training rows of each class: the abstention answer.
        categories_: (n_categories,) int64 category ids in the memory's category order, or None
            when ``category`` is None.
        n_features_in_: columns of ``X``, the category column included.
        feature_names_in_: (n_features_in_,) column names, when ``X`` was a DataFrame of string
            column names.

    Examples::

        >>> X = [[0.0, 0.1, 0], [1.0, 0.9, 0], [0.1, 0.0, 1], [0.9, 1.0, 1]]
        >>> model = JudgmentClassifier(category=2, tau=0.2).fit(X, ["no", "yes", "no", "yes"])
        >>> model.predict([[0.2, 0.1, 1], [0.8, 0.7, 0], [0.8, 0.7, 5]]).tolist()
        ['no', 'yes', 'no']
        >>> model.memory_.config.learning
        'lvq'
    """

    def __init__(self, *, category: int | None = None, **options: Any) -> None:
        self.category = category
        for name, value in JudgmentConfig.with_defaults(options, "JudgmentClassifier", _DEFAULTS).items():
            setattr(self, name, value)
        self._lock = threading.RLock()  # held by every public method, from its checks to its last write

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:  # the state between two calls, even while other threads learn
            state = {name: value for name, value in super().__getstate__().items() if name != "_lock"}
            if "memory_" in state:  # pickled here, under the lock, not after this returns
                state["memory_"] = pickle.dumps(state["memory_"], pickle.HIGHEST_PROTOCOL)
                state["class_count_"] = state["class_count_"].copy()  # partial_fit adds to it in place
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("memory_"), bytes):
            state = {**state, "memory_": pickle.loads(state["memory_"])}
        super().__setstate__(state)
        self._lock = threading.RLock()

    def _config(self) -> JudgmentConfig:
        """The options as a :class:`~gae.JudgmentConfig`: its checks name a bad option and value."""
        return JudgmentConfig(**{name: getattr(self, name) for name in JudgmentConfig.options()})

    # -- fitting ------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any) -> JudgmentClassifier:
        """Build a fresh memory and learn every row of ``X`` (n_samples, n_features) with its
        label in ``y`` (n_samples,), in order. Returns self."""
        with self._lock:
            config = self._config()
            _check_labels(y, "y")
            X_checked, y = check_X_y(X, y, dtype="numeric", estimator=self)
            column = _category_column(self.category, X_checked.shape[1])
            check_classification_targets(y)
            classes, labels = np.unique(y, return_inverse=True)
            factors, ids = _split(X_checked, column, LEARN_LIMIT)
            categories = None if ids is None else np.unique(ids)
            # every check passed: from here on the estimator changes
            validate_data(self, X, skip_check_array=True)  # n_features_in_ and feature_names_in_
            self.classes_ = classes
            self.class_count_ = np.zeros(len(classes))
            self.categories_ = categories
            self._category_column = column
            self.memory_ = JudgmentMemory(1 if categories is None else _names(categories), _names(classes),
                                          self._factor_names(column), config)
            self._learn(factors, ids, labels)
            return self

    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> JudgmentClassifier:
        """Learn the rows of ``X`` with the labels ``y``, in order, continuing the memory.

        Args:
            X: (n_samples, n_features) decisions.
            y: (n_samples,) their labels, all in ``classes_``.
            classes: every label the memory will learn, e.g. ``np.unique(y_all)`` over the whole
                stream's labels; required on the first call (when ``fit`` was not called), which
                fixes the classes (the memory's actions) and raises without it. Later calls: None
                or the same labels.
        """
        with self._lock:
            return self._partial_fit(X, y, classes)

    def _partial_fit(self, X: Any, y: Any, classes: Any) -> JudgmentClassifier:
        first = not hasattr(self, "memory_")
        _check_labels(y, "y")
        if classes is not None:
            _check_labels(classes, "classes")
        if first:
            config = self._config()
            if classes is None:
                raise ValueError("classes must be given on the first call to partial_fit: pass classes=, every label "
                                 "the memory will learn, e.g. partial_fit(X, y, classes=np.unique(y_all)) with y_all "
                                 "the labels of the whole stream (or call fit first); got classes=None")
            X_checked, y = check_X_y(X, y, dtype="numeric", estimator=self)
            column = _category_column(self.category, X_checked.shape[1])
            known = unique_labels(classes)
        else:
            self._check_unchanged()
            column = self._category_column
            X_checked, y = validate_data(self, X, y, reset=False, dtype="numeric")
            known = self.classes_
            if classes is not None and not np.array_equal(unique_labels(classes), known):
                raise ValueError(f"classes={classes!r} differs from the classes of the fitted memory, "
                                 f"{known.tolist()!r}")
        check_classification_targets(y)
        outside = np.setdiff1d(y, known)
        if outside.size:
            raise ValueError(f"y holds labels outside classes {known.tolist()!r}: {outside.tolist()!r}")
        factors, ids = _split(X_checked, column, LEARN_LIMIT)
        # every check passed: from here on the estimator changes
        if first:
            validate_data(self, X, skip_check_array=True)
            self.classes_ = known
            self.class_count_ = np.zeros(len(known))
            self.categories_ = None if ids is None else np.unique(ids)
            self._category_column = column
            categories = 1 if self.categories_ is None else _names(self.categories_)
            self.memory_ = JudgmentMemory(categories, _names(known), self._factor_names(column), config)
        elif ids is not None and self.categories_ is not None:
            new = np.setdiff1d(ids, self.categories_)
            if new.size:
                self.memory_.add_categories_([str(i) for i in new])
                self.categories_ = np.concatenate([self.categories_, new])
        self._learn(factors, ids, np.searchsorted(self.classes_, y))
        return self

    def _learn(self, factors: np.ndarray, ids: np.ndarray | None, labels: np.ndarray) -> None:
        device = self.memory_.centroids.device
        category = self._category_index(ids, factors.shape[0])[0]
        self.memory_.learn_(torch.from_numpy(factors).to(device), torch.from_numpy(category).to(device),
                            torch.from_numpy(labels.astype(np.int64)).to(device), confirmed=None)
        self.class_count_ += np.bincount(labels, minlength=len(self.classes_))

    def _check_unchanged(self) -> None:
        """partial_fit continues the memory only with the options and column it was built with."""
        built, current = self.memory_.config, self._config()
        changed = [f"{name}: {built.option(name)!r} -> {current.option(name)!r}"
                   for name in JudgmentConfig.options() if current.option(name) != built.option(name)]
        if self.category != self._category_column:
            changed.append(f"category: {self._category_column!r} -> {self.category!r}")
        if changed:
            raise ValueError(f"parameters changed since the memory was built ({'; '.join(changed)}); "
                             "partial_fit continues that memory: call fit to build one with the new parameters")

    def _factor_names(self, column: int | None) -> list[str]:
        names = getattr(self, "feature_names_in_", None)
        kept = [j for j in range(self.n_features_in_) if j != column]
        return _names(np.asarray(kept) if names is None else names[kept])

    def _category_index(self, ids: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(n,) int64 memory category indices and (n,) bool: the id is known to the memory."""
        if ids is None or self.categories_ is None:
            return np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
        order = np.argsort(self.categories_)
        sorted_ids = self.categories_[order]
        position = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
        known = sorted_ids[position] == ids
        return np.where(known, order[position], 0).astype(np.int64), known

    # -- predicting ---------------------------------------------------------------------------
    def predict_proba(self, X: Any) -> np.ndarray:
        """(n_samples, n_classes) float64 probabilities, columns in ``classes_`` order: the
        memory's, or the training class frequencies where it abstains."""
        with self._lock:
            check_is_fitted(self)
            X_checked = validate_data(self, X, reset=False, dtype="numeric")
            factors, ids = _split(X_checked, self._category_column, _SCORE_LIMIT)
            n = factors.shape[0]
            proba = np.tile(self.class_count_ / self.class_count_.sum(), (n, 1))
            category, known = self._category_index(ids, n)
            rows = np.flatnonzero(known)
            if rows.size:
                device = self.memory_.centroids.device
                with torch.no_grad():
                    out = self.memory_(torch.from_numpy(factors[rows]).to(device),
                                       torch.from_numpy(category[rows]).to(device))
                probs = out.probs.double().cpu().numpy()  # (n_known, n_classes), rows of zeros: abstained
                total = probs.sum(axis=1)
                answered = total > 0
                proba[rows[answered]] = probs[answered] / total[answered, None]
            return proba

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """The log of :meth:`predict_proba` (``-inf`` for a class with probability 0)."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        """(n_samples,) the most probable class of each row (ties: the first in ``classes_``)."""
        with self._lock:  # classes_ read from the state predict_proba answered from
            proba = self.predict_proba(X)  # first: it says when the estimator is not fitted
            return self.classes_[np.argmax(proba, axis=1)]


def _signature() -> inspect.Signature:
    """``__init__``'s signature as scikit-learn reads it: ``category`` and every JudgmentConfig
    option as a keyword parameter with its default (``get_params``, ``clone`` and ``repr``)."""
    return inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         inspect.Parameter("category", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="int | None"),
         *JudgmentConfig.keyword_parameters(_DEFAULTS)], return_annotation=None)


JudgmentClassifier.__init__.__signature__ = _signature()  # type: ignore[attr-defined]


def _category_column(category: Any, n_columns: int) -> int | None:
    """The ``category`` parameter checked: None, or a column of ``X`` that leaves a factor."""
    if category is None:
        return None
    if isinstance(category, bool) or not isinstance(category, numbers.Integral):
        raise TypeError(f"category must be None or the int index of X's category column, got {category!r}")
    column = int(category)
    if not 0 <= column < n_columns:
        raise ValueError(f"category must be a column index of X in [0, {n_columns}), got {column}")
    if n_columns == 1:
        raise ValueError(f"category={category} is X's only column: the memory needs at least one factor column")
    return column


def _check_labels(values: Any, argument: str) -> None:
    """ValueError naming the first missing label (None or NaN) in ``values`` and its position."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):  # not an array of labels: scikit-learn's checks say what it is
        return
    if array.ndim == 0:  # y=None and other non-sequences: scikit-learn's checks say so too
        return
    if array.dtype.kind in "fc":
        missing = np.isnan(array)
    elif array.dtype.kind == "O":
        missing = np.fromiter((_is_missing(value) for value in array.flat), bool, array.size).reshape(array.shape)
    else:
        return
    if missing.any():
        where = tuple(int(i) for i in np.argwhere(missing)[0])
        value = array[where]
        value = value.item() if isinstance(value, np.generic) else value
        raise ValueError(f"{argument} must hold labels, not missing values: got {value!r} at "
                         f"{argument}[{', '.join(map(str, where))}] (None and NaN mark a missing label)")


def _is_missing(value: Any) -> bool:
    """None, and any value not equal to itself (NaN of any numeric type, NumPy's NaT), are no label."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except ArithmeticError:  # a signalling Decimal NaN refuses even to be compared
        return True
    except (TypeError, ValueError):  # a value whose comparison is no truth value is not missing
        return False


def _split(X: np.ndarray, column: int | None, limit: float) -> tuple[np.ndarray, np.ndarray | None]:
    """(factors (n, K) float32, category ids (n,) int64 or None) of a checked numeric ``X``."""
    ids = None
    if column is not None:
        raw = X[:, column]
        if raw.dtype.kind == "f":
            bad = ~((raw >= 0) & (raw < 2.0**63) & (np.floor(raw) == raw))
        else:  # integers and bools
            bad = (raw < 0) | (raw > np.iinfo(np.int64).max)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"X[:, {column}] (the category column) must hold whole numbers in [0, 2**63), "
                             f"got {raw[row].item()!r} at row {row}")
        ids = raw.astype(np.int64)
    kept = [j for j in range(X.shape[1]) if j != column]
    factors = np.asarray(X[:, kept], dtype=np.float64)
    outside = np.abs(factors) > limit
    if outside.any():
        row, col = (int(i) for i in np.argwhere(outside)[0])
        reason = "to be learned (the memory's float32 state must stay finite)" if limit == LEARN_LIMIT \
            else "to be scored (the memory computes in float32)"
        raise ValueError(f"X must lie in [-{limit:g}, {limit:g}] {reason}, got {factors[row, col]:g} "
                         f"at X[{row}, {kept[col]}]")
    return factors.astype(np.float32), ids


def _names(values: np.ndarray) -> list[str]:
    """``str`` of each value when those are distinct and non-empty, else the indices ``'0'..``."""
    names = [str(value) for value in values]
    if all(names) and len(set(names)) == len(names):
        return names
    return [str(i) for i in range(len(names))]

