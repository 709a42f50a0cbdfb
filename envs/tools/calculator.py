"""Calculator MCP server: exact arithmetic with a safe parser.

Run: `python -m rlfactory.envs.tools.calculator` (stdio) or `python -m rlfactory.envs.tools.calculator --http
--port 8011` (streamable HTTP on 127.0.0.1, endpoint /mcp). For benchmarks, `--latency-median-s 0.1
--tail-fraction 0.01 --tail-s 5:10` makes calls slow on purpose: log-normal latency around the median, and that
fraction of calls taking a uniform 5-10 s (seeded by `--latency-seed`), like a real tool with stragglers.

The expression is parsed with `ast` and evaluated by walking a whitelist of node types — never `eval`.
Numbers are exact rationals: integers of any size (up to a bound), decimals such as 0.1 taken as written
(0.1 + 0.2 == 0.3), `/` gives a fraction. Supported: + - * / // % ** (also written ^), unary minus, parentheses,
and abs(), min(), max(). Fractional powers are exact when the root is exact (8 ** (1/3) = 2), else approximate
and marked with ≈. Limits: expression length, exponent size and result size, so one call cannot stall the server.
Left out: variables, trigonometry and other transcendental functions.
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import math
import random
from fractions import Fraction

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 10_000
# Results stay below Python's 4,300-digit int/str conversion limit (13,000 bits ≈ 3,900 digits).
MAX_RESULT_BITS = 13_000
APPROX_DIGITS = 12

_TRANSLATE = str.maketrans({"×": "*", "÷": "/", "−": "-", "^": "**"})
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: lambda a, b: a % b,
}
_FUNCS = {"abs": (1, 1), "min": (1, 64), "max": (1, 64)}


class CalcError(ValueError):
    """An expression the calculator cannot evaluate; the message is shown to the model."""


class _Approx:
    """A value that lost exactness (an irrational root); arithmetic on it stays approximate."""

    def __init__(self, value: float):
        self.value = value


Number = Fraction | _Approx


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _check_size(x: Number) -> Number:
    if isinstance(x, Fraction) and _bits(x) > MAX_RESULT_BITS:
        raise CalcError(f"the result is too large (over {MAX_RESULT_BITS} bits); simplify the expression")
    if isinstance(x, _Approx) and not math.isfinite(x.value):
        raise CalcError("the result is too large to approximate")
    return x


def _exact_root(x: int, n: int) -> int | None:
    """The integer n-th root of x >= 0 when it is exact."""
    if x < 2:
        return x
    r = round(x ** (1.0 / n)) if x.bit_length() < 1000 else _int_root(x, n)
    for cand in (r - 1, r, r + 1):
        if cand >= 0 and cand ** n == x:
            return cand
    return None


def _int_root(x: int, n: int) -> int:
    # Newton's method on integers, for values too large for float.
    r = 1 << ((x.bit_length() + n - 1) // n)
    while True:
        s = ((n - 1) * r + x // r ** (n - 1)) // n
        if s >= r:
            return r
        r = s


def _power(base: Number, exp: Number) -> Number:
    if isinstance(base, _Approx) or isinstance(exp, _Approx):
        b = base.value if isinstance(base, _Approx) else float(base)
        e = exp.value if isinstance(exp, _Approx) else float(exp)
        try:
            return _Approx(b ** e)
        except (OverflowError, ZeroDivisionError) as err:
            raise CalcError(f"power cannot be computed: {err}") from None
    if abs(exp.numerator) > MAX_EXPONENT or exp.denominator > MAX_EXPONENT:
        raise CalcError(f"the exponent {exp} is too large (limit {MAX_EXPONENT})")
    if base == 0 and exp < 0:
        raise CalcError("zero cannot be raised to a negative power (division by zero)")
    p, q = exp.numerator, exp.denominator
    # base ** p is computed before any root: bound it (a lower estimate of its bits; _check_size does the rest).
    if (_bits(base) - 1) * abs(p) > MAX_RESULT_BITS * (1 if q == 1 else 4):
        raise CalcError(f"the result is too large (over {MAX_RESULT_BITS} bits); simplify the expression")
    raised = base ** p  # exact: Fraction ** int
    if q == 1:
        return raised
    if raised < 0 and q % 2 == 0:
        raise CalcError(f"an even root of a negative number is not real: ({base}) ** ({exp})")
    sign = -1 if raised < 0 else 1
    num, den = _exact_root(abs(raised.numerator), q), _exact_root(raised.denominator, q)
    if num is not None and den is not None:
        return Fraction(sign * num, den)
    return _Approx(sign * float(abs(raised)) ** (1.0 / q))


def _number(node: ast.Constant, source: str) -> Fraction:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalcError(f"only numbers are allowed, not {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    # Take the literal as written (0.1 is exactly 1/10), not the binary float Python parsed.
    literal = ast.get_source_segment(source, node) or repr(value)
    try:
        return Fraction(literal.replace("_", ""))
    except (ValueError, ZeroDivisionError):
        return Fraction(repr(value))


def _eval(node: ast.AST, source: str) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body, source)
    if isinstance(node, ast.Constant):
        return _number(node, source)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, source)
        if isinstance(node.op, ast.UAdd):
            return v
        return _Approx(-v.value) if isinstance(v, _Approx) else -v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, source), _eval(node.right, source)
        if isinstance(node.op, (ast.Pow, ast.BitXor)):  # ^ is translated to ** before parsing; kept as a guard
            return _check_size(_power(a, b))
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CalcError(f"operator {type(node.op).__name__} is not supported (use + - * / // % **)")
        if isinstance(a, _Approx) or isinstance(b, _Approx):
            fa = a.value if isinstance(a, _Approx) else float(a)
            fb = b.value if isinstance(b, _Approx) else float(b)
            try:
                return _check_size(_Approx(float(op(fa, fb))))
            except ZeroDivisionError:
                raise CalcError("division by zero") from None
        try:
            return _check_size(op(a, b))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        lo, hi = _FUNCS[node.func.id]
        if not lo <= len(node.args) <= hi:
            raise CalcError(f"{node.func.id}() takes {lo} to {hi} arguments")
        args = [_eval(a, source) for a in node.args]
        if any(isinstance(a, _Approx) for a in args):
            floats = [a.value if isinstance(a, _Approx) else float(a) for a in args]
            return _Approx({"abs": lambda x: abs(x[0]), "min": min, "max": max}[node.func.id](floats))
        return {"abs": lambda x: abs(x[0]), "min": min, "max": max}[node.func.id](args)
    if isinstance(node, ast.Name):
        raise CalcError(f"unknown name {node.id!r}: only numbers, operators, parentheses and abs/min/max are allowed")
    raise CalcError(f"{type(node).__name__} is not allowed in an expression")


def format_number(x: Number) -> str:
    """Integers as digits, terminating fractions as exact decimals, other fractions as p/q with an approximation."""
    if isinstance(x, _Approx):
        return f"≈ {x.value:.{APPROX_DIGITS}g}"
    if x.denominator == 1:
        return str(x.numerator)
    den = x.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den == 1:
        places = max(twos, fives)
        scaled = abs(x.numerator) * 10 ** places // x.denominator
        digits = str(scaled).rjust(places + 1, "0")
        sign = "-" if x < 0 else ""
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    return f"{x.numerator}/{x.denominator} ≈ {float(x):.{APPROX_DIGITS}g}"


def evaluate(expression: str) -> str:
    """Evaluate `expression` exactly and format the result; raises CalcError with a message for the model."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("the expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"the expression is too long ({len(expression)} characters; limit {MAX_EXPRESSION_CHARS})")
    source = expression.strip().translate(_TRANSLATE)
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        msg = e.msg if isinstance(e, SyntaxError) else str(e) or type(e).__name__
        shown = expression if len(expression) <= 80 else expression[:80] + "…"
        raise CalcError(f"cannot parse {shown!r}: {msg}") from None
    try:
        return format_number(_eval(tree, source))
    except RecursionError:
        raise CalcError("the expression is nested too deeply") from None


class Latency:
    """Injected call latency (off by default): log-normal around `median_s` (sigma 0.5), and `tail_fraction` of
    the calls drawn uniformly from `tail_s` instead."""

    def __init__(self, median_s: float = 0.0, tail_fraction: float = 0.0, tail_s: tuple[float, float] = (5.0, 10.0),
                 seed: int = 0):
        self.median_s, self.tail_fraction, self.tail_s = median_s, tail_fraction, tail_s
        self.rng = random.Random(seed)

    def draw(self) -> float:
        if self.tail_fraction and self.rng.random() < self.tail_fraction:
            return self.rng.uniform(*self.tail_s)
        return self.median_s * math.exp(0.5 * self.rng.gauss(0.0, 1.0)) if self.median_s else 0.0


LATENCY = Latency()

server = MCPServer(
    "calculator",
    instructions="Exact arithmetic: call calculator(expression) with + - * / // % ** and parentheses.",
    log_level="WARNING",
)


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False,
                                         open_world_hint=False))
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "(3 + 4) * 12 / 7" or "2 ** 100".

    Supports + - * / // % ** (or ^), unary minus, parentheses, decimals, and abs(), min(), max().
    Results are exact: integers of any size, decimals, or fractions (shown as p/q with an approximation).

    Args:
        expression: The arithmetic expression to evaluate.
    """
    delay = LATENCY.draw()
    if delay:
        await asyncio.sleep(delay)
    try:
        return evaluate(expression)
    except CalcError as e:
        raise ToolError(str(e)) from None  # ToolError: the SDK shows its message to the model


def main() -> None:
    parser = argparse.ArgumentParser(description="Calculator MCP server (exact arithmetic).")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--latency-median-s", type=float, default=0.0, help="injected latency's median (benchmarks)")
    parser.add_argument("--tail-fraction", type=float, default=0.0, help="fraction of calls that take --tail-s")
    parser.add_argument("--tail-s", default="5:10", help="straggler latency range LO:HI in seconds")
    parser.add_argument("--latency-seed", type=int, default=0)
    args = parser.parse_args()
    lo, _, hi = args.tail_s.partition(":")
    global LATENCY
    LATENCY = Latency(args.latency_median_s, args.tail_fraction, (float(lo), float(hi or lo)), args.latency_seed)
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
