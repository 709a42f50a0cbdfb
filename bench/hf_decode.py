"""HF engine decoding, ours vs the engine before its GPU fixes, side by side in one run (CPU or one GPU).

    python bench/hf_decode.py --json out.json [--preset small|0.6b] [--rows 64] [--prompt-tokens 256]
                              [--new-tokens 128] [--rounds 3] [--device cpu|cuda]

Two changes are measured, alone and together:
- KV layout. "concat": every decode step allocates each layer's keys/values one column longer and copies the old
  ones in (what transformers' `DynamicLayer` does with `torch.cat`; here `rlfactory.rollout.hf_kv` with 1-column
  chunks and no growth, so both sides run the same code otherwise). "growing" (ours): buffers with spare columns,
  written in place, replaced by one half again larger only when full.
- Attention backend (CUDA only). "cudnn": PyTorch's default choice, which on Hopper is cuDNN attention, planned
  anew for every sequence length. "nocudnn" (ours): `rlfactory.models.avoid_cudnn_attention`.
Variants: `baseline` (concat + cudnn: the engine before), `ours` (growing + nocudnn), and on CUDA `kv_only`
(growing + cudnn) and `attention_only` (concat + nocudnn). Same random Qwen3, prompts and seeds for all; rounds
rotate the order, each run starts from an empty CUDA cache, medians reported.

Presets: `small` (hidden 256, 4 layers, fp32; the CPU default) and `0.6b` (Qwen3-0.6B's shape: hidden 1024,
28 layers, 16/8 heads, vocab 151,669; bf16; the CUDA default). Figures: `<variant>_tokens_per_s`,
`<variant>_ms_per_step`, `ours_vs_baseline_speedup` (> 1: ours is faster), on CUDA `kv_only_speedup` and
`attention_only_speedup` (each vs baseline), `decode_steps`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PRESETS: dict[str, dict[str, Any]] = {
    "small": {"vocab": 8192, "dtype": "float32",
              "model": {"hidden_size": 256, "num_layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 64}},
    "0.6b": {"vocab": 151_669, "dtype": "bfloat16",
             "model": {"hidden_size": 1024, "num_layers": 28, "heads": 16, "kv_heads": 8, "head_dim": 128,
                       "intermediate_size": 3072}},
}
CONCAT = (1, 0.0)  # (GROW_COLUMNS, GROWTH) that make a new tensor every step; None: the module's defaults
VARIANTS = {"baseline": (CONCAT, True), "ours": (None, False),  # (KV layout, cuDNN attention on)
            "kv_only": (None, True), "attention_only": (CONCAT, False)}


async def _run(model: Any, prompts: list[list[int]], new_tokens: int, device: Any, vocab: int,
               cudnn: bool = False) -> dict[str, float]:
    import torch

    from rlfactory.rollout.engines.hf import HFEngine
    from rlfactory.rollout.engines.protocol import SamplingParams

    engine = HFEngine(model, pad_token_id=0, eos_token_ids=[vocab + 1], max_batch_size=len(prompts), device=device)
    torch.backends.cuda.enable_cudnn_sdp(cudnn)  # the engine turned it off on CUDA; the baseline turns it back on
    try:
        started = time.perf_counter()
        outs = await asyncio.gather(*[
            engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i))
            for i, p in enumerate(prompts)])
        wall = time.perf_counter() - started
    finally:
        await engine.close()
    tokens = sum(len(o.token_ids) for o in outs)
    return {"tokens_per_s": tokens / wall, "ms_per_step": 1000 * wall / max(engine.stats.decode_steps, 1),
            "decode_steps": engine.stats.decode_steps}


def measure(preset: str, rows: int, prompt_tokens: int, new_tokens: int, rounds: int, device: str) -> dict[str, Any]:
    import torch

    from rlfactory.models.devices import resolve_dtype
    from rlfactory.models.tiny import build_tiny_qwen3
    from rlfactory.rollout.engines import hf_kv

    spec = PRESETS[preset]
    dev = torch.device(device)
    model = build_tiny_qwen3(spec["vocab"], max_position_embeddings=prompt_tokens + new_tokens + 8,
                             **spec["model"]).to(resolve_dtype(spec["dtype"])).to(dev)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, spec["vocab"], (prompt_tokens,), generator=gen).tolist() for _ in range(rows)]
    defaults = (hf_kv.GROW_COLUMNS, hf_kv.GROWTH)
    cudnn_before = torch.backends.cuda.cudnn_sdp_enabled()
    names = list(VARIANTS) if dev.type == "cuda" else ["baseline", "ours"]  # the attention switch is CUDA-only
    for cudnn in (True, False):  # warm-up: kernels, cuBLAS handles, both attention backends
        asyncio.run(_run(model, prompts[:2], 4, dev, spec["vocab"], cudnn))
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                layout, cudnn = VARIANTS[name]
                hf_kv.GROW_COLUMNS, hf_kv.GROWTH = layout or defaults
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                results[name].append(asyncio.run(_run(model, prompts, new_tokens, dev, spec["vocab"], cudnn)))
                print(f"round {r + 1} {name}: {results[name][-1]['tokens_per_s']:.0f} tokens/s", flush=True)
    finally:
        hf_kv.GROW_COLUMNS, hf_kv.GROWTH = defaults
        torch.backends.cuda.enable_cudnn_sdp(cudnn_before)
    out: dict[str, Any] = {"preset": preset, "device": str(dev), "rows": rows, "prompt_tokens": prompt_tokens,
                           "new_tokens": new_tokens, "rounds": rounds,
                           "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None}
    for name, runs in results.items():
        out[f"{name}_tokens_per_s"] = statistics.median(x["tokens_per_s"] for x in runs)
        out[f"{name}_ms_per_step"] = statistics.median(x["ms_per_step"] for x in runs)
    out["decode_steps"] = results["ours"][0]["decode_steps"]
    out["ours_vs_baseline_speedup"] = out["ours_tokens_per_s"] / out["baseline_tokens_per_s"]
    for name in ("kv_only", "attention_only"):
        if name in results:
            out[f"{name}_speedup"] = out[f"{name}_tokens_per_s"] / out["baseline_tokens_per_s"]
    return out


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    preset = args.preset or ("0.6b" if args.device.startswith("cuda") else "small")
    out = measure(preset, args.rows, args.prompt_tokens, args.new_tokens, args.rounds, args.device)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
