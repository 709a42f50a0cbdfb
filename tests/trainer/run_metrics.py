"""Reading a run folder's metrics.jsonl and comparing two runs' metrics (equal except for wall-clock figures)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfactory.trainer.run import NON_DETERMINISTIC_PREFIXES


def rows_of(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(NON_DETERMINISTIC_PREFIXES)
            and k not in ("rollout/wall_s", "rollout/generate_s_mean", "rollout/tools_s_mean",
                          "tools/latency_mean_s") and not k.startswith("tools/latency_p")}


def assert_same_metrics(a: dict, b: dict) -> None:
    a, b = comparable(a), comparable(b)
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float) and k.startswith("loss/"):
            # Losses go through float sums whose order depends on the engine's batching: equal to float noise.
            assert a[k] == pytest.approx(b[k], rel=1e-3, abs=1e-5), k
        else:
            assert a[k] == b[k], k
