"""Images in the conversation: checking a client's image and opening it for a local model.

An image travels as the OpenAI Realtime GA ``input_image`` content part,
``{"type": "input_image", "image_url": "data:image/png;base64,...", "detail": "auto"}``, and is kept
in history in that shape (see :mod:`speech_to_speech.llm.items`). :func:`check_image` is the one
check every image passes before it reaches history: a ``data:`` URL with a base64 payload, an image
MIME type this server accepts, at most :data:`MAX_IMAGE_BYTES` decoded and :data:`MAX_IMAGE_PIXELS`
pixels, a single frame, and data that Pillow decodes whole as the format the MIME type names.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

MAX_IMAGE_BYTES = 10 * 1024 * 1024
"""The largest image accepted, bytes decoded (10 MiB). A phone camera's JPEG is 2-6 MB; OpenAI's vision
guide allows 50 MB of images per request. Over WebSocket ``--max_message_kb`` (1024 KiB by default)
bounds a message, and so an image, first; the browser page shrinks photos to fit a data channel message."""

MAX_IMAGE_PIXELS = 50_000_000
"""The most pixels (width x height) accepted: a 50-megapixel camera. Pillow's own decompression-bomb
warning starts at 89,478,485 pixels (``PIL.Image.MAX_IMAGE_PIXELS``)."""

IMAGE_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
"""Accepted MIME types and the Pillow format each must decode as: the formats OpenAI's vision guide
lists (PNG, JPEG, WEBP, non-animated GIF)."""

DETAILS = ("auto", "low", "high")
"""The ``detail`` values of an ``input_image`` part (OpenAI Realtime GA; absent means ``auto``)."""

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)(?P<params>(;[^;,]*)*);base64,(?P<data>.*)", re.DOTALL)


class ImageError(ValueError):
    """An image the server cannot accept; the message says why, for the user."""


@dataclass(frozen=True)
class ImageInfo:
    """What :func:`check_image` found.

    Attributes:
        mime: the declared (and verified) MIME type, e.g. ``"image/png"``.
        width: pixels.
        height: pixels.
        size: bytes, decoded.
    """

    mime: str
    width: int
    height: int
    size: int


def decode_data_url(url: str) -> tuple[str, bytes]:
    """The MIME type and the bytes of a base64 ``data:`` URL of an accepted image type.

    The size is checked from the base64 length before anything is decoded.

    Raises:
        ImageError: not a base64 data URL, not an accepted image type, too large, or bad base64.
    """
    if not isinstance(url, str) or not url.startswith("data:"):
        raise ImageError("image_url must be a data URL (data:image/png;base64,...); web addresses are not fetched")
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise ImageError("image_url must be a base64 data URL (data:image/png;base64,...)")
    mime = match["mime"].lower()
    if mime not in IMAGE_FORMATS:
        raise ImageError(f"images of type {mime!r} are not supported; send one of {', '.join(IMAGE_FORMATS)}")
    data = match["data"].strip()
    if len(data) * 3 // 4 > MAX_IMAGE_BYTES + 2:
        raise ImageError(f"the image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image_url is not valid base64") from None
    if not raw:
        raise ImageError("the image is empty")
    if len(raw) > MAX_IMAGE_BYTES:
        raise ImageError(f"the image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB")
    return mime, raw


def check_image(url: str) -> ImageInfo:
    """Check an image given as a data URL (see the module docstring).

    Raises:
        ImageError: naming what is wrong with it.
    """
    mime, raw = decode_data_url(url)
    try:
        with Image.open(io.BytesIO(raw)) as image:
            found, (width, height) = image.format, image.size
            if found != IMAGE_FORMATS[mime]:
                raise ImageError(f"the image is declared {mime} but its data is {found or 'unknown'}")
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageError(f"the image has {width}x{height} pixels; at most {MAX_IMAGE_PIXELS:,} are accepted")
            if getattr(image, "is_animated", False):
                raise ImageError("animated images are not supported; send a single frame")
            image.verify()  # the file's structure (PNG: every chunk's CRC)
        with Image.open(io.BytesIO(raw)) as image:  # verify() leaves an image unusable: open it anew
            # decode every pixel, so truncated or corrupt data is found here; a JPEG is decoded at
            # 1/8 scale (libjpeg's DCT scaling), which reads all of its data for a fraction of the time
            image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
            image.load()
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError(f"the image has more than {MAX_IMAGE_PIXELS:,} pixels") from None
    except UnidentifiedImageError:
        raise ImageError(f"the data is not a readable {mime} image") from None
    except Exception as exc:  # Pillow raises many kinds (OSError, SyntaxError, ...) for broken files
        raise ImageError(f"the {mime} image is damaged: {exc}") from None
    return ImageInfo(mime, width, height, len(raw))


def open_image(url: str) -> Image.Image:
    """An image data URL (already checked by :func:`check_image`) as a loaded RGB ``PIL.Image``."""
    _, raw = decode_data_url(url)
    with Image.open(io.BytesIO(raw)) as image:
        return image.convert("RGB")
