"""A recipe's data files checked before any work: found, a known format, and every row with the prompt field (and
the metadata fields) the recipe names, bad rows named by line (the first few) and counted.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from rlfactory.recipe.schema import Recipe

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def _first_row(path: Path) -> dict[str, Any] | None:
    for _, row in _rows(path):
        if isinstance(row, ValueError):
            raise row
        return row
    return None


MAX_ROW_PROBLEMS = 5
"""Bad rows named one by one in a data file; the rest are counted."""


def _rows(path: Path) -> Any:
    """(where, row) for every row: `line N` of a JSONL file, `row N` of JSON and parquet; a line that is not JSON
    yields (where, ValueError)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        n = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for row in batch.to_pylist():
                n += 1
                yield f"row {n}", row
        return
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        for i, row in enumerate(data if isinstance(data, list) else [], start=1):
            yield f"row {i}", row
        return
    with path.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"line {i}", json.loads(line)
            except ValueError as e:
                yield f"line {i}", ValueError(f"not JSON ({e})")


def _row_problem(row: Any, d: Any) -> str | None:
    if isinstance(row, ValueError):
        return str(row)
    if not isinstance(row, dict):
        return f"not an object (got {type(row).__name__})"
    if d.prompt_field not in row:
        return f"no field {d.prompt_field!r} (data.prompt_field)"
    prompt = row[d.prompt_field]
    if not isinstance(prompt, (str, list)) or (isinstance(prompt, str) and not prompt.strip()):
        return f"field {d.prompt_field!r} must be a non-empty string or a list of chat messages"
    missing = [name for name in d.metadata_fields or [] if name not in row]
    if missing:
        return f"no field {missing[0]!r} (data.metadata_fields)"
    return None


def _check_every_row(key: str, path: Path, d: Any, errors: list[str]) -> None:
    bad: list[str] = []
    count = 0
    for where, row in _rows(path):
        problem = _row_problem(row, d)
        if problem is not None:
            count += 1
            if len(bad) < MAX_ROW_PROBLEMS:
                bad.append(f"{where}: {problem}")
    if bad:
        more = f" (and {count - len(bad)} more rows)" if count > len(bad) else ""
        errors.append(f"{key}: {path}: " + "; ".join(bad) + more)


def _check_data_file(key: str, file: str, d: Any, errors: list[str], warnings: list[str]) -> None:
    path = Path(file)
    if not path.is_file():
        errors.append(f"{key}: file not found: {file}")
        return
    if path.suffix not in DATA_SUFFIXES:
        errors.append(f"{key}: {file} must be JSONL, JSON (a list of rows) or parquet ({', '.join(DATA_SUFFIXES)})")
        return
    try:
        row = _first_row(path)
    except Exception as e:  # any parse failure is the user's file, reported as such
        errors.append(f"{key}: cannot read the first row of {file}: {e}")
        return
    if row is None:
        errors.append(f"{key}: {file} has no rows")
        return
    if not isinstance(row, dict):
        errors.append(f"{key}: rows of {file} must be objects (got {type(row).__name__})")
        return
    first_errors = len(errors)
    if d.prompt_field not in row:
        close = difflib.get_close_matches(d.prompt_field, list(row), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (row fields: {', '.join(sorted(row))})"
        errors.append(f"data.prompt_field: {d.prompt_field!r} is not a field of the rows of {file}{hint}")
    if d.answer_field not in row:
        warnings.append(f"data.answer_field: {d.answer_field!r} is not a field of the rows of {file}; rewards get "
                        f"answer=None")
    for name in d.metadata_fields or []:
        if name not in row:
            errors.append(f"data.metadata_fields: {name!r} is not a field of the rows of {file}")
    if len(errors) == first_errors:
        try:
            _check_every_row(key, path, d, errors)  # the first row was fine: is every other?
        except Exception as e:  # noqa: BLE001 - a file that cannot be read through is the user's file
            errors.append(f"{key}: cannot read {file}: {e}")


def check_data(r: Recipe, errors: list[str], warnings: list[str]) -> None:
    _check_data_file("data.train_file", r.data.train_file, r.data, errors, warnings)
    if r.data.val_file:
        _check_data_file("data.val_file", r.data.val_file, r.data, errors, warnings)
    elif r.trainer.eval_every_steps:
        errors.append(f"trainer.eval_every_steps is {r.trainer.eval_every_steps} but data.val_file is empty: "
                      f"add a validation file or set eval_every_steps: 0")
