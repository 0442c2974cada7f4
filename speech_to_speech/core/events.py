"""Pipeline events for presentation (console, transcript file, benchmarks).

Handlers publish events on an :class:`EventBus`; they never print. Subscribers
(see :mod:`speech_to_speech.pipeline.console`) decide how to show or record them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class Event:
    """Base of all events. ``time`` is ``time.monotonic()`` at creation."""

    turn_id: int
    time: float = field(default_factory=time.monotonic, kw_only=True)

    @property
    def kind(self) -> str:
        """A snake_case name for the event type, used in JSON Lines output."""
        name = type(self).__name__
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with the event's ``kind`` first."""
        return {"event": self.kind, **asdict(self)}


@dataclass
class SpeechStarted(Event):
    """The VAD detected the start of user speech (``revision`` > 0: a reopened turn).

    Attributes:
        audio_ms: where speech starts in the input stream, ms since the stream began.
        pauses_reply: a reply was in flight and is paused, not cancelled: what the user
            says decides (see :mod:`speech_to_speech.turns.interruptions`).
        barge_in: the VAD cancelled whatever was in flight (the generation moved on).
    """

    revision: int = 0
    audio_ms: float = 0.0
    pauses_reply: bool = False
    barge_in: bool = False


@dataclass
class SpeechDiscarded(Event):
    """Speech that started a turn ended shorter than ``min_speech_ms``: noise, not a turn.

    Attributes:
        speech_ms: from its start until it was dropped (the silence after it included), ms.
    """

    speech_ms: float = 0.0


@dataclass
class SpeechStopped(Event):
    """The VAD endpointed a user turn.

    Attributes:
        duration_ms: length of the segment sent to STT, ms.
        endpoint_delay_ms: time from the end of speech to the endpoint decision, ms.
        audio_ms: where speech ended in the input stream, ms since the stream began.
        endpoint_by: what ended the turn: ``"model"`` (the end-of-turn model judged it
            complete), ``"silence"`` (the silence bound: ``--min_silence_ms``, or
            ``--turn_max_silence_ms`` with a model), ``"max_speech"`` or ``"end_of_input"``.
        turn_probability: the end-of-turn model's last P(complete) for the turn, 0-1 (None:
            no model, or it was not asked).
    """

    duration_ms: float = 0.0
    endpoint_delay_ms: float = 0.0
    audio_ms: float = 0.0
    endpoint_by: str = "silence"
    turn_probability: float | None = None


@dataclass
class TurnSpeculated(Event):
    """A short pause (``speculative_silence_ms``) sent the turn on before its endpoint was confirmed.

    Its transcript and reply are computed at once but held: nothing of it is heard or
    written to history unless the endpoint follows (then :class:`SpeechStopped`).

    Attributes:
        revision: the speculative revision of the turn.
        audio_ms: where speech ended in the input stream, ms since the stream began.
    """

    revision: int = 0
    audio_ms: float = 0.0


@dataclass
class TurnSuperseded(Event):
    """The user spoke on after a speculative pause: that revision is stale, ``revision`` replaces it."""

    revision: int = 0


@dataclass
class UserTranscriptDelta(Event):
    """A partial transcript while the user is still speaking (streaming STT).

    Attributes:
        text: the transcript of the turn's audio so far (may still change).
        delta: words that became stable since the previous delta of this turn, to append to the
            earlier deltas (the first has no leading space); "" when nothing new is stable.
        stt_ms: time the partial pass took, ms.
        audio_ms: length of the audio transcribed, ms.
    """

    text: str = ""
    delta: str = ""
    stt_ms: float = 0.0
    audio_ms: float = 0.0


@dataclass
class EmptyTranscript(Event):
    """The STT heard no words in a turn's audio (noise, a cough); the turn gets no response."""


@dataclass
class UserTranscript(Event):
    """The user's words for a turn (from STT or typed).

    Attributes:
        text: the final transcript.
        language: ISO 639-1 code when known.
        stt_ms: STT time of the final pass, ms (None for typed turns).
        delta: the end of ``text`` that no :class:`UserTranscriptDelta` of this turn carried yet
            ("" when the partials already announced every word or disagree with the final text).
    """

    text: str = ""
    language: str | None = None
    stt_ms: float | None = None
    delta: str = ""


@dataclass
class AssistantText(Event):
    """The assistant's complete reply text for a turn."""

    text: str = ""
    error: str | None = None


@dataclass
class ResponseStarted(Event):
    """The LLM request for a turn was sent (the start of TTFT and TTFA).

    Attributes:
        speech_end_time: when the user's speech ended (monotonic s), for a spoken turn.
        revision: the revision of the turn the response answers (a speculative one may be
            superseded before its endpoint, and the response with it).
        claimed_by: for a follow-up generated ahead (``turn_id`` is its own turn), the turn of the
            response request that claimed it; None for every other response.
    """

    speech_end_time: float | None = None
    revision: int = 0
    claimed_by: int | None = None


@dataclass
class ToolCallEvent(Event):
    """The LLM called a function (``arguments`` is JSON)."""

    call_id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class ToolCallReady(Event):
    """Side channel: a tool call the client may run now, before earlier audio has played.

    ``after_output`` is True when speech or text of the same response went before the call (the
    client is shown that message item first, as the model produced them)."""

    call_id: str = ""
    name: str = ""
    arguments: str = ""
    after_output: bool = False


@dataclass
class FirstToken(Event):
    """The LLM produced its first token for a turn (``ttft_ms`` from request start)."""

    ttft_ms: float = 0.0


@dataclass
class FirstChunk(Event):
    """The first text of a response (revision ``revision`` of its turn) went on to TTS: the first
    phrase the sentence streamer cut (``text``), published by the LMOutputProcessor."""

    revision: int = 0
    text: str = ""


@dataclass
class FirstAudio(Event):
    """The first sound of a turn's reply reached the sink: ``time`` is when its first sample above
    -60 dBFS (:data:`~speech_to_speech.core.audio.FIRST_SOUND`) plays (monotonic s, maybe a few
    ms ahead), where voice-to-voice ends.

    Attributes:
        engine: the TTS engine that spoke it (e.g. ``"espeak-ng"``), "" when not told.
        language: ISO 639-1 code it was spoken in, None when unknown.
    """

    engine: str = ""
    language: str | None = None


@dataclass
class ReplyWords(Event):
    """The audio that speaks ``text`` (words of turn ``turn_id``'s reply) was delivered to play
    from ``at``: what the user hears, and what their microphone may hear back (echo).

    Attributes:
        text: the words, as the TTS was given them.
        at: when their audio starts playing (monotonic s).
    """

    text: str = ""
    at: float = 0.0


@dataclass
class ResponseDone(Event):
    """The end of a response reached the sink (all its audio was delivered).

    Attributes:
        usage: the LLM's token counts (``input_tokens``, ``output_tokens``) when the backend reported them.
    """

    text: str = ""
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


@dataclass
class EngineWait(Event):
    """A response waited for an in-process LLM engine shared by every session of the process.

    ``turn_id`` is 0: the backend that waits does not know the turn.

    Attributes:
        wait_ms: from the request until the engine was free for it, ms.
    """

    wait_ms: float = 0.0


@dataclass
class ResponseInterrupted(Event):
    """The user barged in while this turn's reply was playing.

    Attributes:
        heard_text: the words played before the interruption.
        audio_end_ms: how much of the reply's audio was played, ms.
        revision: the revision of the turn the reply answered (a turn reopened after its
            endpoint has a later one, with a reply of its own).
    """

    heard_text: str = ""
    audio_end_ms: float = 0.0
    revision: int = 0


@dataclass
class ReplyCut(Event):
    """The LLM stage cut its history of turn ``turn_id``'s reply to what the user heard (after a
    :class:`ResponseInterrupted`, or a client's ``conversation.item.truncate``).

    Attributes:
        heard_text: the words kept.
    """

    heard_text: str = ""


@dataclass
class ReplyPaused(Event):
    """User speech (turn ``turn_id``) paused the assistant's audio; the words will decide.

    Attributes:
        at: monotonic time the user started speaking (the audio is paused from there), s.
        reply_turn_ids: the turns whose replies were in flight.
    """

    at: float = 0.0
    reply_turn_ids: list[int] = field(default_factory=list)


@dataclass
class ReplyResumed(Event):
    """What the user said during the reply (turn ``turn_id``) did not interrupt it: it plays on
    from where it stopped, and the speech is neither answered nor kept in history.

    Attributes:
        reason: ``"backchannel"`` ("yeah", "mm-hmm"), ``"false_start"`` (no words worth
            answering), ``"echo"`` (only words the voice had just played: its own echo),
            ``"no_words"`` (the STT heard nothing) or ``"too_short"`` (shorter than
            ``min_speech_ms``).
        text: the transcript, if any.
        paused_ms: how long the reply was paused, ms.
    """

    reason: str = ""
    text: str = ""
    paused_ms: float = 0.0


@dataclass
class BargeIn(Event):
    """User speech (turn ``turn_id``) interrupts the replies in flight: they are cancelled.

    Attributes:
        reason: ``"words"`` (the transcript, or a partial one, is not a backchannel) or
            ``"timeout"`` (no verdict within ``--resume_within_ms`` of the speech's start, or
            of its end once it ended).
        text: the words that decided, if any.
        at: monotonic time the user started speaking (the replies are cut there), s.
        decision_ms: from the start of the user's speech to this decision, ms.
        keep_turn_ids: the user turns that survive the cancel (this one and any other still
            being judged).
    """

    reason: str = ""
    text: str = ""
    at: float = 0.0
    decision_ms: float = 0.0
    keep_turn_ids: list[int] = field(default_factory=list)


@dataclass
class TurnMetrics(Event):
    """Per-turn latencies in ms; None where a stage did not run (e.g. typed turns).

    Attributes:
        stt_ms: STT processing time.
        ttft_ms: LLM request start → first token.
        ttfa_ms: LLM request start → first audio at the sink.
        voice_to_voice_ms: end of user speech → first assistant audio at the sink.
        endpoint_delay_ms: end of user speech → VAD endpoint decision.
        endpoint_by: what ended the user's turn (see :class:`SpeechStopped`).
        voice: the TTS engine that spoke the reply and its language (``"espeak-ng fr"``), or None.
    """

    stt_ms: float | None = None
    ttft_ms: float | None = None
    ttfa_ms: float | None = None
    voice_to_voice_ms: float | None = None
    endpoint_delay_ms: float | None = None
    endpoint_by: str | None = None
    voice: str | None = None


@dataclass
class StageError(Event):
    """A stage failed on one item and carried on."""

    stage: str = ""
    message: str = ""


Subscriber = Callable[[Event], None]


class EventBus:
    """Synchronous publish/subscribe for events. Thread-safe.

    Subscribers run on the publishing thread; a subscriber that raises is logged
    and does not affect the publisher or other subscribers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        """Register ``subscriber`` to receive every later event."""
        with self._lock:
            self._subscribers.append(subscriber)

    def publish(self, event: Event) -> None:
        """Deliver ``event`` to all subscribers, in subscription order."""
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            try:
                subscriber(event)
            except Exception:
                logger.exception("event subscriber failed on %s", event.kind)
