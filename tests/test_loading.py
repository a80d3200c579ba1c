"""Safe loading. Every artifact gae writes loads with ``torch.load(weights_only=True)`` (saved
results with :func:`gae.safe_load`); a tampered, corrupted or truncated file is refused with a
clear error and runs nothing; a state_dict of other sizes, names or modes is refused, naming the
sizes, before anything is copied; and a load that fails half-way leaves the memory as it was.

(tests/test_battery.py round-trips every memory's state_dict through a weights_only load, and
tests/test_training.py a Lightning checkpoint; this file covers the rest.)
"""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import gae
from gae import EpisodicMemory, JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory, RetrievalScorer
from tests.conftest import MEMORY_FACTORIES, clustered_stream
from tests.test_bad_input import frozen

SEED = JudgmentConfig.seed()  # the original rule, which these tests pin (the default is recommended())

STREAM = clustered_stream(5, 60)


def fed(memory, start: int = 0, stop: int = 60):
    memory.learn_(STREAM.x[start:stop], STREAM.category[start:stop], STREAM.action[start:stop],
                  skip=STREAM.skip[start:stop])
    return memory


def episodic() -> EpisodicMemory:
    memory = EpisodicMemory(4, capacity=6)
    gen = torch.Generator().manual_seed(0)
    memory.add(torch.randn(9, 4, generator=gen), torch.rand(9, generator=gen), scope=["a", 0, "b"] * 3, now=1.0,
               source_ids=[[i] for i in range(9)])
    memory.delete(memory.ids[:1].tolist(), now=2.0)
    return memory


def saved(tmp_path: Path, obj, name: str = "artifact.pt") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


# ---------------------------------------------------------------------------------------
# every artifact loads without pickle code
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [*sorted(MEMORY_FACTORIES), "episodic", "scorer"])
def test_every_state_loads_weights_only_and_through_safe_load(tmp_path, kind):
    if kind == "episodic":
        memory, fresh = episodic(), EpisodicMemory(4, capacity=6)
    elif kind == "scorer":
        memory, fresh = RetrievalScorer(0.5, 0.3, 0.2, tau=60.0, learnable=True), RetrievalScorer(learnable=True)
    else:
        memory, fresh = fed(MEMORY_FACTORIES[kind]()), MEMORY_FACTORIES[kind]()
    path = saved(tmp_path, memory.state_dict())
    plain, safe = torch.load(path, weights_only=True), gae.safe_load(path)
    assert frozen(plain) == frozen(safe) == frozen(memory.state_dict())
    fresh.load_state_dict(safe)
    assert frozen(fresh.state_dict()) == frozen(memory.state_dict())


def test_saved_results_load_through_safe_load(tmp_path):
    judgment, knn, retrieval = (fed(MEMORY_FACTORIES[name]()) for name in ("judgment_adaptive", "knn", "retrieval"))
    memory = episodic()
    results = {
        "judgment step": judgment.prequential_(STREAM.x[:5], STREAM.category[:5], STREAM.action[:5]),
        "knn step": knn.prequential_(STREAM.x[:5], STREAM.category[:5], STREAM.action[:5]),
        "retrieval step": retrieval.prequential_(STREAM.x[:5], STREAM.category[:5], STREAM.action[:5]),
        "output": judgment(STREAM.x[:5], STREAM.category[:5]),
        "gate log": judgment.gate_log,
        "retrieval": memory.retrieve(torch.randn(2, 4), now=3.0, k=3, scopes=[0, "a"]),
        "components": memory.scorer.components(torch.randn(2, 4), memory.embeddings[:3], torch.ones(3),
                                               torch.rand(3)),
        "audit": memory.audit_log,
    }
    path = saved(tmp_path, results)
    loaded = gae.safe_load(path)
    assert {key: type(value) for key, value in loaded.items()} == {key: type(value) for key, value in results.items()}
    assert frozen(loaded) == frozen(results)


# ---------------------------------------------------------------------------------------
# tampered, corrupted, truncated
# ---------------------------------------------------------------------------------------
class Payload:
    """Unpickling this would create ``marker``: code run by loading a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "executed"
    state = fed(JudgmentMemory(4, 4, 8, config=SEED)).state_dict()
    state["_extra_state"]["decision_log"] = Payload(marker)  # hidden deep inside a real state
    archive = saved(tmp_path, state, "tampered.pt")
    raw = tmp_path / "tampered.pkl"
    raw.write_bytes(pickle.dumps({"centroids": Payload(marker)}))
    for unsafe in (lambda: torch.load(archive, weights_only=False), lambda: pickle.loads(raw.read_bytes())):
        unsafe()  # the payloads are live: an unsafe load runs them
        assert marker.exists()
        marker.unlink()
    for path, words in ((archive, ["io.open"]), (raw, [])):
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, weights_only=True)
        with pytest.raises(ValueError) as info:
            gae.safe_load(path)
        assert all(word in str(info.value) for word in [str(path), "nothing in it was run", *words]), str(info.value)
        assert not marker.exists()


def test_a_flipped_byte_in_a_tensor_is_caught(tmp_path):
    """torch.load does not check the archive's CRC-32s; safe_load does."""
    memory = fed(JudgmentMemory(4, 4, 8, config=SEED))
    path = saved(tmp_path, memory.state_dict())
    with zipfile.ZipFile(path) as archive:
        entry = next(info for info in archive.infolist() if info.filename.endswith("/data/0"))
    data = bytearray(path.read_bytes())
    local = entry.header_offset  # the local header's own name and extra lengths (torch pads the extra field)
    start = local + 30 + int.from_bytes(data[local + 26:local + 28], "little") + \
        int.from_bytes(data[local + 28:local + 30], "little")
    assert torch.load(path, weights_only=True)["criterion_logits"].numel() * 4 == entry.file_size
    data[start + 5] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted") as info:
        gae.safe_load(path)
    assert str(path) in str(info.value) and "data/0" in str(info.value)


def test_random_corruption_is_refused_or_harmless(tmp_path):
    """Over seeded random byte changes, safe_load refuses the file or returns exactly the saved
    state (a changed byte the file never reads); never a different state."""
    original = fed(JudgmentMemory(4, 4, 8, config=SEED, prototypes=2)).state_dict()
    data = saved(tmp_path, original, "original.pt").read_bytes()
    rng = random.Random(0)
    refused = 0
    for trial in range(60):
        corrupted = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            corrupted[rng.randrange(len(corrupted))] = rng.randrange(256)
        path = tmp_path / f"corrupted{trial}.pt"
        path.write_bytes(bytes(corrupted))
        try:
            loaded = gae.safe_load(path)
        except ValueError as error:
            assert str(path) in str(error)
            refused += 1
            continue
        assert frozen(loaded) == frozen(original), trial
    assert refused > 40


@pytest.mark.parametrize("cut", ["half", "all but 10 bytes", "empty", "text", "a zip of something else"])
def test_a_truncated_or_foreign_file_is_refused_by_name(tmp_path, cut):
    data = saved(tmp_path, fed(KNNMemory(factors=8, actions=4, capacity=20)).state_dict()).read_bytes()
    path = tmp_path / "bad.pt"
    if cut == "a zip of something else":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("readme.txt", "hello")
    else:
        path.write_bytes({"half": data[: len(data) // 2], "all but 10 bytes": data[:-10], "empty": b"",
                          "text": b"centroids,0.5\n"}[cut])
    with pytest.raises(ValueError) as info:
        gae.safe_load(path)
    assert str(path) in str(info.value)


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        gae.safe_load(tmp_path / "nope.pt")


# ---------------------------------------------------------------------------------------
# a state of other sizes is refused before anything is copied
# ---------------------------------------------------------------------------------------
def without_extra(state: dict) -> dict:
    return {key: value for key, value in state.items() if not key.endswith("_extra_state")}


MISFITS = [  # id, the memory that saved, the memory that loads, drop the names, error, words
    ("other categories", lambda: JudgmentMemory(4, 4, 8, config=SEED), lambda: JudgmentMemory(5, 4, 8, config=SEED),
     True, ValueError, ["criterion_logits: saved (4, 8), this memory (5, 8)",
                        "centroids: saved (4, 4, 1, 8), this memory (5, 4, 1, 8)"]),
    ("other actions", lambda: JudgmentMemory(4, 3, 8, config=SEED), lambda: JudgmentMemory(4, 4, 8, config=SEED),
     True, ValueError, ["centroids: saved (4, 3, 1, 8), this memory (4, 4, 1, 8)",
                        "counts: saved (4, 3, 1), this memory (4, 4, 1)"]),
    ("other factors", lambda: JudgmentMemory(4, 4, 7, config=SEED), lambda: JudgmentMemory(4, 4, 8, config=SEED),
     True, ValueError, ["criterion_logits: saved (4, 7), this memory (4, 8)"]),
    ("other prototypes", lambda: JudgmentMemory(4, 4, 8, config=SEED, prototypes=3),
     lambda: JudgmentMemory(4, 4, 8, config=SEED, prototypes=2),
     True, ValueError, ["centroids: saved (4, 4, 3, 8), this memory (4, 4, 2, 8)", "wins: saved (4, 4, 3)"]),
    ("other prototypes, named", lambda: JudgmentMemory(4, 4, 8, config=SEED, prototypes=3),
     lambda: JudgmentMemory(4, 4, 8, config=SEED, prototypes=2), False, ValueError, ["prototypes=3", "prototypes=2"]),
    ("other categories, adaptive", lambda: JudgmentMemory(4, 4, 8, config=SEED, drift_mode="adaptive"),
     lambda: JudgmentMemory(3, 4, 8, config=SEED, drift_mode="adaptive"), True, ValueError,
     ["shadow_centroids: saved (4, 4, 1, 8), this memory (3, 4, 1, 8)",
      "following: saved (4, 4, 1), this memory (3, 4, 1)"]),
    # one layout in every mode: a seed state has the adaptive buffers, empty
    ("seed into adaptive", lambda: JudgmentMemory(4, 4, 8, config=SEED),
     lambda: JudgmentMemory(4, 4, 8, config=SEED, drift_mode="adaptive"),
     True, ValueError, ["shadow_centroids: saved (0, 0, 0, 0), this memory (4, 4, 1, 8)"]),
    ("knn other capacity", lambda: KNNMemory(factors=8, actions=4, capacity=20, categories=4),
     lambda: KNNMemory(factors=8, actions=4, capacity=30, categories=4), False, ValueError,
     ["store_factors: saved (20, 8), this memory (30, 8)", "store_steps: saved (20,), this memory (30,)"]),
    ("knn other factors", lambda: KNNMemory(factors=7, actions=4, capacity=20),
     lambda: KNNMemory(factors=8, actions=4, capacity=20), True,
     ValueError, ["store_factors: saved (20, 7), this memory (20, 8)"]),
    ("retrieval over capacity", lambda: RetrievalMemory(factors=8, actions=4, capacity=40),
     lambda: RetrievalMemory(factors=8, actions=4, capacity=10),
     False, ValueError, ["40 memories", "capacity=10"]),
    ("retrieval other factors", lambda: RetrievalMemory(factors=7, actions=4, capacity=40),
     lambda: RetrievalMemory(factors=8, actions=4, capacity=40), True, ValueError, ["width (7,)", "dim=8"]),
]


@pytest.mark.parametrize("case,source,target,drop_names,error,words,nested",
                         [(*misfit, nested) for misfit in MISFITS for nested in (False, True)
                          if not (nested and misfit[4] is RuntimeError)],  # a parent's missing keys are torch's
                         ids=[f"{m[0]}{', nested' if nested else ''}" for m in MISFITS for nested in (False, True)
                              if not (nested and m[4] is RuntimeError)])
def test_a_state_of_other_sizes_is_refused_naming_them_and_changes_nothing(case, source, target, drop_names, error,
                                                                          words, nested):
    """``nested``: the memory inside a parent module, as in a Lightning checkpoint."""
    saving, loading = source(), target()
    n_categories = len(saving.category_names or ["all"])
    n_actions, n_factors = len(saving.action_names), saving.n_factors
    gen = torch.Generator().manual_seed(1)
    saving.learn_(torch.rand(50, n_factors, generator=gen), torch.randint(0, n_categories, (50,), generator=gen),
                  torch.randint(0, n_actions, (50,), generator=gen))
    fed_loading = len(loading.category_names or ["all"]), len(loading.action_names), loading.n_factors
    loading.learn_(torch.rand(7, fed_loading[2], generator=gen), torch.randint(0, fed_loading[0], (7,), generator=gen),
                   torch.randint(0, fed_loading[1], (7,), generator=gen))
    state = without_extra(saving.state_dict()) if drop_names else saving.state_dict()
    before = frozen(loading.state_dict())
    if nested:
        parent = nn.ModuleDict({"memory": loading})
        state = {f"memory.{key}": value for key, value in state.items()}
        with pytest.raises(error) as info:
            parent.load_state_dict(state, strict=not drop_names)
    else:
        with pytest.raises(error) as info:
            loading.load_state_dict(state, strict=not drop_names or error is RuntimeError)
    assert all(word in str(info.value) for word in words), (words, str(info.value))
    assert frozen(loading.state_dict()) == before


def test_a_state_of_another_kind_is_refused_naming_it():
    memory = fed(JudgmentMemory(4, 4, 8, config=SEED))
    before = frozen(memory.state_dict())
    state = memory.state_dict()
    misfits = [("counts", state["counts"].float(), ["counts: saved torch.float32, this memory torch.int64"]),
               ("initialized", state["initialized"].long(), ["initialized", "torch.int64", "torch.bool"]),
               ("centroids", state["centroids"].tolist(), ["centroids: saved a list"])]
    for key, value, words in misfits:
        with pytest.raises(ValueError) as info:
            memory.load_state_dict({**state, key: value})
        assert all(word in str(info.value) for word in words), str(info.value)
        assert frozen(memory.state_dict()) == before
    with pytest.raises(TypeError, match="mapping"):
        memory.load_state_dict([("centroids", state["centroids"])])
    with pytest.raises(RuntimeError, match="Unexpected key"):
        memory.load_state_dict({**state, "bogus": torch.zeros(1)})
    assert frozen(memory.state_dict()) == before


def test_a_float64_state_loads_into_a_float32_memory():
    """float32 and float64 load into each other (cast, as torch does): a memory moved with .double()."""
    memory = fed(KNNMemory(factors=8, actions=4, capacity=30, categories=4))
    fresh = KNNMemory(factors=8, actions=4, capacity=30, categories=4)
    fresh.load_state_dict(memory.double().state_dict())
    assert frozen(fresh.state_dict()) == frozen(memory.float().state_dict())


def test_an_inconsistent_episodic_state_is_refused():
    memory = episodic()
    state = memory.state_dict()
    before = frozen(EpisodicMemory(4, capacity=6).state_dict())
    assert len(memory) == 5
    for tampered, words in [({**state, "size": torch.tensor(4)}, ["size=4", "source_ids 5 entries"]),
                            ({**state, "importance": state["importance"][:3]}, ["size=5", "'importance': 3"])]:
        target = EpisodicMemory(4, capacity=6)
        with pytest.raises(ValueError, match="inconsistent") as info:
            target.load_state_dict(tampered)
        assert all(word in str(info.value) for word in words), str(info.value)
        assert frozen(target.state_dict()) == before


# ---------------------------------------------------------------------------------------
# a load that fails half-way is undone
# ---------------------------------------------------------------------------------------
def tampered_extra(kind: str):
    """(the memory that loads, a state whose tensors fit but whose extra state breaks after they are copied)"""
    if kind == "episodic":
        state = episodic().state_dict()
        del state["_extra_state"]["audit_log"]
        return EpisodicMemory(4, capacity=6), state
    source, target = fed(MEMORY_FACTORIES[kind]()), fed(MEMORY_FACTORIES[kind](), 0, 9)
    state = source.state_dict()
    extra = state["_extra_state"]
    if "label_ids" in extra:
        extra["labels"] = extra["labels"][:-1]  # one label short
    else:
        extra["gate_log"] = {"not_a_field": torch.zeros(3)}
    return target, state


@pytest.mark.parametrize("kind", ["judgment", "judgment_adaptive", "judgment_prototypes", "retrieval", "episodic"])
def test_a_load_that_fails_half_way_leaves_the_memory_as_it_was(kind):
    memory, state = tampered_extra(kind)
    before = frozen(memory.state_dict())
    with pytest.raises((TypeError, KeyError, ValueError)):
        memory.load_state_dict(state)
    assert frozen(memory.state_dict()) == before
    # ... whereas torch's own load would have kept the tensors it had copied
    with pytest.raises((TypeError, KeyError, ValueError)):
        nn.Module.load_state_dict(memory, state)
    assert frozen(memory.state_dict()) != before


def test_safe_load_allows_every_named_result_gae_defines(tmp_path):
    from gae.loading import _result_types
    from gae.types import LearnEvents, StreamStep

    allowed = {cls.__qualname__ for cls in _result_types()}
    for name in ("StreamStep", "MemoryOutput", "LearnEvents", "Retrieved", "GateLog", "PromotionLog", "RecycleLog",
                 "Retrieval", "AuditRecord", "Trace", "JudgmentState",
                 "ScoreComponents", "Admission", "ReplayReport", "Mismatch"):
        assert name in allowed, name
    memory = JudgmentMemory(2, 2, 2, config=SEED)
    step = memory.prequential_(torch.rand(4, 2), torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 1, 0]))
    torch.save({"step": step, "trace": memory.trace(0, 0), "state": memory.state()}, tmp_path / "results.pt")
    loaded = gae.safe_load(tmp_path / "results.pt")
    assert isinstance(loaded["step"], StreamStep) and isinstance(loaded["step"].events, LearnEvents)
    assert torch.equal(loaded["state"].centroids, memory.centroids)
