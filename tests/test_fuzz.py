"""Hypothesis fuzzing of the two doors that take raw outside data: the single-decision API
(``score_one`` / ``learn_one`` with arbitrary factors, names, outcomes and flags) and the file
parser of ``FileDecisionStream`` (arbitrary CSV and JSON Lines). Nothing raises anything but the
documented ValueError / TypeError, a refused call changes no state, and what is accepted is
sound (names from the memory, confidences in [0, 1], finite state; finite, in-range tensors).
Bounded and derandomized: the same examples on every run, a few seconds in all.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gae import JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from tests.conftest import clustered_stream
from tests.test_bad_input import frozen
from training.streams_file import FileDecisionStream

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CATEGORIES, ACTIONS = ("invoice", "refund", "travel", "payroll"), ("approve", "review", "escalate", "reject")
MEMORIES = {
    "judgment": lambda: JudgmentMemory(CATEGORIES, ACTIONS, 8, config=JudgmentConfig.seed()),
    "judgment_adaptive": lambda: JudgmentMemory(CATEGORIES, ACTIONS, 8, config=JudgmentConfig.seed(),
                                                drift_mode="adaptive"),
    "judgment_prototypes": lambda: JudgmentMemory(CATEGORIES, ACTIONS, 8, config=JudgmentConfig.seed(), prototypes=3),
    "knn": lambda: KNNMemory(factors=8, actions=ACTIONS, k=3, capacity=20, categories=CATEGORIES, scoped=True),
    "knn_uncategorised": lambda: KNNMemory(factors=8, actions=ACTIONS, k=3, capacity=20),
    "retrieval": lambda: RetrievalMemory(factors=8, actions=ACTIONS, k=3, capacity=20, categories=CATEGORIES,
                                         scoped=True),
}
_FED: dict[str, torch.nn.Module] = {}


def fed(name: str):
    if name not in _FED:
        memory, history = MEMORIES[name](), clustered_stream(6, 30)
        memory.learn_(history.x, history.category, history.action, skip=history.skip)
        _FED[name] = memory
    return copy.deepcopy(_FED[name])


def finite_state(memory) -> bool:
    return all(bool(torch.isfinite(t).all()) for key, t in memory.state_dict().items()
               if isinstance(t, torch.Tensor) and t.is_floating_point() and "valid_" not in key)


# ---------------------------------------------------------------------------------------
# the single-decision API
# ---------------------------------------------------------------------------------------
number = st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                   st.booleans())
factors = st.one_of(
    st.lists(st.floats(0, 1), min_size=8, max_size=8),  # well-formed
    st.lists(number, min_size=8, max_size=8),  # the right length, any numbers
    st.lists(st.one_of(number, st.text(max_size=2), st.none()), max_size=10),  # anything
    st.lists(st.floats(0, 1), min_size=8, max_size=8).map(np.array),
    st.lists(st.floats(allow_nan=True, width=32), min_size=8, max_size=8).map(torch.tensor),
    st.text(max_size=8), st.none(), st.integers())
anything = st.one_of(st.sampled_from(CATEGORIES + ACTIONS + ("general", "")), st.text(max_size=4), st.integers(-3, 6),
                     st.integers(-10**30, 10**30), st.none(), st.booleans(), st.floats())
category = st.one_of(st.sampled_from(CATEGORIES), st.integers(0, 3), anything)  # valid often enough to learn
action = st.one_of(st.sampled_from(ACTIONS), st.integers(0, 3), anything)
outcome = st.one_of(st.none(), st.just("__incorrect__"), st.text(max_size=6), st.binary(max_size=3), st.integers())
confirmed = st.one_of(st.none(), st.booleans(), st.integers(-1, 2), st.text(max_size=2))


@pytest.mark.parametrize("memory_name", sorted(MEMORIES))
@FUZZ
@given(factors=factors, category=category, action=action, confirmed=confirmed, outcome=outcome)
def test_the_single_decision_api_refuses_cleanly_or_answers_soundly(memory_name, factors, category, action,
                                                                   confirmed, outcome):
    memory = fed(memory_name)
    before = frozen(memory.state_dict())
    try:
        answer, confidence = memory.score_one(factors, category)
    except (ValueError, TypeError):
        pass
    else:
        assert answer is None or answer in ACTIONS
        assert 0.0 <= confidence <= 1.0 and (answer is not None or confidence == 0.0)
    assert frozen(memory.state_dict()) == before  # scoring never changes the state
    try:
        verdict = memory.learn_one(factors, action, category, confirmed=confirmed, outcome=outcome)
    except (ValueError, TypeError):
        assert frozen(memory.state_dict()) == before
    else:
        assert isinstance(verdict, dict) and isinstance(verdict["skipped"], bool)
        assert verdict["skipped"] or (math.isfinite(verdict["eta"]) and verdict["disp"] >= 0)
        assert finite_state(memory)


# ---------------------------------------------------------------------------------------
# the file parser
# ---------------------------------------------------------------------------------------
OPTIONAL = ("confirmed", "outcome", "timestamp", "id", "truth", "note")
text_number = st.one_of(st.floats(-2, 2).map(repr), st.floats().map(repr), st.integers(-10**400, 10**400).map(str),
                        st.sampled_from(["", " 0.5 ", "1e39", "-3.4e38", "0x10", "1_000", "nan", "-inf"]))
label = st.one_of(st.sampled_from(["a", "b", "0", "1", "2", "-1", " a", "", "+1", "007", "123456789"]),
                  st.text(max_size=3))
CELLS = {"category": label, "action": label, "truth": label, "f1": text_number, "f2": text_number,
         "confirmed": st.sampled_from(["1", "0", "-1", "", "true", "FALSE", "2", "yes", " 1 "]),
         "outcome": st.sampled_from(["", "__incorrect__", "uncertain", "UNCERTAIN ", "ok", "\x00"]),
         "timestamp": st.one_of(text_number,
                                st.sampled_from(["2024-01-01T00:00:00Z", "2024-01-01", "2024-13-01",
                                                 "2024-01-01T00:00:00+05:00", "10:00", "1e400"])),
         "id": st.one_of(st.integers(-10**30, 10**30).map(str), st.sampled_from(["", "1.0", "x", "+4"])),
         "note": st.text(max_size=3)}
CLEAN_CELLS = {**CELLS, "category": st.sampled_from(["a", "b", "c"]), "action": st.sampled_from(["a", "b"]),
               "truth": st.sampled_from(["a", "b"]), "f1": st.floats(0, 1).map(repr), "f2": st.floats(0, 1).map(repr),
               "timestamp": st.floats(0, 1e9).map(repr), "id": st.integers(0, 99).map(str)}
OPTIONS = st.fixed_dictionaries({
    "factors": st.sampled_from([["f1", "f2"], "f", ["f1"], ["f2", "f1"], ["f3"]]),
    "truth_column": st.sampled_from([None, None, "truth"]),
    "categories": st.sampled_from([None, None, 2, ["a", "b"]]),
    "actions": st.sampled_from([None, None, 3, ["a", "b"]])})


@st.composite
def tables(draw) -> tuple[list[str], list[dict[str, str]]]:
    """A header (the required columns, some optional ones, in any order) and rows of cells, either
    all well-formed (a file that should load) or each drawn from good and bad values alike."""
    columns = ["category", "action", "f1", "f2", *draw(st.lists(st.sampled_from(OPTIONAL), unique=True, max_size=4))]
    columns = draw(st.permutations(columns))
    cells = CLEAN_CELLS if draw(st.booleans()) else CELLS
    return columns, draw(st.lists(st.fixed_dictionaries({c: cells[c] for c in columns}), min_size=1, max_size=5))


def typed(cell: str):
    """A cell as JSON would carry it: an int, a float, null or the text."""
    for convert in (int, float):
        try:
            return convert(cell)
        except ValueError:
            pass
    return None if cell == "" else cell


def write(directory: Path, form: str, columns: list[str], rows: list[dict[str, str]], tail: str) -> Path:
    if form == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows([row[c] for c in columns] for row in rows)
        path, text = directory / "decisions.csv", buffer.getvalue() + tail
    else:
        records = [{c: typed(row[c]) if form == "jsonl-typed" else row[c] for c in columns} for row in rows]
        path, text = directory / "decisions.jsonl", "\n".join(json.dumps(r) for r in records) + "\n" + tail
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def assert_sound(stream: FileDecisionStream) -> None:
    data = stream.tensors()
    n = len(stream)
    assert n > 0 and data.x.shape == (n, stream.n_factors) and data.x.dtype == torch.float32
    assert bool(torch.isfinite(data.x).all()) and bool(torch.isfinite(data.timestamp).all())
    for column, size in ((data.category, stream.n_categories), (data.action, stream.n_actions),
                         (data.truth, stream.n_actions)):
        assert column.shape == (n,) and 0 <= int(column.min()) and int(column.max()) < size
    assert set(data.confirmed.tolist()) <= {-1, 0, 1}


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(FUZZ, max_examples=200)
@given(table=tables(), form=st.sampled_from(["csv", "jsonl", "jsonl-typed"]), options=OPTIONS,
       tail=st.one_of(st.just(""), st.sampled_from(["\n", "{", "[1]", "nan", '{"f1": NaN}', "[" * 5000, "a,b\n",
                                                     "\ufeff"])))
def test_the_file_parser_reads_or_refuses_with_a_value_error(directory, table, form, options, tail):
    path = write(directory, form, *table, tail)
    try:
        stream = FileDecisionStream(path, **options)
    except ValueError as error:
        assert str(path) in str(error) or "factors" in str(error) or " must " in str(error), str(error)
    else:
        assert_sound(stream)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))),
       suffix=st.sampled_from([".csv", ".jsonl"]))
def test_the_file_parser_refuses_garbage_with_a_value_error(directory, data, suffix):
    path = directory / f"garbage{suffix}"
    path.write_bytes(data)
    try:
        stream = FileDecisionStream(path, factors=["f1"])
    except ValueError:
        return
    assert_sound(stream)  # garbage that happens to be a valid file
