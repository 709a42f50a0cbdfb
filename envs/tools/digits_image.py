"""Digits-as-a-picture MCP server: tools whose answer is only in the image they return (MCP `ImageContent`).

Run: `python -m rlfactory.envs.tools.digits_image` (stdio) or `... --http --port 8013` (streamable HTTP on
127.0.0.1, endpoint /mcp).

Tools:
- `render_digits(text)`: the digits (and `-`, `.`, `/`, space) of `text` drawn as a PNG;
- `calculator_picture(expression)`: the calculator's exact result (envs/tools/calculator.py), drawn as a PNG and
  never given as text, so a policy must read the picture to answer.

Digits are drawn from a 5x7 bitmap font scaled by `--scale` (black on white, grayscale PNG): the same text gives
the same bytes on every machine (no font files, no antialiasing), so results cache and tests compare exactly.
Left out: other characters, colours, noise or distortion (a harder reading task is a flag away when one is needed).
"""
from __future__ import annotations

import argparse
import io

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from PIL import Image as PILImage

from rlfactory.envs.tools.calculator import CalcError, evaluate

MAX_CHARS = 64
"""The longest text drawn (a longer one is an error for the model)."""

# 5 columns x 7 rows per glyph, '#' = ink.
_FONT = {
    "0": (" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "),
    "1": ("  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "),
    "2": (" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"),
    "3": ("#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "),
    "4": ("   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "),
    "5": ("#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "),
    "6": ("  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "),
    "7": ("#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "),
    "8": (" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "),
    "9": (" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "),
    "-": ("     ", "     ", "     ", "#####", "     ", "     ", "     "),
    ".": ("     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "),
    "/": ("    #", "    #", "   # ", "  #  ", " #   ", "#    ", "#    "),
    " ": ("     ",) * 7,
}
GLYPH_W, GLYPH_H = 5, 7


def render_png(text: str, scale: int = 3, margin: int = 2) -> bytes:
    """`text` drawn with the bitmap font as PNG bytes; raises ValueError for characters it cannot draw."""
    bad = sorted({ch for ch in text if ch not in _FONT})
    if bad:
        raise ValueError(f"cannot draw {''.join(bad)!r}: only digits, '-', '.', '/' and spaces")
    cols = len(text) * (GLYPH_W + 1) - 1 if text else 1
    width, height = (cols + 2 * margin) * scale, (GLYPH_H + 2 * margin) * scale
    img = PILImage.new("L", (width, height), 255)
    px = img.load()
    for i, ch in enumerate(text):
        for row, line in enumerate(_FONT[ch]):
            for col, mark in enumerate(line):
                if mark != "#":
                    continue
                x0, y0 = (margin + i * (GLYPH_W + 1) + col) * scale, (margin + row) * scale
                for dy in range(scale):
                    for dx in range(scale):
                        px[x0 + dx, y0 + dy] = 0
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


SCALE = 3
PURE = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False)
server = MCPServer("digits_image", log_level="WARNING",
                   instructions="Tools that answer with a picture of digits: read the image to know the answer.")


def _picture(text: str) -> Image:
    if len(text) > MAX_CHARS:
        raise ToolError(f"the text is too long to draw ({len(text)} characters; limit {MAX_CHARS})")
    try:
        return Image(data=render_png(text, SCALE), format="png")
    except ValueError as e:
        raise ToolError(str(e)) from None


@server.tool(annotations=PURE)
async def render_digits(text: str) -> Image:
    """Draw a number as a picture of digits.

    Args:
        text: Digits to draw (also '-', '.', '/' and spaces).
    """
    return _picture(text)


@server.tool(annotations=PURE)
async def calculator_picture(expression: str) -> Image:
    """Evaluate an arithmetic expression exactly; the result comes back as a picture of its digits.

    Args:
        expression: The arithmetic expression, e.g. "(3 + 4) * 12".
    """
    try:
        value = evaluate(expression)
    except CalcError as e:
        raise ToolError(str(e)) from None
    # A fraction's "1/3 ≈ 0.333" keeps the exact part; an approximate value ("≈ 1.414") is drawn without its mark.
    return _picture(value.split(" ≈ ")[0].removeprefix("≈ "))


def main() -> None:
    parser = argparse.ArgumentParser(description="Digits-as-a-picture MCP server.")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8013)
    parser.add_argument("--scale", type=int, default=3, help="pixels per font dot")
    args = parser.parse_args()
    global SCALE
    SCALE = max(1, args.scale)
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
