"""The browser of the web environment: real headless Chromium (Debian's, never a downloaded one) driven through
playwright, one process for many episodes and one context per episode, contained to the episode's sites.

- `adapter.py`   the only module that imports playwright: the process, contexts (containment), tabs
- `policy.py`    which URLs an episode may reach
- `proxy.py`     the proxy each context talks through, which forwards only those
- `actions.py`   WebArena's action language, parsed
- `observation.py` the accessibility tree with ids, tabs and URL, cut to a budget
- `episode.py`   one episode: open, act, observe, screenshot, fork, close (async)
- `host.py`      the browser's loop on a thread and a blocking `BrowserEnv` for the MCP server
  (`envs/tools/browser.py`)
- `probe_site.py` a tiny site with one of everything, for tests, the bench and health checks
"""
