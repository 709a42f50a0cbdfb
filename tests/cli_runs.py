"""The `rlfactory` CLI run as a user runs it, in a subprocess from the checkout (one torch thread), and what the
tests that train through it share: `--set` pairs, and a reward that differs between samples."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A random or weak model often gets the same environment reward on every sample, so every GRPO group ties and the
# update has nothing to do. This reward differs between samples (a hash of the sampled ids), which is all the update
# needs to run forward/backward.
SPREAD_REWARD = '''
def id_spread(trajectory):
    return (sum(trajectory.response_ids) % 101) / 100
'''


def rlf(*args: str, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m rlfactory.cli ARGS` with one torch thread; its output captured, never raising on failure."""
    return subprocess.run([sys.executable, "-m", "rlfactory.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=cwd, check=False)


def sets(pairs: list[str]) -> list[str]:
    """`--set` arguments for recipe overrides `a.b=c`."""
    return [a for p in pairs for a in ("--set", p)]
