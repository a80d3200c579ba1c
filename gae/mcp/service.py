"""What gae-mcp's tools do, without the protocol: decisions on durable judgment memories, text
memories on one episodic memory, every argument checked before anything changes.

Judgment memories: one per vocabulary (the sorted names of a decision's factors), each served
by its own :class:`~gae.Decider` on its own ledger in the store (``mcp:["amount", "risk"]``), so
every decide and verify is committed before it answers and a restarted server (or a second one
on the same store) has every decision, pending or learned. The Decider acts or refers by the
config's ``[refer]`` options. A vocabulary the config does not fix grows its categories and
actions as calls name them; one it fixes (``[[memory]]``) refuses other names.

Text memories: one :class:`~gae.EpisodicMemory` on the same store (FIFO past its capacity),
scoped: with ``scopes`` given, a call may name only those scopes, and ``forget`` only erases
memories of those scopes.

Every method raises :class:`ToolInputError` (a ValueError) naming the argument at fault, and
then has changed nothing.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gae import validation as check
from gae.decider import Decider
from gae.episodic.columns import MEMORY_TYPES
from gae.episodic.embedders import Embedder
from gae.episodic.memory import EpisodicMemory
from gae.judgment.config import JudgmentConfig
from gae.judgment.memory import JudgmentMemory
from gae.ledger import Ledger, ledgers
from gae.mcp.config import ServerConfig
from gae.mcp.explained import explanation_json

LEDGER_PREFIX = "mcp:"  # + the vocabulary as a JSON list
TEXT_LEDGER = "mcp-text"  # its meta says which embedder the text memories were embedded by
MAX_K = 100  # recall's largest k
MAX_OWNERS = 1_000_000  # pending decision ids the service maps to their memory (the oldest forgotten first)


class ToolInputError(ValueError):
    """A tool's argument is refused: ``field`` names it (``factors.amount``, ``scopes[1]``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class MemoryService:
    """The six tools over one store (see the module).

    Args:
        open_store: makes a new connection to the store (one for the judgment memories, one for the texts).
        scopes: the scopes text calls may name, or None for any.
        config: the :class:`~gae.mcp.config.ServerConfig`.
        embedder: the text memories' embedder; default: all-MiniLM-L6-v2 (the text extra).
    """

    def __init__(self, open_store: Callable[[], Any], *, scopes: Sequence[str] | None = None,
                 config: ServerConfig | None = None, embedder: Embedder | None = None) -> None:
        self.open_store = open_store
        self.scopes = None if scopes is None else tuple(scopes)
        self.config = config if config is not None else ServerConfig()
        self._embedder = embedder
        self._lock = threading.RLock()  # the registry of judgment memories, and their calls
        self._text_lock = threading.Lock()  # building the text memory
        self._deciders: dict[tuple[str, ...], Decider] = {}  # vocabulary -> the Decider serving its memory
        # pending decision id -> (its vocabulary, the action recommended when it was decided)
        self._owners: OrderedDict[str, tuple[tuple[str, ...], str | None]] = OrderedDict()
        self._text: EpisodicMemory | None = None
        self._store: Any = None  # one connection for every judgment memory (their ledgers take turns on it)
        self._refresh()

    # -- judgment ---------------------------------------------------------------------------
    def decide(self, category: Any, factors: Any, actions: Any = None) -> dict[str, Any]:
        """Score one decision and keep it pending: ``id``, ``action`` (None: no opinion yet),
        ``confidence``, ``probs``, ``refer`` and its ``reasons``."""
        limits = self.config
        category = _name("category", category, limits.name_length)
        vocabulary, row = _factors(factors, limits.max_factors, limits.name_length)
        actions = None if actions is None else _names("actions", actions, limits.name_length)
        with self._lock:
            fixed = self.config.fixed(vocabulary)
            if fixed is not None:  # checked against the config first: a refused call creates no ledger
                unknown = [a for a in actions or () if a not in fixed.actions]
                if unknown:
                    raise ToolInputError("actions", f"{unknown} are not this memory's actions {list(fixed.actions)}")
                if category not in fixed.categories:
                    raise ToolInputError("category", f"{category!r} is not one of {list(fixed.categories)}")
            decider = self._deciders.get(vocabulary)
            if decider is None:
                self._refresh()  # another server on the store may have opened it
                decider = self._deciders.get(vocabulary) or self._open(vocabulary, category, actions)
            unknown = [a for a in actions or () if a not in decider.memory.action_names]
            if unknown:
                decider.sync()  # another server may have added them meanwhile
                unknown = [a for a in unknown if a not in decider.memory.action_names]
            if unknown:
                decider.add_actions_(unknown)
            decision = decider.decide(row, category)
            self._own(decision.id, vocabulary, decision.action)
        return {"id": decision.id, "action": decision.action, "confidence": float(decision.confidence),
                "probs": {name: float(p) for name, p in decision.probs.items()}, "refer": decision.refer,
                "reasons": list(decision.reasons), "category": category, "factors": list(vocabulary)}

    def verify(self, decision_id: Any, action: Any) -> dict[str, Any]:
        """Learn pending decision ``decision_id`` as ``action``: ``learned``, and ``confirmed``
        (whether it is the action recommended when it was decided)."""
        decision_id = _name("decision_id", decision_id, 200)
        action = _name("action", action, self.config.name_length)
        with self._lock:
            decider, recommended = self._owner(decision_id)
            memory = decider.memory
            if self.config.fixed(tuple(memory.factor_names)) is not None and action not in memory.action_names:
                raise ToolInputError("action", f"{action!r} is not one of {list(memory.action_names)}")
            try:
                result = decider.verify(decision_id, action)
            except KeyError as error:  # expired since, or verified by another server on the store
                self._owners.pop(decision_id, None)
                raise ToolInputError("decision_id", f"{decision_id!r} is not pending: verified already or "
                                     "expired") from error
            self._owners.pop(decision_id, None)
        return {"id": decision_id, "action": action, "learned": not result.get("skipped", False),
                "confirmed": recommended == action}

    def explain(self, decision_id: Any) -> dict[str, Any]:
        """Why decision ``decision_id`` was decided as it was, by the state it was decided with."""
        decision_id = _name("decision_id", decision_id, 200)
        with self._lock:
            for attempt in range(2):
                if attempt:
                    self._refresh()  # decided on a vocabulary another server opened
                for decider in self._search_order(decision_id):
                    try:
                        explanation = decider.explain_decision(decision_id)
                    except KeyError:
                        continue
                    return {"id": decision_id, **explanation_json(explanation)}
        raise ToolInputError("decision_id", f"no decision {decision_id!r} in the store")

    # -- text -------------------------------------------------------------------------------
    def remember(self, text: Any, scope: Any, importance: Any = 0.5, memory_type: Any = "episode") -> int:
        """Embed and store ``text`` in ``scope``; its id."""
        if not isinstance(text, str) or not text.strip():
            raise ToolInputError("text", f"must be a non-empty string, got {text!r}")
        if len(text) > self.config.text_length:
            raise ToolInputError("text", f"holds {len(text):,} characters, more than the {self.config.text_length:,} "
                                 "this server takes ([limits] text_length)")
        _utf8("text", text)
        scope = self._scope("scope", scope)
        importance = _unit("importance", importance)
        if memory_type not in MEMORY_TYPES:
            raise ToolInputError("memory_type", f"must be one of {list(MEMORY_TYPES)}, got {memory_type!r}")
        ids = self.text.remember([text], scope=scope, importance=importance, memory_type=memory_type)
        return int(ids[0])

    def recall(self, query: Any, scopes: Any, k: Any = 5) -> list[dict[str, Any]]:
        """The ``k`` text memories of ``scopes`` that best answer ``query``, best first."""
        if not isinstance(query, str) or not query.strip():
            raise ToolInputError("query", f"must be a non-empty string, got {query!r}")
        if len(query) > self.config.text_length:
            raise ToolInputError("query", f"holds {len(query):,} characters, more than the "
                                 f"{self.config.text_length:,} this server takes ([limits] text_length)")
        _utf8("query", query)
        if isinstance(scopes, str) or not isinstance(scopes, Sequence) or not scopes:
            raise ToolInputError("scopes", f"must be a non-empty list of scope names, got {scopes!r}")
        scopes = [self._scope(f"scopes[{i}]", s) for i, s in enumerate(scopes)]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ToolInputError("k", f"must be an int in [1, {MAX_K}], got {k!r}")
        memory = self.text
        with memory._lock:  # the recall and the scopes of its answer see one state (a forget waits)
            memory._fresh()  # what other servers on the store wrote: their scopes too
            known = [s for s in scopes if s in memory.scope_names]  # a scope never written holds nothing
            if not known:
                return []
            found = memory.recall(query, k=k, scopes=known)
            scope_of = self._scopes_of(found.ids)
        return [{"id": i, "text": t, "scope": scope_of[i], "score": s, "similarity": sim, "recency": rec,
                 "importance": imp} for i, t, s, sim, rec, imp in
                zip(found.ids, found.texts, found.scores, found.similarity, found.recency, found.importance,
                    strict=True)]

    def forget(self, ids: Any) -> list[int]:
        """Erase text memories ``ids`` (gone from the store's files); the ids erased."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids:
            raise ToolInputError("ids", f"must be a non-empty list of memory ids, got {ids!r}")
        for i, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ToolInputError(f"ids[{i}]", f"must be an int memory id, got {value!r}")
        if len(set(ids)) != len(ids):
            raise ToolInputError("ids", f"names a memory twice: {list(ids)}")
        memory = self.text
        with memory._lock:  # the check and the delete see one state
            memory._fresh()
            scope_of = self._scopes_of(list(ids))
            for i, value in enumerate(ids):
                # a memory of a scope this server does not serve reads as absent: its existence is not told
                if value not in scope_of or (self.scopes is not None and scope_of[value] not in self.scopes):
                    raise ToolInputError(f"ids[{i}]", f"no memory {value} in the scopes this server serves "
                                         "(unknown, forgotten, or another scope's)")
            memory.delete(list(ids), now=time.time(), reason="forget (gae-mcp)", erase=True)
        return list(ids)

    @property
    def text(self) -> EpisodicMemory:
        """The text memories (built, and the embedder loaded, on first use)."""
        with self._text_lock:
            if self._text is None:
                embedder = self._embedder
                if embedder is None:
                    from gae.episodic.embedders import default_embedder

                    embedder = default_embedder()
                store = self.open_store()
                _check_embedder(store, embedder)
                try:
                    self._text = EpisodicMemory(embedder.dim, capacity=self.config.text_capacity, eviction="fifo",
                                                store=store, embedder=embedder)
                except ValueError as error:
                    raise ValueError(f"the text memories cannot be opened with this config ([text] capacity = "
                                     f"{self.config.text_capacity:,}): {error}") from error
            return self._text

    # -- helpers ----------------------------------------------------------------------------
    def _open(self, vocabulary: tuple[str, ...], category: str, actions: tuple[str, ...] | None) -> Decider:
        """A new judgment memory for ``vocabulary``, named by the config or by this first call."""
        fixed = self.config.fixed(vocabulary)
        if len(self._deciders) >= self.config.max_memories:
            raise ToolInputError("factors", f"factors {list(vocabulary)[:8]} would open a new judgment memory, but "
                                 f"this server holds {len(self._deciders)}, its limit ([limits] memories)")
        if fixed is not None:
            categories, names = fixed.categories, fixed.actions
        elif actions is None:
            raise ToolInputError("actions", f"no memory decides on factors {list(vocabulary)} yet: name the actions "
                                 "it may recommend (actions=[...]) or fix them in the config ([[memory]])")
        else:
            categories, names = (category,), actions
        decider = self._decider(vocabulary, categories, names, LEDGER_PREFIX + json.dumps(list(vocabulary)))
        self._deciders[vocabulary] = decider
        return decider

    def _decider(self, vocabulary: tuple[str, ...], categories: Sequence[str], actions: Sequence[str],
                 ledger: str, judgment: JudgmentConfig | None = None) -> Decider:
        """The Decider of ``vocabulary``'s memory on its ledger (on a ledger that exists, ``categories``
        and ``actions`` are its names, and ``judgment`` the config it was created with): growing unless
        the config fixes the vocabulary. A new memory takes the server's ``[judgment]``."""
        config = self.config
        memory = JudgmentMemory(list(categories), list(actions), list(vocabulary),
                                config=config.judgment if judgment is None else judgment,
                                grow=config.fixed(vocabulary) is None)
        return Decider(memory, store=self._judgment_store(), ledger=ledger,
                       durable_decisions=config.durable_decisions, target_error=config.target_error,
                       refer_confidence=config.refer_confidence, refer_margin=config.refer_margin)

    def _refresh(self, every_pending: bool = False) -> None:
        """Open every memory the store holds that this service has not opened (another server's
        too), and map its pending decisions; with ``every_pending``, those of every memory (a
        decision another server made on a memory this one holds)."""
        store = self._judgment_store()
        names = [name for name in ledgers(store) if name.startswith(LEDGER_PREFIX)]
        opened: list[tuple[str, ...]] = []
        for name in names:
            vocabulary = tuple(json.loads(name[len(LEDGER_PREFIX):]))
            if vocabulary in self._deciders:
                continue
            ledger = Ledger(store, name)
            with ledger.reading():
                meta = ledger.meta()  # the names as they are now: the memory opens with these, adding none
            fixed = self.config.fixed(vocabulary)
            categories = fixed.categories if fixed else meta.get("grown_categories") or meta["categories"]
            actions = fixed.actions if fixed else meta.get("grown_actions") or meta["actions"]
            self._deciders[vocabulary] = self._decider(vocabulary, categories, actions, name, _recorded(meta))
            opened.append(vocabulary)
        for vocabulary in (list(self._deciders) if every_pending else opened):
            for decision in self._deciders[vocabulary].pending():
                self._own(decision.id, vocabulary, decision.action)

    def _judgment_store(self) -> Any:
        if self._store is None:
            self._store = self.open_store()
        return self._store

    def _own(self, decision_id: str, vocabulary: tuple[str, ...], action: str | None) -> None:
        self._owners[decision_id] = (vocabulary, action)
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)

    def _owner(self, decision_id: str) -> tuple[Decider, str | None]:
        """The Decider holding pending decision ``decision_id`` and what it recommended."""
        owner = self._owners.get(decision_id)
        if owner is None:  # decided by another server on this store, or mapped out: look again
            self._refresh(every_pending=True)
            owner = self._owners.get(decision_id)
        if owner is None:
            raise ToolInputError("decision_id", f"{decision_id!r} is not pending: unknown, verified already or "
                                 "expired")
        return self._deciders[owner[0]], owner[1]

    def _search_order(self, decision_id: str) -> list[Decider]:
        """The Deciders to look for a decision in: its owner first when it is pending."""
        owner = self._owners.get(decision_id)
        deciders = list(self._deciders.values())
        if owner is not None:
            deciders.sort(key=lambda d: self._deciders[owner[0]] is not d)
        return deciders

    def _scope(self, field: str, scope: Any) -> str:
        if not isinstance(scope, str) or not scope or len(scope) > self.config.name_length:
            raise ToolInputError(field, f"must be a scope name of 1 to {self.config.name_length} characters, got "
                                 f"{scope!r}")
        _utf8(field, scope)
        if self.scopes is not None and scope not in self.scopes:
            raise ToolInputError(field, f"{scope!r} is outside the scopes this server serves {list(self.scopes)}")
        return scope

    def _scopes_of(self, ids: list[int]) -> dict[int, str]:
        """The scope name of each live text memory among ``ids``."""
        memory = self.text
        with memory._lock:
            rows = memory.rows_of(ids)
            codes = memory._column("scope")
            scope = {i: int(codes[row]) for i, row in zip(ids, rows, strict=True) if row is not None}
            names = list(memory.scope_names)
        return {i: (names[-1 - code] if code < 0 else f"#{code}") for i, code in scope.items()}


def _utf8(field: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate: no store can hold it
        raise ToolInputError(field, f"is not valid Unicode text ({error.reason} at {error.start})") from error


def _name(field: str, value: Any, longest: int) -> str:
    if not isinstance(value, str) or not value:
        raise ToolInputError(field, f"must be a non-empty string, got {value!r}")
    if len(value) > longest:
        raise ToolInputError(field, f"holds {len(value)} characters, more than the {longest} a name may ([limits] "
                             "name_length)")
    _utf8(field, value)
    return value


def _names(field: str, values: Any, longest: int) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ToolInputError(field, f"must be a non-empty list of names, got {values!r}")
    names = tuple(_name(f"{field}[{i}]", v, longest) for i, v in enumerate(values))
    if len(set(names)) != len(names):
        raise ToolInputError(field, f"names an item twice: {list(names)}")
    return names


def _recorded(meta: dict[str, Any]) -> JudgmentConfig | None:
    """The judgment a stored memory was created with (its ledger's settings), which it keeps: a server
    whose ``[judgment]``, or whose gae's recommended configuration, changed since still opens the memories
    it holds. None where the ledger is not a judgment memory's or its settings are not a config this gae
    reads (another gae's): the server's own config then, and the ledger's check names what differs."""
    if meta.get("kind") != JudgmentMemory.__name__ or not isinstance(meta.get("settings"), dict):
        return None
    try:
        return JudgmentConfig.from_dict(meta["settings"])
    except (TypeError, ValueError):
        return None


def _factors(factors: Any, most: int, longest: int) -> tuple[tuple[str, ...], list[float]]:
    """The vocabulary (sorted names) and the row in its order; every value a finite number a
    memory can learn (within ``LEARN_LIMIT``)."""
    if not isinstance(factors, Mapping) or not factors:
        raise ToolInputError("factors", f"must be a non-empty object of name: number, got {factors!r}")
    if len(factors) > most:
        raise ToolInputError("factors", f"names {len(factors)} factors, more than the {most} a decision may "
                             "([limits] factors)")
    values = {}
    for name, value in factors.items():
        if not isinstance(name, str) or not name:
            raise ToolInputError("factors", f"names must be non-empty strings, got {name!r}")
        _name(f"factors.{name[:40]}", name, longest)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolInputError(f"factors.{name}", f"must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ToolInputError(f"factors.{name}", f"must be finite, got {value!r}"[:200])
        if abs(number) > check.LEARN_LIMIT:
            raise ToolInputError(f"factors.{name}", f"must lie in [-{check.LEARN_LIMIT:g}, {check.LEARN_LIMIT:g}], "
                                 f"got {number!r}")
        values[name] = number
    vocabulary = tuple(sorted(values))
    return vocabulary, [values[name] for name in vocabulary]


def _check_embedder(store: Any, embedder: Embedder) -> None:
    """Record which embedder the store's text memories are embedded by (its first use), and refuse
    another: two embedders' vectors are not comparable."""
    name = getattr(embedder, "name", type(embedder).__name__)
    wanted = {"embedder": name, "dim": int(embedder.dim)}
    ledger = Ledger(store, TEXT_LEDGER)
    with ledger.writing():
        meta = ledger.meta()
        if not meta:
            ledger.set_meta(wanted)
            return
    if {key: meta.get(key) for key in wanted} != wanted:
        raise ValueError(f"the store's text memories were embedded by {meta.get('embedder')} ({meta.get('dim')} "
                         f"dimensions), not {name} ({embedder.dim}): start the server with that embedder")


def _unit(field: str, value: Any) -> float:
    """``value`` as :func:`gae.validation.check_real` takes a number in [0, 1], refused by ``field``."""
    try:
        return check.check_real(field, value, low=0.0, high=1.0)
    except (TypeError, ValueError) as error:
        raise ToolInputError(field, str(error).removeprefix(f"{field} ")) from error
