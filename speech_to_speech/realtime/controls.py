"""What a realtime session changes in its running stages, as :class:`StageControl` messages.

The session runs on the event loop; its VAD and LLM run in their own threads. A session update
or a history edit is never written into a stage from the loop: it is a message put on the
stage's input queue (the VAD's audio queue, the STT's queue for the LLM, where client-driven
work keeps its place), applied by the stage between two items (see
:meth:`speech_to_speech.core.handler.BaseHandler._control`).

Cutting a reply to what the client played (``conversation.item.truncate``) is a message too:
:class:`~speech_to_speech.llm.upstream.CutToHeard`, the one the pipeline sends on a barge-in.
A ``response.create`` is a :class:`~speech_to_speech.core.messages.ResponseRequest` on the same
queue; the LLM stage decides, in its thread, whether the follow-up it generated ahead is that
response. Throwing that follow-up away when what it was made from changed is a message too:
:class:`~speech_to_speech.llm.hidden_response.DiscardFollowUp`, put ahead of the data in the LLM
stage's queue. What the session still reads directly is the history (``chat.items()``, behind the
history's lock); it calls no stage method.
"""

from __future__ import annotations

import argparse
import copy
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from speech_to_speech.core.handler import StageControl
from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.stage import BaseLLMHandler
from speech_to_speech.realtime.config import SessionConfig
from speech_to_speech.realtime.conversation import Ref
from speech_to_speech.turns.stt import BaseSTTHandler
from speech_to_speech.turns.vad import BaseVADHandler, Endpointer

logger = logging.getLogger(__name__)


@dataclass
class InputCleaning(StageControl):
    """A session's ``audio.input.noise_reduction`` for the VAD's input
    (:meth:`~speech_to_speech.turns.vad.BaseVADHandler.clean_input`).

    ``"near_field"`` (a headset, a phone at the ear) suppresses noise; ``"far_field"`` (a laptop's
    or a room's microphone, which hears the speakers too) also cancels the assistant's echo where
    the server sees what the client plays (a WebRTC call); None: the input as it comes.
    """

    target: ClassVar[type] = BaseVADHandler
    noise_reduction: str | None

    def apply(self, stage: Any) -> None:
        stage.clean_input(self.noise_reduction is not None, self.noise_reduction == "far_field")


@dataclass
class VADSettings(StageControl):
    """Turn detection for the VAD stage (see :meth:`~speech_to_speech.realtime.config.TurnDetection.vad_settings`).

    ``eagerness`` is handed to the VAD's ``set_eagerness(eagerness)``: None (``server_vad``) ends
    turns on silence, a value (``semantic_vad``) with the Smart Turn end-of-turn model.
    """

    target: ClassVar[type] = BaseVADHandler
    vad_threshold: float
    min_silence_ms: int
    speech_pad_ms: int
    interrupt_response: bool = True
    create_response: bool = True
    eagerness: str | None = None

    def apply(self, stage: Any) -> None:
        cfg = stage.config
        cfg.vad_threshold = float(self.vad_threshold)
        cfg.min_silence_ms = int(self.min_silence_ms)
        cfg.speech_pad_ms = int(self.speech_pad_ms)
        cfg.interrupt_response = bool(self.interrupt_response)
        stage.create_response = bool(self.create_response)
        stage.endpointer = Endpointer(cfg)
        set_eagerness = getattr(stage, "set_eagerness", None)
        if set_eagerness is not None:
            set_eagerness(self.eagerness)


@dataclass
class LLMSettings(StageControl):
    """The session's instructions, tools and reply defaults for the LLM stage."""

    target: ClassVar[type] = BaseLLMHandler
    instructions: str
    tools: list[dict[str, Any]]
    tool_choice: str
    wants_audio: bool
    max_new_tokens: int
    language: str | None = None  # the STT's language setting (None: unchanged), for the reply rule

    def apply(self, stage: Any) -> None:
        if self.language is not None:
            stage.config.language = self.language
        stage.config.system_prompt = self.instructions
        stage.config.max_new_tokens = self.max_new_tokens
        stage.tools = list(self.tools)
        stage.tool_choice = self.tool_choice
        stage.default_wants_audio = self.wants_audio
        prepare = getattr(stage, "prepare_prompt", None)  # e.g. llama-cpp: the new system prompt into its cache
        if prepare is not None:
            prepare()


@dataclass
class STTSettings(StageControl):
    """The language the STT stage hears: a code, "auto" or a comma-separated list of candidates
    (see :class:`~speech_to_speech.turns.stt.STTConfig`). Sent on the audio queue, it passes the
    VAD and takes effect from the next segment on."""

    target: ClassVar[type] = BaseSTTHandler
    language: str

    def apply(self, stage: Any) -> None:
        stage.set_language(self.language)


def chat_item_id(llm: BaseLLMHandler, ref: Ref) -> str | None:
    """The id in ``llm.chat`` of the history entry ``ref`` points to (None: not there yet, or gone).

    Runs in the LLM stage's thread. Spoken user turns and replies are found through the LLM
    stage's own turn records (it wrote them).
    """
    kind, key = ref
    items = llm.chat.items()
    if kind == "chat":
        return key if any(i["id"] == key for i in items) else None
    if kind in ("call", "output"):
        wanted = "function_call" if kind == "call" else "function_call_output"
        return next((i["id"] for i in items if i["type"] == wanted and i.get("call_id") == key), None)
    # the LLM stage's records of what it wrote for a turn: its user message, its reply
    found = llm._user_items.get(key) if kind == "user_turn" else llm.replies.item_id(key)
    return found if any(i["id"] == found for i in items) else None


def _rebuild(chat: Chat, items: list[dict[str, Any]]) -> None:
    """Make ``chat`` hold exactly ``items`` (ids kept), in that order; restored as it was on failure."""
    before = chat.items()
    calls = {i["call_id"] for i in items if i["type"] == "function_call"}
    items = [i for i in items if i["type"] != "function_call_output" or i["call_id"] in calls]
    chat.reset()
    try:
        for item in items:
            chat.add_item(item)
    except Exception:
        chat.reset()
        for item in before:
            chat.add_item(item)
        raise


@dataclass
class HistoryInsert(StageControl):
    """Add an item (history shape, with the protocol item's id) to the LLM's history.

    Attributes:
        item: the history item.
        after: where: None at the end; else the refs of the protocol items before it, nearest
            first (the first one found in history is the anchor; none found: first).
    """

    target: ClassVar[type] = BaseLLMHandler
    item: dict[str, Any]
    after: list[Ref] | None = None

    def apply(self, stage: Any) -> None:
        chat: Chat = stage.chat
        if self.after is None:
            chat.add_item(self.item)
            return
        anchor = next((found for ref in self.after if (found := chat_item_id(stage, ref)) is not None), None)
        items = chat.items()
        at = 0 if anchor is None else next(i for i, it in enumerate(items) if it["id"] == anchor) + 1
        if at == len(items):
            chat.add_item(self.item)
        else:
            _rebuild(chat, [*items[:at], self.item, *items[at:]])


@dataclass
class HistoryDelete(StageControl):
    """Remove the history entry of a deleted protocol item (a function call takes its output along)."""

    target: ClassVar[type] = BaseLLMHandler
    ref: Ref
    removed: list[str] = field(default_factory=list)

    def apply(self, stage: Any) -> None:
        chat: Chat = stage.chat
        found = chat_item_id(stage, self.ref)
        if found is None:
            logger.info("%s: nothing in history for deleted item %s", stage.name, self.ref)
            return
        items = chat.items()
        if not chat.remove_message(found):
            _rebuild(chat, [i for i in items if i["id"] != found])
        self.removed.append(found)


def update_controls(
    old: SessionConfig, new: SessionConfig, args: argparse.Namespace
) -> tuple[list[StageControl], LLMSettings]:
    """What a ``session.update`` from ``old`` to ``new`` changes in the stages: the controls for the
    VAD's queue, in order (the language passes on to the STT), and the LLM's settings.

    Args:
        args: the server's flags (``--language``, ``--max_new_tokens``: the defaults).
    """
    language = new.stt_language(args.language)
    to_vad: list[StageControl] = []
    if language != old.stt_language(args.language):
        to_vad.append(STTSettings(language))
    if new.noise_reduction != old.noise_reduction:
        to_vad.append(InputCleaning(new.noise_reduction))
    if new.turn_detection is not None:
        to_vad.append(VADSettings(**new.turn_detection.vad_settings()))
    max_tokens = new.max_output_tokens if isinstance(new.max_output_tokens, int) else None
    tools = copy.deepcopy(new.tools)
    settings = LLMSettings(
        new.instructions, tools, new.tool_choice, new.wants_audio, max_tokens or args.max_new_tokens, language
    )
    return to_vad, settings
