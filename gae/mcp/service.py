"""What gae-mcp's tools do, without the protocol: decisions on durable judgment memories, text
memories on one episodic memory, every argument checked before anything changes.

Judgment memories: one per vocabulary (the sorted names of a decision's factors), each on its
own ledger in the store (``mcp:["amount", "risk"]``), so every decide and verify is committed
before it answers and a restarted server (or a second one on the same store) has every
decision, pending or learned. A vocabulary the config does not fix grows its categories and
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

from gae.episodic.columns import MEMORY_TYPES
from gae.episodic.embedders import Embedder
from gae.episodic.memory import EpisodicMemory
from gae.judgment.memory import JudgmentMemory
from gae.ledger import Ledger, ledgers
from gae.mcp.config import ServerConfig
from gae.mcp.explained import explanation_json

LEDGER_PREFIX = "mcp:"  # + the vocabulary as a JSON list
MAX_K = 100  # recall's largest k
MAX_OWNERS = 1_000_000  # pending decision ids the service maps to their memory (the oldest forgotten first)
REASONS = ("unseen_category", "low_confidence", "small_margin")  # what decide says today (docs/mcp.md)


class ToolInputError(ValueError):
    """A tool's argument is refused: ``field`` names it (``factors.amount``, ``scopes[1]``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class MemoryService:
    """The six tools over one store (see the module).

    Args:
        open_store: makes a new connection to the store (each memory holds its own).
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
        self._memories: dict[tuple[str, ...], JudgmentMemory] = {}
        # pending decision id -> (its vocabulary, the action recommended when it was decided)
        self._owners: OrderedDict[str, tuple[tuple[str, ...], str | None]] = OrderedDict()
        self._text: EpisodicMemory | None = None
        self._refresh()

    # -- judgment ---------------------------------------------------------------------------
    def decide(self, category: Any, factors: Any, actions: Any = None) -> dict[str, Any]:
        """Score one decision and keep it pending: ``id``, ``action`` (None: no opinion yet),
        ``confidence``, ``probs``, ``refer`` and its ``reasons``."""
        category = _name("category", category)
        vocabulary, row = _factors(factors)
        actions = None if actions is None else _names("actions", actions)
        with self._lock:
            memory = self._memories.get(vocabulary) or self._open(vocabulary, category, actions)
            fixed = self.config.fixed(vocabulary) is not None
            unknown = [a for a in actions or () if a not in memory.action_names]
            if fixed and unknown:
                raise ToolInputError("actions", f"{unknown} are not this memory's actions {list(memory.action_names)}")
            if fixed and category not in (memory.category_names or ()):
                raise ToolInputError("category", f"{category!r} is not one of {list(memory.category_names or ())}")
            if unknown:
                memory.add_actions_(unknown)
            seen = category in (memory.category_names or ())
            decision = memory.decide(row, category)
            self._own(decision.id, vocabulary, decision.action)
        probs = sorted(decision.probs.values(), reverse=True) + [0.0, 0.0]
        reasons = [code for code, applies in (
            ("unseen_category", not seen or decision.action is None),
            ("low_confidence", decision.confidence < self.config.min_confidence),
            ("small_margin", decision.action is not None and probs[0] - probs[1] < self.config.min_margin)) if applies]
        return {"id": decision.id, "action": decision.action, "confidence": float(decision.confidence),
                "probs": {name: float(p) for name, p in decision.probs.items()}, "refer": bool(reasons),
                "reasons": reasons, "category": category, "factors": list(vocabulary)}

    def verify(self, decision_id: Any, action: Any) -> dict[str, Any]:
        """Learn pending decision ``decision_id`` as ``action``: ``learned``, and ``confirmed``
        (whether it is the action recommended when it was decided)."""
        decision_id, action = _name("decision_id", decision_id), _name("action", action)
        with self._lock:
            memory, recommended = self._owner(decision_id)
            if self.config.fixed(tuple(memory.factor_names)) is not None and action not in memory.action_names:
                raise ToolInputError("action", f"{action!r} is not one of {list(memory.action_names)}")
            try:
                result = memory.verify(decision_id, action)
            except KeyError as error:  # expired since, or verified by another server on the store
                self._owners.pop(decision_id, None)
                raise ToolInputError("decision_id", f"{decision_id!r} is not pending: verified already or "
                                     "expired") from error
            self._owners.pop(decision_id, None)
        return {"id": decision_id, "action": action, "learned": not result.get("skipped", False),
                "confirmed": recommended == action}

    def explain(self, decision_id: Any) -> dict[str, Any]:
        """Why decision ``decision_id`` was decided as it was, by the state it was decided with."""
        decision_id = _name("decision_id", decision_id)
        with self._lock:
            for memory in self._search_order(decision_id):
                try:
                    explanation = memory.explain_decision(decision_id)
                except KeyError:
                    continue
                return {"id": decision_id, **explanation_json(explanation)}
        raise ToolInputError("decision_id", f"no decision {decision_id!r} in the store")

    # -- text -------------------------------------------------------------------------------
    def remember(self, text: Any, scope: Any, importance: Any = 0.5, memory_type: Any = "episode") -> int:
        """Embed and store ``text`` in ``scope``; its id."""
        if not isinstance(text, str) or not text.strip():
            raise ToolInputError("text", f"must be a non-empty string, got {text!r}")
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
        if isinstance(scopes, str) or not isinstance(scopes, Sequence) or not scopes:
            raise ToolInputError("scopes", f"must be a non-empty list of scope names, got {scopes!r}")
        scopes = [self._scope(f"scopes[{i}]", s) for i, s in enumerate(scopes)]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ToolInputError("k", f"must be an int in [1, {MAX_K}], got {k!r}")
        memory = self.text
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
            scope_of = self._scopes_of(list(ids))
            for i, value in enumerate(ids):
                if value not in scope_of:
                    raise ToolInputError(f"ids[{i}]", f"no memory {value} (unknown or forgotten)")
                if self.scopes is not None and scope_of[value] not in self.scopes:
                    raise ToolInputError(f"ids[{i}]", f"memory {value} is outside the scopes this server serves")
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
                self._text = EpisodicMemory(embedder.dim, capacity=self.config.text_capacity, eviction="fifo",
                                            store=self.open_store(), embedder=embedder)
            return self._text

    # -- helpers ----------------------------------------------------------------------------
    def _open(self, vocabulary: tuple[str, ...], category: str, actions: tuple[str, ...] | None) -> JudgmentMemory:
        """A new judgment memory for ``vocabulary``, named by the config or by this first call."""
        fixed = self.config.fixed(vocabulary)
        if fixed is not None:
            categories, names = fixed.categories, fixed.actions
        elif actions is None:
            raise ToolInputError("actions", f"no memory decides on factors {list(vocabulary)} yet: name the actions "
                                 "it may recommend (actions=[...]) or fix them in the config ([[memory]])")
        else:
            categories, names = (category,), actions
        memory = JudgmentMemory(list(categories), list(names), list(vocabulary), config=self.config.judgment,
                                store=self.open_store(), ledger=LEDGER_PREFIX + json.dumps(list(vocabulary)),
                                grow=fixed is None, durable_decisions=self.config.durable_decisions)
        self._memories[vocabulary] = memory
        return memory

    def _refresh(self) -> None:
        """Open every memory the store holds that this service has not opened (another server's
        too), and map its pending decisions."""
        store = self.open_store()
        try:
            names = [name for name in ledgers(store) if name.startswith(LEDGER_PREFIX)]
        finally:
            store.close()
        for name in names:
            vocabulary = tuple(json.loads(name[len(LEDGER_PREFIX):]))
            if vocabulary in self._memories:
                continue
            store = self.open_store()
            ledger = Ledger(store, name)
            with ledger.reading():
                meta = ledger.meta()  # the names as they are now: the memory opens with these, adding none
            fixed = self.config.fixed(vocabulary)
            categories = fixed.categories if fixed else meta.get("grown_categories", meta["categories"])
            actions = fixed.actions if fixed else meta.get("grown_actions", meta["actions"])
            self._memories[vocabulary] = JudgmentMemory(list(categories), list(actions), list(vocabulary),
                                                        config=self.config.judgment, store=store, ledger=name,
                                                        grow=fixed is None,
                                                        durable_decisions=self.config.durable_decisions)
        for vocabulary, memory in self._memories.items():
            for decision in memory.pending():
                self._own(decision.id, vocabulary, decision.action)

    def _own(self, decision_id: str, vocabulary: tuple[str, ...], action: str | None) -> None:
        self._owners[decision_id] = (vocabulary, action)
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)

    def _owner(self, decision_id: str) -> tuple[JudgmentMemory, str | None]:
        """The memory holding pending decision ``decision_id`` and what it recommended."""
        owner = self._owners.get(decision_id)
        if owner is None:  # decided by another server on this store, or mapped out: look again
            self._refresh()
            owner = self._owners.get(decision_id)
        if owner is None:
            raise ToolInputError("decision_id", f"{decision_id!r} is not pending: unknown, verified already or "
                                 "expired")
        return self._memories[owner[0]], owner[1]

    def _search_order(self, decision_id: str) -> list[JudgmentMemory]:
        """The memories to look for a decision in: its owner first when it is pending."""
        owner = self._owners.get(decision_id)
        memories = list(self._memories.values())
        if owner is not None:
            memories.sort(key=lambda m: self._memories[owner[0]] is not m)
        return memories

    def _scope(self, field: str, scope: Any) -> str:
        if not isinstance(scope, str) or not scope:
            raise ToolInputError(field, f"must be a non-empty scope name, got {scope!r}")
        if self.scopes is not None and scope not in self.scopes:
            raise ToolInputError(field, f"{scope!r} is outside the scopes this server serves {list(self.scopes)}")
        return scope

    def _scopes_of(self, ids: list[int]) -> dict[int, str]:
        """The scope name of each live text memory among ``ids``."""
        memory = self.text
        with memory._lock:
            live = dict(zip(memory.column("ids").tolist(), memory.column("scope").tolist(), strict=True))
            names = list(memory.scope_names)
        return {i: (names[-1 - live[i]] if live[i] < 0 else f"#{live[i]}") for i in ids if i in live}


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ToolInputError(field, f"must be a non-empty string, got {value!r}")
    return value


def _names(field: str, values: Any) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ToolInputError(field, f"must be a non-empty list of names, got {values!r}")
    names = tuple(_name(f"{field}[{i}]", v) for i, v in enumerate(values))
    if len(set(names)) != len(names):
        raise ToolInputError(field, f"names an item twice: {list(names)}")
    return names


def _factors(factors: Any) -> tuple[tuple[str, ...], list[float]]:
    """The vocabulary (sorted names) and the row in its order; every value a finite number."""
    if not isinstance(factors, Mapping) or not factors:
        raise ToolInputError("factors", f"must be a non-empty object of name: number, got {factors!r}")
    for name, value in factors.items():
        if not isinstance(name, str) or not name:
            raise ToolInputError("factors", f"names must be non-empty strings, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolInputError(f"factors.{name}", f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ToolInputError(f"factors.{name}", f"must be finite, got {value!r}")
    vocabulary = tuple(sorted(factors))
    return vocabulary, [float(factors[name]) for name in vocabulary]


def _unit(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= 1:
        raise ToolInputError(field, f"must be a number in [0, 1], got {value!r}")
    return float(value)
