"""Images tools return (MCP `ImageContent`): checked and kept in `ToolResult.images`, counted in `tools/*`, cached;
bad ones (too large, a decompression bomb, corrupt, an unsupported format, not an image, too many) become error
results that say why. Real MCP server subprocesses: envs/tools/digits_image.py and tests/tools/servers/image_toolbox.py.
"""
from __future__ import annotations

import base64
import hashlib
import io
import sys

import pytest
from mcp_helpers import SERVERS, write_config
from PIL import Image

from rlfactory.envs.tools.digits_image import render_png
from rlfactory.tools.cache.redis_backend import EmbeddedCache
from rlfactory.tools.images import ImageLimits
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.types import ToolCall


def _config(tmp_path, **settings):
    toolbox = {"command": sys.executable, "args": [str(SERVERS / "image_toolbox.py")]}
    if settings:
        toolbox["rlfactory"] = settings
    return write_config(tmp_path / "images.json", {
        "digits": {"command": sys.executable, "args": ["-m", "rlfactory.envs.tools.digits_image"]},
        "toolbox": toolbox,
    })


async def test_digit_pictures_come_back_as_checked_images_and_are_counted(tmp_path):
    async with ToolManager.from_files([_config(tmp_path)]) as tools:
        picture, square = await tools.call_many([
            ToolCall(name="calculator_picture", arguments={"expression": "6*7"}),
            ToolCall(name="square", arguments={"size": 16, "shade": 99})])
        metrics = tools.metrics()
    assert not picture.is_error and picture.text == "" and len(picture.images) == 1
    image = picture.images[0]
    raw = base64.b64decode(image.data_b64)
    assert raw == render_png("42")  # the tool drew the result, and nothing changed the bytes on the way
    assert image.sha256 == hashlib.sha256(raw).hexdigest() and image.num_bytes == len(raw)
    with Image.open(io.BytesIO(raw)) as img:
        assert (image.mime_type, image.width, image.height) == ("image/png", *img.size)
    assert square.text == "a 16x16 square" and square.images[0].width == 16
    assert metrics["tools/images"] == 2
    assert metrics["tools/image_bytes"] == image.num_bytes + square.images[0].num_bytes


async def test_the_cache_keeps_images(tmp_path):
    cache = EmbeddedCache(tmp_path / "tools.rdb")
    try:
        async with ToolManager.from_files([_config(tmp_path)], cache) as tools:
            call = ToolCall(name="render_digits", arguments={"text": "1234"})
            first = await tools.call(call)
            hit = await tools.call(call)
            metrics = tools.metrics()
    finally:
        await cache.close()
    assert not first.cached and hit.cached
    assert hit.images == first.images and hit.images[0].data_b64 == base64.b64encode(render_png("1234")).decode()
    assert metrics["tools/images"] == 2 and metrics["tools/cache_hit_rate"] == 0.5


@pytest.mark.parametrize("tool, args, says", [
    ("noise", {"side": 64}, "over this server's max_image_bytes (4096)"),
    ("bomb", {"side": 10_000}, "10000x10000 = 100000000 pixels, over this server's max_image_pixels (16777216)"),
    ("bomb", {"side": 50_000}, "refused as a decompression bomb"),  # past PIL's own bound: refused at the header
    ("truncated", {}, "is corrupt"),
    ("tiff", {}, "format TIFF (image/tiff) is not supported"),
    ("not_an_image", {}, "not an image in a readable format"),
    ("squares", {"count": 3}, "returned 3 images, over this server's max_images_per_result (2)"),
])
async def test_a_bad_image_is_an_error_result_that_says_why(tmp_path, tool, args, says):
    config = _config(tmp_path, max_image_bytes=4096, max_images_per_result=2)
    async with ToolManager.from_files([config]) as tools:
        result = await tools.call(ToolCall(name=tool, arguments=args))
        fine = await tools.call(ToolCall(name="squares", arguments={"count": 2}))  # the server goes on serving
        metrics = tools.metrics()
    assert result.is_error and result.error_kind == "bad_image" and not result.infra
    assert says in result.text and result.text.startswith("Error: ")
    assert result.images == []
    assert not fine.is_error and len(fine.images) == 2
    assert metrics["tools/errors_bad_image"] == 1 and metrics["tools/images"] == 2


async def test_a_partly_bad_result_keeps_its_good_image_and_reads_as_its_error_lines(tmp_path):
    from rlfactory.tools.format import response_text

    async with ToolManager.from_files([_config(tmp_path)]) as tools:
        result = await tools.call(ToolCall(name="mixed", arguments={}))
    assert result.is_error and result.error_kind == "bad_image" and len(result.images) == 1
    first, rest = result.text.split("\n", 1)
    assert first.startswith("Error: image 2 of mixed could not be used") and rest == "one good picture, one cut short"
    assert response_text(result) == result.text  # not the tool's own words marked "Error:"


def test_image_limits_default_to_the_server_settings_defaults():
    from rlfactory.recipe.tools import ServerSettings

    s = ServerSettings()
    assert ImageLimits() == ImageLimits(s.max_image_bytes, s.max_image_pixels, s.max_images_per_result)
