"""JudgmentConfig: every option of the judgment memory, each in the group of what it configures.

A group is a small frozen dataclass declared once here, with its options' comments and checks:
:class:`Rule` (the seed rule), :class:`Drift` (``drift_mode`` and the change test of
``'adaptive'``), :class:`Slots` (several prototypes per category and action), :class:`LVQ`
(``learning='lvq'``), :class:`Log` (the decision log) and :class:`Trust` (the trust in the
judges); each judge's options are its own record (:mod:`gae.judgment.judges`).
:class:`JudgmentConfig` holds one of each, ``learning`` and the judges.

Every option also has its flat name, the one address it had before the groups (``tau``,
``drift_mode``, ``trust_rate``, ...): :data:`PATHS` maps each to its place, derived from the
groups' fields (a field's flat name is its own unless its ``metadata`` names another). A config
is built and changed by either (``JudgmentConfig(tau=0.2)``, ``replace(drift_mode='adaptive')``),
is written flat (:meth:`JudgmentConfig.to_dict`: what checkpoints, evaluation traces and ledgers
record, so those of every gae version compare and load), and read from either form
(:meth:`JudgmentConfig.from_dict`). The river and scikit-learn estimators take the flat names
as their parameters (:meth:`JudgmentConfig.keyword_parameters`).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gae import validation as check

DriftMode = Literal["seed", "adaptive"]
Learning = Literal["gated", "lvq"]
Units = Literal["criterion", "category", "memory"]
# options of act or refer that configs held before the Decider did: an old config's values are dropped when read
REFER_OPTIONS = ("target_error", "refer_confidence", "refer_margin")
FLAT = "flat"  # a group field's metadata key: the option's flat name, where it is not the field's own


def flat_name(group: type, name: str) -> str:
    """The flat name of field ``name`` of ``group`` (its own, unless its metadata names another)."""
    return next(spec for spec in dataclasses.fields(group) if spec.name == name).metadata.get(FLAT, name)


def _set_real(group: Any, name: str, **bounds: Any) -> None:
    """Check field ``name`` of a group being built as a real number in ``bounds`` (the error names its
    flat name) and keep it as a float; a group is frozen, so the checked value is set once, here."""
    value = check.check_real(flat_name(type(group), name), getattr(group, name), **bounds)
    object.__setattr__(group, name, value)


def _check_choice(group: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(group, name)
    if value not in choices:
        raise ValueError(f"{flat_name(type(group), name)} must be {' or '.join(map(repr, choices))}, got {value!r}")


def _checked_clip(clip: Any) -> tuple[float, float] | None:
    if clip is None:
        return None
    if isinstance(clip, str) or not isinstance(clip, Sequence) or len(clip) != 2:
        raise TypeError(f"clip must be None or a (low, high) pair, got {clip!r}")
    low = check.check_real("clip[0]", clip[0], low=-math.inf)
    high = check.check_real("clip[1]", clip[1], low=-math.inf)
    if not low < high:
        raise ValueError(f"clip must have low < high, got {clip!r}")
    return (low, high)


@dataclass(frozen=True)
class Rule:
    """The seed rule (docs/rule.md): the scores' temperature, the gated eta steps, and the options
    the original package has and the seed leaves off (``clip``, ``push_rate``, ``min_confidence``)."""

    tau: float = 0.1  # softmax temperature of the scores: logits are -distance / tau
    eta_confirmed: float = 0.05  # step size when the memory's own recommendation was confirmed
    eta_override: float = 0.01  # step size when the verifier chose another action
    drift_threshold: float = 0.4  # unweighted L2 displacement past which a step is damped (the gate)
    gate_damping: float = 0.5  # factor applied to a gated step
    clip: tuple[float, float] | None = None  # (low, high) every prototype is clamped to after an update
    push_rate: float = 0.0  # on an override, move the wrongly recommended prototype away from x at this rate
    min_confidence: float = 0.0  # abstain (action -1) when the best probability is below this

    def __post_init__(self) -> None:
        _set_real(self, "tau", low=0.0, low_open=True)
        if float(np.float32(self.tau)) == 0.0:  # the rule divides by tau in float32 (logits: -distance / tau)
            raise ValueError(f"tau must be at least the smallest float32 (1.4e-45): the memory divides by it in "
                             f"float32, got {self.tau!r}")
        for name in ("eta_confirmed", "eta_override", "gate_damping"):
            _set_real(self, name, low=0.0, high=1.0, low_open=True)
        for name in ("push_rate", "min_confidence"):
            _set_real(self, name, low=0.0, high=1.0)
        _set_real(self, "drift_threshold", low=0.0)
        object.__setattr__(self, "clip", _checked_clip(self.clip))


@dataclass(frozen=True)
class Drift:
    """``drift_mode`` (docs/drift.md): ``'seed'``, the original rule, or ``'adaptive'``, which
    follows a sustained drift and damps an outlier (a change test against shadow prototypes,
    run means, tracking prototypes); the other options are the adaptive mode's."""

    mode: DriftMode = field(default="seed", metadata={FLAT: "drift_mode"})  # 'seed' or 'adaptive'
    shadow_eta: float = 0.5  # step size of the shadow prototypes the change test compares against
    promotion_threshold: float = math.log(20.0)  # CUSUM threshold in nats: about 4 decisions clearly closer
    tracking_eta: float = 0.2  # step size of the tracking prototypes (halved past drift_threshold)
    evidence_clip: float = 1.0  # nats: one decision moves the change test and the tracking lead by at most this
    evidence_allowance: float = 0.25  # nats subtracted per decision: without a drift the statistic falls
    lead_rate: float = 0.1  # rate of the tracking lead: about the category's last 10 verified decisions

    def __post_init__(self) -> None:
        _check_choice(self, "mode", typing.get_args(DriftMode))
        for name in ("shadow_eta", "tracking_eta", "lead_rate"):
            _set_real(self, name, low=0.0, high=1.0, low_open=True)
        for name in ("evidence_clip", "evidence_allowance"):
            _set_real(self, name, low=0.0)
        _set_real(self, "promotion_threshold", low=0.0, low_open=True)


@dataclass(frozen=True)
class Slots:
    """The prototype slots of each category and action (docs/prototypes.md): how many, how far
    from its action's prototypes a decision starts a new one, and when a new one scores."""

    prototypes: int = 1  # prototype slots per category and action
    spawn_threshold: float = 0.5  # unweighted L2 from its action's prototypes that starts one (lvq: see docs/lvq.md)
    spawn_support: float = 1.5  # recent wins a prototype needs before it scores: two wins close together
    win_decay: float = 0.05  # per decision of the action: wins remember about the last 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "prototypes", check.check_int("prototypes", self.prototypes, low=1))
        for name in ("spawn_threshold", "spawn_support"):
            _set_real(self, name, low=0.0)
        _set_real(self, "win_decay", low=0.0, high=1.0)


@dataclass(frozen=True)
class LVQ:
    """``learning='lvq'`` (docs/lvq.md): learning vector quantization in the data's own units, a
    metric learned online, prototypes where the memory errs; with the gated rule these are unused."""

    # what a squared difference is divided by: the category's mean running variance over its criteria ('category'),
    # each criterion's running variance in the category ('criterion') or over all the memory's decisions ('memory');
    # with 'criterion' and 'memory' the answers are the same in any units (docs/inputs.md)
    units: Units = "category"
    rate_floor: float = 0.02  # prototypes learn at max(1 / (updates + 1), rate_floor): running mean, then tracking
    relevance_rate: float = 0.0  # step size of the criterion relevances (GRLVQ); 0 keeps them uniform
    miss_penalty: float = 0.0  # P > 1: other actions' prototypes nearer than the right one lose this share of wins
    # the rate floor rises to rate_per_error x the category's recent error rate: a category whose prototypes
    # keep erring (fast drift, a concept switched) forgets at the rate its losses call for; 0: rate_floor alone
    rate_per_error: float = 0.0
    error_decay: float = 0.02  # rate of the recent error rate (the prototypes' own): about the last 50 decisions

    def __post_init__(self) -> None:
        _check_choice(self, "units", typing.get_args(Units))
        _set_real(self, "rate_floor", low=0.0, high=1.0, low_open=True)
        _set_real(self, "relevance_rate", low=0.0)
        _set_real(self, "miss_penalty", low=0.0, high=1.0)
        _set_real(self, "rate_per_error", low=0.0, high=1.0)
        _set_real(self, "error_decay", low=0.0, high=1.0, low_open=True)


@dataclass(frozen=True)
class Log:
    """The decision log behind ``trace``, ``undo_`` and ``forget_`` (docs/audit.md)."""

    max_events: int | None = field(default=None, metadata={FLAT: "max_log_events"})  # decisions kept; 0: none

    def __post_init__(self) -> None:
        if self.max_events is not None:
            check.check_int("max_log_events", self.max_events, low=0)


@dataclass(frozen=True)
class Trust:
    """The trust in the judges beside the prototypes (docs/judges.md, :mod:`gae.judgment.trust`):
    each judge is trusted as far as its recent log-loss says it has judged well."""

    rate: float = field(default=0.5, metadata={FLAT: "trust_rate"})  # learning rate of the weights on the log-loss
    # fixed share (> 0): every judge keeps at least this share over J of the trust, so the normaliser never reaches 0
    share: float = field(default=0.02, metadata={FLAT: "trust_share"})
    floor: float = field(default=0.05, metadata={FLAT: "trust_floor"})  # a decision costs at most -log(floor) nats

    def __post_init__(self) -> None:
        _set_real(self, "rate", low=0.0)
        _set_real(self, "share", low=0.0, high=1.0, low_open=True)
        _set_real(self, "floor", low=0.0, high=1.0, low_open=True)


@dataclass(frozen=True, init=False, repr=False)
class JudgmentConfig:
    """The options of a :class:`~gae.JudgmentMemory`, in groups by what they configure, validated
    on construction.

    ``JudgmentConfig()`` (also :meth:`seed`) is the original design's rule, bit for bit;
    :meth:`recommended` composes the groups of the best configuration measured, and is what a
    :class:`~gae.JudgmentMemory` built without ``config`` uses. A config is
    immutable: derive another with :meth:`replace`.

    Every field is given by name, a group as its record or as a mapping of its fields (built from
    the group's defaults). Every option can also be given, changed and read by its flat name
    (``tau`` for ``rule.tau``, ``drift_mode`` for ``drift.mode``; :data:`PATHS` lists them all),
    which is also how :meth:`to_dict` writes a config: checkpoints, evaluation traces and ledgers
    of every gae version record the same names. A flat option given beside its group overrides
    the group's field (``JudgmentConfig(rule=Rule(tau=0.3), tau=0.2)`` has ``tau`` 0.2). In
    LightningCLI YAML a config is written either way (docs/training.md).

    Args:
        rule: :class:`Rule`, the seed rule. Default: ``Rule()``.
        drift: :class:`Drift`, ``drift_mode`` and the adaptive mode's options. Default: ``Drift()``.
        slots: :class:`Slots`, the prototypes per category and action. Default: ``Slots()``.
        learning: ``'gated'`` (the rule's eta steps) or ``'lvq'`` (learning vector quantization,
            the ``lvq`` group's options). Default: ``'gated'``.
        lvq: :class:`LVQ`, the options of ``learning='lvq'``. Default: ``LVQ()``.
        log: :class:`Log`, the decision log. Default: ``Log()``.
        judges: judges beside the prototypes, ``{name: {"kind": kind, option: value}}``, each judge
            its own options (:func:`gae.judgment.judges.parse`); None: none. Default: none.
        trust: :class:`Trust`, the trust in the judges. Default: ``Trust()``.
        **options: any option by its flat name (``tau=0.2``), over its group's field.

    Examples::

        >>> config = JudgmentConfig(drift=Drift(mode="adaptive"), rule={"tau": 0.2})
        >>> config.drift.mode, config.rule.tau, config.rule.eta_confirmed
        ('adaptive', 0.2, 0.05)
        >>> config == JudgmentConfig(drift_mode="adaptive", tau=0.2)  # the same, by flat names
        True
        >>> config.replace(tau=0.3).rule.tau, config.tau  # a flat name reads too
        (0.3, 0.2)
        >>> config.to_dict()["drift_mode"], JudgmentConfig.from_dict(config.to_dict()) == config
        ('adaptive', True)
        >>> PATHS["drift_mode"], PATHS["trust_rate"], PATHS["learning"]
        (('drift', 'mode'), ('trust', 'rate'), ('learning',))
        >>> JudgmentConfig(tau=0)
        Traceback (most recent call last):
        ...
        ValueError: tau must be in (0.0, inf), got 0.0
    """

    rule: Rule = Rule()  # the seed rule: temperature, gated eta steps, clip, push, minimum confidence
    drift: Drift = Drift()  # drift_mode and the change test of 'adaptive'
    slots: Slots = Slots()  # prototypes per category and action, when one starts, when one scores
    learning: Learning = "gated"  # 'gated': the rule's eta steps; 'lvq': learning vector quantization (judgment/lvq.py)
    lvq: LVQ = LVQ()  # learning='lvq': units, rates, relevances, misses
    log: Log = Log()  # the decision log (trace, undo_, forget_)
    judges: Mapping[str, Mapping[str, Any]] | tuple | None = ()  # {name: {"kind": kind, option: value}}; None: ()
    trust: Trust = Trust()  # the trust in the judges

    def __init__(self, **options: Any) -> None:
        _refuse_unknown("JudgmentConfig", options, (*_FIELDS, *PATHS))
        values = {name: options.get(name, spec.default) for name, spec in _FIELDS.items()}
        changes: dict[str, dict[str, Any]] = {}
        for name, value in options.items():
            if name not in _FIELDS:  # a flat name of a group's field: it overrides the group's
                group, group_field = PATHS[name]
                changes.setdefault(group, {})[group_field] = value
        set_ = object.__setattr__  # frozen: every field is set once, here
        for name, value in values.items():
            if name in GROUPS:
                value = dataclasses.replace(_group(name, value), **changes.get(name, {}))
            set_(self, name, value)
        if self.learning not in typing.get_args(Learning):
            raise ValueError(f"learning must be 'gated' or 'lvq', got {self.learning!r}")
        if self.learning == "lvq" and self.adaptive:
            raise ValueError("learning='lvq' handles drift per prototype (rate_floor, spawning where it errs) and "
                             "does not combine with drift_mode='adaptive'; got learning='lvq', drift_mode='adaptive'")
        from gae.judgment import judges  # the judges' modules build on the primitives, which import this one
        set_(self, "judges", judges.parse(self.judges))

    def __repr__(self) -> str:
        """The options that differ from the seed rule's, by their flat names: ``JudgmentConfig()`` is
        the seed rule, and the repr is a call that builds this config."""
        seed, judges = JudgmentConfig.seed(), self.to_dict()["judges"]  # the judges as the mapping they are given as
        changed = [f"{name}={judges if name == 'judges' else self.option(name)!r}"
                   for name in PATHS if self.option(name) != seed.option(name)]
        return f"JudgmentConfig({', '.join(changed)})"

    def __getattr__(self, name: str) -> Any:
        """An option by its flat name (``config.tau`` is ``config.rule.tau``): only called for a name
        that is not a field, a method or a property."""
        if name not in PATHS:
            raise AttributeError(f"'JudgmentConfig' object has no attribute {name!r}")
        return self.option(name)

    @classmethod
    def seed(cls) -> JudgmentConfig:
        """The original design: one prototype per (category, action), the gated eta rule
        (``JudgmentMemory(..., config=JudgmentConfig.seed())``; without ``config`` a memory is
        :meth:`recommended`)."""
        return cls()

    @classmethod
    def recommended(cls) -> JudgmentConfig:
        """The best configuration gae has for a stream it knows nothing about, the default of
        :class:`~gae.JudgmentMemory` (a memory built without ``config``),
        ``gae.river.JudgmentClassifier`` and ``gae.sklearn.JudgmentClassifier``: ``learning='lvq'``
        (docs/lvq.md) with up to 32 prototypes per category and action, spawned where the memory
        errs, relevances learned online, each criterion in units of its own running spread (so the
        answers are the same in any units: no scaler needed, docs/inputs.md), a step size that rises
        with the category's recent errors; beside them four judges (docs/judges.md), class means
        under one shrunk covariance (``lda``, also with a short memory of about the category's last
        33 decisions), each criterion's histograms over bins of its spread (``bins``) and class
        means with a variance per criterion over about the last 20 decisions (``gauss_short``),
        trusted as far as each has judged well. Its constants were chosen on tuning
        streams apart from those the benchmarks report (docs/lvq.md and docs/judges.md say how)."""
        return cls(rule=Rule(push_rate=0.5),
                   slots=Slots(prototypes=32, spawn_threshold=0.4, spawn_support=0.25, win_decay=0.01),
                   learning="lvq", lvq=LVQ(units="memory", rate_floor=0.1, relevance_rate=0.05, miss_penalty=0.5,
                                           rate_per_error=1.0, error_decay=0.02),
                   judges={"lda": {"kind": "lda", "refresh": 32}, "bins": {"kind": "bins"},
                           "gauss_short": {"kind": "gauss", "rate_floor": 0.05},
                           "lda_short": {"kind": "lda", "rate_floor": 0.03, "refresh": 32}})

    @classmethod
    def keyword_parameters(cls, defaults: JudgmentConfig | None = None) -> list[inspect.Parameter]:
        """Every option by its flat name as a keyword-only :class:`inspect.Parameter` with its value in
        ``defaults`` (:meth:`recommended` unless given) and its type: the visible signature of an
        estimator that takes the options as ``**options`` (``gae.river``, ``gae.sklearn``), whose
        parameter lists (``get_params``, ``clone``, ``repr``) read the signature."""
        defaults = cls.recommended() if defaults is None else defaults
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults.parameter(name),
                                  annotation=_annotation(name)) for name in cls.options()]

    @classmethod
    def with_defaults(cls, options: Mapping[str, Any], owner: str,
                      defaults: JudgmentConfig | None = None) -> dict[str, Any]:
        """``options`` (flat names) as given (values unchecked), with every option they lack at its
        value in ``defaults`` (:meth:`recommended` unless given); TypeError naming ``owner`` and any
        unknown option."""
        _refuse_unknown(owner, options, tuple(PATHS))
        defaults = cls.recommended() if defaults is None else defaults
        return {name: options[name] if name in options else defaults.parameter(name) for name in cls.options()}

    def option(self, name: str) -> Any:
        """The value of the option of flat name ``name`` (``'tau'``: ``self.rule.tau``)."""
        path = PATHS.get(name)
        if path is None:
            raise KeyError(f"JudgmentConfig has no option {name!r}; the options are {list(PATHS)}")
        value = object.__getattribute__(self, path[0])
        return getattr(value, path[1]) if len(path) > 1 else value

    def parameter(self, name: str) -> Any:
        """Option ``name`` (a flat name) as an estimator's parameter: its value, but the judges as
        their :class:`~gae.judgment.judges.Judge` records and None for none (scikit-learn refuses a
        default that is a dict, and river's ``clone`` fails on an empty tuple)."""
        if name == "judges":
            return self.judged() or None
        return self.option(name)

    def replace(self, **changes: Any) -> JudgmentConfig:
        """A copy with ``changes`` applied (and validated): fields by name, options by their flat
        names (over their group's, as in the constructor); TypeError names an unknown option."""
        _refuse_unknown("JudgmentConfig", changes, (*_FIELDS, *PATHS))
        return type(self)(**{**{name: getattr(self, name) for name in _FIELDS}, **changes})

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The options' flat names, in declaration order (group by group)."""
        return tuple(PATHS)

    def to_dict(self) -> dict[str, Any]:
        """Every option by its flat name as plain JSON-able values (``clip`` as a list, the judges as
        ``{name: {"kind": kind, option: value}}``): the form every gae version wrote and reads."""
        values = {name: self.option(name) for name in PATHS}
        values["clip"] = None if self.rule.clip is None else list(self.rule.clip)
        values["judges"] = {judge.name: judge.to_dict() for judge in self.judged()}
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> JudgmentConfig:
        """The config :meth:`to_dict` wrote, or one written with its groups (``{"rule": {"tau": 0.2},
        ...}``, as in YAML), or a mix; options missing from ``values`` (written before they existed)
        take their defaults, unknown ones are refused (TypeError). A config written before the
        :class:`~gae.Decider` held act or refer (``target_error``, ``refer_confidence``,
        ``refer_margin``) is read without them: they are the Decider's now."""
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping of option names, got {type(values).__name__}")
        return cls(**{name: value for name, value in values.items() if name not in REFER_OPTIONS})

    @property
    def adaptive(self) -> bool:
        """``drift.mode == 'adaptive'``."""
        return self.drift.mode == "adaptive"

    def judged(self) -> tuple[Any, ...]:
        """The judges beside the prototypes, as :class:`~gae.judgment.judges.Judge` records."""
        return typing.cast(tuple, self.judges)


GROUPS: dict[str, type] = {"rule": Rule, "drift": Drift, "slots": Slots, "lvq": LVQ, "log": Log, "trust": Trust}
_FIELDS = {spec.name: spec for spec in dataclasses.fields(JudgmentConfig)}


def _paths() -> dict[str, tuple[str, ...]]:
    """Every option's flat name -> its place: ``(group, field)`` for a group's field, ``(field,)`` for
    a field of the config itself; in declaration order."""
    paths: dict[str, tuple[str, ...]] = {}
    for name in _FIELDS:
        group = GROUPS.get(name)
        if group is None:
            paths[name] = (name,)
            continue
        for spec in dataclasses.fields(group):
            paths[spec.metadata.get(FLAT, spec.name)] = (name, spec.name)
    return paths


PATHS = _paths()  # flat name -> (field,) or (group, field): the address every option had before the groups


def _annotation(name: str) -> Any:
    """The type of the option of flat name ``name``."""
    path = PATHS[name]
    owner = JudgmentConfig if len(path) == 1 else GROUPS[path[0]]
    return typing.get_type_hints(owner)[path[-1]]


def _signature() -> inspect.Signature:
    """``JudgmentConfig(...)``'s signature as jsonargparse reads it (LightningCLI YAML and command lines,
    training/module.py): the fields, then every group's option by its flat name. A flat option's
    default is argparse's SUPPRESS, so a parser leaves it out unless it is given: YAML then writes a
    config either with its groups or flat, and a flat option given overrides its group's field."""
    hints = typing.get_type_hints(JudgmentConfig)
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = [inspect.Parameter(name, keyword, default=spec.default, annotation=hints[name])
              for name, spec in _FIELDS.items()]
    flat = [inspect.Parameter(name, keyword, default=argparse.SUPPRESS, annotation=_annotation(name))
            for name, path in PATHS.items() if len(path) > 1]
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *fields, *flat],
                             return_annotation=None)


JudgmentConfig.__init__.__signature__ = _signature()  # type: ignore[attr-defined]


def _group(name: str, value: Any) -> Any:
    """Field ``name``'s group from ``value``: its record, or a mapping of its fields (from the defaults)."""
    kind = GROUPS[name]
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a {kind.__name__} or a mapping of its options, got {value!r}")
    fields = [spec.name for spec in dataclasses.fields(kind)]
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise TypeError(f"{name} ({kind.__name__}) has no option(s) {unknown}; its options are {fields}")
    return kind(**value)


def _refuse_unknown(owner: str, options: Mapping[str, Any], known: Sequence[str]) -> None:
    """TypeError naming ``owner`` and any option not in ``known`` (act or refer's: one sentence naming the Decider)."""
    moved = [name for name in REFER_OPTIONS if name in options]
    if moved:
        raise TypeError(f"{owner}: {', '.join(moved)} configure act or refer, which moved to gae.Decider: "
                        f"Decider(memory, {', '.join(f'{name}=...' for name in moved)})")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{owner} got unknown option(s) {unknown}; the options are {list(known)}")

