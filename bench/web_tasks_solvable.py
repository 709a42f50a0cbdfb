"""Sweep: the HTTP demonstrator solves every web task (train and held-out) on a live site server.

Usage: python bench/web_tasks_solvable.py [--seed 0] [--limit N] [--concurrency 4] [--json PATH]
Prints the count solved, the failures (task id, template, score parts or error) and the time per task.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    configs = build_tasks(args.seed)
    if args.limit:
        configs = configs[:: max(1, len(configs) // args.limit)][: args.limit]
    with WebSites(seed=args.seed) as sites:
        start = time.perf_counter()
        failures = asyncio.run(sweep(sites, configs, args.concurrency))
        took_s = time.perf_counter() - start
    for config, why in failures[:50]:
        print(f"FAIL task {config['task_id']} template {config['intent_template_id']}: {config['intent']} -> {why}")
    summary = {"tasks": len(configs), "solved": len(configs) - len(failures), "seconds": round(took_s, 2),
               "ms_per_task": round(1000 * took_s / max(1, len(configs)), 1)}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    main()
