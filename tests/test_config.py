"""JudgmentConfig: options in groups, every option also by its flat name, and what earlier gae wrote still reads.

Checkpoints, evaluation traces and durable ledgers record a config flat (``to_dict``), and the river
and scikit-learn estimators take the flat names as parameters: these tests hold the flat address
to the groups (one place each, round trips) and to the records written before the groups.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math

import pytest

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment.config import GROUPS, LVQ, PATHS, Drift, Log, Rule, Slots, Trust, flat_name
from gae.judgment.kernels.scoring import Options

# the config as gae wrote it before the groups (and before the Decider held act or refer): to_dict() of
# JudgmentConfig.seed() and .recommended(), what checkpoints, traces and ledger meta hold
SEED_BEFORE = {
    "tau": 0.1, "eta_confirmed": 0.05, "eta_override": 0.01, "drift_threshold": 0.4, "gate_damping": 0.5,
    "clip": None, "push_rate": 0.0, "min_confidence": 0.0, "drift_mode": "seed", "shadow_eta": 0.5,
    "promotion_threshold": 2.995732273553991, "tracking_eta": 0.2, "evidence_clip": 1.0, "evidence_allowance": 0.25,
    "lead_rate": 0.1, "prototypes": 1, "spawn_threshold": 0.5, "spawn_support": 1.5, "win_decay": 0.05,
    "learning": "gated", "units": "category", "rate_floor": 0.02, "relevance_rate": 0.0, "miss_penalty": 0.0,
    "max_log_events": None, "judges": {}, "trust_rate": 0.5, "trust_share": 0.02, "trust_floor": 0.05,
    "target_error": None, "refer_confidence": 0.6, "refer_margin": 0.1}
RECOMMENDED_BEFORE = {
    **SEED_BEFORE, "push_rate": 0.5, "prototypes": 32, "spawn_threshold": 0.4, "win_decay": 0.01, "learning": "lvq",
    "rate_floor": 0.1, "relevance_rate": 0.05, "miss_penalty": 0.5,
    "judges": {"gauss": {"kind": "gauss", "rate_floor": 0.0, "prior": 1.0},
               "lda": {"kind": "lda", "shrinkage": 0.2, "rate_floor": 0.0, "refresh": 8},
               "gauss_short": {"kind": "gauss", "rate_floor": 0.05, "prior": 1.0},
               "lda_short": {"kind": "lda", "shrinkage": 0.2, "rate_floor": 0.03, "refresh": 8}}}
REFER = ("target_error", "refer_confidence", "refer_margin")
# the options issue 43 added to the lvq group (after miss_penalty), with their defaults: a record written before
# them reads as these
ADDED_43 = {"rate_per_error": 0.0, "error_decay": 0.02}
# JudgmentConfig.recommended() as issue 43 re-chose it, flat
RECOMMENDED_43 = {
    **SEED_BEFORE, "push_rate": 0.5, "prototypes": 32, "spawn_threshold": 0.4, "spawn_support": 0.25,
    "win_decay": 0.01, "learning": "lvq", "units": "memory", "rate_floor": 0.1, "relevance_rate": 0.05,
    "miss_penalty": 0.5, "rate_per_error": 1.0, "error_decay": 0.02,
    "judges": {"lda": {"kind": "lda", "shrinkage": 0.2, "rate_floor": 0.0, "refresh": 32},
               "bins": {"kind": "bins", "bins": 16, "reach": 2.0, "prior": 0.5, "rate_floor": 0.0},
               "gauss_short": {"kind": "gauss", "rate_floor": 0.05, "prior": 1.0},
               "lda_short": {"kind": "lda", "shrinkage": 0.2, "rate_floor": 0.03, "refresh": 32}}}


def now(before: dict) -> dict:
    """A flat record as today's to_dict writes it: the act-or-refer options gone (the Decider's), the
    options added since in their places (their defaults where the record lacks them)."""
    out: dict = {}
    for name, value in without_refer(before).items():
        if name in ADDED_43:
            continue
        out[name] = value
        if name == "miss_penalty":
            out.update({added: before.get(added, default) for added, default in ADDED_43.items()})
    return out
# a valid value of every option other than the seed's
CHANGED = {"tau": 0.2, "eta_confirmed": 0.1, "eta_override": 0.02, "drift_threshold": 0.5, "gate_damping": 0.25,
           "clip": (-5.0, 5.0), "push_rate": 0.01, "min_confidence": 0.1, "drift_mode": "adaptive", "shadow_eta": 0.4,
           "promotion_threshold": 3.5, "tracking_eta": 0.3, "evidence_clip": 2.0, "evidence_allowance": 0.5,
           "lead_rate": 0.2, "prototypes": 2, "spawn_threshold": 0.7, "spawn_support": 2.0, "win_decay": 0.1,
           "learning": "lvq", "units": "criterion", "rate_floor": 0.05, "relevance_rate": 0.02, "miss_penalty": 0.2,
           "rate_per_error": 0.5, "error_decay": 0.05,
           "max_log_events": 100, "judges": {"gauss": {"kind": "gauss", "rate_floor": 0.01, "prior": 2.0}},
           "trust_rate": 0.7, "trust_share": 0.05, "trust_floor": 0.1}


def without_refer(values: dict) -> dict:
    return {name: value for name, value in values.items() if name not in REFER}


def test_every_flat_name_is_one_field_of_one_group_and_every_field_has_one():
    fields = [f.name for f in dataclasses.fields(JudgmentConfig)]
    assert fields == ["rule", "drift", "slots", "learning", "lvq", "log", "judges", "trust"]
    group_fields = [(name, f.name) for name, kind in GROUPS.items() for f in dataclasses.fields(kind)]
    places = list(PATHS.values())
    assert len(set(places)) == len(places) == len(PATHS)  # one place per flat name, no place twice
    assert sorted(path for path in places if len(path) == 2) == sorted(group_fields)  # every group field has one
    assert [path for path in places if len(path) == 1] == [("learning",), ("judges",)]
    assert all(flat_name(GROUPS[path[0]], path[1]) == name for name, path in PATHS.items() if len(path) == 2)
    assert JudgmentConfig.options() == tuple(PATHS) == tuple(now(SEED_BEFORE))  # the order of before
    assert (PATHS["drift_mode"], PATHS["max_log_events"], PATHS["trust_floor"], PATHS["prototypes"]) == \
        (("drift", "mode"), ("log", "max_events"), ("trust", "floor"), ("slots", "prototypes"))


@pytest.mark.parametrize("name", list(PATHS))
def test_every_option_round_trips_by_its_flat_name_and_its_place_in_the_config(name):
    value = CHANGED[name]
    config = JudgmentConfig.recommended().replace(learning="gated") if name == "drift_mode" else JudgmentConfig()
    changed = config.replace(**{name: value})
    path = PATHS[name]
    held = getattr(getattr(changed, path[0]), path[1]) if len(path) == 2 else getattr(changed, path[0])
    assert held == changed.option(name) == getattr(changed, name)  # the grouped read, the flat ones
    if name != "judges":
        assert held == value
    assert JudgmentConfig(**{**config.to_dict(), name: value}) == changed  # the constructor, flat
    assert JudgmentConfig.from_dict(json.loads(json.dumps(changed.to_dict()))) == changed  # through JSON
    others = [other for other in PATHS if other != name]
    assert all(changed.option(other) == config.option(other) for other in others)  # nothing else moved


def test_groups_compose_and_a_flat_option_overrides_its_groups_field():
    config = JudgmentConfig(rule=Rule(tau=0.3, push_rate=0.2), drift={"mode": "adaptive"}, tau=0.2)
    assert config.rule == Rule(tau=0.2, push_rate=0.2) and config.drift == Drift(mode="adaptive")
    assert config == JudgmentConfig(tau=0.2, push_rate=0.2, drift_mode="adaptive")
    assert config.replace(rule=Rule()).rule == Rule()  # a group replaced whole
    assert config.replace(tau=0.5).rule == Rule(tau=0.5, push_rate=0.2)  # one option of it
    recommended = JudgmentConfig.recommended()
    assert (recommended.slots, recommended.lvq) == (
        Slots(prototypes=32, spawn_threshold=0.4, spawn_support=0.25, win_decay=0.01),
        LVQ(units="memory", rate_floor=0.1, relevance_rate=0.05, miss_penalty=0.5, rate_per_error=1.0))
    assert (recommended.rule, recommended.log, recommended.trust) == (Rule(push_rate=0.5), Log(), Trust())
    nested = {"rule": {"push_rate": 0.5}, "slots": dataclasses.asdict(recommended.slots), "learning": "lvq",
              "lvq": dataclasses.asdict(recommended.lvq), "judges": recommended.to_dict()["judges"]}
    assert JudgmentConfig.from_dict(nested) == recommended  # YAML's form: the groups as mappings


def test_old_flat_config_dicts_load_and_to_dict_writes_what_they_wrote():
    # the recommended configuration before issue 43 re-chose it: what its records hold
    recommended_before = JudgmentConfig.recommended().replace(
        units="category", spawn_support=1.5, rate_per_error=0.0, judges=RECOMMENDED_BEFORE["judges"])
    assert JudgmentConfig.from_dict(RECOMMENDED_43) == JudgmentConfig.recommended()
    assert JudgmentConfig.recommended().to_dict() == now(RECOMMENDED_43)
    for before, preset in ((SEED_BEFORE, JudgmentConfig.seed()), (RECOMMENDED_BEFORE, recommended_before)):
        assert JudgmentConfig.from_dict(before) == preset  # act or refer's options dropped: the Decider's now
        assert preset.to_dict() == now(before)  # and the options added since, at their defaults
        assert list(preset.to_dict()) == list(now(before))
        partial = {name: before[name] for name in ("tau", "drift_mode", "prototypes")}  # written before the others
        assert JudgmentConfig.from_dict(partial) == JudgmentConfig.seed().replace(prototypes=before["prototypes"])


def test_a_ledgers_settings_from_before_the_groups_compare_equal():
    """What a durable ledger recorded (``settings()``) is compared key by key when it reopens: the flat
    dict of before, the act-or-refer options aside, for every preset and for the defaults."""
    for before, config in ((SEED_BEFORE, JudgmentConfig.seed()), (RECOMMENDED_43, JudgmentConfig.recommended())):
        assert JudgmentMemory(2, 2, 3, config).settings() == now(before)
    defaults = JudgmentMemory.default_settings()
    assert defaults == now(SEED_BEFORE)  # a setting a ledger lacks, written before it existed, reads as this
    assert all(defaults[name] == value for name, value in ADDED_43.items())  # what gae did before them
    options = {name: value for name, value in CHANGED.items() if name != "drift_mode"}  # lvq is not adaptive
    written = {**now(SEED_BEFORE), **options, "clip": [-5.0, 5.0],
               "judges": {"gauss": {"kind": "gauss", "rate_floor": 0.01, "prior": 2.0}}}
    # every option changed, as gae wrote it
    assert JudgmentMemory(2, 2, 3, JudgmentConfig.seed(), **options).settings() == written


def test_a_memory_without_a_config_is_the_recommended_one_and_the_seed_rule_is_one_word_away():
    assert JudgmentMemory(2, 2, 3).config == JudgmentConfig.recommended()
    assert JudgmentMemory(2, 2, 3, tau=0.3).config == JudgmentConfig.recommended().replace(tau=0.3)  # on top of it
    assert JudgmentMemory(2, 2, 3, config=JudgmentConfig.seed()).config == JudgmentConfig()
    seed_adaptive = JudgmentMemory(2, 2, 3, config=JudgmentConfig.seed(), drift_mode="adaptive").config
    assert seed_adaptive == JudgmentConfig(drift_mode="adaptive")
    # an option the recommended config cannot take says where it came from and how to start from the seed rule
    with pytest.raises(ValueError, match=r"drift_mode='adaptive'.*without config=.*JudgmentConfig\.seed\(\)"):
        JudgmentMemory(2, 2, 3, drift_mode="adaptive")
    with pytest.raises(ValueError, match=r"drift_mode='adaptive'") as info:  # a config given: its own message
        JudgmentMemory(2, 2, 3, JudgmentConfig.recommended(), drift_mode="adaptive")
    assert "without config=" not in str(info.value)


def test_the_kernels_options_are_the_flat_values():
    for config in (JudgmentConfig.seed(), JudgmentConfig.recommended(), JudgmentConfig(clip=(0.0, 1.0)),
                   JudgmentConfig(drift_mode="adaptive", units="criterion")):
        options = Options.of(config)
        flat = config.to_dict()
        assert all(getattr(options, name) == float(flat[name]) for name in Options._fields if name in flat
                   and name != "clip")
        assert (options.clip, options.adaptive, options.lvq, options.pooled) == (
            config.rule.clip is not None, config.drift.mode == "adaptive", config.learning == "lvq",
            config.lvq.units == "category")


def test_config_errors_name_the_option_by_its_flat_name():
    cases = [({"tau": 0}, ValueError, r"tau must be in \(0.0, inf\), got 0.0"),
             ({"drift_mode": "adaptiv"}, ValueError, "drift_mode must be 'seed' or 'adaptive', got 'adaptiv'"),
             ({"trust_rate": -1}, ValueError, r"trust_rate must be in \[0.0, inf\), got -1.0"),
             ({"max_log_events": -1}, ValueError, "max_log_events must be >= 0, got -1"),
             ({"learning": "glvq"}, ValueError, "learning must be 'gated' or 'lvq', got 'glvq'"),
             ({"tau": None}, TypeError, "tau must be a real number, got None"),
             ({"taus": 0.2}, TypeError, r"unknown option\(s\) \['taus'\]"),
             ({"rule": {"tauu": 0.2}}, TypeError, r"rule \(Rule\) has no option\(s\) \['tauu'\]"),
             ({"rule": 0.2}, TypeError, "rule must be a Rule or a mapping of its options, got 0.2"),
             ({"target_error": 0.05}, TypeError, "moved to gae.Decider"),
             ({"learning": "lvq", "drift": Drift(mode="adaptive")}, ValueError, "does not combine with")]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            JudgmentConfig(**options)
        with pytest.raises(error, match=message):
            JudgmentConfig().replace(**options)
    with pytest.raises(ValueError, match=r"trust_share must be in \(0.0, 1.0\]"):
        Trust(share=0)  # a group checks its own options


def test_the_config_repr_is_the_call_that_builds_it():
    options = JudgmentConfig(clip=(0.0, 1.0), drift_mode="adaptive", max_log_events=5)
    for config in (JudgmentConfig(), JudgmentConfig.recommended(), options):
        assert eval(repr(config), {"JudgmentConfig": JudgmentConfig}) == config
    assert repr(JudgmentConfig(drift=Drift(mode="adaptive"))) == "JudgmentConfig(drift_mode='adaptive')"


def test_the_signature_lists_the_groups_then_every_flat_name_that_a_parser_leaves_out_unless_given():
    parameters = inspect.signature(JudgmentConfig).parameters
    fields = [f.name for f in dataclasses.fields(JudgmentConfig)]
    assert list(parameters) == [*fields, *(name for name, path in PATHS.items() if len(path) == 2)]
    assert all(parameters[name].default is argparse.SUPPRESS for name in list(parameters)[len(fields):])
    assert parameters["rule"].default == Rule() and parameters["tau"].annotation is float
    assert math.isclose(JudgmentConfig().drift.promotion_threshold, math.log(20.0))
