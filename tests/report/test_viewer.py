"""The HTML transcript viewer: one self-contained file, rendered in real headless Chromium, XSS-safe."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from browser import chromium_path

from rlfactory.report.viewer import render_html, write_html
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan

XSS = '<img src=x onerror="document.title=\'pwned\'"></pre><script>document.title="pwned"</script>'


def _dump_dom(url: str, tmp: Path) -> str:
    exe = chromium_path()
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp / 'chrome-profile'}", "--virtual-time-budget=3000", "--dump-dom", url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _trajectories() -> list[Trajectory]:
    # Response: assistant turn (3 policy tokens), tool turn (4 template/tool tokens), final assistant turn (2).
    a = Trajectory(
        id="traj-a", task_id="q1", group_id="g0", sample_index=0, prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 12, 20, 21, 22, 23, 30, 31], loss_mask=[1, 1, 1, 0, 0, 0, 0, 1, 1],
        logprobs=[-0.5, -0.1, -0.2, 0.0, 0.0, 0.0, 0.0, -1.0, -0.3],
        turns=[TurnSpan(role="assistant", start=0, end=3, text='<tool_call>{"name": "calculator"}</tool_call>'),
               TurnSpan(role="tool", start=3, end=7, text="<tool_response>\n" + XSS + "\n</tool_response>"),
               TurnSpan(role="assistant", start=7, end=9, text="The answer is 42")],
        tool_calls=[ToolCallRecord(turn=0, name="calculator", arguments={"expression": XSS}, result=XSS,
                                   latency_s=0.012, cached=True)],
        finish_reason="stop", messages=[{"role": "user", "content": "What is 6*7? " + XSS}],
        task={"prompt": "What is 6*7?", "answer": "42"}, horizon=4, reward=1.0,
        reward_components={"exact_match": 1.0, "format": 0.5}, timings={"total_s": 0.5},
    )
    b = Trajectory(
        id="traj-b", task_id="q2", prompt_ids=[1], response_ids=[40, 41], loss_mask=[1, 1], logprobs=[-0.1, -0.2],
        turns=[TurnSpan(role="assistant", start=0, end=2, text="hmm")], finish_reason="error",
        error="RuntimeError: " + XSS, reward=0.0,
    )
    c = Trajectory(id="traj-c", prompt_ids=[1], response_ids=[50], loss_mask=[1], logprobs=[-0.1],
                   turns=[TurnSpan(role="assistant", start=0, end=1, text="x")], finish_reason="max_turns")
    return [a, b, c]


def test_static_html_is_self_contained_and_escaped():
    page = render_html(_trajectories(), title="t <b>itle</b>")
    assert "<img src=x" not in page and "<script>document.title" not in page
    assert "&lt;img src=x" in page
    # no external assets: nothing is loaded from a URL
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:|//)', page)
    assert page.count('class="traj"') == 3
    # the per-token payload sits in script blocks that no transcript text can close
    for block in re.findall(r'<script type="application/json" class="tokdata">(.*?)</script>', page, re.S):
        assert "<" not in block


def test_chromium_renders_turns_mask_and_filters(tmp_path):
    class _Tok:  # per-token texts for the token view: a tiny stand-in for tokenizer.decode
        def decode(self, ids, skip_special_tokens=False):
            return "<tok%d>" % ids[0] if ids[0] != 21 else XSS

    path = write_html(_trajectories(), tmp_path / "view.html", title="viewer test", tokenizer=_Tok())
    dom = _dump_dom(path.as_uri(), tmp_path)
    # the payload stayed text: the title is unchanged, no <img> element, no injected script ran
    assert "<title>viewer test</title>" in dom and "<img" not in dom and "<script>document" not in dom
    assert len(re.findall(r'<section class="traj[ "]', dom)) == 3
    # the loss mask is visible: policy turns and tool turns carry their mask classes
    assert len(re.findall(r'class="turn assistant mask1"', dom)) == 4
    assert len(re.findall(r'class="turn tool mask0"', dom)) == 1
    assert "calculator" in dom and "cached" in dom and "exact_match=1" in dom
    assert "3 / 3 shown" in dom  # the JS ran

    # filters from the URL: only the errored trajectory stays visible; token view built from JSON
    dom = _dump_dom(path.as_uri() + "#finish=error&tokens=1", tmp_path)
    assert "1 / 3 shown" in dom
    sections = re.findall(r'<section class="([^"]*)" id="(t\d)"', dom)
    assert [tid for cls, tid in sections if "hidden" not in cls.split()] == ["t1"]
    assert all("show-tokens" in cls.split() for cls, _ in sections)
    tokens = re.findall(r'<span class="tok (m[01])"[^>]*>([^<]*)</span>', dom)
    assert len(tokens) == 9 + 2 + 1
    assert [m for m, _ in tokens[:9]] == ["m1", "m1", "m1", "m0", "m0", "m0", "m0", "m1", "m1"]
    assert "&lt;tok10&gt;" in dom and "<img" not in dom

    dom = _dump_dom(path.as_uri() + "#rmin=0.5", tmp_path)
    assert "1 / 3 shown" in dom


def test_a_branched_group_shows_as_a_tree_with_the_shared_turns_folded(tmp_path):
    from rlfactory.rollout.trajectory import Branch

    def leaf(k: int, root: int, child: int, reward: float) -> Trajectory:
        own = [60 + k, 61 + k]
        return Trajectory(
            id=f"g/{k}", group_id="g", sample_index=k, prompt_ids=[1], response_ids=[10, 11, 20] + own,
            loss_mask=[1, 1, 0, 1, 1], logprobs=[-0.5, -0.5, 0.0, -0.2, -0.2],
            turns=[TurnSpan(role="assistant", start=0, end=2, text=f"root {root} opens"),
                   TurnSpan(role="tool", start=2, end=3, text="<tool_response>ok</tool_response>"),
                   TurnSpan(role="assistant", start=3, end=5, text=f"branch {child} of root {root} " + XSS)],
            finish_reason="stop", reward=reward,
            branch=Branch(root=root, child=child, prefix_tokens=3, prefix_turns=1))

    trajs = [leaf(0, 0, 0, 1.0), leaf(1, 0, 1, 0.0), leaf(2, 1, 0, 0.5), leaf(3, 1, 1, 0.0)]
    path = write_html(trajs, tmp_path / "tree.html", title="tree")
    dom = _dump_dom(path.as_uri(), tmp_path)
    (tree,) = re.findall(r'<div class="tree">(.*?)</div>', dom, re.S)
    assert "group g" in tree and tree.count("root ") == 2
    assert re.findall(r'href="#(t\d)">branch (\d)', tree) == [("t0", "0"), ("t1", "1"), ("t2", "0"), ("t3", "1")]
    assert "reward 1 " in tree and "1 turns of its own" in tree
    # branch 0 shows its root's turn; a later branch folds it
    assert dom.count("the root's 1 turns (shared)") == 2
    assert "root 0 · branch 1 · 1 turns (3 tokens) shared" in dom
    assert "<img" not in dom
