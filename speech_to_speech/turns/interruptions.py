"""Interruptions that are real: user speech during a reply pauses it; what was said decides.

A person who hears "yeah" or "mm-hmm" while talking goes on; one who hears "wait,
stop" stops. So when the user starts speaking while a reply is in flight (from its
LLM request until its end at the sink), the VAD no longer cancels it: it publishes
:class:`~speech_to_speech.core.events.SpeechStarted` with ``pauses_reply``, the reply's
audio is paused (the judge publishes :class:`~speech_to_speech.core.events.ReplyPaused`
and the pipeline puts a ``Pause`` in the sink's queue; the sink stops within one device
block, as for a cut), and :class:`Interruptions` waits for the words:

* a backchannel (:func:`~speech_to_speech.turns.backchannel.is_backchannel`), a false
  start (:func:`~speech_to_speech.turns.backchannel.is_false_start`, an empty transcript),
  the voice's own echo (:func:`~speech_to_speech.turns.backchannel.is_echo`: the words it
  played in the last :data:`ECHO_MEMORY_S`, from :class:`~speech_to_speech.core.events.ReplyWords`)
  or speech shorter than ``min_speech_ms`` resumes the reply from where it stopped
  (:class:`~speech_to_speech.core.events.ReplyResumed`, then ``Resume``); its transcript
  never reaches the LLM (:class:`TurnJudge` drops it), so it is neither
  answered nor written to history;
* anything else, a partial transcript of more words than a backchannel has, or no
  verdict in time (``resume_within_ms`` after the speech started, or after it ended
  if it ended before that) is a real interruption
  (:class:`~speech_to_speech.core.events.BargeIn`): the pipeline bumps the cancel
  generation, keeping the user's turn valid (:meth:`~speech_to_speech.core.cancel.Gate.cancel`),
  flushes stale work and cuts the reply where the user started speaking, as before. The
  transcript goes on to the LLM only once the LLM stage has cut the interrupted replies in
  its history (:class:`~speech_to_speech.core.events.ReplyCut`, at most :data:`CUT_WAIT_S`).

If the user speaks on after a resume (a superseded or reopened backchannel), the
reply is paused and judged again, with the whole utterance.

The judge is a stage of its own, :class:`TurnJudge`, between the STT and the LLM: the
transcripts pass through it, the pipeline's events reach it as :class:`JudgeEvent` messages
ahead of the data in its queue, and it keeps the verdict's deadline with its own wait on that
queue. Everything it decides, it decides in its thread.

:class:`RepliesInFlight` is the book-keeping both use: which turns have a reply in
flight and whether any of its audio reached the sink. A reply cancelled before that
had nothing heard: it gets a :class:`~speech_to_speech.core.events.ResponseInterrupted`
with no words, so history keeps no text of it (only the interruption marker).
"""

from __future__ import annotations

import collections
import logging
import queue
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from speech_to_speech.core.events import (
    BargeIn,
    EmptyTranscript,
    Event,
    EventBus,
    ReplyCut,
    ReplyPaused,
    ReplyResumed,
    ReplyWords,
    ResponseDone,
    SpeechDiscarded,
    SpeechStarted,
    SpeechStopped,
    TurnSpeculated,
    TurnSuperseded,
    UserTranscriptDelta,
)
from speech_to_speech.core.handler import BaseHandler, StageControl
from speech_to_speech.core.messages import Transcript
from speech_to_speech.turns.backchannel import MAX_BACKCHANNEL_WORDS, is_backchannel, is_echo, is_false_start
from speech_to_speech.turns.replies import RepliesInFlight
from speech_to_speech.turns.vad import BaseVADHandler

logger = logging.getLogger(__name__)

#: how long a real interruption's transcript waits for the interrupted replies to be cut in
#: history before it goes on to the LLM (normally a few ms: the sink's report), s
CUT_WAIT_S = 0.5
#: user turns remembered as resolved (dropped as backchannels), to re-judge if they go on
RESOLVED_KEPT = 16
#: a partial transcript with at least this many words that is not a backchannel interrupts at once
#: (more than a backchannel has: a partial pass over a short "mm hmm" can read "and then them")
PARTIAL_WORDS = MAX_BACKCHANNEL_WORDS + 1
#: the words the voice played in this long before now are what its echo may repeat, s (the
#: speech being judged, up to 30 s, plus the echo's delay)
ECHO_MEMORY_S = 10.0


def clearly_words(text: str, language: str | None = "en") -> bool:
    """Whether a (partial) transcript already shows an interruption: at least
    :data:`PARTIAL_WORDS` words, neither a backchannel nor a false start."""
    words = re.findall(r"[\w']+", text)
    return len(words) >= PARTIAL_WORDS and not is_false_start(text) and not is_backchannel(text, language)


class Interruptions:
    """Judges user speech that paused a reply: resume it, or interrupt for real.

    The decisions are published as events (:class:`ReplyPaused`, :class:`ReplyResumed`,
    :class:`BargeIn`); the pipeline acts on them (control messages to the sink, the
    cancel and flush). Inputs: the pipeline's events (:meth:`on_event`), the STT's transcripts
    (:meth:`judge`) and the clock (:meth:`expire`). Not thread-safe: :class:`TurnJudge` calls
    it, in its own thread.

    Args:
        bus: the pipeline's event bus (where the decisions are published).
        resume_within_ms: a paused reply resumes only on a verdict within this time after
            the user started speaking or, once they stopped, after they stopped (the words
            of a short utterance need the STT's time); later, the speech interrupts it, ms.
        hears_voice: the input can hear the assistant's voice (a speaker, a WebRTC call), so a
            transcript of its own words is its echo; False (a file, a WebSocket client): such
            a transcript is the user repeating them.
    """

    def __init__(self, bus: EventBus, resume_within_ms: int = 1500, hears_voice: bool = False) -> None:
        self.hears_voice = hears_voice
        self.bus = bus
        #: the replies in flight, as the judge's events tell it (:attr:`RepliesInFlight.EVENTS`)
        self.replies = RepliesInFlight()
        self.resume_within_s = resume_within_ms / 1000
        self._pending: dict[int, float] = {}  # user turn being judged -> when it started speaking
        self._paused_at: float | None = None
        self._resolved: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._cut: set[int] = set()  # reply turns reported cut since the last barge-in
        self._deadline: float | None = None  # when the pause's verdict is due (monotonic s)
        self._awaiting_cut: set[int] = set()  # audible replies an interruption's transcript waits for
        self._cut_deadline = 0.0  # when that transcript goes on anyway (monotonic s)
        self._played: collections.deque[ReplyWords] = collections.deque()  # the voice's words, oldest first

    # -- replies in flight ---------------------------------------------------------------------
    def reply_in_flight(self, other_than: int | None = None) -> bool:
        """Whether speech starting now would pause a reply (one in flight, not ``other_than``'s)."""
        return bool(self.replies.turns(other_than))

    @property
    def paused(self) -> bool:
        """A reply is paused, waiting for the words of :attr:`pending`."""
        return bool(self._pending)

    @property
    def pending(self) -> list[int]:
        """The user turns being judged."""
        return list(self._pending)

    # -- events -----------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        """Follow the replies, and open, resolve or decide a pause, from the pipeline's events."""
        if isinstance(event, RepliesInFlight.EVENTS):
            self.replies.on_event(event)
        if isinstance(event, SpeechStarted) and event.pauses_reply:
            self._open(event.turn_id, event.time)
        elif isinstance(event, TurnSuperseded):
            again = event.turn_id in self._resolved and event.turn_id not in self._pending
            if again and self.reply_in_flight(event.turn_id):
                self._open(event.turn_id, event.time)  # the "backchannel" goes on: judge it again, whole
        elif isinstance(event, (TurnSpeculated, SpeechStopped)):
            if event.turn_id in self._pending:
                self._arm()  # the speech ended: its words get their time from now
        elif isinstance(event, SpeechDiscarded):
            self._resolve(event.turn_id, "too_short", "")
        elif isinstance(event, EmptyTranscript):
            self._resolve(event.turn_id, "no_words", "")
        elif isinstance(event, UserTranscriptDelta):
            if event.turn_id in self._pending and clearly_words(event.text) and not self.echoes(event.text):
                self._barge_in(event.turn_id, "words", event.text)
        elif isinstance(event, ReplyWords) and self.hears_voice:
            self._played.append(event)
            while self._played and self._played[0].at < event.at - ECHO_MEMORY_S:
                self._played.popleft()
        elif isinstance(event, (ReplyCut, ResponseDone)):
            self._cut.add(event.turn_id)
            self._awaiting_cut.discard(event.turn_id)

    #: the event types :meth:`on_event` acts on (the pipeline delivers only these to the judge)
    EVENTS: ClassVar[tuple[type[Event], ...]] = (
        *RepliesInFlight.EVENTS,
        SpeechStarted,
        TurnSuperseded,
        TurnSpeculated,
        SpeechStopped,
        SpeechDiscarded,
        EmptyTranscript,
        UserTranscriptDelta,
        ReplyWords,
        ReplyCut,
    )

    # -- the STT's transcripts ----------------------------------------------------------------
    def judge(self, item: Transcript) -> bool:
        """Decide on the transcript of speech that paused a reply.

        Returns:
            True if the transcript goes on to the LLM (not a pausing turn, or a real
            interruption: then only once the interrupted replies are cut in history, see
            :meth:`waiting_for_cut`); False if it is dropped (the reply resumes).
        """
        turn = item.stamp.turn_id
        if turn not in self._pending:
            return True
        text = item.text
        if is_false_start(text):
            return not self._resolve(turn, "false_start", text)
        if self.echoes(text):
            return not self._resolve(turn, "echo", text)
        if is_backchannel(text, item.language):
            return not self._resolve(turn, "backchannel", text)
        self._barge_in(turn, "words", text, wait_for_cut=True)
        return True

    def echoes(self, text: str) -> bool:
        """Whether ``text`` only repeats words the voice played in the last :data:`ECHO_MEMORY_S`
        (never when the input cannot hear the voice: see ``hears_voice``)."""
        if not self.hears_voice:
            return False
        horizon = time.monotonic() - ECHO_MEMORY_S
        played = " ".join(words.text for words in self._played if words.at >= horizon)
        return is_echo(text, played)

    # -- the clock --------------------------------------------------------------------------------
    def waiting_for_cut(self, now: float | None = None) -> bool:
        """An interruption's transcript is waiting for the replies it cut to be cut in history
        (:class:`ReplyCut`), for at most :data:`CUT_WAIT_S`."""
        return bool(self._awaiting_cut) and (now or time.monotonic()) < self._cut_deadline

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (monotonic s), or None."""
        due = [self._deadline] if self._pending and self._deadline is not None else []
        if self._awaiting_cut:
            due.append(self._cut_deadline)
        return min(due) if due else None

    def expire(self, now: float | None = None) -> None:
        """No verdict in time on the speech being judged: it interrupts."""
        now = now or time.monotonic()
        if self._pending and self._deadline is not None and now >= self._deadline:
            self._barge_in(next(iter(self._pending)), "timeout", "")
        if self._awaiting_cut and now >= self._cut_deadline:
            self._awaiting_cut.clear()

    # -- decisions ----------------------------------------------------------------------------
    def _open(self, turn: int, at: float) -> None:
        first = not self._pending
        self._pending[turn] = at
        self._resolved.pop(turn, None)
        if not first:
            return
        self._paused_at = at
        self._arm()
        self.bus.publish(ReplyPaused(turn, at=at, reply_turn_ids=self.replies.turns(turn)))

    def _arm(self) -> None:
        """Give the verdict :attr:`resume_within_s` from now."""
        self._deadline = time.monotonic() + self.resume_within_s

    def _close(self) -> float:
        """End the pause; return how long it lasted, ms."""
        paused_ms = (time.monotonic() - (self._paused_at or time.monotonic())) * 1000
        self._paused_at = None
        self._pending.clear()
        self._deadline = None
        return paused_ms

    def _resolve(self, turn: int, reason: str, text: str) -> bool:
        """``turn`` did not interrupt; resume once no other turn is being judged.

        Returns:
            True if ``turn`` was being judged (so its transcript is to be dropped).
        """
        if turn not in self._pending:
            return False
        del self._pending[turn]
        self._resolved[turn] = None
        while len(self._resolved) > RESOLVED_KEPT:
            self._resolved.popitem(last=False)
        if self._pending:
            return True
        paused_ms = self._close()
        logger.info("turn %d: %s (%r), the reply resumes after %.0f ms", turn, reason, text, paused_ms)
        self.bus.publish(ReplyResumed(turn, reason=reason, text=text, paused_ms=paused_ms))
        return True

    def _barge_in(self, turn: int, reason: str, text: str, wait_for_cut: bool = False) -> None:
        """``turn`` interrupts: cancel the replies in flight (keeping every turn being judged)."""
        if turn not in self._pending:
            return
        at = self._paused_at or time.monotonic()
        keep = list(self._pending)
        self._close()
        audible = self.replies.audible()
        self._cut.difference_update(audible)  # only cuts from now on count
        decision_ms = (time.monotonic() - at) * 1000
        logger.info("turn %d interrupts (%s, %r) after %.0f ms", turn, reason, text, decision_ms)
        self.bus.publish(BargeIn(turn, reason=reason, text=text, at=at, decision_ms=decision_ms, keep_turn_ids=keep))
        if wait_for_cut:
            self._awaiting_cut = set(audible) - self._cut
            self._cut_deadline = time.monotonic() + CUT_WAIT_S


class TurnJudge(BaseHandler):
    """The interruption judge's stage, between the STT and the LLM: a transcript of speech that
    paused a reply is judged here, in this stage's own thread.

    A backchannel, false start or echo is dropped (the reply resumes), so the LLM never sees it.
    A real interruption goes on once the LLM stage has cut the interrupted replies in its history
    (:class:`~speech_to_speech.core.events.ReplyCut`, at most :data:`CUT_WAIT_S`); what comes
    after it waits behind it. Everything else passes. The pipeline's events reach it as
    :class:`JudgeEvent` messages ahead of the data in its queue (:meth:`StageQueue.put_ahead`),
    and the verdict that falls due without words (``resume_within_ms``) is kept by its own wait
    on that queue: no other thread acts for it.

    Args:
        interruptions: the judge.
        *args, **kwargs: the :class:`~speech_to_speech.core.handler.BaseHandler` arguments.
    """

    def __init__(self, *args: Any, interruptions: Interruptions, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.interruptions = interruptions
        self._held: list[Any] = []  # an interruption's transcript and what came after it

    def process(self, item: Any) -> Iterator[Any]:
        if self._held:
            self._held.append(item)
            return
        if isinstance(item, Transcript) and not self.interruptions.judge(item):
            return
        if self.interruptions.waiting_for_cut():
            self._held.append(item)
            return
        yield item

    def on_event(self, event: Event) -> None:
        """Judge on ``event`` (from a :class:`JudgeEvent`), then release what may go on."""
        self.interruptions.on_event(event)
        self._release()

    def tick(self, now: float | None = None) -> None:
        """Act on the verdicts and waits that fell due by ``now`` (monotonic s; default: now)."""
        self.interruptions.expire(now)
        self._release(now)

    def _release(self, now: float | None = None) -> None:
        """The interrupted replies were cut (or the wait ran out): send what was held on, in order."""
        if not self._held or self.interruptions.waiting_for_cut(now):
            return
        first, *rest = self._held
        self._held = []
        self.emit(first)
        for item in rest:
            self._guarded(self.process, item)

    def _next_item(self) -> Any:
        """The next input item (None if none came), waiting no longer than the next deadline."""
        assert self.input_queue is not None
        due = self.interruptions.next_deadline()
        timeout = self.poll_s if due is None else min(self.poll_s, max(0.0, due - time.monotonic()))
        try:
            item = self.input_queue.get(timeout=timeout)
        except queue.Empty:
            item = None
        self.tick()
        return item

    def _control(self, control: StageControl) -> None:
        """A control message for a later stage waits behind a held transcript, in order with it."""
        if self._held and not isinstance(self, control.target):
            self._held.append(control)
            return
        super()._control(control)

    def on_end_of_stream(self) -> Iterator[Any]:
        held, self._held = self._held, []
        yield from held


@dataclass
class JudgeEvent(StageControl):
    """An event for the interruption judge (:attr:`Interruptions.EVENTS`), delivered in its
    stage's thread: the pipeline puts it ahead of the data in :class:`TurnJudge`'s queue.

    Attributes:
        event: the pipeline's event.
    """

    target: ClassVar[type] = TurnJudge
    event: Event

    def apply(self, stage: Any) -> None:
        """Hand the event to the judge."""
        stage.on_event(self.event)


@dataclass
class ReplyProgress(StageControl):
    """A reply's progress (:attr:`RepliesInFlight.EVENTS`) for the VAD, which decides at each
    speech start whether the speech pauses a reply: the pipeline puts it ahead of the audio in
    the VAD's queue, and the VAD keeps its own :class:`RepliesInFlight` in its thread.

    Attributes:
        event: the pipeline's event.
    """

    target: ClassVar[type] = BaseVADHandler
    event: Event

    def apply(self, stage: Any) -> None:
        """Track the event in the VAD's replies."""
        stage.replies.on_event(self.event)
