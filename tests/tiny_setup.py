"""Builds a tiny, real training setup in a folder: a byte-level BPE tokenizer trained on calculator transcripts, a
random tiny Qwen3 (a few hundred thousand parameters), arithmetic tasks, an mcpServers file for the real calculator
MCP server, and a recipe. Used by the tests in this folder and by bench/train_step.py (which passes a bigger model).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def _transcripts(tasks: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from rlfactory.warmup.demos import calculator_policy, direct_demo, tool_demo

    out = []
    for t in tasks:
        out.append({**tool_demo(t, calculator_policy(t), str(t["answer"])), "tools": tools})
        out.append({**direct_demo(t), "tools": tools})
    return out


def _tool_schemas(mcp_file: Path) -> list[dict[str, Any]]:
    """The calculator's schemas as the policy sees them (from the real server), so prompts tokenize short."""
    import asyncio

    from rlfactory.tools.manager import ToolManager

    async def get() -> list[dict[str, Any]]:
        async with ToolManager.from_files([mcp_file]) as tools:
            return tools.openai_schemas()

    return asyncio.run(get())


def build_tiny_setup(root: Path, *, hidden_size: int = 32, num_layers: int = 1, seed: int = 0,
                     vocab_size: int = 400, tokenizer_tasks: int = 32,
                     recipe_overrides: dict[str, Any] | None = None) -> Path:
    """Write everything under `root`; return the recipe path."""
    from rlfactory.models.tiny import build_tiny_qwen3
    from rlfactory.warmup.demos import make_arithmetic_tasks
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    (root / "mcp.json").write_text(json.dumps({"mcpServers": {"calculator": {
        "command": sys.executable, "args": [str(REPO / "envs" / "tools" / "calculator.py")],
        "rlfactory": {"tool_timeout_s": 10}}}}))
    tasks = make_arithmetic_tasks(max(48, tokenizer_tasks), seed=seed, digits=(2, 3))
    tok = build_tokenizer(_transcripts(tasks[:tokenizer_tasks], _tool_schemas(root / "mcp.json")),
                          vocab_size=vocab_size, model_max_length=1024)
    model = build_tiny_qwen3(len(tok), seed=seed, hidden_size=hidden_size, num_layers=num_layers, heads=2,
                             kv_heads=1, max_position_embeddings=1024)
    model.config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else model.config.eos_token_id
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    with (root / "train.jsonl").open("w") as f:
        for t in tasks[:40]:
            f.write(json.dumps(t) + "\n")
    with (root / "val.jsonl").open("w") as f:
        for t in tasks[40:48]:
            f.write(json.dumps(t) + "\n")
    # A reward that varies on a random policy (so GRPO groups have signal), beside the real task reward.
    (root / "shaping.py").write_text(
        "def digit_share(completion: str) -> float:\n"
        "    \"\"\"Share of digits in the completion: varies between samples of an untrained model.\"\"\"\n"
        "    return sum(c.isdigit() for c in completion) / max(len(completion), 1)\n")
    recipe: dict[str, Any] = {
        "name": "tiny",
        "model": {"path": "model"},
        "data": {"train_file": "train.jsonl", "val_file": "val.jsonl"},
        "tools": {"mcp_configs": ["mcp.json"], "cache": {"backend": "none"}},
        "rollout": {"samples_per_prompt": 4, "sampling": {"temperature": 1.0, "max_new_tokens_per_turn": 24},
                    "horizon": {"type": "fixed", "turns": 2}, "max_response_tokens": 96,
                    "max_context_tokens": 1024, "tool_response_max_tokens": 32},
        "rewards": {"functions": [{"function": "exact_match", "weight": 1.0},
                                  {"function": "shaping.py:digit_share", "weight": 1.0},
                                  {"function": "tool_calls_well_formed", "weight": 0.0}]},
        "algorithm": {"learning_rate": 1e-3, "micro_batch_size": 4},
        "trainer": {"total_steps": 3, "prompts_per_step": 2, "save_every_steps": 1, "output_dir": str(root / "run"),
                    "seed": seed, "log": {"tensorboard": True, "transcripts_per_step": 2}},
    }
    for dotted, value in (recipe_overrides or {}).items():
        node = recipe
        *head, last = dotted.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = value
    path = root / "recipe.yaml"
    path.write_text("# tiny test recipe\n" + yaml.safe_dump(recipe, sort_keys=False))
    return path
