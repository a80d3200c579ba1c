"""Evaluation traces: the schema, exact replay over a run with drift, a forget_ and a delete, and
the listing of the answers a removal changes against a brute-force recomputation."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from gae.traces.lines import Decisions, encode, json_rows
from gae.traces.replay import replay
from gae.traces.writer import TraceWriter, load_checkpoint, memory_config, read_trace, save_checkpoint, state_hash
from gae.types import MemoryOutput
from training.streams import DecisionStream

ROOT = Path(__file__).resolve().parents[1]
N, BATCH, MIDDLE = 400, 50, 200
FORGOTTEN = [3, 41, 150, 190]


def stream() -> DecisionStream:
    return DecisionStream(n_decisions=N, categories=3, actions=3, factors=5, informative=3, drift_at=N // 2,
                          seed=4)


FACTORIES = {
    "judgment": lambda s: JudgmentMemory(s.category_names, s.action_names, s.factor_names,
                                         config=JudgmentConfig.seed()),
    "judgment_adaptive_prototypes": lambda s: JudgmentMemory(s.category_names, s.action_names, s.factor_names,
                                                             config=JudgmentConfig.seed(),
                                                             drift_mode="adaptive", prototypes=3),
    "knn": lambda s: KNNMemory(factors=s.factor_names, actions=s.action_names, categories=s.category_names, k=3,
                               capacity=60, scoped=True),
    "retrieval": lambda s: RetrievalMemory(factors=s.factor_names, actions=s.action_names,
                                           categories=s.category_names, k=3, capacity=60, scoped=True),
}


def traced_run(name: str, folder: Path) -> tuple[Path, Path, object]:
    """A run through the writer: learned in batches (the attention too, for a JudgmentMemory),
    a score-only call and a forget_ / delete at the middle."""
    s = stream()
    memory = FACTORIES[name](s)
    optimizer = torch.optim.Adam(memory.parameters(), lr=0.05) if isinstance(memory, JudgmentMemory) else None
    path, checkpoint = folder / f"{name}.jsonl", folder / f"{name}.pt"
    with TraceWriter(path, memory, run=name, checkpoint=checkpoint) as writer:
        for start in range(0, N, BATCH):
            batch = s.batch(start, start + BATCH)
            step = writer.prequential_(batch.x, batch.category, batch.action, skip=batch.skip)
            if optimizer is not None:
                loss = memory.attention_loss(step, batch.category, batch.action, batch.skip)
                if loss is not None:
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            if start + BATCH == MIDDLE:
                writer.score(batch.x[:7], batch.category[:7])
                if isinstance(memory, JudgmentMemory):
                    writer.forget_(FORGOTTEN)
                elif isinstance(memory, RetrievalMemory):
                    writer.delete(step.retrieved.ids[-1].tolist())
                writer.score(batch.x[:7], batch.category[:7])
    return path, checkpoint, memory


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def run(request, tmp_path_factory):
    return (request.param, *traced_run(request.param, tmp_path_factory.mktemp(request.param)))


def test_schema(run):
    name, path, _, memory = run
    records = list(read_trace(path))
    assert records[0]["kind"] == "header" and records[0]["memory"] in name
    assert records[0]["config"] == json.loads(json.dumps(memory_config(memory)))
    decisions = [r for r in records if r["kind"] == "decision"]
    assert len(decisions) == N + 14
    a, k = len(memory.action_names), memory.n_factors
    for record in decisions:
        assert set(record) == {"kind", "run", "id", "memory", "call", "version", "x", "category", "answer", "probs",
                               "shaped", "learned", "deleted", "line"}
        assert set(record["version"]) == {"updates", "hash", "since"} and len(record["version"]["hash"]) == 16
        assert len(record["x"]) == k and len(record["probs"]) == a
        assert record["answer"] is None or 0 <= record["answer"] < a
        shaped = record["shaped"]
        if "judgment" in name:
            assert set(shaped) == {"prototype", "distance", "attention"} and len(shaped["attention"]) == k
            assert len(shaped["prototype"]) == len(shaped["distance"]) == a
        else:
            assert len(shaped["ids"]) == memory.k
            assert set(shaped) == ({"ids", "distance"} if name == "knn" else
                                   {"ids", "score", "similarity", "recency", "importance", "store_version", "stored"})
            if record["learned"] is None and name == "retrieval":
                assert shaped["stored"] == -1
    learned = [r for r in decisions if r["learned"] is not None]
    # within a call: the same hash, ``since`` counting, the counter rising by one per decision
    assert [r["version"]["since"] for r in learned[:BATCH]] == list(range(BATCH))
    assert len({r["version"]["hash"] for r in learned[:BATCH]}) == 1
    if name != "retrieval":
        assert [r["version"]["updates"] for r in learned[:BATCH]] == list(range(BATCH))
        assert [r["id"] for r in learned] == list(range(N))
    counters = [r["version"]["updates"] for r in decisions]
    assert counters == sorted(counters)  # monotonic, through the forget_ too
    removals = [r for r in records if r["kind"] in ("forget", "delete")]
    assert len(removals) == (0 if name == "knn" else 1)
    if removals:
        assert decisions[-1]["deleted"] == removals[0]["removed"] > 0
    if "judgment" in name:  # the optimizer's steps are recorded before the calls they precede
        assert sum(r["kind"] == "parameters" for r in records) >= N // BATCH - 2


def test_replay_reproduces_every_line_exactly(run):
    name, path, checkpoint, _ = run
    result = replay(path, checkpoint)
    assert result.runs == [name] and result.checked == N + 14
    assert result.mismatches == [] and result.ok


def test_tampered_lines_are_caught(run, tmp_path):
    name, path, checkpoint, _ = run
    lines = path.read_text().splitlines()
    target = next(i for i, line in enumerate(lines) if '"since":7' in line and '"answer":null' not in line)
    record = json.loads(lines[target])
    record["probs"][0] += 1e-3
    lines[target] = json.dumps(record)
    tampered = tmp_path / "probs.jsonl"
    tampered.write_text("\n".join(lines) + "\n")
    result = replay(tampered, checkpoint)
    assert [(m.line, m.field) for m in result.mismatches] == [(target + 1, "probs")] and not result.ok
    boundary = next(i for i, line in enumerate(lines) if '"since":0' in line and i > target)
    record = json.loads(lines[boundary])
    record["version"]["hash"] = "0" * 16
    lines[boundary] = json.dumps(record)
    tampered.write_text("\n".join(lines) + "\n")
    assert (boundary + 1, "version") in [(m.line, m.field) for m in replay(tampered, checkpoint).mismatches]


def brute_force_changes(path: Path, checkpoint: Path) -> list[int]:
    """Every decision line before the removal whose answer changes: each on a copy of the state
    it was scored on, with the removal applied there by the memory's own forget_ / delete."""
    memory, _ = load_checkpoint(checkpoint)
    records = list(read_trace(path))
    event = next(r for r in records if r["kind"] in ("forget", "delete"))
    changed, learned_ids = [], []
    for record in records[1:]:
        if record is event:
            return changed
        if record["kind"] == "header":
            continue
        if record["kind"] == "parameters":
            with torch.no_grad():
                memory.criterion_logits.copy_(torch.tensor(record["values"]["criterion_logits"]))
            continue
        x, category = torch.tensor([record["x"]]), torch.tensor([record["category"]])
        probe = copy.deepcopy(memory)
        if event["kind"] == "forget":
            logged = set(probe.decision_log.events()["source_id"].tolist())
            present = sorted(set(event["source_ids"]) & logged)
            if present:
                probe.forget_(present)
        else:
            alive = sorted(set(event["ids"]) & set(probe.store._column("ids").tolist()))
            if alive:
                probe.delete(alive)
        with torch.no_grad():
            now = int(probe(x, category).action[0])
        if (None if now < 0 else now) != record["answer"]:
            changed.append(record["line"])
        if record["learned"] is not None:
            learned = record["learned"]
            memory.prequential_(x, category, torch.tensor([learned["action"]]), skip=torch.tensor([learned["skip"]]),
                                source_ids=torch.tensor([record["id"]]))
            learned_ids.append(record["id"])
    raise AssertionError("no removal in the trace")


@pytest.mark.parametrize("name", ["judgment", "retrieval"])
def test_removal_lists_exactly_the_answers_that_change(name, tmp_path):
    path, checkpoint, _ = traced_run(name, tmp_path)
    removal, = replay(path, checkpoint).removals
    assert removal.kind == ("forget" if name == "judgment" else "delete")
    listed = [change.line for change in removal.changed]
    assert listed == brute_force_changes(path, checkpoint)
    assert listed  # forgetting four early decisions / deleting the last neighbours changes something
    assert all(change.answer != change.now for change in removal.changed)


def test_replay_starts_from_a_later_checkpoint(tmp_path):
    """A checkpoint of a state in the middle of the run: the lines from there on are replayed."""
    s = stream()
    memory = FACTORIES["knn"](s)
    path = tmp_path / "later.jsonl"
    with TraceWriter(path, memory, run="later") as writer:
        for start in range(0, N, BATCH):
            if start == MIDDLE:
                save_checkpoint(memory, tmp_path / "middle.pt")
            batch = s.batch(start, start + BATCH)
            writer.prequential_(batch.x, batch.category, batch.action)
    result = replay(path, tmp_path / "middle.pt")
    assert result.ok and result.checked == N - MIDDLE


def test_unrelated_checkpoint_and_bad_files_are_refused(run, tmp_path):
    _, path, _, _ = run
    other = tmp_path / "other.pt"
    save_checkpoint(KNNMemory(factors=2, actions=2), other)
    with pytest.raises(ValueError, match="no run of the trace"):
        replay(path, other)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(other.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable gae checkpoint"):
        load_checkpoint(truncated)
    (tmp_path / "bad.jsonl").write_text('{"kind": "header"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        list(read_trace(tmp_path / "bad.jsonl"))


def test_writer_refuses_what_the_memory_cannot_do():
    s = stream()
    knn, judgment = FACTORIES["knn"](s), FACTORIES["judgment"](s)
    with pytest.raises(TypeError, match="forget_ needs a JudgmentMemory"):
        TraceWriter(io.BytesIO(), knn).forget_([0])
    with pytest.raises(TypeError, match="delete needs a RetrievalMemory"):
        TraceWriter(io.BytesIO(), judgment).delete([0])
    with pytest.raises(TypeError, match="JudgmentMemory, KNNMemory or RetrievalMemory"):
        TraceWriter(io.BytesIO(), torch.nn.Linear(2, 2))
    buffer, before = io.BytesIO(), state_hash(judgment)
    writer = TraceWriter(buffer, judgment)
    size = len(buffer.getvalue())
    with pytest.raises(ValueError):
        writer.prequential_(torch.full((2, 5), float("nan")), torch.zeros(2, dtype=torch.long),
                            torch.zeros(2, dtype=torch.long))
    assert len(buffer.getvalue()) == size and state_hash(judgment) == before  # nothing written, nothing learned


def test_state_hash_sees_every_change():
    s = stream()
    memory = FACTORIES["judgment"](s)
    digest = state_hash(memory)
    assert state_hash(copy.deepcopy(memory)) == digest
    with torch.no_grad():
        memory.criterion_logits[0, 0] += 1e-6
    assert state_hash(memory) != digest
    other = FACTORIES["judgment"](s)
    other.counts[0, 0] = 1
    assert state_hash(other) != digest


def test_fast_encoding_equals_the_json_module():
    """The columnar encoder against json.dumps of the same values: exact float32, null for inf."""
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((64, 5)) * 10.0 ** rng.integers(-9, 9, (64, 5))).astype(np.float32)
    values[3, 2], values[7, 0] = np.inf, -np.inf
    for row, encoded in zip(values, json_rows(values), strict=True):
        parsed = json.loads(encoded)
        expected = [None if not np.isfinite(v) else float(v) for v in row]
        assert [None if p is None else float(np.float32(p)) for p in parsed] == expected
    ints = np.array([-1, 0, 2**40], dtype=np.int64)
    assert [json.loads(b) for b in json_rows(ints)] == [-1, 0, 2**40]
    probs = torch.tensor([[0.25, 0.75], [0.0, 0.0]])
    output = MemoryOutput(probs.log(), probs, torch.tensor([1, -1]), torch.tensor([0.75, 0.0]))
    zeros = np.zeros(2, dtype=np.int64)
    shaped = {"ids": torch.tensor([[3, -1], [-1, -1]]), "distance": torch.tensor([[0.5, np.inf], [np.inf, np.inf]],
                                                                                  dtype=torch.float64)}
    calls = [Decisions(zeros + 5, zeros + 9, zeros, 3, "ab" * 8, 1, torch.ones(2, 2), torch.tensor([0, 1]), output,
                       shaped, None),
             Decisions(zeros + 7, zeros + 11, np.arange(2), 4, "cd" * 8, 2, torch.zeros(2, 2), torch.tensor([1, 1]),
                       output, shaped, (torch.tensor([1, 0]), None, torch.tensor([False, True])))]
    lines = encode('run "%s"', "knn", calls).splitlines()
    assert len(lines) == 4
    assert json.loads(lines[0]) == {
        "kind": "decision", "run": 'run "%s"', "id": 5, "memory": "knn", "call": 3,
        "version": {"updates": 9, "hash": "ab" * 8, "since": 0}, "x": [1.0, 1.0], "category": 0, "answer": 1,
        "probs": [0.25, 0.75], "shaped": {"ids": [3, -1], "distance": [0.5, None]}, "learned": None, "deleted": 1}
    assert json.loads(lines[1])["answer"] is None
    last = json.loads(lines[3])
    assert (last["call"], last["version"], last["deleted"]) == (4, {"updates": 11, "hash": "cd" * 8, "since": 1}, 2)
    assert last["learned"] == {"action": 0, "confirmed": None, "skip": True}


def test_replay_script_lists_the_changes(tmp_path):
    path, checkpoint, _ = traced_run("judgment", tmp_path)
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "replay_trace.py"), str(path), str(checkpoint),
                             "--json_out", str(tmp_path / "replay.json")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert f"{N + 14} decisions recomputed, 0 mismatches" in result.stdout
    assert "forget [3, 41, 150, 190] changes" in result.stdout and "| line | decision |" in result.stdout
    saved = json.loads((tmp_path / "replay.json").read_text())
    assert saved["ok"] and saved["removals"][0]["changed"]


def test_a_resumed_writer_continues_the_run_and_a_new_one_starts_its_own(tmp_path):
    """Writers appending to one file: one resumed on the state the last left chains on; one on a
    fresh memory under the same run name is a run of its own, replayed from the checkpoint."""
    s = stream()
    memory = FACTORIES["judgment"](s)
    path, checkpoint = tmp_path / "resumed.jsonl", tmp_path / "start.pt"
    with TraceWriter(path, memory, run="r", checkpoint=checkpoint) as writer:
        batch = s.batch(0, 100)
        writer.prequential_(batch.x, batch.category, batch.action)
    with TraceWriter(path, memory, run="r") as writer:  # the process restarted with the memory it had
        batch = s.batch(100, 200)
        writer.prequential_(batch.x, batch.category, batch.action)
    with TraceWriter(path, FACTORIES["judgment"](s), run="r") as writer:  # a fresh memory, same name
        batch = s.batch(0, 50)
        writer.prequential_(batch.x, batch.category, batch.action)
    result = replay(path, checkpoint)
    assert result.ok and result.runs == ["r"] and result.checked == 250


def test_runs_written_to_one_file_at_once_are_told_apart(tmp_path):
    s = stream()
    path = tmp_path / "both.jsonl"
    judgment, knn = FACTORIES["judgment"](s), FACTORIES["knn"](s)
    writers = [TraceWriter(path, judgment, run="jm", checkpoint=tmp_path / "jm.pt"),
               TraceWriter(path, knn, run="knn", checkpoint=tmp_path / "knn.pt")]
    for start in range(0, 200, BATCH):  # the lines of the two runs alternate call by call
        batch = s.batch(start, start + BATCH)
        for writer in writers:
            writer.prequential_(batch.x, batch.category, batch.action)
            writer._file.flush()
    for writer in writers:
        writer.close()
    for run in ("jm", "knn"):
        result = replay(path, tmp_path / f"{run}.pt")
        assert result.ok and result.runs == [run] and result.checked == 200


def test_forgetting_decisions_learned_before_the_checkpoint_and_reused_ids(tmp_path):
    """forget_ of decisions the memory learned before the writer opened (the checkpoint holds them),
    and of an id that comes back later: the replay reproduces every line and lists the changes a
    brute force finds."""
    s = stream()
    memory = FACTORIES["judgment"](s)
    early = s.batch(0, 200)
    memory.learn_(early.x, early.category, early.action, skip=early.skip)
    path, checkpoint = tmp_path / "late.jsonl", tmp_path / "late.pt"
    with TraceWriter(path, memory, run="late", checkpoint=checkpoint) as writer:
        batch = s.batch(200, 400)
        ids = torch.arange(200, 400)
        ids[150] = 210  # one id on two decisions: forget_ removes both
        writer.prequential_(batch.x, batch.category, batch.action, skip=batch.skip, source_ids=ids)
        writer.forget_(list(range(0, 120, 3)) + [210])
        again = s.batch(0, 20)  # id 210 comes back after its forget_: a later forget_ keeps it
        writer.prequential_(again.x, again.category, again.action, source_ids=torch.arange(200, 220))
        writer.forget_([205])
    result = replay(path, checkpoint)
    assert result.ok and result.checked == 220
    removal = result.removals[0]
    assert [change.line for change in removal.changed] == brute_force_changes(path, checkpoint)
    assert removal.changed


def test_a_header_written_before_an_option_existed_still_replays(tmp_path):
    """A trace of the seed rule written before ``tracking_eta`` existed: its header lacks the
    option, and the memory that wrote it used the default, so the replay takes it."""
    path, checkpoint, _ = traced_run("judgment", tmp_path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["kind"] == "header" and header["config"].pop("tracking_eta") == 0.2
    lines[0] = json.dumps(header)
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join(lines) + "\n")
    result = replay(old, checkpoint)
    assert result.ok and result.checked == N + 14
    header["config"]["tau"] = 0.5  # a header of another memory still does not match
    lines[0] = json.dumps(header)
    old.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="no run of the trace"):
        replay(old, checkpoint)


def test_a_judgment_trace_checkpoint_of_format_1_is_refused_by_name(tmp_path):
    # format 1 hashed the judgment memory's state in its earlier layout: its trace cannot be replayed bit for bit
    memory = JudgmentMemory(2, 2, 2, config=JudgmentConfig.seed())
    save_checkpoint(memory, tmp_path / "new.pt")
    saved = torch.load(tmp_path / "new.pt", weights_only=True)
    torch.save({**saved, "format": 1}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="before the judgment memory's state layout 2"):
        load_checkpoint(tmp_path / "old.pt")
    knn = KNNMemory(factors=2, actions=2)  # the k-NN's layout did not change: its format-1 checkpoints still load
    save_checkpoint(knn, tmp_path / "knn.pt")
    saved = torch.load(tmp_path / "knn.pt", weights_only=True)
    torch.save({**saved, "format": 1}, tmp_path / "knn_old.pt")
    assert load_checkpoint(tmp_path / "knn_old.pt")[1] == state_hash(knn)


def test_the_writer_logs_a_forget_of_numpy_ids(tmp_path):
    # the removal is written in the same words the memory read its ids in: an id array forgotten is traced
    memory = JudgmentMemory(2, 2, 2, config=JudgmentConfig.seed())
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, memory, run="jm")
    writer.prequential_(torch.rand(6, 2), torch.tensor([0, 1, 0, 1, 0, 1]), torch.tensor([0, 1, 1, 0, 0, 1]))
    assert writer.forget_(np.array([2, 4], dtype=np.uint64)) == 2
    writer.close()
    forgets = [record for record in read_trace(path) if record["kind"] == "forget"]
    assert [record["source_ids"] for record in forgets] == [[2, 4]]
