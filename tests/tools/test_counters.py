"""`tools/*` metrics from call counters: the latency histogram's quantiles, and sums / differences of snapshots
(what verl's per-worker counters and the asynchronous generator's per-group counters go through)."""
from __future__ import annotations

from rlfactory.tools.counters import (
    LATENCY_BUCKETS_S,
    combine_counters,
    count_result,
    empty_counters,
    latency_quantile,
    tool_metrics,
)
from rlfactory.tools.types import ToolResult


def _calls(latencies: list[float], *, cached: bool = False) -> dict:
    c = empty_counters()
    for s in latencies:
        count_result(c, ToolResult(name="calculator", text="1", latency_s=s, server="calc", cached=cached))
    return c


def test_latency_quantiles_are_the_bounds_of_the_buckets_holding_them():
    c = _calls([0.003] * 50 + [0.03] * 40 + [3.0] * 9 + [1000.0])
    m = tool_metrics(c)
    assert (m["tools/latency_p50_s"], m["tools/latency_p90_s"], m["tools/latency_p99_s"]) == (0.005, 0.05, 5.0)
    assert latency_quantile(c["latency_hist"], 100) == LATENCY_BUCKETS_S[-1]  # "at least the last bound"
    assert m["tools/calls"] == 100 and m["tools/calc/calls"] == 100


def test_cache_hits_stay_out_of_the_latency_histogram():
    c = _calls([0.0001] * 5, cached=True)
    m = tool_metrics(c)
    assert m["tools/cache_hit_rate"] == 1.0 and "tools/latency_p50_s" not in m


def test_snapshots_add_and_subtract_with_their_histograms():
    before = _calls([0.003] * 10)
    after = _calls([0.003] * 10 + [0.3] * 10)  # the same worker, later: 10 slow calls since `before`
    other = _calls([0.3] * 5)
    step = combine_counters([after, other], minus=[before])
    assert step["calls"] == 15 and sum(step["latency_hist"]) == 15
    assert tool_metrics(step)["tools/latency_p50_s"] == 0.5
