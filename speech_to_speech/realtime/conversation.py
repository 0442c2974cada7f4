"""The conversation as the client sees it: ordered protocol items, each tied to its history entry.

The LLM's :class:`~speech_to_speech.llm.chat.Chat` holds what the model reads; this holds what the
protocol shows (ids, statuses, transcripts, the order ``previous_item_id`` refers to) and, for
each item, a :data:`Ref` by which the LLM stage finds the matching history entry: the item's own
id for items the client created, the turn of a spoken user message or of an assistant reply,
the ``call_id`` of a function call or output.

Thread-safe: items are added from the event loop (client events) and from the pipeline's
threads (committed audio, response output).
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speech_to_speech.llm.images import ImageError, ImageInfo, check_image
from speech_to_speech.realtime.protocol import ProtocolError

#: where a protocol item's history entry is: ("chat", chat item id), ("user_turn", turn id),
#: ("reply", turn id), ("call", call_id) or ("output", call_id)
Ref = tuple[str, Any]

#: ``previous_item_id`` that puts an item first
ROOT = "root"
#: the most items one session keeps (the oldest go first)
MAX_ITEMS = 1024


@dataclass
class _Entry:
    item: dict[str, Any]
    ref: Ref


class Conversation:
    """Ordered protocol items of one session."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._items: OrderedDict[str, _Entry] = OrderedDict()

    def add(self, item: dict[str, Any], ref: Ref, previous_item_id: str | None = None) -> str | None:
        """Insert ``item`` (it has an ``id``) after ``previous_item_id`` (None: at the end; :data:`ROOT`: first).

        Returns:
            The id of the item now before it (None when it is first).

        Raises:
            KeyError: ``previous_item_id`` is not in the conversation.
            ValueError: an item with this id is already there.
        """
        item_id = item["id"]
        with self._lock:
            if item_id in self._items:
                raise ValueError(item_id)
            if previous_item_id not in (None, ROOT) and previous_item_id not in self._items:
                raise KeyError(previous_item_id)
            ids = list(self._items)
            at = (
                len(ids)
                if previous_item_id is None
                else 0
                if previous_item_id == ROOT
                else ids.index(previous_item_id) + 1
            )
            self._items[item_id] = _Entry(copy.deepcopy(item), ref)
            for later in ids[at:]:
                self._items.move_to_end(later)
            while len(self._items) > MAX_ITEMS:
                self._items.popitem(last=False)
            return ids[at - 1] if at > 0 else None

    def get(self, item_id: str) -> dict[str, Any] | None:
        """A copy of item ``item_id``, or None."""
        with self._lock:
            entry = self._items.get(item_id)
            return None if entry is None else copy.deepcopy(entry.item)

    def items(self) -> list[dict[str, Any]]:
        """Copies of the items, in order."""
        with self._lock:
            return [copy.deepcopy(entry.item) for entry in self._items.values()]

    def ref(self, item_id: str) -> Ref | None:
        with self._lock:
            entry = self._items.get(item_id)
            return None if entry is None else entry.ref

    def refs_before(self, item_id: str | None) -> list[Ref]:
        """The refs of the items before ``item_id`` (None: of all items), nearest first."""
        with self._lock:
            ids = list(self._items)
            end = len(ids) if item_id is None else ids.index(item_id)
            return [self._items[i].ref for i in reversed(ids[:end])]

    def update(self, item_id: str, **fields: Any) -> dict[str, Any] | None:
        """Set top-level ``fields`` of item ``item_id``; returns a copy of it (None: not there)."""
        with self._lock:
            entry = self._items.get(item_id)
            if entry is None:
                return None
            entry.item.update(copy.deepcopy(fields))
            return copy.deepcopy(entry.item)

    def set_content(self, item_id: str, index: int, **fields: Any) -> dict[str, Any] | None:
        """Set ``fields`` of content part ``index`` of item ``item_id``; returns a copy (None: not there)."""
        with self._lock:
            entry = self._items.get(item_id)
            if entry is None or index >= len(entry.item.get("content") or []):
                return None
            entry.item["content"][index].update(fields)
            return copy.deepcopy(entry.item)

    def remove(self, item_id: str) -> Ref | None:
        """Remove item ``item_id``; returns its ref (None: it was not there)."""
        with self._lock:
            entry = self._items.pop(item_id, None)
            return None if entry is None else entry.ref

    def previous_id(self, item_id: str) -> str | None:
        """The id of the item before ``item_id`` (None: it is first, or not there)."""
        with self._lock:
            ids = list(self._items)
            at = ids.index(item_id) if item_id in self._items else 0
            return ids[at - 1] if at > 0 else None

    def last_id(self) -> str | None:
        with self._lock:
            return next(reversed(self._items), None)

    def find_call(self, call_id: str) -> dict[str, Any] | None:
        """The function call item with ``call_id`` (None: none)."""
        with self._lock:
            for entry in self._items.values():
                if entry.item.get("type") == "function_call" and entry.item.get("call_id") == call_id:
                    return copy.deepcopy(entry.item)
            return None

    def has_output(self, call_id: str) -> bool:
        with self._lock:
            return any(
                e.item.get("type") == "function_call_output" and e.item.get("call_id") == call_id
                for e in self._items.values()
            )


def to_history(item: dict[str, Any], check: Callable[[str], ImageInfo] = check_image) -> dict[str, Any]:
    """A client's protocol item (``conversation.item.create``) as a history item, with the same id.

    Messages keep their text (a user's ``input_audio`` part its transcript) as one string; a user
    message with an ``input_image`` part keeps its parts in order instead (text as ``input_text``,
    each image as ``{"type": "input_image", "image_url", "detail"}`` once
    :func:`~speech_to_speech.llm.images.check_image` accepts it). Function calls and outputs keep
    their fields. ``check`` checks an image's data URL (raising :class:`ImageError`).

    Raises:
        ProtocolError: content the server cannot read (audio without a transcript), a bad image
            (``invalid_image``, naming the problem), a part of the wrong kind for the role, an empty
            message, or an MCP item.
    """
    kind = item.get("type")
    if kind == "function_call":
        if not item.get("call_id"):
            raise ProtocolError("invalid_value", "a function_call item needs a 'call_id'", param="item.call_id")
        fields = ("id", "type", "call_id", "name", "arguments")
        return {k: item[k] for k in fields}
    if kind == "function_call_output":
        return {k: item[k] for k in ("id", "type", "call_id", "output")}
    if kind != "message":
        raise ProtocolError("unsupported_item_type", f"items of type {kind!r} are not supported", param="item.type")
    role = item["role"]
    readable = {
        "user": ("input_text", "input_audio", "input_image"),
        "system": ("input_text",),
        "assistant": ("output_text", "output_audio"),
    }
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(item.get("content") or []):
        param = f"item.content.{index}"
        ptype = part.get("type") or readable[role][0]
        if ptype not in readable[role]:
            raise ProtocolError(
                "unsupported_content", f"{role} content of type {ptype!r} is not supported", param=param
            )
        if ptype == "input_image":
            parts.append(_image_part(part, param, check))
            continue
        text = part.get("text") if ptype.endswith("_text") else part.get("transcript")
        if not isinstance(text, str):
            what = "text" if ptype.endswith("_text") else "a transcript (audio is not read)"
            raise ProtocolError("invalid_value", f"{ptype} content needs {what}", param=param)
        parts.append({"type": "input_text", "text": text})
    if not parts:
        raise ProtocolError("invalid_value", "'content' must be a non-empty list", param="item.content")
    if any(part["type"] == "input_image" for part in parts):
        content: str | list[dict[str, Any]] = parts
    else:
        content = "\n".join(part["text"] for part in parts)
    return {"id": item["id"], "type": "message", "role": role, "content": content}


def _image_part(part: dict[str, Any], param: str, check: Callable[[str], ImageInfo]) -> dict[str, Any]:
    """A protocol ``input_image`` part as a history part, after checking the image."""
    url = part.get("image_url")
    if not isinstance(url, str):
        raise ProtocolError("invalid_image", "an input_image part needs an 'image_url' data URL", param=param)
    try:
        check(url)
    except ImageError as exc:
        raise ProtocolError("invalid_image", f"{param}: {exc}", param=f"{param}.image_url") from None
    return {"type": "input_image", "image_url": url, "detail": part.get("detail") or "auto"}
