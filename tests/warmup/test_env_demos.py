"""Warm starts in environments: the scripted demonstrators play real BabyAI and TextCraft MCP servers (AgentGym's
task ids, `mcp_configs/agentgym_tasks.json`), their transcripts encode token for token as the AgentLoop builds the
same episode, the `sft:` section checks its environment demo sets, and the shipped warm starts load and pass
its usable-start check. Real parts: the environment servers as subprocesses, the ToolManager, the AgentLoop, the
Qwen3 models and tokenizers shipped in models/babyai-walker and models/textcraft-crafter."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from child_processes import running_children
from replay_engine import ReplayEngine
from shipped_models import shipped_summary

from rlfactory.recipe.tools import ToolsConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "mcp_configs" / "agentgym_tasks.json")
TASKS = REPO / "envs" / "tools" / "data" / "tasks"
MACRO_PREFIXES = ("go to ", "pickup ", "toggle and go through ", "go through ")
WALK_WORDS = {"turn left", "turn right", "move forward", "toggle", "drop"}


def rows(name: str, n: int) -> list[dict]:
    with open(TASKS / name) as f:
        return [json.loads(line) for line in f][:n]


def actions(demo: dict) -> list[str]:
    return [json.loads(m["content"].removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))["arguments"]["action"]
            for m in demo["messages"] if m["role"] == "assistant"]


def play(server: str, tasks: list[dict], styles: dict[str, float], max_turns: int = 9,
         on_episode=None):
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.env_demos import generate_env_demos

    async def go():
        async with ToolManager.from_recipe(ToolsConfig(mcp_configs=[CONFIG], servers=[server])) as manager:
            demos, stats = await generate_env_demos(tasks, manager, policy=server, styles=styles,
                                                    max_turns=max_turns, seed=3, system_prompt="Play.",
                                                    on_episode=on_episode)
            (conn,) = manager.servers[server].connections
            res = await conn.session.read_resource("rlfactory://episodes")
            return demos, stats, json.loads(res.contents[0].text)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def babyai_demos():
    # tasks 0-9: AgentGym's levels 1-10 at seed 0 (go-to levels, several solvable by one macro)
    demos, stats, open_after = play("babyai", rows("babyai_agentgym_train.jsonl", 10), {"walk": 0.5, "macro": 0.5})
    return demos, stats, open_after


def test_mission_clauses_order_the_parts_of_a_goal():
    from rlfactory.envs.babyai_agentgym import mission_clauses

    assert mission_clauses("go to the red ball") == [("go to", "red ball")]
    assert mission_clauses("open the purple door after you open the red door") == [
        ("open", "red door"), ("open", "purple door")]
    assert mission_clauses("open the red door, then open the blue door") == [("open", "red door"),
                                                                             ("open", "blue door")]
    assert mission_clauses("pick up a key and go to the yellow box") == [("pick up", "key"), ("go to", "yellow box")]
    assert mission_clauses("open a door on your left")[0][0] == "other"  # no macro knows left from right
    assert mission_clauses("put the yellow ball next to the yellow key")[0][0] == "other"


def test_babyai_demos_are_real_successful_episodes_in_both_styles(babyai_demos):
    demos, stats, open_after = babyai_demos
    assert demos and sum(v for k, v in stats.items() if k.startswith("dropped_")) + len(demos) == 10
    assert {d["style"] for d in demos} == {"walk", "macro"}
    for d in demos:
        roles = [m["role"] for m in d["messages"]]
        assert roles[:3] == ["system", "user", "user"] and roles[3:] == ["assistant", "tool"] * d["actions"]
        assert d["messages"][2]["content"].startswith("Level: BabyAI-")  # the reset observation, as the loop shows it
        last = d["messages"][-1]["content"]
        assert "done=true" in last and "The task is completed." in last and "score=0 " not in last
        words = actions(d)
        if d["style"] == "walk":
            assert all(w in WALK_WORDS or w.startswith("pickup ") for w in words), words
        else:
            assert any(w.startswith(MACRO_PREFIXES) for w in words), words
        assert all("episode_id" not in m["content"] for m in d["messages"])  # filled in, never shown
        assert {t["function"]["name"] for t in d["tools"]} == {"reset", "step", "observe", "close"}
    assert open_after["open"] == 0  # every demonstration closed its episode


def test_search_demos_open_the_door_that_hides_the_target():
    """Style `search` plays the shortest solution found on forks of a private copy, through the real server: on task
    10016 (a purple ball behind a closed door, out of sight) it turns, goes through the door and picks the ball up
    (3 actions), where the macro demonstrator does not finish within 6; task 10000 takes its 2. A bound of 2 actions
    drops 10016 as stuck."""
    tasks = [r for r in rows("babyai_agentgym_val.jsonl", 32) if r["env"]["task_id"] in (10000, 10016)]
    demos, stats, open_after = play("babyai", tasks, {"search": 1.0}, max_turns=7)
    assert [d["actions"] for d in demos] == [2, 3] and stats == {"search": 2}
    assert actions(demos[1])[1:] == ["toggle and go through green closed door 1", "pickup purple ball 1"]
    assert "done=true" in demos[1]["messages"][-1]["content"] and open_after["open"] == 0
    _, macro, _ = play("babyai", tasks, {"macro": 1.0}, max_turns=7)
    assert macro.get("macro") == 1 and macro.get("dropped_too_long", 0) + macro.get("dropped_solver_stuck", 0) == 1
    ended: list[tuple[int, int]] = []
    short, stats, _ = play("babyai", tasks, {"search": 1.0}, max_turns=3,
                           on_episode=lambda played, kept: ended.append((played, kept)))
    assert [d["actions"] for d in short] == [2] and stats.get("dropped_solver_stuck") == 1
    assert [played for played, _ in ended] == [1, 2] and ended[-1][1] == 1  # told as each episode ends


def test_the_search_warm_start_recipe_runs_end_to_end_through_the_cli(tmp_path):
    """`rlfactory sft recipes/babyai_learn_search_sft.yaml`, cut to 4 tasks and 3 steps: search demonstrations
    through the real server (a line per tenth of the episodes in a log), the namer's weights trained, a model
    folder written and checked."""
    import subprocess
    import sys

    out = tmp_path / "searcher"
    sets = ["sft.demos.0.n=4", "sft.phases.0.steps=3", "sft.check.tasks=2", f"sft.work_dir={tmp_path / 'work'}"]
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "sft", "recipes/babyai_learn_search_sft.yaml",
                           "--output-dir", str(out), *[x for s in sets for x in ("--set", s)]],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 2), proc.stdout[-3000:] + proc.stderr[-3000:]  # 2: 3 steps make no usable start
    log = proc.stdout
    assert "demos search: 4/4 episodes" in log and "demos search: kept " in log, log[-3000:]
    assert (out / "model.safetensors").exists()
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 3 and summary["made_by"].endswith("babyai_learn_search_sft.yaml")
    kept = [json.loads(x) for x in (tmp_path / "work" / "demos" / "search.jsonl").read_text().splitlines()]
    assert kept and all(d["style"] == "search" for d in kept)


@pytest.mark.parametrize("style", ["plan", "ask"])
def test_textcraft_demos_follow_the_plan_through_the_real_server(style):
    demos, stats, _ = play("textcraft", rows("textcraft_agentgym_train.jsonl", 6), {style: 1.0}, max_turns=12)
    assert len(demos) + sum(v for k, v in stats.items() if k.startswith("dropped_")) == 6 and demos
    for d in demos:
        assert actions(d)[-1].startswith("craft ")
        assert "Task complete" in d["messages"][-1]["content"]
        if style == "ask":  # the goal's recipe comes from the server's answer to a get of the goal
            assert actions(d)[0].startswith("get 1 ") and "Its crafting command: craft " in d["messages"][4]["content"]


def _textcraft_servers() -> int:
    """TextCraft MCP servers running under this process."""
    return len(running_children("rlfactory.envs.tools.textcraft"))


def test_a_demo_set_plays_through_its_own_servers_with_the_same_tools(tmp_path):
    """`sft.demos.N.mcp_configs`: the set's episodes run on TextCraft with shuffled names (the same server name, so
    the transcripts render the same tools); the other set runs on the recipe's servers, with the real names. A set's
    own servers stop once it is made: while the third set (`server_args`) is made, the second's are gone."""
    from rlfactory.warmup.run import load_sft_recipe, make_demo_sets

    tasks = "tasks_file: pkg://rlfactory.envs.tools/data/tasks/textcraft_agentgym_train.jsonl"
    recipe, sft = load_sft_recipe(REPO / "recipes" / "textcraft_learn_sft.yaml", [
        f"sft.demos=[{{name: real, policy: textcraft, n: 4, max_turns: 12, {tasks}}}, {{name: shuffled, "
        f"policy: textcraft, n: 4, max_turns: 12, {tasks}, mcp_configs: [../mcp_configs/textcraft_shuffled.json]}}, "
        f"{{name: args, policy: textcraft, n: 2, max_turns: 12, {tasks}, server_args: {{textcraft: [--max-episodes, "
        f"40]}}}}]",
        "sft.phases=[{data: real, steps: 1, lr: 1.0e-3}]"])
    assert sft.demos[1].mcp_configs == [str(REPO / "mcp_configs" / "textcraft_shuffled.json")]
    live: dict[str, int] = {}
    sets = asyncio.run(make_demo_sets(recipe, sft, tmp_path,
                                      lambda event, figures: live.update({figures["name"]: _textcraft_servers()})))
    assert live == {"real": 1, "shuffled": 2, "args": 2}, live  # the recipe's server, and the set's own
    assert len(sets["args"]) == 2 and _textcraft_servers() == 0
    real, shuffled = sets["real"], sets["shuffled"]
    assert len(real) == len(shuffled) == 4 and (tmp_path / "shuffled.jsonl").is_file()
    assert [d["tools"] for d in shuffled] == [d["tools"] for d in real]
    for a, b in zip(real, shuffled):
        assert a["id"] == b["id"] and a["messages"][2]["content"] != b["messages"][2]["content"]
        assert "Task complete" in b["messages"][-1]["content"]
    from rlfactory.errors import ConfigError

    for key in ("mcp_configs=[x.json]", "server_args={calculator: [-v]}"):
        with pytest.raises(ConfigError, match="only environment demonstrators"):
            load_sft_recipe(REPO / "recipes" / "quickstart_sft.yaml", [f"sft.demos.0.{key}"])


def test_demo_encoding_equals_what_the_agent_loop_builds_for_the_same_episode(babyai_demos):
    """Replay each demonstration's actions through the real AgentLoop on the real server: the trajectory (the loop
    resets the episode itself and shows its observation) must hold the SFT encoding token for token."""
    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.sft import encode_transcript
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    demos, _, _ = babyai_demos
    tokenizer = build_tokenizer(demos, vocab_size=1024, model_max_length=4096)

    async def go():
        tools = ToolsConfig(mcp_configs=[CONFIG], servers=["babyai"])
        async with ToolManager.from_recipe(tools) as manager:
            chat = ChatFormat(tokenizer, manager.openai_schemas(), system_prompt="Play.")
            cfg = RolloutConfig(samples_per_prompt=1, max_tool_calls_per_turn=1, max_response_tokens=4096,
                                max_context_tokens=4096, tool_response_max_tokens=1024, horizon={"type": "fixed",
                                                                                                 "turns": 9})
            for demo in demos:
                ids, mask = encode_transcript(chat, demo["messages"])
                turns = [chat.encode(m["content"]) + [chat.im_end_id] for m in demo["messages"]
                         if m["role"] == "assistant"]
                task = {"id": demo["id"], "prompt": demo["messages"][1]["content"], "env": demo["env"]}
                traj = await AgentLoop(ReplayEngine(turns), manager, chat, cfg).run_one(task)
                assert traj.finish_reason == "env_done", traj.error
                full, full_mask = traj.prompt_ids + traj.response_ids, [0] * len(traj.prompt_ids) + traj.loss_mask
                # The SFT encoding stops after the last action (the final observation has nothing to learn); the
                # loop keeps that observation, unmasked-out, after the same tokens.
                assert full[:len(ids)] == ids and full_mask[:len(mask)] == mask
                assert not any(full_mask[len(mask):]) and chat.decode(full[len(ids):]).count("done=true") == 1

    asyncio.run(go())


def test_sft_section_names_what_an_environment_demo_set_lacks():
    from rlfactory.errors import ConfigError
    from rlfactory.warmup.run import load_sft_recipe

    recipe = REPO / "recipes" / "babyai_learn_sft.yaml"
    with pytest.raises(ConfigError) as e:
        load_sft_recipe(recipe, ["sft.demos.0.tasks_file=null"])
    assert "sft.demos.0" in " ".join(e.value.problems) and "set tasks_file" in " ".join(e.value.problems)
    _, sft = load_sft_recipe(recipe, ["sft.demos.0.styles={run: 1.0}"])
    with pytest.raises(ValueError, match="babyai demonstrations know the styles walk, macro, search; got run"):
        play("babyai", rows("babyai_agentgym_train.jsonl", 1), dict(sft.demos[0].styles))


def test_environment_words_spell_a_name_the_same_wherever_it_appears(tmp_path):
    """`sft.tokenizer.environment_words`: every word of the environment's turns is one token with its leading space,
    so the goal line, the crafting list, the server's answer and the policy's action spell an item with the same ids;
    the system turn keeps its merges; text round-trips, also through a saved and reloaded tokenizer."""
    from transformers import AutoTokenizer

    from rlfactory.warmup.tokenizer_builder import build_tokenizer, check_tokenizer, render_transcripts

    demos, _, _ = play("textcraft", rows("textcraft_agentgym_train.jsonl", 24), {"ask": 1.0}, max_turns=12)
    plain = build_tokenizer(demos, vocab_size=700)
    tok = build_tokenizer(demos, vocab_size=700, environment_words=True)
    assert check_tokenizer(tok) == [] and len(tok) > len(plain)
    name = actions(demos[0])[0].removeprefix("get 1 ")  # the goal, got first in style ask
    ids = tok.encode(" " + name, add_special_tokens=False)
    assert len(ids) == len(name.split()) and all(i >= 700 for i in ids)  # one added token per word
    reset_obs, answer = demos[0]["messages"][2]["content"], demos[0]["messages"][4]["content"]
    for text in (reset_obs, answer, demos[0]["messages"][3]["content"]):  # goal line and list, answer, the action
        assert name in text
        full = tok.encode(text, add_special_tokens=False)
        assert any(full[i:i + len(ids)] == ids for i in range(len(full))), text
        assert tok.decode(full) == text
    system_turn = render_transcripts(tok, demos[:1])[0].split("<|im_start|>user", 1)[0]
    assert len(tok.encode(system_turn)) == len(plain.encode(system_turn))
    # Word tokens are text, not chat markup: the loop shows observations unchanged (no zero-width spaces in them),
    # while markup from outside is still broken up.
    from rlfactory.rollout.chat import ZWSP, ChatFormat

    chat = ChatFormat(tok, demos[0]["tools"])
    assert chat.neutralize(reset_obs) == reset_obs
    assert ZWSP in chat.neutralize("<|im_end|>") and ZWSP in chat.neutralize("<tool_call>")
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.encode(reset_obs, add_special_tokens=False) == tok.encode(reset_obs, add_special_tokens=False)


def test_a_phase_draws_from_every_demo_set_it_names():
    """`sft.phases.N.data` may list demo sets (and files): the phase trains on their union; an unknown name or an
    empty list is refused when the recipe loads."""
    from rlfactory.errors import ConfigError
    from rlfactory.warmup.run import load_sft_recipe, phase_examples

    recipe = REPO / "recipes" / "textcraft_learn_sft.yaml"
    two_sets = ("sft.demos=[{name: plans, policy: textcraft, n: 4, tasks_file: "
                "pkg://rlfactory.envs.tools/data/tasks/textcraft_agentgym_train.jsonl}, {name: renamed, "
                "policy: textcraft, n: 4, tasks_file: pkg://rlfactory.envs.tools/data/tasks/textcraft_agentgym_train.jsonl,"
                " mcp_configs: [../mcp_configs/textcraft_shuffled.json]}]")
    _, sft = load_sft_recipe(recipe, [two_sets, "sft.phases=[{data: [plans, renamed], steps: 2, lr: 1.0e-3}, "
                                                "{data: plans, steps: 1, lr: 1.0e-3}]"])
    assert [p.sources for p in sft.phases] == [["plans", "renamed"], ["plans"]]
    encoded = {"plans": [([1], [1]), ([2], [1])], "renamed": [([3], [1])]}
    assert [ex for _, ex in phase_examples(sft.phases, encoded)] == [
        [([1], [1]), ([2], [1]), ([3], [1])], [([1], [1]), ([2], [1])]]
    for bad, says in (("[plans, renamd]", "'renamd' is neither a demo-set name (plans, renamed)"),
                      ("[]", "an empty list")):
        with pytest.raises(ConfigError) as e:
            load_sft_recipe(recipe, [two_sets, f"sft.phases=[{{data: {bad}, steps: 2, lr: 1.0e-3}}]"])
        assert says in " ".join(e.value.problems), e.value.problems


@pytest.mark.parametrize("env", ["babyai", "textcraft"])
def test_sft_that_continues_a_missing_model_stops_before_playing_any_demonstration(tmp_path, env):
    """Stage 2 of each warm start continues stage 1's model: without it, the run names the folder and the fix
    before any server starts or any work folder is written."""
    from rlfactory.errors import ConfigError
    from rlfactory.warmup.run import load_sft_recipe, run_sft

    recipe, sft = load_sft_recipe(REPO / "recipes" / f"{env}_learn_sft.yaml", [
        f"model.path={tmp_path / 'stage1'}", f"sft.work_dir={tmp_path / 'work'}",
        f"sft.output_dir={tmp_path / 'out'}"])
    assert sft.init == "model"
    with pytest.raises(ConfigError, match=r"must be a model folder \(folder not found: .*stage1\): make that model"):
        asyncio.run(run_sft(recipe, sft))
    (tmp_path / "stage1").mkdir()
    with pytest.raises(ConfigError, match=r"stage1 has no config.json \(is it a Hugging Face model folder\?\)"):
        asyncio.run(run_sft(recipe, sft))
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("env,model", [("babyai", "babyai-walker"), ("textcraft", "textcraft-crafter")])
def test_shipped_warm_start_is_small_and_passes_its_check(env, model):
    """The warm starts the learning recipes train from: bf16, a few MB, and (sampled on training tasks, as GRPO will
    see them) they solve some tasks and not all, so GRPO's groups disagree."""
    from rlfactory.warmup.run import check_model, load_sft_recipe

    shipped_summary(model, f"rlfactory sft recipes/{env}_learn_sft.yaml", prefix=True, checked=False)
    recipe, sft = load_sft_recipe(REPO / "recipes" / f"{env}_learn_sft.yaml", ["sft.check.tasks=32"])
    check = asyncio.run(check_model(recipe, sft))
    assert check["errors"] == 0 and check["well_formed"] > 0.8
    assert 0.0 < check["success"] < 1.0, check


@pytest.mark.parametrize("model,recipe,steps", [("babyai-namer", "babyai_learn_namer_sft", 4000),
                                                ("textcraft-reader", "textcraft_learn_reader_sft", 2400)])
def test_the_shipped_strongest_starts_are_stage_1_of_the_warm_ups(model, recipe, steps):
    """models/babyai-namer and models/textcraft-reader, the starts bench/credit.py measures RL from: stage 1's output
    as its recipe makes it (bf16, a few MB, checked usable when it was made), which stage 2 continues."""
    shipped_summary(model, f"rlfactory sft recipes/{recipe}.yaml", steps=steps)
    stage2 = yaml.safe_load((REPO / "recipes" / recipe.replace("_namer", "").replace("_reader", "")
                             ).with_suffix(".yaml").read_text())
    assert stage2["model"]["path"] == f"../models/{model}"  # stage 2 continues the shipped stage 1


def test_textcraft_held_out_goals_are_never_trained_or_demonstrated():
    """The agentgym TextCraft split: 32 goals held out at random, the other 501 trained on, and the demonstration pool
    plays only those 501; the shipped files are what rlfactory.envs.tasks writes."""
    from rlfactory.envs.tasks import AGENTGYM_SPLITS, task_rows
    from rlfactory.envs.textcraft import TextCraftEnv

    env = TextCraftEnv(task_set="agentgym")
    goal = {i: env.goals[i % env.num_tasks] for s in AGENTGYM_SPLITS["textcraft"].values() for i in s}
    split = {name: [json.loads(x) for x in (TASKS / f"textcraft_agentgym_{name}.jsonl").read_text().splitlines()]
             for name in ("train", "val", "sft")}
    for name, file_rows in split.items():
        assert file_rows == task_rows("textcraft", AGENTGYM_SPLITS["textcraft"][name], "agentgym")
    goals = {name: {goal[r["env"]["task_id"]] for r in file_rows} for name, file_rows in split.items()}
    assert len(goals["val"]) == 32 and len(goals["train"]) == env.num_tasks - 32
    assert not goals["val"] & (goals["train"] | goals["sft"]) and goals["sft"] == goals["train"]
    assert len(split["sft"]) == 5 * len(split["train"])  # each training goal with 5 draws of distractors


def test_babyai_demonstration_pool_shares_no_layout_with_training_or_held_out_tasks():
    """The BabyAI warm-up plays 8,192 task ids of its own (AgentGym's levels with seeds 25-229): no (level, seed) of
    GRPO's training tasks or of the held-out tasks; the shipped file is what rlfactory.envs.tasks writes."""
    from rlfactory.envs.babyai_agentgym import level_and_seed
    from rlfactory.envs.tasks import AGENTGYM_SPLITS, SPLITS, task_rows

    split = {name: [json.loads(x) for x in (TASKS / f"babyai_agentgym_{name}.jsonl").read_text().splitlines()]
             for name in ("train", "val", "sft")}
    assert split["sft"] == task_rows("babyai", AGENTGYM_SPLITS["babyai"]["sft"], "agentgym")
    assert split["train"] == task_rows("babyai", SPLITS["babyai"][0], "agentgym")
    assert split["val"] == task_rows("babyai", SPLITS["babyai"][1], "agentgym")
    layouts = {name: {level_and_seed(r["env"]["task_id"]) for r in file_rows} for name, file_rows in split.items()}
    assert len(layouts["sft"]) == len(split["sft"]) == 8192
    assert not layouts["sft"] & (layouts["train"] | layouts["val"]) and not layouts["train"] & layouts["val"]


@pytest.mark.parametrize("env", ["babyai", "textcraft"])
def test_learning_recipes_validate(env):
    from rlfactory.preflight import check_recipe
    from rlfactory.warmup.run import load_sft_recipe

    check = check_recipe(REPO / "recipes" / f"{env}_learn.yaml")
    assert check.ok, check.errors
    assert all("model.path" in w for w in check.warnings)  # only the warm start, until it is made
    assert check.recipe.rollout.horizon.type == "scaling_inter"
    _, sft = load_sft_recipe(REPO / "recipes" / f"{env}_learn_sft.yaml")
    assert Path(sft.output_dir).resolve() == Path(check.recipe.model.path).resolve()
    assert all(d.policy == env for d in sft.demos)


def test_a_phase_with_max_turns_trains_on_each_transcript_cut_after_its_first_turns(babyai_demos):
    """`sft.phases[].max_turns`: each example is the encoding of its transcript's messages up to and including its
    N-th assistant turn, token for token (mask included); a transcript with fewer turns stays whole; refused for a
    vision-language warm-up."""
    from rlfactory.errors import ConfigError
    from rlfactory.recipe.sft import SFTPhase
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.warmup.run import load_sft_recipe, phase_examples
    from rlfactory.warmup.sft import encode_transcript
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    demos, _, _ = babyai_demos
    tokenizer = build_tokenizer(demos, vocab_size=1024, model_max_length=4096)
    chat = ChatFormat(tokenizer, demos[0]["tools"], system_prompt="Play.")
    encoded = {"d": [encode_transcript(chat, d["messages"]) for d in demos]}
    phases = [SFTPhase(data="d", steps=1, lr=1e-3), SFTPhase(data="d", steps=1, lr=1e-3, max_turns=2)]
    (_, whole), (_, cut) = phase_examples(phases, encoded)
    assert whole == encoded["d"]
    for demo, full, short in zip(demos, whole, cut):
        assistant = [i for i, m in enumerate(demo["messages"]) if m["role"] == "assistant"]
        if len(assistant) <= 2:
            assert short == full
            continue
        ids, mask = encode_transcript(chat, demo["messages"][:assistant[1] + 1])
        assert short == (ids, mask) and sum(short[1]) < sum(full[1]) and full[0][:len(ids)] == ids
    assert any(len(s[0]) < len(f[0]) for f, s in zip(whole, cut))
    with pytest.raises(ConfigError, match=r"sft.phases.0.max_turns: a vision-language warm-up"):
        load_sft_recipe(REPO / "recipes" / "quickstart_vision_sft.yaml", ["sft.phases.0.max_turns=1"])


def test_a_phase_with_loss_turns_last_keeps_the_loss_on_each_transcripts_last_turn_alone(babyai_demos):
    """`sft.phases[].loss_turns: last`: the ids stay whole and the mask keeps only the last assistant turn's tokens
    (the last of the whole mask's runs, one run per assistant message, its end token included); with `max_turns: 2`
    it is the second turn's, in the cut transcript."""
    from rlfactory.recipe.sft import SFTPhase
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.warmup.run import phase_examples
    from rlfactory.warmup.sft import encode_transcript
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    def runs(mask: list[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for i, m in enumerate(mask):
            if m:
                if i and mask[i - 1]:
                    out[-1].append(i)
                else:
                    out.append([i])
        return out

    demos, _, _ = babyai_demos
    tokenizer = build_tokenizer(demos, vocab_size=1024, model_max_length=4096)
    chat = ChatFormat(tokenizer, demos[0]["tools"], system_prompt="Play.")
    encoded = {"d": [encode_transcript(chat, d["messages"]) for d in demos]}
    phases = [SFTPhase(data="d", steps=1, lr=1e-3, loss_turns="last"),
              SFTPhase(data="d", steps=1, lr=1e-3, max_turns=2, loss_turns="last")]
    (_, last), (_, second) = phase_examples(phases, encoded)
    for demo, (ids, mask), one, two in zip(demos, encoded["d"], last, second):
        assistant = [i for i, m in enumerate(demo["messages"]) if m["role"] == "assistant"]
        assert len(runs(mask)) == len(assistant)
        assert one[0] == ids and runs(one[1]) == runs(mask)[-1:]
        assert tokenizer.decode([ids[i] for i in runs(one[1])[0]]).endswith("<|im_end|>")
        if len(assistant) >= 2:
            cut_ids, cut_mask = encode_transcript(chat, demo["messages"][:assistant[1] + 1])
            assert two[0] == cut_ids and runs(two[1]) == runs(cut_mask)[1:2] == runs(mask)[1:2]
    assert any(sum(o[1]) < sum(f[1]) for f, o in zip(encoded["d"], last))
