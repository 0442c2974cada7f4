"""Typed messages that travel between pipeline stages.

Every message is a :class:`Message`, whose :attr:`~Message.kind` says how it behaves when work is
cancelled (:class:`~speech_to_speech.core.cancel.MessageKind`):

- **data** (most of them) carries the :class:`~speech_to_speech.core.cancel.Stamp` of the turn it
  belongs to; the :class:`~speech_to_speech.core.cancel.Gate` drops it once that stamp is stale;
- **end** (:class:`EndOfResponse`) is never dropped: every response ends exactly once;
- **control** (:class:`ControlMessage`: :class:`EndOfStream`, :class:`Flush`, :class:`Interrupt`,
  :class:`Pause`, :class:`Resume`, and the stage settings of
  :class:`~speech_to_speech.core.handler.StageControl`) carries no stamp and is never stale.

An interruption is a message like the others: :class:`Interrupt` is put at the head of every
stage's input queue; each stage, in its own thread, between two items, drops the stale data still
queued for it and passes on; the sink also cuts playback and reports what was heard.

Audio conventions: mono ``float32`` in [-1, 1]; the sample rate travels with the
audio in Hz.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from speech_to_speech.core.cancel import MessageKind, Stamp


class Message:
    """Base of everything that travels on a stage queue.

    Attributes:
        kind: how the message behaves when work is cancelled (data, end or control).
    """

    kind: ClassVar[MessageKind] = MessageKind.DATA


class ControlMessage(Message):
    """A message that changes how stages behave rather than carrying a turn's work.

    It has no stamp and is never stale; a stage handles it in its own thread, between two items.
    """

    kind: ClassVar[MessageKind] = MessageKind.CONTROL


@dataclass
class Flush(ControlMessage):
    """Every stage drops the stale data queued for it (a speculative revision was superseded:
    none of its work reached the sink). Put at the head of each stage's input queue."""


@dataclass
class Interrupt(Flush):
    """The user barged in at ``time`` (monotonic s): every stage drops its stale queued data, and the
    sink cuts the replies the gate no longer admits at ``time`` and reports what was heard of them."""

    time: float = field(default_factory=time.monotonic)


@dataclass
class Pause(ControlMessage):
    """For the sink: user speech from ``time`` (monotonic s) pauses what is playing.

    Audio stops at ``time``, as for a cut, but what was not heard is kept (and audio that
    arrives meanwhile is held), for a :class:`Resume` or an :class:`Interrupt` to settle.
    """

    time: float = field(default_factory=time.monotonic)


@dataclass
class Resume(ControlMessage):
    """For the sink: play what a :class:`Pause` held, from where it stopped, now."""

    time: float = field(default_factory=time.monotonic)


class EndOfStream(ControlMessage):
    """Sentinel: the source is exhausted. Each stage forwards it, then stops."""

    _instance: EndOfStream | None = None

    def __new__(cls) -> EndOfStream:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EndOfStream"


END_OF_STREAM = EndOfStream()


@dataclass
class AudioChunk(Message):
    """A block of input audio from a source (microphone or file).

    Attributes:
        samples: shape ``(n,)`` float32 in [-1, 1].
        sample_rate: Hz (16,000 after the source's resampling).
        time: ``time.monotonic()`` when the chunk was delivered (its last sample).
        stream_offset: index of the chunk's first sample in the input stream.
    """

    samples: np.ndarray
    sample_rate: int
    time: float
    stream_offset: int = 0


@dataclass
class SpeechSegment(Message):
    """One endpointed user utterance from the VAD.

    Attributes:
        stamp: the new turn's stamp.
        samples: shape ``(n,)`` float32, 16 kHz, including pre-roll and padding.
        sample_rate: Hz.
        speech_end_time: monotonic time when the last speech chunk arrived.
        endpoint_time: monotonic time when the VAD decided the turn was over.
        stream_end_offset: input-stream sample index where speech ended.
        wants_audio: False when the reply should be text only.
        respond: False to transcribe into history without answering (client-driven turns).
        speculative: sent on a short pause before the endpoint was confirmed; its output is
            held until the VAD confirms the endpoint (see :mod:`speech_to_speech.turns.speculation`)
            and dropped if the user speaks on (a new revision supersedes it).
        during_reply: spoken while a reply was in flight, which it paused: as likely a
            backchannel ("mm-hmm") as words (see :mod:`speech_to_speech.turns.interruptions`).
    """

    stamp: Stamp
    samples: np.ndarray
    sample_rate: int
    speech_end_time: float
    endpoint_time: float
    stream_end_offset: int = 0
    wants_audio: bool = True
    respond: bool = True
    speculative: bool = False
    during_reply: bool = False


@dataclass
class PartialSpeech(Message):
    """The audio of a turn so far, while the user is still speaking: for a partial transcript.

    The STT skips it when it is behind (more input waiting) or when the pass would
    still be running at ``deadline``, so a partial never delays a turn's final transcript.

    Attributes:
        stamp: the turn's stamp.
        samples: shape ``(n,)`` float32, 16 kHz, from the turn's start (pre-roll included).
        sample_rate: Hz.
        time: monotonic time when the last chunk of ``samples`` arrived.
        deadline: monotonic time before which the turn's next segment cannot reach the STT
            (the VAD needs that much silence first); a partial pass should end before it.
        speech_end_offset: -1 for a partial of speech that goes on; else the speech stopped at
            this stream sample index (a short silence followed it), and the pass is the turn's
            final one done ahead: the STT keeps its transcript for a segment of ``stamp`` whose
            speech ends there, and runs it even past ``deadline``.
    """

    stamp: Stamp
    samples: np.ndarray
    sample_rate: int
    time: float
    deadline: float
    speech_end_offset: int = -1


@dataclass
class PartialTranscript(Message):
    """The words of a turn still being spoken, from a partial STT pass, for the LLM to evaluate ahead.

    The STT puts it at the head of the LLM stage's queue (it is newer than anything queued
    there); the LLM stage takes it in its own thread (its ``on_partial_transcript``) and never
    passes it on. A flush drops a stale one like any data.

    Attributes:
        stamp: the turn's stamp.
        text: the words so far (not empty).
    """

    stamp: Stamp
    text: str


@dataclass
class Transcript(Message):
    """User text for the LLM: an STT transcript or a typed turn.

    Attributes:
        stamp: the turn's stamp.
        text: the user's words.
        language: ISO 639-1 code when known (e.g. ``"en"``).
        speech_end_time: monotonic end of user speech (or submission time for text).
        stt_ms: STT time in ms (None for typed turns).
        wants_audio: False for a text-only response (raw text, no TTS).
        respond: False to only add the text to history (the client asks for a response later).
        item_id: the conversation item id the client knows this turn by.
    """

    stamp: Stamp
    text: str
    language: str | None = None
    speech_end_time: float = 0.0
    stt_ms: float | None = None
    wants_audio: bool = True
    respond: bool = True
    item_id: str | None = None


@dataclass
class ResponseRequest(Message):
    """Ask the LLM for a response from the history as it is (e.g. a client's ``response.create``).

    Attributes:
        stamp: the response's stamp.
        wants_audio: False for a text-only response.
        instructions: replaces the session instructions for this response (None: keep).
        tools: replaces the session tools for this response (None: keep).
        tool_choice: "auto", "required" or "none" for this response (None: keep).
        claim_options: a client's request: what it asked for beyond the session's defaults
            (``instructions``, ``tools``, ``tool_choice``, ``output_modalities``, ``metadata``), so
            that the LLM stage can tell whether the follow-up it generated ahead is this response
            (only ``metadata`` may differ: :func:`speech_to_speech.llm.prefetch.fingerprint_of`).
            None: the request never takes a follow-up generated ahead (it discards it).
    """

    stamp: Stamp
    wants_audio: bool = True
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    claim_options: dict[str, Any] | None = None


@dataclass
class FunctionOutput(Message):
    """The result of a function call, for history (a client's ``function_call_output`` item).

    Attributes:
        call_id: the call it answers.
        output: the result, usually JSON.
    """

    call_id: str
    output: str


@dataclass
class TTSInput(Message):
    """Text of one or more complete sentences to speak.

    Attributes:
        stamp: the turn's stamp.
        text: speakable text (never empty).
        language: ISO 639-1 code of the text (the user's turn's language, e.g. ``"fr"``), or
            None when unknown; the TTS picks its voice or engine by it.
    """

    stamp: Stamp
    text: str
    language: str | None = None


@dataclass
class TextOutput(Message):
    """A raw text delta of a text-only response (unfiltered, unsplit); TTS passes it on.

    Attributes:
        stamp: the turn's stamp.
        text: the delta as the LLM produced it.
    """

    stamp: Stamp
    text: str


@dataclass
class ToolCallRequest(Message):
    """A complete function call produced by the LLM, in order with the speech around it.

    Attributes:
        stamp: the turn's stamp.
        call_id: pairs the call with its output.
        name: the function name.
        arguments: JSON-encoded arguments.
    """

    stamp: Stamp
    call_id: str
    name: str
    arguments: str


@dataclass
class AudioOutput(Message):
    """A chunk of assistant audio.

    Attributes:
        stamp: the turn's stamp.
        samples: shape ``(n,)`` float32 in [-1, 1].
        sample_rate: Hz (the TTS engine's native rate; sinks resample once).
        text: the text this audio speaks, on the chunk that starts a sentence batch.
        engine: what spoke it (e.g. ``"piper"``, ``"espeak-ng"``), "" when not told.
        language: ISO 639-1 code it was spoken in, None when unknown.
    """

    stamp: Stamp
    samples: np.ndarray
    sample_rate: int
    text: str = ""
    engine: str = ""
    language: str | None = None


@dataclass
class EndOfResponse(Message):
    """Marks the end of one assistant response. Emitted exactly once per response.

    Attributes:
        stamp: the turn's stamp.
        text: the full reply text as generated.
        error: a short description when the response failed.
        usage: token counts, e.g. ``{"input_tokens": 12, "output_tokens": 30}``.
        cleanup_only: the turn was stale: only close the response, emit nothing for it.
    """

    stamp: Stamp
    text: str = ""
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    cleanup_only: bool = False

    #: never dropped as stale: even a cancelled response must end
    kind: ClassVar[MessageKind] = MessageKind.END
