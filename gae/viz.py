"""The retrieval-score landscape of an :class:`~gae.EpisodicMemory`, the original design's two panels.

Left, the embedding circle: every memory at its direction (its own unit embedding when D = 2,
a PCA projection onto the circle when D > 2), coloured by its score against the query. Right,
the score-space plane: x = similarity, y = recency, the background the score formula itself at
the store's mean importance. Gold rings mark the top-k retrieved.

Drawing needs matplotlib (``pip install gae-torch[viz]``), imported only when a figure is
drawn, with the Agg backend; ``import gae`` never imports this module.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor

from gae import validation as check
from gae.episodic import EpisodicMemory

_RING = "#f2a900"  # gold: the top-k rings, as in the original design
_LABEL_GAP = 0.075  # least vertical distance between two top-k labels, in recency units
_LABEL_COLUMN = 1.1  # similarity at which the top-k labels start: the gutter right of cos = 1


class Landscape(NamedTuple):
    """What :func:`landscape_figure` draws: one row per stored memory (N of them).

    Attributes:
        ids: (N,) stable memory ids.
        positions: (N, 2) the memories on the unit circle.
        query_position: (2,) the query on the unit circle.
        similarity, recency, importance: (N,) the three unweighted score terms.
        scores: (N,) the full score against the query, ``-inf`` where the memory is not valid now.
        eligible: (N,) bool, valid at ``now`` (the memories retrieval may return).
        top_ids: (<= k,) the retrieved ids, best first.
        weights: ``(w_sim, w_rec, w_imp)`` of the memory's scorer. tau: its time constant (s).
    """

    ids: Tensor
    positions: Tensor
    query_position: Tensor
    similarity: Tensor
    recency: Tensor
    importance: Tensor
    scores: Tensor
    eligible: Tensor
    top_ids: Tensor
    weights: tuple[float, float, float]
    tau: float


def circle_positions(embeddings: Tensor, query: Tensor, *, pca: bool | None = None) -> tuple[Tensor, Tensor]:
    """Directions of (N, D) embeddings and a (D,) query as points on the unit circle.

    With ``pca`` (default: when D != 2) the principal axes of the centred embeddings and query
    (the query takes part so that an empty store still has axes) span the plane; the uncentred
    vectors are projected onto them and normalised. Projecting, not centring, keeps 2-D input
    unchanged up to a rotation or reflection. Each axis is signed so the query's coordinate is
    >= 0, which makes the picture deterministic. A vector orthogonal to both axes lands on (0, 0).
    Without ``pca`` the first two coordinates are used (D = 1 is padded with a zero).

    Returns:
        (N, 2) positions and the (2,) query position.
    """
    points = torch.cat([embeddings, query.unsqueeze(0)]).float()  # (N + 1, D)
    dim = points.shape[1]
    if pca is None:
        pca = dim != 2
    if not pca:
        plane = nnf.normalize(nnf.pad(points, (0, max(0, 2 - dim)))[:, :2], dim=-1)
        return plane[:-1], plane[-1]
    _, _, vh = torch.linalg.svd(points - points.mean(0), full_matrices=False)
    axes = vh[:2].T  # (D, <= 2)
    if axes.shape[1] < 2:  # one point or D = 1: complete the basis
        axes = torch.linalg.qr(torch.cat([axes, torch.eye(dim, max(dim, 2))[:, :2]], dim=1)).Q[:, :2]
        axes = nnf.pad(axes, (0, 2 - axes.shape[1]))
    axes = axes * torch.where(query.float() @ axes < 0, -1.0, 1.0)
    plane = nnf.normalize(points @ axes, dim=-1)
    return plane[:-1], plane[-1]


@torch.no_grad()
def landscape(memory: EpisodicMemory, query: Tensor, now: float, *, k: int = 5) -> Landscape:
    """The data of :func:`landscape_figure`: every stored memory scored against one (D,) query.

    Examples::

        >>> memory = EpisodicMemory(2, capacity=3)
        >>> _ = memory.add(torch.eye(2), torch.tensor([0.2, 0.8]), now=0.0)
        >>> data = landscape(memory, torch.tensor([1.0, 0.0]), now=15.0, k=1)
        >>> data.top_ids.tolist(), [round(s, 3) for s in data.scores.tolist()]
        ([0], [0.722, 0.212])
    """
    if not isinstance(query, Tensor) or query.shape != (memory.dim,) or not query.is_floating_point():
        got = f"{tuple(query.shape)} {query.dtype}" if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(f"query must be a floating ({memory.dim},) tensor, got {got}")
    if not bool(torch.isfinite(query).all()):
        raise ValueError(f"query must be finite, got {query.tolist()}")
    now = check.check_real("now", now, low=-float("inf"))
    k = check.check_int("k", k, low=1)
    size = len(memory)

    def column(name: str) -> Tensor:
        return getattr(memory, name)[:size]

    embeddings, importance = column("embeddings"), column("importance")
    age = (now - column("created_at")).float()
    eligible = (column("valid_from") <= now) & (now < column("valid_until"))
    probe = query.to(embeddings.device, torch.float32).unsqueeze(0)  # (1, D)
    terms = memory.scorer.components(probe, embeddings, age, importance)
    scores = memory.scorer(probe, embeddings, age, importance, mask=eligible)[0]
    top = memory.retrieve(probe, now=now, k=k).ids[0] if size else torch.zeros(0, dtype=torch.int64)
    positions, query_position = circle_positions(embeddings.cpu(), probe[0].cpu())
    w_sim, w_rec, w_imp = (float(w) for w in memory.scorer.weights)
    return Landscape(column("ids").cpu(), positions, query_position, terms.similarity[0].cpu(),
                     terms.recency[0].cpu(), importance.cpu(), scores.cpu(), eligible.cpu(), top[top >= 0].cpu(),
                     (w_sim, w_rec, w_imp), float(memory.scorer.tau))


def landscape_figure(memory: EpisodicMemory, query: Tensor, now: float, *, k: int = 5,
                     title: str | None = None) -> Any:
    r"""The memory's retrieval landscape for one query at time ``now``, as two panels.

    The score is the memory's own, ``w_sim cos(q, m) + w_rec exp(-(now - t_m) / tau) + w_imp i_m``
    with its scorer's weights and tau. Point size encodes importance and colour the score; both
    panels share one colour scale. The right panel's shading is the plane
    ``w_sim x + w_rec y + w_imp \bar{i}`` (``\bar{i}`` the mean importance of the memories valid
    now), so a point sits above or below its shading by ``w_imp (i_m - \bar{i})``. Memories not
    valid at ``now`` are drawn hollow and grey.

    Args:
        memory: the store to draw.
        query: (D,) the query.
        now: the current time in seconds.
        k: how many retrieved memories to ring. Default: 5.
        title: the figure's title. Default: ``'retrieval landscape'``.

    Returns:
        a ``matplotlib.figure.Figure`` whose panels are labelled ``'embedding circle'`` and
        ``'score space'`` (the caller closes it, or hands it to ``SummaryWriter.add_figure``).

    Example (the data it draws, :func:`landscape`, has a doctest that needs no matplotlib)::

        figure = landscape_figure(memory, query, now=120.0, k=5)
        figure.savefig("landscape.png", dpi=110)
        SummaryWriter("runs").add_figure("landscape", figure, step)
    """
    data = landscape(memory, query, now, k=k)
    _matplotlib()
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    w_sim, w_rec, w_imp = data.weights
    ok = data.eligible.numpy()
    mean_importance = float(data.importance[data.eligible].mean()) if ok.any() else 0.0
    top_rows = [int((data.ids == i).nonzero()[0, 0]) for i in data.top_ids]
    recency_top = max(1.0, float(data.recency.max()) if len(data.ids) else 1.0)
    floor, ceiling = -w_sim + w_imp * mean_importance, w_sim + w_rec * recency_top + w_imp * mean_importance
    if ok.any():
        floor, ceiling = min(floor, float(data.scores[data.eligible].min())), max(ceiling, float(data.scores.max()))
    norm = Normalize(floor, ceiling)
    sizes = (18 + 160 * data.importance).numpy()

    figure = Figure(figsize=(13.5, 6.2), layout="constrained")
    circle, plane = figure.subplots(1, 2, width_ratios=[1, 1.25])
    circle.set_label("embedding circle")
    plane.set_label("score space")
    figure.suptitle(f"{title or 'retrieval landscape'}\n"
                    f"score = {w_sim:.2f}·cos(q, m) + {w_rec:.2f}·exp(−age / {data.tau:g} s) + {w_imp:.2f}·importance"
                    f"   ·   t = {now:g} s, {len(data.ids)} memories ({int(ok.sum())} valid)", fontsize=11)

    # left: the embedding circle
    angle = np.linspace(0, 2 * np.pi, 361)
    circle.plot(np.cos(angle), np.sin(angle), color="0.75", lw=1, zorder=0)
    circle.axhline(0, color="0.9", lw=0.8, zorder=0)
    circle.axvline(0, color="0.9", lw=0.8, zorder=0)
    xy = data.positions.numpy()
    if not ok.all():
        circle.scatter(xy[~ok, 0], xy[~ok, 1], s=sizes[~ok], facecolors="none", edgecolors="0.6",
                       label="not valid now")
    points = circle.scatter(xy[ok, 0], xy[ok, 1], c=data.scores[data.eligible].numpy(), s=sizes[ok], cmap="viridis",
                            norm=norm, edgecolors="black", linewidths=0.4, alpha=0.9, zorder=2)
    circle.scatter(xy[top_rows, 0], xy[top_rows, 1], s=sizes[top_rows] + 140, facecolors="none", edgecolors=_RING,
                   linewidths=2.2, zorder=3, gid="top_k", label=f"top-{k} retrieved")
    qx, qy = data.query_position.tolist()
    circle.annotate("", (qx, qy), (0, 0), arrowprops={"arrowstyle": "-|>", "color": "crimson", "lw": 1.8})
    circle.scatter([qx], [qy], marker="*", s=320, color="crimson", edgecolors="white", zorder=4, label="query")
    circle.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xticks=[], yticks=[],
               title="embedding circle" + (" (unit embeddings)" if memory.dim == 2 else
                                           f" (PCA of D = {memory.dim} onto the circle)"))
    circle.legend(loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=3, fontsize=9, frameon=False)
    figure.colorbar(points, ax=circle, label="score", shrink=0.8)

    # right: the score-space plane
    grid_x, grid_y = np.meshgrid(np.linspace(-1, 1, 201), np.linspace(0, recency_top, 101))
    shade = w_sim * grid_x + w_rec * grid_y + w_imp * mean_importance
    background = plane.imshow(shade, extent=(-1, 1, 0, recency_top), origin="lower", aspect="auto", cmap="viridis",
                              norm=norm, alpha=0.55, zorder=0)
    contours = plane.contour(grid_x, grid_y, shade, levels=6, colors="white", linewidths=0.7, alpha=0.8)
    plane.clabel(contours, fontsize=7, fmt="%.2f")
    sim, rec = data.similarity.numpy(), data.recency.numpy()
    plane.scatter(sim[~ok], rec[~ok], s=sizes[~ok], facecolors="none", edgecolors="0.5")
    plane.scatter(sim[ok], rec[ok], c=data.scores[data.eligible].numpy(), s=sizes[ok], cmap="viridis", norm=norm,
                  edgecolors="black", linewidths=0.5, zorder=2)
    plane.scatter(sim[top_rows], rec[top_rows], s=sizes[top_rows] + 140, facecolors="none", edgecolors=_RING,
                  linewidths=2.2, zorder=3, gid="top_k")
    _label_top(plane, sim[top_rows], rec[top_rows], data.top_ids.tolist(),
               data.scores[top_rows].tolist(), recency_top)
    plane.axvline(1.0, color="0.6", lw=0.8, zorder=1)
    plane.set(xlim=(-1.03, 1.55), ylim=(-0.04, recency_top + 0.04), xticks=np.linspace(-1, 1, 9),
              xlabel="similarity  cos(q, m)",
              ylabel=f"recency  exp(−age / {data.tau:g} s)",
              title=f"score space (shading at mean importance {mean_importance:.2f}; size = importance)")
    figure.colorbar(background, ax=plane, label="score at mean importance", shrink=0.8)
    return figure


def landscape_image(figure: Any) -> np.ndarray:
    """A figure drawn to an (H, W, 3) uint8 RGB array (for ``SummaryWriter.add_image``, HWC)."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _matplotlib() -> None:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("gae.viz draws with matplotlib, which is not installed: pip install gae-torch[viz]") from None
    matplotlib.use("Agg")


def _label_top(axes: Any, x: np.ndarray, y: np.ndarray, ids: list[int], scores: list[float], top: float) -> None:
    """Label the ringed points in a column right of cos = 1 (where no point can be), spread apart."""
    order = np.argsort(-y)  # top of the plane first, so leader lines do not cross
    placed = np.clip(y[order], 0.03, top - 0.03)
    gap = min(_LABEL_GAP, (top - 0.06) / max(len(placed) - 1, 1))  # a large k: pack them closer
    for i in range(1, len(placed)):  # walk down, keeping at least one gap from the label above
        placed[i] = min(placed[i], placed[i - 1] - gap)
    for i in reversed(range(len(placed))):  # then up from the floor, for those pushed off the bottom
        placed[i] = max(placed[i], 0.03 if i == len(placed) - 1 else placed[i + 1] + gap)
    for row, text_y in zip(order, placed, strict=True):
        axes.annotate(f"{row + 1}. #{ids[row]}  {scores[row]:.2f}", (x[row], y[row]), (_LABEL_COLUMN, text_y),
                      ha="left", va="center", fontsize=8, zorder=5,
                      bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": _RING, "alpha": 0.9},
                      arrowprops={"arrowstyle": "-", "color": "0.3", "lw": 0.7, "shrinkB": 7})
