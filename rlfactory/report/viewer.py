"""A self-contained HTML transcript viewer: one file (inline CSS and JS, no external assets) that opens in any browser.

A branched group (`rollout.branching`) is shown as a tree above its trajectories (roots, branches, rewards), and a later
branch folds the turns it shares with its root. Each trajectory shows its prompt, its turns (policy tokens highlighted,
tool/template tokens greyed: the loss mask made visible), the tool calls with arguments, latency, cache hits and errors,
the finish reason, and the reward with its components when present. The images the policy saw appear inline where
it saw them (transcript_images.py: a tool's at its tool turn, a prompt's at the prompt); a tool turn longer than
`FOLD_LINES` lines or `FOLD_CHARS` characters (a web page's accessibility tree) shows its start with the rest folded
under a click. Filters narrow the list by finish reason, reward range and text (folded text included); a toggle
switches a trajectory to a per-token view (one box per token, coloured by its mask bit) when token texts were
supplied.

Everything is rendered server-side with `html.escape`; the JS only filters and toggles, and the per-token data sits
in `<script type="application/json">` blocks with `<`, `>` and `&` escaped, so transcript text cannot inject markup.

Left out: live updates and charts (the dashboard, dashboard.py, embeds single trajectories from here).
"""
from __future__ import annotations

import html
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from rlfactory.report.transcript_images import CSS as _IMAGES_CSS
from rlfactory.report.transcript_images import TrajectoryFigures
from rlfactory.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{position:sticky;top:0;background:#1d2330;color:#fff;padding:10px 16px;z-index:2}
header h1{font-size:17px;margin:0 0 6px}
header label{margin-right:12px}
header input,header select{font-size:13px}
#count{margin-left:8px;opacity:.8}
main{padding:12px 16px}
.traj{background:#fff;border:1px solid #d6dae1;border-radius:6px;margin:0 0 14px;padding:10px 12px}
.traj.hidden{display:none}
.meta{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;font-size:13px}
.badge{border-radius:10px;padding:1px 8px;font-weight:600;background:#e4e7ec}
.badge.stop,.badge.env_done{background:#cdeccf}.badge.error{background:#f7c6c6}.badge.max_turns{background:#fde6b3}
.badge.token_budget,.badge.context_length{background:#e3d4f5}
.err{color:#a40000;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
.turn{margin:6px 0;border-left:4px solid #999;padding:2px 8px}
.turn .who{font-size:12px;font-weight:600;color:#555}
.turn pre{margin:2px 0;white-space:pre-wrap;word-break:break-word;font:12.5px/1.4 ui-monospace,monospace}
.turn.mask1{border-color:#2f7de1;background:#eef5ff}
.turn.mask0{border-color:#aaa;background:#f1f1f1;color:#666}
.turn.mixed{border-color:#d00;background:#fff0f0}
.calls{font-size:12px;margin:2px 0 4px 12px}
.calls .c{font-family:ui-monospace,monospace}
.calls .bad{color:#a40000}
.tok{border:1px solid #ccd;border-radius:3px;padding:0 1px;margin:0 1px 1px 0;display:inline-block;
     white-space:pre;font:12px ui-monospace,monospace}
.tok.m1{background:#d7e8ff}.tok.m0{background:#e6e6e6;color:#666}
.tokens{display:none}.show-tokens .tokens{display:block}.show-tokens .turns{display:none}
details{margin:4px 0}summary{cursor:pointer;font-size:13px;color:#333}
.tree{background:#fff;border:1px dashed #8a94a6;border-radius:6px;margin:0 0 10px;padding:6px 12px;font-size:13px}
.tree ul{margin:2px 0;padding-left:18px}.turn.shared{border-left-style:dashed}
.turn details.rest{margin:0}.turn details.rest summary{font-size:12px;color:#555}
""" + _IMAGES_CSS

_JS = """
(function(){
  var trajs = Array.prototype.slice.call(document.querySelectorAll('.traj'));
  var fr = document.getElementById('f-finish'), rmin = document.getElementById('f-rmin'),
      rmax = document.getElementById('f-rmax'), q = document.getElementById('f-text'),
      count = document.getElementById('count');
  function apply(){
    var shown = 0, lo = parseFloat(rmin.value), hi = parseFloat(rmax.value), text = q.value.toLowerCase();
    trajs.forEach(function(t){
      var ok = !fr.value || t.dataset.finish === fr.value;
      var r = t.dataset.reward === '' ? NaN : parseFloat(t.dataset.reward);
      if (!isNaN(lo)) ok = ok && !isNaN(r) && r >= lo;
      if (!isNaN(hi)) ok = ok && !isNaN(r) && r <= hi;
      if (ok && text) ok = t.textContent.toLowerCase().indexOf(text) >= 0;
      t.classList.toggle('hidden', !ok);
      if (ok) shown++;
    });
    count.textContent = shown + ' / ' + trajs.length + ' shown';
  }
  [fr, rmin, rmax, q].forEach(function(el){ el.addEventListener('input', apply); });
  function buildTokens(t){
    var box = t.querySelector('.tokens');
    if (box.dataset.built) return;
    var data = JSON.parse(t.querySelector('script.tokdata').textContent);
    data.forEach(function(tok){
      var s = document.createElement('span');
      s.className = 'tok m' + tok[1];
      s.textContent = tok[0];
      s.title = 'id ' + tok[2] + ' · mask ' + tok[1] + (tok[1] ? ' · logprob ' + tok[3] : '');
      box.appendChild(s);
    });
    box.dataset.built = '1';
  }
  document.querySelectorAll('button.toggle').forEach(function(b){
    b.addEventListener('click', function(){
      var t = b.closest('.traj');
      buildTokens(t);
      t.classList.toggle('show-tokens');
      b.textContent = t.classList.contains('show-tokens') ? 'turn view' : 'token view';
    });
  });
  // Filters and the token view can be preset from the URL (#finish=error&rmin=0.5&text=foo&tokens=1): shareable
  // links, and how the headless-browser test drives the page.
  var params = new URLSearchParams(location.hash.replace(/^#/, ''));
  if (params.has('finish')) fr.value = params.get('finish');
  if (params.has('rmin')) rmin.value = params.get('rmin');
  if (params.has('rmax')) rmax.value = params.get('rmax');
  if (params.has('text')) q.value = params.get('text');
  if (params.get('tokens') === '1') trajs.forEach(function(t){
    buildTokens(t); t.classList.add('show-tokens'); t.querySelector('button.toggle').textContent = 'turn view';
  });
  window.rlfactoryViewer = {buildTokens: buildTokens, apply: apply};
  apply();
})();
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _json_for_script(data: Any) -> str:
    # Inside <script> only "</" could end the element; escaping <, > and & keeps any text inert.
    return json.dumps(data, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


FOLD_LINES = 40
FOLD_CHARS = 4000
"""A tool turn longer than this shows its first `FOLD_LINES` lines (at most `FOLD_CHARS` characters); the rest is
folded in a `<details>`."""


def _folded_pre(text: str) -> str:
    """`text` in a <pre>, its tail folded when long (a web page's accessibility tree runs to thousands of lines)."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= FOLD_LINES and len(text) <= FOLD_CHARS:
        return f"<pre>{_e(text)}</pre>"
    head = "".join(lines[:FOLD_LINES])[:FOLD_CHARS]
    rest = text[len(head):]
    return (f"<pre>{_e(head)}</pre><details class=\"rest\"><summary>{len(rest.splitlines())} more lines "
            f"({len(rest)} characters)</summary><pre>{_e(rest)}</pre></details>")


def _span_mask_class(mask: list[int]) -> str:
    if mask and all(m == 1 for m in mask):
        return "mask1"
    if all(m == 0 for m in mask):
        return "mask0"
    return "mixed"


def _render_calls(calls: list[Any]) -> str:
    rows = []
    for c in calls:
        args = json.dumps(c.arguments, ensure_ascii=False) if c.arguments is not None else "(unparsed)"
        flags = [f"{c.latency_s * 1000:.0f} ms"]
        if c.cached:
            flags.append("cached")
        cls = "c"
        if c.is_error:
            flags.append(f"error: {c.error_kind or 'tool_error'}")
            cls += " bad"
        rows.append(f'<div class="{cls}">&#8594; {_e(c.name)}({_e(args)}) <i>{_e(", ".join(flags))}</i></div>')
    return f'<div class="calls">{"".join(rows)}</div>' if rows else ""


def _render_trajectory(i: int, t: Trajectory, token_text: Callable[[int], str] | None) -> str:
    reward = "" if t.reward is None else f"{t.reward:.6g}"
    policy_tokens = sum(t.loss_mask)
    meta = [
        f'<span class="badge {_e(t.finish_reason)}">{_e(t.finish_reason)}</span>',
        f"<b>{_e(t.id)}</b>",
    ]
    if t.task_id is not None:
        meta.append(f"task {_e(t.task_id)}")
    if t.group_id is not None:
        meta.append(f"group {_e(t.group_id)} #{t.sample_index}")
    b = t.branch
    if b is not None:
        meta.append(f"root {b.root} · branch {b.child} · {b.prefix_turns} turns ({b.prefix_tokens} tokens) shared")
    meta.append(f"reward <b>{_e(reward or '–')}</b>")
    if t.reward_components:
        comps = ", ".join(f"{k}={v:.4g}" for k, v in t.reward_components.items())
        meta.append(f'<span class="components">{_e(comps)}</span>')
    if t.reward_failed:
        meta.append('<span class="err">reward failed</span>')
    meta.append(f"{t.num_turns} turns" + (f" / horizon {t.horizon}" if t.horizon is not None else ""))
    meta.append(f"{len(t.prompt_ids)} prompt + {len(t.response_ids)} response tokens ({policy_tokens} policy)")
    figures = TrajectoryFigures(t)
    if len(figures):
        meta.append(f"{len(figures)} image{'s' if len(figures) != 1 else ''}")
    if t.timings:
        meta.append(_e(" ".join(f"{k}={v:.2f}" for k, v in t.timings.items())))

    prompt_msgs = []
    for m in t.messages:
        if m.get("role") in ("assistant", "tool"):
            break
        prompt_msgs.append(f'<div class="who">{_e(m.get("role", "?"))}</div><pre>{_e(m.get("content", ""))}</pre>')
    parts = [f'<div class="meta">{"".join(f"<span>{m}</span>" for m in meta)}'
             f'<button class="toggle" type="button">token view</button></div>']
    if t.error:
        parts.append(f'<div class="err">{_e(t.error)}</div>')
    if prompt_msgs:
        parts.append(f'<details><summary>prompt</summary>{"".join(prompt_msgs)}</details>')
    parts.append(figures.at(None))  # the prompt's pictures (a pixel environment's first view): shown, not folded
    if t.task.get("answer") is not None:
        parts.append(f'<div class="meta">expected answer: <code>{_e(t.task["answer"])}</code></div>')

    calls_by_turn: dict[int, list[Any]] = {}
    for c in t.tool_calls:
        calls_by_turn.setdefault(c.turn, []).append(c)
    turns_html, shared_html, assistant_index = [], [], 0
    shared_end = b.prefix_tokens if b is not None else 0
    for span in t.turns:
        mask_cls = _span_mask_class(t.loss_mask[span.start:span.end])
        who = "assistant (policy tokens, mask 1)" if span.role == "assistant" else "tool / template (mask 0)"
        shared = span.end <= shared_end
        if shared:
            who += " · the root's, shared by its branches"
        body = f'<div class="who">{_e(who)} · tokens {span.start}–{span.end}</div>'
        if span.role == "assistant":
            body += f"<pre>{_e(span.text)}</pre>" + _render_calls(calls_by_turn.get(assistant_index, []))
            assistant_index += 1
        else:  # the results of the last assistant turn's calls, and the images they returned
            body += _folded_pre(span.text) + (figures.at(assistant_index - 1) if assistant_index else "")
        (shared_html if shared and b is not None and b.child > 0 else turns_html).append(
            f'<div class="turn {span.role} {mask_cls}{" shared" if shared else ""}">{body}</div>')
    if shared_html:  # a later branch: its root's turns folded (branch 0 shows them)
        turns_html.insert(0, f'<details><summary>the root\'s {b.prefix_turns} turns (shared)</summary>'
                             f'{"".join(shared_html)}</details>')
    parts.append(f'<div class="turns">{"".join(turns_html)}</div>')

    if token_text is not None:
        toks = [
            [token_text(tid), m, tid, round(lp, 4)]
            for tid, m, lp in zip(t.response_ids, t.loss_mask, t.logprobs or [0.0] * len(t.response_ids))
        ]
        note = ""
    else:
        toks = [[f"#{tid}", m, tid, 0] for tid, m in zip(t.response_ids, t.loss_mask)]
        note = '<div class="who">(token ids only: no tokenizer was given to the viewer)</div>'
    parts.append(f'<div class="tokens">{note}</div><script type="application/json" class="tokdata">'
                 f"{_json_for_script(toks)}</script>")
    return (f'<section class="traj" id="t{i}" data-finish="{_e(t.finish_reason)}" data-reward="{_e(reward)}">'
            f'{"".join(parts)}</section>')


VIEWER_CSS = _CSS
"""The viewer's styles, for pages that embed single trajectories (the dashboard)."""


def trajectory_html(t: Trajectory, *, index: int = 0, token_text: Callable[[int], str] | None = None) -> str:
    """One trajectory's `<section class="traj">` as the viewer renders it (turns, calls, reward, per-token data)."""
    return _render_trajectory(index, t, token_text)


def token_text_of(tokenizer: Any | None) -> Callable[[int], str] | None:
    """`token_text(id)` for the per-token view from a tokenizer (None without one: the view shows ids)."""
    if tokenizer is None:
        return None
    return lambda tid: tokenizer.decode([tid], skip_special_tokens=False)


def _trees(trajs: list[Trajectory], link: Callable[[int, Trajectory], str] = lambda i, t: f'href="#t{i}"'
           ) -> dict[int, str]:
    """For each branched group, its tree (roots, their branches with reward and finish, linked), keyed by the index of
    the group's first trajectory: shown above it. `link(i, t)`: the attributes of branch i's link (an anchor on the
    viewer's page by default)."""
    groups: dict[str | None, list[int]] = {}
    for i, t in enumerate(trajs):
        if t.branch is not None:
            groups.setdefault(t.group_id, []).append(i)
    out = {}
    for gid, members in groups.items():
        roots: dict[int, list[int]] = {}
        for i in members:
            roots.setdefault(trajs[i].branch.root, []).append(i)
        items = []
        for r, leaves in sorted(roots.items()):
            first = trajs[leaves[0]].branch
            branches = "".join(
                f'<li><a {link(i, trajs[i])}>branch {trajs[i].branch.child}</a> · {_e(trajs[i].finish_reason)} · '
                f'reward {_e("–" if trajs[i].reward is None else f"{trajs[i].reward:.4g}")} · '
                f"{trajs[i].num_turns - first.prefix_turns} turns of its own</li>" for i in leaves)
            items.append(f"<li>root {r}: {first.prefix_turns} turns shared ({first.prefix_tokens} tokens)"
                         f"<ul>{branches}</ul></li>")
        out[members[0]] = f'<div class="tree"><b>group {_e(gid)}</b> as a tree<ul>{"".join(items)}</ul></div>'
    return out


def group_tree_html(group: list[Trajectory]) -> str:
    """A branched group's tree (`_trees`) for pages that show one trajectory at a time (the dashboard): its links name
    the trajectories by id (`data-id`), for the page to open."""
    return next(iter(_trees(group, lambda i, t: f'data-id="{_e(t.id)}" href="#"').values()), "")


def render_html(
    trajectories: Iterable[Trajectory], *, title: str = "rlfactory rollouts",
    token_text: Callable[[int], str] | None = None,
) -> str:
    """The viewer page as a string. `token_text(id)` gives one token's text for the per-token view."""
    trajs = list(trajectories)
    reasons = Counter(t.finish_reason for t in trajs)
    options = "".join(f'<option value="{_e(r)}">{_e(r)} ({n})</option>' for r, n in sorted(reasons.items()))
    rewards = [t.reward for t in trajs if t.reward is not None]
    summary = f"{len(trajs)} trajectories"
    if rewards:
        summary += f" · mean reward {sum(rewards) / len(rewards):.4g}"
    controls = (
        f'<label>finish <select id="f-finish"><option value="">all</option>{options}</select></label>'
        '<label>reward ≥ <input id="f-rmin" type="number" step="any" size="5"></label>'
        '<label>reward ≤ <input id="f-rmax" type="number" step="any" size="5"></label>'
        '<label>text <input id="f-text" type="search" size="18"></label><span id="count"></span>'
    )
    trees = _trees(trajs)
    body = "".join(trees.get(i, "") + _render_trajectory(i, t, token_text) for i, t in enumerate(trajs))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>{_e(title)}</h1><div class="summary">{_e(summary)}</div>{controls}</header>'
        f"<main>{body}</main><script>{_JS}</script></body></html>"
    )


def write_html(
    trajectories: Iterable[Trajectory], path: str | Path, *, title: str = "rlfactory rollouts",
    tokenizer: Any | None = None,
) -> Path:
    """Write the viewer for `trajectories` to `path` (one self-contained file). With `tokenizer`, the per-token view
    shows token texts; without, token ids."""
    token_text = token_text_of(tokenizer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(trajectories, title=title, token_text=token_text), encoding="utf-8")
    logger.info("wrote transcript viewer %s", path)
    return path
