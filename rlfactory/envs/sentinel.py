"""Sentinel instances: how a bridge process sees a restart of an AgentGym server that no request of its host saw.

AgentGym's servers hand out instance ids in order from 0, in every incarnation. Before a process creates its first
episode instance in an epoch (`rlfactory/envs/restarts.py`), it creates one more instance, the *sentinel*, and
makes its observation its own (TextCraft: `get 1 rlfactory-sentinel-<random>`, answered "Could not find
rlfactory-sentinel-<random>"; BabyAI: a reset to a random seed of its biggest level). Every instance the process
creates afterwards has a higher id, so a restarted server hands out the sentinel's id before any of them: while the
sentinel still shows its observation, no episode id of this process names another episode's instance. `EnvClient`
checks it before each call on an instance (one request); when it shows anything else the server restarted, the
epoch moves on for every process of the host, and the episodes fail as infrastructure failures.

Only environments whose sentinel can be made recognisable have one (`MARKS`); the process closes its sentinels when
it ends (the env MCP server's shutdown, or interpreter exit). Left out: a sentinel per episode (one per process
and epoch suffices), and any use for servers that do not number instances in order.
"""
from __future__ import annotations

import atexit
import logging
import random
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from rlfactory.envs.types import EnvReplyError, EnvServerError

logger = logging.getLogger(__name__)

MARKS: dict[str, dict[str, Any]] = {
    # An unknown item: the answer names it, and the inventory does not change (the reset first: a server whose
    # create does not reset, as BabyAI's, has nothing to step yet).
    "textcraft": {"reset": lambda rng: 0, "step": "get 1 rlfactory-sentinel-{token}"},
    # BossLevel (data_idx % 40 == 38) at a random seed: a layout no task of a training set shares.
    "babyai": {"reset": lambda rng: 40 * rng.randrange(10**6, 10**9) + 38},
}


@dataclass
class Sentinel:
    env_id: Any
    epoch: str
    observation: str


class Sentinels:
    """The sentinels of one process, by (server URL, epoch). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_server: dict[str, Sentinel] = {}
        self._id_keys: dict[str, str] = {}
        self._unmarkable: set[str] = set()
        self._rng = random.Random()

    def ensure(self, client: Any) -> None:
        """Make the sentinel of the client's server for the current epoch, if the process has none yet (called
        before an episode's instance is created)."""
        mark = MARKS.get(client.env.lower())
        if mark is None or client.base_url in self._unmarkable:
            return

        with self._lock:
            held = self._by_server.get(client.base_url)
            if held is not None and held.epoch == client.watch.epoch():
                return
            if held is not None:
                self._retire(client, held)
            before = client.watch.before_create()
            data = client._request("POST", "/create", json=client.create_body)
            env_id = data.get("id", data.get(client.id_key)) if isinstance(data, dict) else data
            placed = client.watch.created(before, env_id)
            if placed.epoch is None:
                return  # the server restarted under the create: the next create tries again
            token = uuid.uuid4().hex[:16]
            try:
                if "reset" in mark:
                    client._request("POST", "/reset", json={client.id_key: env_id,
                                                            client.reset_key: int(mark["reset"](self._rng))})
                if "step" in mark:
                    client._request("POST", "/step", json={client.id_key: env_id,
                                                           "action": mark["step"].format(token=token)})
                observation = _observation(client, env_id)
            except EnvReplyError as e:  # a server of another kind than its name says: no sentinel there
                logger.warning("%s: cannot make a sentinel instance (%s); restarts seen by other hosts only show "
                               "in the observation check", client.where, e.message)
                self._unmarkable.add(client.base_url)
                client._request("POST", "/close", json={client.id_key: env_id})
                return
            self._by_server[client.base_url] = Sentinel(env_id, placed.epoch, observation)
            self._id_keys[client.base_url] = client.id_key
            logger.info("%s: sentinel instance %s for epoch %s", client.where, env_id, placed.epoch)

    def check(self, client: Any, epoch: str, env_id: Any) -> str | None:
        """None while the sentinel of `epoch` still shows its observation; else why not (and the epoch moves on:
        the server restarted). None too when it says nothing about `env_id` (no sentinel for that epoch, or one
        made after that instance: a lower id)."""
        with self._lock:
            held = self._by_server.get(client.base_url)
        if held is None or held.epoch != epoch:
            return None
        if isinstance(env_id, int) and isinstance(held.env_id, int) and env_id < held.env_id:
            return None

        try:
            current = _observation(client, held.env_id)
        except EnvReplyError as e:
            current = f"an error: {e.message}"
        if current == held.observation:
            return None
        why = (f"the sentinel instance {held.env_id} this process made before its episodes' instances shows "
               f"{_clip(current)!r}, not its own observation: the server restarted and has handed its id, and so "
               "maybe this episode's, to others")
        client.watch.restarted(epoch, why)
        with self._lock:
            if self._by_server.get(client.base_url) is held:
                del self._by_server[client.base_url]  # gone with the old server: never closed (its id is another's)
        return why

    def close_all(self) -> int:
        """Close every sentinel this process holds (its shutdown); returns how many."""
        import httpx

        with self._lock:
            held, self._by_server = self._by_server, {}
        closed = 0
        for url, sentinel in held.items():
            id_key = self._id_keys.get(url, "id")
            try:
                httpx.post(f"{url}/close", json={id_key: sentinel.env_id}, timeout=2.0)
                closed += 1
            except httpx.HTTPError as e:
                logger.warning("%s: closing sentinel instance %s failed: %s", url, sentinel.env_id, e)
        return closed

    def _retire(self, client: Any, held: Sentinel) -> None:
        """The epoch moved on. Only a suspicion moved it: the old sentinel says whether the server restarted (then
        the restart is recorded, and it is left alone) or not (then it is closed)."""

        self._by_server.pop(client.base_url, None)
        if client.watch.gone_for_sure(held.epoch):
            return
        try:
            try:
                current = _observation(client, held.env_id)
            except EnvReplyError as e:
                current = f"an error: {e.message}"
            if current == held.observation:
                client._request("POST", "/close", json={client.id_key: held.env_id})
            else:
                client.watch.restarted(held.epoch, f"the sentinel instance {held.env_id} shows {_clip(current)!r}, "
                                                   "not its own observation: the server restarted")
        except EnvServerError as e:  # best effort: the server may be down again
            logger.info("%s: old sentinel %s not closed: %s", client.where, held.env_id, e)


def _observation(client: Any, env_id: Any) -> str:
    data = client._request("GET", "/observation", params={client.id_key: env_id})
    return str(data.get("observation")) if isinstance(data, dict) else str(data)


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


SENTINELS = Sentinels()
"""The process's sentinels (every `EnvClient` with `sentinel=True` shares them)."""
atexit.register(SENTINELS.close_all)
