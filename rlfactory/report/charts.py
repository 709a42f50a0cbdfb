"""Which charts a run gets, and from which metric names: one list for the live dashboard (its page reads it as JSON)
and for `rlfactory report`'s PNGs (chart_pngs.py), so the two show the same curves.

A chart is (id, title, candidate keys): the first key a run logs is plotted, so one chart covers both engines'
names (the local engine's `loss/*`, verl's `actor/*`). A multi-series chart is (id, title, regex): every key that
matches is one series, labelled by the regex's first group that matched.
Each chart's keys are explained by the metrics registry (metric_names.py): the dashboard shows that on hover.
Left out: how charts are drawn (the page's SVG, matplotlib).
"""
from __future__ import annotations

import re
from typing import Any

from rlfactory.report.metric_names import lookup

SECTIONS: list[dict[str, Any]] = [
    {"id": "learning", "title": "Learning: reward, loss, KL, entropy", "charts": [
        ["reward", "reward (mean)", ["reward/mean"]],
        ["loss", "policy loss", ["loss/pg", "actor/pg_loss"]],
        ["kl", "KL", ["loss/kl", "actor/kl_loss", "loss/ppo_kl", "actor/ppo_kl"]],
        ["entropy", "entropy", ["loss/entropy", "actor/entropy"]]], "multi": []},
    {"id": "tools", "title": "Tools: calls, errors, timeouts, restarts, cache, latency", "charts": [
        ["tcalls", "tool calls", ["tools/calls"]],
        ["terrors", "tool errors", ["tools/errors"]],
        ["ttimeouts", "timeouts", ["tools/errors_timeout"]],
        ["trestarts", "server restarts", ["tools/restarts"]],
        ["tcache", "cache hit rate", ["tools/cache_hit_rate"]],
        ["tlatency", "mean latency (s)", ["tools/latency_mean_s"]]],
     "multi": [["tlatq", "latency quantiles (s, bucket bound)", r"^tools/latency_(p\d+)_s$"],
               ["tper", "calls per tool", r"^tools/(.+)/calls$"]]},
    {"id": "shape", "title": "Rollout shape: turns, tokens, finish reasons, tool calls", "charts": [
        ["turns", "turns per trajectory", ["rollout/num_turns_mean"]],
        ["tokens", "response tokens", ["rollout/response_tokens_mean"]],
        ["tpt", "tool calls per trajectory", ["rollout/tool_calls_mean"]]],
     "multi": [["finish", "finish reasons (trajectories)", r"^rollout/finish_(.+)$"]]},
    {"id": "perf", "title": "Stage times", "charts": [],
     "multi": [["stages", "stage times (s)", r"^(?:perf/(?!.*_per_s$)(.+)_s|timing_s/(.+))$"]]},
    {"id": "async", "title": "Asynchronous training: staleness", "only_if": r"^async/", "charts": [
        ["stale_tok", "staleness per token (mean)", ["async/staleness_token_mean"]],
        ["stale_traj", "staleness per trajectory (max)", ["async/staleness_traj_max"]],
        ["dropped", "dropped trajectories", ["async/dropped_trajectories"]]], "multi": []},
]
"""The dashboard's sections in page order (the PNGs follow them too)."""

def chart_meanings() -> dict[str, str]:
    """What each key a chart may plot means, with its unit, from the metrics registry (the dashboard's hover text)."""
    out = {}
    for section in SECTIONS:
        for _, _, keys in section["charts"]:
            for key in keys:
                if (m := lookup(key)) is not None:
                    out[key] = f"{key}: {m.meaning}" + (f" [{m.unit}]" if m.unit else "")
    return out


ZERO_WHEN_ABSENT = ["ttimeouts", "tcache"]
"""Charts whose key is logged only when nonzero (no timeouts, no cache): plotted as 0 at every step instead."""


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def pick_key(rows: list[dict[str, Any]], keys: list[str]) -> str | None:
    """The first of `keys` that some row logs a number for."""
    for key in keys:
        if any(_num(r.get(key)) for r in rows):
            return key
    return None


def series(rows: list[dict[str, Any]], key: str, default: float | None = None) -> tuple[list[int], list[float]]:
    """(steps, values) of one key; steps without it get `default` when given, else are skipped."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key, default) if r.get(key) is not None else default
        if _num(v) and _num(r.get("step")):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def matching(rows: list[dict[str, Any]], pattern: str) -> list[tuple[str, str]]:
    """(key, label) of every key matching a multi-series chart's regex, sorted by key."""
    rx = re.compile(pattern)
    found: dict[str, str] = {}
    for r in rows:
        for k in r:
            if k not in found and (m := rx.match(k)):
                found[k] = next((g for g in m.groups() if g), k)
    return sorted(found.items())
