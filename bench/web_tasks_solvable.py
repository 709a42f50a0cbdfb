"""Sweep: the HTTP demonstrator solves every web task (train and held-out) on a live site server.

Usage: python bench/web_tasks_solvable.py [--seed 0] [--limit N] [--concurrency 4] [--json PATH] [--browser]
Prints the count solved, the failures (task id, template, score parts or error) and the time per task.
`--browser`: the scripted demonstrator through the real browser instead (`WebEnv` in headless Chromium: each plan
step found by its id in the observation and played as a WebArena action, rlfactory/envs/web/demonstrator.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

from rlfactory.envs.web.sites.server import WebSites
from rlfactory.envs.web.tasks.build import build_tasks
from rlfactory.envs.web.tasks.http_solver import run_task


async def sweep(sites: WebSites, configs: list[dict], concurrency: int) -> list[tuple[dict, str]]:
    failures: list[tuple[dict, str]] = []
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30.0) as client:
        async def one(config: dict) -> None:
            async with limit:
                try:
                    result = await run_task(sites, config, client, f"t{config['task_id']}")
                    if result.score != 1.0:
                        failures.append((config, f"score {result.score} {result.parts}"))
                except Exception as exc:  # noqa: BLE001 - a failure is reported, the sweep goes on
                    failures.append((config, f"{type(exc).__name__}: {exc}"))
        await asyncio.gather(*(one(c) for c in configs))
    return failures


def browser_sweep(configs: list[dict], seed: int, concurrency: int) -> list[tuple[dict, str]]:
    """The demonstrator through `WebEnv` (one browser, `concurrency` episodes at once on threads)."""
    from concurrent.futures import ThreadPoolExecutor

    from rlfactory.envs.web.demonstrator import play_plan
    from rlfactory.envs.web.env import WebEnv, WebWorld

    failures: list[tuple[dict, str]] = []
    with WebWorld(seed=seed) as world:
        index = {c["task_id"]: (split, i) for split, tasks in world.splits.items() for i, c in enumerate(tasks)}

        def one(config: dict) -> None:
            split, i = index[config["task_id"]]
            env = WebEnv(world, split=split)
            try:
                first = env.reset(i)

                def act(action: str):
                    r = env.step(action)
                    return r.observation, r.done, r.score
                demo = play_plan(env.config, first.observation, act, world.sites.placeholders(env.episode))
                if demo.score != 1.0:
                    failures.append((config, f"score {demo.score} after {demo.actions}"))
            except Exception as exc:  # noqa: BLE001 - a failure is reported, the sweep goes on
                failures.append((config, f"{type(exc).__name__}: {exc}"))
            finally:
                env.close()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, configs))
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", default=None)
    parser.add_argument("--browser", action="store_true", help="through headless Chromium (WebEnv), not HTTP")
    args = parser.parse_args()
    configs = build_tasks(args.seed)
    if args.limit:
        configs = configs[:: max(1, len(configs) // args.limit)][: args.limit]
    start = time.perf_counter()
    if args.browser:
        failures = browser_sweep(configs, args.seed, args.concurrency)
    else:
        with WebSites(seed=args.seed) as sites:
            failures = asyncio.run(sweep(sites, configs, args.concurrency))
    took_s = time.perf_counter() - start
    for config, why in failures[:50]:
        print(f"FAIL task {config['task_id']} template {config['intent_template_id']}: {config['intent']} -> {why}")
    summary = {"via": "browser" if args.browser else "http", "tasks": len(configs),
               "solved": len(configs) - len(failures), "seconds": round(took_s, 2),
               "ms_per_task": round(1000 * took_s / max(1, len(configs)), 1)}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    main()
