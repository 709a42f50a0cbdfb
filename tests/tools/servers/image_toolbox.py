"""A test MCP server whose tools return images, good and bad on purpose: a PNG with text, several images, a large
noise PNG, decompression bombs (PNG headers claiming
10,000 or 50,000 pixels square), a truncated PNG, a TIFF (a format
rlfactory does not take), bytes that are no image at all, a 1 x 305 strip (valid, but too thin for a vision
processor), and a good image beside a corrupt one in one result. Used by the image tests and bench/chaos_images.py.

Run: `python image_toolbox.py` (stdio).
"""
from __future__ import annotations

import io
import random
import struct
import zlib

from mcp.server.mcpserver import Image, MCPServer
from mcp.types import ToolAnnotations
from PIL import Image as PILImage

app = MCPServer("image_toolbox", version="1.0", log_level="WARNING")
PURE = ToolAnnotations(readOnlyHint=True, idempotentHint=True)


def _png(img: PILImage.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


@app.tool(annotations=PURE)
def square(size: int, shade: int = 0) -> list:
    """A grey square of `size` pixels, after a line of text."""
    return [f"a {size}x{size} square", Image(data=_png(PILImage.new("L", (size, size), shade)), format="png")]


@app.tool(annotations=PURE)
def strip() -> Image:
    """A white 1 x 305 strip: a valid PNG that vision processors refuse (aspect ratio over 200)."""
    return Image(data=_png(PILImage.new("L", (1, 305), 255)), format="png")


@app.tool(annotations=PURE)
def squares(count: int) -> list:
    """`count` small squares of different shades."""
    return [Image(data=_png(PILImage.new("L", (8, 8), 30 * i % 256)), format="png") for i in range(count)]


@app.tool(annotations=PURE)
def noise(side: int) -> Image:
    """A PNG of random pixels (incompressible: about 3 x side^2 bytes)."""
    img = PILImage.frombytes("RGB", (side, side), random.Random(side).randbytes(3 * side * side))
    return Image(data=_png(img), format="png")


@app.tool(annotations=PURE)
def bomb(side: int) -> Image:
    """A valid PNG header saying side x side RGB pixels (50,000: 7.5 GB decoded), with a few bytes of data."""
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 1000)) \
        + _chunk(b"IEND", b"")
    return Image(data=data, format="png")


@app.tool(annotations=PURE)
def truncated() -> Image:
    """A PNG cut in the middle of its pixel data."""
    rng = random.Random(0)
    full = _png(PILImage.frombytes("RGB", (32, 32), bytes(rng.getrandbits(8) for _ in range(3 * 32 * 32))))
    return Image(data=full[: len(full) // 2], format="png")


@app.tool(annotations=PURE)
def tiff() -> Image:
    """A small valid TIFF."""
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), (255, 0, 0)).save(buf, format="TIFF")
    return Image(data=buf.getvalue(), format="tiff")


@app.tool(annotations=PURE)
def mixed() -> list:
    """A line of text, a good 16x16 PNG, then the first half of another PNG."""
    good = _png(PILImage.new("L", (16, 16), 90))
    cut = _png(PILImage.frombytes("RGB", (32, 32), random.Random(1).randbytes(3 * 32 * 32)))
    return ["one good picture, one cut short", Image(data=good, format="png"), Image(data=cut[: len(cut) // 2],
                                                                                      format="png")]


@app.tool(annotations=PURE)
def not_an_image() -> Image:
    """Plain text bytes claimed to be a PNG."""
    return Image(data=b"this is not an image at all", format="png")


if __name__ == "__main__":
    app.run()
