"""Fixtures shared by every test area: free ports, a real redis-server, repo paths.

Servers start on 127.0.0.1 with ports the fixture picks, and are stopped by the fixture that started them.
"""
from __future__ import annotations

import os
import sys
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
