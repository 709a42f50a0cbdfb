"""Weight pushes for `VLLMEngine`: which policy version sampled each token of a request, and the task that follows a
`WeightSource` (the asynchronous wing's shared weights).

A request's tokens arrive as deltas, in the order vLLM sampled them. `RequestStream` keeps them with a list of
(first token index, version) segments: a push appends one at the number of tokens the request had been sent when
generation stopped, so every later token carries the new version. `VLLMEngine.push_weights` (vllm.py) does the
push itself: stop vLLM between two steps, load, stamp, resume. `WeightFollower` polls the source and calls it for
every newer version. This module does not import vllm.
Left out: LoRA adapters (pushed adapter names are refused), weights pushed over NCCL/IPC (vLLM's weight-transfer
engines need a GPU): pushes travel as a safetensors file in /dev/shm.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
from typing import Any, Protocol

from rlfactory.errors import RLFactoryError
from rlfactory.rollout.engines.protocol import WeightSource

logger = logging.getLogger(__name__)


class RequestStream:
    """One request's tokens and logprobs as vLLM streams them, and the version each token was sampled under."""

    def __init__(self, version: int):
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.collector: Any = None
        """vLLM's per-request output collector (`RequestOutputCollector`), once the request is added."""
        self._starts = [0]  # segment i: tokens from _starts[i] on were sampled by version _versions[i]
        self._versions = [version]

    def absorb(self, token_ids: list[int], logprobs: list[float]) -> None:
        self.token_ids.extend(token_ids)
        self.logprobs.extend(logprobs)

    def sent_tokens(self) -> int:
        """Tokens vLLM has handed to this request so far: those absorbed plus those waiting in its collector (it
        merges deltas while the consumer is away, so a pending delta may hold several steps' tokens)."""
        pending = 0
        if self.collector is not None:
            try:
                out = self.collector.get_nowait()
            except Exception as e:  # noqa: BLE001 - an error for the request: hand it back to its consumer
                self.collector.put(e)
                return len(self.token_ids)
            if out is not None:
                self.collector.put(out)  # the collector was emptied by get_nowait: this restores it as it was
                pending = len(out.outputs[0].token_ids) if out.outputs else 0
        return len(self.token_ids) + pending

    def new_version_from(self, index: int, version: int) -> None:
        """Tokens from `index` on are sampled by `version` (a later push at the same index overrides)."""
        if index == self._starts[-1]:
            self._versions[-1] = version
        else:
            self._starts.append(index)
            self._versions.append(version)

    def versions(self) -> list[int]:
        """The version of each token: that of the last segment starting at or before it."""
        return [self._versions[bisect.bisect_right(self._starts, i) - 1] for i in range(len(self.token_ids))]


class PushTarget(Protocol):
    """What the follower needs of the engine (`VLLMEngine`)."""

    policy_version: int

    async def push_weights(self, version: int, tensors: dict[str, Any]) -> None: ...


class WeightFollower:
    """Polls a `WeightSource` and pushes each newer version into the engine (between two of vLLM's steps).

    vLLM's steps run in its engine-core process, so there is no hook "before each step" as in the HF engine: the
    source's version (an int in shared memory) is read every `poll_s`. A failed push stops the follower and is
    raised by the engine's next `generate`."""

    def __init__(self, engine: PushTarget, source: WeightSource, poll_s: float):
        self.engine = engine
        self.source = source
        self.poll_s = poll_s
        self.error: BaseException | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    async def load_newer(self) -> bool:
        """Push the source's version if it is newer than the engine's; True when it was."""
        have = self.engine.policy_version
        if self.source.version <= have:
            return False
        got = await asyncio.to_thread(self.source.read, have)  # a copy under the source's lock: off the loop
        if got is None:
            return False
        version, tensors = got
        adapters = [name for name in tensors if "lora_" in name]
        if adapters:
            raise RLFactoryError(f"the vLLM engine cannot follow pushed LoRA adapters ({adapters[0]}, ...): use "
                                 "rollout.engine: hf for LoRA runs, or train full weights")
        await self.engine.push_weights(version, tensors)
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rlfactory-vllm-weight-follower")

    async def _run(self) -> None:
        try:
            while not self._stopping:
                if not await self.load_newer():
                    await asyncio.sleep(self.poll_s)
        except Exception as e:  # kept and raised by generate(), so a failed push is never silent
            logger.exception("vLLM weight push failed; generation stops with this error")
            self.error = e

    async def stop(self) -> None:
        """Stop polling; a push under way finishes first (cancelling it could leave vLLM paused)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            await task
