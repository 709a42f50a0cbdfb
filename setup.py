"""Which folders the wheel holds, and where they sit in it (everything else about the package is in pyproject.toml).

Three of the checkout's top-level folders install under the one `rlfactory` namespace, never as top-level packages
of their own (`envs` and `rewards` would collide with other distributions of those names):
- `rewards/`    -> `rlfactory.rewards`     (the reward functions users read and copy);
- `envs/tools/` -> `rlfactory.envs.tools`  (the MCP servers: `python -m rlfactory.envs.tools.calculator`);
- the starter project, `recipes/`, `mcp_configs/`, `data/`, `models/` and `examples/` -> `rlfactory/starter/`,
  laid out as in the checkout so that the recipes' relative paths hold (`rlfactory init DIR` copies it,
  `rlfactory train quickstart` finds a recipe in it by name).
An editable install maps the same names onto the checkout's folders.
"""
from setuptools import find_packages, setup

STARTER = {f"rlfactory.starter.{folder}": folder for folder in ("recipes", "mcp_configs", "data", "models", "examples")}
STARTER_FILES = ["**/*.yaml", "**/*.json", "**/*.jsonl", "**/*.parquet", "**/*.safetensors", "**/*.jinja", "**/*.txt"]
# Folders of data files only whose names could be packages: listed as packages of their own (setuptools warns about
# each one it finds in package_data otherwise), each with its own files.
DATA = {
    "rlfactory.models.templates": ["*.jinja"],
    "rlfactory.envs.tools.data": ["*.json", "*.jsonl"],
    "rlfactory.envs.tools.data.tasks": ["*.jsonl"],
    "rlfactory.starter.data.quickstart": STARTER_FILES,
}

setup(
    packages=find_packages(include=["rlfactory", "rlfactory.*"]) + ["rlfactory.rewards", "rlfactory.envs.tools"]
    + list(STARTER) + list(DATA),
    package_dir={"rlfactory.rewards": "rewards", "rlfactory.envs.tools": "envs/tools", **STARTER},
    package_data={**{name: STARTER_FILES for name in STARTER}, **DATA},
)
