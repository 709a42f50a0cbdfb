"""The AgentGym campaign of `bench/chaos.py`: bridge episodes against the stand-in AgentGym server, with server
restarts and sessions that end abruptly, all real processes.

Three bridge sessions (`envs/tools/agentgym_bridge.py` subprocesses, spoken to over MCP stdio) on two "hosts" (two
restart records, as on two machines: one host's creates say nothing to the other) play TextCraft episodes in
parallel against `envs/tools/agentgym_http_server.py`. Each episode gets base items in seeded random counts and
checks its inventory after every get; the server is killed (`kill -9`) and started again on the same port at seeded
moments (numbering instances from 0 again), and sessions end at seeded moments by stdin EOF or SIGTERM with their
episodes open, a new session taking their place. At the end every session ends (closing its episodes first, by EOF,
or by SIGTERM) and the stand-in's instance table (`GET /rlfactory/instances`) says what is left.

- `episode_crosstalk`: calls whose answer shows they acted on another episode's instance (an inventory that is not
  the episode's own gets, a get answered for other items, an instance closed under an episode when no restart came
  since its reset). Must be 0.
- `leaked_env_instances`: instances left on the server after every session ended. Must be 0.
- detail: episodes, calls, restarts, session ends, the infrastructure failures by what caught them, and the
  per-step cost of the checks (`EnvClient` alone against the stand-in: ownership check, sentinel).
Left out: SIGKILL of a bridge (nothing runs to close its instances) and restarts of a bridge's host.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "envs"))
from agentgym_stand_in import BridgeProcess, McpError, StandIn  # noqa: E402 - tests/envs/agentgym_stand_in.py
from local_services import pick_free_port  # noqa: E402

INFRA = {"rlfactory/infra": True}
CAUGHT_BY = (  # what an infrastructure failure's text says caught it
    ("ids_back", "numbers its instances from 0 again"),
    ("sentinel", "sentinel instance"),
    ("observation", "observation changed without an action"),
    ("failed_reset", "reset(task_id="),
    ("connection", "is the server running"),
    ("connection", "failed at the connection"),
    ("stopping", "shutting down"),
)


def _caught_by(text: str) -> str:
    for name, needle in CAUGHT_BY:
        if needle in text:
            return name
    return "other"


class Chaos:
    """The shared record of one campaign: counters, and the server restarts so far."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.restarts = 0
        self.calls = 0
        self.counts: dict[str, int] = {}
        self.infra: dict[str, int] = {}
        self.crosstalk: list[str] = []

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def crossed(self, what: str) -> None:
        with self.lock:
            self.crosstalk.append(what)


def _live(url: str) -> list[int]:
    try:
        return httpx.get(url + "/rlfactory/instances", timeout=10).json()["live"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


def _inventory_text(items: dict[str, int]) -> str:
    if not items:
        return "Inventory: You are not carrying anything."
    return "Inventory: " + " ".join(f"[{item}] ({n})" for item, n in sorted(items.items()))


class Session:
    """One bridge session of a worker, replaced when it ends abruptly."""

    def __init__(self, url: str, state_dir: Path, logs: Path, name: str):
        self.url, self.state_dir, self.logs, self.name = url, state_dir, logs, name
        self.generation = 0
        self.open_episodes: set[str] = set()
        self.active: list[Any] = []  # episodes being played (the worker's)
        self.bridge = self._start()

    def _start(self) -> BridgeProcess:
        self.generation += 1
        return BridgeProcess(self.url, state_dir=self.state_dir,
                             stderr=self.logs / f"bridge-{self.name}-{self.generation}.log")

    def end(self, how: str) -> None:
        if how == "close":
            for episode in sorted(self.open_episodes):
                try:
                    self.bridge.call("close", episode_id=episode)
                except McpError:
                    break
            self.bridge.end_by_eof()
        elif how == "eof":
            self.bridge.end_by_eof()
        else:
            self.bridge.end_by_signal(signal.SIGTERM)
        self.open_episodes.clear()

    def replace(self, how: str) -> None:
        self.end(how)
        self.bridge = self._start()


class _Episode:
    def __init__(self, name: str, restarts_at_reset: int, steps: int):
        self.name, self.restarts_at_reset, self.steps_left = name, restarts_at_reset, steps
        self.own: dict[str, int] = {}
        self.resume_at = 0  # paused (a long policy turn) until the campaign has opened this many episodes


def _step(session: Session, chaos: Chaos, rng: random.Random, items: list[str], ep: _Episode) -> bool:
    """One get and an inventory check on `ep`; False when the episode cannot go on."""
    item, k = rng.choice(items), rng.randint(1, 9)
    for action in (f"get {k} {item}", "inventory"):
        text, s, err = session.bridge.call("step", action=action, episode_id=ep.name)
        chaos.count("calls")
        if err:
            if s == INFRA:
                with chaos.lock:
                    why = _caught_by(text)
                    chaos.infra[why] = chaos.infra.get(why, 0) + 1
                lost = re.search(r"instance (\d+) of this episode", text)
                if lost and int(lost.group(1)) in _live(session.url):
                    chaos.count("lost_ids_held_by_new_episodes")  # a crossing the checks prevented
            elif "is not valid" in text:
                with chaos.lock:
                    restarted = chaos.restarts != ep.restarts_at_reset
                if restarted:
                    chaos.count("stale_id_after_restart")
                else:  # closed under it, with no restart since its reset: another episode's close
                    chaos.crossed(f"{ep.name}: {text[:160]}")
            else:
                chaos.count("reply_errors")
            return False
        observation = s.get("observation", "")
        if action.startswith("get"):
            if observation != f"Got {k} {item}":
                chaos.crossed(f"{ep.name}: {action!r} answered {observation[:120]!r}")
            ep.own[item] = ep.own.get(item, 0) + k
        elif observation != _inventory_text(ep.own):
            chaos.crossed(f"{ep.name}: inventory {observation[:120]!r}, its own gets {ep.own}")
    return True


def _wait_up(url: str, deadline_s: float = 120.0) -> None:
    """Until the server answers again (it is being restarted); hang guard only."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def _play(session: Session, chaos: Chaos, rng: random.Random, items: list[str], episodes: int, steps: int,
          end_p: float, progress: list[int], width: int = 4) -> None:
    """One worker: `episodes` episodes on its session, up to `width` open at a time and played in turns, some paused
    for a while (a long policy turn, counted in episodes opened by all workers), so that restarts land in the middle
    of episodes and the new server hands their ids to other sessions' episodes before they act again. Each episode
    makes `steps` gets, checking its inventory after each."""
    active: list[_Episode] = session.active
    opened = 0
    while opened < episodes or active:
        ready = [e for e in active if e.resume_at <= progress[0]]
        if opened < episodes and (len(active) < width or not ready):
            if rng.random() < end_p:  # an abrupt end with episodes open; a new session takes its place
                how = rng.choice(["eof", "sigterm"])
                session.replace(how)
                chaos.count(f"sessions_ended_{how}")
                chaos.count("episodes_cut_by_session_end", len(active))
                active.clear()
            name = f"{session.name}-{opened}"
            opened += 1
            with chaos.lock:
                restarts = chaos.restarts
            _, _, err = session.bridge.call("reset", task_id=rng.randrange(0, 300), episode_id=name)
            session.open_episodes.add(name)
            chaos.count("episodes")
            if err:
                chaos.count("resets_failed")
                _wait_up(session.url)  # as a trainer's next batch: once the server is back
            else:
                with chaos.lock:
                    progress[0] += 1
                active.append(_Episode(name, restarts, steps))
            continue
        ep = rng.choice(ready or active)
        ep.steps_left -= 1
        if _step(session, chaos, rng, items, ep) and ep.steps_left > 0:
            if rng.random() < 0.3:
                ep.resume_at = progress[0] + rng.randint(3, 15)
            continue
        active.remove(ep)
        if rng.random() < 0.7:
            session.bridge.call("close", episode_id=ep.name)
            session.open_episodes.discard(ep.name)


def _restarts(server: StandIn, chaos: Chaos, rng: random.Random, count: int, done: threading.Event,
              progress: list[int], total_episodes: int) -> None:
    """Restart the server `count` times, at seeded points of the campaign's progress (episodes opened)."""
    gap = total_episodes // 8
    marks = [total_episodes // 8 + i * gap + rng.randrange(gap) for i in range(count)]
    for mark in marks:
        while not done.is_set() and progress[0] < mark:
            time.sleep(0.05)
        if done.is_set():
            return
        server.kill()
        with chaos.lock:
            chaos.restarts += 1
        time.sleep(rng.uniform(0.0, 0.5))  # down a while: some calls meet a refused connection
        server.start()


def _step_cost(url: str, state_dir: Path, steps: int) -> dict[str, Any]:
    """Milliseconds per `step` of `EnvClient` against the stand-in, without and with the checks."""
    from rlfactory.envs.client import EnvClient
    from rlfactory.envs.sentinel import SENTINELS

    configs = {"no_checks": {"verify_owner": False, "sentinel": False},
               "ownership_check": {"verify_owner": True, "sentinel": False},
               "ownership_and_sentinel": {"verify_owner": True, "sentinel": True}}
    times: dict[str, list[float]] = {k: [] for k in configs}
    clients = {k: EnvClient("textcraft", url, state_dir=state_dir, **kw) for k, kw in configs.items()}
    requests = {k: 0 for k in configs}
    try:
        for name, client in clients.items():
            client.reset(7)
            client.step("inventory")  # the first step learns whether the server echoes
            client._http.event_hooks["request"] = [lambda _r, name=name: requests.__setitem__(name, requests[name] + 1)]
        for _ in range(steps // 20):  # interleaved rounds: drift of the machine falls on all alike
            for name, client in clients.items():
                t0 = time.perf_counter()
                for _ in range(20):
                    client.step("inventory")
                times[name].append((time.perf_counter() - t0) / 20 * 1000)
    finally:
        for client in clients.values():
            client.close()
        SENTINELS.close_all()
    out: dict[str, Any] = {f"{k}_ms": round(statistics.median(v), 3) for k, v in times.items()}
    base = out["no_checks_ms"]
    out.update({f"{k}_overhead_ms": round(out[f"{k}_ms"] - base, 3) for k in configs if k != "no_checks"})
    out["requests_per_step"] = {k: round(n / (steps // 20 * 20), 2) for k, n in requests.items()}
    return out


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    from rlfactory.envs.textcraft import TextCraftEnv

    items = sorted(TextCraftEnv().book.base_items)
    tmp.mkdir(parents=True, exist_ok=True)
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    server = StandIn(pick_free_port(), log=logs / "stand_in.log").start()
    episodes, steps, restarts = (24, 3, 2) if quick else (60, 4, 4)
    chaos = Chaos()
    t0 = time.perf_counter()
    sessions: list[Session] = []
    try:
        cost = _step_cost(server.url, tmp / "host-cost", 200 if quick else 600)
        hosts = [("a0", "host-a"), ("a1", "host-a"), ("b0", "host-b")]
        sessions = [Session(server.url, tmp / host, logs, name) for name, host in hosts]
        progress = [0]
        done = threading.Event()

        def worker(session: Session, wseed: int) -> None:
            try:
                _play(session, chaos, random.Random(wseed), items, episodes, steps, end_p=0.06, progress=progress)
            except Exception as e:  # noqa: BLE001 - a campaign reports, never dies
                chaos.count(f"worker_error:{type(e).__name__}: {e}"[:120])

        restarter = threading.Thread(target=_restarts, args=(server, chaos, rng, restarts, done, progress,
                                                             episodes * len(sessions)), daemon=True)
        restarter.start()
        workers = [threading.Thread(target=worker, args=(s, rng.randrange(2**31))) for s in sessions]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        restarter.join(timeout=120)
        if server.proc is None or server.proc.poll() is not None:
            server.start()
        ends = {}
        final = rng.sample(["close", "eof", "sigterm"], 3)  # each way once
        for session, how in zip(sessions, final):
            session.end(how)
            ends[how] = ends.get(how, 0) + 1
        deadline = time.monotonic() + 30
        live = server.instances()
        while live and time.monotonic() < deadline:
            time.sleep(0.2)
            live = server.instances()
    finally:
        for session in sessions:
            session.bridge.kill()
        server.stop()
    counts = dict(sorted(chaos.counts.items()))
    return {
        "episode_crosstalk": len(chaos.crosstalk),
        "leaked_env_instances": len(live),
        "episodes": counts.pop("episodes", 0),
        "calls": counts.pop("calls", 0),
        "server_restarts": chaos.restarts,
        "sessions_ended_abruptly": {k.removeprefix("sessions_ended_"): v for k, v in counts.items()
                                    if k.startswith("sessions_ended_")},
        "final_session_ends": ends,
        "infra_failures_caught_by": dict(sorted(chaos.infra.items())),
        "other_counts": {k: v for k, v in counts.items() if not k.startswith("sessions_ended_")},
        "crosstalk_examples": chaos.crosstalk[:5],
        "leaked_ids": live,
        "step_cost": cost,
        "campaign_s": round(time.perf_counter() - t0, 1),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-envs-") as d:
        result = campaign(Path(d), seed=args.seed, quick=args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
