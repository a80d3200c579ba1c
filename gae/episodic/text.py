"""Text memories: :meth:`EpisodicMemory.remember` embeds texts and stores them, :meth:`recall` embeds
a query and retrieves the texts that answer it, both through the memory's ``embedder``
(:mod:`gae.episodic.embedders`), cached by the text's hash.

A memory's text is its ``content``: the store keeps it (full-text index included) and the index
keeps it row-aligned with the other columns (``EpisodicMemory.contents``), so a recall answers
from the index and a delete removes the text with the row (``erase=True``: from the store's
files too).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gae import validation as check
from gae.episodic.embedders import CachedEmbedder, Embedder, check_texts, default_embedder


class TextRecall(NamedTuple):
    """The ``k`` best text memories for one query, best first (only those found: no padding).

    Attributes:
        ids: the memories' ids. texts: their texts (None for a memory stored without one).
        scores: the full retrieval scores; similarity, recency, importance: their three terms.
        version: the memory's version the answer was computed on.
    """

    ids: list[int]
    texts: list[str | None]
    scores: list[float]
    similarity: list[float]
    recency: list[float]
    importance: list[float]
    version: int


class TextMixin:
    """``embedder``, :meth:`remember` and :meth:`recall` of :class:`~gae.EpisodicMemory`."""

    dim: int
    contents: list[str | None]
    _lock: Any
    add: Any
    retrieve: Any
    _column: Any

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "embedder":  # the property, also for an nn.Module embedder (which would become a submodule)
            TextMixin.embedder.fset(self, value)  # type: ignore[attr-defined]
        else:
            super().__setattr__(name, value)

    @property
    def embedder(self) -> CachedEmbedder | None:
        """What turns texts into embeddings (a :class:`~gae.episodic.embedders.CachedEmbedder` around
        the one given), or None: set on first use to all-MiniLM-L6-v2 when ``dim`` is 384."""
        return self.__dict__.get("_embedder")

    @embedder.setter
    def embedder(self, value: Embedder | None) -> None:
        if value is not None:
            cached = value if isinstance(value, CachedEmbedder) else CachedEmbedder(value)
            if cached.dim != self.dim:
                raise ValueError(f"embedder gives rows of width {cached.dim} but this memory has dim={self.dim}")
            value = cached
        self.__dict__["_embedder"] = value

    def _embed(self, texts: list[str]) -> Tensor:
        embedder = self.embedder
        if embedder is None:
            if self.dim != 384:
                raise ValueError(f"this memory (dim={self.dim}) has no embedder: give one (embedder=) whose width "
                                 "is its dim; the default, all-MiniLM-L6-v2, gives 384")
            self.embedder = embedder = CachedEmbedder(default_embedder())
        return embedder.embed(texts)

    def remember(self, texts: Sequence[str], *, scope: Any = 0, importance: Any = 0.5,
                 memory_type: str | Sequence[str] = "episode", now: float | None = None, **options: Any) -> Tensor:
        """Embed ``texts`` and store them (:meth:`~gae.EpisodicMemory.add` with ``content=texts``);
        returns their (B,) ids. ``now`` (seconds, default ``time.time()``) stamps ``created_at``;
        every other argument of ``add`` may be given (``confidence``, ``source_ids``,
        ``valid_from``, ``valid_until``, ``query``). A call that raises stores nothing."""
        texts = check_texts("texts", texts)
        now = time.time() if now is None else check.check_real("now", now, low=-float("inf"))
        embeddings = self._embed(texts)
        return self.add(embeddings, importance, scope=scope, memory_type=memory_type, now=now, content=texts, **options)

    def recall(self, text: str, *, k: int = 5, scopes: Any = None, now: float | None = None,
               memory_type: str | None = None) -> TextRecall:
        """The ``k`` memories that best answer ``text`` among those ``scopes`` (and ``memory_type``,
        default every type) allow (:meth:`~gae.EpisodicMemory.retrieve` of its embedding), with their
        texts. ``now``: seconds, default ``time.time()``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        query = self._embed(check_texts("text", [text]))
        now = time.time() if now is None else now
        with self._lock:  # the retrieval and the texts of one state
            found = self.retrieve(query, now=now, k=k, scopes=scopes, memory_type=memory_type)
            ids = [int(i) for i in found.ids[0].tolist() if i >= 0]
            texts = [None if row is None else self.contents[row] for row in self.rows_of(ids)]
        n = len(ids)

        def first(values: Tensor) -> list[float]:
            return [float(v) for v in values[0, :n].tolist()]

        return TextRecall(ids, texts, first(found.scores), first(found.similarity), first(found.recency),
                          first(found.importance), found.version)

    def rows_of(self, ids: Sequence[int]) -> list[int | None]:
        """The index row of each memory id, None for one not live (deleted, evicted, never
        stored). Rows keep insertion order and ids grow with it, so a binary search finds them."""
        if not len(ids):
            return []
        live = self._column("ids")
        wanted = torch.as_tensor(list(ids), dtype=live.dtype, device=live.device)
        if not live.numel():
            return [None] * len(ids)
        if bool((live[1:] > live[:-1]).all()):
            rows = torch.searchsorted(live, wanted).clamp_max(live.numel() - 1)
        else:  # not in id order (a state loaded from elsewhere): compare every id
            rows = (live.unsqueeze(0) == wanted.unsqueeze(1)).int().argmax(1)
        found = live[rows] == wanted
        return [row if hit else None for row, hit in zip(rows.tolist(), found.tolist(), strict=True)]
