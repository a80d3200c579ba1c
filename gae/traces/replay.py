"""Replay an evaluation trace: rebuild every state it names and recompute every answer.

:func:`replay` starts from a checkpoint (:func:`gae.traces.writer.save_checkpoint`), finds the runs
of the trace that start from that state, and walks them line by line: each ``decision`` is
scored again on the rebuilt state (and learned again when it was), and its answer, its
probabilities and what shaped it must equal the trace's exactly; at every call boundary the
state's hash and update counter must equal the line's ``version``. Each ``forget`` /
``delete`` is applied, and the answers it would have changed are listed: for a
JudgmentMemory, each earlier decision scored by the memory retrained without the forgotten
decisions (which is what ``forget_`` leaves, bit for bit); for a RetrievalMemory, each
earlier decision scored by the state it saw, less the deleted memories.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import torch

from gae.judgment import JudgmentConfig, JudgmentMemory
from gae.judgment.config import REFER_OPTIONS
from gae.models.retrieval import RetrievalMemory
from gae.traces.lines import Decisions, Memory, decision_fields, encode, learn_and_shape, score_and_shape
from gae.traces.writer import load_checkpoint, memory_config, memory_kind, read_trace, state_hash


class Mismatch(NamedTuple):
    """A trace line the replay could not reproduce: ``field`` differs (traced vs replayed)."""

    run: str
    line: int
    field: str
    traced: Any
    replayed: Any


class Change(NamedTuple):
    """A decision whose answer a removal changes: traced ``answer``, ``now`` the new one (None: abstains)."""

    line: int
    id: int
    answer: int | None
    now: int | None


class Removal(NamedTuple):
    """A ``forget`` or ``delete`` line and the earlier answers it changes."""

    run: str
    line: int
    kind: str
    ids: list[int]
    changed: list[Change]


class ReplayReport(NamedTuple):
    """What :func:`replay` checked: the runs, the decision lines, every mismatch, every removal."""

    runs: list[str]
    checked: int
    mismatches: list[Mismatch]
    removals: list[Removal]

    @property
    def ok(self) -> bool:
        """Some decision was checked and every line was reproduced exactly."""
        return self.checked > 0 and not self.mismatches


def replay(trace: str | Path | IO[str], checkpoint: str | Path) -> ReplayReport:
    """Replay every run of ``trace`` that passes through the state saved in ``checkpoint``.

    Raises:
        ValueError: the checkpoint is unreadable, or no run of the trace passes through it.
    """
    start, digest = load_checkpoint(checkpoint)
    config = _normal(memory_config(start))
    segments: list[tuple[str, list[dict[str, Any]]]] = []  # a header opens one: a writer's records
    current: dict[str, list[dict[str, Any]]] = {}  # each run's open segment (writers of runs interleave)
    for record in read_trace(trace):
        run = str(record.get("run", ""))
        if record["kind"] == "header" or run not in current:
            current[run] = []
            segments.append((run, current[run]))
        current[run].append(record)
    names: list[str] = []
    checked, mismatches, removals = 0, list[Mismatch](), list[Removal]()
    chains: dict[str, _Chain] = {}  # the run being replayed: a later writer of it may continue its state
    for run, records in segments:
        header = records[0] if records[0]["kind"] == "header" else None
        if header is None or _normal(_completed(header.get("config"))) != config:
            continue
        chain = chains.get(run)
        if chain is not None and chain.alive and state_hash(chain.memory) == header["version"]["hash"]:
            begin = 0  # a writer resumed on the state the last one left: continue
        else:
            found = _start(records, digest)
            if found is None:
                continue
            chain, begin = _Chain(run, start), found
            chains[run] = chain
        if run not in names:
            names.append(run)
        count, failed, effects = chain.walk(records[begin:])
        checked, mismatches, removals = checked + count, mismatches + failed, removals + effects
    if not names:
        raise ValueError(f"no run of the trace starts from or passes through the state in {checkpoint} "
                         f"(hash {digest}, memory {config['kind']})")
    return ReplayReport(names, checked, mismatches, removals)


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _completed(config: Any) -> Any:
    """A header's memory config with the JudgmentMemory options it predates (written before the
    option existed) set to their defaults, which is what the memory that wrote it used, and without
    the act-or-refer options it held before the Decider did (a memory read back drops them too)."""
    if not isinstance(config, dict) or config.get("kind") != "judgment":
        return config
    given = {name: value for name, value in config.items() if name not in REFER_OPTIONS}
    return {**JudgmentConfig().to_dict(), **given}


def _start(records: list[dict[str, Any]], digest: str) -> int | None:
    """Index of the first record to replay: the first whose state is the checkpoint's."""
    for i, record in enumerate(records):
        version = record.get("version") or {}
        if version.get("hash") == digest and version.get("since", 0) == 0:
            return i if record["kind"] == "decision" else i + 1
    return None


def _decision(record: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([record["x"]], dtype=torch.float32), torch.tensor([int(record["category"])])


def _fields(memory: Memory, x: torch.Tensor, category: torch.Tensor, output: Any,
            shaped: dict[str, torch.Tensor], learned: Any = None) -> list[dict[str, Any]]:
    """The reproducible fields of recomputed decisions, encoded and read back as the trace's were."""
    zeros = np.zeros(x.shape[0], dtype=np.int64)
    lines = encode("", memory_kind(memory), [Decisions(zeros, zeros, zeros, 0, "", 0, x, category, output, shaped,
                                                       learned)])
    return [decision_fields(json.loads(line)) for line in lines.splitlines()]


def _score_call(memory: Memory, records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Score the decisions of one score-only call together, as the writer did (a batch of
    queries is not always rounded like each on its own)."""
    x = torch.tensor([record["x"] for record in records], dtype=torch.float32)
    category = torch.tensor([int(record["category"]) for record in records])
    output, shaped = score_and_shape(memory, x, category)
    return {record["line"]: fields for record, fields in zip(records, _fields(memory, x, category, output, shaped),
                                                              strict=True)}


def _recompute(memory: Memory, record: dict[str, Any], confirmed: bool | None = None,
               learn: bool = True) -> dict[str, Any]:
    """Score the record's decision on ``memory`` (and learn it, when it was learned and ``learn``),
    returning the fields the trace holds."""
    x, category = _decision(record)
    learned = record["learned"]
    if learned is None or not learn:
        output, shaped = score_and_shape(memory, x, category)
    else:
        flag = learned["confirmed"] if confirmed is None else confirmed
        x, category, action, flags, skip = memory._check_stream(
            x, category, torch.tensor([int(learned["action"])]), None if flag is None else torch.tensor([bool(flag)]),
            torch.tensor([bool(learned["skip"])]))
        source = torch.tensor([int(record["id"])]) if isinstance(memory, JudgmentMemory) else None
        step, shaped = learn_and_shape(memory, x, category, action, flags, skip, source)
        output = step.output
    return _fields(memory, x, category, output, shaped)[0]


def _same_call(records: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The score-only decision records of the call ``records[index]`` opens."""
    call, end = records[index].get("call"), index
    while (end < len(records) and records[end]["kind"] == "decision" and records[end]["learned"] is None
           and records[end].get("call") == call):
        end += 1
    return records[index:end]


class _Chain:
    """One run being replayed from the checkpoint: its memory and the records walked so far."""

    def __init__(self, run: str, start: Memory) -> None:
        self.run, self.start = run, start
        self.memory = copy.deepcopy(start)
        self.seen: list[dict[str, Any]] = []  # for the removals' counterfactuals
        self.alive = True

    def walk(self, records: list[dict[str, Any]]) -> tuple[int, list[Mismatch], list[Removal]]:
        checked, mismatches, removals = 0, [], []
        memory, run = self.memory, self.run
        scored: dict[int, dict[str, Any]] = {}  # the answers of the score-only call being walked, by line
        for index, record in enumerate(records):
            kind, line, version = record["kind"], record["line"], record.get("version") or {}
            if kind == "parameters":
                _set_parameters(memory, record["values"])
            elif kind in ("forget", "delete"):
                _remove(memory, record)
            if kind != "decision" or version.get("since", 0) == 0:  # a call boundary: the state is named
                hashed, updates = state_hash(memory), memory.version
                if version and (hashed != version["hash"] or updates != version["updates"]):
                    mismatches.append(Mismatch(run, line, "version", version, {"updates": updates, "hash": hashed}))
                    self.alive = False
                    break  # every later line would differ for the same reason
            if kind == "decision":
                if record["learned"] is not None:
                    replayed = _recompute(memory, record)
                else:
                    if record["line"] not in scored:
                        scored = _score_call(memory, _same_call(records, index))
                    replayed = scored[record["line"]]
                checked += 1
                for field, value in replayed.items():  # the trace's own encoding: exact, or it differs
                    if value != record[field]:
                        mismatches.append(Mismatch(run, line, field, record[field], value))
            self.seen.append(record)
            if kind in ("forget", "delete"):
                removal, failed = _removal_effect(run, self.start, self.seen)
                removals.append(removal)
                mismatches += [failed] if failed is not None else []
        return checked, mismatches, removals


def _forgotten_on_copies(start: Memory, seen: list[dict[str, Any]], forgotten_at: dict[int, int]) -> list[Change]:
    """The earlier decisions a forget_ changes, each scored on a copy of the state it saw with the
    memory's own forget_ applied there (for decisions learned before the checkpoint, which a
    retraining from it cannot leave out); a copy whose log no longer reaches them is skipped."""
    replica, changed = copy.deepcopy(start), []
    for index, record in enumerate(seen[:-1]):
        if record["kind"] == "parameters":
            _set_parameters(replica, record["values"])
        elif record["kind"] == "forget":
            _remove(replica, record)
        elif record["kind"] == "decision":
            assert isinstance(replica, JudgmentMemory)  # _remove checked the kind at the forget line
            logged = set(replica.decision_log.events()["source_id"].tolist())
            probe, wanted = copy.deepcopy(replica), sorted(i for i, at in forgotten_at.items() if at > index)
            present = [i for i in wanted if i in logged]
            try:
                if present:
                    probe.forget_(present)
            except ValueError:  # folded by max_log_events: the memory could not forget them either
                continue
            now = _recompute(probe, record, learn=False)["answer"]
            if now != record["answer"]:
                changed.append(Change(record["line"], record["id"], record["answer"], now))
            if record["learned"] is not None:
                _recompute(replica, record)
    return changed


def _remove(memory: Memory, record: dict[str, Any]) -> None:
    """Apply a ``forget`` / ``delete`` line to the memory it names."""
    if record["kind"] == "forget" and isinstance(memory, JudgmentMemory):
        memory.forget_(record["source_ids"])
    elif record["kind"] == "delete" and isinstance(memory, RetrievalMemory):
        memory.delete(record["ids"])
    else:
        raise ValueError(f"trace line {record['line']}: a {record['kind']} line in the run of a "
                         f"{type(memory).__name__}, which cannot {record['kind']}")


def _set_parameters(memory: Memory, values: dict[str, Any]) -> None:
    with torch.no_grad():
        for name, parameter in memory.named_parameters():
            if name in values:
                parameter.copy_(torch.tensor(values[name], dtype=parameter.dtype))


def _removal_effect(run: str, start: Memory, seen: list[dict[str, Any]]) -> tuple[Removal, Mismatch | None]:
    """The decisions before the removal ending ``seen`` whose answers the removals so far change."""
    event = seen[-1]
    key = "source_ids" if event["kind"] == "forget" else "ids"
    removed = {i for record in seen if record["kind"] == event["kind"] for i in record[key]}
    counterfactual = copy.deepcopy(start)
    changed, mismatch = [], None
    scored: dict[int, dict[str, Any]] = {}
    # a decision is forgotten by a forget_ that names its id after it (an id may come back later)
    forgotten_at = {i: position for position, record in enumerate(seen) if record["kind"] == "forget"
                    for i in record["source_ids"]}
    learned_here = {record["id"] for record in seen if record["kind"] == "decision" and record["learned"] is not None}
    if event["kind"] == "forget" and not set(forgotten_at) <= learned_here:
        # some were learned before the checkpoint: forget_ them on a copy of the state at every decision
        return Removal(run, event["line"], "forget", list(event[key]), _forgotten_on_copies(start, seen,
                                                                                             forgotten_at)), None
    if event["kind"] == "forget":  # forget_ equals retraining without: one pass of the counterfactual memory
        for index, record in enumerate(seen[:-1]):
            if record["kind"] == "parameters":
                _set_parameters(counterfactual, record["values"])
            elif record["kind"] == "decision":
                learned = record["learned"]
                if learned is None:
                    if record["line"] not in scored:
                        scored = _score_call(counterfactual, _same_call(seen, index))
                    now = scored[record["line"]]["answer"]
                else:
                    # as forget_ does: a confirmed flag the caller gave is a fact and is kept, one the memory
                    # derived from its own recommendation (None in the trace) is derived again by the counterfactual
                    kept = forgotten_at.get(record["id"], -1) < index
                    now = _recompute(counterfactual, record, learn=kept)["answer"]
                if now != record["answer"]:
                    changed.append(Change(record["line"], record["id"], record["answer"], now))
        retrained = state_hash(counterfactual)
        if retrained != event["version"]["hash"]:  # forget_ must equal retraining without
            mismatch = Mismatch(run, event["line"], "retrained without", event["version"]["hash"], retrained)
    else:  # each earlier decision against the state it saw, less the deleted memories
        for record in seen[:-1]:
            if record["kind"] == "parameters":
                _set_parameters(counterfactual, record["values"])
            elif record["kind"] == "delete":
                _remove(counterfactual, record)
            elif record["kind"] == "decision":
                probe = copy.deepcopy(counterfactual)
                assert isinstance(probe, RetrievalMemory)  # _remove checked the kind at the delete line
                alive = sorted(removed & set(probe.store._column("ids").tolist()))
                if alive:
                    probe.delete(alive)
                now = _recompute(probe, record, learn=False)["answer"]
                if now != record["answer"]:
                    changed.append(Change(record["line"], record["id"], record["answer"], now))
                if record["learned"] is not None:
                    _recompute(counterfactual, record)
    return Removal(run, event["line"], event["kind"], list(event[key]), changed), mismatch
