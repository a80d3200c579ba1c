"""A ledger's events, and how a learn or a growth is applied to a memory: the one function that
learns live, replays on open and applies other writers' commits (:func:`apply_event`), and the
serial replay every process on a ledger equals (:func:`replay`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

DECIDE, LEARN, CLOSE, GROW = "decide", "learn", "close", "grow"  # the kinds of event
KINDS = (DECIDE, LEARN, CLOSE, GROW)
NO_DETAIL: dict[str, Any] = {}  # (shared by events without detail: never written to)


class Event(NamedTuple):
    """One ledger row. ``decide``: a decision (``action`` its recommendation, ``detail`` its
    ``confidence``, ``probs``, the action ``names`` they are over and its ``reasons``); ``learn``:
    a verified decision as learned (``action`` as given, ``confirmed`` the flag it was learned
    with, ``detail['referral']`` what act or refer takes from it); ``close``: a decision closed
    without learning (``detail['reason']``: ``skipped`` or ``expired``); ``grow``: names added
    (``detail['actions']``, ``detail['categories']``)."""

    kind: str
    decision_id: str | None = None
    category: str | int | None = None
    row: np.ndarray | None = None  # (K,) float64
    action: str | int | None = None
    confirmed: bool | None = None
    outcome: str | None = None
    source_id: int | None = None
    decided_version: int | None = None
    version: int | None = None
    at: float | None = None
    detail: dict[str, Any] = NO_DETAIL
    seq: int = 0  # given when appended


def apply_event(memory: Any, event: Event, meet: bool = True) -> dict[str, Any] | None:
    """A learn or grow event on ``memory`` (a model in RAM) through its public calls: ``learn_one``
    with the event's source id, ``add_actions_`` / ``add_categories_``. Returns what ``learn_one``
    returned (None for a growth). With ``meet``, a name the writer met with ``grow=True`` is added
    as its ``learn_one`` added it (the action, then the category), so a memory built with
    ``grow=False`` replays it too."""
    if event.kind == GROW:  # (only what is missing: a rebuild may have grown the memory to today's names first)
        grow_to(memory, event.detail.get("actions") or (), event.detail.get("categories") or ())
        return None
    return learn(memory, event.row, event.action, event.category, event.confirmed, event.outcome, event.source_id,
                 meet)


def learn(memory: Any, row: Any, action: Any, category: Any, confirmed: bool | None, outcome: str | None,
          source: int | None, meet: bool = True) -> dict[str, Any]:
    """A learn event's fields on ``memory``: its ``learn_one`` (see :func:`apply_event`)."""
    if meet:
        grow_to(memory, [action] if isinstance(action, str) and action else (),
                [category] if isinstance(category, str) and category and memory.category_names is not None
                else ())
    return memory.learn_one(row, action, category, confirmed, outcome, source_id=source)


def grow_to(memory: Any, actions: Any = (), categories: Any = ()) -> None:
    """Append to ``memory`` the action and category names of ``actions`` and ``categories`` it lacks."""
    actions = [name for name in actions if name not in memory.action_names]
    categories = [name for name in categories if name not in (memory.category_names or ())]
    if actions:
        memory.add_actions_(actions)
    if categories:
        memory.add_categories_(categories)


def snapshot_parts(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A snapshot's ``(memory state, referral state)``. A ledger written before the Decider kept
    the memory's ``state_dict`` alone, the referral in its extra state: both are read from it."""
    if set(state) == {"memory", "referral"}:
        return state["memory"], state["referral"]
    extra = state.get("_extra_state")
    return state, extra.get("referral") if isinstance(extra, dict) else None


def replay(ledger: Any, memory: Any) -> Any:
    """``memory`` (in RAM, built with the ledger's first names and settings) fed every verification
    and growth of ``ledger`` in commit order, from the state the ledger started with (a memory that
    had learned when its ledger was created left it as a snapshot at sequence number 0): the
    serial replay every process on the ledger equals."""
    first = ledger.snapshot(before=1)
    if first is not None:
        state = snapshot_parts(first.state)[0]
        extra = state.get("_extra_state", {})
        grow_to(memory, extra.get("action_names") or (), extra.get("category_names") or ())
        memory.load_state_dict(state)
    meta = ledger.meta()  # its names today, in order: a name whose first use was forgotten keeps its place
    grow_to(memory, meta.get("grown_actions") or meta.get("actions") or (),
            meta.get("grown_categories") or meta.get("categories") or ())
    for event in ledger.events(0, kinds=(LEARN, GROW)):
        apply_event(memory, event)
    return memory
