"""The metrics registry (rlfactory/report/metric_names.py) against what runs really write, both ways:
- two short real runs of `rlfactory train` on the quickstart (its warm checkpoint, the real calculator MCP server):
  the synchronous loop and the asynchronous one (k = 1), both with branched groups, credit per turn, an eval step with
  pass@2 and a reward function that raises on some trajectories, the synchronous one also with a KL reference;
  every key of their metrics.jsonl matches exactly one entry written by that engine, every entry written "every step"
  is in every row, and every entry is written by some run or names the circumstance no run here gives (NOT_SEEN);
- verl's run folder: the keys of two real verl runs (data/verl_run_keys.json; tests/verl checks its own runs'
  rows each time) and the names run_folder.py copies;
- tool-error kinds, from the ToolManager's real counters; the dashboard's charts; and `MetricsLog` warning once about
  a key the registry lacks."""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest
from cli_runs import REPO, rlf, sets

from rlfactory.report.charts import SECTIONS, chart_meanings
from rlfactory.report.metric_names import ENGINES, REGISTRY, lookup, matches
from rlfactory.report.metrics import MetricsLog
from rlfactory.rollout.metrics import FINISH_REASONS
from rlfactory.tools.counters import count_result, empty_counters, tool_metrics
from rlfactory.tools.types import ToolResult

RECIPE = REPO / "recipes" / "quickstart.yaml"
VERL_KEYS = json.loads((Path(__file__).parent / "data" / "verl_run_keys.json").read_text())["keys"]
COMMON = ["trainer.total_steps=2", "trainer.prompts_per_step=4", "rollout.samples_per_prompt=4",
          "trainer.log.tensorboard=false", "trainer.save_every_steps=0", "trainer.device=cpu",
          "trainer.eval_every_steps=2", "data.max_val_tasks=4", "rollout.branching.width=2",
          "rollout.branching.at_turn=1", "algorithm.turn_credit.estimator=returns"]
FLAKY = '''
def flaky(trajectory):
    if sum(trajectory.response_ids) % 3 == 0:
        raise ValueError("fails on a third of the trajectories")
    return 0.0
'''
TOOL_ERROR_KINDS = ("parse", "unknown_tool", "bad_arguments", "timeout", "server_error", "tool_error", "bad_image")
"""`ToolResult.error_kind`'s values (rlfactory/tools/types.py)."""

NOT_SEEN = {
    **{(e, "tools/errors_<kind>"): "a failing call is up to the policy: test_tool_error_kinds_are_registered"
       for e in ENGINES},
    ("sync", "perf/push_s"): "an engine holding its own weights (vLLM, on a GPU)",
    ("async", "loss/kl"): "a KL reference turns the shared update off, which the async run here keeps (the sync run "
                          "has one: the update's code is the same)",
    **{(e, name): "images: the quickstart's model is text-only (tests/tools/test_tool_images.py, "
       "tests/rollout/test_rollout_images.py and tests/trainer/test_vl_training_cli.py write them)"
       for e in ENGINES for name in ("tools/images", "tools/image_bytes", "rollout/images_mean",
                                     "rollout/image_tokens_mean") if not (e == "verl" and "rollout/" in name)},
    **{("sync", name): "a run with data.skip_settled_epochs (tests/trainer/test_skip_settled.py writes them)"
       for name in ("data/tasks_set_aside", "data/draws_skipped")},
    ("async", "perf/wait_s"): "the trainer waits for groups or not, by timing",
    ("async", "perf/wait_jobs_s"): "the generator takes update jobs or not, by timing",
    **{("verl", name): "the recorded verl runs had none (no raising reward, branching, KL, verl reward stage, "
       "validation)" for name in ("reward/errors/<function>", "rollout/branches", "rollout/branches_went_on",
                                  "rollout/branch_shared_tokens", "loss/kl", "perf/reward_s", "val-core/<name...>",
                                  "val-aux/<name...>")},
}
"""(engine, entry) pairs the runs here do not write, with why: each must be an entry that names its circumstance."""
if len(os.sched_getaffinity(0)) < 2:  # no core to lend the generator: no shared update (shared_update.applies)
    NOT_SEEN.update({("async", f"async/generator_update_{x}"): "one CPU" for x in ("jobs", "rows", "s")})


def _train(out: Path, *extra: str) -> list[dict]:
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), *sets(COMMON + list(extra)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("metric_names")
    (tmp / "flaky.py").write_text(FLAKY)
    functions = ("[{function: exact_match, weight: 1.0}, {function: tool_calls_well_formed, weight: 0.0}, "
                 f"{{function: '{tmp / 'flaky.py'}:flaky', weight: 0.0}}]")
    both = ["trainer.eval_samples_per_prompt=2", "trainer.eval_temperature=1.0", f"rewards.functions={functions}"]
    return {"sync": _train(tmp / "sync", *both, "algorithm.kl.use_reference=true", "algorithm.kl.coef=0.01"),
            "async": _train(tmp / "async", *both, "trainer.max_staleness_steps=1")}


def _entry(key: str, engine: str) -> str:
    found = matches(key)
    assert len(found) == 1, f"{engine} wrote {key!r}: it matches {[m.name for m in found] or 'no entry'}"
    assert engine in found[0].engines, f"{engine} wrote {key!r}, registered as {found[0].name} for {found[0].engines}"
    return found[0].name


def test_every_key_a_run_writes_is_registered_for_its_engine_and_every_step_entry_is_in_every_row(runs):
    for engine, rows in runs.items():
        for row in rows:
            entries = {_entry(k, engine) for k in row}
            missing = [m.name for m in REGISTRY if m.always_on(engine) and m.name not in entries]
            assert not missing, f"step {row['step']} of the {engine} run lacks {missing}, registered as every step"


def test_verl_run_folder_keys_are_registered_for_verl():
    from rlfactory.verl.run_folder import VERL_NAMES

    entries = {_entry(k, "verl") for k in VERL_KEYS}
    missing = [m.name for m in REGISTRY if m.always_on("verl") and m.name not in entries]
    assert not missing, f"the recorded verl rows lack {missing}, registered as every step on verl"
    for ours, theirs in VERL_NAMES.items():  # what run_folder.py copies under the local engine's names
        _entry(ours, "verl")
        _entry(theirs, "verl")


def test_every_entry_is_written_by_a_run_or_names_the_circumstance_it_needs(runs):
    # (a key no entry matches is the other tests' failure)
    seen = {(e, m.name) for e, rows in runs.items() for r in rows for k in r for m in matches(k)[:1]}
    seen |= {("verl", m.name) for k in VERL_KEYS for m in matches(k)[:1]}
    registered = {(e, m.name): m for m in REGISTRY for e in m.engines}
    unseen = sorted(set(registered) - seen)
    unexplained = [pair for pair in unseen if pair not in NOT_SEEN]
    assert not unexplained, f"registered but written by no run here (gone from the code? else add to NOT_SEEN): " \
                            f"{unexplained}"
    for (engine, name), why in NOT_SEEN.items():
        m = registered.get((engine, name))
        assert m is not None, f"NOT_SEEN names {name} on {engine}, which the registry does not ({why})"
        assert not m.always_on(engine), f"{name} is registered as every step on {engine} but no run here writes it"


def test_tool_error_kinds_are_registered():
    counters = empty_counters()
    for kind in TOOL_ERROR_KINDS:
        count_result(counters, ToolResult(name="calculator", text="Error", is_error=True, error_kind=kind,
                                          server="calculator", latency_s=0.01))
    metrics = tool_metrics(counters)
    assert {f"tools/errors_{k}" for k in TOOL_ERROR_KINDS} <= set(metrics)
    for engine in ENGINES:
        assert {_entry(k, engine) for k in metrics} >= {"tools/errors_<kind>", "tools/<server>/errors"}


def test_the_registry_is_well_formed_and_covers_the_charts():
    names = [m.name for m in REGISTRY]
    assert len(names) == len(set(names)) and len(names) > 100
    for m in REGISTRY:
        assert m.meaning.strip() and m.engines and set(m.engines) <= set(ENGINES), m.name
        assert m.when_on is None or (m.when and set(m.when_on) < set(m.engines)), m.name
    reasons = lookup("rollout/finish_stop").meaning  # the finish reasons it lists are the Trajectory's
    assert re.findall(r"`(\w+)`", reasons) == list(FINISH_REASONS)
    meanings = chart_meanings()
    for section in SECTIONS:
        for _, title, keys in section["charts"]:
            assert all(lookup(k) is not None for k in keys), (title, [k for k in keys if lookup(k) is None])
            assert all(meanings[k].startswith(f"{k}: ") for k in keys), title


def test_metrics_log_warns_once_about_a_key_the_registry_lacks(tmp_path, caplog):
    log = MetricsLog(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rlfactory.report.metric_names"):
        log.write({"step": 1, "reward/mean": 0.5, "made_up/metric_s": 1.0})
        log.write({"step": 2, "reward/mean": 0.5, "made_up/metric_s": 2.0})
    log.close()
    warned = [r.getMessage() for r in caplog.records if "made_up/metric_s" in r.getMessage()]
    assert len(warned) == 1 and "rlfactory/report/metric_names.py" in warned[0]
    assert not [r for r in caplog.records if "reward/mean" in r.getMessage()]
    assert [json.loads(ln)["made_up/metric_s"]
            for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
