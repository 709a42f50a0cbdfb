"""metrics.jsonl lines that must not stop a reader: damaged lines (to be skipped and counted) and odd but valid rows (to
be shown), interleaved with ordinary rows. Shared by the dashboard tests and bench/chaos_dashboard.py."""
from __future__ import annotations

import json
from typing import NamedTuple


class Line(NamedTuple):
    kind: str
    data: bytes  # without its newline
    is_row: bool  # a JSON object the dashboard must show (True) or a bad line it must skip and count (False)


def good_row(step: int) -> dict:
    return {"step": step, "reward/mean": round(0.1 * step, 3), "loss/pg": 0.5 / step, "tools/calls": 2,
            "tools/calculator/calls": 2, "tools/calculator/errors": 0, "rollout/num_turns_mean": 2.0,
            "perf/step_s": 1.5}


def bad_lines(big_line_mb: int = 50) -> list[Line]:
    """Lines that are not one JSON object (each a single line: no newline inside)."""
    deep = 100_000
    return [
        Line("invalid_utf8", b'{"step": 1000, "reward/mean": 0.5, "note": "\xff\xfe\xc3("}', False),
        Line("deep_array", b"[" * deep + b"]" * deep, False),
        Line("deep_object", b'{"a":' * deep + b"1" + b"}" * deep, False),
        Line("null", b"null", False),
        Line("list", b'[{"step": 1001, "reward/mean": 0.5}]', False),
        Line("number", b"42", False),
        Line("string", b'"step 1002"', False),
        Line("truncated_json", b'{"step": 1003, "reward/mean": 0.', False),
        Line("huge_line", b'{"step": 1004, "reward/mean": 0.5, "pad": "' + b"x" * (big_line_mb << 20) + b'"}', False),
    ]


def odd_rows(first_step: int) -> list[Line]:
    """Valid objects with values a chart cannot plot as they are; each has an ordinary step and reward."""
    def row(kind: str, step: int, extra: str) -> Line:
        return Line(kind, (f'{{"step": {step}, "reward/mean": 0.25, {extra}}}').encode(), True)

    s = first_step
    return [
        row("nan_infinity", s, '"loss/pg": NaN, "loss/kl": Infinity, "loss/entropy": -Infinity'),
        row("huge_numbers", s + 1, '"tools/calls": 1' + "0" * 5000 + ', "loss/kl": 1e999, "loss/pg": 1' + "0" * 30),
        row("non_number_values", s + 2, '"loss/pg": "high", "tools/calls": true, "loss/entropy": null'),
        row("nested_value", s + 3, '"rollout/num_turns_mean": {"a": [1, 2, {"b": []}]}, "perf/step_s": [1, 2]'),
        row("prototype_keys", s + 4, '"tools/__proto__/calls": 3, "constructor": 1, "__proto__": {"x": 1}, '
                                     '"tools/constructor/calls": 2'),
        row("lone_surrogate", s + 5, '"note": "\\ud800 and \\u2028 and </script>"'),
    ]


def stream(good: int, *, big_line_mb: int = 50) -> list[Line]:
    """`good` ordinary rows (steps 1..good) with every bad line and odd row between them, ordinary rows first and
    last; odd rows take steps after `good`."""
    extra = bad_lines(big_line_mb) + odd_rows(good + 1)
    out = [Line("good", json.dumps(good_row(1)).encode(), True)]
    for step in range(2, good + 1):
        if extra:
            out.append(extra.pop(0))
        out.append(Line("good", json.dumps(good_row(step)).encode(), True))
    out[-1:-1] = extra  # more poison than ordinary rows: the rest goes before the last
    return out


def write(path, lines: list[Line]) -> None:
    with open(path, "ab") as f:
        f.writelines(line.data + b"\n" for line in lines)
