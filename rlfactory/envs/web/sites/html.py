"""Server-side HTML for the sites: a page layout and small builders for links, forms and labelled controls.

Plain semantic HTML (landmarks, headings, `<label for>` on every control, buttons with text), no JavaScript, so a
browser's accessibility tree names every element an agent needs. Every value is escaped here or by the caller with
`esc`. Left out: styling beyond a few inline rules and any client-side behaviour.
"""
from __future__ import annotations

import html
from urllib.parse import urlencode

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:auto;padding:0 1em}nav a{margin-right:1em}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em}")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def link(href: str, text: object, **attrs: str) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return f'<a href="{esc(href)}"{extra}>{esc(text)}</a>'


def url(path: str, **params: object) -> str:
    """`path` with the non-empty `params` as its query string (in the given order)."""
    query = urlencode([(k, v) for k, v in params.items() if v not in (None, "")])
    return f"{path}?{query}" if query else path


def textbox(name: str, label: str, value: object = "", *, kind: str = "text", field_id: str | None = None) -> str:
    fid = field_id or f"f-{name}"
    return (f'<p><label for="{fid}">{esc(label)}</label> '
            f'<input type="{kind}" id="{fid}" name="{esc(name)}" value="{esc(value)}"></p>')


def textarea(name: str, label: str, value: object = "", field_id: str | None = None) -> str:
    fid = field_id or f"f-{name}"
    return (f'<p><label for="{fid}">{esc(label)}</label><br>'
            f'<textarea id="{fid}" name="{esc(name)}" rows="4" cols="60">{esc(value)}</textarea></p>')


def radios(name: str, legend: str, options: list[tuple[str, str]], checked: str | None = None) -> str:
    """A fieldset of radio buttons; `options` are (value, label) pairs."""
    items = []
    for i, (value, label) in enumerate(options):
        fid = f"f-{name}-{i}"
        on = " checked" if value == checked else ""
        items.append(f'<input type="radio" id="{fid}" name="{esc(name)}" value="{esc(value)}"{on}>'
                     f'<label for="{fid}">{esc(label)}</label> ')
    return f"<fieldset><legend>{esc(legend)}</legend>{''.join(items)}</fieldset>"


def form(action: str, body: str, button: str, *, method: str = "post", hidden: dict | None = None,
         label: str | None = None) -> str:
    fields = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in (hidden or {}).items())
    aria = f' aria-label="{esc(label)}"' if label else ""
    return (f'<form method="{method}" action="{esc(action)}"{aria}>{fields}{body}'
            f'<button type="submit">{esc(button)}</button></form>')


def page(title: str, site: str, home: str, nav: list[tuple[str, str]], body: str, *,
         search_action: str | None = None, query: str = "", message: str = "") -> str:
    links = " ".join(link(href, text) for href, text in nav)
    search = ""
    if search_action:
        search = (f'<form method="get" action="{esc(search_action)}" role="search">'
                  f'<label for="search">Search</label> <input type="search" id="search" name="q" '
                  f'value="{esc(query)}"> <button type="submit">Search</button></form>')
    note = f'<p role="status">{esc(message)}</p>' if message else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)} - {esc(site)}</title>'
            f'<style>{STYLE}</style></head><body><header><p>{link(home, site)}</p>'
            f'<nav aria-label="Main">{links}</nav>{search}</header><main>{note}{body}</main>'
            f'<footer><p>{esc(site)} runs locally for agent training.</p></footer></body></html>')


def error_page(status: int, detail: str, home: str | None = None) -> str:
    titles = {400: "Bad request", 403: "Forbidden", 404: "Page not found", 405: "Method not allowed"}
    title = titles.get(status, "Error")
    back = f"<p>{link(home, 'Back to the home page')}</p>" if home else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status} {esc(title)}</title></head>'
            f'<body><main><h1>{esc(title)}</h1><p>{esc(detail)}</p>{back}</main></body></html>')
