"""Act or refer in the Decider: decide's ``refer`` and ``reasons`` (gae/decider/refer.py's Referral),
the calibrated threshold of ``Decider(memory, target_error=...)`` fed by verify, and what the
referral keeps: through the Decider's state_dict (and a checkpoint saved before the Decider), a
ledger's replay and restart, undo_ and forget_."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch

from gae import Decider, JudgmentConfig, JudgmentMemory, KNNMemory
from gae.decider.refer import NOVEL_AFTER, REASONS, RECENT, Referral, ReferralCalibrator, novel_bound
from gae.storage import SQLiteStore

ACTIONS = ["approve", "reject"]


def blobs(n: int, seed: int = 0, swap_after: int | None = None) -> list[tuple[np.ndarray, str]]:
    """Two well separated classes in two criteria; past ``swap_after`` the labels swap (a drift)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = int(rng.integers(2))
        row = rng.normal(size=2) * 0.5 + 3.0 * label
        if swap_after is not None and i >= swap_after:
            label = 1 - label
        out.append((row, ACTIONS[label]))
    return out


def feed(decider, stream, category="a", sources=False):
    decisions = []
    for i, (row, action) in enumerate(stream):
        decision = decider.decide(row, category, source_id=i if sources else None)
        decider.verify(decision.id, action)
        decisions.append(decision)
    return decisions


def recommended(**changes) -> JudgmentConfig:
    return JudgmentConfig.recommended().replace(**changes)


def served(config: JudgmentConfig | None = None, **options) -> Decider:
    """A Decider (``options`` its own: target_error, refer_confidence, refer_margin, a store ...) on a
    judgment memory of one category ``a`` and two criteria."""
    return Decider(JudgmentMemory(["a"], ACTIONS, 2, recommended() if config is None else config), **options)


# -- the reasons -------------------------------------------------------------------------------
def test_a_memory_with_no_opinion_refers_as_unseen_and_a_sure_one_acts():
    decider = served()
    first = decider.decide([0.0, 0.0], "a")
    assert first.action is None and first.refer and first.reasons == ("unseen_category",)
    feed(decider, blobs(60))
    sure = decider.decide([3.0, 3.0], "a")
    assert sure.action == "reject" and sure.confidence > 0.9 and not sure.refer and sure.reasons == ()
    for x in np.linspace(1.0, 2.0, 21):  # across the boundary: unsure there, and the two closest at its middle
        between = decider.decide([x, x], "a")
        p = sorted(between.probs.values())
        assert ("low_confidence" in between.reasons) == (between.confidence < 0.6)
        assert ("small_margin" in between.reasons) == (p[1] - p[0] < 0.1)
        assert list(between.reasons) == [r for r in REASONS if r in between.reasons]  # in REASONS order
        assert between.refer == bool(between.reasons)


def test_the_fixed_thresholds_are_the_deciders():
    strict, lax = (served(refer_confidence=c, refer_margin=m) for c, m in ((0.99, 0.99), (0.0, 0.0)))
    assert (strict.referral.min_confidence, strict.referral.min_margin) == (0.99, 0.99)
    assert served().referral.min_confidence == 0.6 and served().referral.min_margin == 0.1  # the defaults
    feed(strict, blobs(60))
    feed(lax, blobs(60))
    for x in np.linspace(1.0, 2.0, 11):  # across the boundary
        decided, alone = strict.decide([x, x], "a"), lax.decide([x, x], "a")
        assert alone.reasons == () and alone.action == decided.action
        if decided.confidence < 0.99:
            assert decided.reasons == ("low_confidence", "small_margin")
    with pytest.raises(ValueError, match="refer_margin"):
        served(refer_margin=1.5)
    with pytest.raises(ValueError, match="refer_confidence"):
        served(refer_confidence=-0.1)
    with pytest.raises(ValueError, match="target_error"):
        served(target_error=0.0)
    for option in ("target_error", "refer_confidence", "refer_margin"):  # the config's no more: it names the Decider
        with pytest.raises(TypeError, match=rf"{option}.*Decider\(memory, {option}=\.\.\.\)"):
            recommended(**{option: 0.05})


def test_a_case_far_outside_the_categorys_spread_is_novel():
    decider = served(refer_margin=0.0)
    feed(decider, blobs(NOVEL_AFTER - 1))
    assert "novel" not in decider.decide([40.0, 40.0], "a").reasons  # too little spread to tell yet
    feed(decider, blobs(40, seed=1))
    assert "novel" in decider.decide([40.0, 40.0], "a").reasons
    assert "novel" not in decider.decide([3.2, 2.9], "a").reasons
    # the bound: the chi-square's 0.999 quantile, 13.8 for two criteria and 16.3 for three
    assert novel_bound(1) == pytest.approx(10.8276, abs=1e-3) and novel_bound(2) == pytest.approx(13.8155, abs=1e-3)
    assert novel_bound(3) == pytest.approx(16.2662, abs=1e-3) and novel_bound(100) == pytest.approx(149.449, abs=1e-2)
    # the gated rule keeps no spread: never novel
    seed_rule = Decider(JudgmentMemory(["a"], ACTIONS, 2, config=JudgmentConfig.seed()))
    feed(seed_rule, blobs(60))
    assert "novel" not in seed_rule.decide([40.0, 40.0], "a").reasons


def test_a_drift_shows_as_a_recent_change_in_the_trust_weights():
    decider = served()
    stream = blobs(400, swap_after=300)
    decisions = feed(decider, stream)
    before = [d for d in decisions[250:300] if "recent_change" in d.reasons]
    after = [d for d in decisions[300:340] if "recent_change" in d.reasons]
    assert not before and after  # quiet while the stream is, then the trust moves


def test_the_change_test_halfway_to_firing_is_a_recent_change():
    decider = Decider(JudgmentMemory(["a"], ACTIONS, 2, config=JudgmentConfig.seed(), drift_mode="adaptive"))
    feed(decider, blobs(60))
    assert "recent_change" not in decider.decide([3.0, 3.0], "a").reasons
    memory = decider.memory
    with torch.no_grad():
        memory.promotion_statistic[0] = memory.config.promotion_threshold / 2
    assert "recent_change" in decider.decide([3.0, 3.0], "a").reasons


# -- the calibrated threshold ----------------------------------------------------------------------
def test_without_evidence_every_decision_is_referred_then_the_threshold_comes_down():
    decider = served(target_error=0.05)
    assert decider.referral.threshold == float("inf") and decider.target_error == 0.05
    decisions = feed(decider, blobs(300))
    assert all(d.refer for d in decisions[:50])
    assert decider.referral.threshold < 1.0 and not decider.decide([3.0, 3.0], "a").refer


def test_only_decisions_no_other_reason_referred_calibrate():
    decider = served(target_error=0.05)
    decisions = feed(decider, blobs(200))
    eligible = [d for d in decisions if d.action is not None and set(d.reasons) <= {"not_calibrated", "low_confidence"}]
    state = decider.referral.state()["calibration"]
    assert state["confidence"] == pytest.approx([d.confidence for d in eligible])
    assert state["seq"] == [i for i, d in enumerate(decisions) if d in eligible]


def test_a_learn_one_without_a_decision_feeds_no_calibration():
    decider = served(target_error=0.05)
    feed(decider, blobs(100))
    before = decider.referral.state()["calibration"]
    for row, action in blobs(20, seed=4):
        decider.learn_one(row, action, "a")
    assert decider.referral.state()["calibration"] == before  # no decision: no confidence to calibrate on


def test_on_an_exchangeable_stream_the_error_among_decisions_taken_alone_stays_under_the_target():
    decider = served(target_error=0.05, refer_margin=0.0)
    rng = np.random.default_rng(3)
    alone = wrong = 0
    for _ in range(3000):  # overlapping classes: about one decision in ten is wrong
        label = int(rng.integers(2))
        row = rng.normal(size=2) + 1.8 * label
        decision = decider.decide(row, "a")
        if not decision.refer:
            alone += 1
            wrong += decision.action != ACTIONS[label]
        decider.verify(decision.id, ACTIONS[label])
    assert alone > 300 and wrong / alone <= 0.05


def test_a_knn_refers_by_the_same_rule():
    decider = Decider(KNNMemory(factors=2, actions=ACTIONS, k=5), target_error=0.05)
    decisions = feed(decider, blobs(400))
    assert decisions[0].reasons == ("unseen_category",) and all(d.refer for d in decisions[:60])
    assert decider.referral.threshold < 1.0 and not decider.decide([3.0, 3.0]).refer
    with pytest.raises(ValueError, match="target_error"):
        Decider(KNNMemory(factors=2, actions=ACTIONS), target_error=1.0)
    with pytest.raises(TypeError, match=r"Decider\(KNNMemory\(\.\.\.\), target_error=\.\.\.\)"):
        KNNMemory(factors=2, actions=ACTIONS, target_error=0.05)  # the memory's no more: it names the Decider


# -- what it keeps -------------------------------------------------------------------------------
def test_the_referral_travels_in_the_state_dict_and_old_states_load_empty():
    decider = served(target_error=0.05)
    feed(decider, blobs(300))
    pending = decider.decide([3.0, 3.0], "a")
    buffer = io.BytesIO()
    torch.save(decider.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    again = served(target_error=0.05)
    again.load_state_dict(saved)
    assert again.referral.state() == decider.referral.state() and again.referral.threshold == decider.referral.threshold
    assert again.pending()[0].reasons == pending.reasons and again.pending()[0].refer == pending.refer
    for copied in (copy.deepcopy(decider), pickle.loads(pickle.dumps(decider))):
        assert copied.referral.state() == decider.referral.state()
    old = {key: value for key, value in saved.items() if key != "referral"}  # a state saved before referrals
    old["pending"] = {k: v for k, v in saved["pending"].items() if k != "reasons"}
    again.load_state_dict(old)
    assert again.referral.threshold == float("inf") and again.pending()[0].reasons == ()


def before_the_decider(state: dict) -> dict:
    """A Decider's state as a gae before the Decider saved it: the memory's state_dict, the pending
    decisions, expired count and referral in its extra state."""
    memory = dict(state["memory"])
    kept = {key: state[key] for key in ("pending", "expired_decisions", "referral") if key in state}
    memory["_extra_state"] = {**memory["_extra_state"], **kept}
    return memory


def test_a_checkpoint_saved_before_the_decider_brings_its_referral():
    decider = served(target_error=0.05)
    feed(decider, blobs(300))
    pending = decider.decide([3.0, 3.0], "a")
    old = before_the_decider(decider.state_dict())
    again = served(target_error=0.05)
    again.load_state_dict(old)
    assert again.referral.state() == decider.referral.state() and again.referral.threshold == decider.referral.threshold
    assert again.pending() == [pending]
    older = before_the_decider({k: v for k, v in decider.state_dict().items() if k != "referral"})  # before referrals
    older["_extra_state"]["pending"] = {k: v for k, v in older["_extra_state"]["pending"].items() if k != "reasons"}
    again.load_state_dict(older)
    assert again.referral.threshold == float("inf") and again.pending()[0].reasons == ()


@pytest.mark.parametrize("layout", ["decider", "before the decider"])
def test_a_bad_referral_state_is_refused_and_changes_nothing(layout):
    decider = served(target_error=0.05)
    feed(decider, blobs(100))
    saved = decider.state_dict()
    before = decider.referral.state()
    bad = {**saved, "referral": {"calibration": {"confidence": [2.0], "correct": [True], "seq": [0]}}}
    with pytest.raises(ValueError, match="confidence"):
        decider.load_state_dict(bad if layout == "decider" else before_the_decider(bad))
    assert decider.referral.state() == before
    with pytest.raises(ValueError, match="trust"):
        Referral().load_state({"trust": {"category": [0], "seq": [0], "row": [[2.0, -1.0]]}})


def test_undo_and_forget_take_out_what_the_unlearned_verifications_fed():
    decider = served(target_error=0.05)
    decisions = feed(decider, blobs(120), sources=True)
    state = decider.referral.state()["calibration"]
    decider.undo_(5)
    assert decider.referral.state()["calibration"]["seq"] == [s for s in state["seq"] if s < 115]
    gone = {10, 11, 50}
    decider.forget_(sorted(gone))
    kept = [(c, s - sum(g < s for g in gone)) for c, s in zip(state["confidence"], state["seq"], strict=True)
            if s < 115 and s not in gone]
    after = decider.referral.state()["calibration"]
    assert list(zip(after["confidence"], after["seq"], strict=True)) == kept
    trust = decider.referral.state()["trust"]
    assert max(trust["seq"]) == 114 - len(gone) and len(trust["seq"]) <= RECENT
    assert decisions  # (fed)


def test_on_a_ledger_a_restart_and_a_second_writer_hold_the_same_referral(tmp_path):
    config = recommended()
    store = SQLiteStore(tmp_path / "ledger.db")
    decider = served(config, target_error=0.05, store=store, snapshot_every=50)
    in_ram = served(config, target_error=0.05)
    stream = blobs(180)
    for i, (row, action) in enumerate(stream):
        on_ledger, plain = decider.decide(row, "a", source_id=i), in_ram.decide(row, "a", source_id=i)
        assert on_ledger.reasons == plain.reasons
        decider.verify(on_ledger.id, action)
        in_ram.verify(plain.id, action)
    assert decider.referral.state() == in_ram.referral.state()
    reopened = served(config, target_error=0.05, store=SQLiteStore(tmp_path / "ledger.db"))
    assert reopened.referral.state() == decider.referral.state()  # a snapshot, then the verifications after it
    pending = decider.decide([3.0, 3.0], "a")
    reopened.sync()
    assert [d.reasons for d in reopened.pending()] == [pending.reasons]
    decider.forget_([3, 4])  # the ledger's rebuild replays the referral without them, as it replays the rest
    reopened.sync()
    in_ram.forget_([3, 4])
    late = served(config, target_error=0.05, store=SQLiteStore(tmp_path / "ledger.db"))  # from the snapshot
    assert decider.referral.state() == reopened.referral.state() == late.referral.state()
    # in RAM the calibration (facts: each decision's confidence and outcome) comes out the same while the
    # window neither filled nor restarted; the trust history keeps the rows it had, where a replay recomputes them
    replayed, dropped = decider.referral.state(), in_ram.referral.state()
    assert replayed["calibration"] == dropped["calibration"] and len(decider.referral.calibrator) > 100
    assert replayed["trust"]["seq"] == dropped["trust"]["seq"]


def test_a_ledger_written_before_or_without_the_referral_options_opens(tmp_path):
    from gae.ledger import Ledger

    store = SQLiteStore(tmp_path / "old.db")
    decider = served(store=store)
    feed(decider, blobs(10))
    ledger = Ledger(store, "judgment")
    with ledger.writing():
        settings = ledger.meta()["settings"]
        assert not {"target_error", "refer_confidence", "refer_margin"} & set(settings)  # the Decider's options
        # a gae before the Decider recorded them with the memory's settings: read as before, without them
        ledger.set_meta({"settings": {**settings, "target_error": None, "refer_confidence": 0.6, "refer_margin": 0.1}})
    again = served(store=SQLiteStore(tmp_path / "old.db"))
    assert again.version == decider.version
    # the referral options change what decide answers, not what is learned: the ledger does not check them
    other = served(target_error=0.05, refer_margin=0.0, store=SQLiteStore(tmp_path / "old.db"))
    assert other.version == decider.version and other.referral.target_error == 0.05
    with ledger.writing():  # a setting a ledger written before it existed lacks counts as its default
        ledger.set_meta({"settings": {k: v for k, v in settings.items() if k != "trust_floor"}})
    served(store=SQLiteStore(tmp_path / "old.db"))
    with pytest.raises(ValueError, match=r"trust_floor \(0.05 there, 0.1 here\)"):
        served(recommended(trust_floor=0.1), store=SQLiteStore(tmp_path / "old.db"))


def test_a_memory_pickled_with_a_referral_unpickles_without_it_and_a_decider_serves_it():
    decider = served(target_error=0.05)
    feed(decider, blobs(40))
    state = decider.memory.__getstate__()
    assert "referral" not in state  # the Decider's now
    state["referral"] = Referral(0.05)  # what a gae before the Decider pickled with the memory
    old = JudgmentMemory.__new__(JudgmentMemory)
    old.__setstate__(state)
    assert "referral" not in old.__dict__
    with pytest.raises(AttributeError, match=r"Decider\(memory\)\.referral"):
        old.referral  # noqa: B018
    again = Decider(old, target_error=0.05)
    assert again.referral.target_error == 0.05 and len(again.referral.calibrator) == 0
    assert again.decide([3.0, 3.0], "a").reasons == ("not_calibrated",) and again.state_dict()
    knn = KNNMemory(factors=2, actions=ACTIONS)
    state = knn.__getstate__()
    state["referral"] = Referral()
    unpickled = KNNMemory.__new__(KNNMemory)
    unpickled.__setstate__(state)
    assert "referral" not in unpickled.__dict__
    assert Decider(unpickled).decide([1.0, 1.0]).reasons == ("unseen_category",)


def test_a_decision_refers_exactly_when_it_has_reasons():
    decision = Decider(JudgmentMemory(["a"], ACTIONS, 2, config=JudgmentConfig.seed())).decide([0.0, 0.0], "a")
    with pytest.raises(ValueError, match="refers exactly when it has reasons"):
        type(decision)(**{**decision.__dict__, "refer": False})
    with pytest.raises(ValueError, match="refers exactly when it has reasons"):
        type(decision)(**{**decision.__dict__, "reasons": ("bored",)})


def test_the_retrieval_baseline_keeps_its_referral_in_its_state():
    from gae.models import RetrievalMemory

    decider = Decider(RetrievalMemory(factors=2, actions=ACTIONS), target_error=0.05)
    feed(decider, blobs(30))
    again = Decider(RetrievalMemory(factors=2, actions=ACTIONS), target_error=0.05)
    again.load_state_dict(decider.state_dict())
    assert again.referral.state() == decider.referral.state() and len(again.referral.calibrator) > 0


def test_the_autonomy_measurement_counts_what_each_contestant_took_alone():
    pytest.importorskip("river")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "autonomy.py"
    spec = importlib.util.spec_from_file_location("autonomy_script", path)
    assert spec is not None and spec.loader is not None
    autonomy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(autonomy)
    decided = autonomy.run_decide("stagger", 200, 600, 0.05)
    ruled = autonomy.run(("knn_400", "stagger", 200, 600, 0.05))
    for counts in (decided, ruled):
        assert counts["n"] == 600 and 0 < counts["alone"] < 600 and counts["wrong_alone"] <= 0.05 * counts["alone"]
    assert set(decided["reasons"]) <= set(REASONS) and decided["reasons"]["not_calibrated"] > 0
    for counts in (decided, ruled):  # nothing is taken alone before the calibration passes a level
        assert 90 <= counts["first_alone"] < 600 - counts["alone"] + counts["first_alone"]
    summary = autonomy.summarise([decided, ruled, {**ruled, "model": "jm_recommended"}])
    stagger = summary["per_stream"]["stagger"]
    assert stagger["jm_decide"]["autonomy"] == decided["alone"] / 600
    assert stagger["jm_decide"]["first_alone"] == decided["first_alone"]
    table = autonomy.section({"summary": summary, "target": 0.05, "window": 2000, "delta": 0.05, "n": 600,
                              "command": "test", "machine": "here", "seconds": 1.0})
    assert f"| {decided['first_alone']:,} |" in table and "first alone" in table


def test_a_writer_without_a_target_keeps_the_evidence_for_one_with_a_target(tmp_path):
    """Deciders of other targets may share a ledger: a snapshot written by one without a target
    still holds the calibration window, so one with a target opened from it has the evidence."""
    path = tmp_path / "shared.db"
    off = served(store=SQLiteStore(path), snapshot_every=50)
    feed(off, blobs(300))
    assert off.referral.threshold == 0.6 and len(off.referral.calibrator) > 250  # evidence kept, not used
    on = served(target_error=0.05, store=SQLiteStore(path))
    assert len(on.referral.calibrator) == len(off.referral.calibrator) and on.referral.threshold < 1.0
    off.undo_(1)  # a deletion rebuilds everyone from the snapshot it writes
    on.sync()
    assert len(on.referral.calibrator) >= 250 and on.referral.threshold < 1.0


def test_unlearning_nothing_of_the_window_changes_nothing():
    calibrator = ReferralCalibrator(0.02, window=3)
    for i, correct in enumerate([False, False, True, False]):
        calibrator.observe(0.99, correct, i, alone=True)
    before = calibrator.state()
    calibrator.unlearned([])
    assert calibrator.state() == before
    calibrator.unlearned([0])  # evicted already: the window's entries only renumber, the change test stands
    assert calibrator.state() == {**before, "seq": [0, 1, 2]}


def test_a_trace_header_written_before_the_decider_builds_its_memory_without_the_target():
    from gae.traces.writer import build_memory, memory_config

    knn = KNNMemory(factors=2, actions=ACTIONS, k=3)
    assert "target_error" not in memory_config(knn)  # the target is the Decider's, not the memory's
    rebuilt = build_memory({**memory_config(knn), "target_error": 0.1})  # a k-NN's header from before the Decider
    assert type(rebuilt) is KNNMemory and memory_config(rebuilt) == memory_config(knn)
    judgment = JudgmentMemory(["a"], ACTIONS, 2, recommended())
    old = {**memory_config(judgment), "target_error": 0.05, "refer_confidence": 0.6, "refer_margin": 0.1}
    assert memory_config(build_memory(old)) == memory_config(judgment)


# -- not calibrated yet ------------------------------------------------------------------------------
def test_until_a_level_passes_the_reason_is_not_calibrated_with_what_it_still_needs(tmp_path):
    """With a target and no level proven, a decision the memory has an opinion on is referred as
    ``not_calibrated`` (never ``low_confidence``), its ``verifications_needed`` the calibrator's
    count then, falling as right answers come; once a level passes, none is not_calibrated. The
    count travels with the decision: through the pending book's state_dict, the ledger's replay on
    another writer, and ``Decider.decision`` for a past decision."""
    store = SQLiteStore(tmp_path / "ledger.db")
    decider = served(target_error=0.05, store=store, refer_margin=0.0)
    made = feed(decider, blobs(400))
    opinions = [d for d in made if d.action is not None]
    before = [d for d in opinions if d.verifications_needed]
    assert before and all(d.reasons[-1:] == ("not_calibrated",) for d in before)
    assert all("low_confidence" not in d.reasons for d in before)
    needs = [d.verifications_needed for d in before]
    # 90 right answers pass a chain start at 5% on a fifth of delta; a wrong one adds more; the start that
    # passes first needed one more right answer just before
    assert needs[0] == 90 and max(needs) > 90 and needs[-1] == 1
    assert decider.referral.threshold < 1.0 and decider.referral.needed == 0
    assert not any("not_calibrated" in d.reasons for d in made[made.index(before[-1]) + 1:])
    # a past decision as it was made, from the ledger (here and on another writer of the store)
    assert decider.decision(before[0].id) == before[0]
    other = served(target_error=0.05, store=SQLiteStore(tmp_path / "ledger.db"), refer_margin=0.0)
    assert other.decision(before[-1].id).verifications_needed == before[-1].verifications_needed
    with pytest.raises(KeyError):
        decider.decision("nope")
    # pending: in the book's state_dict and a replay
    fresh = served(target_error=0.05)
    pending = fresh.decide([3.0, 3.0], "a")
    fresh.verify(pending.id, "reject")
    waiting = fresh.decide([3.0, 3.0], "a")
    assert waiting.reasons == ("not_calibrated",) and waiting.verifications_needed == fresh.referral.needed > 0
    again = served(target_error=0.05)
    again.load_state_dict(fresh.state_dict())
    assert again.decision(waiting.id) == waiting and again.pending() == [waiting]
    with pytest.raises(KeyError, match="in RAM"):
        fresh.decision(pending.id)  # verified: a Decider in RAM keeps no past decisions


def test_verifications_needed_is_refused_where_it_cannot_be():
    from gae.decider.decision import Decision

    with pytest.raises(ValueError, match="verifications_needed"):
        Decision("x", "approve", 0.9, {"approve": 0.9, "reject": 0.1}, "a", 0, 0.0, None, True,
                 ("low_confidence",), 5)  # only a not_calibrated decision needs verifications
    with pytest.raises(ValueError, match="verifications_needed"):
        Decision("x", "approve", 0.9, {"approve": 0.9, "reject": 0.1}, "a", 0, 0.0, None, True,
                 ("not_calibrated",), -1)
    decider = served(target_error=0.05)
    decider.decide([3.0, 3.0], "a")
    state = decider.state_dict()
    state["pending"]["verifications_needed"] = [3]  # reasons: unseen_category, not not_calibrated
    again = served(target_error=0.05)
    before = again.state_dict()
    with pytest.raises(ValueError, match="verifications_needed"):
        again.load_state_dict(state)
    assert str(again.state_dict()) == str(before)
