"""Checking the images tools return (MCP `ImageContent`) before anything keeps them: `decode_image` turns one
base64 block into a `ToolImage`, or into the reason it cannot be used.

The checks run cheapest first, so a hostile or broken image costs little: the base64 length against
`max_image_bytes` (before decoding), the header PIL reads (format and size, no pixels) against the allowed formats
and `max_image_pixels` (before any pixel is decoded: a decompression bomb is refused from its header), then one full
decode (a truncated or corrupt file fails here). Every failure is a `BadImage` whose message the model reads; none
is an exception to the caller.

Left out: resizing (the policy's image processor does that) and keeping the image's place among the text blocks.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from rlfactory.tools.types import ToolImage

ALLOWED_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp",
                   "BMP": "image/bmp"}
"""Formats PIL decodes without optional plugins, and vision processors read."""


@dataclass(frozen=True)
class ImageLimits:
    """A server's bounds on one image (`ServerSettings.max_image_bytes`, `max_image_pixels`, `max_images`)."""

    max_bytes: int = 4 * 2**20
    max_pixels: int = 4096 * 4096
    max_images: int = 8


class BadImage(ValueError):
    """An image that cannot be used; the message says why, for the model and the log."""


def decode_image(data_b64: str, claimed_mime: str, limits: ImageLimits) -> ToolImage:
    """A checked `ToolImage` from an `ImageContent`'s base64 data; raises BadImage with the reason."""
    if not isinstance(data_b64, str) or not data_b64:
        raise BadImage("the image has no data")
    approx_bytes = len(data_b64) * 3 // 4
    if approx_bytes > limits.max_bytes:
        raise BadImage(f"the image is {approx_bytes} bytes, over this server's max_image_bytes ({limits.max_bytes})")
    try:
        raw = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("the image data is not valid base64") from None
    try:
        with warnings.catch_warnings():
            # PIL warns (then raises) on pixel counts past its own MAX_IMAGE_PIXELS; our bound is checked below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as img:
                fmt = img.format or "?"
                if fmt not in ALLOWED_FORMATS:
                    raise BadImage(f"the image format {fmt} ({claimed_mime}) is not supported; use one of "
                                   f"{', '.join(sorted(ALLOWED_FORMATS))}")
                width, height = img.size
                if width <= 0 or height <= 0:
                    raise BadImage(f"the image has no pixels ({width}x{height})")
                if width * height > limits.max_pixels:
                    raise BadImage(f"the image is {width}x{height} = {width * height} pixels, over this server's "
                                   f"max_image_pixels ({limits.max_pixels})")
                img.load()  # decodes every pixel: a truncated or corrupt file fails here
    except BadImage:
        raise
    except UnidentifiedImageError:
        raise BadImage(f"the data ({claimed_mime}) is not an image in a readable format") from None
    except Image.DecompressionBombError as e:
        raise BadImage(f"the image was refused as a decompression bomb: {e}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # PIL's ways of saying "corrupt"
        raise BadImage(f"the image ({claimed_mime}) is corrupt: {e}") from None
    return ToolImage(mime_type=ALLOWED_FORMATS[fmt], data_b64=data_b64, width=width, height=height,
                     sha256=hashlib.sha256(raw).hexdigest())

