"""Tool-call counters and the `tools/*` metrics made from them: calls, errors (also by kind), cache hits, latency
(mean, and p50 / p90 / p99 from a fixed-bucket histogram), retries, infrastructure failures, restarts, images
returned (count and decoded bytes; refused ones are `errors_bad_image`), per server.

Counters are plain additive dicts, so those of several managers (verl's agent-loop workers), of several groups
(the asynchronous generator) or of several moments can be summed and subtracted before they become metrics.
Left out: counting itself (`ToolManager` calls `count_result`), restarts (`server.py` counts them).
"""
from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from rlfactory.tools.types import ToolResult

# Upper bounds (s) of the call-latency histogram behind `tools/latency_p*_s`: fixed buckets add up across workers,
# managers and moments (sums and differences of counters), which raw latencies or running quantiles would not.
LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0,
                     300.0)
LATENCY_QUANTILES = (50, 90, 99)


def empty_counters() -> dict[str, Any]:
    """Zeroed counters in the shape of `ToolManager.counters()`."""
    return {"calls": 0, "errors": 0, "hits": 0, "latency_sum_s": 0.0, "infra_errors": 0, "retried": 0, "restarts": 0,
            "images": 0, "image_bytes": 0, "error_kinds": Counter(), "per_server": {},
            "latency_hist": [0] * (len(LATENCY_BUCKETS_S) + 1)}


def latency_quantile(hist: list[int], q: float) -> float:
    """The upper bound of the histogram bucket holding quantile q (0-100) of the calls; for the overflow bucket,
    the last bound (the calls took at least that long)."""
    total = sum(hist)
    if total <= 0:
        return 0.0
    need, seen = q / 100 * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= need and n:
            return LATENCY_BUCKETS_S[min(i, len(LATENCY_BUCKETS_S) - 1)]
    return LATENCY_BUCKETS_S[-1]


def count_result(c: dict[str, Any], result: ToolResult) -> None:
    """Add one call's result to counters `c` (a ToolManager's, or those of one GRPO group's calls)."""
    c["calls"] += 1
    c["latency_sum_s"] += result.latency_s
    if not result.cached:  # a cache hit's latency is the cache's, not the tool's
        hist = c.setdefault("latency_hist", [0] * (len(LATENCY_BUCKETS_S) + 1))
        hist[bisect.bisect_left(LATENCY_BUCKETS_S, result.latency_s)] += 1
    if result.cached:
        c["hits"] += 1
    if result.retried:
        c["retried"] += 1
    if result.images:
        c["images"] = c.get("images", 0) + len(result.images)
        c["image_bytes"] = c.get("image_bytes", 0) + sum(im.num_bytes for im in result.images)
    if result.infra:
        c["infra_errors"] += 1
    per = c["per_server"].setdefault(result.server or "_unknown", [0, 0])
    per[0] += 1
    if result.is_error:
        c["errors"] += 1
        per[1] += 1
        c["error_kinds"][result.error_kind or "unknown"] += 1


def tool_metrics(c: dict[str, Any]) -> dict[str, float]:
    """`tools/*` metrics from `ToolManager.counters()` (or sums and differences of them)."""
    calls = c["calls"]
    out: dict[str, float] = {
        "tools/calls": calls,
        "tools/errors": c["errors"],
        "tools/cache_hit_rate": c["hits"] / calls if calls else 0.0,
        "tools/latency_mean_s": c["latency_sum_s"] / calls if calls else 0.0,
        "tools/restarts": c["restarts"],
        "tools/infra_errors": c.get("infra_errors", 0),
        "tools/retried": c.get("retried", 0),
    }
    if c.get("images"):  # tools that return images: how many, and their decoded bytes
        out["tools/images"] = c["images"]
        out["tools/image_bytes"] = c.get("image_bytes", 0)
    hist = c.get("latency_hist")
    if hist and sum(hist) > 0:  # calls that reached a tool (cache hits excluded)
        for q in LATENCY_QUANTILES:
            out[f"tools/latency_p{q}_s"] = latency_quantile(hist, q)
    for kind, n in sorted(c["error_kinds"].items()):
        out[f"tools/errors_{kind}"] = n
    for server, (n, errors) in sorted(c["per_server"].items()):
        out[f"tools/{server}/calls"] = n
        out[f"tools/{server}/errors"] = errors
    return out


def combine_counters(items: list[dict[str, Any]], *, minus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The sum of counter snapshots, less the sum of `minus` (e.g. each worker's last snapshot at the previous step)."""
    total = empty_counters()
    for sign, group in ((1, items), (-1, minus or [])):
        for c in group:
            for key in ("calls", "errors", "hits", "latency_sum_s", "infra_errors", "retried", "restarts", "images",
                        "image_bytes"):
                total[key] += sign * c.get(key, 0)
            for kind, n in c["error_kinds"].items():
                total["error_kinds"][kind] += sign * n
            for i, n in enumerate(c.get("latency_hist") or []):
                total["latency_hist"][i] += sign * n
            for server, (n, errors) in c["per_server"].items():
                per = total["per_server"].setdefault(server, [0, 0])
                per[0] += sign * n
                per[1] += sign * errors
    total["error_kinds"] = {k: n for k, n in total["error_kinds"].items() if n}
    total["per_server"] = {k: v for k, v in total["per_server"].items() if v[0] or v[1]}
    return total
