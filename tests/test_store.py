"""SQLiteStore and EpisodicMemory(store=...): write-through, exact restore, kill safety, scopes, audit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae import AdmissionPolicy, EpisodicMemory
from gae.episodic.records import COLUMNS as _COLUMNS
from gae.storage import Change, Rows, SQLiteStore
from gae.storage.base import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
DIM = 6


def index_of(memory: EpisodicMemory) -> dict:
    """Everything the tensor index holds (its live rows) and its bookkeeping."""
    return {**{name: memory._column(name).clone() for name in ("embeddings", *_COLUMNS)},
            "version": memory.version, "next_id": int(memory.next_id), "scope_names": list(memory.scope_names),
            "source_ids": list(memory.source_ids), "audit": list(memory.audit_log)}


def assert_same_index(a: EpisodicMemory, b: EpisodicMemory, float_tolerance: bool = False) -> None:
    """Both indexes alike, bit for bit; with ``float_tolerance`` (one side written on another CPU)
    the floats within a few float32 ulps: ``torch.randn`` and the unit-norm scaling draw other
    last bits on other SIMD kernels."""
    left, right = index_of(a), index_of(b)
    for key, value in left.items():
        if isinstance(value, torch.Tensor) and float_tolerance and value.is_floating_point():
            torch.testing.assert_close(value, right[key], rtol=1e-5, atol=1e-6, msg=key)
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, right[key]), key
        else:
            assert value == right[key], key


def busy_memory(store, seed: int = 0, capacity: int = 12) -> EpisodicMemory:
    """A memory that has added, evicted, deleted, expired and refused, on the given store."""
    gen = torch.Generator().manual_seed(seed)
    memory = EpisodicMemory(DIM, capacity=capacity, store=store)
    for step in range(6):
        n = 4
        memory.add(torch.randn(n, DIM, generator=gen), torch.rand(n, generator=gen), now=float(step),
                   scope=["alice", 3, "bob", "alice"], memory_type=["episode", "semantic", "episode", "episode"],
                   confidence=torch.rand(n, generator=gen), source_ids=[(step, i) for i in range(n)],
                   valid_until=torch.tensor([float("inf"), 50.0, 8.0, float("inf")], dtype=torch.float64),
                   content=[f"refund {step}", None, "vendor address mismatch", f"note {step}"])
    memory.delete(memory._column("ids")[:2], now=6.0, reason="user asked")
    memory.expire(now=9.0)
    policy = AdmissionPolicy()
    traces = [{"embedding": torch.randn(DIM, generator=gen), "importance": 0.7, "outcome": outcome,
               "quality": 0.9, "scope": "bob", "content": "admitted trace"} for outcome in ("success", "failure")]
    memory.admit_and_add(traces, policy, now=10.0)
    return memory


def test_reopening_restores_the_index_exactly(tmp_path):
    path = tmp_path / "memory.db"
    memory = busy_memory(SQLiteStore(path))
    actions = [record.action for record in memory.audit_log]
    assert {"add", "evict", "delete", "expire", "reject"} <= set(actions)
    memory.store.close()
    reopened = EpisodicMemory(DIM, capacity=12, store=SQLiteStore(path))
    assert_same_index(memory, reopened)
    queries = torch.randn(3, DIM, generator=torch.Generator().manual_seed(5))
    for scopes in (None, ["alice"], [[3], ["bob", "alice"], []]):
        a = memory.retrieve(queries, now=11.0, k=4, scopes=scopes)
        b = reopened.retrieve(queries, now=11.0, k=4, scopes=scopes)
        assert torch.equal(a.ids, b.ids) and torch.equal(a.scores, b.scores)
    # and it goes on where the other left off: same ids, same version
    assert reopened.add(torch.randn(1, DIM), 0.5, now=12.0).tolist() == [int(memory.next_id)]


def test_store_audit_is_complete_and_equals_the_memorys(tmp_path):
    store = SQLiteStore(tmp_path / "memory.db", actor="tester")
    memory = busy_memory(store)
    audit = store.audit()
    assert [(e.action, e.time, e.ids, e.reason, e.version) for e in audit] == [tuple(r) for r in memory.audit_log]
    assert {e.actor for e in audit} == {"tester"}
    mutations = [e for e in audit if e.action != "reject"]
    assert [e.version for e in mutations] == list(range(1, memory.version + 1))  # one row per mutation
    assert sum(e.action == "reject" for e in audit) == 1


def test_store_retrieval_equals_the_tensor_index(tmp_path):
    store = SQLiteStore(tmp_path / "memory.db")
    memory = busy_memory(store)
    queries = torch.randn(4, DIM, generator=torch.Generator().manual_seed(2))
    weights = tuple(float(w) for w in memory.scorer.weights)
    for scopes in (None, ["bob", 3], [["alice"], [3], ["bob"], ["alice", "bob", 3]]):
        ours = memory.retrieve(queries, now=11.0, k=5, scopes=scopes)
        theirs = store.retrieve(queries.numpy(), 11.0, 5, scopes, weights=weights, tau=float(memory.scorer.tau))
        assert ours.ids.tolist() == theirs.ids.tolist()
        finite = np.isfinite(theirs.scores)
        np.testing.assert_allclose(ours.scores.numpy()[finite], theirs.scores[finite], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours.similarity.numpy(), theirs.similarity, rtol=1e-5, atol=1e-6)


def test_deletes_and_validity_are_honoured_in_the_store(tmp_path):
    path = tmp_path / "memory.db"
    store = SQLiteStore(path)
    memory = EpisodicMemory(DIM, capacity=10, store=store)
    ids = memory.add(torch.eye(DIM)[:4], 0.5, now=0.0, valid_from=torch.tensor([0.0, 5.0, 0.0, 0.0]),
                     valid_until=torch.tensor([10.0, 20.0, 3.0, float("inf")]), content=["a b", "c", "d", "secret"])
    memory.delete([int(ids[3])], now=1.0)
    probe = np.eye(DIM)[:4].astype(np.float32)
    seen_at = {t: set(store.retrieve(probe, float(t), 4).ids.ravel().tolist()) - {-1} for t in (1, 4, 6, 12)}
    assert seen_at == {1: {0, 2}, 4: {0}, 6: {0, 1}, 12: {1}}
    raw = sqlite3.connect(path).execute("SELECT content, embedding, deleted_at, deleted_reason FROM memories "
                                        "WHERE seq = 3").fetchone()
    assert raw == (None, None, 1.0, "delete")  # the user's data is gone; the tombstone stays
    assert store.retrieve(probe, 1.0, 4, text="secret", w_text=5.0).text.max() == 0.0


def test_text_match_term_ranks_matching_content_first(tmp_path):
    store = SQLiteStore(tmp_path / "memory.db")
    memory = EpisodicMemory(DIM, capacity=10, store=store)
    memory.add(torch.ones(3, DIM), 0.5, now=0.0, content=["refund for a late delivery", "vendor address", None])
    query = np.ones((1, DIM), np.float32)
    plain = store.retrieve(query, 0.0, 3)
    assert plain.ids[0].tolist() == [0, 1, 2]  # equal scores: the older memory first
    found = store.retrieve(query, 0.0, 3, text="vendor", w_text=0.5)
    assert found.ids[0, 0] == 1 and found.text[0].tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="text"):
        store.retrieve(query, 0.0, 3, text=["a", "b"], w_text=0.5)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.lists(st.sampled_from(["u1", "u2", "u3", 0, 7]),
                                                               min_size=1, max_size=3))
def test_scopes_are_enforced_by_the_store(seed, n, allowed):
    gen = np.random.default_rng(seed)
    store = SQLiteStore(":memory:")
    store.open(DIM)
    keys = ["u1", "u2", "u3", "#0", "#7"]
    scope = [keys[i] for i in gen.integers(0, len(keys), n)]
    embedding = gen.normal(size=(n, DIM)).astype(np.float32)
    embedding /= np.linalg.norm(embedding, axis=1, keepdims=True)
    rows = Rows(seq=np.arange(n), embedding=embedding, scope=scope, memory_type=["episode"] * n,
                importance=gen.random(n), confidence=np.ones(n), created_at=gen.random(n) * 10,
                valid_from=np.full(n, -np.inf), valid_until=np.full(n, np.inf), source_ids=[()] * n)
    store.commit(Change(added=rows, version=1, next_id=n))
    wanted = {key if isinstance(key, str) else f"#{key}" for key in allowed}
    result = store.retrieve(gen.normal(size=(3, DIM)), 10.0, k=n, scopes=allowed)
    returned = result.ids[result.ids >= 0]
    assert all(scope[i] in wanted for i in returned.tolist())
    assert len(returned) == 3 * sum(s in wanted for s in scope)  # and every visible row is found


def test_bad_input_is_refused_and_writes_nothing(tmp_path):
    path = tmp_path / "memory.db"
    store = SQLiteStore(path)
    memory = EpisodicMemory(DIM, capacity=10, store=store)
    memory.add(torch.randn(2, DIM), 0.5, now=0.0)
    before = store.audit(), index_of(memory)
    with pytest.raises(ValueError, match="embeddings"):
        memory.add(torch.full((1, DIM), float("nan")), 0.5, now=1.0)
    with pytest.raises(ValueError, match="content"):
        memory.add(torch.randn(2, DIM), 0.5, now=1.0, content=["only one"])
    with pytest.raises(ValueError, match="unknown scope"):
        memory.retrieve(torch.randn(1, DIM), now=1.0, scopes=["nobody"])
    bad = Rows(seq=np.array([9]), embedding=np.full((1, DIM), np.inf, np.float32), scope=["x"],
               memory_type=["episode"], importance=np.ones(1), confidence=np.ones(1), created_at=np.zeros(1),
               valid_from=np.zeros(1), valid_until=np.ones(1), source_ids=[()])
    with pytest.raises(ValueError, match="finite"):
        store.commit(Change(added=bad, version=99))
    with pytest.raises(ValueError, match=f"embedding must be \\(1, {DIM}\\)"):
        store.commit(Change(added=Rows(**{**bad.__dict__, "embedding": np.ones((1, DIM + 1), np.float32)})))
    with pytest.raises(ValueError, match="memory_type"):
        store.commit(Change(added=Rows(**{**bad.__dict__, "embedding": np.ones((1, DIM), np.float32),
                                          "memory_type": ["rumour"]})))
    assert store.audit() == before[0]
    assert_same_index(memory, EpisodicMemory(DIM, capacity=10, store=SQLiteStore(path)))
    with pytest.raises(ValueError, match=f"dim={DIM}, not dim=4"):
        EpisodicMemory(4, store=SQLiteStore(path))
    with pytest.raises(ValueError, match="capacity=1"):
        EpisodicMemory(DIM, capacity=1, store=SQLiteStore(path))
    with pytest.raises(TypeError, match="store"):
        EpisodicMemory(DIM, store="memory.db")


class FailingStore(SQLiteStore):
    """A real SQLite store whose n-th commit fails before writing (a full disk, a lost server)."""

    def __init__(self, path, fail_at: int) -> None:
        super().__init__(path)
        self.calls, self.fail_at = 0, fail_at

    def commit(self, change: Change) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError("disk full")
        super().commit(change)


def test_a_failed_write_leaves_the_index_as_the_store_has_it(tmp_path):
    store = FailingStore(tmp_path / "memory.db", fail_at=3)
    memory = EpisodicMemory(DIM, capacity=3, store=store)
    memory.add(torch.randn(2, DIM), 0.5, now=0.0)
    memory.add(torch.randn(1, DIM), 0.5, now=1.0)
    before = index_of(memory)
    with pytest.raises(OSError, match="disk full"):
        memory.add(torch.randn(2, DIM), 0.5, now=2.0)  # would add two and evict two
    after = index_of(memory)
    for key, value in before.items():
        assert torch.equal(value, after[key]) if isinstance(value, torch.Tensor) else value == after[key], key
    memory.add(torch.randn(1, DIM), 0.5, now=3.0)  # and it carries on from the stored state
    assert_same_index(memory, EpisodicMemory(DIM, capacity=3, store=SQLiteStore(tmp_path / "memory.db")))


def test_a_store_of_this_schema_version_opens_and_a_newer_one_is_refused(tmp_path):
    path = tmp_path / "memory.db"
    busy_memory(SQLiteStore(path)).store.close()
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    # written by gae 0.1.0 (schema 1) with busy_memory(seed=0): later versions must open it
    fixture = tmp_path / "store_v1.db"
    shutil.copyfile(ROOT / "tests" / "data" / "store_v1.db", fixture)
    opened = EpisodicMemory(DIM, capacity=12, store=SQLiteStore(fixture))
    assert len(opened) == 9 and opened.version == 12 and opened.scope_names == ["alice", "bob"]
    assert_same_index(opened, busy_memory(SQLiteStore(":memory:")), float_tolerance=True)  # written on another CPU
    connection = sqlite3.connect(path)
    connection.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    connection.commit()
    with pytest.raises(ValueError, match="newer than this gae"):
        EpisodicMemory(DIM, store=SQLiteStore(path))


WRITER = textwrap.dedent("""
    import sys, torch
    from gae import EpisodicMemory
    from gae.storage import SQLiteStore
    memory = EpisodicMemory({dim}, capacity=50, store=SQLiteStore(sys.argv[1], synchronous="NORMAL"))
    gen = torch.Generator().manual_seed(0)
    for step in range(100000):
        x, importance = torch.randn(3, {dim}, generator=gen), torch.rand(3, generator=gen)
        ids = memory.add(x, importance, now=float(step), scope=step % 4)
        print(step, *ids.tolist(), flush=True)  # reported only once add has returned
""")


def test_a_killed_process_loses_nothing_it_reported_stored(tmp_path):
    path = tmp_path / "memory.db"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(dim=DIM))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    reported = []
    for line in process.stdout:
        reported.append([int(v) for v in line.split()])
        if len(reported) == 150:  # in the middle of the stream: adds are being written as we kill
            os.kill(process.pid, signal.SIGKILL)
            break
    process.wait()
    reopened = EpisodicMemory(DIM, capacity=50, store=SQLiteStore(path))
    committed = reopened.audit_log[-1]
    steps = sum(record.action == "add" for record in reopened.audit_log)
    assert steps >= len(reported)  # every reported add is there (and maybe one more, not yet reported)
    # the store holds exactly the first `steps` adds of the stream: replay them in memory and compare
    replay = EpisodicMemory(DIM, capacity=50)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        replay.add(torch.randn(3, DIM, generator=gen), torch.rand(3, generator=gen), now=float(step), scope=step % 4)
    assert_same_index(replay, reopened)
    assert committed.version == reopened.version
    for step, *ids in reported:
        added = [r for r in reopened.audit_log if r.action == "add" and r.time == float(step)]
        assert [list(r.ids) for r in added] == [ids]


def test_rows_from_the_store_keep_json_provenance(tmp_path):
    path = tmp_path / "memory.db"
    memory = EpisodicMemory(DIM, capacity=4, store=SQLiteStore(path))
    memory.add(torch.randn(2, DIM), 0.5, now=0.0, source_ids=[(1, 2, 3), ()])
    stored = sqlite3.connect(path).execute("SELECT source_ids, sensitivity, memory_type FROM memories "
                                           "ORDER BY seq").fetchall()
    assert [(json.loads(s), t, m) for s, t, m in stored] == [([1, 2, 3], "normal", "episode"),
                                                             ([], "normal", "episode")]


def test_scope_names_may_not_look_like_integer_scopes(tmp_path):
    memory = EpisodicMemory(DIM, capacity=4, store=SQLiteStore(tmp_path / "memory.db"))
    with pytest.raises(ValueError, match="may not start with '#'"):
        memory.add(torch.randn(2, DIM), 0.5, scope=["#5", 5], now=0.0)
    assert len(memory) == 0 and memory.store.audit() == []


class UnreachableStore(SQLiteStore):
    """A real SQLite store that, once cut off, can neither commit nor be read (a lost server)."""

    cut = False

    def commit(self, change: Change) -> None:
        if self.cut:
            raise OSError("connection lost")
        super().commit(change)

    def open(self, dim: int, audit_last: int | None = None):
        if self.cut:
            raise OSError("connection lost")
        return super().open(dim, audit_last)


def test_a_store_that_cannot_be_read_back_leaves_no_stale_index(tmp_path):
    store = UnreachableStore(tmp_path / "memory.db")
    memory = EpisodicMemory(DIM, capacity=4, store=store)
    memory.add(torch.randn(2, DIM), 0.5, now=0.0)
    store.cut = True
    with pytest.raises(OSError):
        memory.add(torch.randn(1, DIM), 0.5, now=1.0)  # the commit fails, and so does the reload
    with pytest.raises(OSError):
        memory.retrieve(torch.randn(1, DIM), now=2.0)  # nothing is served from an index the store did not accept
    store.cut = False
    assert memory.retrieve(torch.randn(1, DIM), now=2.0).ids.shape == (1, 5)  # the call reloads first
    assert memory.version == 1 and len(memory) == 2


def test_a_store_backed_memory_refuses_load_state_dict(tmp_path):
    memory = EpisodicMemory(DIM, capacity=4, store=SQLiteStore(tmp_path / "memory.db"))
    plain = EpisodicMemory(DIM, capacity=4)
    plain.add(torch.randn(2, DIM), 0.5, now=0.0)
    with pytest.raises(RuntimeError, match="backed by a store"):
        memory.load_state_dict(plain.state_dict())
    assert len(memory) == 0


def test_text_relevance_is_scaled_among_the_rows_a_query_may_see(tmp_path):
    store = SQLiteStore(tmp_path / "memory.db")
    memory = EpisodicMemory(DIM, capacity=10, store=store)
    memory.add(torch.ones(2, DIM), 0.5, now=0.0, scope=["mine", "theirs"],
               content=["refund", "refund refund refund request for a refund"])
    mine = store.retrieve(np.ones((1, DIM), np.float32), 0.0, 2, ["mine"], text="refund", w_text=1.0)
    assert mine.text[0, 0] == 1.0  # the best match it can see, whatever another scope holds
