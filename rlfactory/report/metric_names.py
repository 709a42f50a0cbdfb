"""The registry of every metric a run writes to metrics.jsonl: one `Metric` per name (or per family of names, such as
`reward/<function>` or `tools/<server>/calls`) with its meaning, unit, the engines that write it and when.

The code uses it in two places: `MetricsLog.write` (metrics.py) warns once per process about a key of a row that no
entry matches, so a new metric that nobody registered shows up in the first run's log; and the docs site's metrics
reference (docs/_hooks/metrics_reference.py) is generated from it. tests/report/test_metric_names.py runs short real
runs and fails on a key the registry lacks, and on an entry that no run writes and that names no circumstance, so the
registry cannot drift either way.

A name's `<placeholder>` stands for one path segment (no `/`); `<placeholder...>` for the rest of the key, slashes
included (verl's own families). An exact name wins over a pattern.
Left out: building the rows (step_row.py and the loops), charts (charts.py), summary.json and eval/*.json. It
imports nothing of rlfactory's, so the dashboard and the report read it without loading the rollout's models.
"""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

Engine = Literal["sync", "async", "verl"]
"""Who writes a row: the local engine's synchronous loop (`trainer.max_staleness_steps: 0`), its asynchronous loop
(k >= 1), or the verl engine's run folder (rlfactory/verl/run_folder.py)."""
ENGINES: tuple[Engine, ...] = ("sync", "async", "verl")
ENGINE_TITLES: dict[Engine, str] = {"sync": "local sync", "async": "local async", "verl": "verl"}


@dataclass(frozen=True)
class Metric:
    """One metric name (or family of names) of metrics.jsonl."""

    name: str
    """The key, or a pattern: `<x>` is one path segment, `<x...>` the rest of the key."""
    meaning: str
    unit: str
    """What one unit is (`s`, `tokens`, `calls`, `fraction` for 0-1 shares, ...); "" for a pure number."""
    engines: tuple[Engine, ...]
    """The engines whose rows hold it."""
    when: str = ""
    """The circumstance it is written in; "" = every trained step's row of its engines."""
    when_on: tuple[Engine, ...] | None = None
    """The engines `when` applies to (None: all of `engines`); on the others it is in every row."""

    @property
    def is_pattern(self) -> bool:
        return "<" in self.name

    @property
    def namespace(self) -> str:
        """The first path segment (`reward`, `tools`, ...); `step` for the row's own keys (`step`, `horizon`)."""
        return self.name.split("/", 1)[0] if "/" in self.name else "step"

    def always_on(self, engine: Engine) -> bool:
        """Whether every trained step's row of `engine` holds it (a family: at least one key of it)."""
        if engine not in self.engines:
            return False
        return not self.when or (self.when_on is not None and engine not in self.when_on)

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        parts = re.split(r"(<[^>]+>)", self.name)
        body = "".join((".+" if p.endswith("...>") else "[^/]+") if p.startswith("<") else re.escape(p)
                       for p in parts)
        return re.compile(f"^{body}$")


LOCAL: tuple[Engine, ...] = ("sync", "async")
ALL: tuple[Engine, ...] = ENGINES
_EVAL = "eval steps (`trainer.eval_every_steps`)"

LOCAL_METRICS: tuple[Metric, ...] = (
    # ---- the row's own keys (report/step_row.py)
    Metric("step", "Optimizer steps taken when the row was written (1-based): the policy version the next step "
           "samples with.", "steps", ALL),
    Metric("horizon", "The most assistant turns a trajectory of the step could take (`rollout.horizon` at this "
           "step; the asynchronous loop and verl give the largest over the step's trajectories).", "turns", ALL),
    Metric("horizon_stage", "The stage of a staged horizon schedule (ScalingInter-RL) the step is in; 0 for a fixed "
           "horizon.", "", ALL),
    # ---- reward/: the RewardSet (rlfactory/reward/)
    Metric("reward/mean", "Mean reward of the step's trajectories: the weighted sum of the reward functions "
           "(`rewards.failure_value` for a trajectory where one raised).", "", ALL),
    Metric("reward/std", "Standard deviation (population) of that reward over the step's trajectories.", "", ALL),
    Metric("reward/errors", "Reward-function calls that raised during the step; each trajectory hit scored "
           "`rewards.failure_value` (counted, never silently 0).", "calls", ALL),
    Metric("reward/<function>", "Mean unweighted score of one reward function over the trajectories it scored "
           "(a function of weight 0 is a metric only).", "", ALL),
    Metric("reward/errors/<function>", "Calls of one reward function that raised during the step.", "calls", ALL,
           "a reward function raised"),
    Metric("reward/verl_score_mismatches", "Trained samples whose score in verl differs from the reward the "
           "RewardSet gave: 0 unless the reward bridge is broken.", "trajectories", ("verl",)),
    # ---- rollout/: the step's trajectories (rollout/metrics.py, trainer/update.py, trainer/outage.py)
    Metric("rollout/trajectories", "Trajectories the step trained on (prompts x samples).", "trajectories", ALL),
    Metric("rollout/num_turns_mean", "Assistant turns per trajectory, mean.", "turns", ALL),
    Metric("rollout/num_turns_max", "Assistant turns per trajectory, max.", "turns", ALL),
    Metric("rollout/response_tokens_mean", "Response tokens per trajectory (the policy's and the tools' after the "
           "prompt), mean.", "tokens", ALL),
    Metric("rollout/response_tokens_max", "Response tokens per trajectory, max.", "tokens", ALL),
    Metric("rollout/policy_tokens_mean", "Tokens the policy sampled per trajectory (loss mask 1), mean.", "tokens",
           ALL),
    Metric("rollout/generated_tokens", "Tokens the policy sampled in the step (a branch's copy of its root's "
           "tokens counted once).", "tokens", ALL),
    Metric("rollout/prompt_tokens_mean", "Prompt tokens per trajectory (system prompt, tool schemas, task), mean.",
           "tokens", ALL),
    Metric("rollout/tool_calls_mean", "Tool calls per trajectory, mean.", "calls", ALL),
    Metric("rollout/tool_calls", "Tool calls of the step's trajectories.", "calls", ALL),
    Metric("rollout/tool_call_errors", "Of those, calls whose result was an error.", "calls", ALL),
    Metric("rollout/errors", "Trajectories that ended in an error (finish reason `error`): counted, not trained "
           "on.", "trajectories", ALL),
    Metric("rollout/infra_failed", "Trajectories hit by an infrastructure failure (a tool server lost under a "
           "call): kept out of the loss.", "trajectories", ALL),
    Metric("rollout/finish_<reason>", "Trajectories that ended for this reason: `stop`, `max_turns`, "
           "`token_budget`, `context_length`, `env_done`, `error` (one key per reason, 0 included).", "trajectories",
           ALL),
    Metric("rollout/generate_s_mean", "Seconds a trajectory spent in generation, mean.", "s", ALL),
    Metric("rollout/tools_s_mean", "Seconds a trajectory waited on its tool calls, mean.", "s", ALL),
    Metric("rollout/wall_s", "Wall-clock seconds of the step's rollout batch.", "s", ("sync",)),
    Metric("rollout/branches", "Branches of branched groups: trajectories that went on from a root's first turns.",
           "trajectories", ALL, "branched groups (`rollout.branching`)"),
    Metric("rollout/branches_went_on", "Branches that played turns of their own after the branch point.",
           "trajectories", ALL, "branched groups (`rollout.branching`)"),
    Metric("rollout/branch_shared_tokens", "Tokens the branches shared with their roots (sampled once, by the "
           "root).", "tokens", ALL, "branched groups (`rollout.branching`)"),
    Metric("data/tasks_set_aside", "Training tasks the sampler passes over now: their last group's samples all "
           "scored alike, so they sit out `data.skip_settled_epochs` epochs.", "tasks", ("sync",),
           "`data.skip_settled_epochs` > 0"),
    Metric("data/draws_skipped", "Draws passed over since the run began, because their task was set aside.",
           "draws", ("sync",), "`data.skip_settled_epochs` > 0"),
    Metric("rollout/advantage_abs_mean", "Mean absolute advantage over the response tokens of the batch.", "", LOCAL),
    Metric("rollout/groups_all_same_reward", "GRPO groups whose samples all got the same reward as trained (zero "
           "advantage: nothing to learn from them). Infrastructure failures are left out; a sample whose reward "
           "function raised counts at its failure value (trainer/settled.py).", "groups", LOCAL),
    Metric("rollout/trained_tokens", "Response tokens in the loss (infrastructure failures left out).", "tokens",
           LOCAL),
    Metric("rollout/trained_on_infra_failures", "Infrastructure failures that still had a trained token: 0 unless "
           "something is wrong.", "trajectories", LOCAL),
    Metric("rollout/rows_with_signal", "Trajectories with a non-zero advantage: the rows forward/backward ran on.",
           "trajectories", LOCAL),
    Metric("rollout/skipped_steps", "Steps skipped since the previous row (nothing to train on: an environment "
           "outage, `trainer.max_env_outage_s`).", "steps", LOCAL),
    Metric("rollout/skipped_steps_total", "Steps skipped since the run started.", "steps", LOCAL),
    Metric("rollout/nodes", "Ray nodes whose agent-loop workers produced the step's trajectories.", "nodes",
           ("verl",)),
    Metric("rollout/images_mean", "Images a trajectory saw (tool results and the task's own pictures), mean.",
           "images", LOCAL, "a vision-language policy saw images"),
    Metric("rollout/image_tokens_mean", "Image placeholder tokens per trajectory (what its images cost in context), "
           "mean.", "tokens", LOCAL, "a vision-language policy saw images"),
    # ---- credit/
    Metric("credit/turns_with_company", "Share of assistant turns whose baseline came from other trajectories of "
           "their group (`returns`: one reached the same turn; `anchors`: one visited the same state).", "fraction",
           LOCAL, "per-turn credit (`algorithm.turn_credit.estimator` is not `none`)"),
    # ---- tools/: the ToolManager's counters (tools/counters.py)
    Metric("tools/calls", "Tool calls of the step, cache hits included.", "calls", ALL),
    Metric("tools/errors", "Calls that returned an error (content for the model).", "calls", ALL),
    Metric("tools/errors_<kind>", "Calls that failed with one kind of error: parse, unknown_tool, bad_arguments, "
           "timeout, server_error, tool_error, bad_image.", "calls", ALL, "a call failed with that kind"),
    Metric("tools/cache_hit_rate", "Share of the calls the tool cache answered.", "fraction", ALL),
    Metric("tools/latency_mean_s", "Seconds per call, mean (a cache hit's are the cache's).", "s", ALL),
    Metric("tools/latency_p<q>_s", "Quantile q (50, 90, 99) of the calls' latency, as the upper bound of its fixed "
           "histogram bucket (cache hits left out).", "s", ALL, "a call reached a tool (not only cache hits)"),
    Metric("tools/restarts", "Tool servers lost during the step, whether or not they are back yet.", "servers", ALL),
    Metric("tools/infra_errors", "Calls that failed for infrastructure reasons (server lost, down, or not back in "
           "time).", "calls", ALL),
    Metric("tools/retried", "Calls run again after their server was restarted (idempotent tools only).", "calls",
           ALL),
    Metric("tools/images", "Images the step's tool results brought (MCP ImageContent kept, after the checks of "
           "tools/images.py).", "images", ALL, "a tool returned an image"),
    Metric("tools/image_bytes", "Their decoded size.", "bytes", ALL, "a tool returned an image"),
    Metric("tools/<server>/calls", "Calls to one MCP server (`_unknown` for a call naming no known tool).", "calls",
           ALL, "the step called that server"),
    Metric("tools/<server>/errors", "Of those, calls that returned an error.", "calls", ALL,
           "the step called that server"),
    Metric("tools/cache_hits", "Calls the shared tool cache answered, counted from the trajectories.", "calls",
           ("verl",)),
    Metric("tools/cache_hits_from_other_nodes", "Of those, results another Ray node had put in the cache.", "calls",
           ("verl",)),
    # ---- loss/: the update (trainer/update.py over verl's core_algos; verl: copied from actor/*)
    Metric("loss/pg", "Policy-gradient loss (`algorithm.policy_loss`, verl's core_algos), mean over the step's "
           "updates; verl: `actor/pg_loss`.", "", ALL),
    Metric("loss/pg_clipfrac", "Share of tokens whose probability ratio was clipped; verl: `actor/pg_clipfrac`.",
           "fraction", ALL),
    Metric("loss/pg_clipfrac_lower", "Share of tokens clipped by the dual clip (negative advantages); verl: "
           "`actor/pg_clipfrac_lower`.", "fraction", ALL),
    Metric("loss/ppo_kl", "Approximate KL of the updated policy from the one that sampled (from the ratio); verl: "
           "`actor/ppo_kl`.", "nats", ALL),
    Metric("loss/entropy", "Mean token entropy of the policy on the trained tokens; verl: `actor/entropy`.", "nats",
           ALL),
    Metric("loss/kl", "KL to the frozen reference policy; verl: `actor/kl_loss`.", "nats", ALL,
           "a KL penalty (`algorithm.kl.use_reference` with `algorithm.kl.coef` > 0)"),
    Metric("loss/total", "The loss backpropagated: pg - entropy_coef x entropy + kl coef x KL.", "", LOCAL),
    Metric("loss/grad_norm", "Gradient norm before clipping, mean over the step's optimizer steps; verl: "
           "`actor/grad_norm`.", "", ALL),
    Metric("loss/lr", "Learning rate after the step; verl: `actor/lr`.", "", ALL),
    # ---- perf/: stage times (trainer/run.py's StageTimer; verl: copied from timing_s/*) and throughput
    Metric("perf/step_s", "Wall-clock seconds of the step; verl: `timing_s/step`.", "s", ALL),
    Metric("perf/sample_s", "Seconds picking the step's prompts.", "s", ("sync",)),
    Metric("perf/rollout_s", "Seconds of the rollouts (generation and tool calls); verl: `timing_s/gen`.", "s",
           ("sync", "verl")),
    Metric("perf/reward_s", "Seconds scoring the trajectories; verl: `timing_s/reward`.", "s", ("sync", "verl"),
           "verl logs `timing_s/reward` (its own reward path)", ("verl",)),
    Metric("perf/update_s", "Seconds of the GRPO update; verl: `timing_s/update_actor`.", "s", ALL),
    Metric("perf/push_s", "Seconds sending the new weights to the generation engine.", "s", LOCAL,
           "an engine that holds its own copy of the weights (vLLM)", ("sync",)),
    Metric("perf/wait_s", "Seconds the trainer waited for the generator's groups.", "s", ("async",),
           "the trainer had to wait for groups"),
    Metric("perf/wait_jobs_s", "Seconds the trainer waited for update jobs the generator took.", "s", ("async",),
           "the generator takes update jobs (`trainer.update_on_generator`) and took some"),
    Metric("perf/eval_s", "Seconds of the evaluation.", "s", LOCAL, _EVAL),
    Metric("perf/tokens_per_s", "Policy tokens of the step per second of the step.", "tokens/s", LOCAL),
    Metric("perf/rollout_tokens_per_s", "Response tokens of the rollout batch per second of its wall time.",
           "tokens/s", ("sync",)),
    Metric("perf/engine_busy_s", "Seconds the generation engine computed during the step (the rest of the rollout "
           "stage waited on tools).", "s", ("sync",)),
    Metric("perf/engine_prefill_s", "Of those, seconds of prefills.", "s", ("sync",)),
    Metric("perf/engine_decode_steps", "Decode steps of the engine (fewer for the same tokens: larger batches).",
           "steps", ("sync",)),
    Metric("perf/engine_prefills", "Prefill forward passes of the engine.", "passes", ("sync",)),
    Metric("time/elapsed_s", "Seconds since the run (its tool servers) started.", "s", LOCAL),
    # ---- eval/: `trainer.eval_every_steps` (trainer/evaluate.py), on the validation tasks
    Metric("eval/reward/mean", "Mean reward on the validation tasks.", "", LOCAL, _EVAL),
    Metric("eval/pass@1", "Mean success rate (reward >= `trainer.eval_success_threshold`).", "fraction", LOCAL,
           _EVAL),
    Metric("eval/pass@<k>", "Share of tasks solved by any of their k samples.", "fraction", LOCAL,
           _EVAL[:-1] + " with `trainer.eval_samples_per_prompt` > 1)"),
    Metric("eval/tasks", "Validation tasks evaluated.", "tasks", LOCAL, _EVAL),
    Metric("eval/k", "Samples per validation task (`trainer.eval_samples_per_prompt`).", "samples", LOCAL, _EVAL),
    Metric("eval/rollout/tool_calls_mean", "Tool calls per validation trajectory, mean.", "calls", LOCAL, _EVAL),
    Metric("eval/rollout/errors", "Validation trajectories that ended in an error.", "trajectories", LOCAL, _EVAL),
    # ---- async/: the asynchronous loop (trainer/asynchronous/), the staleness bound and the weight pushes
    Metric("async/policy_version", "The policy version the step trained from (steps taken before it).", "steps",
           ("async",)),
    Metric("async/staleness_token_mean", "Policy versions between a trained token's sampler and the trained "
           "policy, mean over policy tokens.", "steps", ("async",)),
    Metric("async/staleness_token_max", "The same, max (never above `trainer.max_staleness_steps`).", "steps",
           ("async",)),
    Metric("async/staleness_traj_mean", "A trajectory's staleness (the age of its oldest token), mean; verl: "
           "`training/off_policy/trajectory_staleness/mean`.", "steps", ("async", "verl")),
    Metric("async/staleness_traj_max", "The same, max; verl: `training/off_policy/trajectory_staleness/max`.",
           "steps", ("async", "verl")),
    Metric("async/versions_per_trajectory_max", "Most policy versions that sampled tokens of one trajectory (a "
           "partial rollout across weight loads).", "versions", ("async",)),
    Metric("async/dropped_trajectories", "Trajectories dropped this step for being staler than the bound.",
           "trajectories", ("async",)),
    Metric("async/dropped_trajectories_total", "The same, since the run started.", "trajectories", ("async",)),
    Metric("async/groups_waiting", "Finished groups waiting for a later step.", "groups", ("async",)),
    Metric("async/weight_push_s", "Seconds the trainer spent publishing the new weights.", "s", ("async",)),
    Metric("async/weight_load_s", "Seconds the generator spent loading pushed weights.", "s", ("async",)),
    Metric("async/weight_loads", "Pushed versions the generator loaded.", "versions", ("async",)),
    Metric("async/trainer_idle_s", "Seconds the trainer waited (for groups and for update jobs).", "s", ("async",)),
    Metric("async/trainer_wait_groups_s", "Of those, waiting for groups.", "s", ("async",)),
    Metric("async/trainer_wait_jobs_s", "Of those, waiting for update jobs the generator took.", "s", ("async",)),
    Metric("async/generator_idle_s", "Seconds the generator's engine had no forward pass to run.", "s", ("async",)),
    Metric("async/generator_gated_s", "Seconds the staleness bound held the generator back.", "s", ("async",)),
    Metric("async/engine_busy_s", "Seconds the generator's engine computed.", "s", ("async",)),
    Metric("async/engine_prefill_s", "Of those, seconds of prefills.", "s", ("async",)),
    Metric("async/engine_decode_steps", "Decode steps of the generator's engine.", "steps", ("async",)),
    Metric("async/engine_prefills", "Prefill forward passes of the generator's engine.", "passes", ("async",)),
    Metric("async/generator_update_jobs", "Update jobs (micro-batches) the generator's idle core ran.", "jobs",
           ("async",), "`trainer.update_on_generator` applies (CPU, cores split)"),
    Metric("async/generator_update_rows", "Trajectories in those jobs.", "trajectories", ("async",),
           "`trainer.update_on_generator` applies (CPU, cores split)"),
    Metric("async/generator_update_s", "Seconds the generator spent on them.", "s", ("async",),
           "`trainer.update_on_generator` applies (CPU, cores split)"),
    # ---- off_policy/: the correction of stale tokens (algorithms/off_policy.py, `algorithm.off_policy`)
    Metric("off_policy/tokens", "Policy tokens the correction weighed.", "tokens", ("async",)),
    Metric("off_policy/tokens_clipped", "Tokens whose importance weight was capped (`is_cap`).", "tokens",
           ("async",)),
    Metric("off_policy/tokens_masked", "Tokens left out for a ratio outside `mask_outside`.", "tokens", ("async",)),
    Metric("off_policy/logprob_gap", "Mean log pi_old - log mu per token (proximal over behaviour policy).", "nats",
           ("async",)),
    Metric("off_policy/kl", "Mean KL estimate of the proximal from the behaviour policy per token.", "nats",
           ("async",)),
    Metric("off_policy/is_weight_mean", "Mean importance weight per token.", "", ("async",)),
)
"""rlfactory's own names, written by the local engine's loops and (most of them) by verl's run folder."""

_VERL = ("verl",)

VERL_METRICS: tuple[Metric, ...] = (
    Metric("actor/<name...>", "verl's actor update: `pg_loss`, `entropy`, `grad_norm`, `lr`, `ppo_kl`, "
           "`pg_clipfrac`, `pg_clipfrac_lower`, `loss`, `kl_loss`, and `perf/*` memory figures (GB).", "", _VERL),
    Metric("critic/<name...>", "verl's data metrics: `score`, `rewards`, `advantages`, `returns` (min / mean / "
           "max), and with a critic its values.", "", _VERL),
    Metric("timing_s/<stage>", "Seconds of one of verl's stages (`gen`, `old_log_prob`, `adv`, `update_actor`, "
           "`update_weights`, `save_checkpoint`, `step`, ...).", "s", _VERL),
    Metric("timing_per_token_ms/<stage>", "Milliseconds per token of one of verl's stages.", "ms", _VERL),
    Metric("training/<name...>", "verl's trainer: `epoch`, `global_step`, `num_turns/*`, the rollout / actor "
           "probability agreement (`rollout_actor_probs_pearson_corr`, `rollout_probs_diff_*`), and the policy "
           "versions behind the trained batch (`off_policy/trajectory_staleness*`, `off_policy/trajectory_spans/*`).",
           "", _VERL),
    Metric("global_seqlen/<stat>", "Tokens per data-parallel rank after verl's balancing (min, max, mean, "
           "balanced_min, balanced_max, minmax_diff).", "tokens", _VERL),
    Metric("prompt_length/<stat>", "verl's prompt lengths (min, max, mean, clip_ratio).", "tokens", _VERL),
    Metric("response_length/<stat>", "verl's response lengths (min, max, mean, clip_ratio).", "tokens", _VERL),
    Metric("response_length_non_aborted/<stat>", "The same, over responses not aborted.", "tokens", _VERL),
    Metric("response/aborted_ratio", "Share of verl's responses aborted.", "fraction", _VERL),
    Metric("num_turns/<stat>", "verl's turns per trajectory (min, max, mean).", "turns", _VERL),
    Metric("rollout_corr/<name>", "verl's rollout-vs-training policy divergence: KL, k3 KL, chi2, perplexities "
           "and their ratio.", "", _VERL),
    Metric("perf/mfu/<role>", "verl's model FLOPs utilisation of a role (actor, actor_infer, critic).", "fraction",
           _VERL),
    Metric("perf/throughput", "verl's tokens per second per GPU.", "tokens/s", _VERL),
    Metric("perf/time_per_step", "verl's seconds per step.", "s", _VERL),
    Metric("perf/total_num_tokens", "verl's tokens of the step (prompts and responses).", "tokens", _VERL),
    Metric("val-core/<name...>", "verl's validation: the main score per data source (`val-core/<source>/reward/"
           "mean@n`, ...).", "", _VERL, _EVAL),
    Metric("val-aux/<name...>", "verl's validation: the other figures (best@n, worst@n, num_turns, ...).", "",
           _VERL, _EVAL),
)
"""verl's own names, which its run-folder rows keep beside rlfactory's (rlfactory/verl/run_folder.py)."""


REGISTRY: tuple[Metric, ...] = (*LOCAL_METRICS, *VERL_METRICS)
"""Every metric, in the reference's order."""
_EXACT = {m.name: m for m in REGISTRY if not m.is_pattern}
_PATTERNS = [m for m in REGISTRY if m.is_pattern]


def matches(key: str) -> list[Metric]:
    """Every entry that `key` matches: its exact entry alone when there is one, else the patterns it fits."""
    if key in _EXACT:
        return [_EXACT[key]]
    return [m for m in _PATTERNS if m.regex.match(key)]


@functools.lru_cache(maxsize=4096)
def lookup(key: str) -> Metric | None:
    """The entry of a metrics.jsonl key, or None when the registry lacks it."""
    found = matches(key)
    return found[0] if found else None


_warned: set[str] = set()


def warn_unregistered(row: Iterable[str], where: object) -> list[str]:
    """Log a warning, once per key and process, for each key of `row` the registry lacks; returns those keys."""
    missing = [k for k in row if k not in _warned and lookup(k) is None]
    for key in missing:
        _warned.add(key)
        logger.warning("%s: metric %r is not in the metrics registry: add it to rlfactory/report/metric_names.py "
                       "(name, meaning, unit, engines) so the metrics reference documents it", where, key)
    return missing
