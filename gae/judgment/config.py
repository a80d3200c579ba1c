"""JudgmentConfig: every option of the judgment memory, declared and validated once."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gae import validation as check
from gae.refer import Referral

DriftMode = Literal["seed", "adaptive"]
Learning = Literal["gated", "lvq"]
Units = Literal["criterion", "category"]
# the options of decide's act-or-refer answer, not of what the memory learns: memories sharing a ledger need not agree
REFER_OPTIONS = ("target_error", "refer_confidence", "refer_margin")


@dataclass(frozen=True, repr=False)
class JudgmentConfig:
    """The options of a :class:`~gae.JudgmentMemory`, one field each, validated on construction.

    ``JudgmentConfig()`` (also :meth:`seed`) is the original design's rule, bit for bit. A
    config is immutable: derive another with :meth:`replace`. Every field travels in
    checkpoints and evaluation traces through :meth:`to_dict` / :meth:`from_dict`.

    Examples::

        >>> config = JudgmentConfig.seed().replace(drift_mode="adaptive")
        >>> config.drift_mode, config.eta_confirmed
        ('adaptive', 0.05)
        >>> JudgmentConfig.from_dict(config.to_dict()) == config
        True
        >>> JudgmentConfig(tau=0)
        Traceback (most recent call last):
        ...
        ValueError: tau must be in (0.0, inf], got 0.0
    """

    # -- the seed rule
    tau: float = 0.1  # softmax temperature of the scores: logits are -distance / tau
    eta_confirmed: float = 0.05  # step size when the memory's own recommendation was confirmed
    eta_override: float = 0.01  # step size when the verifier chose another action
    drift_threshold: float = 0.4  # unweighted L2 displacement past which a step is damped (the gate)
    gate_damping: float = 0.5  # factor applied to a gated step
    # -- options the original package has and the seed leaves off
    clip: tuple[float, float] | None = None  # (low, high) every prototype is clamped to after an update
    push_rate: float = 0.0  # on an override, move the wrongly recommended prototype away from x at this rate
    min_confidence: float = 0.0  # abstain (action -1) when the best probability is below this
    # -- drift_mode='adaptive' (docs/drift.md)
    drift_mode: DriftMode = "seed"  # 'seed': the original rule; 'adaptive': change test, run means, tracking
    shadow_eta: float = 0.5  # step size of the shadow prototypes the change test compares against
    promotion_threshold: float = math.log(20.0)  # CUSUM threshold in nats: about 4 decisions clearly closer
    tracking_eta: float = 0.2  # step size of the tracking prototypes (halved past drift_threshold)
    evidence_clip: float = 1.0  # nats: one decision moves the change test and the tracking lead by at most this
    evidence_allowance: float = 0.25  # nats subtracted per decision: without a drift the statistic falls
    lead_rate: float = 0.1  # rate of the tracking lead: about the category's last 10 verified decisions
    # -- prototypes=P > 1 (docs/prototypes.md)
    prototypes: int = 1  # prototype slots per category and action
    spawn_threshold: float = 0.5  # unweighted L2 from its action's prototypes that starts one (lvq: see docs/lvq.md)
    spawn_support: float = 1.5  # recent wins a prototype needs before it scores: two wins close together
    win_decay: float = 0.05  # per decision of the action: wins remember about the last 20
    # -- learning='lvq' (docs/lvq.md): units from the data, a metric learned online, prototypes where errors are
    learning: Learning = "gated"  # 'gated': the eta rule above; 'lvq': learning vector quantization (judgment/lvq.py)
    units: Units = "category"  # lvq: squared differences over the category's mean running variance, or each criterion's
    rate_floor: float = 0.02  # lvq: prototypes learn at max(1 / (updates + 1), rate_floor): running mean, then tracking
    relevance_rate: float = 0.0  # lvq: step size of the criterion relevances (GRLVQ); 0 keeps them uniform
    miss_penalty: float = 0.0  # lvq, P > 1: other actions' prototypes nearer than the right one lose this share of wins
    # -- the decision log (trace, undo_, forget_)
    max_log_events: int | None = None  # decisions the log keeps (older ones folded into its base); 0: none
    # -- judges beside the prototypes, each trusted as far as it has judged well (docs/judges.md)
    judges: Mapping[str, Mapping[str, Any]] | tuple | None = ()  # {name: {"kind": kind, option: value}}; None: ()
    trust_rate: float = 0.5  # learning rate of the trust weights on the judges' log-loss (judgment/trust.py)
    trust_share: float = 0.02  # fixed share (> 0): every judge keeps at least this share over J of the trust
    trust_floor: float = 0.05  # one decision costs a judge at most -log(trust_floor) nats of log-loss
    # -- act or refer: decide's refer and reasons (gae/refer.py, docs/mcp.md#act-or-refer)
    target_error: float | None = None  # the error allowed among the decisions not referred, calibrated online
    refer_confidence: float = 0.6  # without target_error: refer a decision less confident than this
    refer_margin: float = 0.1  # refer a decision whose best two probabilities are closer than this

    def __post_init__(self) -> None:
        real = check.check_real
        set_ = object.__setattr__  # frozen: the checked values (ints as floats) are set once, here
        set_(self, "tau", real("tau", self.tau, low=0.0, low_open=True))
        if float(np.float32(self.tau)) == 0.0:  # the rule divides by tau in float32 (logits: -distance / tau)
            raise ValueError(f"tau must be at least the smallest float32 (1.4e-45): the memory divides by it in "
                             f"float32, got {self.tau!r}")
        for name in ("eta_confirmed", "eta_override", "gate_damping", "shadow_eta", "tracking_eta", "lead_rate"):
            set_(self, name, real(name, getattr(self, name), low=0.0, high=1.0, low_open=True))
        for name in ("push_rate", "min_confidence", "win_decay", "miss_penalty"):
            set_(self, name, real(name, getattr(self, name), low=0.0, high=1.0))
        for name in ("drift_threshold", "spawn_threshold", "spawn_support", "evidence_clip", "evidence_allowance"):
            set_(self, name, real(name, getattr(self, name), low=0.0))
        set_(self, "promotion_threshold", real("promotion_threshold", self.promotion_threshold, low=0.0,
                                               low_open=True))
        if self.drift_mode not in ("seed", "adaptive"):
            raise ValueError(f"drift_mode must be 'seed' or 'adaptive', got {self.drift_mode!r}")
        if self.learning not in ("gated", "lvq"):
            raise ValueError(f"learning must be 'gated' or 'lvq', got {self.learning!r}")
        if self.units not in ("criterion", "category"):
            raise ValueError(f"units must be 'criterion' or 'category', got {self.units!r}")
        set_(self, "rate_floor", real("rate_floor", self.rate_floor, low=0.0, high=1.0, low_open=True))
        set_(self, "relevance_rate", real("relevance_rate", self.relevance_rate, low=0.0))
        if self.lvq and self.adaptive:
            raise ValueError("learning='lvq' handles drift per prototype (rate_floor, spawning where it errs) and "
                             "does not combine with drift_mode='adaptive'; got learning='lvq', drift_mode='adaptive'")
        set_(self, "prototypes", check.check_int("prototypes", self.prototypes, low=1))
        if self.max_log_events is not None:
            check.check_int("max_log_events", self.max_log_events, low=0)
        set_(self, "clip", _checked_clip(self.clip))
        from gae.judgment import judges  # the judges' modules build on the primitives, which import this one
        set_(self, "judges", judges.parse(self.judges))
        set_(self, "trust_rate", real("trust_rate", self.trust_rate, low=0.0))
        # a share > 0 keeps every trust weight >= trust_share / J, so the trust's normaliser never reaches 0
        set_(self, "trust_share", real("trust_share", self.trust_share, low=0.0, high=1.0, low_open=True))
        set_(self, "trust_floor", real("trust_floor", self.trust_floor, low=0.0, high=1.0, low_open=True))
        if self.target_error is not None:
            set_(self, "target_error", real("target_error", self.target_error, low=0.0, high=1.0, low_open=True,
                                            high_open=True))
        for name in ("refer_confidence", "refer_margin"):
            set_(self, name, real(name, getattr(self, name), low=0.0, high=1.0))

    def referral(self) -> Referral:
        """A fresh :class:`~gae.refer.Referral` of these options (nothing observed yet)."""
        return Referral(self.target_error, min_confidence=self.refer_confidence, min_margin=self.refer_margin)

    def __repr__(self) -> str:
        """The options that differ from the seed rule's; ``JudgmentConfig()`` is the seed rule."""
        judges = self.to_dict()["judges"]  # as the mapping they are given as
        changed = [f"{f.name}={judges if f.name == 'judges' else getattr(self, f.name)!r}"
                   for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]
        return f"JudgmentConfig({', '.join(changed)})"

    @classmethod
    def seed(cls) -> JudgmentConfig:
        """The original design: one prototype per (category, action), the gated eta rule."""
        return cls()

    @classmethod
    def recommended(cls) -> JudgmentConfig:
        """The best configuration gae has for a stream it knows nothing about, the default of
        ``gae.river.JudgmentClassifier`` and ``gae.sklearn.JudgmentClassifier``: ``learning='lvq'``
        (docs/lvq.md) with up to 32 prototypes per category and action, spawned where the memory
        errs, relevances learned online, in the data's own units; beside them four judges
        (docs/judges.md), class means with a variance per criterion (``gauss``) and under one shrunk
        covariance (``lda``), each also with a short memory (about the last 20 and 33 decisions of
        the category), trusted as far as each has judged well. Its constants were chosen on tuning
        streams apart from those the benchmarks report (docs/lvq.md and docs/judges.md say how)."""
        return cls(learning="lvq", units="category", prototypes=32, rate_floor=0.1, push_rate=0.5,
                   relevance_rate=0.05, miss_penalty=0.5, spawn_threshold=0.4, spawn_support=1.5, win_decay=0.01,
                   judges={"gauss": {"kind": "gauss"}, "lda": {"kind": "lda"},
                           "gauss_short": {"kind": "gauss", "rate_floor": 0.05},
                           "lda_short": {"kind": "lda", "rate_floor": 0.03}})

    @classmethod
    def keyword_parameters(cls, defaults: JudgmentConfig | None = None) -> list[inspect.Parameter]:
        """Every option as a keyword-only :class:`inspect.Parameter` with its value in ``defaults``
        (:meth:`recommended` unless given) and its type: the visible signature of an estimator
        that takes the options as ``**options`` (``gae.river``, ``gae.sklearn``), whose parameter
        lists (``get_params``, ``clone``, ``repr``) read the signature."""
        defaults = cls.recommended() if defaults is None else defaults
        hints = typing.get_type_hints(cls)
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults.parameter(name),
                                  annotation=hints[name]) for name in cls.options()]

    @classmethod
    def with_defaults(cls, options: Mapping[str, Any], owner: str,
                      defaults: JudgmentConfig | None = None) -> dict[str, Any]:
        """``options`` as given (values unchecked), with every option they lack at its value in
        ``defaults`` (:meth:`recommended` unless given); TypeError naming ``owner`` and any
        unknown option."""
        unknown = sorted(set(options) - set(cls.options()))
        if unknown:
            raise TypeError(f"{owner} got unknown option(s) {unknown}; the options are {list(cls.options())}")
        defaults = cls.recommended() if defaults is None else defaults
        return {name: options[name] if name in options else defaults.parameter(name) for name in cls.options()}

    def parameter(self, name: str) -> Any:
        """Option ``name`` as an estimator's parameter: its value, but the judges as their
        :class:`~gae.judgment.judges.Judge` records and None for none (scikit-learn refuses a
        default that is a dict, and river's ``clone`` fails on an empty tuple)."""
        if name == "judges":
            return self.judged() or None
        return getattr(self, name)

    def replace(self, **changes: Any) -> JudgmentConfig:
        """A copy with ``changes`` applied (and validated); TypeError names an unknown option."""
        unknown = sorted(set(changes) - set(self.options()))
        if unknown:
            raise TypeError(f"unknown JudgmentConfig option(s) {unknown}; the options are {list(self.options())}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """Every option as plain JSON-able values (``clip`` as a list)."""
        values = {name: getattr(self, name) for name in self.options()}
        values["clip"] = None if self.clip is None else list(self.clip)
        values["judges"] = {judge.name: judge.to_dict() for judge in self.judged()}
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> JudgmentConfig:
        """The config :meth:`to_dict` wrote; options missing from ``values`` (written before
        they existed) take their defaults, unknown ones are refused (TypeError)."""
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping of option names, got {type(values).__name__}")
        return cls().replace(**values)

    @property
    def adaptive(self) -> bool:
        """``drift_mode == 'adaptive'``."""
        return self.drift_mode == "adaptive"

    def judged(self) -> tuple[Any, ...]:
        """The judges beside the prototypes, as :class:`~gae.judgment.judges.Judge` records."""
        return typing.cast(tuple, self.judges)

    @property
    def lvq(self) -> bool:
        """``learning == 'lvq'``."""
        return self.learning == "lvq"


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
