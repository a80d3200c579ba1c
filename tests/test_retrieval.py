"""RetrievalScorer and the chunked top_k against slow references (tests/episodic_reference.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as nnf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gae import RetrievalScorer
from gae.episodic.scorer import ScoreComponents, top_k
from tests.episodic_reference import cosine, score_matrix

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None)
WEIGHTS = [(0.60, 0.25, 0.15), (1.0, 0.0, 0.0), (0.3, 0.9, 0.7)]


def inputs(seed: int, n_queries: int, n: int, dim: int = 5):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n_queries, dim, generator=gen), 3.0 * torch.randn(n, dim, generator=gen),
            40.0 * torch.rand(n_queries, n, generator=gen), torch.rand(n, generator=gen),
            torch.rand(n_queries, n, generator=gen) < 0.7, gen)


# ---------------------------------------------------------------------------------------
# the score
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("tau", [15.0, 2.5])
def test_forward_matches_reference(weights, tau):
    scorer = RetrievalScorer(*weights, tau=tau)
    queries, embeddings, age, importance, mask, _ = inputs(0, 3, 11)
    cases = [(age[0], None), (age, None), (age[0], mask[0]), (age, mask), (age[1], mask)]
    for a, m in cases:
        got = scorer(queries, embeddings, a, importance, m)
        want = score_matrix(weights, tau, queries, embeddings, a, importance, m)
        assert got.shape == (3, 11)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
        if m is not None:
            assert torch.equal(torch.isinf(got), ~m.expand(3, 11))


def test_components_match_reference():
    scorer = RetrievalScorer(tau=7.0)
    queries, embeddings, age, importance, _, _ = inputs(1, 4, 6)
    shared = scorer.components(queries, embeddings, age[0], importance)
    assert isinstance(shared, ScoreComponents)
    assert shared.similarity.shape == (4, 6) and shared.recency.shape == (1, 6) and shared.importance.shape == (1, 6)
    cos = torch.tensor([[cosine(q, e) for e in embeddings.tolist()] for q in queries.tolist()], dtype=torch.float64)
    torch.testing.assert_close(shared.similarity.double(), cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(shared.recency.double()[0], torch.tensor([math.exp(-a / 7.0) for a in age[0].tolist()],
                                                                        dtype=torch.float64), rtol=1e-6, atol=0)
    assert torch.equal(shared.importance[0], importance)
    per_query = scorer.components(queries, embeddings, age, importance)
    assert per_query.recency.shape == (4, 6)
    torch.testing.assert_close(per_query.recency, torch.exp(-age / 7.0))


def test_scale_of_embeddings_does_not_matter():
    scorer = RetrievalScorer()
    queries, embeddings, age, importance, _, _ = inputs(2, 2, 5)
    torch.testing.assert_close(scorer(queries, embeddings, age[0], importance),
                               scorer(7.0 * queries, 0.01 * embeddings, age[0], importance))


def test_defaults_and_hourly():
    scorer = RetrievalScorer()
    torch.testing.assert_close(scorer.weights, torch.tensor([0.60, 0.25, 0.15]))
    assert float(scorer.tau) == 15.0
    hourly = RetrievalScorer.hourly()
    assert float(hourly.tau) == 3600.0
    torch.testing.assert_close(hourly.weights, scorer.weights)
    assert isinstance(RetrievalScorer.hourly(learnable=True).weights, torch.nn.Parameter)
    # an hour-old memory keeps exp(-1) of its recency under hourly, nothing under the 15 s default
    age, one = torch.tensor([3600.0]), torch.ones(1, 2)
    assert float(hourly.components(one, one, age, torch.zeros(1)).recency) == pytest.approx(math.exp(-1.0))
    assert float(scorer.components(one, one, age, torch.zeros(1)).recency) == pytest.approx(0.0, abs=1e-30)
    assert "tau=3600.0" in repr(hourly) and "w_sim=0.6" in repr(hourly) and "learnable=False" in repr(hourly)


# ---------------------------------------------------------------------------------------
# learnable weights
# ---------------------------------------------------------------------------------------
def test_learnable_weights_and_queries_receive_gradients():
    scorer = RetrievalScorer(learnable=True)
    assert [name for name, _ in scorer.named_parameters()] == ["weights"]
    queries, embeddings, age, importance, mask, _ = inputs(3, 3, 8)
    queries.requires_grad_(True)
    scorer(queries, embeddings, age, importance, mask).masked_fill(~mask, 0.0).sum().backward()
    assert scorer.weights.grad is not None and queries.grad is not None
    assert torch.isfinite(queries.grad).all() and queries.grad.abs().sum() > 0
    # d(sum of scores)/d(w) = sum of that component over the unmasked entries
    parts = scorer.components(queries.detach(), embeddings, age, importance)
    want = torch.stack([(part.expand(3, 8) * mask).sum() for part in parts])
    torch.testing.assert_close(scorer.weights.grad, want)


def test_fixed_weights_have_no_parameters_but_queries_still_get_gradients():
    scorer = RetrievalScorer(learnable=False)
    assert list(scorer.parameters()) == []
    assert "weights" in dict(scorer.named_buffers()) and "tau" in dict(scorer.named_buffers())
    queries, embeddings, age, importance, _, _ = inputs(4, 2, 4)
    queries.requires_grad_(True)
    scorer(queries, embeddings, age[0], importance).sum().backward()
    assert queries.grad is not None and queries.grad.abs().sum() > 0


def test_learning_moves_the_weights():
    scorer = RetrievalScorer(learnable=True)
    queries, embeddings, age, importance, _, _ = inputs(5, 2, 4)
    before = scorer.weights.detach().clone()
    optimizer = torch.optim.SGD(scorer.parameters(), lr=0.1)
    scorer(queries, embeddings, age, importance).sum().backward()
    optimizer.step()
    assert not torch.equal(scorer.weights.detach(), before)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"w_sim": -0.1}, ValueError, ["w_sim", "-0.1"]),
    ({"w_rec": float("nan")}, ValueError, ["w_rec", "nan"]),
    ({"w_imp": float("inf")}, ValueError, ["w_imp", "inf"]),
    ({"w_sim": "0.6"}, TypeError, ["w_sim", "'0.6'"]),
    ({"tau": 0.0}, ValueError, ["tau", "0.0"]),
    ({"tau": -15.0}, ValueError, ["tau", "-15.0"]),
    ({"tau": None}, TypeError, ["tau", "None"]),
])
def test_bad_hyperparameters(kwargs, error, words):
    with pytest.raises(error) as info:
        RetrievalScorer(**kwargs)
    assert all(word in str(info.value) for word in words), str(info.value)


# ---------------------------------------------------------------------------------------
# chunked top-k
# ---------------------------------------------------------------------------------------
def reference_top_k(scorer, queries, embeddings, bias, k, allowed):
    """Full (Q, N) matrix, mask, one torch.topk over it padded to k columns; -1 / -inf padding."""
    full = scorer.weights[0].item() * nnf.normalize(queries.double(), dim=-1) @ embeddings.double().T + bias.double()
    if allowed is not None:
        full = full.masked_fill(~allowed, float("-inf"))
    full = nnf.pad(full, (0, max(0, k - full.shape[1])), value=float("-inf"))
    scores, rows = full.topk(k, dim=1)
    return scores, rows.masked_fill(torch.isinf(scores), -1)


def assert_top_k_equal(got, want_scores, want_rows):
    scores, rows = got
    assert scores.shape == want_scores.shape and rows.shape == want_rows.shape and rows.dtype == torch.int64
    assert torch.equal(torch.isinf(scores), torch.isinf(want_scores))
    assert torch.equal(rows == -1, torch.isinf(scores))
    finite = torch.isfinite(want_scores)
    torch.testing.assert_close(scores.double()[finite], want_scores[finite], rtol=0, atol=1e-5)
    assert torch.equal(rows, want_rows)
    assert (scores[:, :-1] >= scores[:, 1:]).all(), "not sorted best first"


@FAST
@given(seed=st.integers(0, 2**16), n_queries=st.integers(1, 4), n=st.integers(0, 30), k=st.integers(1, 40),
       chunk=st.sampled_from([1, 3, 7, 64]), dropped=st.floats(0.0, 1.0), per_query=st.booleans(),
       weights=st.sampled_from(WEIGHTS))
@example(seed=0, n_queries=2, n=10, k=12, chunk=7, dropped=0.0, per_query=False, weights=WEIGHTS[0])  # k > n > chunk
@example(seed=1, n_queries=3, n=30, k=5, chunk=7, dropped=0.6, per_query=True, weights=WEIGHTS[2])
def test_top_k_chunked_matches_unchunked_reference(seed, n_queries, n, k, chunk, dropped, per_query, weights):
    scorer = RetrievalScorer(*weights)
    queries, _, _, _, _, gen = inputs(seed, n_queries, 0)
    embeddings = nnf.normalize(torch.randn(n, 5, generator=gen), dim=-1)
    bias = torch.rand(n, generator=gen).masked_fill(torch.rand(n, generator=gen) < dropped / 2, float("-inf"))
    allowed = torch.rand(n_queries, n, generator=gen) >= dropped / 2 if per_query else None
    got = top_k(scorer, queries, embeddings, bias, k, allowed, chunk=chunk)
    assert_top_k_equal(got, *reference_top_k(scorer, queries, embeddings, bias, k, allowed))


def test_top_k_pads_when_fewer_than_k_are_eligible():
    scorer = RetrievalScorer()
    queries, _, _, _, _, gen = inputs(6, 2, 0)
    embeddings = nnf.normalize(torch.randn(20, 5, generator=gen), dim=-1)
    bias = torch.zeros(20)
    bias[3::4] = float("-inf")  # 15 rows left, spread over every chunk of 7
    allowed = torch.zeros(2, 20, dtype=torch.bool)
    allowed[0, :] = True
    allowed[1, [0, 8, 19]] = True
    for k in (17, 25):  # merges cut back to k, and merges that never reach k
        got = top_k(scorer, queries, embeddings, bias, k, allowed, chunk=7)
        assert_top_k_equal(got, *reference_top_k(scorer, queries, embeddings, bias, k, allowed))
    assert (got.rows[0] >= 0).sum() == 15 and got.rows[1, :2].tolist() != [-1, -1]
    assert sorted(got.rows[1, :2].tolist()) == [0, 8] and (got.rows[1, 2:] == -1).all()  # row 19 has -inf bias


def test_top_k_of_nothing_is_all_padding():
    scores, rows = top_k(RetrievalScorer(), torch.randn(3, 4), torch.zeros(0, 4), torch.zeros(0), 5, chunk=7)
    assert rows.shape == (3, 5) and (rows == -1).all() and torch.isinf(scores).all()


def test_top_k_builds_no_graph():
    scorer = RetrievalScorer(learnable=True)
    queries = torch.randn(2, 4, requires_grad=True)
    scores, _ = top_k(scorer, queries, nnf.normalize(torch.randn(9, 4), dim=-1), torch.zeros(9), 3, chunk=7)
    assert not scores.requires_grad
