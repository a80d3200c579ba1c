"""gae-mcp's configuration: a TOML file, every key checked (an unknown one is an error naming it).

.. code-block:: toml

    [judgment]               # JudgmentConfig.recommended(), these options replaced (any JudgmentConfig option)
    drift_mode = "adaptive"

    [refer]                  # act or refer: the Decider each memory is served by (gae.Decider)
    target_error = 0.02      # the error allowed among the decisions not referred (false: none, and refer
    confidence = 0.6         # ... below this confidence instead)
    margin = 0.1             # refer when the best two actions' probabilities are closer ("small_margin")

    [text]
    capacity = 1000000       # text memories kept (the oldest go first past it)
    recency_hours = 24       # recall's recency time constant, in hours: exp(-age / 24 h) (see below), one
                             # second (1/3600) to a million hours

    [ledger]
    durable_decisions = true # every decide committed before it answers (false: with the next verify)

    [limits]                 # what one call may ask for
    memories = 100           # judgment memories (sets of factor names) the server holds
    factors = 256            # factors a decision names
    actions = 64             # actions a judgment memory holds (decide's actions, and what it grows to)
    categories = 1000        # categories a judgment memory grows to (each holds prototypes of every action)
    name_length = 200        # characters of a name (category, action, factor, scope)
    text_length = 20000      # characters of a text or a query

    [[memory]]               # a judgment memory with fixed names (refuses others)
    factors = ["amount", "risk"]
    categories = ["billing"]
    actions = ["approve", "escalate"]

Act or refer configures the :class:`~gae.Decider` that serves a memory, not the memory, so it has
its own table. The older forms are read as the settings they became: the previous release's
``[judgment] target_error``, ``refer_confidence`` and ``refer_margin``, and the first release's
``[refer] min_confidence`` and ``min_margin``. A setting given in two forms is refused.

Without a ``[[memory]]`` for a set of factor names, the server opens a memory for it on first
sight that grows its categories and actions as calls name them.

``[text] recency_hours`` is the time constant of the recency term of a recall's score,
``exp(-age / tau)``, in hours (the :class:`~gae.RetrievalScorer` takes seconds: the service
converts). The default, 24 hours, is an agent's working day: a note written today keeps most of
its recency, one from yesterday about a third (e^-1), one from last week next to none, so among
texts about as similar to the query, today's come first. The store does not keep it: a server
started with another value ranks the same texts by it, and stores written before it existed open
as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gae import validation as check
from gae.decider.refer import MIN_CONFIDENCE, MIN_MARGIN
from gae.judgment.config import JudgmentConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser from PyPI (the mcp extra installs it)
    import tomli as tomllib

TEXT_CAPACITY = 1_000_000
RECENCY_HOURS = 24.0  # an agent's working day (see the module)
# recency_hours' range: the scorer holds tau in seconds as a float32, which a second to a million hours keeps
# finite and non-zero (past them: a recency of nan at age 0, or of 1 at every age)
RECENCY_HOURS_RANGE = (1 / 3600, 1e6)
MAX_CATEGORIES = 1000
TARGET_ERROR = 0.02  # the server's act-or-refer target by default: an agent asks "may I act?" first
# act or refer's settings: the ServerConfig field -> its key in [refer], then the older forms read as it
# (the first release's [refer] keys, the previous release's [judgment] options)
REFER_SETTINGS = {
    "target_error": (("refer", "target_error"), ("judgment", "target_error")),
    "refer_confidence": (("refer", "confidence"), ("refer", "min_confidence"), ("judgment", "refer_confidence")),
    "refer_margin": (("refer", "margin"), ("refer", "min_margin"), ("judgment", "refer_margin")),
}


@dataclass(frozen=True)
class FixedMemory:
    """A judgment memory the config fixes: its factor names, categories and actions."""

    factors: tuple[str, ...]
    categories: tuple[str, ...]
    actions: tuple[str, ...]


@dataclass(frozen=True)
class ServerConfig:
    """What the server runs with (see the module); ``ServerConfig()`` is the default.

    ``judgment`` builds each memory; ``target_error``, ``refer_confidence`` and ``refer_margin``
    are the act-or-refer options of the :class:`~gae.Decider` that serves it (``[refer]``), checked
    as the Decider checks them.
    """

    judgment: JudgmentConfig = field(default_factory=JudgmentConfig.recommended)
    target_error: float | None = TARGET_ERROR  # the error allowed among the decisions not referred (None: none)
    refer_confidence: float = MIN_CONFIDENCE  # without a target: refer a decision less confident than this
    refer_margin: float = MIN_MARGIN  # refer when the best two probabilities are closer than this
    text_capacity: int = TEXT_CAPACITY
    recency_hours: float = RECENCY_HOURS  # recall's recency time constant, in hours
    durable_decisions: bool = True
    max_memories: int = 100
    max_factors: int = 256
    max_actions: int = 64  # actions one judgment memory holds
    max_categories: int = MAX_CATEGORIES  # categories one judgment memory grows to
    name_length: int = 200
    text_length: int = 20_000
    memories: tuple[FixedMemory, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.judgment, JudgmentConfig):
            raise TypeError(f"judgment must be a JudgmentConfig, got {type(self.judgment).__name__}")
        for setting in REFER_SETTINGS:
            value = getattr(self, setting)
            if not (setting == "target_error" and value is None):
                _refer_value(setting, setting, value)
        _recency_hours("recency_hours", self.recency_hours)
        for name in ("text_capacity", "max_memories", "max_factors", "max_actions", "max_categories", "name_length",
                     "text_length"):
            check.check_int(name, getattr(self, name), low=1)
        if not isinstance(self.durable_decisions, bool):
            raise TypeError(f"durable_decisions must be True or False, got {self.durable_decisions!r}")

    def fixed(self, factors: tuple[str, ...]) -> FixedMemory | None:
        """The fixed memory of these (sorted) factor names, or None."""
        return next((m for m in self.memories if m.factors == factors), None)

    @classmethod
    def from_toml(cls, path: str | Path) -> ServerConfig:
        """Read ``path``; ValueError naming the file and the key for anything it cannot take."""
        path = Path(path)
        try:
            with path.open("rb") as handle:
                values = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ValueError(f"config {str(path)!r} cannot be read: {error}") from error
        try:
            return cls.from_mapping(values)
        except (ValueError, TypeError) as error:
            raise ValueError(f"config {str(path)!r}: {error}") from error

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerConfig:
        """The config of a parsed TOML file (see the module); ValueError or TypeError naming the key."""
        _known("the config", values, ("judgment", "refer", "text", "ledger", "limits", "memory"))
        tables = {"judgment": dict(_table("judgment", values.get("judgment", {}))),
                  "refer": dict(_table("refer", values.get("refer", {})))}
        for table, keys in tables.items():  # [judgment] takes JudgmentConfig's options and the older refer forms
            spellings = tuple(key for forms in REFER_SETTINGS.values() for where, key in forms if where == table)
            _known(f"[{table}]", keys, (JudgmentConfig.options() if table == "judgment" else ()) + spellings)
        referral: dict[str, Any] = {}
        for setting, forms in REFER_SETTINGS.items():
            given = [(table, key) for table, key in forms if key in tables[table]]
            if len(given) > 1:
                named = [f"[{table}] {key}" for table, key in given]
                raise ValueError(f"{', '.join(named[:-1])} and {named[-1]} are one setting: give it once, as "
                                 f"[{forms[0][0]}] {forms[0][1]}")
            if given:
                table, key = given[0]
                value = tables[table].pop(key)
                # TOML has no null: false turns the calibration off
                referral[setting] = None if setting == "target_error" and value is False else _refer_value(
                    setting, f"{table}.{key}", value)
        options = tables["judgment"]
        judgment = JudgmentConfig.recommended().replace(**options) if options else JudgmentConfig.recommended()
        text = _table("text", values.get("text", {}))
        _known("[text]", text, ("capacity", "recency_hours"))
        ledger = _table("ledger", values.get("ledger", {}))
        _known("[ledger]", ledger, ("durable_decisions",))
        limits = _table("limits", values.get("limits", {}))
        _known("[limits]", limits, ("memories", "factors", "actions", "categories", "name_length", "text_length"))
        durable = ledger.get("durable_decisions", True)
        if not isinstance(durable, bool):
            raise TypeError(f"ledger.durable_decisions must be true or false, got {durable!r}")
        memories = []
        entries = values.get("memory", [])
        if not isinstance(entries, list):
            raise TypeError(f"memory must be an array of tables ([[memory]]), got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            entry = _table(f"memory[{i}]", entry)
            _known(f"[[memory]] {i}", entry, ("factors", "categories", "actions"))
            names = {key: _names(f"memory[{i}].{key}", entry.get(key)) for key in ("factors", "categories", "actions")}
            memories.append(FixedMemory(tuple(sorted(names["factors"])), names["categories"], names["actions"]))
        vocabularies = [m.factors for m in memories]
        if len(set(vocabularies)) != len(vocabularies):
            raise ValueError("two [[memory]] tables name the same factors")
        max_actions = check.check_int("limits.actions", limits.get("actions", 64), low=1)
        max_categories = check.check_int("limits.categories", limits.get("categories", MAX_CATEGORIES), low=1)
        for i, memory in enumerate(memories):
            if len(memory.actions) > max_actions:
                raise ValueError(f"memory[{i}].actions names {len(memory.actions)} actions, more than [limits] "
                                 f"actions ({max_actions})")
            if len(memory.categories) > max_categories:
                raise ValueError(f"memory[{i}].categories names {len(memory.categories)} categories, more than "
                                 f"[limits] categories ({max_categories})")
        return cls(judgment=judgment, **referral,
                   text_capacity=check.check_int("text.capacity", text.get("capacity", TEXT_CAPACITY), low=1),
                   recency_hours=_recency_hours("text.recency_hours", text.get("recency_hours", RECENCY_HOURS)),
                   durable_decisions=durable, memories=tuple(memories),
                   max_memories=check.check_int("limits.memories", limits.get("memories", 100), low=1),
                   max_factors=check.check_int("limits.factors", limits.get("factors", 256), low=1),
                   max_actions=max_actions, max_categories=max_categories,
                   name_length=check.check_int("limits.name_length", limits.get("name_length", 200), low=1),
                   text_length=check.check_int("limits.text_length", limits.get("text_length", 20_000), low=1))


def _refer_value(setting: str, name: str, value: Any) -> float:
    """``value`` of act-or-refer ``setting`` as the Decider takes it; refused naming ``name``."""
    if setting == "target_error":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number in (0, 1), or false for none, got {value!r}")
        return check.check_real(name, value, low=0.0, high=1.0, low_open=True, high_open=True)
    return check.check_real(name, value, low=0.0, high=1.0)


def _recency_hours(name: str, value: Any) -> float:
    hours = check.check_real(name, value, low=-float("inf"))  # a real number (bools and strings refused), not nan
    low, high = RECENCY_HOURS_RANGE
    if not low <= hours <= high:
        raise ValueError(f"{name} must be in [1/3600, {high:g}] hours (one second to a million hours), got {value!r}")
    return hours


def _table(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a table, got {type(value).__name__}")
    return value


def _known(where: str, values: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; known: {sorted(known)}")


def _names(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name} must be a non-empty list of non-empty names, got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} must not repeat a name, got {value!r}")
    return tuple(value)
