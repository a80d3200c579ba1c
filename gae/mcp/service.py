"""What gae-mcp's tools do, without the protocol: decisions on durable judgment memories, text
memories on one episodic memory, every argument checked before anything changes.

Judgment memories: one per vocabulary (the sorted names of a decision's factors), each served
by its own :class:`~gae.Decider` on its own ledger in the store (``mcp:["amount", "risk"]``), so
every decide and verify is committed before it answers and a restarted server (or a second one
on the same store) has every decision, pending or learned. The Decider acts or refers by the
config's ``[refer]`` options. A vocabulary the config does not fix grows its categories and
actions as calls name them (up to ``[limits] categories`` and ``[limits] actions``); one it fixes
(``[[memory]]``) refuses other names. A vocabulary that nearly is one the server has (:func:`near_miss`: a name left out
or added, or names spelled a little differently) is refused as a likely slip, naming the memory
it resembles, unless the call says it opens a new memory (``new_memory=True``).

Text memories: one :class:`~gae.EpisodicMemory` on the same store (FIFO past its capacity,
recency fading over ``[text] recency_hours``), scoped: with ``scopes`` given, a call may name
only those scopes, and ``forget`` only erases memories of those scopes. A text remembered again
in a scope that holds it already is not stored twice: ``remember`` answers the id it has.

Every method raises :class:`ToolInputError` (a ValueError) naming the argument at fault, and
then has changed nothing.
"""

from __future__ import annotations

import difflib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gae import validation as check
from gae.decider import Decider
from gae.episodic.columns import MEMORY_TYPES, scope_index
from gae.episodic.embedders import Embedder
from gae.episodic.memory import EpisodicMemory
from gae.episodic.scorer import SECONDS_PER_HOUR, RetrievalScorer
from gae.judgment.config import JudgmentConfig
from gae.judgment.memory import JudgmentMemory
from gae.ledger import Ledger, ledgers
from gae.mcp.config import ServerConfig
from gae.mcp.explained import explanation_json

LEDGER_PREFIX = "mcp:"  # + the vocabulary as a JSON list
TEXT_LEDGER = "mcp-text"  # its meta says which embedder the text memories were embedded by
MAX_K = 100  # recall's largest k
MAX_ID = 2**63 - 1  # a text memory's id is a signed 64-bit int, >= 0
CLOSE_SPELLING = 0.8  # two factor names this alike (difflib's ratio) read as one name misspelt
SHOWN = 8  # names a refusal lists of a longer list
LONGEST_MESSAGE = 1000  # characters of a refusal
MAX_ID_LENGTH = 200  # characters of a decision id (decide answers 32)
ID_BOUND = "a decision id may (decide answers the ids)"
MAX_OWNERS = 1_000_000  # pending decision ids the service maps to their memory (the oldest forgotten first)


class ToolInputError(ValueError):
    """A tool's argument is refused: ``field`` names it (``factors.amount``, ``scopes[1]``). The
    message is one line, cut at :data:`LONGEST_MESSAGE` characters (a value a client sent may be
    as long as it likes: a 400-digit int)."""

    def __init__(self, field: str, message: str) -> None:
        text = f"{field}: {message}"
        if len(text) > LONGEST_MESSAGE:
            text = text[:LONGEST_MESSAGE - 1] + "…"
        super().__init__(text)
        self.field = field


class MemoryService:
    """The seven tools over one store (see the module).

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
        # pending decision id -> (its vocabulary, the action recommended when it was decided, its category)
        self._owners: OrderedDict[str, tuple[tuple[str, ...], str | None, str]] = OrderedDict()
        self._text: EpisodicMemory | None = None
        self._store: Any = None  # one connection for every judgment memory (their ledgers take turns on it)
        self._refresh()

    # -- judgment ---------------------------------------------------------------------------
    def decide(self, category: Any, factors: Any, actions: Any = None, new_memory: Any = False) -> dict[str, Any]:
        """Score one decision and keep it pending: ``id``, ``action`` (None: no opinion yet),
        ``confidence``, ``probs``, ``refer``, its ``reasons`` and ``verifications_needed`` (the
        verified decisions act or refer still needs before it takes one alone).

        ``new_memory=True`` opens a memory for these factor names even when they nearly are those
        of a memory the server has (without it, such a call is refused naming that memory)."""
        limits = self.config
        category = _name("category", category, limits.name_length)
        vocabulary, row = _factors(factors, limits.max_factors, limits.name_length)
        if actions is not None and not isinstance(actions, str) and isinstance(actions, Sequence) \
                and len(actions) > limits.max_actions:
            raise ToolInputError("actions", f"names {len(actions):,} actions, more than the {limits.max_actions} a "
                                 "memory may hold ([limits] actions)")
        actions = None if actions is None else _names("actions", actions, limits.name_length)
        if not isinstance(new_memory, bool):
            raise ToolInputError("new_memory", f"must be true or false, got {new_memory!r}")
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
                decider = self._deciders.get(vocabulary) or self._open(vocabulary, category, actions, new_memory)
            if fixed is None:  # refused here, not at its verify: a decision that could never be learned
                self._check_category(decider, category, "category")
            unknown = [a for a in actions or () if a not in decider.memory.action_names]
            if unknown:
                decider.sync()  # another server may have added them meanwhile
                unknown = [a for a in unknown if a not in decider.memory.action_names]
            if unknown:
                held = decider.memory.action_names
                if len(held) + len(unknown) > limits.max_actions:
                    raise ToolInputError("actions", f"would add {_shown(unknown)} to the {len(held)} actions of the "
                                         f"memory of factors {_shown(vocabulary)}, more than the "
                                         f"{limits.max_actions} a memory may hold ([limits] actions)")
                decider.add_actions_(unknown)
            decision = decider.decide(row, category)
            self._own(decision.id, vocabulary, decision.action, category)
        return {"id": decision.id, "action": decision.action, "confidence": float(decision.confidence),
                "probs": {name: float(p) for name, p in decision.probs.items()}, "refer": decision.refer,
                "reasons": list(decision.reasons),
                # (a Decider without the attribute predates calibration's count: nothing is owed)
                "verifications_needed": decision.verifications_needed,
                "category": category, "factors": list(vocabulary)}

    def verify(self, decision_id: Any, action: Any) -> dict[str, Any]:
        """Learn pending decision ``decision_id`` as ``action``: ``learned``, and ``confirmed``
        (whether it is the action recommended when it was decided)."""
        decision_id = _name("decision_id", decision_id, MAX_ID_LENGTH, ID_BOUND)
        action = _name("action", action, self.config.name_length)
        with self._lock:
            decider, recommended, category = self._owner(decision_id)
            memory = decider.memory
            if action not in memory.action_names:
                decider.sync()  # another server may have added it meanwhile
            if action not in memory.action_names:
                held = list(memory.action_names)
                if self.config.fixed(tuple(memory.factor_names)) is not None:
                    raise ToolInputError("action", f"{action!r} is not one of this memory's actions {held}")
                if len(held) >= self.config.max_actions:
                    raise ToolInputError("action", f"{action!r} is not one of this memory's actions {_shown(held)}, "
                                         f"and it holds {len(held)}, the most a memory may ([limits] actions)")
            if self.config.fixed(tuple(memory.factor_names)) is None:  # (decided when it had room; filled since)
                self._check_category(decider, category, "decision_id")
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
        decision_id = _name("decision_id", decision_id, MAX_ID_LENGTH, ID_BOUND)
        with self._lock:
            for attempt in range(2):
                if attempt:
                    self._refresh()  # decided on a vocabulary another server opened
                for decider in self._search_order(decision_id):
                    try:
                        explanation = decider.explain_decision(decision_id)
                        made = decider.decision(decision_id)
                    except KeyError:
                        continue
                    return {"id": decision_id, **explanation_json(explanation), "refer": made.refer,
                            "reasons": list(made.reasons), "verifications_needed": made.verifications_needed}
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
        _memory_type("memory_type", memory_type)
        memory = self.text
        memory._embed([text])  # embedded (and cached) outside the lock: the store's other calls need not wait
        with memory._lock:  # the look for the text and the add see one state
            memory._fresh()
            stored = _stored(memory, text, scope)
            if stored is not None:
                return stored
            ids = memory.remember([text], scope=scope, importance=importance, memory_type=memory_type)
        return int(ids[0])

    def recall(self, query: Any, scopes: Any = None, k: Any = 5, memory_type: Any = None) -> list[dict[str, Any]]:
        """The ``k`` text memories of ``scopes`` that best answer ``query``, best first: ``scopes``
        None asks every scope this server serves (``scopes`` given to it, else every scope the
        store holds); ``memory_type`` None asks every type."""
        if not isinstance(query, str) or not query.strip():
            raise ToolInputError("query", f"must be a non-empty string, got {query!r}")
        if len(query) > self.config.text_length:
            raise ToolInputError("query", f"holds {len(query):,} characters, more than the "
                                 f"{self.config.text_length:,} this server takes ([limits] text_length)")
        _utf8("query", query)
        if scopes is not None:
            if isinstance(scopes, str) or not isinstance(scopes, Sequence) or not scopes:
                raise ToolInputError("scopes", f"must be a non-empty list of scope names, or omitted for every scope, "
                                     f"got {scopes!r}")
            scopes = [self._scope(f"scopes[{i}]", s) for i, s in enumerate(scopes)]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ToolInputError("k", f"must be an int in [1, {MAX_K}], got {k!r}")
        if memory_type is not None:
            _memory_type("memory_type", memory_type)
        memory = self.text
        with memory._lock:  # the recall and the scopes of its answer see one state (a forget waits)
            memory._fresh()  # what other servers on the store wrote: their scopes too
            asked = scopes if scopes is not None else self.scopes  # None: every scope
            known = None if asked is None else [s for s in asked if s in memory.scope_names]
            if known == []:  # a scope never written holds nothing
                return []
            found = memory.recall(query, k=k, scopes=known, memory_type=memory_type)
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
            if not 0 <= value <= MAX_ID:  # no memory has it: ids are signed 64-bit ints from 0
                raise ToolInputError(f"ids[{i}]", f"must be a memory id in [0, 2**63 - 1], got {value}")
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

    # -- what there is ----------------------------------------------------------------------
    def memories(self) -> dict[str, Any]:
        """What a client may name: ``scopes`` (those this server serves, or, serving any, those the
        store holds), ``any_scope`` (whether other scope names are taken too), and ``judgment``:
        each judgment memory's ``factors``, ``categories`` and ``actions``, whether its names are
        ``fixed`` by the config or grow, and its ``pending`` and ``learned`` decisions (a memory the
        config fixes is listed before its first decision too)."""
        with self._lock:
            self._refresh()
            listed = []
            for vocabulary, decider in sorted(self._deciders.items()):
                decider.sync()  # names another server added since
                memory = decider.memory
                listed.append({"factors": list(vocabulary), "categories": list(memory.category_names or ()),
                               "actions": list(memory.action_names),
                               "fixed": self.config.fixed(vocabulary) is not None,
                               "pending": len(decider.pending()), "learned": int(memory.num_decisions)})
            listed += [{"factors": list(m.factors), "categories": list(m.categories), "actions": list(m.actions),
                        "fixed": True, "pending": 0, "learned": 0}
                       for m in self.config.memories if m.factors not in self._deciders]
        if self.scopes is not None:
            scopes = list(self.scopes)
        else:
            text = self.text
            with text._lock:
                text._fresh()
                scopes = list(text.scope_names)
        return {"scopes": scopes, "any_scope": self.scopes is None, "judgment": listed}

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
                    scorer = RetrievalScorer(tau=self.config.recency_hours * SECONDS_PER_HOUR)
                    self._text = EpisodicMemory(embedder.dim, capacity=self.config.text_capacity, eviction="fifo",
                                                scorer=scorer, store=store, embedder=embedder)
                except ValueError as error:
                    raise ValueError(f"the text memories cannot be opened with this config ([text] capacity = "
                                     f"{self.config.text_capacity:,}): {error}") from error
            return self._text

    # -- helpers ----------------------------------------------------------------------------
    def _open(self, vocabulary: tuple[str, ...], category: str, actions: tuple[str, ...] | None,
              new_memory: bool) -> Decider:
        """A new judgment memory for ``vocabulary``, named by the config or by this first call;
        refused when ``vocabulary`` nearly is a known one's, unless ``new_memory``."""
        fixed = self.config.fixed(vocabulary)
        if fixed is None and not new_memory:
            known = set(self._deciders) | {m.factors for m in self.config.memories}
            close = near_miss(vocabulary, known)
            if close is not None:
                nearest, difference = close
                raise ToolInputError("factors", f"{_shown(vocabulary)} nearly are the factors of an existing memory "
                                     f"{_shown(nearest)} ({difference}): send its names, or new_memory=true to open "
                                     "a memory on these")
        if len(self._deciders) >= self.config.max_memories:
            raise ToolInputError("factors", f"factors {_shown(vocabulary)} would open a new judgment memory, but "
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
                self._own(decision.id, vocabulary, decision.action, str(decision.category))

    def _check_category(self, decider: Decider, category: str, field: str) -> None:
        """Refuse, by ``field``, a category that would grow ``decider``'s memory past ``[limits] categories``."""
        held = decider.memory.category_names or ()
        if category in held:
            return
        decider.sync()  # another server may have added it meanwhile
        held = decider.memory.category_names or ()
        if category not in held and len(held) >= self.config.max_categories:
            raise ToolInputError(field, f"category {category!r} would be a new category of the memory of factors "
                                 f"{_shown(tuple(decider.memory.factor_names))}, which holds {len(held)}, the most "
                                 "a memory may ([limits] categories)")

    def _judgment_store(self) -> Any:
        if self._store is None:
            self._store = self.open_store()
        return self._store

    def _own(self, decision_id: str, vocabulary: tuple[str, ...], action: str | None, category: str) -> None:
        self._owners[decision_id] = (vocabulary, action, category)
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)

    def _owner(self, decision_id: str) -> tuple[Decider, str | None, str]:
        """The Decider holding pending decision ``decision_id``, what it recommended, and its category."""
        owner = self._owners.get(decision_id)
        if owner is None:  # decided by another server on this store, or mapped out: look again
            self._refresh(every_pending=True)
            owner = self._owners.get(decision_id)
        if owner is None:
            raise ToolInputError("decision_id", f"{decision_id!r} is not pending: unknown, verified already or "
                                 "expired")
        return self._deciders[owner[0]], owner[1], owner[2]

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


def near_miss(vocabulary: tuple[str, ...], known: Iterable[tuple[str, ...]]) -> tuple[tuple[str, ...], str] | None:
    """The known vocabulary that ``vocabulary`` nearly is, and how it differs (``['risk'] left
    out``), or None: one it leaves names out of (a strict subset), one it adds
    names to (a strict superset), or one of as many names where each name it does not share is
    spelt close to one of the other's (equal but for case, spaces, ``_`` and ``-``, or difflib's
    ratio at least :data:`CLOSE_SPELLING`). The closest is the one with the fewest names differing
    (then the first in sorted order)."""
    new = set(vocabulary)
    found: list[tuple[int, tuple[str, ...], str]] = []
    for names in known:
        old = set(names)
        if new < old:
            left_out = sorted(old - new)
            found.append((len(left_out), names, f"{_shown(left_out)} left out"))
        elif new > old:
            added = sorted(new - old)
            found.append((len(added), names, f"{_shown(added)} added"))
        elif len(new) == len(old) and new != old:
            pairs = _spelt_alike(sorted(new - old), sorted(old - new))
            if pairs is not None:
                spelt = ", ".join(f"{a!r} for {b!r}" for a, b in pairs[:SHOWN])
                found.append((len(pairs), names, f"{spelt}{' ...' if len(pairs) > SHOWN else ''}"))
    if not found:
        return None
    _, names, difference = min(found, key=lambda entry: entry[:2])
    return names, difference


def _spelt_alike(names: list[str], others: list[str]) -> list[tuple[str, str]] | None:
    """Each of ``names`` paired with one of ``others`` spelt close to it, or None when one has none."""
    def plain(name: str) -> str:
        return "".join(name.lower().replace("_", "").replace("-", "").split())

    left = list(others)
    alike: dict[str, list[str]] = {}  # a plain spelling -> the names of others spelt so
    for other in others:
        alike.setdefault(plain(other), []).append(other)
    pairs = []
    for name in names:
        match = next((o for o in alike.get(plain(name), ()) if o in left), None)
        if match is None:
            close = difflib.get_close_matches(name, left, n=1, cutoff=CLOSE_SPELLING)
            if not close:
                return None  # (stops at the first name with no match: a vocabulary of other names costs little)
            match = close[0]
        left.remove(match)
        pairs.append((name, match))
    return pairs


def _shown(names: Sequence[str]) -> str:
    """``names`` as a list, the first :data:`SHOWN` of a longer one and how many more."""
    names = list(names)
    if len(names) <= SHOWN:
        return str(names)
    return f"{str(names[:SHOWN])[:-1]}, ... (+{len(names) - SHOWN} more)]"


def _stored(memory: EpisodicMemory, text: str, scope: str) -> int | None:
    """The id of the live text memory of ``scope`` that holds ``text``, or None (the caller holds
    the memory's lock). The texts are scanned by ``list.index`` (C), a few milliseconds a million."""
    if scope not in memory.scope_names:
        return None
    code = scope_index(scope, memory.scope_names, "scope")
    scopes, ids, contents = memory._column("scope"), memory._column("ids"), memory.contents
    row = -1
    while True:
        try:
            row = contents.index(text, row + 1)
        except ValueError:
            return None
        if int(scopes[row]) == code:
            return int(ids[row])


def _memory_type(field: str, value: Any) -> str:
    if not isinstance(value, str) or value not in MEMORY_TYPES:
        raise ToolInputError(field, f"must be one of {list(MEMORY_TYPES)}, got {value!r}")
    return value


def _utf8(field: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate: no store can hold it
        raise ToolInputError(field, f"is not valid Unicode text ({error.reason} at {error.start})") from error


def _name(field: str, value: Any, longest: int, bound: str = "a name may ([limits] name_length)") -> str:
    if not isinstance(value, str) or not value:
        raise ToolInputError(field, f"must be a non-empty string, got {value!r}")
    if len(value) > longest:
        raise ToolInputError(field, f"holds {len(value)} characters, more than the {longest} {bound}")
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
            raise ToolInputError(f"factors.{name}", f"must be finite, got {value!r}")
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
