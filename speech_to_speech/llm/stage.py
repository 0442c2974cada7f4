"""The shared LLM stage: provider events, streaming to speech, and the response life cycle.

Every backend turns its output into four small provider events
(:class:`TextDelta`, :class:`AssistantMessage`, :class:`ToolCall`, :class:`Usage`).
Everything else is written here, once:

* streaming to speech: unspeakable characters removed, sentences split with
  NLTK Punkt, the first sentence sent alone at once, later ones in batches;
  text-only responses get the raw deltas instead;
* cancellation: the turn's stamp is checked before every side effect (usage
  excepted, it is billing);
* history: a transactional :class:`~speech_to_speech.llm.chat.Chat`, written
  provisionally and committed only if the turn is still current; a tool call
  is committed on its own once the client is shown it (:class:`~speech_to_speech.llm.upstream.CommitToolCall`),
  so that its output always pairs with it;
* the follow-up to tool results generated ahead, held until the client's
  request claims it (:mod:`speech_to_speech.llm.hidden_response`);
* errors: an empty request fails early, a timeout speaks an apology, any other
  exception is recorded and, if nothing was said yet, a fallback line is spoken;
  so is a spoken reply with nothing to hear (no text, or only markdown and emoji);
* exactly one :class:`EndOfResponse` per response, whatever happened.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.events import (
    AssistantText,
    Event,
    FirstToken,
    ResponseStarted,
    ToolCallEvent,
    UserTranscript,
)
from speech_to_speech.core.handler import SHOWN_AS_EVENT, BaseHandler
from speech_to_speech.core.messages import (
    EndOfResponse,
    FunctionOutput,
    PartialTranscript,
    ResponseRequest,
    TextOutput,
    ToolCallRequest,
    Transcript,
    TTSInput,
)
from speech_to_speech.core.speculation import SpeculativeTurns
from speech_to_speech.llm.api import (
    AssistantMessage,
    EmptyRequestError,
    LLMConfig,
    LLMRequest,
    ProviderEvent,
    ProviderTimeout,
    TextDelta,
    ToolCall,
    Usage,
    summary_request,
)
from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.hidden_response import FollowUpAhead, HiddenResponse
from speech_to_speech.llm.prefetch import PrefetchCoordinator, ResponsePrefetchTransaction
from speech_to_speech.llm.prompts import build_text_system_prompt, build_voice_system_prompt, reply_language
from speech_to_speech.llm.provider_reader import STALLED, read_with_deadlines
from speech_to_speech.llm.replies import RepliesInHistory
from speech_to_speech.llm.tools.prompt import build_tool_prompt
from speech_to_speech.speech.text import SentenceStreamer, is_speakable, remove_unspeakable
from speech_to_speech.speech.words import WordStreamer

logger = logging.getLogger(__name__)

#: spoken when a response fails before saying anything
FAILURE_FALLBACK = "Sorry, I'm having trouble responding right now. Please try again."
#: spoken when the provider does not answer in time
TIMEOUT_APOLOGY = "Sorry, I'm a bit slow right now. Could you say that again?"
#: tool calls remembered between their emission and the moment the client is shown them
MAX_CALLS_IN_FLIGHT = 64


@dataclass
class _ResponseState:
    """Book-keeping of one response inside :meth:`BaseLLMHandler._generate`."""

    stamp: Stamp
    key: str
    wants_audio: bool
    publish: Callable[[Event], None]  # the bus's, or the hidden response's (held until claimed)
    deltas: list[str] = field(default_factory=list)
    final_text: str | None = None
    tool_calls: int = 0
    spoken: bool = False
    usage: Usage | None = None
    error: str | None = None
    cancelled: bool = False
    language: str | None = None  # of the user's turn: the reply is spoken in it
    said_instead: str = ""  # the stage's own line said for a failed reply (the apology, the fallback)
    after_tool_output: bool = False  # the request answers tool results
    held: HiddenResponse | None = None  # a follow-up generated ahead: what it holds until claimed

    @property
    def text(self) -> str:
        """The reply's text so far: the provider's whole message if it sent one, else the deltas."""
        return self.final_text if self.final_text is not None else "".join(self.deltas)


class BaseLLMHandler(FollowUpAhead, BaseHandler):
    """Consumes :class:`Transcript`; emits :class:`TTSInput` / :class:`TextOutput` /
    :class:`ToolCallRequest` in order, then exactly one :class:`EndOfResponse`.

    Subclasses implement :meth:`load` and :meth:`events`.

    Attributes:
        chat: the conversation history.
        tools: function tools offered to the model (flat Responses shape).
    """

    def __init__(
        self,
        *args: Any,
        config: LLMConfig,
        device: str = "cpu",
        prefetch: PrefetchCoordinator | None = None,
        speculation: SpeculativeTurns | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.speculation = speculation  # unconfirmed speculative turns (None: no speculation)
        self.config = config
        self.device = device
        self.chat = Chat(size=config.history_turns, compactor=self._compact if config.compact_history else None)
        self.tools: list[dict[str, Any]] = []
        self.tool_choice = "auto"
        #: speculative follow-ups to tool results (a realtime session's; None: none generated ahead)
        self.prefetch = prefetch
        self.default_wants_audio = True  # modality of responses nobody asked for yet (prefetch)
        self._hidden: tuple[str, HiddenResponse] | None = None  # the follow-up generated ahead, by key
        self.replies = RepliesInHistory(self.chat, keep=4 * config.history_turns)  # for cuts to what was heard
        self._history_lock = self.replies.lock  # commit vs. cutting a reply to what was heard
        self._user_items: dict[int, str] = {}  # turn id -> id of its user message
        #: calls emitted downstream and not yet shown to the client: call id -> (response key, stored item)
        self._calls_in_flight: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()

    def emit(self, item: Any) -> bool:
        """Send ``item`` on; after an output of an unconfirmed speculative turn, wait for its endpoint
        (TTS starts on it; the response cannot finish before the turn is confirmed or superseded)."""
        sent = super().emit(item)
        if sent and self.speculation is not None:
            self.speculation.wait_after(item, self.stop_event, self.poll_s)
        return sent

    # -- backend hooks --------------------------------------------------------------
    def setup(self) -> None:
        self.load()

    def load(self) -> None:
        """Load the model or open the client (called once from :meth:`setup`)."""
        raise NotImplementedError

    def events(self, request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        """Yield provider events for ``request``; stop soon after ``should_stop()``.

        Raises:
            ProviderTimeout: when the provider did not answer in time.
        """
        raise NotImplementedError

    def cleanup(self) -> None:
        self.chat.close()

    def response_timeout_s(self) -> float | None:
        """The longest a whole response may take, s (None: no limit); providers bound it."""
        return None

    def first_token_deadline_s(self, request: LLMRequest) -> float | None:
        """The longest the first text or tool call of ``request`` may take, s (None: no limit)."""
        return self.config.first_token_timeout_s or None

    def abort_request(self) -> None:
        """Unblock a provider read that is stuck (called from the stage thread when it gives up
        on a response while the backend is still inside :meth:`events`); best effort."""

    #: False for engines whose calls must stay on the stage's own thread: :meth:`events` is then
    #: iterated there, without the helper thread that keeps the first-token and response time-outs
    events_in_helper_thread = True

    #: True when the backend passes tools to the model natively (providers);
    #: False when tools are described in the system prompt (local models)
    native_tools = True

    #: True when the model reads images (``input_image`` parts); a session refuses images for one
    #: that does not (see docs/images.md)
    accepts_images = False

    #: True when the model follows the compact voice prompt better than the full one (small
    #: models; see :func:`~speech_to_speech.llm.prompts.build_voice_system_prompt`)
    compact_voice_prompt = False

    # -- requests ---------------------------------------------------------------------
    def system_prompt(
        self,
        wants_audio: bool,
        language_code: str | None,
        instructions: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str = "auto",
    ) -> str:
        """The system prompt for a response: voice or text rules, a reply-language rule (the
        detected language with ``language`` auto, the set one when it is not English) and, for
        backends without native tools, a tools block."""
        language = reply_language(self.config.language, language_code)
        offered = bool(tools) and tool_choice != "none"
        tools_block = build_tool_prompt(tools or [], voice=wants_audio) if offered and not self.native_tools else ""
        persona = self.config.system_prompt if instructions is None else instructions
        if not wants_audio:
            return build_text_system_prompt(persona, tools_block, language)
        return build_voice_system_prompt(
            persona, tools_block, language, tools_offered=offered, compact=self.compact_voice_prompt
        )

    def build_request(self, item: Transcript) -> LLMRequest:
        """The request answering ``item`` from the current history."""
        return LLMRequest(
            system_prompt=self.system_prompt(item.wants_audio, item.language, None, self.tools, self.tool_choice),
            items=self.chat.items(),
            tools=list(self.tools),
            tool_choice=self.tool_choice,
            wants_audio=item.wants_audio,
            max_output_tokens=self.config.max_new_tokens,
            temperature=self.config.temperature,
        )

    # -- the stage --------------------------------------------------------------------
    def process(self, item: Any) -> Iterator[Any]:
        if isinstance(item, PartialTranscript):
            # the newest is put first: older ones still queued (this stage was busy) are stale
            if self.input_queue is not None:
                self.input_queue.drop_where(lambda queued: isinstance(queued, PartialTranscript))
            if self.gate.admits(item.stamp):
                self.on_partial_transcript(item.text)
            return
        if isinstance(item, FunctionOutput):
            self.chat.append_tool_output(item.call_id, item.output)
            if self.prefetch is not None and self._all_calls_answered():
                yield from self._prefetch()
            return
        if isinstance(item, ResponseRequest):
            held = self._claim(item)
            if held is not None:  # the follow-up generated ahead is this response
                yield from held
                return
            self.discard_follow_up("response request")  # it answers the history as it is
            if not self.gate.admits(item.stamp):
                yield EndOfResponse(item.stamp, error="cancelled")
                return
            answering = Transcript(item.stamp, "", language=self.latest_language(), wants_audio=item.wants_audio)
            request = self.build_request(answering)
            if item.tools is not None:
                request.tools = list(item.tools)
            if item.tool_choice is not None:
                request.tool_choice = item.tool_choice
            request.system_prompt = self.system_prompt(
                item.wants_audio, answering.language, item.instructions, request.tools, request.tool_choice
            )
            yield from self._generate(answering, request)
            return
        stamp = item.stamp
        if not self.gate.admits(stamp):
            if item.respond:
                yield EndOfResponse(stamp, error="cancelled")
            return
        if item.stt_ms is None:  # typed turns have no STT event upstream
            self.bus.publish(UserTranscript(stamp.turn_id, text=item.text, language=item.language))
        if not item.text.strip():
            logger.warning("%s: turn %d has no text to answer", self.name, stamp.turn_id)
            if item.respond:
                yield EndOfResponse(stamp, error="empty request: no user text")
            return
        self._add_user_text(stamp, item.text, item.language)
        if item.respond:
            yield from self._generate(item, self.build_request(item))

    def _add_user_text(self, stamp: Stamp, text: str, language: str | None = None) -> None:
        """Add the user's turn (with its ``language``, ISO 639-1, when known), or edit it in place
        when this is a new revision of it."""
        previous = self._user_items.get(stamp.turn_id)
        if stamp.revision > 0 and previous is not None and self.chat.replace_user_message_text(previous, text):
            return
        message = {"type": "message", "role": "user", "content": text}
        if language:
            message["language"] = language
        stored = self.chat.add_item(message)
        self._user_items[stamp.turn_id] = stored["id"]
        while len(self._user_items) > 4 * self.config.history_turns:
            self._user_items.pop(next(iter(self._user_items)))

    def latest_language(self) -> str | None:
        """The language (ISO 639-1) of the latest user turn in history that has one, else None:
        what a reply that answers no transcript (``response.create``, a tool follow-up) is in."""
        for item in reversed(self.chat.items()):
            if item.get("role") == "user" and item.get("language"):
                return str(item["language"])
        return None

    def apply_heard_text(self, turn_id: int, heard: str, revision: int | None = None) -> None:
        """Cut the assistant's reply to turn ``turn_id`` (to its revision ``revision``; None: the
        latest) to the words the user heard: see :meth:`RepliesInHistory.cut`. Called on barge-in."""
        self.replies.cut(turn_id, heard, revision)

    def _stale(self, stamp: Stamp) -> bool:
        return self.stop_event.is_set() or not self.gate.admits(stamp)

    def _generate(
        self, item: Transcript, request: LLMRequest, txn: ResponsePrefetchTransaction | None = None
    ) -> Iterator[Any]:
        held = self._hidden[1] if txn is not None and self._hidden is not None else None
        publish = held.publish if held is not None else self.bus.publish
        st = _ResponseState(item.stamp, f"resp_{uuid.uuid4().hex}", item.wants_audio, publish, language=item.language)
        st.after_tool_output = bool(request.items) and request.items[-1].get("type") == "function_call_output"
        st.held = held
        if txn is not None:
            txn.on_rollback(lambda: self.chat.cancel_provisional_generation(st.key))
        self.replies.started(st.stamp.turn_id, st.key, st.stamp.revision)
        sent = False
        try:
            if not any(i.get("role") == "user" or i.get("type") == "function_call_output" for i in request.items):
                raise EmptyRequestError("empty request: no user input to answer")
            st.publish(ResponseStarted(st.stamp.turn_id, item.speech_end_time or None, st.stamp.revision))
            start = time.monotonic()
            sent = True

            def should_stop() -> bool:  # a follow-up generated ahead also stops on a discard sent to it
                return (held is not None and self._discard_waiting()) or self._stale(st.stamp)

            yield from self._consume(st, self._timed_events(request, should_stop, start), start)
        except EmptyRequestError as exc:
            st.error = str(exc)
            logger.warning("%s: %s", self.name, exc)
        except ProviderTimeout as exc:
            st.error = f"timeout: {exc}"
            logger.warning("%s: provider timeout (%s)", self.name, exc)
            if not self._stale(st.stamp):
                st.spoken = True
                yield self._tts_or_text(st, TIMEOUT_APOLOGY)
        except Exception as exc:  # a failing provider must never end the session
            st.error = f"{type(exc).__name__}: {exc}"
            logger.exception("%s: generation failed", self.name, extra=SHOWN_AS_EVENT)
        yield from self._finish(st, sent, txn)

    def _timed_events(
        self, request: LLMRequest, should_stop: Callable[[], bool], start: float
    ) -> Iterator[ProviderEvent]:
        """:meth:`events` read in a helper thread (see :func:`read_with_deadlines`), so that the
        stage keeps its deadlines and its cancellation while the backend is blocked (a provider
        that accepted the request and sends nothing, an engine busy with another session).

        Raises:
            ProviderTimeout: no first token within :meth:`first_token_deadline_s`, no next one within
                ``config.next_token_timeout_s``, or no end within :meth:`response_timeout_s`; the
                backend is told to stop (and :meth:`abort_request` unblocks it if it does not).
        """
        if not self.events_in_helper_thread:
            yield from self.events(request, should_stop)
            return
        yield from read_with_deadlines(
            lambda abandoned: self.events(request, lambda: abandoned() or should_stop()),
            f"{self.name}:provider",
            should_stop,
            start,
            (self.first_token_deadline_s(request), self.config.next_token_timeout_s or None, self.response_timeout_s()),
            self.abort_request,
        )

    def _consume(self, st: _ResponseState, events: Iterator[ProviderEvent], start: float) -> Iterator[Any]:
        streamer: SentenceStreamer | WordStreamer = (
            WordStreamer() if self.config.stream_words else SentenceStreamer(self.config.stream_batch_sentences)
        )
        try:
            for event in events:
                if st.held is not None and not st.held.released:  # is the client's request for it next?
                    yield from self._between_events(st)
                    if st.cancelled:
                        return
                if event is STALLED:  # the provider paused: a whole sentence held for more text goes now
                    if st.wants_audio and isinstance(streamer, SentenceStreamer) and not self._stale(st.stamp):
                        for batch in streamer.flush_complete():
                            yield from self._speak(st, batch)
                    continue
                if isinstance(event, Usage):
                    st.usage = event
                    continue
                if self._stale(st.stamp):
                    st.cancelled = True
                    return
                if isinstance(event, AssistantMessage):
                    st.final_text = event.text
                elif isinstance(event, ToolCall):
                    yield from self._flush_sentences(st, streamer)  # speech before the call goes first
                    if self._stale(st.stamp):
                        st.cancelled = True
                        return
                    yield from self._record_tool_call(st, event)
                elif isinstance(event, TextDelta) and event.text:
                    if not st.deltas:
                        ttft = (time.monotonic() - start) * 1000
                        st.publish(FirstToken(st.stamp.turn_id, ttft_ms=ttft))
                    st.deltas.append(event.text)
                    if not st.wants_audio:
                        yield TextOutput(st.stamp, event.text)
                        continue
                    for batch in streamer.push(event.text):
                        if self._stale(st.stamp):
                            st.cancelled = True
                            return
                        yield from self._speak(st, batch)
            if not self._stale(st.stamp):
                if st.usage is not None and st.usage.at_token_limit and isinstance(streamer, SentenceStreamer):
                    self._drop_unfinished(st, streamer)
                yield from self._flush_sentences(st, streamer)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def _drop_unfinished(self, st: _ResponseState, streamer: SentenceStreamer) -> None:
        """A spoken reply cut at ``max_new_tokens`` ends at its last whole sentence: the unfinished
        one is neither spoken nor kept in history (see :meth:`SentenceStreamer.drop_unfinished`)."""
        dropped = streamer.drop_unfinished()
        if not dropped:
            return
        text = st.text.rstrip()
        if text.endswith(dropped):
            st.final_text = text[: -len(dropped)].rstrip()
        logger.info("%s: turn %d hit max_new_tokens; unfinished %r not spoken", self.name, st.stamp.turn_id, dropped)

    def _flush_sentences(self, st: _ResponseState, streamer: SentenceStreamer | WordStreamer) -> Iterator[Any]:
        for batch in streamer.flush():
            yield from self._speak(st, batch)

    def _speak(self, st: _ResponseState, text: str) -> Iterator[TTSInput]:
        clean = remove_unspeakable(text)
        clean = clean.rstrip() if self.config.stream_words else clean.strip()  # words keep their leading space
        if is_speakable(clean):
            st.spoken = True
            yield TTSInput(st.stamp, clean, st.language)

    @staticmethod
    def _tts_or_text(st: _ResponseState, text: str) -> TTSInput | TextOutput:
        """One of the stage's own (English) sentences, spoken or as text."""
        st.said_instead = text
        return TTSInput(st.stamp, text, "en") if st.wants_audio else TextOutput(st.stamp, text)

    def _record_tool_call(self, st: _ResponseState, call: ToolCall) -> Iterator[ToolCallRequest]:
        """Write the call to history before anyone can see it, then emit it.

        The call is provisional, like the rest of the response, until the client is shown it
        (:class:`~speech_to_speech.llm.upstream.CommitToolCall`, see :meth:`commit_shown_call`);
        from then on it stays in history whatever happens to the rest of the response, so that its
        output pairs with it.
        """
        item = {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
        stored = None if self._stale(st.stamp) else self.chat.add_provisional_generation_items(st.key, [item])
        if not stored:
            st.cancelled = True
            return
        with self._history_lock:
            self._calls_in_flight[call.call_id] = (st.key, stored[0])
            while len(self._calls_in_flight) > MAX_CALLS_IN_FLIGHT:
                self._calls_in_flight.popitem(last=False)
        st.tool_calls += 1
        event = ToolCallEvent(st.stamp.turn_id, call_id=call.call_id, name=call.name, arguments=call.arguments)
        st.publish(event)
        yield ToolCallRequest(st.stamp, call.call_id, call.name, call.arguments)

    def commit_shown_call(self, call_id: str) -> None:
        """The client was shown call ``call_id`` (a ``CommitToolCall``, in this stage's
        thread): it stays in history from now on, even if the response that made it was cancelled
        or rolled back meanwhile (then it is written again, at the end). Unknown ids are ignored."""
        with self._history_lock:
            entry = self._calls_in_flight.pop(call_id, None)
            if entry is not None:
                self.chat.commit_provisional_call(*entry)

    def _finish(self, st: _ResponseState, sent: bool, txn: ResponsePrefetchTransaction | None = None) -> Iterator[Any]:
        text = st.text.strip()
        stale = st.cancelled or self._stale(st.stamp)
        if not stale and st.error is None and sent and st.wants_audio and not st.spoken and not st.tool_calls:
            # nothing to hear (no text, or only markdown and emoji): the listener gets the fallback, not silence
            st.error = "empty reply: nothing speakable"
            logger.warning("%s: turn %d got an empty reply", self.name, st.stamp.turn_id)
        if not stale and st.error is not None and sent and not st.spoken:
            st.spoken = True
            yield self._tts_or_text(st, FAILURE_FALLBACK)
        committed = False
        # a failed reply to tool results keeps the line it said, so that the next turn does not answer them
        said = st.said_instead if st.error and st.after_tool_output and txn is None and not text else ""
        if not stale and (st.error is None or said):
            try:
                assistant = [{"type": "message", "role": "assistant", "content": text or said}] if text or said else []
                with self._history_lock:
                    stored = self.chat.add_provisional_generation_items(st.key, assistant) if assistant else []
                    if stored is None:
                        raise RuntimeError("response was cancelled before it was written")
                    if stored:
                        self.replies.written(st.stamp.turn_id, st.key, stored[0]["id"])
                committed = True
                if txn is None:
                    self._commit(st.key)
                else:  # a hidden follow-up: history becomes final only if a client claims it
                    txn.complete(lambda: self._commit(st.key))
            except Exception as exc:
                st.error = f"history: {exc}"
                logger.exception("%s: history write failed", self.name, extra=SHOWN_AS_EVENT)
        if not committed:
            if stale:
                self.chat.cancel_provisional_generation(st.key)
            else:
                self.chat.rollback_provisional_generation(st.key)
        if stale:
            st.error = st.error or "cancelled"
        else:
            st.publish(AssistantText(st.stamp.turn_id, text=text, error=st.error))
        if not text and st.tool_calls == 0 and st.error is None:
            logger.warning("%s: turn %d got an empty text reply", self.name, st.stamp.turn_id)
        usage = {"input_tokens": st.usage.input_tokens, "output_tokens": st.usage.output_tokens} if st.usage else {}
        yield EndOfResponse(st.stamp, text=text, error=st.error, usage=usage)

    def _commit(self, key: str) -> None:
        self.chat.finalize_provisional_generation(key)
        self.chat.trim_if_needed()
        self.chat.compact_audio_history(self.config.audio_history_turns)
        self.chat.compact_image_history(self.config.image_history_turns)

    def on_partial_transcript(self, text: str) -> None:
        """The words of the turn being spoken so far (a :class:`PartialTranscript`, in this stage's
        thread): a backend that can evaluate the prompt ahead starts on it here, without blocking
        (llama-cpp does); by default nothing."""

    # -- history compaction -------------------------------------------------------------
    def _compact(self, items: list[dict[str, Any]]) -> tuple[str, str]:
        """Summarise ``items`` with this backend (runs in the Chat's compaction thread)."""
        events = self.events(summary_request(items), self.stop_event.is_set)
        summary = "".join(e.text for e in events if isinstance(e, TextDelta))
        return "(Our earlier conversation, summarised.)", summary.strip()
