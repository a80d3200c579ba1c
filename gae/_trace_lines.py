"""The decision lines of an evaluation trace, encoded a batch at a time (see :mod:`gae.trace`).

A line is a few dozen numbers; formatting them one by one in Python would cost several times
what the memories spend deciding. Every column of a batch (factors, probabilities, distances,
ids) is encoded by one ``orjson`` call and cut into rows, and the lines are joined from the
pieces: float32 values in their shortest exact form, float64 in full, ``inf`` and ``nan`` as
``null``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import torch
from torch import Tensor, nn

from gae.judgment import JudgmentMemory
from gae.retrieval_memory import RetrievalMemory
from gae.types import MemoryOutput, Retrieved, StreamStep

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


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


def json_objects(columns: list[tuple[str, list[bytes]]]) -> list[bytes]:
    """One JSON object per row from named columns of encoded values."""
    template = b"{" + b",".join(orjson.dumps(name).replace(b"%", b"%%") + b":%b" for name, _ in columns) + b"}"
    return [template % values for values in zip(*(rows for _, rows in columns), strict=True)]


def _judgment_shaped(category: Tensor, nearest: Tensor, distance: Tensor, attention: Tensor) -> list[bytes]:
    """Each action's prototype slot, its weighted squared distance (null for none), the attention."""
    distance = distance.masked_fill(nearest < 0, float("inf"))
    weights = json_rows(attention)  # (C, K): each category's row encoded once, then looked up
    return json_objects([("prototype", json_rows(nearest)), ("distance", json_rows(distance)),
                         ("attention", [weights[c] for c in category.tolist()])])


def _retrieved_shaped(retrieved: Retrieved, stored: Tensor | None = None) -> list[bytes]:
    """The ids that voted (-1 past those in reach) with their distances or scores and score terms."""
    columns = [("ids", json_rows(retrieved.ids))]
    if retrieved.similarity is None:
        columns.append(("distance", json_rows(retrieved.scores)))
    else:
        columns += [(name, json_rows(values)) for name, values in
                    (("score", retrieved.scores), ("similarity", retrieved.similarity),
                     ("recency", retrieved.recency), ("importance", retrieved.importance))]
    if retrieved.version is not None:
        columns.append(("store_version", json_rows(retrieved.version)))
    if stored is not None:
        columns.append(("stored", json_rows(stored)))
    return json_objects(columns)


def learn_and_shape(memory: nn.Module, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                    skip: Tensor | None, source_ids: Tensor | None) -> tuple[StreamStep, list[bytes]]:
    """``memory.prequential_`` and, per decision, what shaped its answer (encoded)."""
    with torch.no_grad():  # with a graph, torch.softmax of even a (C, K) tensor can cost milliseconds
        attention = memory.criterion_attention().cpu() if isinstance(memory, JudgmentMemory) else None
    next_store_id = int(memory.store.next_id) if isinstance(memory, RetrievalMemory) else 0
    step = memory.prequential_(x, category, action, confirmed, skip, source_ids)
    if isinstance(memory, JudgmentMemory):
        assert step.nearest is not None and step.sq_diff is not None and attention is not None
        category = category.cpu()
        distance = (step.sq_diff.cpu() * attention[category].unsqueeze(1)).sum(-1)
        return step, _judgment_shaped(category, step.nearest.cpu(), distance, attention)
    assert step.retrieved is not None
    stored = None
    if isinstance(memory, RetrievalMemory):  # ids are handed out in order, one per stored decision
        applied = step.events.applied.cpu()
        stored = (torch.cumsum(applied.long(), 0) - 1 + next_store_id).masked_fill(~applied, -1)
    return step, _retrieved_shaped(step.retrieved.to("cpu"), stored)


@torch.no_grad()
def score_and_shape(memory: nn.Module, x: Tensor, category: Tensor) -> tuple[MemoryOutput, list[bytes]]:
    """``memory(x, category)`` (nothing learned) and, per decision, what shaped its answer (encoded)."""
    if isinstance(memory, JudgmentMemory):
        output = memory(x, category)
        explained = memory.explain(x, category)
        attention = memory.criterion_attention().detach().cpu()
        return output, _judgment_shaped(explained.category.cpu(), explained.nearest.cpu(), explained.distance.cpu(),
                                        attention)
    if isinstance(memory, RetrievalMemory):
        output, retrieved = memory.neighbours_and_output(x, category)
    else:
        output, retrieved = memory(x, category), memory.neighbours(x, category)
    return output, _retrieved_shaped(retrieved.to("cpu"))


def learned_rows(action: Tensor, confirmed: Tensor | None, skip: Tensor) -> list[bytes]:
    """The ``learned`` object of each decision of a prequential call."""
    flags = [b"null"] * action.shape[0] if confirmed is None else json_rows(confirmed)
    return json_objects([("action", json_rows(action)), ("confirmed", flags), ("skip", json_rows(skip))])


def decision_lines(run: str, kind: str, ids: np.ndarray, call: int, updates: np.ndarray, digest: str,
                   since: np.ndarray, x: Tensor, category: Tensor, output: MemoryOutput, shaped: list[bytes],
                   learned: list[bytes] | None, deleted: int) -> bytes:
    """The ``decision`` lines of one call (``ids``, ``updates``, ``since``: (B,) int64), newline-terminated."""
    n = len(ids)
    template = (b'{"kind":"decision","run":' + orjson.dumps(run).replace(b"%", b"%%") + b',"id":%b,"memory":'
                + orjson.dumps(kind) + b',"call":' + str(call).encode() + b',"version":{"updates":%b,"hash":'
                + orjson.dumps(digest) + b',"since":%b},"x":%b,"category":%b,"answer":%b,'
                b'"probs":%b,"shaped":%b,"learned":%b,"deleted":' + str(deleted).encode() + b"}\n")
    answers = [b"null" if a == b"-1" else a for a in json_rows(output.action)]
    columns = (json_rows(ids), json_rows(updates), json_rows(since), json_rows(x.float()), json_rows(category),
               answers, json_rows(output.probs.float()), shaped, learned if learned is not None else [b"null"] * n)
    return b"".join([template % values for values in zip(*columns, strict=True)])


def decision_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of a decision record that a replay must reproduce."""
    return {key: record[key] for key in ("answer", "probs", "shaped")}
