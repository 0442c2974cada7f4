"""Images in a session's items: checked off the event loop, and left out for a model that cannot see.

See docs/images.md. The check itself is :func:`speech_to_speech.llm.images.check_image`.
"""

from __future__ import annotations

import json
from typing import Any

from speech_to_speech.llm.images import ImageError, ImageInfo, check_image
from speech_to_speech.realtime.protocol import ProtocolError


class ImageChecks:
    """:func:`check_image` verdicts made ahead, in a worker thread, for the next message's images.

    Decoding an image takes up to a few hundred ms; the server calls :meth:`check_ahead` off the
    event loop the sessions share, then the session's :func:`~speech_to_speech.realtime.conversation.to_history`
    calls this object, which hands over the verdict (or checks there, for an image not seen ahead).
    """

    def __init__(self) -> None:
        self._verdicts: dict[str, ImageInfo | ImageError] = {}

    def check_ahead(self, raw: str) -> None:
        """Check every image of a raw ``conversation.item.create`` message (forgetting earlier verdicts)."""
        self._verdicts = {}
        for url in image_urls(raw):
            try:
                self._verdicts[url] = check_image(url)
            except ImageError as exc:
                self._verdicts[url] = exc

    def __call__(self, url: str) -> ImageInfo:
        """The verdict on ``url``.

        Raises:
            ImageError: the image is refused.
        """
        verdict = self._verdicts.pop(url, None) or check_image(url)
        if isinstance(verdict, ImageError):
            raise verdict
        return verdict


def refuse_images(
    item: dict[str, Any], backend: str, event_id: str | None
) -> tuple[dict[str, Any] | None, ProtocolError]:
    """For a model that cannot see: ``item`` without its images (None when nothing else is in it), and
    the ``unsupported_content`` error that says so, naming the first image part."""
    first = image_indices(item)[0]
    stripped = without_images(item)
    outcome = "the image was left out" if stripped is not None else "no item was created"
    message = f"the current model ({backend}) does not accept images; {outcome}"
    return stripped, ProtocolError("unsupported_content", message, event_id, param=f"item.content.{first}")


def image_indices(item: dict[str, Any]) -> list[int]:
    """The indices of a protocol message's ``input_image`` parts."""
    content = item.get("content") if item.get("type") == "message" else None
    return [i for i, part in enumerate(content or []) if isinstance(part, dict) and part.get("type") == "input_image"]


def image_urls(raw: str) -> list[str]:
    """The ``image_url`` of every ``input_image`` part of a raw ``conversation.item.create`` message."""
    try:
        event = json.loads(raw)
        content = event["item"]["content"] if event.get("type") == "conversation.item.create" else []
    except (ValueError, KeyError, TypeError, AttributeError):
        return []  # not for here: the event's own parsing reports it
    if not isinstance(content, list):
        return []
    return [
        part["image_url"]
        for part in content
        if isinstance(part, dict) and part.get("type") == "input_image" and isinstance(part.get("image_url"), str)
    ]


def without_images(item: dict[str, Any]) -> dict[str, Any] | None:
    """A protocol message without its ``input_image`` parts; None when nothing else is in it."""
    kept = [part for part in item.get("content") or [] if part.get("type") != "input_image"]
    return {**item, "content": kept} if kept else None
