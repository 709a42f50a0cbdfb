"""What a web warm start has learned, turn by turn, on pages it never trained on (teacher-forced).

    python bench/web_warm_start.py --model models/web-copier [--model DIR ...] --content-seed 16 --json PATH

The scripted demonstrator plays the web learning recipe's training tasks (recipes/web_learn_sft.yaml's six shop
templates) through the real web server at `--content-seed` (other products, prices and reviews than the seeds a
warm start trained on: 0-7 for stage 1, 8-15 for stage 2), ~2.5 min through the browser. Each demonstration is then
fed to the model whole, and a turn counts as right when the model's most likely next token is the demonstration's at
every one of the turn's tokens (what greedy decoding would write, given the right history). Reported:
`turn_right_<action>` for `type` (the product's name typed into the search box), `click` (its result) and `stop`
(the answer the product page shows), `name_word_right` (each word of the typed name, first to last), `name_right`
(the whole name), `answer_token_right` (each token of the answer's value: progress short of whole answers) and
`stop_right_by_question` (the answer turn per question asked). Figures move by ~0.01 between runs: the pages' URLs
carry the run's port and episode ids, so the demonstrations' tokens differ. The held-out success of `rlfactory sft`'s
check says whether a start works; these say which step it fails at.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "web_learn_sft.yaml"
_ACTION = re.compile(r'"action": "(\w+)')
_TYPED = re.compile(r"type \[\d+\] \[(.+?)\]")


def demonstrations(recipe: Any, sft: Any, content_seed: int, out: Path) -> list[dict[str, Any]]:
    """The demonstrator's transcripts of the recipe's first demo set (its training tasks), played at `content_seed`
    through the real server."""
    from rlfactory.warmup.run import make_demo_sets

    demo = sft.demos[0].model_copy(update={"name": f"seed{content_seed}",
                                           "server_args": {"web": ["--seed", str(content_seed)]}})
    return asyncio.run(make_demo_sets(recipe, sft.model_copy(update={"demos": [demo]}), out))[demo.name]


def score(model_dir: Path, demos: list[dict[str, Any]], system_prompt: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.warmup.sft import encode_example, policy_turns

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    chat = ChatFormat(tok, demos[0]["tools"], enable_thinking=False, system_prompt=system_prompt)
    turns: dict[str, list[int]] = {}
    words: list[list[int]] = []
    names: list[int] = []
    answers: dict[str, list[int]] = {}  # the question (the intent up to the product's name) -> stop turn right
    answer_tokens: list[int] = []
    for demo in demos:
        ids, mask = encode_example(chat, demo["messages"])[:2]
        question = "?"
        with torch.no_grad():
            pred = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
        right = [i > 0 and pred[i - 1] == ids[i] for i in range(len(ids))]
        actions = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
        for (a, b), action in zip(policy_turns(mask), actions):
            kind = m.group(1) if (m := _ACTION.search(action)) else "other"
            turns.setdefault(kind, []).append(int(all(right[a:b])))
            if kind == "type" and (typed := _TYPED.search(action)):
                per_word = _word_right(tok, ids[a:b], right[a:b], typed.group(1))
                if per_word is not None:
                    words.append(per_word)
                    names.append(int(all(per_word)))
                question = _question(demo["messages"], typed.group(1))
            if kind == "stop":
                answers.setdefault(question, []).append(int(all(right[a:b])))
                value = _value_span(tok, ids[a:b])
                answer_tokens += [int(right[a + k]) for k in value]
    longest = max((len(w) for w in words), default=0)
    return {
        "transcripts": len(demos),
        **{f"turn_right_{k}": round(sum(v) / len(v), 3) for k, v in sorted(turns.items())},
        "name_word_right": [round(sum(w[i] for w in words if len(w) > i) / sum(len(w) > i for w in words), 3)
                            for i in range(longest)],
        "name_right": round(sum(names) / len(names), 3) if names else None,
        "answer_token_right": round(sum(answer_tokens) / len(answer_tokens), 3) if answer_tokens else None,
        "stop_right_by_question": {q: round(sum(v) / len(v), 3) for q, v in sorted(answers.items())},
    }


def _question(messages: list[dict[str, Any]], name: str) -> str:
    """The task's question up to the product's name ('What is the price of the'), from the intent line."""
    intent = next((line for m in messages if m["role"] == "user" and isinstance(m["content"], str)
                   for line in m["content"].splitlines() if line.startswith("Task: ")), "")
    return intent.removeprefix("Task: ").split(name)[0].strip() or "?"


def _value_span(tok: Any, ids: list[int]) -> list[int]:
    """Offsets, inside a stop turn's `ids`, of the tokens that write the answer between `stop [` and `]`."""
    ends = _char_ends(tok, ids)
    text = tok.decode(ids)
    a = text.find("stop [")
    if a < 0:
        return []
    a += len("stop [")
    return _covering(ends, a, text.find("]", a))


def _word_right(tok: Any, ids: list[int], right: list[bool], name: str) -> list[int] | None:
    """Per word of `name` inside the turn `ids`: 1 when every token overlapping the word is right."""
    ends = _char_ends(tok, ids)
    start = tok.decode(ids).find(f"[{name}]")
    if start < 0:
        return None
    out, pos = [], start + 1
    for word in name.split(" "):
        out.append(int(all(right[k] for k in _covering(ends, pos, pos + len(word)))))
        pos += len(word) + 1
    return out


def _char_ends(tok: Any, ids: list[int]) -> list[int]:
    """For each token of `ids`, where its text ends in the decoded turn."""
    return [len(tok.decode(ids[: k + 1])) for k in range(len(ids))]


def _covering(ends: list[int], a: int, b: int) -> list[int]:
    """The tokens whose text overlaps characters [a, b)."""
    return [k for k in range(len(ends)) if (ends[k - 1] if k else 0) < b and ends[k] > a]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, action="append",
                   help="a warm start's folder (repeatable: each scored on the same demonstrations; default "
                        "models/web-copier)")
    p.add_argument("--content-seed", type=int, default=16, help="the site content the demonstrations play on")
    p.add_argument("--transcripts", type=int, default=149, help="how many of the demonstrations to score")
    p.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = p.parse_args()
    models = args.model or [REPO / "models" / "web-copier"]
    from rlfactory.warmup.run import load_sft_recipe

    recipe, sft = load_sft_recipe(RECIPE)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlf-web-warm-") as tmp:
        demos = demonstrations(recipe, sft, args.content_seed, Path(tmp))[: args.transcripts]
    demo_s = time.perf_counter() - t0
    scores = {str(m): score(m, demos, recipe.rollout.system_prompt or "") for m in models}
    result = {"content_seed": args.content_seed, "demonstrations_s": round(demo_s, 1), "models": scores,
              "wall_s": round(time.perf_counter() - t0, 1)}
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
