"""RetrievalScorer: the retrieval score of the original design, and batched, chunked top-k."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as nnf
from torch import Tensor, nn

from gae import validation as check

SECONDS_PER_HOUR = 3600.0
_CHUNK = 65536  # memories scored at once: bounds the (Q, chunk) score block, never Q x N x 3


class ScoreComponents(NamedTuple):
    """The three terms of the score, before weighting.

    Attributes:
        similarity: (Q, N) cosine similarity of query and memory.
        recency: (Q, N) or (1, N) ``exp(-age / tau)``.
        importance: (1, N) the memories' importance in [0, 1].
    """

    similarity: Tensor
    recency: Tensor
    importance: Tensor


class RetrievalScorer(nn.Module):
    r"""``score(m, q) = w_sim cos(q, m) + w_rec exp(-age_m / tau) + w_imp importance_m``.

    Time is in seconds. The default ``tau = 15`` s suits a fast simulated clock (the original
    design's landscape); for memories that should fade over hours use :meth:`hourly`.

    Args:
        w_sim, w_rec, w_imp: weights of similarity, recency and importance. Default: 0.60, 0.25, 0.15.
        tau: recency time constant in seconds. Default: 15.
        learnable: make the three weights an ``nn.Parameter`` (trained by gradient). Default: False.

    Shape:
        - queries: (Q, D); embeddings: (N, D) (normalised here, so any scale works);
          age: (N,) or (Q, N) seconds; importance: (N,); mask: (N,) or (Q, N) bool, True = eligible.
        - Output: (Q, N) scores, ``-inf`` where masked out. Q or N may be 0 (an empty result).

    Inputs must be finite, on the scorer's device, of any real dtype (cast to the scorer's,
    float32 unless moved); anything else raises TypeError or ValueError naming the argument.

    Thread safety: scoring is pure. ``forward``, :meth:`components` and :func:`top_k` only read
    ``weights`` and ``tau`` and write nothing the scorer holds, so any number of threads may score
    with one scorer at once, with no lock. Its numbers change only when you change them (an
    optimizer step on learnable weights, ``load_state_dict``, ``to``): do that while no thread
    scores with it, nor with a memory that holds it (the memory's lock does not cover the scorer).

    Attributes:
        weights: (3,) ``[w_sim, w_rec, w_imp]``, a parameter when learnable, else a buffer.
        tau: () buffer.

    Examples::

        >>> scorer = RetrievalScorer()
        >>> q = torch.tensor([[1.0, 0.0]])
        >>> m = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> scorer(q, m, age=torch.tensor([0.0, 0.0]), importance=torch.tensor([1.0, 0.0]))
        tensor([[1.0000, 0.2500]])
    """

    weights: Tensor
    tau: Tensor

    def __init__(self, w_sim: float = 0.60, w_rec: float = 0.25, w_imp: float = 0.15, tau: float = 15.0,
                 learnable: bool = False) -> None:
        super().__init__()
        values = [check.check_real(name, value, low=0.0) for name, value in
                  (("w_sim", w_sim), ("w_rec", w_rec), ("w_imp", w_imp))]
        weights = torch.tensor(values, dtype=torch.float32)
        if learnable:
            self.weights = nn.Parameter(weights)
        else:
            self.register_buffer("weights", weights)
        self.register_buffer("tau", torch.tensor(check.check_real("tau", tau, low=0.0, low_open=True)))

    @classmethod
    def hourly(cls, w_sim: float = 0.60, w_rec: float = 0.25, w_imp: float = 0.15,
               learnable: bool = False) -> RetrievalScorer:
        """The same score with memories fading over an hour (``tau = 3600`` s)."""
        return cls(w_sim, w_rec, w_imp, tau=SECONDS_PER_HOUR, learnable=learnable)

    def components(self, queries: Tensor, embeddings: Tensor, age: Tensor, importance: Tensor) -> ScoreComponents:
        """The unweighted terms; see :class:`ScoreComponents`."""
        return self._components(*self._check(queries, embeddings, age, importance, None)[:4])

    def forward(self, queries: Tensor, embeddings: Tensor, age: Tensor, importance: Tensor,
                mask: Tensor | None = None) -> Tensor:
        return self._scores(*self._check(queries, embeddings, age, importance, mask))

    def _components(self, queries: Tensor, embeddings: Tensor, age: Tensor, importance: Tensor) -> ScoreComponents:
        similarity = nnf.normalize(queries, dim=-1) @ nnf.normalize(embeddings, dim=-1).T  # (Q, N)
        recency = torch.exp(-age / self.tau)
        return ScoreComponents(similarity, recency if recency.dim() == 2 else recency.unsqueeze(0),
                               importance.unsqueeze(0))

    def _scores(self, queries: Tensor, embeddings: Tensor, age: Tensor, importance: Tensor,
                mask: Tensor | None = None) -> Tensor:
        """:meth:`forward` on inputs already checked (the memories' own calls)."""
        similarity, recency, weight_of_importance = self._components(queries, embeddings, age, importance)
        w_sim, w_rec, w_imp = self.weights
        scores = w_sim * similarity + w_rec * recency + w_imp * weight_of_importance
        return scores if mask is None else scores.masked_fill(~mask, float("-inf"))

    def _check(self, queries: Tensor, embeddings: Tensor, age: Tensor, importance: Tensor,
               mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """The inputs, checked and cast to the scorer's dtype, or an error naming the first bad one."""
        embeddings = self._real("embeddings", embeddings, "(N, D)", lambda shape: len(shape) == 2)
        n, width = embeddings.shape
        queries = self._real("queries", queries, f"(Q, {width})", lambda shape: len(shape) == 2 and shape[1] == width)
        q = queries.shape[0]
        age = self._real("age", age, f"({n},) or ({q}, {n})", lambda shape: shape in ((n,), (q, n)), floating=False)
        importance = self._real("importance", importance, f"({n},)", lambda shape: shape == (n,), floating=False)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
                raise TypeError(f"mask must be None or a bool tensor, got {got}")
            if tuple(mask.shape) not in ((n,), (q, n)):
                raise ValueError(f"mask must have shape ({n},) or ({q}, {n}), got {tuple(mask.shape)}")
            if mask.device != self.weights.device:
                raise ValueError(f"mask is on {mask.device} but the scorer is on {self.weights.device}")
        return queries, embeddings, age, importance, mask

    def _real(self, name: str, value: Tensor, expected: str, fits: Callable[[tuple[int, ...]], bool],
              floating: bool = True) -> Tensor:
        """``value`` as a finite, contiguous tensor of the scorer's dtype, on its device, of a shape
        that ``fits`` (contiguous: a transposed input scores exactly as its copy)."""
        device, dtype = self.weights.device, self.weights.dtype
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {expected}, got {type(value).__name__}")
        if not value.is_floating_point() and (floating or value.is_complex() or value.dtype == torch.bool):
            raise TypeError(f"{name} must be a {'floating-point' if floating else 'real'} tensor, got dtype "
                            f"{value.dtype}")
        if not fits(tuple(value.shape)):
            raise ValueError(f"{name} must have shape {expected}, got {tuple(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name} is on {value.device} but the scorer is on {device}")
        cast = value.to(dtype).contiguous()
        bad = ~torch.isfinite(cast.detach())
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name} must be finite in {dtype}, got {float(value[where])} at {list(where)}")
        return cast

    def extra_repr(self) -> str:
        w = [round(float(v), 4) for v in self.weights]
        return f"w_sim={w[0]}, w_rec={w[1]}, w_imp={w[2]}, tau={float(self.tau)}, " \
               f"learnable={isinstance(self.weights, nn.Parameter)}"


class TopK(NamedTuple):
    """Best ``k`` memories per query: (Q, k) scores (``-inf`` padding) and row indices (-1 padding)."""

    scores: Tensor
    rows: Tensor


@torch.no_grad()
def top_k(scorer: RetrievalScorer, queries: Tensor, embeddings: Tensor, bias: Tensor, k: int,
          allowed: Tensor | None = None, chunk: int = _CHUNK) -> TopK:
    """The ``k`` best rows of ``w_sim * cos(q, e) + bias`` per query, scanning the store in chunks.

    ``bias`` (N,) holds every query-independent part of the score (recency and importance at a
    common ``now``), with ``-inf`` for rows no query may see (expired, not yet valid). ``allowed``
    (Q, N) bool adds per-query restrictions (scopes). Peak memory is O(Q * chunk), never Q x N x 3.
    ``embeddings`` must already be unit-norm.
    """
    n_queries = queries.shape[0]
    w_sim = scorer.weights[0].detach()
    unit = nnf.normalize(queries, dim=-1) * w_sim  # fold the weight into the queries: one fewer pass
    best = torch.full((n_queries, 0), float("-inf"), device=queries.device)
    best_index = torch.zeros((n_queries, 0), dtype=torch.int64, device=queries.device)
    for start in range(0, embeddings.shape[0], chunk):
        block = torch.addmm(bias[start:start + chunk].unsqueeze(0), unit, embeddings[start:start + chunk].T)
        if allowed is not None:
            block.masked_fill_(~allowed[:, start:start + chunk], float("-inf"))
        take = min(k, block.shape[1])
        scores, index = block.topk(take, dim=1)
        best = torch.cat([best, scores], dim=1)
        best_index = torch.cat([best_index, index + start], dim=1)
        if best.shape[1] > k:
            best, keep = best.topk(k, dim=1)
            best_index = best_index.gather(1, keep)
    best, order = best.sort(dim=1, descending=True, stable=True)  # chunks never cut to k are still unsorted
    best_index = best_index.gather(1, order)
    if best.shape[1] < k:  # fewer memories than k: pad
        pad = k - best.shape[1]
        best = nnf.pad(best, (0, pad), value=float("-inf"))
        best_index = nnf.pad(best_index, (0, pad), value=-1)
    return TopK(best, best_index.masked_fill(torch.isinf(best), -1))
