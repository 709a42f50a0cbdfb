"""An HTTP-level demonstrator: follows a task's plan by links and forms, as a browser would, without a browser.

It proves every task solvable on the real site server: each step is resolved on the current page by role and
accessible name (a link's text, a control's `<label>`, a button's text), forms are filled and submitted as a browser
submits them (lxml's form handling), and redirects are followed. `run_task` plays one task in a fresh episode and
scores it with the evaluator. Left out: anything JavaScript would do (the sites have none).
"""
from __future__ import annotations

import uuid
from urllib.parse import urlencode, urljoin

import httpx
import lxml.html

from rlfactory.envs.web.tasks.build import plan_steps
from rlfactory.envs.web.tasks.evaluator import EvalResult, Evaluator, Judge, fill

_INPUT_ROLES = {"textbox": ("text", "email", "tel", "url", ""), "searchbox": ("search",), "spinbutton": ("number",),
                "radio": ("radio",), "checkbox": ("checkbox",)}


class PlanError(RuntimeError):
    """A plan step found nothing to act on, or the site answered it with an error page."""


class HttpAgent:
    """One tab: the current URL and page, acted on by plan steps."""

    def __init__(self, client: httpx.AsyncClient):
        self.client = client
        self.url = ""
        self.doc = None

    async def _load(self, response: httpx.Response, what: str) -> None:
        if response.status_code >= 400:
            raise PlanError(f"{what}: {response.request.method} {response.url} answered {response.status_code}: "
                            f"{response.text[:300]}")
        self.url = str(response.url)
        self.doc = lxml.html.fromstring(response.text)

    async def goto(self, url: str) -> None:
        await self._load(await self.client.get(url, follow_redirects=True), f"goto {url}")

    def _control(self, role: str, name: str):
        for label in self.doc.iter("label"):
            if label.text_content().strip() == name and label.get("for"):
                el = self.doc.get_element_by_id(label.get("for"), None)
                kind = (el.get("type") or "").lower() if el is not None and el.tag == "input" else el.tag if el is \
                    not None else None
                if el is not None and (kind in _INPUT_ROLES.get(role, ())
                                       or (role == "textbox" and kind == "textarea")):
                    return el
        raise PlanError(f"no {role} labelled {name!r} on {self.url}")

    async def _submit(self, form, extra: list[tuple[str, str]] = ()) -> None:
        action = urljoin(self.url, form.get("action") or self.url)
        data = list(form.form_values()) + list(extra)
        if (form.get("method") or "get").lower() == "post":
            response = await self.client.post(action, content=urlencode(data), follow_redirects=True,
                                              headers={"content-type": "application/x-www-form-urlencoded"})
        else:
            response = await self.client.get(action, params=data, follow_redirects=True)
        await self._load(response, f"submit {action}")

    async def act(self, step: dict) -> str | None:
        """Do one step; returns the answer for `stop`, else None."""
        action, role, name = step["action"], step.get("role", ""), step.get("name", "")
        if action == "stop":
            return step.get("answer", "")
        if action == "goto":
            await self.goto(step["url"])
        elif action == "click" and role == "link":
            for a in self.doc.iter("a"):
                if a.text_content().strip() == name and a.get("href"):
                    await self.goto(urljoin(self.url, a.get("href")))
                    return None
            raise PlanError(f"no link {name!r} on {self.url}")
        elif action == "click" and role == "button":
            for b in self.doc.iter("button"):
                if b.text_content().strip() == name:
                    form = next((f for f in b.iterancestors("form")), None)
                    if form is None:
                        raise PlanError(f"button {name!r} on {self.url} is in no form")
                    await self._submit(form, [(b.get("name"), b.get("value", ""))] if b.get("name") else [])
                    return None
            raise PlanError(f"no button {name!r} on {self.url}")
        elif action == "click" and role in ("radio", "checkbox"):
            el = self._control(role, name)
            form = next(el.iterancestors("form"))
            if role == "radio":
                for other in form.inputs:
                    if getattr(other, "type", "") == "radio" and other.name == el.name:
                        other.checked = False
            el.checked = True if role == "radio" else not el.checked
        elif action == "type":
            el = self._control(role, name)
            el.value = step["text"]  # `type` replaces what the field held
            if step.get("press_enter"):
                await self._submit(next(el.iterancestors("form")))
        else:
            raise PlanError(f"unknown step {step!r}")
        return None


async def solve(config: dict, client: httpx.AsyncClient, urls: dict[str, str]) -> tuple[str, str]:
    """Play the task's plan from its start URL; returns (answer, final URL)."""
    agent = HttpAgent(client)
    await agent.goto(fill(config["start_url"], urls))
    answer = ""
    for step in plan_steps(config):
        result = await agent.act({k: fill(v, urls) if k == "url" else v for k, v in step.items()})
        if result is not None:
            answer = result
            break
    return answer, agent.url


def episode_evaluator(sites, episode: str, client: httpx.AsyncClient, judge: Judge | None = None) -> Evaluator:
    """The evaluator of one open episode of `sites` (a WebSites): its URLs, its pages over `client`, its databases."""
    async def fetch(url: str) -> str:
        return (await client.get(url, follow_redirects=True)).text

    return Evaluator(sites.placeholders(episode), fetch, lambda site: sites.database(episode, site), judge)


async def run_task(sites, config: dict, client: httpx.AsyncClient, episode: str | None = None) -> EvalResult:
    """Open a fresh episode on `sites` (a WebSites), solve `config` in it over HTTP, score it, close it."""
    episode = episode or f"demo-{uuid.uuid4().hex[:12]}"
    sites.open_episode(episode, config.get("site_seed"))
    try:
        answer, final_url = await solve(config, client, sites.placeholders(episode))
        return await episode_evaluator(sites, episode, client)(config, answer, final_url)
    finally:
        sites.close_episode(episode)
