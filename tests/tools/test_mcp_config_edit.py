"""Adding a server to an mcpServers file as text (what `rlfactory new-tool` does): the rest of the file keeps its
bytes, the entry follows its neighbours' layout, and files it cannot edit are refused with the reason."""
from __future__ import annotations

import json

import pytest
from mcp_helpers import inserted

from rlfactory.errors import ConfigError
from rlfactory.tools.mcp_config_edit import EMPTY_FILE, add_server

ENTRY = {"command": "python", "args": ["envs/tools/weather.py"], "cwd": ".."}


HAND = (
    '{ "$schema": "https://example.org/mcp.schema.json",\n'
    '  "mcpServers": {\n'
    '      "calculator": {"command": "python", "args": ["-m", "rlfactory.envs.tools.calculator"],\n'
    '                     "rlfactory": {"max_concurrency": 64,   "tool_timeout_s": 10}},\n'
    '      "remote":     {"url": "http://127.0.0.1:8931/mcp", "headers": {"X-Key": "é"}}\n'
    '  }\n'
    '}'  # no newline at the end, as the user left it
)


def test_hand_formatted_file_keeps_every_byte():
    new = add_server(HAND, "weather", ENTRY)
    assert inserted(HAND, new) == (',\n      "weather": {"command": "python", "args": ["envs/tools/weather.py"], '
                                   '"cwd": ".."}')
    assert not new.endswith("\n")
    assert json.loads(new)["mcpServers"] == {**json.loads(HAND)["mcpServers"], "weather": ENTRY}


def test_spread_entries_get_a_spread_entry_at_their_indent():
    old = '{\n\t"mcpServers": {\n\t\t"a": {\n\t\t\t"url": "http://x/mcp"\n\t\t}\n\t}\n}\n'
    new = add_server(old, "weather", ENTRY)
    assert inserted(old, new) == (',\n\t\t"weather": {\n\t\t\t"command": "python",\n'
                                  '\t\t\t"args": ["envs/tools/weather.py"],\n\t\t\t"cwd": ".."\n\t\t}')


@pytest.mark.parametrize("old, expected", [
    ('{"mcpServers": {}}', '{"mcpServers": {"weather": {"command": "python", "args": ["envs/tools/weather.py"], '
                           '"cwd": ".."}}}'),
    ('{\r\n  "mcpServers": {\r\n  }\r\n}\r\n',
     '{\r\n  "mcpServers": {\r\n    "weather": {\r\n      "command": "python",\r\n'
     '      "args": ["envs/tools/weather.py"],\r\n      "cwd": ".."\r\n    }\r\n  }\r\n}\r\n'),
    (EMPTY_FILE, '{\n  "mcpServers": {\n    "weather": {\n      "command": "python",\n'
                 '      "args": ["envs/tools/weather.py"],\n      "cwd": ".."\n    }\n  }\n}\n'),
])
def test_empty_objects(old, expected):
    assert add_server(old, "weather", ENTRY) == expected


def test_compact_object_stays_on_its_line():
    old = '{"mcpServers": {"a": {"url": "http://x/mcp"}}, "$schema": "s"}\n'
    new = add_server(old, "weather", ENTRY)
    assert "\n" not in new.rstrip("\n") and json.loads(new)["mcpServers"]["weather"] == ENTRY
    inserted(old, new)


@pytest.mark.parametrize("text, message", [
    ('{"mcpServers": {"weather": {"url": "http://x/mcp"}}}', "mcpServers.weather already exists"),
    ('{"mcpServers": {"a": {"url": "http://x/mcp"},}}', "invalid JSON at line 1 column 46"),
    ('{"servers": {}}', 'top level must be {"mcpServers": {...}}'),
    ('[]', 'top level must be {"mcpServers": {...}}'),
])
def test_refusals_name_the_file_and_the_reason(text, message):
    with pytest.raises(ConfigError) as e:
        add_server(text, "weather", ENTRY, source="mcp_configs/mine.json")
    assert str(e.value).startswith("mcp_configs/mine.json: ") and message in str(e.value)
