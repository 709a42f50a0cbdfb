"""rlfactory's MCP servers, one runnable file each (`python -m rlfactory.envs.tools.NAME`, or from a checkout
`python envs/tools/NAME.py`), and the data they serve (`data/`: corpora, the TextCraft recipe set, environment task
rows).

Installed as `rlfactory.envs.tools` (see setup.py). Nothing else lives here, so that starting a server imports only
what that server needs.
"""
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The servers' shipped data (read by rlfactory/envs/ too)."""
