"""The web environment (rlfactory/envs/web/env.py) on the real site server and real headless Chromium: a task's
reset, scoring at `stop`, the step limit, containment to the episode's own path, forks that share nothing, the
scripted demonstrator through the browser, and the MCP env server (envs/tools/web.py) as a real subprocess."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

from rlfactory.envs.web.demonstrator import find_element, play_plan
from rlfactory.envs.web.env import WebEnv, WebWorld

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                reason="Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with WebWorld(cache=tmp_path_factory.mktemp("web-cache")) as w:
        yield w


def _act(env: WebEnv):
    def act(action: str):
        r = env.step(action)
        return r.observation, r.done, r.score
    return act


def _solve(world: WebWorld, env: WebEnv, task_id: int) -> float:
    first = env.reset(task_id)
    demo = play_plan(env.config, first.observation, _act(env), world.sites.placeholders(env.episode))
    assert demo.done and demo.actions[-1].startswith("stop ["), demo.actions
    return demo.score


def test_reset_shows_the_task_and_stop_scores_it(world):
    env = WebEnv(world)
    try:
        first = env.reset(0)
        assert first.observation.startswith(f"Task: {env.config['intent']}\n") and "URL: " in first.observation
        assert first.info["site"] == "shopping" and first.info["split"] == "train" and not first.done
        assert env.url.startswith(world.sites.episode_prefix(env.episode))
        wrong = env.step("stop [no idea]")
        assert wrong.done and wrong.score == 0.0 and wrong.reward == 0.0 and wrong.info["answer"] == "no idea"
        assert env.step("scroll [down]").done  # an ended episode stays ended
        assert [world.task("train", i)["sites"][0] for i in range(3)] == ["shopping", "reddit", "wikipedia"]
    finally:
        env.close()
    assert env.episode is None and not world.sites.store.episodes()


@pytest.mark.parametrize("task_id", [0, 1, 2])  # a shop, a forum and a wiki task
def test_the_demonstrator_solves_a_task_of_each_site_through_the_browser(world, task_id):
    env = WebEnv(world)
    try:
        assert _solve(world, env, task_id) == 1.0
    finally:
        env.close()


def test_a_tasks_subgoal_page_is_reported_as_progress_once_and_forks_keep_it(world):
    """Task 0 asks about a product: its config names the product's page (`eval.subgoal_urls`), and `progress` rises
    from 0 to 1 on the step that opens it (the demonstrator's click), stays there, and enters the state key."""
    env = WebEnv(world)
    twin = None
    try:
        first = env.reset(0)
        (subgoal,) = env.config["eval"]["subgoal_urls"]
        assert subgoal.startswith("__SHOPPING__/product/")
        assert first.info["progress"] == 0.0
        seen, keys = [], []

        def act(action: str):
            r = env.step(action)
            seen.append((action.split(" ")[0], r.info["progress"], env.url))
            keys.append(env.state_key())
            if r.info["progress"] == 1.0 and len(seen) == 2:
                nonlocal twin
                twin = env.fork()
            return r.observation, r.done, r.score
        demo = play_plan(env.config, first.observation, act, world.sites.placeholders(env.episode))
        assert demo.score == 1.0 and [s[:2] for s in seen] == [("type", 0.0), ("click", 1.0), ("stop", 1.0)]
        assert seen[1][2].endswith(subgoal.removeprefix("__SHOPPING__"))  # the product's page
        assert twin is not None and twin.reached == {0}
        assert twin.step("go_back").info["progress"] == 1.0  # paid once: leaving the page keeps it
        assert json.loads(keys[0])[3] == [] and json.loads(keys[1])[3] == [0]  # the state key holds it
    finally:
        env.close()
        if twin is not None:
            twin.close()


def test_the_step_limit_ends_and_scores_the_episode(world):
    env = WebEnv(world, max_steps=2)
    try:
        env.reset(1)
        assert not env.step("scroll [down]").done
        last = env.step("scroll [down]")
        assert last.done and last.score == 0.0 and "step limit (2)" in last.observation
    finally:
        env.close()


def test_an_episode_reaches_its_own_sites_only(world):
    a, b = WebEnv(world), WebEnv(world)
    try:
        a.reset(0)
        b.reset(0)
        other = world.sites.base_urls(b.episode)["shop"] + "/"
        seen = a.step(f"goto [{other}]").observation
        assert "outside this episode's sites" in seen and f"URL: {other}" not in seen
        assert a.step("goto [http://example.com/]").observation.count("outside") >= 1
    finally:
        a.close()
        b.close()


def test_a_fork_has_sites_and_browser_of_its_own(world):
    tid = next(i for i, c in enumerate(world.splits["train"]) if c["eval"].get("db_state"))
    env = WebEnv(world)
    try:
        env.reset(tid)
        twin = env.fork()
        try:
            assert twin.episode != env.episode and twin.url.startswith(world.sites.episode_prefix(twin.episode))
            assert f"URL: {twin.url}" in twin.observe()
            demo = play_plan(twin.config, twin.observe(), _act(twin), world.sites.placeholders(twin.episode))
            assert demo.score == 1.0
            # The fork's changes are in its own databases: the original's still fail the task's database checks.
            untouched = world.evaluate(env.episode, env.config, demo.actions[-1][6:-1], twin.url)
            assert untouched.parts["db_state"] == 0.0 and not env.done
        finally:
            twin.close()
    finally:
        env.close()


def test_sites_that_are_down_are_an_infrastructure_failure(tmp_path):
    from rlfactory.envs.types import EnvError

    with WebWorld(cache=tmp_path / "cache") as own:
        env = WebEnv(own)
        env.reset(0)
        own.sites.proc.terminate()  # the site server dies under an open episode
        own.sites.proc.wait(10)
        with pytest.raises(EnvError) as lost:
            env.step("click [3]")  # the proxy's error page is not the policy's observation
        assert lost.value.infra and "site server is not running" in str(lost.value)
        with pytest.raises(EnvError) as down:
            env.reset(1)
        assert down.value.infra
        env.close()


def test_state_key_is_equal_for_equal_states(world):
    a, b = WebEnv(world), WebEnv(world)
    try:
        assert a.state_key() is None
        first = a.reset(0).observation
        b.reset(0)
        assert a.state_key() == b.state_key() and a.episode != b.episode
        go = f"click [{find_element(first, 'link', 'Hoodies')}]"
        a.step(go)
        assert a.state_key() != b.state_key()
        b.step(go)
        assert a.state_key() == b.state_key()
        twin = a.fork()
        try:
            assert twin.state_key() == a.state_key()
        finally:
            twin.close()
        b.reset(3)
        assert a.state_key() != b.state_key()
    finally:
        a.close()
        b.close()


def test_pixel_view_gives_a_png(world):
    env = WebEnv(world, view="pixels")
    try:
        assert env.picture() is None
        env.reset(2)
        assert env.picture().startswith(b"\x89PNG")
    finally:
        env.close()
    assert WebEnv(world).picture() is None


def test_a_confined_policy_allows_the_episode_path_only():
    from rlfactory.envs.web.browser.policy import OriginPolicy

    p = OriginPolicy.of(["http://127.0.0.1:8001/e/a/"], confine_paths=True)
    for url in ("http://127.0.0.1:8001/e/a/shop/p/3?x=1", "HTTP://127.0.0.1:8001/e/a/", "about:blank",
                "http://127.0.0.1:8001/favicon.ico"):
        assert p.allows(url), url
    for url in ("http://127.0.0.1:8001/e/b/shop/", "http://127.0.0.1:8001/e/ab/shop", "http://127.0.0.1:8001/health",
                "http://127.0.0.1:8002/e/a/shop", "http://127.0.0.1:8001/e/a%2F..%2Fb/shop"):
        assert not p.allows(url), url
    assert "http://127.0.0.1:8001/e/a/" in p.refusal("/e/b/", base="http://127.0.0.1:8001/e/a/shop")
    assert OriginPolicy.of(["http://127.0.0.1:8001/e/a/"]).allows("http://127.0.0.1:8001/e/b/")  # paths: opt-in


def test_find_element_reads_ids_from_an_observation():
    obs = "Tab 0 (current): Shop\nURL: http://x/\n[1] banner\n\t[7] link 'Bob's shop'\n\t[9] searchbox 'Search' focused"
    assert find_element(obs, "link", "Bob's  shop") == "7" and find_element(obs, "searchbox", "Search") == "9"
    assert find_element(obs, "button", "Search") is None


@pytest.mark.slow
def test_the_demonstrator_solves_one_task_per_template_through_the_browser(world):
    """Every template once (its first task in the train split, or in the held-out one for a template held out
    whole): the plans name elements as the browser's observation names them, and the sites' markup lets them act.
    Every one of the ~1,089 tasks is solved over HTTP by test_web_tasks.py; `python bench/web_tasks_solvable.py
    --browser` sweeps them all through the browser."""
    failures, done = [], set()
    for split in ("train", "heldout"):
        first_of: dict[int, int] = {}
        for i, config in enumerate(world.splits[split]):
            if config["intent_template_id"] not in done:
                first_of.setdefault(config["intent_template_id"], i)
        done |= set(first_of)
        env = WebEnv(world, split=split)
        try:
            for template, i in sorted(first_of.items()):
                score = _solve(world, env, i)
                if score != 1.0:
                    failures.append((split, template, i, score))
        finally:
            env.close()
    assert not failures


async def test_the_mcp_server_plays_scores_and_forks_an_episode():
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.mcp_configs import ServerConfig, ServerSettings
    from rlfactory.tools.types import ToolCall

    cfg = ServerConfig("web", "test", "stdio", command=sys.executable,
                       args=("-m", "rlfactory.envs.tools.web", "--max-episodes", "4"),
                       settings=ServerSettings(cache=False, startup_timeout_s=90, tool_timeout_s=90))
    async with ToolManager({"web": cfg}) as tools:
        assert {"reset", "step", "observe", "close"} <= {s.tool for s in tools.specs if s.server == "web"}
        assert [s.tool for s in tools.loop_specs if s.server == "web"] == ["fork"]
        opened = await tools.call(ToolCall(name="web.reset", arguments={"task_id": 1, "episode_id": "ep"}))
        assert not opened.is_error and opened.structured["observation"].startswith("Task: ")
        forked = await tools.call(ToolCall(name="web.fork", arguments={"into": "ep2", "episode_id": "ep"}))
        assert not forked.is_error, forked.text

        progress = [opened.structured["progress"]]  # the rollout side sees it (the post's page is a subgoal)

        async def play(episode: str, first: str) -> float:
            config = _server_task(1)

            async def act(action: str):
                r = await tools.call(ToolCall(name="web.step", arguments={"action": action, "episode_id": episode}))
                assert not r.is_error, r.text
                progress.append(r.structured["progress"])
                return r.structured["observation"], r.structured["done"], r.structured["score"]
            return await _play_async(config, first, act)

        assert await play("ep", opened.structured["observation"]) == 1.0
        assert progress[0] == 0.0 and progress[-1] == 1.0 and "progress" not in opened.text
        done_twin = await tools.call(ToolCall(name="web.step", arguments={"action": "stop [x]", "episode_id": "ep2"}))
        assert done_twin.structured["done"] and done_twin.structured["score"] == 0.0
        for ep in ("ep", "ep2"):
            closed = await tools.call(ToolCall(name="web.close", arguments={"episode_id": ep}))
            assert not closed.is_error

        # `rlfactory sft`'s demo sets: the web demonstrator through this server, one task of each site.
        from rlfactory.warmup.env_demos import generate_env_demos

        rows = [{"id": f"web-{i}", "prompt": "Do the web task.", "answer": None, "env": {"server": "web", "task_id": i}}
                for i in range(3)]
        demos, stats = await generate_env_demos(rows, tools, policy="web", styles={"plan": 1.0}, max_turns=12,
                                                concurrency=1)
        assert stats == {"plan": 3} and [d["id"] for d in demos] == ["web-0", "web-1", "web-2"]
        last = demos[0]["messages"][-1]
        assert last["role"] == "tool" and "score=1 done=true" in last["content"]
        assert demos[0]["messages"][1]["content"].startswith("Task: ")
        assert all(m["content"].startswith("<tool_call>") for m in demos[0]["messages"][2::2])


def _server_task(task_id: int) -> dict:
    """The config the server's `reset(task_id)` opens (its list: the train split, sites interleaved)."""
    from rlfactory.envs.web.env import split_tasks

    tasks = split_tasks(0)["train"]
    return tasks[task_id % len(tasks)]


async def _play_async(config: dict, first: str, act) -> float:
    """`play_plan` over an async `act` (the MCP call): the plan's steps resolved on each observation."""
    from rlfactory.envs.web.demonstrator import MAX_SCROLLS
    from rlfactory.envs.web.tasks.build import plan_steps, webarena_action

    observation, score = first, 0.0
    for step in plan_steps(config):
        if step["action"] == "stop":
            _, done, score = await act(webarena_action(step))
            assert done
            return score
        eid = find_element(observation, step["role"], step["name"])
        for _ in range(MAX_SCROLLS):
            if eid is not None:
                break
            observation, _, _ = await act("scroll [down]")
            eid = find_element(observation, step["role"], step["name"])
        assert eid is not None, (step, observation[-500:])
        observation, _, _ = await act(webarena_action(step, eid))
    return score


async def test_doctor_plays_an_episode_on_each_site():
    from pathlib import Path

    from rlfactory.envs.doctor import run_doctor

    (report,) = await run_doctor([Path(__file__).resolve().parents[2] / "mcp_configs" / "web.json"])
    assert report.server == "web" and report.ok, [(s.name, s.detail) for s in report.stages]
    names = [s.name for s in report.stages]
    assert names[0] == "health" and [n for n in names if n.startswith("reset")] == [
        "reset(task_id=0)", "reset(task_id=1)", "reset(task_id=2)"]
    pages = [s.detail for s in report.stages if s.name == "observe()"]
    assert [re.search(r"URL: \S+/e/[\w-]+/(\w+)", p).group(1) for p in pages] == ["shop", "forum", "wiki"], pages
