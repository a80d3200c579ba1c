"""The decision lines of an evaluation trace, encoded many calls at a time (see :mod:`gae.traces.writer`).

A line is a few dozen numbers; formatting them one by one in Python would cost several times
what the memories spend deciding. A writer keeps each call's tensors (:class:`Decisions`) and
encodes thousands of decisions at once: every column (factors, probabilities, distances,
ids) by one ``orjson`` call, cut into rows, the lines joined from one template. float32
values are written in their shortest exact form, float64 in full, ``inf`` and ``nan`` as
``null``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import orjson
import torch
from torch import Tensor

from gae.judgment import JudgmentMemory, rule
from gae.models.knn import KNNMemory
from gae.models.retrieval import RetrievalMemory
from gae.types import MemoryOutput, Retrieved, StreamStep

Memory = JudgmentMemory | KNNMemory | RetrievalMemory

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# what shaped an answer, by memory kind, in the order the lines hold it
SHAPED = {"judgment": ("prototype", "distance", "attention"), "knn": ("ids", "distance"),
          "retrieval": ("ids", "score", "similarity", "recency", "importance", "store_version", "stored")}


class Decisions(NamedTuple):
    """One call's scored decisions, as tensors, until they are encoded.

    ``ids``, ``updates``, ``since``: (B,) int64 arrays; ``call``, ``digest``, ``deleted``: the
    call's number, the hash of the state it began on, the removals so far; ``x`` (B, K),
    ``category`` (B,), ``output`` the answers; ``shaped`` the :data:`SHAPED` columns;
    ``learned``: (action, confirmed or None, skip) for a prequential call, None for a score-only one.
    """

    ids: np.ndarray
    updates: np.ndarray
    since: np.ndarray
    call: int
    digest: str
    deleted: int
    x: Tensor
    category: Tensor
    output: MemoryOutput
    shaped: dict[str, Tensor]
    learned: tuple[Tensor, Tensor | None, Tensor] | None


def json_rows(values: Tensor | np.ndarray) -> list[bytes]:
    """Each row of a (B,) or (B, N) tensor as JSON, from one encoder call."""
    array = values.detach().cpu().numpy() if isinstance(values, Tensor) else values
    array = np.ascontiguousarray(array)
    if array.shape[0] == 0:
        return []
    text = orjson.dumps(array, option=_NUMPY)
    if array.ndim == 1:
        return text[1:-1].split(b",")
    if array.shape[1] == 0:
        return [b"[]"] * array.shape[0]
    return [b"[" + row + b"]" for row in text[2:-2].split(b"],[")]


def _judgment_shaped(category: Tensor, nearest: Tensor, distance: Tensor, attention: Tensor) -> dict[str, Tensor]:
    """Each action's prototype slot, its weighted squared distance (inf: none), the attention."""
    return {"prototype": nearest, "distance": distance.masked_fill(nearest < 0, float("inf")),
            "attention": attention[category]}


def _retrieved_shaped(retrieved: Retrieved, stored: Tensor) -> dict[str, Tensor]:
    """The ids that voted (-1 past those in reach) with their distances or scores and score terms."""
    if retrieved.similarity is None:
        return {"ids": retrieved.ids, "distance": retrieved.scores}
    assert retrieved.recency is not None and retrieved.importance is not None and retrieved.version is not None
    return {"ids": retrieved.ids, "score": retrieved.scores, "similarity": retrieved.similarity,
            "recency": retrieved.recency, "importance": retrieved.importance, "store_version": retrieved.version,
            "stored": stored}


def learn_and_shape(memory: Memory, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                    skip: Tensor, source_ids: Tensor | None) -> tuple[StreamStep, dict[str, Tensor]]:
    """``memory.prequential_`` on inputs it has already validated, and what shaped each answer."""
    with torch.no_grad():  # with a graph, torch ops on the attention parameter cost far more
        attention = memory.criterion_attention().cpu() if isinstance(memory, JudgmentMemory) else None
        next_store_id = int(memory.store.next_id) if isinstance(memory, RetrievalMemory) else 0
        step = memory._prequential(x, category, action, confirmed, skip, source_ids)
    if isinstance(memory, JudgmentMemory):
        assert step.nearest is not None and step.sq_diff is not None and attention is not None
        category = category.cpu()
        distance = rule.weighted(step.sq_diff.cpu(), attention[category])  # the scoring formula's sum
        return step, _judgment_shaped(category, step.nearest.cpu(), distance, attention)
    assert step.retrieved is not None
    applied = step.events.applied.cpu()
    stored = torch.full(applied.shape, -1, dtype=torch.int64)
    if isinstance(memory, RetrievalMemory):  # ids are handed out in order, one per stored decision
        stored = (torch.cumsum(applied.long(), 0) - 1 + next_store_id).masked_fill(~applied, -1)
    return step, _retrieved_shaped(step.retrieved.to("cpu"), stored)


@torch.no_grad()
def score_and_shape(memory: Memory, x: Tensor, category: Tensor) -> tuple[MemoryOutput, dict[str, Tensor]]:
    """``memory(x, category)`` (nothing learned) and what shaped each answer."""
    if isinstance(memory, JudgmentMemory):
        output = memory(x, category)
        explained = memory.explain(x, category)
        attention = memory.criterion_attention().cpu()
        return output, _judgment_shaped(explained.category.cpu(), explained.nearest.cpu(), explained.distance.cpu(),
                                        attention)
    if isinstance(memory, RetrievalMemory):
        output, retrieved = memory.neighbours_and_output(x, category)
    else:
        output, retrieved = memory(x, category), memory.neighbours(x, category)
    return output, _retrieved_shaped(retrieved.to("cpu"), torch.full((x.shape[0],), -1, dtype=torch.int64))


_LEARNED: dict[tuple[int, int, bool], bytes] = {}  # (action, confirmed: 1 / 0 / -1 for null, skip) -> JSON


def _learned_rows(learned: tuple[Tensor, Tensor | None, Tensor] | None, n: int) -> list[bytes]:
    if learned is None:
        return [b"null"] * n
    action, confirmed, skip = learned
    flags = [-1] * n if confirmed is None else [int(flag) for flag in confirmed.tolist()]
    rows = []
    for key in zip(action.tolist(), flags, skip.tolist(), strict=True):
        row = _LEARNED.get(key)
        if row is None:
            flag = b"null" if key[1] < 0 else (b"true" if key[1] else b"false")
            row = b'{"action":%d,"confirmed":%b,"skip":%b}' % (key[0], flag, b"true" if key[2] else b"false")
            _LEARNED[key] = row
        rows.append(row)
    return rows


def encode(run: str, kind: str, calls: list[Decisions]) -> bytes:
    """The ``decision`` lines of ``calls``, newline-terminated, each column encoded once."""
    if not calls:
        return b""
    shaped = b",".join(orjson.dumps(name) + b":%b" for name in SHAPED[kind])
    template = (b'{"kind":"decision","run":' + orjson.dumps(run).replace(b"%", b"%%") + b',"id":%b,"memory":'
                + orjson.dumps(kind) + b',"call":%b,"version":{"updates":%b,"hash":%b,"since":%b},"x":%b,'
                b'"category":%b,"answer":%b,"probs":%b,"shaped":{' + shaped + b'},"learned":%b,"deleted":%b}\n')
    sizes = [len(call.ids) for call in calls]

    def each(value: Any, call: Decisions) -> np.ndarray:
        return np.full(len(call.ids), value, dtype=np.int64)

    hashes: list[bytes] = []
    learned: list[bytes] = []
    for call, size in zip(calls, sizes, strict=True):
        hashes += [orjson.dumps(call.digest)] * size
        learned += _learned_rows(call.learned, size)
    answers = [b"null" if a == b"-1" else a for a in json_rows(torch.cat([c.output.action for c in calls]))]
    columns = [json_rows(np.concatenate([c.ids for c in calls])),
               json_rows(np.concatenate([each(c.call, c) for c in calls])),
               json_rows(np.concatenate([c.updates for c in calls])), hashes,
               json_rows(np.concatenate([c.since for c in calls])),
               json_rows(torch.cat([c.x.float() for c in calls])), json_rows(torch.cat([c.category for c in calls])),
               answers, json_rows(torch.cat([c.output.probs.float() for c in calls])),
               *(json_rows(torch.cat([c.shaped[name] for c in calls])) for name in SHAPED[kind]),
               learned, json_rows(np.concatenate([each(c.deleted, c) for c in calls]))]
    return b"".join([template % values for values in zip(*columns, strict=True)])


def decision_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of a decision record that a replay must reproduce."""
    return {key: record[key] for key in ("answer", "probs", "shaped")}
