"""Judges beside the prototypes (gae/judgment/judges, gae/judgment/trust.py): each kernel held
to its torch reference, the single-decision path to the batched one, the state generic (undo,
forget, growth, state_dict, migration), bad options refused, the gradient path intact."""

from __future__ import annotations

import math

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment import judges, trust
from gae.models.base import INCORRECT

JUDGES = {"gauss": {}, "lda": {"refresh": 3}, "gauss_short": {"kind": "gauss", "rate_floor": 0.05},
          "lda_short": {"kind": "lda", "rate_floor": 0.02, "shrinkage": 0.5}, "bins": {"bins": 8},
          "bins_short": {"kind": "bins", "rate_floor": 0.05, "reach": 1.5}}
LVQ = JudgmentConfig.recommended().replace(judges=None)  # the recommended prototypes alone, no judges
CONFIGS = {"lvq": JudgmentConfig.recommended().replace(judges=JUDGES),
           "gated": JudgmentConfig.seed().replace(judges=JUDGES, prototypes=2)}
N, K = 240, 4


def stream(seed: int, n: int = N, n_categories: int = 2, n_actions: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, K, generator=g)
    category = torch.randint(0, n_categories, (n,), generator=g)
    action = ((x[:, 0] + 0.5 * x[:, 1] + 0.3 * category) * n_actions / 1.8).long().clamp(max=n_actions - 1)
    skip = torch.rand(n, generator=g) < 0.1
    return x, category, action, skip


def judge_buffers(memory: JudgmentMemory) -> dict[str, torch.Tensor]:
    return {name: b.clone() for name, b in memory.named_buffers() if name.startswith(("judge_", "trust_"))}


def assert_buffers_close(one: JudgmentMemory, other: JudgmentMemory, atol: float = 1e-5) -> None:
    mine, theirs = dict(one.named_buffers()), dict(other.named_buffers())
    assert mine.keys() == theirs.keys()
    for name, tensor in mine.items():
        if tensor.dtype.is_floating_point:
            assert torch.allclose(tensor, theirs[name], rtol=1e-5, atol=atol), name
        else:
            assert torch.equal(tensor, theirs[name]), name


@pytest.mark.parametrize("mode", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_matches_reference(mode, seed):
    x, category, action, skip = stream(seed)
    steps = {}
    memories = {}
    for backend in ("reference", "compiled"):
        memory = JudgmentMemory(2, 3, K, CONFIGS[mode])
        memory.backend = backend
        steps[backend] = memory.prequential_(x, category, action, skip=skip)
        memories[backend] = memory
    assert_buffers_close(memories["reference"], memories["compiled"])
    ref, fast = steps["reference"], steps["compiled"]
    assert torch.allclose(ref.output.probs, fast.output.probs, atol=1e-5)
    assert torch.allclose(ref.votes, fast.votes, atol=1e-5)
    assert torch.equal(ref.output.action, fast.output.action)
    assert torch.equal(ref.own.action, fast.own.action)  # the prototypes' own answer, bit for bit as ever


def test_judge_kernels_match_reference_one_decision_at_a_time():
    """Each kind's kernel log_scores and learn, called directly, against its torch reference."""
    from gae.judgment import judged
    x, category, action, _ = stream(3, n=60)
    for judge in judges.parse(JUDGES):
        layout = judges.layout((judge,), 2, 3, K)
        ref = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in layout.items()}
        fast = {name: t.clone() for name, t in ref.items()}
        kernel = judged.kernel_of(judge.kind)
        for b in range(x.shape[0]):
            c, a = int(category[b]), int(action[b])
            expected = judges.log_scores(judge, x[b:b + 1], category[b:b + 1], ref)[0]
            got = torch.empty(3)
            arrays = [t.numpy() for t in judges.state_of(judge, fast).values()]
            kernel.log_scores(x[b].numpy(), c, *arrays, *judge.options.params(), got.numpy())
            assert torch.equal(torch.isfinite(expected), torch.isfinite(got))
            finite = torch.isfinite(expected)
            assert torch.allclose(expected[finite], got[finite], rtol=1e-5, atol=1e-4), (judge.name, b)
            judges.learn(judge, x[b], c, a, ref)
            kernel.learn(x[b].numpy(), c, a, *arrays, *judge.options.params())
        for name in ref:
            assert torch.allclose(ref[name].float(), fast[name].float(), rtol=1e-5, atol=1e-6), (judge.name, name)


def test_gauss_is_naive_bayes_written_out():
    """With rate_floor=0 the gauss judge's statistics are each action's plain mean and population
    variance, and its score the Gaussian log-likelihood plus the log prior, computed here from scratch."""
    x, _, action, _ = stream(4, n=120, n_categories=1)
    memory = JudgmentMemory(1, 3, K, JudgmentConfig.recommended().replace(judges={"gauss": {"prior": 0.5}}))
    memory.prequential_(x, torch.zeros(120, dtype=torch.long), action)
    query = torch.rand(5, K, generator=torch.Generator().manual_seed(9))
    total_var = x.double().var(0, unbiased=False)
    expected = []
    for a in range(3):
        rows = x[action == a].double()
        n = rows.shape[0]
        assert torch.allclose(memory.judge_gauss_means[0, a].double(), rows.mean(0), atol=1e-5)
        assert torch.allclose(memory.judge_gauss_variances[0, a].double(), rows.var(0, unbiased=False), atol=1e-5)
        spread = (n * rows.var(0, unbiased=False) + 0.5 * total_var) / (n + 0.5)  # no floor: every criterion varied
        ll = -(0.5 * torch.log(2 * math.pi * spread) + (query.double() - rows.mean(0)) ** 2 / (2 * spread)).sum(-1)
        expected.append(ll + math.log(n / 120))
    expected = torch.stack(expected, -1)
    got = judges.log_scores(judges.parse({"gauss": {"prior": 0.5}})[0], query, torch.zeros(5, dtype=torch.long),
                            dict(memory.named_buffers()))
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-3)


def test_lda_precision_is_the_shrunk_covariance_inverted():
    x, _, action, _ = stream(5, n=64, n_categories=1)
    config = JudgmentConfig.recommended().replace(judges={"lda": {"shrinkage": 0.3, "refresh": 8}})
    memory = JudgmentMemory(1, 3, K, config)
    memory.prequential_(x, torch.zeros(64, dtype=torch.long), action)  # 64: a refresh on the last decision
    s = memory.judge_lda_covariance[0].double()
    # the ridge: 1e-3 of each criterion's total variance, within the actions (s's diagonal) plus between their means
    n, means = memory.judge_lda_weights[0].double(), memory.judge_lda_means[0].double()
    between = (n[:, None] * (means - (n[:, None] * means).sum(0) / n.sum()) ** 2).sum(0) / n.sum()
    sigma = 0.7 * s + torch.diag(0.3 * torch.diagonal(s) + 1e-3 * (torch.diagonal(s) + between))
    assert torch.allclose(memory.judge_lda_precision[0].double(), torch.linalg.inv(sigma), rtol=1e-4)
    for a in range(3):
        assert torch.allclose(memory.judge_lda_means[0, a], x[action == a].mean(0), atol=1e-5)


def test_bins_is_naive_bayes_over_bins_of_each_criterions_spread_written_out():
    """With rate_floor=0 the bins judge's histograms count each action's decisions per bin, each put
    in its bin under the running mean and variance after it (recomputed here from scratch), and its
    score is the log prior plus each criterion's smoothed log bin probability."""
    x, _, action, _ = stream(6, n=150, n_categories=1)
    options = {"bins": 6, "reach": 1.5, "prior": 0.5}
    memory = JudgmentMemory(1, 3, K, JudgmentConfig.recommended().replace(judges={"bins": options}))
    memory.prequential_(x, torch.zeros(150, dtype=torch.long), action)
    counts = torch.zeros(3, K, 6, dtype=torch.float64)
    for i in range(150):
        seen = x[:i + 1].double()
        z = (x[i].double() - seen.mean(0)) / seen.var(0, unbiased=False).sqrt()
        b = torch.floor((z + 1.5) * 6 / 3.0).clamp(0, 5).long() if i else torch.full((K,), 3)
        counts[action[i], torch.arange(K), b] += 1
    assert torch.allclose(memory.judge_bins_counts[0].double(), counts)  # (a value on an edge would tip; none here)
    query = torch.rand(4, K, generator=torch.Generator().manual_seed(10))
    z = (query.double() - x.double().mean(0)) / x.double().var(0, unbiased=False).sqrt()
    b = torch.floor((z + 1.5) * 6 / 3.0).clamp(0, 5).long()  # (4, K)
    n = torch.bincount(action, minlength=3).double()
    expected = torch.log(n / 150)[None] + torch.stack(
        [torch.log((counts[a, torch.arange(K), b] + 0.5) / (n[a] + 3.0)).sum(-1) for a in range(3)], -1)
    got = judges.log_scores(judges.parse({"bins": options})[0], query, torch.zeros(4, dtype=torch.long),
                            dict(memory.named_buffers()))
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-3)


def test_explain_names_the_bins_that_decided():
    """A band rule on one criterion among three in very different units: the bins judge's thresholds
    name that criterion, a bin holding the query's value, in the user's units, for the right action."""
    g = torch.Generator().manual_seed(12)
    x = torch.rand(900, 3, generator=g) * torch.tensor([100.0, 1.0, 1e3])
    action = ((x[:, 0] > 40) & (x[:, 0] < 60)).long()
    memory = JudgmentMemory(["loan"], ["reject", "approve"], ["age", "noise", "salary"],
                            JudgmentConfig.recommended())
    memory.prequential_(x, torch.zeros(900, dtype=torch.long), action)
    for age, expected in ((50.0, "approve"), (20.0, "reject"), (75.0, "reject")):
        why = memory.explain([age, 0.5, 300.0], "loan")
        first = why.thresholds[0][0]
        assert (first.judge, first.factor, first.action, first.rival) == ("bins", "age", expected,
                                                                         {"approve": "reject"}.get(expected, "approve"))
        assert first.low <= age < first.high and first.nats > 1.0
        assert all(t.nats > 0 for t in why.thresholds[0])
        assert str(first) in str(why)
    assert memory.explain(x[:3], torch.zeros(3, dtype=torch.long)).thresholds[2] is not None
    assert JudgmentMemory(1, 2, 3, JudgmentConfig.recommended().replace(judges={"lda": {}})).explain(
        [0.1, 0.2, 0.3], 0).thresholds == ((),)


@pytest.mark.parametrize("mode", CONFIGS)
def test_single_decision_path_matches_batched(mode):
    x, category, action, skip = stream(6, n=150)
    batched = JudgmentMemory(2, 3, K, CONFIGS[mode])
    step = batched.prequential_(x, category, action, skip=skip)
    single = JudgmentMemory(2, 3, K, CONFIGS[mode])
    for b in range(x.shape[0]):
        name, confidence = single.score_one(x[b].tolist(), int(category[b]))
        expected = int(step.output.action[b])
        assert name == (None if expected < 0 else expected) or name == f"{expected}" or \
            (name is not None and single.action_names.index(name) == expected)
        assert confidence == pytest.approx(float(step.output.confidence[b]), abs=1e-5)
        single.learn_one(x[b].tolist(), int(action[b]), int(category[b]), confirmed=None,
                         outcome=INCORRECT if skip[b] else None)
    assert_buffers_close(batched, single)


BENCH_JUDGES = {"gauss": {"kind": "gauss"}, "lda": {"kind": "lda"},
                "gauss_short": {"kind": "gauss", "rate_floor": 0.05}, "lda_short": {"kind": "lda", "rate_floor": 0.03},
                "bins": {"kind": "bins"}}


@pytest.mark.parametrize("chosen", [BENCH_JUDGES, {"lda": {"refresh": 3}}], ids=["four", "one"])
def test_fused_single_decision_call_is_bit_equal_to_the_per_judge_calls(chosen, monkeypatch):
    """The single-decision path's one compiled call for every judge (kernels/judges/fused.py)
    computes what one call per judge and one to mix compute: the same answers, votes and buffers,
    bit for bit."""
    from gae.judgment.judged import JudgeHost
    x, category, action, skip = stream(7, n=300)
    config = JudgmentConfig.recommended().replace(judges=chosen)
    answers = {}
    buffers = {}
    for one_call in (False, True):
        monkeypatch.setattr(JudgeHost, "one_call", one_call)
        memory = JudgmentMemory(2, 3, K, config)
        got = []
        for b in range(x.shape[0]):
            got.append(memory.score_one(x[b].tolist(), int(category[b])))
            memory.learn_one(x[b].tolist(), int(action[b]), int(category[b]), confirmed=None,
                             outcome=INCORRECT if skip[b] else None)
        answers[one_call] = got
        buffers[one_call] = judge_buffers(memory)
        assert (memory._judge_host.fused_call is not None) is one_call  # the route taken
    assert answers[True] == answers[False]
    assert buffers[True].keys() == buffers[False].keys() and "trust_weights" in buffers[True]
    for name, tensor in buffers[True].items():
        assert torch.equal(tensor, buffers[False][name]), name
    assert float(buffers[True]["trust_weights"].sum()) > 0  # the trust learned


@pytest.mark.parametrize("concept", ["linear", "noisy prototypes"])
def test_the_mixture_judges_about_as_well_as_its_best_judge(concept):
    """On a linear concept and on noisy prototypes with irrelevant criteria (the geometries of the
    shared covariance and of naive Bayes), the mixture answers within a point of its best judge
    and clearly better than the prototypes alone."""
    g = torch.Generator().manual_seed(11)
    if concept == "linear":
        n_factors, n_actions = 6, 2
        x = torch.rand(1500, n_factors, generator=g)
        # a boundary across every criterion: a few prototypes tile it coarsely, one shared covariance fits it
        action = (x @ torch.tensor([1.0, -1.0, 0.5, 0.8, -0.6, 0.3]) > 0.5).long()
    else:
        n_factors, n_actions = 12, 3
        action = torch.randint(0, n_actions, (1500,), generator=g)
        centers = torch.rand(n_actions, n_factors, generator=g) * torch.cat([torch.ones(3), torch.zeros(9)])
        x = centers[action] + 0.25 * torch.randn(1500, n_factors, generator=g)
    config = JudgmentConfig.recommended().replace(judges={"gauss": {}, "lda": {}})
    memory = JudgmentMemory(1, n_actions, n_factors, config)
    step = memory.prequential_(x, torch.zeros(1500, dtype=torch.long), action)
    assert memory.judge_names() == ("prototypes", "gauss", "lda")
    assert float(memory.trust()[0].sum()) == pytest.approx(1.0)
    late = slice(500, None)
    accuracy = float((step.output.action[late] == action[late]).float().mean())
    judged = [float((step.votes[late, j].argmax(-1) == action[late]).float().mean()) for j in range(3)]
    assert judged[0] == float((step.own.action[late] == action[late]).float().mean())
    assert accuracy >= max(judged) - 0.01
    assert accuracy >= judged[0] + 0.02


def test_fixed_share_keeps_every_judge_in_reach():
    weights = torch.zeros(1, 3)
    vote = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    for _ in range(200):  # judge 1 is wrong every time
        trust.trust_step(vote, 0, 0, weights, rate=0.5, share=0.02, floor=0.05)
    assert float(weights[0, 1]) >= 0.02 / 3 - 1e-7
    assert float(weights[0].sum()) == pytest.approx(1.0)
    for _ in range(60):  # the concept flips: judge 1 is right now, and comes back
        trust.trust_step(vote, 0, 1, weights, rate=0.5, share=0.02, floor=0.05)
    assert int(weights[0].argmax()) == 1


@pytest.mark.parametrize("mode", CONFIGS)
def test_undo_and_forget_replay_the_judges(mode):
    x, category, action, _ = stream(7, n=100)
    memory = JudgmentMemory(2, 3, K, CONFIGS[mode])
    memory.prequential_(x, category, action)
    memory.undo_(10)
    shorter = JudgmentMemory(2, 3, K, CONFIGS[mode])
    shorter.prequential_(x[:90], category[:90], action[:90])
    assert_buffers_close(memory, shorter)
    memory.forget_([3, 40])
    keep = torch.ones(90, dtype=torch.bool)
    keep[[3, 40]] = False
    without = JudgmentMemory(2, 3, K, CONFIGS[mode])
    without.prequential_(x[:90][keep], category[:90][keep], action[:90][keep])
    assert_buffers_close(memory, without)


def test_growth_equals_a_memory_built_with_every_name():
    x, category, action, _ = stream(8, n=120)
    names = (["c0", "c1"], ["a0", "a1", "a2"])
    grown = JudgmentMemory(["c0"], ["a0"], K, CONFIGS["lvq"], grow=True)
    full = JudgmentMemory(*names, K, CONFIGS["lvq"])
    for b in range(120):
        row, a, c = x[b].tolist(), names[1][int(action[b])], names[0][int(category[b])]
        grown.learn_one(row, a, c, confirmed=None)
        full.learn_one(row, a, c, confirmed=None)
    order = [grown.action_names.index(a) for a in names[1]]
    assert list(grown.category_names) == names[0]
    assert order == [0, 1, 2] or sorted(order) == [0, 1, 2]
    if order == [0, 1, 2]:
        assert_buffers_close(grown, full)


def test_state_dict_round_trip_and_refusals(tmp_path):
    x, category, action, _ = stream(9, n=80)
    memory = JudgmentMemory(2, 3, K, CONFIGS["lvq"])
    memory.prequential_(x, category, action)
    path = tmp_path / "judges.pt"
    torch.save(memory.state_dict(), path)
    loaded = JudgmentMemory(2, 3, K, CONFIGS["lvq"])
    loaded.load_state_dict(torch.load(path, weights_only=True))
    assert_buffers_close(memory, loaded, atol=0.0)
    query = torch.rand(7, K)
    assert torch.equal(memory(query, torch.ones(7, dtype=torch.long)).probs,
                       loaded(query, torch.ones(7, dtype=torch.long)).probs)
    other = JudgmentMemory(2, 3, K, JudgmentConfig.recommended().replace(judges={"gauss": {}}))
    with pytest.raises(ValueError, match="judges"):
        other.load_state_dict(torch.load(path, weights_only=True))
    plain = JudgmentMemory(2, 3, K, LVQ)
    with pytest.raises(ValueError, match="judges"):
        plain.load_state_dict(torch.load(path, weights_only=True))


def test_a_state_of_layout_3_loads_without_trust():
    memory = JudgmentMemory(2, 3, K, LVQ)
    x, category, action, _ = stream(10, n=50)
    memory.prequential_(x, category, action)
    state = memory.state_dict()
    del state["trust_weights"]
    state._metadata[""]["version"] = 3  # type: ignore[attr-defined]
    fresh = JudgmentMemory(2, 3, K, LVQ)
    fresh.load_state_dict(state)
    assert fresh.trust_weights.shape == (0, 0)
    assert torch.equal(fresh.centroids, memory.centroids)


@pytest.mark.parametrize("judges_option, error, words", [
    ({"gauss": {"prio": 1.0}}, TypeError, "no option(s) ['prio']"),
    ({"x": {"kind": "forest"}}, ValueError, "unknown kind 'forest'"),
    ({"gauss": {"prior": -1}}, ValueError, "judges['gauss']: prior"),
    ({"bins": {"reach": 1e-300}}, ValueError, "judges['bins']: reach must be in [0.001, 1000.0], got 1e-300"),
    ({"bins": {"prior": 1e38}}, ValueError, "judges['bins']: prior must be in [1e-06, 1000000.0], got 1e+38"),
    ({"bins": {"bins": 1}}, ValueError, "judges['bins']: bins must be >= 2, got 1"),
    ({"lda": {"refresh": 0}}, ValueError, "refresh"),
    ({"Bad Name": {}}, ValueError, "judge name"),
    ({"prototypes": {"kind": "gauss"}}, ValueError, "prototypes"),
    (["gauss"], TypeError, "mapping"),
])
def test_bad_judges_are_refused(judges_option, error, words):
    with pytest.raises(error) as raised:
        JudgmentConfig(judges=judges_option)
    assert words in str(raised.value)


@pytest.mark.parametrize("option, value", [("trust_rate", -1.0), ("trust_share", 1.5), ("trust_floor", 0.0),
                                           ("trust_rate", math.nan), ("trust_share", 0.0)])
def test_bad_trust_options_are_refused(option, value):
    with pytest.raises(ValueError, match=option):
        JudgmentConfig(**{option: value})


def test_config_round_trips_with_judges():
    config = CONFIGS["lvq"]
    again = JudgmentConfig.from_dict(config.to_dict())
    assert again == config and hash(again) == hash(config)
    assert config.to_dict()["judges"]["gauss_short"] == {"kind": "gauss", "rate_floor": 0.05, "prior": 1.0}


def test_gradient_reaches_the_factors_and_the_attention():
    x, category, action, _ = stream(12, n=80)
    memory = JudgmentMemory(2, 3, K, CONFIGS["lvq"])
    step = memory.prequential_(x, category, action)
    query = torch.rand(6, K, requires_grad=True)
    out = memory(query, torch.zeros(6, dtype=torch.long))
    out.probs[:, 0].sum().backward()
    assert query.grad is not None and torch.isfinite(query.grad).all() and query.grad.abs().sum() > 0
    loss = memory.attention_loss(step, category, action)
    assert loss is not None and torch.isfinite(loss)
    loss.backward()
    assert memory.criterion_logits.grad is not None and torch.isfinite(memory.criterion_logits.grad).all()
    with torch.no_grad():
        fast = memory(query, torch.zeros(6, dtype=torch.long))
    assert torch.allclose(fast.probs, out.probs.detach(), atol=1e-5)


def test_a_harsh_trust_never_divides_by_zero():
    """A large trust_rate with the smallest share and floor: the losers' factors underflow, the
    share keeps every weight positive, and learning goes on finite through both paths."""
    config = JudgmentConfig.recommended().replace(judges={"gauss": {}}, trust_rate=1e6, trust_share=1e-30,
                                                  trust_floor=1e-30)
    x, category, action, _ = stream(13, n=80, n_categories=1, n_actions=2)
    batched = JudgmentMemory(1, 2, K, config)
    batched.prequential_(x, category, action)
    single = JudgmentMemory(1, 2, K, config)
    for b in range(80):
        single.learn_one(x[b].tolist(), int(action[b]), 0, confirmed=None)
    for memory in (batched, single):
        assert torch.isfinite(memory.trust_weights).all() and (memory.trust_weights > 0).all()
    assert_buffers_close(batched, single)


@pytest.mark.parametrize("mode", CONFIGS)
def test_explain_shows_each_judge_its_vote_and_trust_and_the_deciding_prototype(mode):
    x, category, action, skip = stream(7)
    memory = JudgmentMemory(2, 3, K, CONFIGS[mode])
    memory.prequential_(x, category, action, skip=skip)
    query, where = torch.rand(6, K, generator=torch.Generator().manual_seed(8)), torch.tensor([0, 1, 0, 1, 0, 1])
    why = memory.explain(query, where)
    with torch.no_grad():
        answer = memory(query, where)
    assert why.judge_names == memory.judge_names() == ("prototypes", *JUDGES)
    assert why.votes.shape == (6, 1 + len(JUDGES), 3) and why.trust.shape == (6, 1 + len(JUDGES))
    assert torch.equal(why.trust, memory.trust()[where])  # the category's weights, rows summing to 1
    assert torch.allclose(why.trust.sum(-1), torch.ones(6))
    assert torch.allclose(why.probs, trust.mixture(why.votes, why.trust), atol=1e-6)  # the answer is their mixture
    assert torch.allclose(why.probs, answer.probs, atol=1e-6) and torch.equal(why.action, answer.action)
    # judge 0 is the prototypes: its vote is the softmax of their logits, and the rest of the explanation is theirs
    own = torch.where(torch.isfinite(why.distance), -why.distance / memory.config.tau, -math.inf).softmax(-1)
    assert torch.allclose(why.votes[:, 0], own, atol=1e-5)
    assert torch.equal(why.prototypes_action, own.argmax(-1))
    deciding = why.nearest.gather(1, why.prototypes_action[:, None]).squeeze(1)
    assert (deciding >= 0).all()  # the prototype that decided the prototypes' vote
    text = str(why)
    for name in ("judge", "trust", "mixture", *JUDGES):
        assert name in text
    assert f"the mixture of {1 + len(JUDGES)} judges" in text and "the prototypes recommend" in text


def test_explain_without_judges_is_the_prototypes_alone():
    x, category, action, skip = stream(9)
    memory = JudgmentMemory(2, 3, K, LVQ)
    memory.prequential_(x, category, action, skip=skip)
    why = memory.explain(x[:5], category[:5])
    assert why.judge_names == ("prototypes",) and torch.equal(why.trust, torch.ones(5, 1))
    assert torch.equal(why.votes[:, 0], why.probs) and torch.equal(why.prototypes_action, why.action)
    assert "mixture" not in str(why) and "the prototypes recommend" not in str(why)


def test_a_judge_buffer_of_another_dtype_takes_the_checked_path():
    x, category, action, _ = stream(12, n=60)
    memory, reference = JudgmentMemory(2, 3, K, CONFIGS["lvq"]), JudgmentMemory(2, 3, K, CONFIGS["lvq"])
    for m in (memory, reference):
        m.prequential_(x, category, action)
    assert memory.score_one(x[0].tolist(), 0) == reference.score_one(x[0].tolist(), 0)  # the views are built
    memory.judge_gauss_means = memory.judge_gauss_means.double()  # the kernels read float32: not this one
    assert memory._judge_host.get(memory._buffers) is None  # not viewed as float32 bytes: the checked path
    (mine, confidence), (theirs, expected) = memory.score_one(x[1].tolist(), 1), reference.score_one(x[1].tolist(), 1)
    assert mine == theirs and confidence == pytest.approx(expected, abs=1e-5)


def test_an_interrupted_build_of_the_judges_views_changes_nothing_and_is_built_again(monkeypatch):
    from gae.judgment import judged as online_judges

    x, category, action, _ = stream(13, n=40)
    memory, reference = JudgmentMemory(2, 3, K, CONFIGS["lvq"]), JudgmentMemory(2, 3, K, CONFIGS["lvq"])
    real, calls = online_judges.entry_point, []

    def interrupted(*args):
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt  # as Ctrl-C while numba compiles or loads the kernel
        return real(*args)

    monkeypatch.setattr(online_judges, "entry_point", interrupted)
    before = {name: t.clone() for name, t in memory.state_dict().items() if isinstance(t, torch.Tensor)}
    with pytest.raises(KeyboardInterrupt):
        memory.learn_one(x[0].tolist(), int(action[0]), int(category[0]))
    after = memory.state_dict()
    assert all(torch.equal(tensor, after[name]) for name, tensor in before.items())  # nothing learned
    for b in range(x.shape[0]):  # and then it learns as a memory never interrupted
        for m in (memory, reference):
            m.learn_one(x[b].tolist(), int(action[b]), int(category[b]))
    assert_buffers_close(memory, reference, atol=0.0)


def test_lda_keeps_a_criterion_that_separates_the_actions_perfectly():
    """A criterion constant within each action but not across them has no within-action variance; its
    total variance keeps it in the precision (its ridge), and lda votes by it."""
    g = torch.Generator().manual_seed(13)
    action = torch.randint(0, 2, (300,), generator=g)
    x = torch.rand(300, 3, generator=g)
    x[:, 0] = action.float()  # the whole concept
    memory = JudgmentMemory(1, 2, 3, JudgmentConfig.recommended().replace(judges={"lda": {}}))
    step = memory.prequential_(x, torch.zeros(300, dtype=torch.long), action)
    assert float(memory.judge_lda_covariance[0, 0, 0]) == 0.0 and float(memory.judge_lda_precision[0, 0, 0]) > 0
    assert float((step.votes[50:, 1].argmax(-1) == action[50:]).float().mean()) == 1.0


def test_a_tiny_gauss_prior_never_divides_by_zero():
    """prior x the category's variance may underflow to 0 where an action's own variance is 0: the spread
    is held at the smallest normal float32, so learning and scoring go on (the kernel raised
    ZeroDivisionError after the prototypes had learned)."""
    x = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 1.5], [1.0, 2.5]] * 5)
    action = torch.tensor([0, 0, 1, 1] * 5)
    memory = JudgmentMemory(1, 2, 2, JudgmentConfig.recommended().replace(judges={"gauss": {"prior": 1e-46}}))
    for row, a in zip(x.tolist(), action.tolist(), strict=True):
        memory.learn_one(row, a, 0)
    assert memory.score_one([0.0, 1.5], 0)[0] == "0"
    assert bool(torch.isfinite(memory(x, torch.zeros(20, dtype=torch.long)).probs).all())
