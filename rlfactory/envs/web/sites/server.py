"""`WebSites`: the Python API the web environment uses: start the site server, open / fork / close episodes, read an
episode's databases for evaluation, stop.

The server is one uvicorn process (`python -m rlfactory.envs.web.sites.server`) serving every episode of every
site on one 127.0.0.1 port that this process binds and hands over as a file descriptor (no port race). Episode
state is files under `root` (see store.py), so opening, forking and closing happen here without talking to the
server. An episode's base URLs are `http://127.0.0.1:<port>/e/<episode>/shop`, `.../forum` and `.../wiki`; a browser
confined to `http://127.0.0.1:<port>/e/<episode>/` sees its own episode and nothing else.
Left out: several server processes behind one port (one process serves ~hundreds of requests per second).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rlfactory.envs.web.sites.store import SITES, EpisodeStore, connect, seed_database

logger = logging.getLogger(__name__)

# WebArena's placeholders for the sites we stand in for (its configs say `__SHOPPING__/...`, `__REDDIT__/...`).
PLACEHOLDERS = {"__SHOPPING__": "shop", "__REDDIT__": "forum", "__WIKIPEDIA__": "wiki"}
# WebArena's site names (a config's `sites`, an `eval.db_state` check's `site`) for ours.
WEBARENA_SITES = {"shopping": "shop", "reddit": "forum", "wikipedia": "wiki"}


class WebSites:
    """The site server and its episodes. Use as a context manager, or call `start()` and `stop()`."""

    def __init__(self, root: Path | None = None, seed: int = 0, cache: Path | None = None,
                 start_timeout_s: float = 30.0):
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="rlfactory-web-"))
        self.seed = seed
        self.cache = cache
        self.store = EpisodeStore(self.root / "episodes", seed, cache)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.origin = ""

    def start(self) -> str:
        """Build the seed databases if needed, start the server, wait until it answers; returns its origin."""
        for site in SITES:
            seed_database(site, self.seed, self.cache)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        port = sock.getsockname()[1]
        cmd = [sys.executable, "-m", "rlfactory.envs.web.sites.server", "--root", str(self.store.root),
               "--seed", str(self.seed), "--fd", str(sock.fileno())]
        if self.cache:
            cmd += ["--cache", str(self.cache)]
        self.proc = subprocess.Popen(cmd, pass_fds=[sock.fileno()])
        sock.close()  # the child holds its own copy
        self.origin = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the web site server exited with code {self.proc.returncode} at start: run "
                                   f"`{' '.join(cmd[:3])} --help` and check its log above")
            try:
                if httpx.get(f"{self.origin}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the web site server did not answer /health within {self.start_timeout_s} s")
            time.sleep(0.05)
        logger.info("web sites serving at %s (episodes under %s)", self.origin, self.store.root)
        return self.origin

    def base_urls(self, episode: str) -> dict[str, str]:
        """{site: base URL} of an episode (no trailing slash)."""
        if not self.origin:
            raise RuntimeError("the web sites are not started: call WebSites.start() first")
        return {site: f"{self.origin}/e/{episode}/{site}" for site in SITES}

    def episode_prefix(self, episode: str) -> str:
        """The URL prefix every page of an episode starts with: what a browser confined to it may load."""
        if not self.origin:
            raise RuntimeError("the web sites are not started: call WebSites.start() first")
        return f"{self.origin}/e/{episode}/"

    def placeholders(self, episode: str) -> dict[str, str]:
        """WebArena's URL placeholders mapped to this episode's sites, for task configs and the evaluator."""
        urls = self.base_urls(episode)
        return {name: urls[site] for name, site in PLACEHOLDERS.items()}

    def open_episode(self, episode: str, seed: int | None = None) -> dict[str, str]:
        self.store.open(episode, seed)
        return self.base_urls(episode)

    def fork_episode(self, src: str, dst: str) -> dict[str, str]:
        self.store.fork(src, dst)
        return self.base_urls(dst)

    def close_episode(self, episode: str) -> None:
        self.store.close(episode)

    def database(self, episode: str, site: str) -> sqlite3.Connection:
        """A read-only connection to an episode's database (the caller closes it); `site` is ours ("shop") or
        WebArena's name for it ("shopping")."""
        return connect(self.store.path(episode, WEBARENA_SITES.get(site, site)), readonly=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> WebSites:  # noqa: PYI034 - a final class: Self buys nothing
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from rlfactory.envs.web.sites.app import build_app

    parser = argparse.ArgumentParser(
        description="Serve the web environment's sites (shop, forum, wiki) for all episodes.")
    parser.add_argument("--root", required=True, help="folder of the episodes' databases")
    parser.add_argument("--seed", type=int, default=0, help="content seed of newly opened episodes")
    parser.add_argument("--cache", default=None, help="folder of the seed databases")
    parser.add_argument("--fd", type=int, default=None, help="an inherited listening socket (else --port)")
    parser.add_argument("--port", type=int, default=8480)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    app = build_app(EpisodeStore(Path(args.root), args.seed, Path(args.cache) if args.cache else None))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                                           lifespan="off", access_log=False))
    if args.fd is not None:
        server.run(sockets=[socket.socket(fileno=args.fd)])
    else:
        server.run()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
