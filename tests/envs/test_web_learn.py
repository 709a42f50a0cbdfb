"""The web learning pair's parts (recipes/web_learn_sft.yaml, recipes/web_learn.yaml, mcp_configs/web_learn.json):
a world that serves only some templates, held-out tasks on the same server from an id offset, the demonstrator on
both through the real MCP server, the task rows as `rlfactory envs tasks` writes them, the recipes, and (once
models/web-browser is made) the warm start and GRPO steps from it. Real parts: the site server, headless
Chromium, the env server subprocess, the model."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shipped_models import shipped_summary

from rlfactory.envs.web.env import WebEnv, WebWorld, split_tasks

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                reason="Debian's chromium is not installed (apt-get install chromium)")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "mcp_configs" / "web_learn.json"
TASKS = REPO / "envs" / "tools" / "data" / "tasks"
SHOP = {1, 2, 3, 4, 5, 6}
WARM = pytest.mark.skipif(not (REPO / "models" / "web-browser" / "config.json").exists(),
                          reason="the web warm start is not made yet: rlfactory sft recipes/web_learn_reader_sft.yaml")


def _server_args() -> list[str]:
    return json.loads(CONFIG.read_text())["mcpServers"]["web"]["args"]


def _arg(name: str) -> str:
    args = _server_args()
    return args[args.index(name) + 1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with WebWorld(cache=tmp_path_factory.mktemp("web-cache"), templates=SHOP) as w:
        yield w


def test_the_world_serves_only_its_templates_and_the_held_out_ids_open_held_out_tasks(world):
    assert {c["intent_template_id"] for s in world.splits.values() for c in s} == SHOP
    assert world.splits == split_tasks(0, world.cache, SHOP)
    env = WebEnv(world, heldout_from=10_000, max_chars=2000)
    try:
        held = env.reset(10_001)
        assert env.config == world.splits["heldout"][1] and env.config["split"] == "heldout"
        assert held.info["split"] == "heldout" and held.observation.startswith(f"Task: {env.config['intent']}\n")
        twin = env.fork()
        try:
            assert twin.task_split == "heldout" and twin.config == env.config
        finally:
            twin.close()
        trained = env.reset(3)  # the same env, a training id: the train split again
        assert env.config == world.splits["train"][3] and trained.info["split"] == "train"
    finally:
        env.close()


def test_templates_that_leave_a_split_empty_are_refused_before_anything_starts(tmp_path):
    world = WebWorld(cache=tmp_path, templates={8})  # held out as a whole: no training task
    with pytest.raises(ValueError, match=r"templates \[8\] leave a split without tasks .* known template ids: \[1, 2"):
        world.start()
    assert world.sites.proc is None and world.host is None


def test_task_rows_are_what_rlfactory_envs_tasks_writes_for_the_served_tasks():
    from rlfactory.envs.tasks import task_rows

    templates = {int(t) for t in _arg("--templates").split(",")}
    offset = int(_arg("--heldout-from"))
    splits = split_tasks(0, templates=templates)
    rows = {n: [json.loads(x) for x in (TASKS / f"web_learn_{n}.jsonl").read_text().splitlines()]
            for n in ("train", "val")}
    assert rows["train"] == task_rows("web", range(len(splits["train"])))
    assert rows["val"] == task_rows("web", range(offset, offset + len(splits["heldout"])))
    assert (len(rows["train"]), len(rows["val"])) == (149, 31)


def test_the_demonstrator_solves_a_training_and_a_held_out_row_through_the_learning_server():
    """The rows' ids through mcp_configs/web_learn.json: the demonstrator plays the task the server says it opened,
    a training task and a held-out one, within the warm start's 4 turns at the 2,000-character budget."""
    from rlfactory.recipe.tools import ToolsConfig
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.env_demos import generate_env_demos

    rows = [json.loads((TASKS / f"web_learn_{n}.jsonl").read_text().splitlines()[0]) for n in ("train", "val")]
    held_out = split_tasks(0, templates=SHOP)["heldout"][0]

    async def go():
        async with ToolManager.from_recipe(ToolsConfig(mcp_configs=[str(CONFIG)], servers=["web"])) as manager:
            return await generate_env_demos(rows, manager, policy="web", styles={"plan": 1.0}, max_turns=4,
                                            concurrency=1)

    demos, stats = asyncio.run(go())
    assert stats == {"plan": 2}, stats
    assert demos[1]["messages"][1]["content"].startswith(f"Task: {held_out['intent']}\n")
    for d in demos:
        assert d["actions"] == 3 and "score=1 done=true" in d["messages"][-1]["content"]
        assert all(len(m["content"]) < 2300 for m in d["messages"] if m["role"] == "tool")  # the budget holds
    _bare_words_spell_the_product_the_same_everywhere(demos)


def _bare_words_spell_the_product_the_same_everywhere(demos):
    """`sft.tokenizer.bare_words` (name_space leading): each word of the product's name is one added token; its
    first word is the same id in the results link (after a quote) and in the policy's `type` action (after a
    bracket), and its later words the same ids there and in the intent (after a space), so typing the name is
    copying ids; text round-trips."""
    from rlfactory.warmup.tokenizer_builder import build_tokenizer, check_tokenizer

    tok = build_tokenizer(demos, vocab_size=600, model_max_length=3072, environment_words=True, bare_words=True)
    assert check_tokenizer(tok) == []
    d = demos[0]
    typed = json.loads(d["messages"][2]["content"].split("<tool_call>")[1].split("</tool_call>")[0])
    name = typed["arguments"]["action"].split("] [")[1]  # type [10] [<name>] [1]
    first, *rest = name.split()
    added = tok.get_added_vocab()
    later = [added[" " + w] for w in rest]
    bracketed = [added[first]] + later
    intent, action, results = d["messages"][1]["content"], d["messages"][2]["content"], d["messages"][3]["content"]
    for text, ids in ((intent, [added[" " + first]] + later), (action, bracketed), (results, bracketed)):
        full = tok.encode(text, add_special_tokens=False)
        assert any(full[i:i + len(ids)] == ids for i in range(len(full))), (name, text[:200])
        assert tok.decode(full) == text
    assert not any(k.isalpha() and k.islower() for k in added)  # a bare "as" would split "Task"
    # name_space trailing: every word carries the space after it ("Cobalt ", bare before `?`, `]` or `'`), so the
    # whole name, its first word too, is the same ids in the intent, the action and the results link
    tok = build_tokenizer(demos, vocab_size=600, model_max_length=3072, environment_words=True, bare_words=True,
                          name_space="trailing")
    added = tok.get_added_vocab()
    ids = [added[w + " "] for w in name.split()[:-1]] + [added[name.split()[-1]]]
    assert not any(k.startswith(" ") and k[1:2].isupper() for k in added)  # " C" would take the space of " Cobalt"
    for text in (intent, action, results):
        full = tok.encode(text, add_special_tokens=False)
        assert any(full[i:i + len(ids)] == ids for i in range(len(full))), (name, text[:200])
        assert tok.decode(full) == text


def test_demo_sets_of_other_content_seeds_play_the_task_their_server_opened():
    """The warm start's extra demo sets (`server_args: {web: [--seed, K]}`: the learning server at content seed K):
    the server's reset reports its content seed, and the demonstrator plays that seed's task from a row that names
    none."""
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.mcp_configs import load_recipe_servers
    from rlfactory.warmup.env_demos import generate_env_demos
    from rlfactory.warmup.run import load_sft_recipe

    recipe, sft = load_sft_recipe(REPO / "recipes" / "web_learn_sft.yaml")
    seeded = [d for d in sft.demos if d.server_args]
    assert [d.server_args for d in seeded] == [{"web": ["--seed", str(k)]} for k in range(1, 8)]
    assert all(d.tasks_file and d.tasks_file.endswith("web_learn_train.jsonl") for d in seeded)
    tools = seeded[2].tools_for(recipe.tools)
    assert load_recipe_servers(tools)["web"].args == (*_server_args(), "--seed", "3")  # the seed added last
    row = json.loads((TASKS / "web_learn_train.jsonl").read_text().splitlines()[5])

    async def go():
        async with ToolManager.from_recipe(tools) as manager:
            return await generate_env_demos([row], manager, policy="web", styles={"plan": 1.0}, max_turns=4)

    demos, stats = asyncio.run(go())
    assert stats == {"plan": 1}, stats
    task = split_tasks(3, templates=SHOP)["train"][5]
    assert task != split_tasks(0, templates=SHOP)["train"][5]
    assert demos[0]["messages"][1]["content"].startswith(f"Task: {task['intent']}\n")
    assert "score=1 done=true" in demos[0]["messages"][-1]["content"]


def test_web_learning_recipes_validate():
    from rlfactory.preflight import check_recipe
    from rlfactory.warmup.run import load_sft_recipe

    check = check_recipe(REPO / "recipes" / "web_learn.yaml")
    assert check.ok, check.errors
    assert all("model.path" in w for w in check.warnings)  # only the warm start, until it is made
    assert check.recipe.rollout.horizon.type == "scaling_inter"
    assert check.recipe.data.max_val_tasks == 31
    recipe, sft = load_sft_recipe(REPO / "recipes" / "web_learn_sft.yaml")
    reader, reader_sft = load_sft_recipe(REPO / "recipes" / "web_learn_reader_sft.yaml")
    # the chain: stage 1 from scratch -> models/web-copier -> stage 2 -> models/web-browser -> GRPO
    assert Path(sft.output_dir).resolve() == Path(reader.model.path).resolve() == REPO / "models" / "web-copier"
    assert Path(reader_sft.output_dir).resolve() == Path(check.recipe.model.path).resolve()
    assert sft.init == "scratch" and reader_sft.init == "model"
    assert all(d.policy == "web" for d in sft.demos + reader_sft.demos)
    seeds = [{(d.server_args or {}).get("web", ["--seed", "0"])[-1] for d in s.demos} for s in (sft, reader_sft)]
    assert seeds == [{str(k) for k in range(8)}, {str(k) for k in range(8, 16)}]  # stage 2 reads other pages
    assert recipe.tools.mcp_configs == reader.tools.mcp_configs == check.recipe.tools.mcp_configs
    for s in (sft, reader_sft):
        assert s.check.split == "val" and s.check.temperature == 0.0  # the warm start's held-out greedy success
    assert sft.tokenizer.environment_words and sft.tokenizer.bare_words
    from rlfactory.errors import ConfigError

    with pytest.raises(ConfigError, match="tokenizer.bare_words .* set tokenizer.environment_words: true"):
        load_sft_recipe(REPO / "recipes" / "web_learn_sft.yaml", ["sft.tokenizer.environment_words=false"])
    with pytest.raises(ConfigError, match="tokenizer.name_space .* set tokenizer.bare_words: true"):
        load_sft_recipe(REPO / "recipes" / "web_learn_sft.yaml", ["sft.tokenizer.bare_words=false",
                                                                   "sft.tokenizer.name_space=trailing"])


def test_the_shipped_copier_is_stage_1_of_the_web_warm_up_and_its_names_are_the_same_ids_everywhere():
    """models/web-copier, as `rlfactory sft recipes/web_learn_sft.yaml` made it (bf16, a few MB, checked usable when
    it was made): a product's name is the same token ids in the intent, in the typed action and in the results link,
    which is what lets it copy the name."""
    from transformers import AutoTokenizer

    shipped_summary("web-copier", "rlfactory sft recipes/web_learn_sft.yaml", steps=4300)
    tok = AutoTokenizer.from_pretrained(str(REPO / "models" / "web-copier"))
    name = "Cobalt Alpine Recycled Blanket"
    ids = tok.encode(name, add_special_tokens=False)
    assert len(ids) == 4
    for text in (f"What is the price of the {name}?", f"type [10] [{name}] [1]", f"link '{name}'"):
        got = tok.encode(text, add_special_tokens=False)
        assert any(got[i:i + 4] == ids for i in range(len(got))), (text, got, ids)


@pytest.mark.slow
@WARM
def test_the_shipped_warm_start_is_small_and_solves_some_held_out_tasks():
    """models/web-browser, made by stage 2's command from the shipped copier: bf16, a few MB; greedy on the 31
    held-out tasks through the real server it solves some and not all (GRPO has something to raise)."""
    from rlfactory.warmup.run import check_model, load_sft_recipe

    shipped_summary("web-browser", "rlfactory sft recipes/web_learn_reader_sft.yaml", checked=False)
    recipe, sft = load_sft_recipe(REPO / "recipes" / "web_learn_reader_sft.yaml")
    check = asyncio.run(check_model(recipe, sft))
    assert check["errors"] == 0 and check["well_formed"] > 0.8
    assert 0.0 < check["success"] < 1.0, check


@pytest.mark.slow
@WARM
def test_grpo_runs_steps_of_the_web_recipe_from_the_shipped_warm_start(tmp_path):
    """`rlfactory train recipes/web_learn.yaml` as a user runs it, cut to 2 small steps: rollouts in the real browser,
    rewards from the shop's evaluator, updates, a checkpoint."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "train", str(REPO / "recipes" / "web_learn.yaml"),
                           "--output-dir", str(out), "--set", "trainer.total_steps=2",
                           "--set", "trainer.prompts_per_step=1", "--set", "rollout.samples_per_prompt=2",
                           "--set", "trainer.save_every_steps=2"], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2 and all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)
    assert (out / "checkpoints" / "step_000002").is_dir()
