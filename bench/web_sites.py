"""Figures of the self-hosted web sites: seed build time, per-episode state copy (file copy against SQLite's backup
API), page latency, and the site server's RSS with many open episodes.

Usage: python bench/web_sites.py [--episodes 50] [--requests 200] [--json PATH]
Runs on whatever machine it is given; the figures are medians (and p99 for latency) of the stated repeats.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from rlfactory.envs.web.sites.server import WebSites
from rlfactory.envs.web.sites.store import SITES, seed_database


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)}


async def _aria_sizes(base: dict[str, str], forum: str, post_id: int) -> dict[str, int]:
    """Characters of `aria_snapshot()` (the page text a browser agent reads) of typical pages."""
    from playwright.async_api import async_playwright

    pages = {"shop_home": base["shop"] + "/", "shop_listing": base["shop"] + "/category/shirts",
             "shop_product": base["shop"] + "/product/SKU-000-00003", "forum_hot": base["forum"] + "/",
             "forum_post": f"{base['forum']}/f/{forum}/{post_id}", "wiki_article": base["wiki"] + "/wiki/Varnholt"}
    sizes = {}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = await browser.new_page()
        for name, url in pages.items():
            await page.goto(url)
            sizes[f"aria_chars_{name}"] = len(await page.locator("body").aria_snapshot())
        await browser.close()
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", default=None)
    parser.add_argument("--aria", action="store_true", help="also the accessibility-tree size of typical pages "
                                                            "(headless Chromium at /usr/bin/chromium)")
    args = parser.parse_args()
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for site in SITES:
            start = time.perf_counter()
            path = seed_database(site, 0, cache)
            out[f"seed_build_{site}_s"] = round(time.perf_counter() - start, 3)
            out[f"seed_size_{site}_bytes"] = path.stat().st_size
            copies, backups = [], []
            for i in range(30):
                start = time.perf_counter()
                shutil.copyfile(path, Path(tmp) / f"copy-{site}-{i}.sqlite")
                copies.append(time.perf_counter() - start)
                start = time.perf_counter()
                src, dst = sqlite3.connect(path), sqlite3.connect(Path(tmp) / f"backup-{site}-{i}.sqlite")
                src.backup(dst)
                src.close()
                dst.close()
                backups.append(time.perf_counter() - start)
            out[f"copy_file_{site}"] = _ms(copies)
            out[f"copy_backup_api_{site}"] = _ms(backups)
        with WebSites(cache=cache) as sites:
            server = psutil.Process(sites.proc.pid)
            opens, forks = [], []
            with httpx.Client(timeout=30.0) as client:
                urls = sites.open_episode("warm")
                client.get(urls["shop"] + "/")
                out["server_rss_mb_idle"] = round(server.memory_info().rss / 2**20, 1)
                for i in range(args.episodes):
                    start = time.perf_counter()
                    urls = sites.open_episode(f"ep{i}")
                    opens.append(time.perf_counter() - start)
                    client.post(urls["shop"] + "/cart/add", data={"sku": "SKU-000-00001", "colour": "x"})
                    for path in ("/", "/category/shirts?colour=red&sort=price_asc", "/product/SKU-000-00002"):
                        client.get(urls["shop"] + path)
                    client.get(urls["forum"] + "/f/cooking/top")
                for i in range(min(10, args.episodes)):
                    start = time.perf_counter()
                    sites.fork_episode(f"ep{i}", f"fork{i}")
                    forks.append(time.perf_counter() - start)
                out["open_episode_all_sites"] = _ms(opens)
                out["fork_episode_all_sites"] = _ms(forks)
                out[f"server_rss_mb_{args.episodes}_episodes"] = round(server.memory_info().rss / 2**20, 1)
                out["disk_bytes_per_episode"] = sum(f.stat().st_size for f in (sites.store.root / "ep0").iterdir())
                base = sites.base_urls("ep0")
                conn = sites.database("ep0", "forum")
                post_id, forum = conn.execute("SELECT p.id, f.name FROM posts p JOIN forums f ON f.id = p.forum_id "
                                              "ORDER BY p.id LIMIT 1").fetchone()
                conn.close()
                for name, url in (("shop_product", base["shop"] + "/product/SKU-000-00003"),
                                  ("shop_filtered_listing", base["shop"] + "/category/shirts?colour=red&size=M"
                                                                           "&sort=price_asc"),
                                  ("shop_search", base["shop"] + "/catalogsearch/result/?q=aurora+shirt"),
                                  ("forum_post", f"{base['forum']}/f/{forum}/{post_id}"),
                                  ("forum_listing_hot", base["forum"] + "/")):
                    samples = []
                    for _ in range(args.requests):
                        start = time.perf_counter()
                        client.get(url, follow_redirects=True)
                        samples.append(time.perf_counter() - start)
                    out[f"latency_{name}"] = _ms(samples)
                if args.aria:
                    out.update(asyncio.run(_aria_sizes(base, forum, post_id)))
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
