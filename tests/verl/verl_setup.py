"""A small real setup for the verl tests: the offline Qwen3 tokenizer saved as a model folder (config + tokenizer,
what verl's HFModelConfig reads), a scripted tiny Qwen3 that calls the calculator or answers, the real calculator
MCP server, two tasks and a recipe with a ScalingInter-RL horizon. Plus an LLM server object with verl's async
`generate()` interface wrapping rlfactory's HFEngine, recording every call."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
# compact JSON: no token repeats inside a script, so the Markov chain cannot jump between its parts
CALL = '<tool_call>{"name": "calculator","arguments":{"expression":"6*7"}}</tool_call><|im_end|>'
ANSWER = "<answer>42</answer><|im_end|>"
IM_END = 151645


def build_setup(root: Path) -> tuple[Path, Any]:
    """Write the setup under `root`; returns (recipe path, scripted model)."""
    from scripted_model import build_scripted_qwen3

    from rlfactory.models.tokenizer import load_qwen_tokenizer
    from rlfactory.rollout.chat import ChatFormat

    tok = load_qwen_tokenizer()
    model = build_scripted_qwen3(tok, [(CALL, 0.6), (ANSWER, 0.4)],
                                 start_token_ids=[ChatFormat(tok).generation_prompt_ids[-1]], junk_prob=1e-4)
    model_dir = root / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(model_dir)
    model.config.save_pretrained(model_dir)  # verl reads the config and tokenizer; the weights stay in memory
    (root / "mcp.json").write_text(json.dumps({"mcpServers": {"calculator": {
        "command": sys.executable, "args": [str(REPO / "envs" / "tools" / "calculator.py")]}}}))
    with (root / "train.jsonl").open("w") as f:
        for i, q in enumerate(["What is 6*7?", "What is 7*6?"]):
            f.write(json.dumps({"id": f"t{i}", "prompt": q, "answer": "42"}) + "\n")
    recipe = {
        "name": "verl-tiny",
        "model": {"path": "model", "dtype": "float32"},
        "data": {"train_file": "train.jsonl"},
        "tools": {"mcp_configs": ["mcp.json"], "cache": {"backend": "none"}},
        "rollout": {"samples_per_prompt": 4, "sampling": {"temperature": 1.0, "max_new_tokens_per_turn": 40},
                    "horizon": {"type": "scaling_inter", "horizons": [1, 3], "interval_steps": 1},
                    "max_response_tokens": 256, "max_context_tokens": 1024, "tool_response_max_tokens": 32},
        "rewards": {"functions": [{"function": "exact_match", "weight": 1.0},
                                  {"function": "tool_calls_well_formed", "weight": 0.0}]},
        "algorithm": {"micro_batch_size": 8},
        "engine": "verl",
        "verl": {"nnodes": 1, "gpus_per_node": 1},
        "trainer": {"total_steps": 2, "prompts_per_step": 2, "output_dir": str(root / "run")},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path, model


class HFServer:
    """verl's LLM-server client interface (`await generate(request_id, prompt_ids=, sampling_params=)` ->
    TokenOutput) over rlfactory's HFEngine; records (request_id, prompt_ids, token_ids, logprobs) per call."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[tuple[str, list[int], list[int], list[float] | None]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from rlfactory.rollout.engines.protocol import SamplingParams

        sp = SamplingParams(temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                            top_k=sampling_params["top_k"], max_new_tokens=sampling_params["max_tokens"],
                            stop_token_ids=list(sampling_params.get("stop_token_ids", [])))
        out = await self.engine.generate(list(prompt_ids), sp, request_id=f"{request_id}/{len(self.calls)}")
        logprobs = list(out.logprobs) if sampling_params.get("logprobs") and out.logprobs is not None else None
        self.calls.append((request_id, list(prompt_ids), list(out.token_ids), logprobs))
        return TokenOutput(token_ids=list(out.token_ids), log_probs=logprobs, stop_reason="completed")


def dataset_batch_dict(prepared: Any) -> dict[str, Any]:
    """verl's RLHFDataset over the parquet rows `prepare` wrote, collated as verl's dataloader does, with a fresh
    `uid` per prompt (as verl's trainers add)."""
    import uuid

    import numpy as np
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    cfg = prepared.config
    tok = hf_tokenizer(cfg.actor_rollout_ref.model.path)
    ds = RLHFDataset(data_files=[str(prepared.files.train_parquet)], tokenizer=tok, config=cfg.data)
    batch = collate_fn([ds[i] for i in range(len(ds))])
    batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(ds))], dtype=object)
    return batch


def expected_mask(calls: list[tuple], full: list[int], prompt_len: int,
                  response_len: int) -> tuple[list[int], list[float], int]:
    """The policy-token mask, logprobs and number of generation calls (assistant turns) of one sample, rebuilt from
    the server's record: the calls of the one request id whose every (prompt + generated tokens) is a prefix of the
    sample's sequence."""
    by_request: dict[str, list] = {}
    for rid, p, out, lp in calls:
        by_request.setdefault(rid, []).append((p, out, lp))
    for rid, cs in by_request.items():
        if all(full[:len(p) + len(out)] == p + out for p, out, _ in cs) and \
                len(cs[-1][0]) + len(cs[-1][1]) == len(full):
            mask, lps = [0] * response_len, [0.0] * response_len
            for p, out, lp in cs:
                for k in range(len(out)):
                    mask[len(p) - prompt_len + k] = 1
                    lps[len(p) - prompt_len + k] = lp[k]
            return mask, lps, len(cs)
    raise AssertionError("no recorded request produced this sample")
