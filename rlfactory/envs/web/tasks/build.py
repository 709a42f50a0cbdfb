"""Build the task set: every template's instances as WebArena task configs, split into train and held-out, and
written as WebArena would read them (a `<split>.raw.json` list with placeholders, and one `<task_id>.json` each).

The split is by instance (a stable hash of the template and the instance's values sends ~15% to held-out) and by
template (HELD_OUT_TEMPLATES never appear in train). Beyond WebArena's keys (which it ignores): `split`,
`site_seed` (the content seed the instance was drawn from), `demo` (the demonstrator's values for the plan) and
`eval.db_state` (see evaluator.py). `plan_steps(config)` yields the demonstrator's steps for a config.
"""
from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from rlfactory.envs.web.sites.server import WEBARENA_SITES
from rlfactory.envs.web.sites.store import seed_database
from rlfactory.envs.web.tasks import forum_tasks, shop_tasks, wiki_tasks
from rlfactory.envs.web.tasks.template import Template

TEMPLATES: dict[int, Template] = {t.id: t for t in shop_tasks.TEMPLATES + forum_tasks.TEMPLATES
                                  + wiki_tasks.TEMPLATES}
HELD_OUT_TEMPLATES = {8, 15, 111, 113}  # top-rated-in-size, buy-and-ship-to, edit a title, a user's post count
HELD_OUT_PERCENT = 15
START = {"shopping": "__SHOPPING__", "reddit": "__REDDIT__", "wikipedia": "__WIKIPEDIA__"}


def _held_out(template: Template, values: dict) -> bool:
    if template.id in HELD_OUT_TEMPLATES:
        return True
    digest = hashlib.sha256(json.dumps([template.id, values], sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def build_tasks(seed: int = 0, cache: Path | None = None) -> list[dict]:
    """All task configs drawn from the content of `seed` (deterministic: same seed, same list)."""
    conns = {site: sqlite3.connect(f"file:{seed_database(db, seed, cache)}?mode=ro", uri=True)
             for site, db in WEBARENA_SITES.items()}
    for conn in conns.values():
        conn.row_factory = sqlite3.Row
    configs: list[dict] = []
    try:
        for template in TEMPLATES.values():
            rng = random.Random(f"tasks-{seed}-{template.id}")
            for inst in template.make(conns[template.site], rng):
                configs.append({
                    "sites": [template.site], "task_id": len(configs), "require_login": True,
                    "storage_state": None, "start_url": START[template.site] + template.start, "geolocation": None,
                    "intent_template": template.intent, "instantiation_dict": inst.vars,
                    "intent": template.intent_for(inst.vars), "require_reset": bool(inst.eval.get("db_state")),
                    "eval": inst.eval, "intent_template_id": template.id,
                    "split": "heldout" if _held_out(template, inst.vars) else "train", "site_seed": seed,
                    "demo": inst.demo,
                })
    finally:
        for conn in conns.values():
            conn.close()
    return configs


def write_tasks(folder: Path, seed: int = 0, cache: Path | None = None) -> dict[str, int]:
    """Write `<split>.raw.json` and `<split>/<task_id>.json` under `folder`; returns {split: count}."""
    folder = Path(folder)
    counts: dict[str, int] = {}
    configs = build_tasks(seed, cache)
    for split in ("train", "heldout"):
        rows = [c for c in configs if c["split"] == split]
        counts[split] = len(rows)
        (folder / split).mkdir(parents=True, exist_ok=True)
        (folder / f"{split}.raw.json").write_text(json.dumps(rows, indent=2))
        for c in rows:
            (folder / split / f"{c['task_id']}.json").write_text(json.dumps(c, indent=2))
    return counts


def plan_steps(config: dict) -> Iterator[dict]:
    """The demonstrator's steps for a task: its template's plan filled with the instance's values. A step whose
    `name` fills to "" is skipped (an option the product does not have, e.g. a size for a mug)."""
    template = TEMPLATES.get(config.get("intent_template_id"))
    if template is None:
        raise KeyError(f"task {config.get('task_id')}: intent_template_id {config.get('intent_template_id')!r} has "
                       "no plan (only the tasks built by rlfactory.envs.web.tasks.build have one)")
    values = {**config["instantiation_dict"], **config.get("demo", {})}
    for step in template.plan:
        filled = {k: v.format_map(values) if isinstance(v, str) else v for k, v in step.items()}
        if "name" in filled and not filled["name"]:
            continue
        yield filled


def webarena_action(step: dict, element_id: int | str | None = None) -> str:
    """A plan step as WebArena's action text, once the browser has resolved its element's id (`click [12]`,
    `type [7] [red shirt] [1]`, `goto [url]`, `stop [answer]`)."""
    action = step["action"]
    if action == "stop":
        return f"stop [{step.get('answer', '')}]"
    if action == "goto":
        return f"goto [{step['url']}]"
    if element_id is None:
        raise ValueError(f"plan step {step!r} needs the id of its element ({step.get('role')} {step.get('name')!r})")
    if action == "click":
        return f"click [{element_id}]"
    if action == "type":
        return f"type [{element_id}] [{step['text']}] [{int(bool(step.get('press_enter')))}]"
    raise ValueError(f"plan step {step!r}: unknown action {action!r}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write the web tasks as WebArena config files.")
    parser.add_argument("--out", required=True, type=Path, help="folder for <split>.raw.json and <split>/<id>.json")
    parser.add_argument("--seed", type=int, default=0, help="content seed of the sites")
    args = parser.parse_args(argv)
    counts = write_tasks(args.out, args.seed)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
