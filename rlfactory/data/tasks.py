"""Tasks for training and evaluation: rows of a JSONL/JSON/parquet file mapped to task dicts, and a seeded sampler
whose position is part of a checkpoint (so a resumed run sees the same prompts it would have seen).

A task is `{"id", "prompt", "answer", "metadata", "system_prompt"?}`: `prompt` is a string or chat messages,
`metadata` holds the row's other fields (or `data.metadata_fields`); a row's `images` (picture files, shown in
its first user turn: rollout/images.py) are resolved against the data file's folder.
The sampler can leave out, for some epochs, tasks whose last group scored alike (`data.skip_settled_epochs`; the
rule of what counts is trainer/settled.py's).
Left out: streaming datasets, shuffling buffers, ordering by difficulty.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rlfactory.errors import ConfigError
from rlfactory.recipe.training import DataConfig


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL, JSON (a list) or parquet file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # only for parquet files: a tool server (deepsearch) imports this module

        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise ConfigError("a .json data file must hold a list of rows (or use JSONL)", file=str(path))
        return data
    rows = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"line {n}: invalid JSON ({e.msg})", file=str(path)) from None
    return rows


def load_tasks(path: str | Path, data: DataConfig, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows mapped through the recipe's `data:` field names into task dicts."""
    rows = read_rows(path)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise ConfigError("no rows", file=str(path))
    tasks = []
    for i, row in enumerate(rows):
        if data.prompt_field not in row:
            raise ConfigError(f"row {i + 1}: no field {data.prompt_field!r} (data.prompt_field)", file=str(path))
        keep = data.metadata_fields
        meta = {k: row[k] for k in keep} if keep else {
            k: v for k, v in row.items() if k not in (data.prompt_field, data.answer_field, data.id_field)
        }
        if isinstance(meta.get("images"), list):  # a row's picture files are named relative to its data file
            meta["images"] = [str(Path(path).parent / p) if isinstance(p, str) and not Path(p).is_absolute() else p
                              for p in meta["images"]]
        task = {
            "id": str(row.get(data.id_field, i)) if data.id_field else str(i),
            "prompt": row[data.prompt_field],
            "answer": row.get(data.answer_field),
            "metadata": meta,
        }
        if data.system_prompt_field and row.get(data.system_prompt_field):
            task["system_prompt"] = row[data.system_prompt_field]
        tasks.append(task)
    return tasks


class TaskSampler:
    """Epoch-wise seeded permutations of task indices. `state()`/`load_state()` capture the position exactly.

    `set_aside(indices, epochs)` leaves tasks out of the next `epochs` whole epochs: `next` passes over them (counted
    in `draws_skipped`). An epoch is a pass over the permutation, so when most tasks sit out, epochs are short and
    the tasks come back soon: the draws never narrow to a few tasks for long. When every task is set aside, draws go
    on in the permutation's order rather than stop."""

    def __init__(self, n_tasks: int, seed: int):
        self.n = n_tasks
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._permutation(0)
        self._other: tuple[int, list[int]] | None = None  # another epoch's order, for `at`
        self.aside: dict[int, int] = {}
        """Task index -> the first epoch it is drawn in again."""
        self.draws_skipped = 0

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, k: int) -> list[int]:
        """The next k task indices (crossing into the next epoch's permutation as needed), passing over the tasks set
        aside."""
        out: list[int] = []
        passed = 0  # tasks passed over since the last draw: a whole permutation's worth means all are set aside
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch += 1
                self.pos = 0
                self._order = self._permutation(self.epoch)
            i = self._order[self.pos]
            self.pos += 1
            if self.aside.get(i, 0) > self.epoch and passed < self.n:
                passed += 1
                self.draws_skipped += 1
                continue
            passed = 0
            out.append(i)
        return out

    def set_aside(self, indices: list[int], epochs: int) -> None:
        """Leave `indices` out of the next `epochs` whole epochs (the one under way is not whole: it does not count)."""
        for i in indices:
            self.aside[i] = self.epoch + epochs + 1

    def bring_back(self) -> None:
        """Every task set aside is drawable again (what set it aside no longer holds)."""
        self.aside.clear()

    def tasks_set_aside(self) -> int:
        """Tasks that `next` passes over now."""
        return sum(1 for back in self.aside.values() if back > self.epoch)

    def state(self) -> dict[str, Any]:
        st: dict[str, Any] = {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "n": self.n}
        if self.aside or self.draws_skipped:
            st.update(aside={str(i): e for i, e in self.aside.items() if e > self.epoch},
                      draws_skipped=self.draws_skipped)
        return st

    def absolute_position(self) -> int:
        """How many draws `next` has made since the start (the index of the next draw)."""
        return self.epoch * self.n + self.pos

    def at(self, draw: int) -> int:
        """The task index of draw number `draw` (0-based), as `next` would return it: asynchronous runs draw out
        of order (and set nothing aside)."""
        epoch, pos = divmod(draw, self.n)
        if epoch == self.epoch:
            return self._order[pos]
        if self._other is None or self._other[0] != epoch:
            self._other = (epoch, self._permutation(epoch))
        return self._other[1][pos]

    def seek(self, draw: int) -> None:
        """Make draw number `draw` the next one `next` returns."""
        epoch, self.pos = divmod(draw, self.n)
        if epoch != self.epoch:
            self.epoch = epoch
            self._order = self._permutation(epoch)

    def load_state(self, st: dict[str, Any]) -> None:
        if st.get("n") != self.n:
            raise ConfigError(f"the checkpoint was made with {st.get('n')} training tasks, the data file now has "
                              f"{self.n}; resume with the same data.train_file")
        self.epoch, self.pos = int(st["epoch"]), int(st["pos"])
        self._order = self._permutation(self.epoch)
        self.aside = {int(i): int(e) for i, e in st.get("aside", {}).items()}
        self.draws_skipped = int(st.get("draws_skipped", 0))
