"""FileDecisionStream: the shipped example files, every column and value form, and every error."""

from __future__ import annotations

import csv
import io
import json
import re
import sys

import pytest
import torch

from tests.test_data import EXAMPLE, ROOT, assert_batches_equal, write
from training.data import DecisionStream, FileDecisionStream


def read_example(suffix: str, **kwargs) -> FileDecisionStream:
    return FileDecisionStream(ROOT / "data" / f"example_decisions{suffix}", factors=EXAMPLE.FACTORS,
                              truth_column="truth", **kwargs)


def test_shipped_csv_and_jsonl_read_alike_and_match_their_generator():
    names = {"categories": EXAMPLE.EXAMPLE["categories"], "actions": EXAMPLE.EXAMPLE["actions"]}
    from_csv, from_jsonl = read_example(".csv", **names), read_example(".jsonl", **names)
    assert_batches_equal(from_csv.tensors(), from_jsonl.tensors())
    assert from_csv.factor_names == tuple(EXAMPLE.FACTORS) and from_csv.category_names == tuple(names["categories"])
    generated, read = DecisionStream(**EXAMPLE.EXAMPLE).tensors(), from_csv.tensors()
    for name in ("category", "action", "truth", "overridden", "skip", "confirmed", "id", "position"):
        assert torch.equal(getattr(read, name), getattr(generated, name)), name
    assert torch.allclose(read.x, generated.x, atol=1e-6, rtol=0)
    assert torch.equal(read.timestamp, generated.timestamp) and float(read.timestamp[0]) == 1735689600.0
    # without names they are collected in order of first appearance
    inferred = read_example(".jsonl")
    assert set(inferred.action_names) == set(names["actions"]) and inferred.category_names[0] == "vendor"


# The script's factors come from torch.randn, whose last bits depend on the CPU's vector kernels
# (its Box-Muller runs torch's vector log, sin and cos): 1.3e-7 apart at most after the 0.1 noise
# scale, which can move a factor rounded to six decimals by one unit of the sixth, 1e-6. Every
# other cell, and the files' layout, is the same on any machine.
FACTOR_ATOL = 1e-6 + 1e-12  # one unit in the sixth decimal, and the parsing of the two decimals


def assert_same_rows(written: list[dict], shipped: list[dict], name: str) -> None:
    assert len(written) == len(shipped), name
    for i, (mine, theirs) in enumerate(zip(written, shipped, strict=True)):
        assert list(mine) == list(theirs), f"{name} row {i}: columns"
        for column, value in theirs.items():
            if column in EXAMPLE.FACTORS:
                assert abs(float(mine[column]) - float(value)) <= FACTOR_ATOL, f"{name} row {i} {column}"
            else:
                assert mine[column] == value, f"{name} row {i} {column}"


def test_shipped_example_files_are_what_the_script_writes(tmp_path):
    EXAMPLE.write(tmp_path)
    csv_name, jsonl_name = "example_decisions.csv", "example_decisions.jsonl"
    texts = {folder: (folder / csv_name).read_text(encoding="utf-8") for folder in (tmp_path, ROOT / "data")}
    assert all(re.fullmatch(r"\d\.\d{6}", row[column]) for text in texts.values()
               for row in csv.DictReader(io.StringIO(text)) for column in EXAMPLE.FACTORS)  # six decimals
    assert_same_rows(*(list(csv.DictReader(io.StringIO(texts[folder]))) for folder in (tmp_path, ROOT / "data")),
                     csv_name)
    assert_same_rows(*([json.loads(line) for line in (folder / jsonl_name).read_text(encoding="utf-8").splitlines()]
                       for folder in (tmp_path, ROOT / "data")), jsonl_name)


def test_optional_columns_and_their_values(tmp_path):
    path = write(tmp_path, "d.csv", "category,action,f1,confirmed,outcome,timestamp,id,note\n"
                 "a,x,0.5,1,correct,2025-01-01T00:00:00Z,10,hi\n"
                 "b,y,1e-1,false,uncertain,2025-01-01T01:00:00+01:00,11,\n"
                 "a,y,0,,__incorrect__,2025-01-01T00:00:01,12,\n"
                 "b,x,1,-1,,1735689603.5,13,\n")
    data = FileDecisionStream(path, factors=["f1"]).tensors()
    assert data.confirmed.tolist() == [1, 0, -1, -1] and data.skip.tolist() == [False, True, True, False]
    assert data.timestamp.tolist() == [1735689600.0, 1735689600.0, 1735689601.0, 1735689603.5]
    assert data.id.tolist() == [10, 11, 12, 13] and data.x[:, 0].tolist() == pytest.approx([0.5, 0.1, 0.0, 1.0])
    assert torch.equal(data.truth, data.action) and not data.overridden.any()
    ignored = FileDecisionStream(path, factors=["f1"], confirmed_column=None, outcome_column=None,
                                 timestamp_column=None, id_column=None).tensors()
    assert ignored.confirmed.tolist() == [-1] * 4 and not ignored.skip.any()
    assert ignored.timestamp.tolist() == [0.0, 1.0, 2.0, 3.0] and ignored.id.tolist() == [0, 1, 2, 3]


def test_jsonl_values_names_indices_and_prefix(tmp_path):
    path = write(tmp_path, "d.jsonl",
                 '{"category": 2, "action": 0, "gold": 1, "f_a": 0.1, "f_b": 1, "confirmed": true}\n\n'
                 '{"category": 0, "action": 1, "gold": 1, "f_a": 0.2, "f_b": 0, "confirmed": null}\n')
    stream = FileDecisionStream(path, factors="f_", truth_column="gold")
    data = stream.tensors()
    assert stream.factor_names == ("f_a", "f_b") and stream.category_names == ("0", "1", "2")
    assert stream.action_names == ("0", "1") and data.category.tolist() == [2, 0]
    assert data.overridden.tolist() == [True, False] and data.confirmed.tolist() == [1, -1]
    counted = FileDecisionStream(path, factors="f_", categories=5, actions=["0", "1", "2"])
    assert counted.n_categories == 5 and counted.action_names == ("0", "1", "2")


def test_names_inferred_in_order_of_first_appearance_across_action_and_truth(tmp_path):
    path = write(tmp_path, "d.csv", "category,action,truth,f\nk,review,approve,0\nj,review,reject,1\n")
    stream = FileDecisionStream(path, factors=["f"], truth_column="truth")
    assert stream.category_names == ("k", "j") and stream.action_names == ("review", "approve", "reject")
    assert stream.tensors().truth.tolist() == [1, 2]


CSV_HEADER = "category,action,f1,f2,confirmed\n"


@pytest.mark.parametrize(("name", "text", "kwargs", "error", "pieces"), [
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\n", {"factors": ["f1", "f3"]}, ValueError, ["no column 'f3'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\n", {"factors": "g_"}, ValueError, ["prefix 'g_'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\n", {"truth_column": "gold"}, ValueError, ["no column 'gold'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\na,x,abc,0.2,1\n", {}, ValueError, ["line 3", "'f1'", "'abc'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,nan,1\n", {}, ValueError, ["line 2", "'f2'", "'nan'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,-inf,1\n", {}, ValueError, ["line 2", "'f2'", "'-inf'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,1e39,1\n", {}, ValueError, ["line 2", "'f2'", "float32"]),
    ("d.csv", CSV_HEADER + "a,x,,0.2,1\n", {}, ValueError, ["line 2", "'f1'", "''"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\nz,x,0.1,0.2,1\n", {"categories": ["a", "b"]}, ValueError,
     ["line 3", "'category'", "'z' is not one of the categories ['a', 'b']"]),
    ("d.csv", CSV_HEADER + "a,w,0.1,0.2,1\n", {"actions": ["x", "y"]}, ValueError,
     ["line 2", "'w' is not one of the actions"]),
    ("d.csv", CSV_HEADER + "a,3,0.1,0.2,1\n", {"actions": 2}, ValueError, ["line 2", "[0, 2)", "'3'"]),
    ("d.csv", CSV_HEADER + "a,-1,0.1,0.2,1\n", {}, ValueError, ["line 2", "'action'", "'-1'"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,yes\n", {}, ValueError, ["line 2", "'confirmed'", "'yes'"]),
    ("d.csv", CSV_HEADER + ",x,0.1,0.2,1\n", {}, ValueError, ["line 2", "'category'", "''"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,1\n", {}, ValueError, ["line 2", "4 fields"]),
    ("d.csv", "category,action,f1,f1\n", {}, ValueError, ["repeated column"]),
    ("d.csv", "", {}, ValueError, ["holds no decisions"]),
    ("d.csv", CSV_HEADER, {}, ValueError, ["holds no decisions"]),
    ("d.jsonl", "\n\n", {}, ValueError, ["holds no decisions"]),
    ("d.jsonl", '{"category": "a", "action": "x", "f1": 1, "f2": 0}\n{"category": "a", "f1": 1, "f2": 0}\n', {},
     ValueError, ["line 2", "'action'", "None"]),
    ("d.jsonl", '{"category": "a", "action": "x", "f1": null, "f2": 0}\n', {}, ValueError, ["line 1", "'f1'", "None"]),
    ("d.jsonl", '{"category": "a", "action": "x", "f1": 1, "f2": 0}\n{"category": "a",\n', {}, ValueError,
     ["line 2", "not valid JSON"]),
    ("d.jsonl", '[1, 2]\n', {}, ValueError, ["line 1", "JSON object"]),
    ("d.jsonl", '{"category": "a", "action": "x", "f1": 1, "f2": 0, "timestamp": "soon"}\n', {}, ValueError,
     ["line 1", "'timestamp'", "'soon'"]),
    ("d.jsonl", '{"category": "a", "action": "x", "f1": 1, "f2": 0, "id": 1.5}\n', {}, ValueError,
     ["line 1", "'id'", "1.5"]),
    ("d.txt", CSV_HEADER, {}, ValueError, ["path must end in", "d.txt"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\n", {"category_column": 3}, TypeError, ["category_column"]),
    ("d.csv", CSV_HEADER + "a,x,0.1,0.2,1\n", {"id_column": 3}, TypeError, ["id_column"]),
])
def test_file_errors_name_the_file_line_column_and_value(tmp_path, name, text, kwargs, error, pieces):
    path = write(tmp_path, name, text)
    with pytest.raises(error) as info:
        FileDecisionStream(path, **{"factors": ["f1", "f2"], **kwargs})
    message = str(info.value)
    for piece in pieces:
        assert piece in message, (piece, message)
    if error is ValueError and path.suffix != ".txt":
        assert str(path) in message


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="needs pyarrow: pip install pyarrow"):
        FileDecisionStream(tmp_path / "d.parquet", factors=["f1"])


def test_parquet_reads_like_csv(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    from pyarrow import csv as pyarrow_csv

    # pyarrow types the columns itself: timestamps as datetimes, the empty confirmed column as nulls
    pq.write_table(pyarrow_csv.read_csv(ROOT / "data" / "example_decisions.csv"), tmp_path / "d.parquet")
    from_parquet = FileDecisionStream(tmp_path / "d.parquet", factors=EXAMPLE.FACTORS, truth_column="truth")
    assert_batches_equal(from_parquet.tensors(), read_example(".csv").tensors())


