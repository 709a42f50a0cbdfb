"""Which `Host` headers the dashboard answers: its guard against DNS rebinding.

A web page on another site can make the browser resolve its own name to 127.0.0.1 and then read the dashboard as if
it were that site; the one thing that gives it away is the Host header, which still names the attacker's domain. So
the dashboard answers only Host values that name where it listens: `localhost`, 127.0.0.1 and [::1] (with its port,
or none), the host it was told to bind, and any the user allows (`--allow-host`). Bound to every interface (0.0.0.0,
::) it cannot know every name the machine goes by, so it also accepts this machine's host names and any IP literal:
rebinding needs a domain name, an address in the Host header cannot be one.

Left out: authentication (there is none; `is_loopback` lets the command line warn when the page is reachable from
other machines), TLS, and proxies that rewrite Host (allow their name with --allow-host, or `*` to turn the guard off).
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_EVERY_INTERFACE = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server to this machine (127.0.0.0/8, ::1, localhost)."""
    name = _bare(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _bare(host: str) -> str:
    """A host name as compared: lower case, without [] around an IPv6 address or a trailing dot."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.removesuffix(".")


def _split(header: str) -> tuple[str, int | None] | None:
    """`name[:port]` from a Host header (IPv6 in brackets), or None when it cannot be one."""
    value = header.strip()
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            return None
        name, rest = value[1:close], value[close + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text = value.partition(":")
        port_text = port_text if colon else None
    if port_text is not None:
        if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536):
            return None
        return _bare(name), int(port_text)
    return _bare(name), None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


@dataclass
class HostGuard:
    """The Host values one dashboard server answers; `problem(header)` says why one is refused (None: accepted)."""

    bind_host: str
    port: int
    extra: list[str] = field(default_factory=list)  # from --allow-host: "name" (any port) or "name:port"; "*": all

    def __post_init__(self) -> None:
        self._names = {_bare(n) for n in _LOOPBACK_NAMES}
        self._any_ip = _bare(self.bind_host) in _EVERY_INTERFACE
        if self._any_ip:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    self._names.add(_bare(name))
        else:
            self._names.add(_bare(self.bind_host))
        self._open = "*" in self.extra
        self._extra: set[tuple[str, int | None]] = set()
        for item in self.extra:
            if item == "*":
                continue
            parsed = _split(item)
            if parsed is None or not parsed[0]:
                raise ValueError(f"--allow-host {item!r}: give a host name or address, optionally with :PORT "
                                 f"(e.g. dash.example.org or dash.example.org:443)")
            self._extra.add(parsed)

    def problem(self, header: str | None) -> str | None:
        if self._open:
            return None
        if not header:
            return "the request has no Host header; the dashboard answers only requests that name it"
        parsed = _split(header)
        if parsed is not None:
            name, port = parsed
            if (name, port) in self._extra or (name, None) in self._extra:
                return None
            if port in (None, self.port) and (name in self._names or (self._any_ip and _is_ip(name))):
                return None
        return (f"this dashboard answers to {self.describe()}, not Host {header[:200]!r}: a page on another site "
                f"may be trying to read it through DNS rebinding. If you reach it by that name on purpose, start it "
                f"with --allow-host {(_bare(parsed[0]) if parsed else 'NAME')}")

    def describe(self) -> str:
        shown = sorted(f"[{n}]" if ":" in n else n for n in self._names)
        text = ", ".join(f"{n}:{self.port}" for n in shown)
        if self._any_ip:
            text += f", any IP address:{self.port}"
        if self._extra:
            text += ", " + ", ".join(sorted(f"{n}:{p}" if p else n for n, p in self._extra))
        return text
