"""The real calculator MCP server (same tool, same schema, so a model trained with it sees the same prompt), except
that its process dies (os._exit, no reply) on every Nth call: a tool server crashing in the middle of a training
step. `--die-every N` (default 5); `--marker FILE` gets a line appended each time the process dies."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "envs" / "tools"))

import calculator as calc  # noqa: E402

_real_evaluate = calc.evaluate
_calls = 0
_die_every = 5
_marker: str | None = None


def _dying_evaluate(expression: str) -> str:
    global _calls
    _calls += 1
    if _calls % _die_every == 0:
        if _marker:
            with open(_marker, "a") as f:
                f.write(f"died at call {_calls} of pid {os.getpid()}\n")
        os._exit(1)
    return _real_evaluate(expression)


calc.evaluate = _dying_evaluate  # the tool looks `evaluate` up in its module at call time

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--die-every", type=int, default=5)
    p.add_argument("--marker", default=None)
    args = p.parse_args()
    _die_every, _marker = args.die_every, args.marker
    calc.server.run()
