"""`OriginPolicy`: which URLs an episode's browser may reach — the one owner of that rule.

An episode is opened with a list of base URLs (its sites); only their origins (scheme, host, port) are reachable.
`about:blank` is allowed (a new tab starts there); `file:`, `data:`, `javascript:`, `chrome:` and every other
scheme or origin are not. Paths in the base URLs are ignored (containment is per origin, as the browser's own
same-origin rule is) unless the policy is made with `confine_paths=True`: then a URL must also start with one of the
base URLs (the web environment's episodes share one site server and differ by path, `/e/<episode>/`).
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """`scheme://host:port` of an http(s) URL (default ports made explicit), else None."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a malformed port
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return f"{scheme}://{parts.hostname.lower()}:{port or _DEFAULT_PORTS[scheme]}"


@dataclass(frozen=True)
class OriginPolicy:
    """The origins one episode may reach."""

    origins: frozenset[str]
    prefixes: frozenset[str] = frozenset()
    """With `confine_paths`: the base URLs (origin made explicit) a reachable URL must start with."""

    @classmethod
    def of(cls, base_urls: list[str] | tuple[str, ...], confine_paths: bool = False) -> OriginPolicy:
        """From base URLs such as `http://127.0.0.1:8001/`; raises ValueError naming a URL that is not http(s)."""
        origins, prefixes = set(), set()
        for url in base_urls:
            origin = origin_of(url)
            if origin is None:
                raise ValueError(f"allowed origin {url!r} is not an http(s) URL like http://127.0.0.1:8001")
            origins.add(origin)
            if confine_paths:
                prefixes.add(origin + urlsplit(url.strip()).path)
        if not origins:
            raise ValueError("an episode needs at least one allowed origin (its sites' base URLs)")
        return cls(frozenset(origins), frozenset(prefixes))

    def allows(self, url: str) -> bool:
        if url.strip() == "about:blank":
            return True
        origin = origin_of(url)
        if origin is None or origin not in self.origins:
            return False
        path = urlsplit(url.strip()).path
        # A browser asks every origin for /favicon.ico by itself: not the policy's doing, nothing to note.
        return not self.prefixes or path == "/favicon.ico" or any((origin + path).startswith(p) for p in self.prefixes)

    def refusal(self, url: str, base: str | None = None) -> str | None:
        """Why `url` (relative to `base`) may not be reached, or None when it may."""
        full = urljoin(base, url) if base else url
        if self.allows(full):
            return None
        return f"{_short(full)} is outside this episode's sites ({', '.join(sorted(self.prefixes or self.origins))})"


def _short(url: str, limit: int = 120) -> str:
    return url if len(url) <= limit else url[:limit] + "…"
