"""The servers a test started, found among this process's descendants by a piece of their command line.

A stopped server its parent has not reaped yet (a zombie), or one gone while the list is read, is not running: reading
its command line would raise, and a test counting servers must not fail on how fast the machine reaps."""
from __future__ import annotations

import psutil


def live_children() -> list[psutil.Process]:
    """Descendants of this process that are running (not zombies, not gone while the list is read)."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def running_children(marker: str) -> list[psutil.Process]:
    """Live descendants of this process whose command line contains `marker`."""
    out = []
    for c in live_children():
        try:
            if marker in " ".join(c.cmdline()):
                out.append(c)
        except psutil.Error:  # gone, a zombie by now, or not ours to read: not one of ours running
            pass
    return out
