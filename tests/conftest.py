"""Fixtures shared by every test area: free ports, a real redis-server, repo paths.

Servers start on 127.0.0.1 with ports the fixture picks, and are stopped by the fixture that started them.
"""
from __future__ import annotations

import multiprocessing.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings as _hypothesis_settings
from local_services import RedisProcess, pick_free_port

# CI runs the fuzz tests with a fixed seed so a run is reproducible; locally hypothesis explores new inputs each run.
_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")

REPO = Path(__file__).resolve().parent.parent

# Fixtures of one concern each, in modules beside this file (tests/ is on sys.path while pytest collects).
pytest_plugins = ["fixtures_models", "fixtures_rewards", "fixtures_serve", "fixtures_trainer"]

# One torch thread per process: measured faster on this 2-core machine, and tests run beside tool subprocesses.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# `make test` runs two pytest-xdist workers. Each gets a temp folder of its own (TMPDIR, inherited by the servers
# it starts), so a test that looks at what is left in the temp folder sees only its own worker's files.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    os.environ["TMPDIR"] = tempfile.tempdir = tempfile.mkdtemp(prefix=f"rlf-tests-{_WORKER}-")
    # Removed when the worker exits, after multiprocessing removes the folder it made in there (its finalizer runs at
    # exit priority -100, this one after it).
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(tempfile.tempdir, True), exitpriority=-101)

# Tests that run verl on Ray share one worker, one at a time: a local Ray is one per machine (`ray.init()` joins a
# cluster another test started, and `ray stop --force` stops every Ray process there is).
_ONE_WORKER = {"verl": "tests/verl/"}


def _unit(nodeid: str) -> str:
    """The scheduling unit of a test: its group in _ONE_WORKER, else the test itself."""
    return next((group for group, prefix in _ONE_WORKER.items() if nodeid.startswith(prefix)), nodeid)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (dev extra): unknown to pytest without it
def pytest_xdist_make_scheduler(config, log):
    # (xdist's own `--dist loadgroup` cannot be used: it renames test ids through an attribute pytest 9.2 ignores)
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return OneWorkerGroups(config, log)


def pytest_collection_modifyitems(config, items):
    if _WORKER:  # the longest unit (verl's, ~10 minutes) first, so the other worker runs everything else beside it
        items.sort(key=lambda item: _unit(item.nodeid) == item.nodeid)


@pytest.fixture
def redis_server(tmp_path):
    """A fresh real redis-server for one test (stop()/start() it to simulate an outage)."""
    r = RedisProcess(tmp_path)
    r.start()
    yield r
    r.stop()


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable
