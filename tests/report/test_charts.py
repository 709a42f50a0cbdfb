"""Which curves the dashboard and `rlfactory report`'s PNGs draw from a run's rows (rlfactory/report/charts.py)."""
from __future__ import annotations

from matplotlib.image import imread

from rlfactory.report.chart_pngs import panels, plot_charts
from rlfactory.report.charts import SECTIONS, matching, pick_key, series

LOCAL = [{"step": 1, "reward/mean": 0.25, "loss/pg": -0.5, "loss/ppo_kl": 0.0, "tools/calls": 4,
          "tools/calculator/calls": 3, "tools/search/calls": 1, "perf/rollout_s": 1.5, "perf/tokens_per_s": 900.0,
          "rollout/finish_stop": 7, "rollout/finish_max_turns": 1},
         {"step": 2, "reward/mean": 0.5, "loss/pg": None, "loss/ppo_kl": 0.01, "tools/calls": 5,
          "tools/errors_timeout": 2, "tools/calculator/calls": 5, "perf/rollout_s": 1.25}]
VERL = [{"step": 1, "reward/mean": 0.5, "actor/pg_loss": -0.1, "actor/entropy": 2.0, "timing_s/gen": 3.0}]


def _section(sid: str) -> dict:
    return next(s for s in SECTIONS if s["id"] == sid)


def _multi(sid: str, chart: str) -> str:
    return next(m[2] for m in _section(sid)["multi"] if m[0] == chart)


def test_a_chart_plots_the_first_name_a_run_logs_so_both_engines_fill_it():
    loss = ["loss/pg", "actor/pg_loss"]
    assert pick_key(LOCAL, loss) == "loss/pg" and pick_key(VERL, loss) == "actor/pg_loss"
    assert pick_key(LOCAL, ["loss/entropy", "actor/entropy"]) is None
    assert series(LOCAL, "loss/pg") == ([1], [-0.5])  # a null is a gap, not a zero
    assert series(LOCAL, "tools/errors_timeout", 0.0) == ([1, 2], [0.0, 2.0])  # logged only when nonzero


def test_multi_series_charts_label_each_key_by_what_varies():
    tools = _multi("tools", "tper")
    assert matching(LOCAL, tools) == [("tools/calculator/calls", "calculator"), ("tools/search/calls", "search")]
    quantiles = _multi("tools", "tlatq")
    rows = [{"step": 1, "tools/latency_p50_s": 0.01, "tools/latency_p90_s": 0.05, "tools/latency_mean_s": 0.02}]
    assert matching(rows, quantiles) == [("tools/latency_p50_s", "p50"), ("tools/latency_p90_s", "p90")]
    stages = _multi("perf", "stages")
    assert matching(LOCAL, stages) == [("perf/rollout_s", "rollout")]  # tokens per second is no stage time
    assert matching(VERL, stages) == [("timing_s/gen", "gen")]


def test_report_pngs_follow_the_sections(tmp_path):
    learning = panels(LOCAL, _section("learning"))
    assert [title.split("\n")[0] for title, _ in learning] == ["reward (mean)", "policy loss", "KL"]
    files = plot_charts(LOCAL, tmp_path, title="t")
    assert [f.name for f in files] == ["charts_learning.png", "charts_tools.png", "charts_shape.png",
                                       "charts_perf.png"]  # no async/ keys: no staleness image
    h, w, _ = imread(files[0]).shape
    assert h > 200 and w > 400
    async_rows = [{**r, "async/staleness_token_mean": 0.5} for r in LOCAL]
    assert "charts_async.png" in [f.name for f in plot_charts(async_rows, tmp_path)]
