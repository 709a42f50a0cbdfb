"""The quickstart's path to a warm model: tokenizer builder, demonstrations through the real calculator server,
SFT encoding (identical to what the AgentLoop builds), a tiny SFT run, the `sft`/`demos` commands and the shipped
checkpoint. Real parts: the calculator MCP server as a subprocess, a real (tiny) Qwen3, the real AgentLoop."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from replay_engine import ReplayEngine

from rlfactory.recipe.tools import ToolsConfig

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = ToolsConfig(mcp_configs=[str(REPO / "mcp_configs" / "default.json")], servers=["calculator"])
SYSTEM = "Use the calculator tool for arithmetic. Give the final answer as <answer>NUMBER</answer>."


def _demos(n: int, direct_fraction: float, seed: int = 0) -> tuple[list[dict], dict]:
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.demos import generate_demos, make_arithmetic_tasks

    async def go():
        async with ToolManager.from_recipe(CALCULATOR) as manager:
            return await generate_demos(make_arithmetic_tasks(n, seed=seed), manager,
                                        direct_fraction=direct_fraction, seed=seed, system_prompt=SYSTEM)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def demos() -> list[dict]:
    rows, stats = _demos(48, direct_fraction=0.25)
    assert stats["tool_errors"] == 0 and stats["wrong_results"] == 0
    return rows


@pytest.fixture(scope="module")
def tokenizer(demos):
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    return build_tokenizer(demos, vocab_size=1024)


def test_demos_come_from_the_real_calculator(demos):
    tool = [d for d in demos if d["style"] == "tool"]
    direct = [d for d in demos if d["style"] == "direct"]
    assert tool and direct and len(tool) + len(direct) == 48
    for d in tool:
        roles = [m["role"] for m in d["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        a, b = d["messages"][1]["content"].removeprefix("What is ").removesuffix("?").split(" * ")
        assert d["messages"][3]["content"] == str(int(a) * int(b)) == d["answer"]  # the server's exact product
        assert d["messages"][4]["content"] == f"<answer>{d['answer']}</answer>"
        call = json.loads(d["messages"][2]["content"].removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        assert call == {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}
        assert d["tools"][0]["function"]["name"] == "calculator"
    for d in direct:
        assert [m["role"] for m in d["messages"]] == ["system", "user", "assistant"]
        assert d["messages"][2]["content"] == f"<answer>{d['answer']}</answer>"


def test_tokenizer_splits_digits_and_keeps_special_tokens_whole(tokenizer):
    from rlfactory.models.tokenizer import chat_template_text
    from rlfactory.warmup.tokenizer_builder import CONTROL_TOKENS, FORMAT_TOKENS, check_tokenizer

    assert check_tokenizer(tokenizer) == []
    ids = tokenizer.encode("x = 4817*2931", add_special_tokens=False)
    digit_pieces = [tokenizer.decode([i]) for i in ids if any(c.isdigit() for c in tokenizer.decode([i]))]
    assert digit_pieces == list("48172931")
    for tok in CONTROL_TOKENS + FORMAT_TOKENS:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok
    assert tokenizer.chat_template == chat_template_text()
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # Byte-level: text it never saw still round-trips.
    assert tokenizer.decode(tokenizer.encode("Ünïcödé ✓ 42", add_special_tokens=False)) == "Ünïcödé ✓ 42"


def test_rendered_prompt_with_tool_schema_is_short(tokenizer, demos):
    from rlfactory.rollout.chat import ChatFormat

    chat = ChatFormat(tokenizer, demos[0]["tools"], system_prompt=SYSTEM)
    messages = chat.prompt_messages("What is 4817 * 2931?")
    text = tokenizer.apply_chat_template(messages, tools=demos[0]["tools"], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    ids = chat.prompt_ids(messages)
    # The schema text repeats in every transcript, so merges compress it: far fewer tokens than characters.
    assert len(text) > 800 and len(ids) < 80, (len(text), len(ids))


def test_sft_encoding_equals_what_the_agent_loop_builds(tokenizer, demos):
    """Replay each demonstration's assistant tokens through the real AgentLoop and the real calculator: the
    trajectory's prompt + response ids and loss mask must equal the SFT encoding, token for token."""
    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.sft import encode_transcript

    async def go():
        async with ToolManager.from_recipe(CALCULATOR) as manager:
            chat = ChatFormat(tokenizer, manager.openai_schemas(), system_prompt=SYSTEM)
            cfg = RolloutConfig(samples_per_prompt=1)
            for demo in demos[:12]:
                ids, mask = encode_transcript(chat, demo["messages"])
                turns = [chat.encode(m["content"]) + [chat.im_end_id] for m in demo["messages"]
                         if m["role"] == "assistant"]
                loop = AgentLoop(ReplayEngine(turns), manager, chat, cfg)
                task = {"id": demo["id"], "prompt": demo["messages"][1]["content"], "answer": demo["answer"]}
                traj = await loop.run_one(task)
                assert traj.finish_reason == "stop", traj.error
                assert traj.prompt_ids + traj.response_ids == ids
                assert [0] * len(traj.prompt_ids) + traj.loss_mask == mask

    asyncio.run(go())


def test_loss_mask_covers_exactly_the_assistant_turns(tokenizer, demos):
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.warmup.sft import _batch, encode_transcript

    chat = ChatFormat(tokenizer, demos[0]["tools"], system_prompt=SYSTEM)
    demo = next(d for d in demos if d["style"] == "tool")
    ids, mask = encode_transcript(chat, demo["messages"])
    policy_text = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    expected = "".join(m["content"] + "<|im_end|>" for m in demo["messages"] if m["role"] == "assistant")
    assert policy_text == expected
    assert demo["messages"][3]["content"] in tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    _, attention, labels = _batch([(ids, mask), (ids[:10], mask[:10])], tokenizer.pad_token_id)
    assert [int(x) != -100 for x in labels[0]] == [bool(m) for m in mask]
    assert int(attention[1].sum()) == 10 and int((labels[1] != -100).sum()) == 0


def test_tiny_sft_run_lowers_the_policy_loss(tokenizer, demos):
    import torch

    from rlfactory.models.tiny import build_tiny_qwen3
    from rlfactory.recipe.sft import SFTPhase
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.warmup.sft import encode_transcript, save_model, train_phases

    torch.manual_seed(0)
    chat = ChatFormat(tokenizer, demos[0]["tools"], system_prompt=SYSTEM)
    examples = [encode_transcript(chat, d["messages"]) for d in demos]
    model = build_tiny_qwen3(len(tokenizer), seed=0, hidden_size=64, num_layers=2, tie_word_embeddings=True)
    history = train_phases(model, [(SFTPhase(data="a.jsonl", steps=40, lr=3e-3, warmup_steps=5), examples)],
                           batch_size=8, pad_id=tokenizer.pad_token_id, seed=0)
    first = sum(r["loss"] for r in history[:5]) / 5
    last = sum(r["loss"] for r in history[-5:]) / 5
    assert last < 0.6 * first, (first, last)
    assert all(r["tokens"] > 0 and r["grad_norm"] >= 0 for r in history)
    assert history[0]["lr"] == pytest.approx(3e-3 / 5)

    out = save_model(model, tokenizer, Path(__import__("tempfile").mkdtemp()) / "m")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    assert AutoTokenizer.from_pretrained(out).chat_template == tokenizer.chat_template
    assert next(model.parameters()).dtype == torch.float32  # the caller's weights are left as they were


def _tiny_sft_recipe(tmp_path: Path) -> Path:
    text = (REPO / "recipes" / "quickstart_sft.yaml").read_text()
    recipe = tmp_path / "recipes" / "tiny_sft.yaml"
    recipe.parent.mkdir(parents=True)
    # Same recipe, paths made absolute, so it runs from a temp folder.
    for rel in ("../models/quickstart-calc", "../data/quickstart/train.jsonl", "../data/quickstart/val.jsonl",
                "../mcp_configs/default.json"):
        target = str((REPO / "recipes" / rel).resolve()) if "models" not in rel else str(tmp_path / "model")
        text = text.replace(rel, target)
    recipe.write_text(text)
    return recipe


def test_sft_command_writes_a_loadable_model_folder(tmp_path):
    recipe = _tiny_sft_recipe(tmp_path)
    cmd = [sys.executable, "-m", "rlfactory.cli", "sft", str(recipe),
           "--set", "sft.demos.0.n=64", "--set", "sft.demos.1.n=32", "--set", "sft.demos.2.n=16",
           "--set", "sft.phases=[{data: tool_use, steps: 6, lr: 3.0e-3}, {data: mostly_direct, steps: 3, lr: 1.0e-3}]",
           "--set", "sft.batch_size=4",
           "--set", "sft.scratch_model.hidden_size=64", "--set", "sft.scratch_model.num_hidden_layers=1",
           "--set", "sft.check.tasks=6", "--set", f"sft.work_dir={tmp_path / 'work'}", "--set", "sft.device=cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=240)
    # Nine steps cannot make a usable start: the command says so and exits 2 (a user error would be 1).
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    assert "check on 6 validation tasks through the real tools" in proc.stdout
    out = tmp_path / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sft_summary.json"):
        assert (out / name).exists(), name
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 9 and summary["check"]["trajectories"] == 6
    assert summary["device"] == "cpu"
    assert len((tmp_path / "work" / "demos" / "tool_use.jsonl").read_text().splitlines()) == 64


def test_sft_command_reports_every_problem_of_a_bad_section(tmp_path):
    recipe = _tiny_sft_recipe(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "sft", str(recipe), "--set", "sft.batch_size=0",
                           "--set", "sft.phases.0.data=nowhere", "--set", "sft.typo=1", "--set", "sft.device=tpu"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1
    err = proc.stderr
    assert "sft.batch_size" in err and "sft.typo" in err and "sft.device" in err and "Traceback" not in err


def test_demos_command_writes_transcripts(tmp_path):
    recipe = REPO / "recipes" / "quickstart.yaml"
    out = tmp_path / "demos.jsonl"
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "demos", str(recipe), "--out", str(out),
                           "--n", "10", "--direct-fraction", "0.5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 10 and {r["style"] for r in rows} <= {"tool", "direct"}
    train = [json.loads(x) for x in (REPO / "data" / "quickstart" / "train.jsonl").read_text().splitlines()[:10]]
    assert [r["answer"] for r in rows] == [t["answer"] for t in train]


def test_shipped_checkpoint_is_small_bf16_and_speaks_qwen3_chat():
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from rlfactory.models.tokenizer import chat_template_text
    from rlfactory.warmup.tokenizer_builder import check_tokenizer

    model_dir = REPO / "models" / "quickstart-calc"
    weights = model_dir / "model.safetensors"
    assert weights.stat().st_size < 10 * 2**20
    with safe_open(str(weights), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert check_tokenizer(tok) == [] and tok.chat_template == chat_template_text()
    summary = json.loads((model_dir / "sft_summary.json").read_text())
    assert summary["check"]["usable"] is True


def test_shipped_checkpoint_still_sees_the_prompt_it_was_trained_on():
    """The checkpoint's tokenizer learned the calculator's schema text as one token; if the calculator's docstring
    or the system prompt changes, the prompt grows and the model sees text it never saw: re-make the checkpoint
    (`rlfactory sft recipes/quickstart_sft.yaml`)."""
    from transformers import AutoTokenizer

    from rlfactory.recipe.schema import Recipe
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.tools.manager import ToolManager

    recipe = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml")
    tok = AutoTokenizer.from_pretrained(REPO / "models" / "quickstart-calc")

    async def schemas():
        async with ToolManager.from_recipe(recipe.tools) as manager:
            return manager.openai_schemas()

    chat = ChatFormat(tok, asyncio.run(schemas()), system_prompt=recipe.rollout.system_prompt)
    ids = chat.prompt_ids(chat.prompt_messages("What is 4817 * 2931?"))
    assert len(ids) <= 60, f"prompt is {len(ids)} tokens: re-make models/quickstart-calc"
