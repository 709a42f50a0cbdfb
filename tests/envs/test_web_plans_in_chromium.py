"""The demonstrator plans name elements as a real browser's accessibility tree names them: one task per template is
played in headless Chromium (Debian's, through playwright) by role and accessible name, then scored.

This checks the plan data and the sites' markup (labels, roles, visible forms); the browser MCP server and its
element ids are tested with the browser itself.
"""
from __future__ import annotations

import os
import shutil

import httpx
import pytest

from rlfactory.envs.web.sites.server import WebSites
from rlfactory.envs.web.tasks.build import build_tasks, plan_steps
from rlfactory.envs.web.tasks.evaluator import fill
from rlfactory.envs.web.tasks.http_solver import episode_evaluator

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs chromium")]


async def _play(page, config: dict, urls: dict[str, str]) -> str:
    await page.goto(fill(config["start_url"], urls))
    for step in plan_steps(config):
        if step["action"] == "stop":
            return step.get("answer", "")
        found = page.get_by_role(step["role"], name=step["name"], exact=True)
        count = await found.count()
        assert count >= 1, f"task {config['task_id']}: no {step['role']} {step['name']!r} on {page.url}"
        if count > 1:  # the same link repeated (an author's name on each of their posts) is one target
            assert step["role"] == "link", f"task {config['task_id']}: {count} {step['role']}s {step['name']!r}"
            assert len({await found.nth(i).get_attribute("href") for i in range(count)}) == 1
        target = found.first
        if step["action"] == "click" and step["role"] == "radio":
            await target.check()
        elif step["action"] == "click":
            await target.click()
        else:
            await target.fill(step["text"])
            if step.get("press_enter"):
                await target.press("Enter")
        await page.wait_for_load_state()
    raise AssertionError(f"task {config['task_id']}: the plan has no stop step")


async def test_one_task_per_template_solved_in_chromium(tmp_path):
    playwright = pytest.importorskip("playwright.async_api")
    tasks = build_tasks(0, tmp_path / "cache")
    sample = list({t["intent_template_id"]: t for t in reversed(tasks)}.values())
    failures = []
    with WebSites(cache=tmp_path / "cache") as sites:
        async with playwright.async_playwright() as p, httpx.AsyncClient(timeout=30.0) as client:
            browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            try:
                for config in sample:
                    episode = f"chromium-{config['task_id']}"
                    sites.open_episode(episode)
                    context = await browser.new_context()
                    try:
                        page = await context.new_page()
                        answer = await _play(page, config, sites.placeholders(episode))
                        result = await episode_evaluator(sites, episode, client)(config, answer, page.url)
                        if result.score != 1.0:
                            failures.append((config["task_id"], config["intent"], result.parts))
                    finally:
                        await context.close()
                        sites.close_episode(episode)
            finally:
                await browser.close()
    assert failures == []
