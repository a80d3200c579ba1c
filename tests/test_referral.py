"""Act or refer inside the memories: decide's ``refer`` and ``reasons`` (gae/refer.py's Referral),
the calibrated threshold of ``JudgmentConfig.target_error`` fed by verify, and what the referral
keeps: through the state_dict, a ledger's replay and restart, undo_ and forget_."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from gae.episodic.store import SQLiteStore
from gae.refer import NOVEL_AFTER, REASONS, RECENT, Referral, ReferralCalibrator, novel_bound

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


def feed(memory, stream, category="a", sources=False):
    decisions = []
    for i, (row, action) in enumerate(stream):
        decision = memory.decide(row, category, source_id=i if sources else None)
        memory.verify(decision.id, action)
        decisions.append(decision)
    return decisions


def recommended(**changes) -> JudgmentConfig:
    return JudgmentConfig.recommended().replace(**changes)


# -- the reasons -------------------------------------------------------------------------------
def test_a_memory_with_no_opinion_refers_as_unseen_and_a_sure_one_acts():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended())
    first = memory.decide([0.0, 0.0], "a")
    assert first.action is None and first.refer and first.reasons == ("unseen_category",)
    feed(memory, blobs(60))
    sure = memory.decide([3.0, 3.0], "a")
    assert sure.action == "reject" and sure.confidence > 0.9 and not sure.refer and sure.reasons == ()
    for x in np.linspace(1.0, 2.0, 21):  # across the boundary: unsure there, and the two closest at its middle
        between = memory.decide([x, x], "a")
        p = sorted(between.probs.values())
        assert ("low_confidence" in between.reasons) == (between.confidence < 0.6)
        assert ("small_margin" in between.reasons) == (p[1] - p[0] < 0.1)
        assert list(between.reasons) == [r for r in REASONS if r in between.reasons]  # in REASONS order
        assert between.refer == bool(between.reasons)


def test_the_fixed_thresholds_are_the_configs():
    strict, lax = (JudgmentMemory(["a"], ACTIONS, 2, recommended(refer_confidence=c, refer_margin=m))
                   for c, m in ((0.99, 0.99), (0.0, 0.0)))
    feed(strict, blobs(60))
    feed(lax, blobs(60))
    for x in np.linspace(1.0, 2.0, 11):  # across the boundary
        decided, alone = strict.decide([x, x], "a"), lax.decide([x, x], "a")
        assert alone.reasons == () and alone.action == decided.action
        if decided.confidence < 0.99:
            assert decided.reasons == ("low_confidence", "small_margin")
    with pytest.raises(ValueError, match="refer_margin"):
        recommended(refer_margin=1.5)
    with pytest.raises(ValueError, match="target_error"):
        recommended(target_error=0.0)


def test_a_case_far_outside_the_categorys_spread_is_novel():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(refer_margin=0.0))
    feed(memory, blobs(NOVEL_AFTER - 1))
    assert "novel" not in memory.decide([40.0, 40.0], "a").reasons  # too little spread to tell yet
    feed(memory, blobs(40, seed=1))
    assert "novel" in memory.decide([40.0, 40.0], "a").reasons
    assert "novel" not in memory.decide([3.2, 2.9], "a").reasons
    # the bound: the chi-square's 0.999 quantile, 13.8 for two criteria and 16.3 for three
    assert novel_bound(1) == pytest.approx(10.8276, abs=1e-3) and novel_bound(2) == pytest.approx(13.8155, abs=1e-3)
    assert novel_bound(3) == pytest.approx(16.2662, abs=1e-3) and novel_bound(100) == pytest.approx(149.449, abs=1e-2)
    seed_rule = JudgmentMemory(["a"], ACTIONS, 2)  # the gated rule keeps no spread: never novel
    feed(seed_rule, blobs(60))
    assert "novel" not in seed_rule.decide([40.0, 40.0], "a").reasons


def test_a_drift_shows_as_a_recent_change_in_the_trust_weights():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended())
    stream = blobs(400, swap_after=300)
    decisions = feed(memory, stream)
    before = [d for d in decisions[250:300] if "recent_change" in d.reasons]
    after = [d for d in decisions[300:340] if "recent_change" in d.reasons]
    assert not before and after  # quiet while the stream is, then the trust moves


def test_the_change_test_halfway_to_firing_is_a_recent_change():
    memory = JudgmentMemory(["a"], ACTIONS, 2, drift_mode="adaptive")
    feed(memory, blobs(60))
    assert "recent_change" not in memory.decide([3.0, 3.0], "a").reasons
    with torch.no_grad():
        memory.promotion_statistic[0] = memory.config.promotion_threshold / 2
    assert "recent_change" in memory.decide([3.0, 3.0], "a").reasons


# -- the calibrated threshold ----------------------------------------------------------------------
def test_without_evidence_every_decision_is_referred_then_the_threshold_comes_down():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    assert memory.referral.threshold == float("inf")
    decisions = feed(memory, blobs(300))
    assert all(d.refer for d in decisions[:50])
    assert memory.referral.threshold < 1.0 and not memory.decide([3.0, 3.0], "a").refer


def test_only_decisions_no_other_reason_referred_calibrate():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    decisions = feed(memory, blobs(200))
    eligible = [d for d in decisions if d.action is not None and set(d.reasons) <= {"low_confidence"}]
    state = memory.referral.state()["calibration"]
    assert state["confidence"] == pytest.approx([d.confidence for d in eligible])
    assert state["seq"] == [i for i, d in enumerate(decisions) if d in eligible]


def test_on_an_exchangeable_stream_the_error_among_decisions_taken_alone_stays_under_the_target():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05, refer_margin=0.0))
    rng = np.random.default_rng(3)
    alone = wrong = 0
    for _ in range(3000):  # overlapping classes: about one decision in ten is wrong
        label = int(rng.integers(2))
        row = rng.normal(size=2) + 1.8 * label
        decision = memory.decide(row, "a")
        if not decision.refer:
            alone += 1
            wrong += decision.action != ACTIONS[label]
        memory.verify(decision.id, ACTIONS[label])
    assert alone > 300 and wrong / alone <= 0.05


def test_a_knn_refers_by_the_same_rule():
    memory = KNNMemory(factors=2, actions=ACTIONS, k=5, target_error=0.05)
    decisions = feed(memory, blobs(400))
    assert decisions[0].reasons == ("unseen_category",) and all(d.refer for d in decisions[:60])
    assert memory.referral.threshold < 1.0 and not memory.decide([3.0, 3.0]).refer
    with pytest.raises(ValueError, match="target_error"):
        KNNMemory(factors=2, actions=ACTIONS, target_error=1.0)


# -- what it keeps -------------------------------------------------------------------------------
def test_the_referral_travels_in_the_state_dict_and_old_states_load_empty():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    feed(memory, blobs(300))
    pending = memory.decide([3.0, 3.0], "a")
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    again = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    again.load_state_dict(saved)
    assert again.referral.state() == memory.referral.state() and again.referral.threshold == memory.referral.threshold
    assert again.pending()[0].reasons == pending.reasons and again.pending()[0].refer == pending.refer
    for copied in (copy.deepcopy(memory), pickle.loads(pickle.dumps(memory))):
        assert copied.referral.state() == memory.referral.state()
    old = {key: value for key, value in saved.items()}
    old["_extra_state"] = {k: v for k, v in saved["_extra_state"].items() if k != "referral"}
    old["_extra_state"]["pending"] = {k: v for k, v in old["_extra_state"]["pending"].items() if k != "reasons"}
    again.load_state_dict(old)
    assert again.referral.threshold == float("inf") and again.pending()[0].reasons == ()


def test_a_bad_referral_state_is_refused_and_changes_nothing():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    feed(memory, blobs(100))
    saved = memory.state_dict()
    before = memory.referral.state()
    bad = dict(saved)
    bad["_extra_state"] = {**saved["_extra_state"], "referral": {"calibration": {"confidence": [2.0],
                                                                                  "correct": [True], "seq": [0]}}}
    with pytest.raises(ValueError, match="confidence"):
        memory.load_state_dict(bad)
    assert memory.referral.state() == before
    with pytest.raises(ValueError, match="trust"):
        Referral().load_state({"trust": {"category": [0], "seq": [0], "row": [[2.0, -1.0]]}})


def test_undo_and_forget_take_out_what_the_unlearned_verifications_fed():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    decisions = feed(memory, blobs(120), sources=True)
    state = memory.referral.state()["calibration"]
    memory.undo_(5)
    assert memory.referral.state()["calibration"]["seq"] == [s for s in state["seq"] if s < 115]
    gone = {10, 11, 50}
    memory.forget_(sorted(gone))
    kept = [(c, s - sum(g < s for g in gone)) for c, s in zip(state["confidence"], state["seq"], strict=True)
            if s < 115 and s not in gone]
    after = memory.referral.state()["calibration"]
    assert list(zip(after["confidence"], after["seq"], strict=True)) == kept
    trust = memory.referral.state()["trust"]
    assert max(trust["seq"]) == 114 - len(gone) and len(trust["seq"]) <= RECENT
    assert decisions  # (fed)


def test_on_a_ledger_a_restart_and_a_second_writer_hold_the_same_referral(tmp_path):
    config = recommended(target_error=0.05)
    store = SQLiteStore(tmp_path / "ledger.db")
    memory = JudgmentMemory(["a"], ACTIONS, 2, config, store=store, snapshot_every=50)
    in_ram = JudgmentMemory(["a"], ACTIONS, 2, config)
    stream = blobs(180)
    for i, (row, action) in enumerate(stream):
        on_ledger, plain = memory.decide(row, "a", source_id=i), in_ram.decide(row, "a", source_id=i)
        assert on_ledger.reasons == plain.reasons
        memory.verify(on_ledger.id, action)
        in_ram.verify(plain.id, action)
    assert memory.referral.state() == in_ram.referral.state()
    reopened = JudgmentMemory(["a"], ACTIONS, 2, config, store=SQLiteStore(tmp_path / "ledger.db"))
    assert reopened.referral.state() == memory.referral.state()  # a snapshot, then the verifications after it
    pending = memory.decide([3.0, 3.0], "a")
    reopened.sync()
    assert [d.reasons for d in reopened.pending()] == [pending.reasons]
    memory.forget_([3, 4])  # the ledger's rebuild replays the referral without them, as it replays the rest
    reopened.sync()
    in_ram.forget_([3, 4])
    late = JudgmentMemory(["a"], ACTIONS, 2, config, store=SQLiteStore(tmp_path / "ledger.db"))  # from the snapshot
    assert memory.referral.state() == reopened.referral.state() == late.referral.state()
    # in RAM the calibration (facts: each decision's confidence and outcome) comes out the same while the
    # window neither filled nor restarted; the trust history keeps the rows it had, where a replay recomputes them
    replayed, dropped = memory.referral.state(), in_ram.referral.state()
    assert replayed["calibration"] == dropped["calibration"] and len(memory.referral.calibrator) > 100
    assert replayed["trust"]["seq"] == dropped["trust"]["seq"]


def test_a_ledger_written_before_the_referral_options_opens_with_their_defaults(tmp_path):
    from gae.ledger import Ledger

    store = SQLiteStore(tmp_path / "old.db")
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(), store=store)
    feed(memory, blobs(10))
    ledger = Ledger(store, "judgment")
    with ledger.writing():
        settings = {k: v for k, v in ledger.meta()["settings"].items()
                    if k not in ("target_error", "refer_confidence", "refer_margin")}
        ledger.set_meta({"settings": settings})
    again = JudgmentMemory(["a"], ACTIONS, 2, recommended(), store=SQLiteStore(tmp_path / "old.db"))
    assert again.version == memory.version
    # the referral options change what decide answers, not what is learned: the ledger does not check them
    other = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05, refer_margin=0.0),
                           store=SQLiteStore(tmp_path / "old.db"))
    assert other.version == memory.version and other.referral.target_error == 0.05
    with ledger.writing():  # a setting a ledger written before it existed lacks counts as its default
        ledger.set_meta({"settings": {k: v for k, v in settings.items() if k != "trust_floor"}})
    JudgmentMemory(["a"], ACTIONS, 2, recommended(), store=SQLiteStore(tmp_path / "old.db"))
    with pytest.raises(ValueError, match=r"trust_floor \(0.05 there, 0.1 here\)"):
        JudgmentMemory(["a"], ACTIONS, 2, recommended(trust_floor=0.1), store=SQLiteStore(tmp_path / "old.db"))


def test_a_memory_pickled_before_referrals_unpickles_with_a_fresh_one():
    memory = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05))
    feed(memory, blobs(40))
    state = memory.__getstate__()
    del state["referral"]  # what a gae before act-or-refer pickled
    old = JudgmentMemory.__new__(JudgmentMemory)
    old.__setstate__(state)
    assert old.referral.target_error == 0.05 and len(old.referral.calibrator) == 0
    assert old.decide([3.0, 3.0], "a").reasons == ("low_confidence",) and old.state_dict()
    knn = KNNMemory(factors=2, actions=ACTIONS)
    state = knn.__getstate__()
    del state["referral"]
    again = KNNMemory.__new__(KNNMemory)
    again.__setstate__(state)
    assert again.decide([1.0, 1.0]).reasons == ("unseen_category",)


def test_a_decision_refers_exactly_when_it_has_reasons():
    decision = JudgmentMemory(["a"], ACTIONS, 2).decide([0.0, 0.0], "a")
    with pytest.raises(ValueError, match="refers exactly when it has reasons"):
        type(decision)(**{**decision.__dict__, "refer": False})
    with pytest.raises(ValueError, match="refers exactly when it has reasons"):
        type(decision)(**{**decision.__dict__, "reasons": ("bored",)})


def test_the_retrieval_baseline_keeps_its_referral_in_its_state():
    from gae.baselines import RetrievalMemory

    memory = RetrievalMemory(factors=2, actions=ACTIONS)
    memory.referral = Referral(0.05)
    feed(memory, blobs(30))
    again = RetrievalMemory(factors=2, actions=ACTIONS)
    again.referral = Referral(0.05)
    again.load_state_dict(memory.state_dict())
    assert again.referral.state() == memory.referral.state() and len(again.referral.calibrator) > 0


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
    assert set(decided["reasons"]) <= set(REASONS) and decided["reasons"]["low_confidence"] > 0
    summary = autonomy.summarise([decided, ruled, {**ruled, "model": "jm_recommended"}])
    assert summary["per_stream"]["stagger"]["jm_decide"]["autonomy"] == decided["alone"] / 600


def test_a_writer_without_a_target_keeps_the_evidence_for_one_with_a_target(tmp_path):
    """Memories of other targets may share a ledger: a snapshot written by one without a target
    still holds the calibration window, so one with a target opened from it has the evidence."""
    path = tmp_path / "shared.db"
    off = JudgmentMemory(["a"], ACTIONS, 2, recommended(), store=SQLiteStore(path), snapshot_every=50)
    feed(off, blobs(300))
    assert off.referral.threshold == 0.6 and len(off.referral.calibrator) > 250  # evidence kept, not used
    on = JudgmentMemory(["a"], ACTIONS, 2, recommended(target_error=0.05), store=SQLiteStore(path))
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


def test_a_knn_checkpoint_keeps_its_target(tmp_path):
    from gae.traces.writer import build_memory, memory_config

    knn = KNNMemory(factors=2, actions=ACTIONS, target_error=0.1)
    assert build_memory(memory_config(knn)).referral.target_error == 0.1
    plain = KNNMemory(factors=2, actions=ACTIONS)
    assert "target_error" not in memory_config(plain)  # a header as before act or refer
