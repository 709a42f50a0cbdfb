"""The documentation site: `make docs`'s build (strict: a warning fails it) into a temporary folder, its generated
references checked against the code, and the built site opened in a real headless Chromium: the landing page
renders, and Material's search (its own offline index, in a web worker) finds a recipe field.

The screenshot of the search is kept under `$RLFACTORY_TEST_ARTIFACTS` when that is set (CI keeps it)."""
from __future__ import annotations

import functools
import html
import http.server
import os
import re
import subprocess
import sys
import threading
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlfactory.recipe.schema import Recipe
from rlfactory.report.charts import SECTIONS
from rlfactory.report.metric_names import REGISTRY

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "report"))
from browser import Browser  # tests/report/browser.py: the DevTools-protocol Chromium driver


def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def recipe_fields(model: type[BaseModel] = Recipe, prefix: str = "") -> dict[str, str]:
    """Dotted path -> field name, for every field of the Recipe and of the sections under it (through lists, maps and
    unions of sections too)."""
    out = {}
    for name, field in model.model_fields.items():
        out[prefix + name] = name
        for inner in _models(field.annotation):
            out.update(recipe_fields(inner, f"{prefix}{name}."))
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                        "--site-dir", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return out


def _text(page: Path) -> str:
    """A page's text: tags dropped, entities decoded, whitespace runs as one space."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.read_text())).split())


def test_the_recipe_reference_names_every_field_with_its_documentation(site):
    page = _text(site / "reference" / "recipe.html")
    fields = recipe_fields()
    assert len(fields) > 150
    missing = sorted(path for path, name in fields.items() if name not in page)
    assert not missing, f"fields missing from the recipe reference: {missing}"
    # each section's fields, with their documentation beside them (a sample: the first sentence of each docstring)
    for path in ("trainer.max_staleness_steps", "rollout.horizon", "tools.cache.backend", "rewards.failure_value"):
        section, _, name = path.rpartition(".")
        model = Recipe
        for part in section.split("."):
            model = _models(model.model_fields[part].annotation)[0]
        doc = " ".join(model.model_fields[name].description.replace("`", "").split())
        assert doc.split(". ")[0][:60] in page, path


def test_the_cli_reference_names_every_command_and_option(site):
    import typer.main

    from rlfactory.cli.app import app

    page = (site / "reference" / "cli.html").read_text()
    root = typer.main.get_command(app)
    seen = 0

    def walk(cmd, ctx):
        nonlocal seen
        assert f"id=\"{ctx.command_path.replace(' ', '-')}\"" in page, ctx.command_path
        for p in cmd.get_params(ctx):
            for opt in p.opts if p.param_type_name == "option" else []:
                assert opt in page, (ctx.command_path, opt)
        seen += 1
        for name in getattr(cmd, "list_commands", lambda c: [])(ctx):
            sub = cmd.get_command(ctx, name)
            walk(sub, sub.context_class(sub, info_name=name, parent=ctx))

    walk(root, root.context_class(root, info_name="rlfactory"))
    assert seen > 15


def test_the_site_is_built_from_every_page_and_fetches_nothing(site):
    for page in ("index.html", "getting-started/quickstart.html", "guides/mcp-tools.html", "reference/python.html",
                 "reference/metrics.html", "benchmarks/measurements.html", "verl.html"):
        assert (site / page).is_file(), page
    assert "redis_cache" in _text(site / "reference" / "python.html")  # mkdocstrings read the docstrings
    metrics = _text(site / "reference" / "metrics.html")
    assert all(k in metrics for s in SECTIONS for _, _, keys in s["charts"] for k in keys)
    missing = [m.name for m in REGISTRY if f"{m.name} {m.meaning.split()[0]}" not in metrics]
    assert not missing, f"metrics missing from the metrics reference (or without their meaning): {missing}"
    # no fonts or scripts from the network: the site works offline (Material's `font: false`)
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
        assert not re.search(r"<script[^>]+src=\"https?://", text), page


def test_lists_written_for_github_render_as_lists(site):
    """The pages are written for GitHub's Markdown (a list right under a paragraph, two-space nesting);
    docs/_hooks/github_lists.py makes Python-Markdown read them the same, so no paragraph holds a run of dashes."""
    bad = []
    for page in site.rglob("*.html"):
        if "|---|" in page.read_text():  # a table inside a list item that stayed text
            bad.append(f"{page.relative_to(site)}: a table left as text")
        for para in re.findall(r"<p>(.*?)</p>", page.read_text(), re.DOTALL):
            if re.search(r"(?:^|\n)\s*(?:-|\d+\.) \S", para):
                bad.append(f"{page.relative_to(site)}: {para[:80]!r}")
    assert not bad, "\n".join(bad[:10])
    nested = (site / "environments.html").read_text()
    assert re.search(r"<li><strong>BabyAI.</strong>.*?<ul>\s*<li>", nested, re.DOTALL)  # two-space nesting nests


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_the_landing_page_renders_and_search_finds_a_recipe_field_in_chromium(site, tmp_path):
    # Served over HTTP, as a site is: Material's search runs in a web worker, which a file:// page may not start.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = None
    try:
        browser = Browser(tmp_path / "chrome-profile", width=1280, height=900)
        browser.record_script_errors()
        browser.goto(url)
        title = browser.wait_js("document.querySelector('article h1') && document.querySelector('article h1')"
                                ".textContent", 60, "the landing page's title")
        assert "rlfactory" in title
        links = browser.js("Array.from(document.querySelectorAll('nav.md-nav a')).map(a => a.textContent.trim())")
        assert {"Recipe", "Command line", "Python API", "The CPU quickstart"} <= set(links), links

        # Type a recipe field into the search box, as a reader would: focus it, type, let the key go.
        browser.js("document.querySelector('label.md-search__icon, label[for=\"__search\"]').click()")
        browser.js("document.querySelector('input.md-search__input').focus()")
        browser.call("Input.insertText", text="max_staleness_steps")
        browser.call("Input.dispatchKeyEvent", type="keyUp", key="s", code="KeyS")
        hits = browser.wait_js(
            "(function(){var a=Array.from(document.querySelectorAll('.md-search-result__item a'));"
            "return a.length && a.map(function(x){return x.getAttribute('href');});})()", 60, "search results")
        assert any("reference/recipe.html" in h for h in hits), hits
        assert not browser.script_errors()
        shot = browser.screenshot(tmp_path / "docs_site.png")  # kept as a CI artifact
        assert shot.stat().st_size > 10_000
    finally:
        if browser is not None:
            browser.close()
        server.shutdown()
        server.server_close()
