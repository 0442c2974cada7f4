"""Which assistant message in history answers which user turn, for cutting it to what was heard.

A user turn can be answered more than once: the VAD endpoints "Hi there," at its pause, the LLM
stage answers it, then the user goes on and the turn is reopened (a new *revision* of it, see
:class:`~speech_to_speech.core.cancel.Stamp`) and answered again. The sink then reports what was
heard of each reply (:class:`~speech_to_speech.llm.upstream.CutToHeard`), in any order relative to the
new reply. :class:`RepliesInHistory` keeps, per turn, the reply to its latest revision and the one it
superseded, so that each cut lands on the reply it is about, and a superseded reply the user never
heard leaves history (the turn reads as one user message and one reply).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.prompts import INTERRUPTION_MARKER


@dataclass
class _Reply:
    key: str  # the response key (its provisional generation in the chat)
    revision: int  # the user turn's revision it answers
    item_id: str | None = None  # its assistant message, once written
    unheard: bool = False  # cut with nothing of it heard


class RepliesInHistory:
    """The replies of the latest user turns in a :class:`Chat` and their cuts.

    Args:
        chat: the history the replies are written to.
        keep: how many turns are remembered (older turns' cuts are ignored).

    Attributes:
        lock: held while a reply is written to history or cut (the LLM stage holds it while it
            writes, so that a cut never falls between the write and :meth:`written`).
    """

    def __init__(self, chat: Chat, keep: int) -> None:
        self.chat = chat
        self.keep = keep
        self.lock = threading.Lock()
        self._latest: dict[int, _Reply] = {}  # turn id -> the reply to its latest revision
        self._superseded: dict[int, _Reply] = {}  # turn id -> the reply to the revision before

    def started(self, turn_id: int, key: str, revision: int) -> None:
        """A response ``key`` to revision ``revision`` of turn ``turn_id`` begins. A reply to an
        earlier revision is superseded: if it was already cut with nothing heard, it leaves history."""
        with self.lock:
            previous = self._latest.get(turn_id)
            if previous is not None and previous.revision < revision:
                self._superseded[turn_id] = previous
                if previous.unheard:
                    self._drop(previous)
            self._latest[turn_id] = _Reply(key, revision)
            for records in (self._latest, self._superseded):
                while len(records) > self.keep:
                    records.pop(next(iter(records)))

    def written(self, turn_id: int, key: str, item_id: str) -> None:
        """Response ``key``'s assistant message ``item_id`` is in history (call under :attr:`lock`)."""
        for records in (self._latest, self._superseded):
            reply = records.get(turn_id)
            if reply is not None and reply.key == key:
                reply.item_id = item_id

    def item_id(self, turn_id: int) -> str | None:
        """The assistant message answering turn ``turn_id``'s latest revision, if written."""
        reply = self._latest.get(turn_id)
        return reply.item_id if reply is not None else None

    def cut(self, turn_id: int, heard: str, revision: int | None = None) -> None:
        """Cut the reply to turn ``turn_id`` (to its revision ``revision``; None: the latest) to the
        words the user ``heard``.

        A reply in history is shortened to them, with :data:`INTERRUPTION_MARKER`; one not yet
        written is refused (a tombstone in the chat) and the heard words stored instead. A reply to a
        superseded revision of which nothing was heard leaves history; an unknown turn or revision
        is ignored."""
        text = (heard.strip() + INTERRUPTION_MARKER).strip()
        with self.lock:
            latest, superseded = self._latest.get(turn_id), self._superseded.get(turn_id)
            if latest is not None and revision in (None, latest.revision):
                reply = latest
            elif superseded is not None and revision == superseded.revision:
                if not heard.strip():
                    self._drop(superseded)
                    return
                reply = superseded
            else:
                return
            reply.unheard = not heard.strip()
            if reply.item_id is not None:
                self.chat.replace_assistant_message_text(reply.item_id, text)
                return
            self.chat.cancel_provisional_generation(reply.key)
            if heard.strip():
                reply.item_id = self.chat.add_item({"type": "message", "role": "assistant", "content": text})["id"]

    def _drop(self, reply: _Reply) -> None:
        """Take ``reply`` out of history (written or not)."""
        self.chat.cancel_provisional_generation(reply.key)
        if reply.item_id is not None:
            self.chat.remove_message(reply.item_id, role="assistant")
            reply.item_id = None
