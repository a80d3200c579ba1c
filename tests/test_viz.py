"""The landscape figure: both panels draw, the right memories are ringed, the script writes its files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

for needed in ("matplotlib", "jsonargparse", "tensorboard"):  # the viz and train extras
    pytest.importorskip(needed)

from jsonargparse import auto_cli  # noqa: E402

from gae import EpisodicMemory  # noqa: E402
from gae.viz import _matplotlib, circle_positions, landscape, landscape_figure, landscape_image  # noqa: E402
from scripts.landscape import landscape as landscape_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PANELS = ("embedding circle", "score space")


def filled_memory(dim: int, n: int, *, expired: int = 0, seed: int = 0) -> EpisodicMemory:
    """``n`` memories formed over ``n`` seconds; the first ``expired`` stopped being valid at 1 s."""
    gen = torch.Generator().manual_seed(seed)
    memory = EpisodicMemory(dim, capacity=n)
    valid_until = torch.full((n,), float("inf"), dtype=torch.float64)
    valid_until[:expired] = 1.0
    memory.add(torch.randn(n, dim, generator=gen), torch.rand(n, generator=gen),
               created_at=torch.arange(n, dtype=torch.float64), valid_until=valid_until, now=float(n))
    return memory


def ringed(figure) -> list[int]:
    """How many memories each panel rings as retrieved."""
    panels = [axes for axes in figure.axes if axes.get_label() in PANELS]
    return [sum(len(c.get_offsets()) for c in axes.collections if c.get_gid() == "top_k") for axes in panels]


@pytest.mark.parametrize(("dim", "n", "expired", "k", "render"),
                         [(2, 12, 0, 5, True), (16, 20, 3, 5, True), (16, 6, 4, 5, False)])
def test_figure_has_two_panels_and_rings_the_retrieved(dim, n, expired, k, render):
    memory = filled_memory(dim, n, expired=expired)
    query = torch.randn(dim, generator=torch.Generator().manual_seed(1))
    figure = landscape_figure(memory, query, now=float(n), k=k, title="test")
    assert [axes.get_label() for axes in figure.axes if axes.get_label() in PANELS] == list(PANELS)
    assert ringed(figure) == [min(k, n - expired)] * 2
    if not render:
        return
    image = landscape_image(figure)
    assert image.dtype.name == "uint8" and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[0] > 300 and image.shape[1] > 600 and image.std() > 0


def test_landscape_scores_are_the_memory_retrieval_scores():
    memory = filled_memory(16, 20, expired=3)
    query = torch.randn(16, generator=torch.Generator().manual_seed(2))
    data = landscape(memory, query, now=20.0, k=4)
    found = memory.retrieve(query.unsqueeze(0), now=20.0, k=4)
    assert data.top_ids.tolist() == found.ids[0].tolist()
    rows = [int((data.ids == i).nonzero()[0, 0]) for i in data.top_ids]
    assert torch.allclose(data.scores[rows], found.scores[0], atol=1e-6)
    assert not data.eligible[:3].any() and torch.isinf(data.scores[:3]).all()
    assert torch.allclose(data.positions.norm(dim=1), torch.ones(20))
    assert data.weights == pytest.approx((0.60, 0.25, 0.15)) and data.tau == 15.0


def test_pca_of_two_dimensional_input_is_a_rotation_or_reflection():
    gen = torch.Generator().manual_seed(3)
    unit = torch.nn.functional.normalize(torch.randn(10, 2, generator=gen), dim=1)
    query = torch.nn.functional.normalize(torch.randn(2, generator=gen), dim=0)
    positions, query_position = circle_positions(unit, query, pca=True)
    assert torch.allclose(positions @ positions.T, unit @ unit.T, atol=1e-5)  # every angle kept
    assert torch.allclose(positions @ query_position, unit @ query, atol=1e-5)
    assert (query_position >= 0).all()  # signs fixed by the query
    direct, direct_query = circle_positions(unit, query)  # D = 2 draws the embeddings themselves
    assert torch.allclose(direct, unit)
    assert torch.allclose(direct_query, query)


def test_empty_memory_and_bad_query():
    memory = EpisodicMemory(8)
    assert ringed(landscape_figure(memory, torch.ones(8), now=0.0)) == [0, 0]
    with pytest.raises(ValueError, match=r"query must be a floating \(8,\) tensor, got \(1, 8\)"):
        landscape_figure(memory, torch.ones(1, 8), now=0.0)
    with pytest.raises(ValueError, match="floating"):
        landscape_figure(memory, torch.ones(8, dtype=torch.int64), now=0.0)
    with pytest.raises(ValueError, match="query must be finite"):
        landscape_figure(memory, torch.full((8,), float("nan")), now=0.0)


def test_missing_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install gae-torch\[viz\]"):
        _matplotlib()


def test_importing_gae_does_not_import_matplotlib():
    code = "import sys, gae; assert 'matplotlib' not in sys.modules and 'gae.viz' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_script_cli_writes_png_and_tensorboard(tmp_path, capsys):
    paths = auto_cli(landscape_script, args=["--seed", "1", "--events", "24", "--capacity", "8", "--snapshots", "2",
                                             "--k", "3", "--out", str(tmp_path)])
    assert paths["png"] == tmp_path / "landscape.png" and paths["png"].stat().st_size > 10_000
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    printed = capsys.readouterr().out
    assert "8 memories kept, 16 forgotten" in printed and str(tmp_path / "landscape.png") in printed
