"""Decision streams read from CSV, JSONL or Parquet files."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch

from gae import validation as check
from gae.validation import Names
from training.batch import DecisionBatch
from training.streams import BaseDecisionStream

SUFFIXES = (".csv", ".jsonl", ".parquet")
UNCERTAIN_OUTCOMES = ("__incorrect__", "uncertain")  # outcomes that must not be learned (skip)
_CONFIRMED = {"1": 1, "true": 1, "0": 0, "false": 0, "-1": -1, "": -1}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_INFERRED = 1_000_000  # most categories or actions that integer indices may imply (index + 1)
_INT64 = (-(2**63), 2**63)


class FileDecisionStream(BaseDecisionStream):
    """Verified decisions read from a file, one decision per row, served in file order.

    The format follows the suffix: ``.csv`` (a header row, then one row per decision),
    ``.jsonl`` (one JSON object per line; blank lines are skipped) or ``.parquet`` (needs
    ``pyarrow``). Text files are UTF-8 (a byte-order mark is skipped). Factors must be finite
    float32 numbers (JSON ``true``/``false`` read as 1/0). A category or action is a name or an
    integer index. ``confirmed`` reads ``1``/``true``, ``0``/``false``, or ``-1``/empty/null (unknown);
    an ``outcome`` of ``'__incorrect__'`` or ``'uncertain'`` marks the decision ``skip``, any
    other outcome (or none) is learned. Timestamps are seconds or ISO 8601 strings (UTC when
    no offset is given). The optional columns (confirmed, outcome, timestamp, id) are read when
    the file has them; set one to None to ignore it. Without timestamps a decision's timestamp
    is its index; without ids its id is its index; without ``truth_column`` the ground truth is
    the verified action (``overridden`` is then all False).

    Args:
        path: the file.
        factors: the factor columns, in order, or a prefix that selects every column starting
            with it (in file order).
        category_column, action_column: required columns. Default: ``'category'``, ``'action'``.
        confirmed_column, outcome_column, timestamp_column, id_column: optional columns.
            Default: ``'confirmed'``, ``'outcome'``, ``'timestamp'``, ``'id'``.
        truth_column: a column with the ground-truth action (same vocabulary as the actions),
            or None. Default: None.
        categories, actions: names (every value must be one of them), a count (every value is an
            index below it) or None: when every value is an integer they are indices and the
            count is the largest + 1 (at most ``MAX_INFERRED``, a million), otherwise the names
            in order of first appearance (actions first from the action column, then from the
            truth column). Default: None.

    Raises:
        ValueError: an unknown suffix, an empty file, a missing column, a file that is not
            UTF-8, CSV or JSON, or a bad value (the message names the file, the line or row,
            the column and the value).
        OSError: the file cannot be opened.
        ImportError: a ``.parquet`` file without ``pyarrow`` installed.

    Examples::

        >>> stream = FileDecisionStream("data/example_decisions.csv", truth_column="truth",
        ...                             factors=["amount", "vendor_age", "mismatch", "urgency"])
        >>> len(stream), stream.action_names  # in order of first appearance
        (200, ('reject', 'review', 'escalate', 'approve'))
        >>> stream.batch(0, 2).x.shape
        torch.Size([2, 4])
    """

    def __init__(self, path: str | Path, *, factors: list[str] | str, category_column: str = "category",
                 action_column: str = "action", confirmed_column: str | None = "confirmed",
                 outcome_column: str | None = "outcome", timestamp_column: str | None = "timestamp",
                 id_column: str | None = "id", truth_column: str | None = None, categories: Names | None = None,
                 actions: Names | None = None) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() not in SUFFIXES:
            raise ValueError(f"path must end in one of {list(SUFFIXES)}, got {str(path)!r}")
        for argument, value in (("category_column", category_column), ("action_column", action_column)):
            if not isinstance(value, str):
                raise TypeError(f"{argument} must be a column name, got {value!r}")
        for argument, optional in (("confirmed_column", confirmed_column), ("outcome_column", outcome_column),
                                   ("timestamp_column", timestamp_column), ("id_column", id_column),
                                   ("truth_column", truth_column)):
            if optional is not None and not isinstance(optional, str):
                raise TypeError(f"{argument} must be a column name or None, got {optional!r}")
        table = _Table(self.path)
        factor_names = table.factor_columns(factors)
        action_columns = [action_column] + ([truth_column] if truth_column is not None else [])
        table.require([*factor_names, category_column, *action_columns])

        n = len(table)
        x = np.stack([table.numbers(c, _factor) for c in factor_names], axis=1).astype(np.float32)
        category_names, (category,) = table.codes("categories", categories, [category_column])
        action_names, codes = table.codes("actions", actions, action_columns)
        action, truth = codes[0], codes[-1]
        index = torch.arange(n)
        confirmed = table.convert_all(confirmed_column, _confirmed) if table.has(confirmed_column) else [-1] * n
        skip = table.convert_all(outcome_column, _uncertain) if table.has(outcome_column) else [False] * n
        timestamp = (torch.from_numpy(table.numbers(timestamp_column, _seconds)) if table.has(timestamp_column)
                     else index.double())
        ids = torch.tensor(table.convert_all(id_column, _integer)) if table.has(id_column) else index.clone()
        data = DecisionBatch(
            x=torch.from_numpy(x), category=category, action=action, truth=truth, overridden=action != truth,
            confirmed=torch.tensor(confirmed, dtype=torch.int8), skip=torch.tensor(skip, dtype=torch.bool),
            timestamp=timestamp, id=ids, position=index)
        super().__init__(data, category_names, action_names, factor_names)


class _Table:
    """The raw values of a file, by column in file order, and where each record came from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values, self.lines, self.unit = _read(path)
        if not self.lines:
            raise ValueError(f"{path} holds no decisions")

    def __len__(self) -> int:
        return len(self.lines)

    def has(self, column: str | None) -> TypeGuard[str]:
        """The file has this (optional) column; None never is."""
        return column is not None and column in self.values

    def require(self, columns: list[str]) -> None:
        for column in columns:
            if column not in self.values:
                raise ValueError(f"{self.path} has no column {column!r} (columns: {list(self.values)})")

    def convert(self, convert: Callable[[Any], Any], value: Any, column: str, row: int) -> Any:
        """``convert(value)``, its ValueError restated with the file, line (or row) and column."""
        try:
            return convert(value)
        except (ValueError, OverflowError) as error:  # OverflowError: a JSON integer no float can hold
            raise ValueError(f"{self.path}, {self.unit} {self.lines[row]}, column {column!r}: {error}") from None

    def convert_all(self, column: str, convert: Callable[[Any], Any]) -> list:
        return [self.convert(convert, value, column, row) for row, value in enumerate(self.values[column])]

    def factor_columns(self, factors: list[str] | str) -> tuple[str, ...]:
        if isinstance(factors, str):
            selected = tuple(c for c in self.values if c.startswith(factors))
            if not selected:
                raise ValueError(f"factors prefix {factors!r} selects no column of {self.path} "
                                 f"(columns: {list(self.values)})")
            return selected
        return check.resolve_names("factors", factors)

    def numbers(self, column: str, convert: Callable[[Any], float]) -> np.ndarray:
        """A float64 column; NumPy converts a clean column at once, anything else goes value by value."""
        try:
            values = np.asarray(self.values[column], dtype=np.float64)
            if np.isfinite(values).all() and np.abs(values).max() <= _FLOAT32_MAX:
                return values
        except (TypeError, ValueError, OverflowError):
            pass
        return np.array(self.convert_all(column, convert), dtype=np.float64)

    def codes(self, role: str, spec: Names | None, columns: list[str]) -> tuple[tuple[str, ...], list[torch.Tensor]]:
        """The names, and the (N,) int64 indices of each of ``columns`` in that one vocabulary."""
        raws = [self.values[c] for c in columns]
        if spec is None:
            if all(_is_integer(v) for raw in raws for v in raw):
                # at least one index, so that a negative value is reported where it is
                spec = max(1, max(_integer(v) for raw in raws for v in raw) + 1)
                if spec > MAX_INFERRED:  # names for every index up to it would take the memory
                    column, row = next((c, i) for c, raw in zip(columns, raws, strict=True)
                                       for i, v in enumerate(raw) if _integer(v) == spec - 1)
                    raise ValueError(f"{self.path}, {self.unit} {self.lines[row]}, column {column!r}: {role} index "
                                     f"{spec - 1} would make {spec} {role} (at most {MAX_INFERRED} are inferred); "
                                     f"pass {role}= (their names or their count) to read it")
            else:
                spec = list(dict.fromkeys(self.convert(_name, v, c, i)
                                          for c, raw in zip(columns, raws, strict=True) for i, v in enumerate(raw)))
        names = check.resolve_names(role, spec)
        position = {name: i for i, name in enumerate(names)}

        def convert(value: Any) -> int:
            if isinstance(spec, int):
                index = _integer(value)
                if not 0 <= index < len(names):
                    raise ValueError(f"{role} index must be in [0, {len(names)}), got {value!r}")
                return index
            if _name(value) not in position:
                raise ValueError(f"{value!r} is not one of the {role} {list(names)}")
            return position[_name(value)]

        return names, [torch.tensor(self.convert_all(c, convert), dtype=torch.int64) for c in columns]


def _read(path: Path) -> tuple[dict[str, list], list[int], str]:
    """``(values by column in file order, the line or row number of each record, 'line' or 'row')``."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # optional: only Parquet files need it
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
        table = pq.read_table(path)
        return table.to_pydict(), list(range(1, table.num_rows + 1)), "row"
    try:
        return _read_text(path, suffix)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text: {error}") from None
    except csv.Error as error:  # a NUL byte (Python 3.10), a field over csv.field_size_limit()
        raise ValueError(f"{path} is not readable CSV: {error}") from None


def _read_text(path: Path, suffix: str) -> tuple[dict[str, list], list[int], str]:
    with open(path, newline="", encoding="utf-8-sig") as file:
        if suffix == ".csv":
            reader = csv.reader(file)
            header = next(reader, [])
            if len(set(header)) != len(header):
                raise ValueError(f"{path} has a repeated column name in its header {header}")
            rows, lines = [], []
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise ValueError(f"{path}, line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
                rows.append(row)
                lines.append(reader.line_num)
            by_column = list(zip(*rows, strict=True)) or [()] * len(header)
            return {c: list(v) for c, v in zip(header, by_column, strict=True)}, lines, "line"
        records, lines = [], []
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
            except RecursionError:
                raise ValueError(f"{path}, line {number}: JSON nested too deeply to read") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object, got {line.strip()[:60]!r}")
            records.append(record)
            lines.append(number)
        columns = dict.fromkeys(key for record in records for key in record)
        return {c: [record.get(c) for record in records] for c in columns}, lines, "line"


def _factor(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a finite number, got {value!r}") from None
    if not math.isfinite(number) or abs(number) > _FLOAT32_MAX:
        raise ValueError(f"expected a finite float32 number, got {value!r}")
    return number


def _seconds(value: Any) -> float:
    """Seconds from a number, a numeric string, an ISO 8601 string or a datetime (naive = UTC)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            if text.endswith("Z"):  # Python 3.10 reads no 'Z' suffix
                text = text[:-1] + "+00:00"
            try:
                value = datetime.fromisoformat(text)
            except ValueError:
                raise ValueError(f"expected seconds or an ISO 8601 time, got {value!r}") from None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected seconds or an ISO 8601 time, got {value!r}")
    return float(value)


def _is_integer(value: Any) -> bool:
    try:
        _integer(value)
    except ValueError:
        return False
    return True


def _integer(value: Any) -> int:
    """An int64 from an int or a decimal string."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        number = int(value)
    else:
        raise ValueError(f"expected an integer, got {value!r}")
    if not _INT64[0] <= number < _INT64[1]:
        raise ValueError(f"expected a 64-bit integer, got {value!r}")
    return number


def _name(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"expected a name or an integer index, got {value!r}")


def _confirmed(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, bool):
        return int(value)
    key = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if key not in _CONFIRMED:
        raise ValueError(f"confirmed must be 1/true, 0/false or -1/empty/null (unknown), got {value!r}")
    return _CONFIRMED[key]


def _uncertain(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() in UNCERTAIN_OUTCOMES
