"""Reading a run folder while it is written: metrics.jsonl rows from a byte offset, and the newest transcripts.

The dashboard polls these; they only read what the trainer already writes (metrics.jsonl, transcripts/step_*.jsonl,
summary.json), so watching a run costs the trainer nothing. A metrics line still being written (no newline yet) is
left for the next read; a file that shrank (a resumed run truncates rows past its checkpoint) is read again from the
start, and the reader reports that with `reset`. A complete line that is not a row (metrics.parse_metrics_line says
why) is skipped and counted, with the newest few reasons kept for the page; the read position moves past it, so one
bad line never stops the rows after it.

Left out: TensorBoard events and checkpoints (the dashboard shows what the JSONL files hold).
"""
from __future__ import annotations

import logging
import math
import threading
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError
from rlfactory.report.metrics import MAX_LINE_BYTES, BadMetricsLine, parse_metrics_line
from rlfactory.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

_READ_BLOCK = 1 << 20
_BAD_NOTES_KEPT = 5
_BAD_LINES_LOGGED = 10


def check_run_dir(path: str | Path) -> Path:
    """`path` as a run folder, or a clear error (a live run may not have written metrics.jsonl yet: that is fine)."""
    run = Path(path)
    if not run.is_dir():
        raise RLFactoryError(f"{run}: not a folder (pass a run folder written by `rlfactory train`, e.g. "
                             f"runs/quickstart)")
    if not any((run / name).exists() for name in ("metrics.jsonl", "recipe.yaml", "transcripts")):
        raise RLFactoryError(f"{run}: no metrics.jsonl, recipe.yaml or transcripts/ here: is it a run folder? "
                             f"(`rlfactory train` writes them to trainer.output_dir or --output-dir)")
    return run


class RunWatch:
    """One run folder, read incrementally. Thread-safe: the dashboard's HTTP threads share one per run."""

    def __init__(self, run_dir: str | Path):
        self.run = check_run_dir(run_dir)
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._offset = 0  # bytes of metrics.jsonl already parsed (whole lines only)
        self._epoch = 0  # bumped when the file is read again from the start
        self._line = 0  # complete lines read, good or bad: the number a bad line is reported under
        self._skipping = False  # inside an over-long line, whose bytes so far were dropped
        self._bad = 0
        self._bad_notes: list[str] = []  # the newest few bad lines, "line N: why"
        self._traj_files: dict[str, tuple[float, list[Trajectory]]] = {}

    # -- metrics ---------------------------------------------------------------------------------------------------
    def _refresh_metrics(self) -> None:
        path = self.run / "metrics.jsonl"
        try:
            size = path.stat().st_size
        except OSError:  # not written yet (a live run before its first step), or gone
            return
        if size < self._offset:  # truncated by a resume: start over
            self._rows, self._offset, self._epoch = [], 0, self._epoch + 1
            self._line, self._skipping, self._bad, self._bad_notes = 0, False, 0, []
        if size == self._offset:
            return
        with path.open("rb") as f:
            f.seek(self._offset)
            left, pending = size - self._offset, b""
            while left > 0:
                block = f.read(min(_READ_BLOCK, left))
                if not block:
                    break
                left -= len(block)
                pending += block
                start = 0
                while (end := pending.find(b"\n", start)) >= 0:
                    self._take(pending[start:end])
                    start = end + 1
                self._offset += start
                pending = pending[start:]
                if len(pending) > MAX_LINE_BYTES:
                    # A line too long to be a row: forget its bytes as they come (memory stays bounded however
                    # long it grows) and count it once its newline arrives.
                    self._offset += len(pending)
                    pending, self._skipping = b"", True
        # What is left in `pending` is a line still being written: it is read again, whole, next time.

    def _take(self, line: bytes) -> None:
        """One complete line: a row, or a counted bad line (the read position moves past it either way)."""
        self._line += 1
        if self._skipping:
            self._skipping = False
            self._skip(f"over the {MAX_LINE_BYTES // 2**20} MiB a metrics row may take")
            return
        if not line.strip():
            return
        try:
            self._rows.append(_flat(parse_metrics_line(line)))
        except BadMetricsLine as e:
            self._skip(str(e))

    def _skip(self, why: str) -> None:
        self._bad += 1
        note = f"line {self._line}: {why}"
        self._bad_notes = (self._bad_notes + [note])[-_BAD_NOTES_KEPT:]
        if self._bad <= _BAD_LINES_LOGGED:
            logger.warning("%s/metrics.jsonl %s (skipped%s)", self.run, note,
                           "; further bad lines are counted, not logged" if self._bad == _BAD_LINES_LOGGED else "")

    def metrics(self, since: int = 0, epoch: int | None = None) -> dict[str, Any]:
        """Rows from index `since` on. When the file was rewritten since the caller's `epoch`, all rows come back
        with `reset: true`."""
        with self._lock:
            self._refresh_metrics()
            reset = epoch is not None and epoch != self._epoch
            start = 0 if reset else max(0, since)
            return {"epoch": self._epoch, "reset": reset, "from": start, "rows": self._rows[start:],
                    "total": len(self._rows), "bad_lines": self._bad, "bad_line_notes": list(self._bad_notes)}

    def status(self) -> dict[str, Any]:
        """Name (the folder's: runs of one recipe differ by folder), whether the run has finished (summary.json
        written), its steps so far and its recipe's total."""
        info: dict[str, Any] = {"path": str(self.run), "name": self.run.name, "finished": False,
                                "total_steps": None, "engine": None}
        info["finished"] = (self.run / "summary.json").is_file()
        recipe = self.run / "recipe.yaml"
        if recipe.is_file():
            try:
                import yaml

                r = yaml.safe_load(recipe.read_text()) or {}
                info["total_steps"] = (r.get("trainer") or {}).get("total_steps")
                info["engine"] = r.get("engine")
                info["recipe_name"] = r.get("name")
            except (yaml.YAMLError, OSError, AttributeError):
                pass
        with self._lock:
            self._refresh_metrics()
            info["steps"] = len(self._rows)
            info["bad_lines"], info["bad_line_notes"] = self._bad, list(self._bad_notes)
        return info

    # -- transcripts -----------------------------------------------------------------------------------------------
    def _step_files(self) -> list[Path]:
        return sorted((self.run / "transcripts").glob("step_*.jsonl"), reverse=True)

    def _load(self, path: Path) -> list[Trajectory]:
        mtime = path.stat().st_mtime
        cached = self._traj_files.get(path.name)
        if cached and cached[0] == mtime:
            return cached[1]
        trajs = []
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    trajs.append(Trajectory.model_validate_json(line))
                except ValueError:  # a file being written: read it again next time
                    return cached[1] if cached else []
        self._traj_files[path.name] = (mtime, trajs)
        return trajs

    def transcripts(self, *, limit: int = 50, finish: str | None = None, reward_min: float | None = None,
                    reward_max: float | None = None, tool_error: bool = False) -> list[dict[str, Any]]:
        """Summaries of the newest saved trajectories (newest step first) that pass the filters."""
        out: list[dict[str, Any]] = []
        with self._lock:
            for path in self._step_files():
                step = _step_of(path)
                for t in self._load(path):
                    if not _keep(t, finish, reward_min, reward_max, tool_error):
                        continue
                    out.append(summarize(t, step))
                    if len(out) >= limit:
                        return out
        return out

    def trajectory(self, traj_id: str) -> tuple[int, Trajectory] | None:
        with self._lock:
            for path in self._step_files():
                for t in self._load(path):
                    if t.id == traj_id:
                        return _step_of(path), t
        return None

    def group_of(self, t: Trajectory, step: int) -> list[Trajectory]:
        """The saved trajectories of `t`'s group in step `step` (a branched group's tree), in sample order."""
        with self._lock:
            path = next((p for p in self._step_files() if _step_of(p) == step), None)
            group = [x for x in self._load(path) if x.group_id == t.group_id] if path is not None else [t]
        return sorted(group, key=lambda x: x.sample_index)

    def tool_latencies(self, max_files: int = 50) -> dict[str, list[float]]:
        """Latency (s) of every tool call in the newest saved transcripts, per tool: the dashboard's distribution
        (metrics.jsonl holds the per-step mean)."""
        out: dict[str, list[float]] = {}
        with self._lock:
            for path in self._step_files()[:max_files]:
                for t in self._load(path):
                    for c in t.tool_calls:
                        if not c.cached:
                            out.setdefault(c.name, []).append(c.latency_s)
        return out


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the page may take it: numbers (non-finite ones as null, as the trainer writes them), strings,
    booleans and nulls; a nested list or object becomes null (rows are flat, and nesting would only cost the
    server its depth in recursion when answering)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, float):
            out[k] = v if math.isfinite(v) else None
        elif v is None or isinstance(v, (bool, int, str)):
            out[k] = v
        else:
            out[k] = None
    return out


def _step_of(path: Path) -> int:
    try:
        return int(path.stem.split("_", 1)[1])
    except (IndexError, ValueError):
        return -1


def _keep(t: Trajectory, finish: str | None, lo: float | None, hi: float | None, tool_error: bool) -> bool:
    if finish and t.finish_reason != finish:
        return False
    if lo is not None and (t.reward is None or t.reward < lo):
        return False
    if hi is not None and (t.reward is None or t.reward > hi):
        return False
    if tool_error and not any(c.is_error for c in t.tool_calls):
        return False
    return True


def summarize(t: Trajectory, step: int) -> dict[str, Any]:
    """The transcript list's row for one trajectory."""
    return {"id": t.id, "step": step, "task_id": t.task_id, "reward": t.reward, "finish": t.finish_reason,
            "turns": t.num_turns, "response_tokens": len(t.response_ids), "tool_calls": len(t.tool_calls),
            "tool_errors": sum(1 for c in t.tool_calls if c.is_error),
            "images": len(t.images) + len(t.unseen_images),
            "tools": sorted({c.name for c in t.tool_calls}),
            "tree": None if t.branch is None else f"root {t.branch.root} · branch {t.branch.child}"}
