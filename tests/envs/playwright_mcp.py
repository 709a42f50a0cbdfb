"""Where the tests find the official Playwright MCP server (`@playwright/mcp`, installed by `make install` into
`<venv>/playwright-mcp`, or the folder RLFACTORY_PLAYWRIGHT_MCP_DIR names), why it cannot run here, how to run a
shipped `mcpServers` entry of it offline there, and how to read an element's ref from its snapshots."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory.tools.mcp_configs import ServerConfig

VERSION = "0.0.86"
INSTALL = Path(os.environ.get("RLFACTORY_PLAYWRIGHT_MCP_DIR", Path(sys.prefix) / "playwright-mcp"))


def missing() -> str | None:
    """Why the server cannot run here, or None."""
    if shutil.which("npx") is None or shutil.which("node") is None:
        return "npx is not installed (apt-get install nodejs npm)"
    node = subprocess.run(["node", "--version"], check=False, capture_output=True, text=True,
                          timeout=30).stdout.strip()
    if not re.fullmatch(r"v(\d+)\..*", node) or int(node[1:].split(".")[0]) < 20:
        return f"@playwright/mcp needs Node.js 20 or later; this node is {node or 'unknown'}"
    if not os.path.exists("/usr/bin/chromium"):
        return "Debian's chromium is not installed (apt-get install chromium)"
    pkg = INSTALL / "node_modules" / "@playwright" / "mcp" / "package.json"
    if not pkg.is_file() or json.loads(pkg.read_text()).get("version") != VERSION:
        return (f"@playwright/mcp@{VERSION} is not installed in {INSTALL} (make install does it: npm install --prefix "
                f"{INSTALL} @playwright/mcp@{VERSION})")
    return None


NEEDED = pytest.mark.skipif(missing() is not None, reason=str(missing()))
"""A test module's `pytestmark`: skip, saying why, where the server cannot run."""


def offline(cfg: ServerConfig, *args: str) -> ServerConfig:
    """A shipped entry of the server run where it is installed, with npm offline (never a download), `args` added."""
    return dataclasses.replace(cfg, cwd=str(INSTALL), env={**cfg.env, "npm_config_offline": "true"},
                               args=(*cfg.args, *args))


def ref_of(snapshot: str, role: str, name: str) -> str:
    """The `[ref=...]` of the element with `role` and accessible `name` in a snapshot's text."""
    m = re.search(re.escape(f'{role} "{name}"') + r".*?\[ref=(\w+)\]", snapshot)
    assert m, f"no {role} {name!r} in:\n{snapshot}"
    return m.group(1)
