"""The command line of a chaos campaign run on its own (`python bench/chaos_NAME.py --json PATH [--seed N]
[--quick]`): the arguments, a scratch folder removed afterwards, the figures printed and written. `bench/chaos.py`
runs the same `campaign(folder, seed=, quick=)` functions inside its own campaign list and does not use this."""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

Campaign = Callable[..., dict[str, Any]]  # campaign(scratch_folder, seed=int, quick=bool) -> figures


def run_campaign(doc: str, campaign: Campaign, *, name: str, quick_help: str) -> dict[str, Any]:
    """Parse the command line, run `campaign` in a fresh scratch folder, print the figures and write them to --json."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the figures to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help=quick_help)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix=f"rlf-chaos-{name}-"))
    try:
        result = campaign(tmp, seed=args.seed, quick=args.quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return result
