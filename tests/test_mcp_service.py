"""gae-mcp's service (what the tools do, without the protocol): decisions on durable judgment
memories that grow on sight, scoped text memories, and every refused argument named with
nothing changed. tests/test_mcp_server.py drives the same through the SDK's client."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gae import JudgmentConfig
from gae.episodic.embedders import HashingEmbedder
from gae.ledger import ledgers
from gae.mcp import MemoryService, ServerConfig, ToolInputError
from gae.storage import PostgresStore, SQLiteStore

ACTIONS = ["approve", "escalate"]


def service(path, **kwargs) -> MemoryService:
    return MemoryService(lambda: SQLiteStore(path), embedder=HashingEmbedder(64), **kwargs)


def state(svc: MemoryService):
    """What a refused call must leave as it was: each memory's version, names and pending ids,
    and the text memory's version and contents."""
    text = svc._text
    return ({v: (d.version, d.memory.category_names, d.memory.action_names, [p.id for p in d.pending()])
             for v, d in svc._deciders.items()},
            None if text is None else (text.version, list(text.contents)))


@pytest.fixture
def svc(tmp_path):
    return service(tmp_path / "mcp.db", scopes=["alice", "bob"])


def teach(svc: MemoryService, n: int = 20) -> None:
    for i in range(n):
        risk = (i % 10) / 10
        decided = svc.decide("billing", {"amount": 0.5, "risk": risk}, actions=ACTIONS)
        svc.verify(decided["id"], "escalate" if risk >= 0.5 else "approve")


# -- decide, verify, explain -------------------------------------------------------------------
def test_a_new_vocabulary_needs_its_actions_then_grows_on_sight(svc):
    with pytest.raises(ToolInputError, match="actions: no memory decides on factors") as refused:
        svc.decide("billing", {"amount": 0.2, "risk": 0.9})
    assert refused.value.field == "actions" and svc._deciders == {}
    first = svc.decide("billing", {"risk": 0.9, "amount": 0.2}, actions=ACTIONS)
    assert first["action"] is None and first["refer"] and "unseen_category" in first["reasons"]
    assert first["factors"] == ["amount", "risk"]  # one memory per vocabulary, its names sorted
    assert svc.verify(first["id"], "escalate") == {"id": first["id"], "action": "escalate", "learned": True,
                                                   "confirmed": False}
    second = svc.decide("billing", {"amount": 0.2, "risk": 0.9})
    assert second["action"] == "escalate" and "unseen_category" not in second["reasons"]
    svc.verify(svc.decide("support", {"amount": 0.1, "risk": 0.1})["id"], "refund")  # a new category and action
    memory = svc._deciders[("amount", "risk")].memory
    assert memory.category_names == ("billing", "support") and memory.action_names == ("approve", "escalate",
                                                                                       "refund")
    other = svc.decide("billing", {"latency": 3.0}, actions=["retry"])  # another vocabulary, another memory
    assert other["factors"] == ["latency"] and len(svc._deciders) == 2


def test_a_taught_memory_acts_where_it_is_sure_and_refers_where_it_is_not(tmp_path):
    svc = service(tmp_path / "fixed.db", config=ServerConfig(target_error=None))  # no target
    teach(svc, 40)
    sure = svc.decide("billing", {"amount": 0.5, "risk": 0.95})
    assert sure["action"] == "escalate" and not sure["refer"] and sure["reasons"] == []
    assert math.isclose(sum(sure["probs"].values()), 1.0, rel_tol=1e-5)
    unsure = svc.decide("billing", {"amount": 0.5, "risk": 0.45})
    if unsure["refer"]:
        assert set(unsure["reasons"]) <= {"low_confidence", "small_margin"}
    assert svc.decide("refunds", {"amount": 0.5, "risk": 0.9})["reasons"][0] == "unseen_category"


def test_at_its_target_error_the_server_refers_until_the_evidence_lets_it_act(svc, tmp_path):
    """The default target, 2%: with few verified decisions no confidence is proven safe (every
    decision referred, low_confidence); hundreds of right answers at high confidence prove it."""
    assert svc.config.target_error == 0.02
    teach(svc, 40)
    early = svc.decide("billing", {"amount": 0.5, "risk": 0.95})
    assert early["action"] == "escalate" and early["refer"] and early["reasons"] == ["low_confidence"]
    teach(svc, 860)  # about 300 right answers at a level prove it at 2% (delta 0.05 over 27 levels)
    late = svc.decide("billing", {"amount": 0.5, "risk": 0.95})
    assert late["action"] == "escalate" and not late["refer"] and late["reasons"] == []
    decider = svc._deciders[("amount", "risk")]
    assert decider.target_error == 0.02 and decider.referral.threshold <= late["confidence"]
    again = service(tmp_path / "mcp.db", scopes=["alice"])  # a restart: the calibration is in the ledger
    assert again.decide("billing", {"amount": 0.5, "risk": 0.95})["refer"] is False


def test_verify_reports_whether_the_recommendation_was_confirmed(svc):
    teach(svc)
    decided = svc.decide("billing", {"amount": 0.5, "risk": 0.9})
    assert svc.verify(decided["id"], decided["action"])["confirmed"] is True
    decided = svc.decide("billing", {"amount": 0.5, "risk": 0.9})
    assert svc.verify(decided["id"], "approve")["confirmed"] is False
    with pytest.raises(ToolInputError, match="decision_id: .* is not pending"):
        svc.verify(decided["id"], "approve")  # verified already


def test_explain_names_actions_factors_and_judges_of_a_pending_and_a_verified_decision(svc):
    teach(svc)
    decided = svc.decide("billing", {"amount": 0.5, "risk": 0.9})
    pending = svc.explain(decided["id"])
    assert pending["id"] == decided["id"] and pending["action"] == decided["action"]
    assert pending["category"] == "billing" and set(pending["attention"]) == {"amount", "risk"}
    assert set(pending["probs"]) == set(ACTIONS) and math.isclose(pending["confidence"], decided["confidence"],
                                                                 rel_tol=1e-5)
    assert set(pending["judges"]) == {"prototypes", "lda", "bins", "gauss_short", "lda_short"}
    assert math.isclose(sum(j["trust"] for j in pending["judges"].values()), 1.0, rel_tol=1e-5)
    # the bins judge names the bins that decided it: a factor's bin holding its value, in the caller's units
    assert pending["thresholds"] and all(t["judge"] == "bins" and t["factor"] in ("amount", "risk")
                                         and t["nats"] > 0 for t in pending["thresholds"])
    for t in pending["thresholds"]:
        value = {"amount": 0.5, "risk": 0.9}[t["factor"]]
        assert (t["low"] is None or t["low"] <= value) and (t["high"] is None or value < t["high"])
    svc.verify(decided["id"], "escalate")
    assert svc.explain(decided["id"])["action"] == decided["action"]  # by the state it was decided with
    with pytest.raises(ToolInputError, match="decision_id: no decision 'nope'"):
        svc.explain("nope")


BAD_DECISIONS = [
    (("billing", {"amount": float("nan"), "risk": 0.1}), "factors.amount", "finite"),
    (("billing", {"amount": float("inf"), "risk": 0.1}), "factors.amount", "finite"),
    (("billing", {"amount": "high", "risk": 0.1}), "factors.amount", "number"),
    (("billing", {"amount": True, "risk": 0.1}), "factors.amount", "number"),
    (("billing", {}), "factors", "non-empty"),
    (("billing", [0.1, 0.2]), "factors", "object"),
    (("", {"amount": 0.1, "risk": 0.1}), "category", "non-empty"),
    ((3, {"amount": 0.1, "risk": 0.1}), "category", "non-empty"),
    (("billing", {"amount": 0.1, "risk": 0.1}, "approve"), "actions", "list"),
    (("billing", {"amount": 0.1, "risk": 0.1}, ["a", "a"]), "actions", "twice"),
    (("billing", {"amount": 0.1, "risk": 0.1}, ["a", ""]), "actions[1]", "non-empty"),
]


@pytest.mark.parametrize("arguments, field, words", BAD_DECISIONS)
def test_a_refused_decision_names_its_field_and_changes_nothing(svc, arguments, field, words):
    teach(svc, 4)
    before = state(svc)
    with pytest.raises(ToolInputError, match=words) as refused:
        svc.decide(*arguments)
    assert refused.value.field == field and str(refused.value).startswith(f"{field}: ")
    assert state(svc) == before


@pytest.mark.parametrize("arguments, field", [(("nope", "approve"), "decision_id"), (("", "approve"), "decision_id"),
                                              ((None, "approve"), "decision_id"), (("ID", ""), "action"),
                                              (("ID", 7), "action")])
def test_a_refused_verification_names_its_field_and_changes_nothing(svc, arguments, field):
    teach(svc, 4)
    pending = svc.decide("billing", {"amount": 0.5, "risk": 0.5})["id"]
    arguments = tuple(pending if a == "ID" else a for a in arguments)
    before = state(svc)
    with pytest.raises(ToolInputError) as refused:
        svc.verify(*arguments)
    assert refused.value.field == field and state(svc) == before


def test_a_fixed_memory_refuses_names_it_does_not_have(tmp_path):
    config = ServerConfig.from_mapping({"memory": [{"factors": ["risk", "amount"], "categories": ["billing"],
                                                    "actions": ACTIONS}]})
    svc = service(tmp_path / "fixed.db", config=config)
    decided = svc.decide("billing", {"amount": 0.5, "risk": 0.5})  # its actions come from the config
    before = state(svc)
    with pytest.raises(ToolInputError, match="category: 'support' is not one of"):
        svc.decide("support", {"amount": 0.5, "risk": 0.5})
    with pytest.raises(ToolInputError, match="actions: \\['refund'\\] are not"):
        svc.decide("billing", {"amount": 0.5, "risk": 0.5}, actions=["refund"])
    with pytest.raises(ToolInputError, match="action: 'refund' is not one of"):
        svc.verify(decided["id"], "refund")
    assert state(svc) == before
    assert svc.verify(decided["id"], "approve")["learned"]


# -- durable: restarts and a second server -------------------------------------------------------
def test_a_restarted_service_has_every_decision_pending_and_learned(tmp_path):
    path = tmp_path / "restart.db"
    first = service(path)
    teach(first, 10)
    pending = first.decide("billing", {"amount": 0.5, "risk": 0.9})
    probs = pending["probs"]
    again = service(path)  # a new process on the same store
    assert again.decide("billing", {"amount": 0.5, "risk": 0.9})["probs"] == probs
    assert again.verify(pending["id"], "escalate")["learned"]
    assert again._deciders[("amount", "risk")].version == first._deciders[("amount", "risk")].version + 1
    assert ledgers(SQLiteStore(path)) == ['mcp:["amount", "risk"]']


def test_a_second_server_on_the_store_verifies_the_first_ones_decisions(tmp_path):
    path = tmp_path / "two.db"
    one, two = service(path), service(path)
    decided = one.decide("billing", {"amount": 0.5, "risk": 0.9}, actions=ACTIONS)  # a vocabulary two never saw
    assert two.verify(decided["id"], "escalate")["learned"]
    with pytest.raises(ToolInputError, match="not pending"):
        one.verify(decided["id"], "escalate")


def test_a_service_on_postgres_keeps_decisions_and_texts(dsn):
    def open_store():
        return PostgresStore(dsn)

    first = MemoryService(open_store, embedder=HashingEmbedder(64))
    decided = first.decide("billing", {"amount": 0.5, "risk": 0.9}, actions=ACTIONS)
    kept = first.remember("refund approved", "alice")
    again = MemoryService(open_store, embedder=HashingEmbedder(64))
    assert again.verify(decided["id"], "escalate")["learned"]
    assert again.recall("refund", ["alice"])[0]["id"] == kept
    if again.text.store.erases:  # forget erases, as the store promises, or refuses saying why
        assert again.forget([kept]) == [kept] and again.recall("refund", ["alice"]) == []
    else:
        with pytest.raises(ValueError, match="erase=True: PostgresStore cannot guarantee"):
            again.forget([kept])
        assert again.recall("refund", ["alice"])[0]["id"] == kept


# -- text memories -------------------------------------------------------------------------------
def test_remember_recall_forget(svc):
    alice = svc.remember("the refund for the double charge was approved", "alice", importance=0.9)
    svc.remember("the password was reset", "alice")
    bob = svc.remember("the refund was refused", "bob", memory_type="semantic")
    found = svc.recall("refund double charge", ["alice"], k=5)
    assert [m["id"] for m in found][0] == alice and all(m["scope"] == "alice" for m in found)
    assert set(found[0]) == {"id", "text", "scope", "score", "similarity", "recency", "importance"}
    assert math.isclose(found[0]["importance"], 0.9, rel_tol=1e-6)
    assert {m["id"] for m in svc.recall("refund", ["alice", "bob"], k=5)} >= {alice, bob}
    assert svc.forget([alice]) == [alice]
    assert alice not in [m["id"] for m in svc.recall("refund double charge", ["alice"])]


@pytest.mark.parametrize("call, field", [
    (lambda s: s.remember("", "alice"), "text"), (lambda s: s.remember(5, "alice"), "text"),
    (lambda s: s.remember("x", "carol"), "scope"), (lambda s: s.remember("x", ""), "scope"),
    (lambda s: s.remember("x", "alice", importance=1.5), "importance"),
    (lambda s: s.remember("x", "alice", importance=float("nan")), "importance"),
    (lambda s: s.remember("x", "alice", memory_type="fact"), "memory_type"),
    (lambda s: s.recall("", ["alice"]), "query"), (lambda s: s.recall("x", []), "scopes"),
    (lambda s: s.recall("x", "alice"), "scopes"), (lambda s: s.recall("x", ["alice", "carol"]), "scopes[1]"),
    (lambda s: s.recall("x", ["alice"], k=0), "k"), (lambda s: s.recall("x", ["alice"], k=101), "k"),
    (lambda s: s.forget([]), "ids"), (lambda s: s.forget(["0"]), "ids[0]"), (lambda s: s.forget([0, 0]), "ids"),
    (lambda s: s.forget([0, 99]), "ids[1]"),
])
def test_a_refused_text_call_names_its_field_and_changes_nothing(svc, call, field):
    svc.remember("kept", "alice")
    before = state(svc)
    with pytest.raises(ToolInputError) as refused:
        call(svc)
    assert refused.value.field == field and state(svc) == before


def test_forget_refuses_a_memory_of_a_scope_the_server_does_not_serve(tmp_path):
    path = tmp_path / "scoped.db"
    carol = service(path).remember("carol's secret", "carol")  # a server for every scope wrote it
    scoped = service(path, scopes=["alice"])
    assert scoped.text.contents == ["carol's secret"]  # the store's memories, every scope's, are loaded
    before = state(scoped)
    with pytest.raises(ToolInputError, match="ids\\[0\\]: no memory 0 in the scopes") as other_scope:
        scoped.forget([carol])
    with pytest.raises(ToolInputError) as absent:
        scoped.forget([12345])
    assert str(other_scope.value).replace("memory 0", "memory N") == str(absent.value).replace("memory 12345",
                                                                                               "memory N")
    assert state(scoped) == before
    with pytest.raises(ToolInputError, match="scopes\\[0\\]"):
        scoped.recall("secret", ["carol"])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alice", "bob", "carol", "dave"]),
                          st.sampled_from(["refund", "password reset", "late parcel", "refund refused"])),
                min_size=1, max_size=10),
       st.lists(st.sampled_from(["alice", "bob", "carol", "dave"]), min_size=1, max_size=3, unique=True),
       st.sampled_from(["refund", "parcel", "reset password"]), st.integers(1, 8))
def test_recall_never_crosses_a_scope(tmp_path_factory, entries, scopes, query, k):
    svc = service(tmp_path_factory.mktemp("scopes") / "s.db")
    written = {svc.remember(text, scope): scope for scope, text in entries}
    found = svc.recall(query, scopes, k=k)
    assert all(written[m["id"]] in scopes and m["scope"] == written[m["id"]] for m in found)
    assert len(found) == min(k, sum(scope in scopes for scope in written.values()))


# -- what a hostile client tried (the review of this server) -----------------------------------------
def test_a_refused_decision_creates_no_ledger_and_adds_no_action(tmp_path):
    path = tmp_path / "refused.db"
    svc = service(path)
    for factors in ({"x": 1e300}, {"x": 10 ** 400}, {"x": 1e16}):
        with pytest.raises(ToolInputError, match="factors.x: must"):
            svc.decide("c", factors, ["a", "b"])
    assert ledgers(SQLiteStore(path)) == [] and svc._deciders == {}
    svc.decide("c", {"x": 0.5}, ["a", "b"])
    before = state(svc)
    with pytest.raises(ToolInputError, match="factors.x"):
        svc.decide("new", {"x": 1e16}, ["a", "zzz"])
    assert state(svc) == before and svc._deciders[("x",)].memory.action_names == ("a", "b")


def test_strings_no_store_can_hold_and_oversized_calls_are_refused_by_field(tmp_path):
    config = ServerConfig.from_mapping({"limits": {"memories": 2, "factors": 3, "name_length": 10,
                                                   "text_length": 50}})
    svc = service(tmp_path / "limits.db", config=config)
    cases = [(lambda: svc.decide("c\ud800", {"x": 0.1}, ["a"]), "category"),
             (lambda: svc.decide("c", {"x\ud800": 0.1}, ["a"]), "factors.x\ud800"),
             (lambda: svc.decide("c", {"a": 1, "b": 1, "c": 1, "d": 1}, ["a"]), "factors"),
             (lambda: svc.decide("c" * 11, {"x": 0.1}, ["a"]), "category"),
             (lambda: svc.remember("x" * 51, "s"), "text"), (lambda: svc.remember("\ud800", "s"), "text"),
             (lambda: svc.recall("y" * 51, ["s"]), "query")]
    for call, field in cases:
        with pytest.raises(ToolInputError) as refused:
            call()
        assert refused.value.field == field
    svc.decide("c", {"x": 0.1}, ["a"])
    svc.decide("c", {"y": 0.1}, ["a"])
    with pytest.raises(ToolInputError, match="factors: .* holds 2, its limit"):
        svc.decide("c", {"z": 0.1}, ["a"])


def test_every_judgment_memory_shares_one_connection(tmp_path):
    svc = service(tmp_path / "shared.db")
    for i in range(5):
        svc.decide("c", {f"v{i}": 0.1}, ["a"])
    again = service(tmp_path / "shared.db")
    for held in (svc, again):
        assert len(held._deciders) == 5
        assert len({id(d._durable.ledger.store) for d in held._deciders.values()}) == 1


def test_explain_says_a_decision_on_an_unseen_category_had_no_opinion(svc):
    teach(svc, 4)
    decided = svc.decide("never seen", {"amount": 0.5, "risk": 0.5})
    explained = svc.explain(decided["id"])
    assert explained["action"] is None and explained["category"] == "never seen"
    svc.verify(decided["id"], "approve")
    assert svc.explain(decided["id"])["action"] is None


def test_a_second_server_sees_what_the_first_wrote_since_it_started(tmp_path):
    path = tmp_path / "stale.db"
    one, two = service(path), service(path)
    decided = one.decide("c", {"new": 0.5}, ["a"])  # a vocabulary two has not opened
    assert two.explain(decided["id"])["id"] == decided["id"]
    assert two.decide("c", {"new": 0.5})["factors"] == ["new"]  # no actions needed: one named them
    one.decide("c", {"new": 0.5}, ["z"])
    two.decide("c", {"new": 0.5}, ["z"])  # z is there already: not added twice
    assert two._deciders[("new",)].memory.action_names == ("a", "z")
    kept = one.remember("written by one", "fresh scope")
    assert [m["id"] for m in two.recall("written by one", ["fresh scope"])] == [kept]
    assert two.forget([kept]) == [kept]


def test_the_store_remembers_its_embedder_and_refuses_another(tmp_path):
    path = tmp_path / "embedder.db"
    service(path).remember("hashed", "s")
    other = MemoryService(lambda: SQLiteStore(path), embedder=HashingEmbedder(32))
    with pytest.raises(ValueError, match="embedded by hashing-64 \\(64 dimensions\\), not hashing-32"):
        other.recall("hashed", ["s"])


def test_a_decision_another_server_made_on_a_memory_this_one_holds_is_verifiable(tmp_path):
    path = tmp_path / "held.db"
    one, two = service(path), service(path)
    two.verify(two.decide("c", {"x": 0.5}, ["a"])["id"], "a")  # two holds the memory now
    decided = one.decide("c", {"x": 0.5})
    assert two.verify(decided["id"], "a")["learned"]


def test_the_target_is_the_configs_and_servers_of_other_targets_share_a_store(tmp_path):
    off = ServerConfig.from_mapping({"refer": {"target_error": False, "confidence": 0.7}})
    assert off.target_error is None and off.refer_confidence == 0.7 and off.judgment == JudgmentConfig.recommended()
    assert ServerConfig.from_mapping({"refer": {"target_error": 0.05, "margin": 0.2}}).refer_margin == 0.2
    with pytest.raises(ValueError, match="refer.target_error must be in"):
        ServerConfig.from_mapping({"refer": {"target_error": 1.5}})
    with pytest.raises(ValueError, match="target_error must be in"):
        ServerConfig(target_error=1.5)
    previous = ServerConfig.from_mapping({"judgment": {"target_error": 0.05, "refer_confidence": 0.7,
                                                       "refer_margin": 0.3}})  # the previous release's options
    assert (previous.target_error, previous.refer_confidence, previous.refer_margin) == (0.05, 0.7, 0.3)
    assert ServerConfig.from_mapping({"judgment": {"target_error": False}}).target_error is None
    with pytest.raises(ValueError, match="judgment.target_error must be in"):
        ServerConfig.from_mapping({"judgment": {"target_error": 1.5}})
    old = ServerConfig.from_mapping({"refer": {"min_confidence": 0.8, "min_margin": 0.2}})  # the first release's table
    assert (old.refer_confidence, old.refer_margin) == (0.8, 0.2)
    with pytest.raises(ValueError, match=r"\[refer\] min_margin and \[judgment\] refer_margin are one setting"):
        ServerConfig.from_mapping({"refer": {"min_margin": 0.2}, "judgment": {"refer_margin": 0.3}})
    with pytest.raises(ValueError, match=r"^\[refer\] target_error and \[judgment\] target_error are one setting: "
                                         r"give it once, as \[refer\] target_error$"):
        ServerConfig.from_mapping({"refer": {"target_error": 0.1}, "judgment": {"target_error": 0.1}})
    with pytest.raises(ValueError, match=r"\[refer\] confidence and \[refer\] min_confidence are one setting"):
        ServerConfig.from_mapping({"refer": {"confidence": 0.7, "min_confidence": 0.7}})
    first = service(tmp_path / "shared.db", config=off)
    teach(first, 20)
    second = service(tmp_path / "shared.db")  # the default target: the ledger does not check decide's options
    decided = second.decide("billing", {"amount": 0.5, "risk": 0.95})
    assert decided["action"] == "escalate" and decided["reasons"] == ["low_confidence"]  # no evidence yet at 2%
    assert first.decide("billing", {"amount": 0.5, "risk": 0.95})["refer"] is False  # 0.7 without a target


def test_a_memory_keeps_the_judgment_it_was_created_with(tmp_path):
    """A store written by a server whose judgment was another (an older gae's recommended configuration, or
    another [judgment] table) opens under today's: each memory it holds keeps the config its ledger recorded,
    and a new memory takes the server's."""
    before = JudgmentConfig.recommended().replace(units="category", spawn_support=1.5, rate_per_error=0.0,
                                                  judges={"gauss": {}, "lda": {}})
    old = service(tmp_path / "mcp.db", config=ServerConfig(judgment=before))
    teach(old)
    old._store.close()  # (the service holds one connection; a process would exit here)
    new = service(tmp_path / "mcp.db")
    decided = new.decide("billing", {"amount": 0.5, "risk": 0.9})
    assert decided["action"] == "escalate"
    assert new._deciders[("amount", "risk")].memory.config == before
    assert new.verify(decided["id"], "escalate")["learned"]
    new.decide("billing", {"size": 1.0}, actions=ACTIONS)
    assert new._deciders[("size",)].memory.config == JudgmentConfig.recommended()


def test_a_ledger_whose_settings_this_gae_cannot_read_takes_the_servers_and_its_check(tmp_path):
    """A stored memory whose recorded settings are not a judgment config this gae reads opens with the
    server's options, and the ledger's own check decides: an option this gae does not know is ignored (the
    memory opens), a value it refuses is a difference named with the ledger."""
    from gae.ledger import Ledger

    def rewrite(path, change) -> None:
        store = SQLiteStore(path)
        name = next(n for n in ledgers(store) if n.startswith("mcp:"))
        ledger = Ledger(store, name)
        with ledger.writing():
            meta = ledger.meta()
            ledger.set_meta({**meta, "settings": change(meta["settings"])})
        store.close()

    old = service(tmp_path / "mcp.db")
    teach(old)
    old._store.close()
    rewrite(tmp_path / "mcp.db", lambda settings: {**settings, "an_option_from_the_future": 1})
    assert service(tmp_path / "mcp.db").decide("billing", {"amount": 0.5, "risk": 0.9})["action"] == "escalate"
    rewrite(tmp_path / "mcp.db", lambda settings: {**settings, "judges": {"bins": {"kind": "bins", "reach": 1e-4}}})
    with pytest.raises(ValueError, match="judges"):
        service(tmp_path / "mcp.db")
