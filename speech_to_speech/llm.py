"""The shared LLM stage: history, streaming to speech, and the response life cycle.

Backends subclass :class:`BaseLLMHandler` and implement only :meth:`load` and
:meth:`stream` (turn a message list into raw text deltas). Sentence batching,
cancellation checks, history write-back, error handling and the single
end-of-response marker are written here, once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from speech_to_speech.chat import Chat, Message
from speech_to_speech.events import AssistantText, FirstToken, ResponseStarted, UserTranscript
from speech_to_speech.handler import BaseHandler
from speech_to_speech.messages import EndOfResponse, Transcript, TTSInput
from speech_to_speech.text import SentenceStreamer, is_speakable, remove_unspeakable

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful, friendly voice assistant. Answer in one or two short sentences. "
    "Do not use markdown, lists or emoji: your words are spoken aloud."
)
#: Spoken when a response fails before saying anything.
FAILURE_FALLBACK = "Sorry, I'm having trouble responding right now. Please try again."


@dataclass
class LLMConfig:
    """Settings shared by every LLM backend.

    Attributes:
        llm_model: model folder, file or hub id ("" = the backend's embedded default).
        system_prompt: the system message.
        max_new_tokens: cap on generated tokens per response.
        temperature: sampling temperature; 0 means greedy decoding.
        history_turns: user turns kept in the conversation history.
        stream_batch_sentences: sentences per TTS batch after the first.
    """

    llm_model: str = ""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_new_tokens: int = 96
    temperature: float = 0.0
    history_turns: int = 8
    stream_batch_sentences: int = 1


class BaseLLMHandler(BaseHandler):
    """Consumes :class:`Transcript`, emits :class:`TTSInput` and one :class:`EndOfResponse`.

    Subclasses implement :meth:`load` (in :meth:`setup`) and :meth:`stream`.
    """

    def __init__(self, *args: object, config: LLMConfig, device: str = "cpu", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device
        self.chat = Chat(config.system_prompt, max_turns=config.history_turns)
        self.load_seconds: float | None = None

    def setup(self) -> None:
        start = time.monotonic()
        self.load()
        self.load_seconds = time.monotonic() - start
        logger.info("%s loaded in %.1f s", self.name, self.load_seconds)

    def load(self) -> None:
        """Load the model (called once from :meth:`setup`)."""
        raise NotImplementedError

    def stream(self, messages: list[Message], should_stop: Callable[[], bool]) -> Iterator[str]:
        """Yield raw text deltas of the assistant reply to ``messages``.

        Implementations should stop soon after ``should_stop()`` turns true.
        """
        raise NotImplementedError

    def process(self, item: Transcript) -> Iterator[TTSInput | EndOfResponse]:
        stamp = item.stamp
        if not self.gate.admits(stamp):
            return
        if item.stt_ms is None:  # typed turns have no STT event upstream
            self.bus.publish(UserTranscript(stamp.turn_id, text=item.text, language=item.language))
        if not item.text.strip():
            yield EndOfResponse(stamp, error="empty request")
            return
        yield from self._respond(item)

    def _respond(self, item: Transcript) -> Iterator[TTSInput | EndOfResponse]:
        stamp = item.stamp
        messages = self.chat.messages_for(item.text)
        streamer = SentenceStreamer(self.config.stream_batch_sentences)
        reply: list[str] = []
        spoken = False
        error: str | None = None
        start = time.monotonic()
        self.bus.publish(ResponseStarted(stamp.turn_id, speech_end_time=item.speech_end_time or None))

        def stale() -> bool:
            return self.stop_event.is_set() or not self.gate.admits(stamp)

        try:
            for delta in self.stream(messages, stale):
                if stale():
                    break
                if not reply:
                    self.bus.publish(FirstToken(stamp.turn_id, ttft_ms=(time.monotonic() - start) * 1000))
                reply.append(delta)
                for batch in streamer.push(delta):
                    tts_input = self._speakable(stamp, batch)
                    if tts_input is not None and not stale():
                        spoken = True
                        yield tts_input
            if not stale():
                for batch in streamer.flush():
                    tts_input = self._speakable(stamp, batch)
                    if tts_input is not None:
                        spoken = True
                        yield tts_input
        except Exception as exc:  # a failing backend must not kill the session
            logger.exception("%s generation failed", self.name)
            error = f"{type(exc).__name__}: {exc}"
        text = "".join(reply).strip()
        if not stale():
            if error is None and not text:
                error = "empty reply"
            if error is not None and not spoken:
                yield TTSInput(stamp, FAILURE_FALLBACK)
            if error is None:
                self.chat.commit(item.text, text)
            self.bus.publish(AssistantText(stamp.turn_id, text=text, error=error))
        yield EndOfResponse(stamp, text=text, error=error)

    @staticmethod
    def _speakable(stamp: object, text: str) -> TTSInput | None:
        clean = remove_unspeakable(text).strip()
        if not is_speakable(clean):
            return None
        return TTSInput(stamp, clean)  # type: ignore[arg-type]
