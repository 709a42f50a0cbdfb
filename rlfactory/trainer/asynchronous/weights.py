"""`SharedWeights`: the policy's trainable weights in shared memory, the channel from the trainer to the generator
process of an asynchronous run (`trainer.max_staleness_steps >= 1`), and the `WeightSource` its engine follows
(rollout/engines/protocol.py).

    trainer: optimizer step -> publish(model, version)   (copy params into the shared buffers, then the version)
    generator's engine, between two decode steps: load_into(model) (HF) or read() (vLLM) when version > its own

Only parameters that train are pushed (all of them for full fine-tuning, the adapter for LoRA); both sides load
the same recipe, so names and shapes match. One lock makes a push and a load exclusive, so a load never sees half
of a push; both are plain memory copies. The buffers are torch tensors in shared memory, so they travel to a spawned
process as handles, not copies; the lock cannot travel in a message, so the generator process gets its own handle to
it at spawn (`Channels.weights_lock`) and attaches it (`with_lock`).
Left out: verl's weight sync (its own), GPU-to-GPU transfers.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import torch


def trainable_parameters(model: Any) -> dict[str, torch.Tensor]:
    """name -> parameter, for the parameters the optimizer updates (shared/tied tensors listed once)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


class SharedWeights:
    """Made by the trainer from its model (`SharedWeights.from_model`), handed to the generator process whole."""

    def __init__(self, buffers: dict[str, torch.Tensor], version: torch.Tensor, lock: Any):
        self.buffers = buffers
        self._version = version  # int64[1] in shared memory
        self._lock = lock

    @classmethod
    def from_model(cls, model: Any, lock: Any = None, version: int = 0) -> SharedWeights:
        """Shared copies of the model's trainable parameters; `lock`: a multiprocessing lock both processes hold
        (made here when None)."""
        buffers = {name: p.detach().to("cpu", copy=True).share_memory_()
                   for name, p in trainable_parameters(model).items()}
        lock = lock if lock is not None else mp.get_context("spawn").Lock()
        return cls(buffers, torch.tensor([version], dtype=torch.int64).share_memory_(), lock)

    def __getstate__(self) -> dict[str, Any]:  # sent in a message: the buffers as handles, the lock left behind
        return {"buffers": self.buffers, "version": self._version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.buffers, self._version, self._lock = state["buffers"], state["version"], None

    def with_lock(self, lock: Any) -> SharedWeights:
        self._lock = lock
        return self

    @property
    def version(self) -> int:
        """The policy version of the weights in the buffers (optimizer steps taken)."""
        return int(self._version[0])

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def publish(self, model: Any, version: int) -> float:
        """Copy the model's trainable parameters in and set the version; returns the seconds it took."""
        t0 = time.perf_counter()
        params = trainable_parameters(model)
        with self._lock, torch.no_grad():
            for name, buf in self.buffers.items():
                buf.copy_(params[name].detach())
            self._version[0] = version
        return time.perf_counter() - t0

    def load_into(self, model: Any, have: int) -> int | None:
        """Copy the buffers into `model` if they hold a newer version than `have`; returns the version loaded, or
        None when there was nothing new."""
        if self.version <= have:
            return None
        params = trainable_parameters(model)
        missing = sorted(set(self.buffers) - set(params))
        if missing:
            raise RuntimeError(f"pushed weights name parameters the generator's model lacks: {missing[:3]}")
        with self._lock, torch.no_grad():
            for name, buf in self.buffers.items():
                params[name].copy_(buf)
            return int(self._version[0])

    def read(self, have: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, name -> a copy of its tensor) when the buffers hold a newer version than `have`, else None; for
        engines that load weights their own way (vLLM)."""
        if self.version <= have:
            return None
        with self._lock:
            return int(self._version[0]), {name: buf.clone() for name, buf in self.buffers.items()}
