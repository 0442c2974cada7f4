"""One fake per pipeline stage, shared by the tests (after LiveKit's ``tests/fake_*.py``).

Each fake is a real stage (a :class:`~speech_to_speech.core.handler.BaseHandler` subclass) whose
model is replaced by something instant and deterministic, so a test can say exactly what the
stage saw and what it must produce:

* source: :class:`ScriptedSource` plays arrays and waits on conditions, at real-time pace;
* VAD: :class:`FakeVAD` scores each chunk with the value in its first sample
  (:func:`vad_chunks` builds such audio), :class:`VADRig` runs it between two queues;
* STT: :class:`FakeSTT` transcribes to a fixed text;
* LLM: :class:`FakeLLM` plays one :class:`Script` of text deltas per request,
  :class:`FakeProviderLLM` one list of provider events per request; the backends a test selects
  by name (``--llm_backend``, the pipeline builds the stage) answer from the user's text:
  :class:`ScriptedLLM` (``turn-script``), :class:`EchoLLM` (``speculative-echo``),
  :class:`HelloLLM` and :class:`NeedsExtraLLM` (registered by ``tests/test_cli.py``'s entry point);
* TTS: :class:`FakeTTS` speaks a tone whose length follows the text;
* sink: :class:`RecordingSink` records every delivery instead of playing it.

Importing this module registers the named LLM backends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import Event, EventBus
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import END_OF_STREAM, AudioChunk, AudioOutput
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.llm.api import LLMConfig, LLMRequest, ProviderEvent
from speech_to_speech.llm.local import LocalLLMHandler
from speech_to_speech.llm.stage import BaseLLMHandler
from speech_to_speech.pipeline.registry import Backend, register
from speech_to_speech.pipeline.running import Pipeline, Stages
from speech_to_speech.speech.audio_io import StreamClock
from speech_to_speech.speech.playback import PacedAudioSink
from speech_to_speech.speech.tts import BaseTTSHandler, TTSConfig
from speech_to_speech.turns.stt import BaseSTTHandler, STTConfig
from speech_to_speech.turns.vad import CHUNK_SAMPLES, SAMPLE_RATE, BaseVADHandler, VADConfig

#: the reply :class:`ScriptedLLM` gives to a question (about 9 s of speech with the embedded voice)
LONG_REPLY = (
    "Paris is the capital of France, and it has been for a very long time. "
    "It sits on the river Seine, in the north of the country, and about two million people live there."
)
#: how long a fake waits on anything it was told to wait for, s
WAIT_S = 10.0


# -- source ----------------------------------------------------------------------------------------


class ScriptedSource(BaseHandler):
    """Plays ``parts`` on one real-time stream, as a microphone would deliver them, then ends it.

    An array is played in :data:`CHUNK_SAMPLES` chunks, each sent when it is due on ``clock``; a
    callable is silence until it returns True (at most ``wait_s``; one that is True at once
    sends nothing, and can record the moment it is asked).

    Attributes:
        marks: for each part, the stream offsets (samples) where it started and ended.
        waited_out: a condition was not met in time (the next part is played anyway).
    """

    def __init__(self, *args: Any, parts: list[Any], clock: StreamClock, wait_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(*args, input_queue=None, **kwargs)
        self.parts = parts
        self.clock = clock
        self.wait_s = wait_s
        self.offset = 0
        self.marks: list[tuple[int, int]] = []
        self.waited_out = False

    def _send(self, chunk: np.ndarray) -> bool:
        """Send one chunk when it is due on the stream's clock; False when stopping."""
        due = self.clock.start + (self.offset + len(chunk)) / SAMPLE_RATE
        if due > time.monotonic() and self.stop_event.wait(due - time.monotonic()):
            return False
        sent = self.emit(AudioChunk(chunk, SAMPLE_RATE, time.monotonic(), self.offset))
        self.offset += len(chunk)
        return sent

    def wall_time(self, offset: int) -> float:
        """Monotonic time at which stream sample ``offset`` was due."""
        return self.clock.start + offset / SAMPLE_RATE

    def _loop(self) -> None:
        self.clock.restart()
        quiet = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
        for part in self.parts:
            begin = self.offset
            if callable(part):
                deadline = time.monotonic() + self.wait_s
                while not part():
                    if time.monotonic() > deadline:
                        self.waited_out = True
                        break
                    if not self._send(quiet):
                        return
            else:
                for i in range(0, len(part), CHUNK_SAMPLES):
                    if not self._send(part[i : i + CHUNK_SAMPLES]):
                        return
            self.marks.append((begin, self.offset))
        assert self.output_queue is not None
        self.output_queue.put_unless_stopped(END_OF_STREAM, self.stop_event)


# -- VAD -------------------------------------------------------------------------------------------


class FakeVAD(BaseVADHandler):
    """Scores each chunk with the value stored in its first sample; counts the chunks it scored."""

    poll_s = 0.02

    def load(self) -> None:
        self.scored = 0

    def speech_probability(self, chunk: np.ndarray) -> float:
        assert len(chunk) == CHUNK_SAMPLES
        self.scored += 1
        return float(chunk[0])


def vad_chunks(probabilities: list[float], per_item: int = 2) -> list[AudioChunk]:
    """AudioChunks of ``per_item`` VAD chunks each, every VAD chunk filled with its probability (for :class:`FakeVAD`).

    Args:
        probabilities: one per VAD chunk.
        per_item: VAD chunks per AudioChunk.
    """
    samples = np.repeat(np.asarray(probabilities, dtype=np.float32), CHUNK_SAMPLES)
    size = per_item * CHUNK_SAMPLES
    return [
        AudioChunk(samples[start : start + size], SAMPLE_RATE, time.monotonic(), start)
        for start in range(0, len(samples), size)
    ]


@dataclass
class VADRig:
    """A :class:`FakeVAD` (not started) between two stage queues, and the events published on its bus.

    Attributes:
        items: the audio to feed it (see :func:`vad_chunks`).
    """

    vad: FakeVAD
    inq: StageQueue
    outq: StageQueue
    gate: Gate
    bus: EventBus
    events: list[Event]
    items: list[AudioChunk]

    @classmethod
    def build(cls, config: VADConfig, items: list[AudioChunk], out_size: int = 64, gate: Gate | None = None) -> VADRig:
        """A rig for ``items``: its input queue holds them all and the end of the stream."""
        gate, bus = gate or Gate(), EventBus()
        events: list[Event] = []
        bus.subscribe(events.append)
        inq, outq = StageQueue(len(items) + 1), StageQueue(out_size)
        vad = FakeVAD(threading.Event(), inq, outq, gate, bus, config=config, name="vad:fake")
        return cls(vad, inq, outq, gate, bus, events, items)

    def run(self, timeout_s: float = 5.0) -> list[Any]:
        """Queue every item and the end of the stream, run the stage to its end; everything it sent, in order."""
        for item in [*self.items, END_OF_STREAM]:
            self.inq.put(item)
        self.vad.start()
        self.vad.join(timeout_s)
        assert not self.vad.is_alive(), "the VAD stage must end by itself after END_OF_STREAM"
        out = []
        while not self.outq.empty():
            out.append(self.outq.get_nowait())
        return out


# -- STT -------------------------------------------------------------------------------------------


class FakeSTT(BaseSTTHandler):
    """Transcribes to the first words of a fixed text (one per second of audio, at least one) after ``delay_s``.

    Attributes:
        calls: how many times it transcribed.
    """

    def __init__(self, *args: Any, text: str = "hello there", delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text = text
        self.delay_s = delay_s
        self.calls = 0

    def load(self) -> None:
        pass

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        self.calls += 1
        time.sleep(self.delay_s)
        words = self.text.split()
        return " ".join(words[: max(1, len(samples) // 16_000)]), "en"


# -- LLM -------------------------------------------------------------------------------------------


class ScriptError(RuntimeError):
    """Raised by a :class:`Script` that is told to fail."""


@dataclass
class Script:
    """What :class:`FakeLLM` streams for one request.

    Attributes:
        deltas: text pieces, in order.
        raise_after: raise ``error`` before delta number ``raise_after`` (``len(deltas)``: after the
            last one; None: never).
        cancel_after: call ``gate.scope.cancel()`` (a barge-in while generating) before delta
            number ``cancel_after`` (None: never).
        pause_after: before delta number ``pause_after``, wait until ``resume`` is set (``paused``
            is set meanwhile); None never pauses.
        error: what to raise.
        paused: set while the script waits for ``resume``.
        resume: lets a paused script go on.
        finished: set once every delta was yielded.
        yielded: how many deltas were yielded.
        stopped_early: the generation was told to stop before its last delta.
        messages: the messages of the request it answered ([] until asked).
    """

    deltas: list[str]
    raise_after: int | None = None
    cancel_after: int | None = None
    pause_after: int | None = None
    error: Exception = field(default_factory=lambda: ScriptError("the model crashed"))
    paused: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    yielded: int = 0
    stopped_early: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)


class FakeLLM(LocalLLMHandler):
    """A local model that plays one :class:`Script` per request (tools are parsed from ``<code>``).

    Attributes:
        scripts: the scripts not played yet.
        played: the scripts played, in order.
        requests: the messages of every request, in order.
        heeds_stop: stop before the next delta once ``should_stop()``, as a real model does (False:
            go on until the stage stops pulling, which the stage must do by itself).
    """

    def __init__(self, *args: Any, scripts: list[Script], heeds_stop: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripts = list(scripts)
        self.heeds_stop = heeds_stop
        self.played: list[Script] = []
        self.requests: list[list[dict[str, Any]]] = []

    def load(self) -> None:
        pass

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        script = self.scripts.pop(0)
        script.messages = messages
        self.played.append(script)
        self.requests.append(messages)
        for i, delta in enumerate(script.deltas):
            if script.raise_after == i:
                raise script.error
            if script.cancel_after == i:
                self.gate.scope.cancel()
            if script.pause_after == i:
                script.paused.set()
                script.resume.wait(WAIT_S)
            if self.heeds_stop and should_stop():
                script.stopped_early = True
                return
            script.yielded += 1
            yield delta
        if script.raise_after == len(script.deltas):
            raise script.error
        script.finished.set()


def make_llm(
    *scripts: Script,
    history_turns: int = 8,
    batch: int = 1,
    heeds_stop: bool = False,
    inq: StageQueue | None = None,
    outq: StageQueue | None = None,
    set_up: bool = True,
    name: str = "llm:fake",
) -> tuple[FakeLLM, list[Event]]:
    """A :class:`FakeLLM` playing ``scripts`` (set up unless told), and the list its bus publishes to.

    Args:
        scripts: one per request.
        history_turns: user turns kept in history.
        batch: sentences per TTS batch after the first.
        heeds_stop: see :attr:`FakeLLM.heeds_stop`.
        inq: its input queue (None: driven through :meth:`~BaseLLMHandler.process`).
        outq: its output queue.
        set_up: call :meth:`setup` (False: left to :meth:`start`, in the stage thread).
        name: the stage's name.
    """
    gate, bus = Gate(), EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    config = LLMConfig(system_prompt="Be brief.", history_turns=history_turns, stream_batch_sentences=batch)
    llm = FakeLLM(
        threading.Event(), inq, outq, gate, bus, config=config, scripts=list(scripts), heeds_stop=heeds_stop, name=name
    )
    if set_up:
        llm.setup()
    return llm, events


class FakeProviderLLM(BaseLLMHandler):
    """A provider backend that yields one list of provider events per request.

    Attributes:
        on_event: runs with the index of each event before it is yielded.
        requests: every request, in order.
        blocks: before its first event, wait until told to stop (an engine busy elsewhere).
        released: set once a blocked request was told to stop.
    """

    def __init__(self, *args: Any, scripts: list[list[ProviderEvent]], blocks: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripts = scripts
        self.blocks = blocks
        self.on_event: Callable[[int], None] = lambda index: None
        self.requests: list[LLMRequest] = []
        self.released = threading.Event()

    def load(self) -> None:
        pass

    def events(self, request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        self.requests.append(request)
        if self.blocks:
            while not should_stop():
                time.sleep(0.01)
            self.released.set()
        for index, event in enumerate(self.scripts.pop(0)):
            self.on_event(index)
            yield event


def make_provider_llm(*scripts: list[ProviderEvent], blocks: bool = False, **config: Any) -> FakeProviderLLM:
    """A set-up :class:`FakeProviderLLM` playing ``scripts``, its :class:`LLMConfig` made of ``config``
    (an input queue, no output queue: drive it with :meth:`~BaseLLMHandler.process`)."""
    llm = FakeProviderLLM(
        threading.Event(),
        StageQueue(16),  # for the control messages a test puts at its head
        None,
        Gate(),
        EventBus(),
        config=LLMConfig(**config),
        scripts=list(scripts),
        blocks=blocks,
        name="llm",
    )
    llm.setup()
    return llm


class ReplyLLM(LocalLLMHandler):
    """Base of the model-free backends a test selects by name: answers the last user text with :meth:`pieces`.

    Attributes:
        heard: the user text of every request, in order.
    """

    heard: list[str]

    def load(self) -> None:
        self.heard = []

    def pieces(self, text: str) -> list[str]:
        """The text deltas of the reply to ``text``."""
        raise NotImplementedError

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        text = str(messages[-1].get("content", ""))
        self.heard.append(text)
        for piece in self.pieces(text):
            if should_stop():
                return
            yield piece


class ScriptedLLM(ReplyLLM):
    """Answers a question (text with "capital") with :attr:`long_reply`, anything else with
    "You said: <text>.", word by word (so there is a reply to talk over, and history can be checked).

    Attributes:
        long_reply: the answer to a question (a class attribute: the pipeline builds the stage).
    """

    long_reply = LONG_REPLY

    def pieces(self, text: str) -> list[str]:
        reply = self.long_reply if "capital" in text.lower() else f"You said: {text.strip().rstrip('.')}."
        return [word + " " for word in reply.split(" ")]


class EchoLLM(ReplyLLM):
    """Answers at once with two sentences that quote the user's text (see :meth:`reply_to`)."""

    @staticmethod
    def reply_to(text: str) -> str:
        """The whole reply to ``text``."""
        return f"I heard you. You said: {text}"

    def pieces(self, text: str) -> list[str]:
        return ["I heard you. ", f"You said: {text}"]


class HelloLLM(ReplyLLM):
    """Says "Hello there."; fails on a user text containing "fail"."""

    def pieces(self, text: str) -> list[str]:
        if "fail" in text:
            raise RuntimeError("the echo model broke down")
        return ["Hello there."]


class NeedsExtraLLM(HelloLLM):
    """An LLM whose engine is not installed: its setup fails on an import."""

    def load(self) -> None:
        raise ModuleNotFoundError("No module named 'some_engine'")


class SeeingEcho(ReplyLLM):
    """A model that sees: answers "I see N image(s)." counting the image parts it was given.

    Attributes:
        seen: the messages of every request (a class attribute: the pipeline builds the stage).
    """

    accepts_images = True
    seen: ClassVar[list[list[dict[str, Any]]]] = []

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        SeeingEcho.seen.append(messages)
        count = sum(
            part.get("type") == "image_url"
            for message in messages
            if isinstance(message.get("content"), list)
            for part in message["content"]
        )
        yield f"I see {count} image{'s' * (count != 1)}."


register(Backend("turn-script", "llm", LLMConfig, "speech_to_speech.testing.fakes:ScriptedLLM", summary="test"))
register(Backend("speculative-echo", "llm", LLMConfig, "speech_to_speech.testing.fakes:EchoLLM", summary="test"))
register(Backend("seeing-echo", "llm", LLMConfig, "speech_to_speech.testing.fakes:SeeingEcho", summary="test"))


# -- TTS -------------------------------------------------------------------------------------------


class FakeTTS(BaseTTSHandler):
    """A voice without a model: after ``delay_s``, ``lead_samples`` of silence, then a tone of
    ``samples_per_char`` per character (``tone_samples`` in all when set), at ``rate`` Hz.

    The settings are class attributes, so that a subclass can be selected by name (the pipeline
    builds the stage).

    Attributes:
        asked: every text it was asked to say, in order.
    """

    rate = 1000
    delay_s = 0.0
    lead_samples = 300
    samples_per_char = 10
    tone_samples: int | None = None
    level = 0.5

    def load(self) -> None:
        self.sample_rate = self.rate
        self.asked: list[str] = []

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        self.asked.append(text)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.lead_samples:
            yield np.zeros(self.lead_samples, dtype=np.float32)
        length = self.tone_samples if self.tone_samples is not None else self.samples_per_char * len(text)
        yield np.full(length, self.level, dtype=np.float32)


# -- sink ------------------------------------------------------------------------------------------


@dataclass
class Write:
    """One call of :meth:`PacedAudioSink.write`, as recorded by :class:`RecordingSink`."""

    time: float
    samples: np.ndarray
    item: AudioOutput
    start: float


class RecordingSink(PacedAudioSink):
    """A paced sink that records every delivery and can run a hook on each one (in the sink's thread)."""

    poll_s = 0.02

    def __init__(self, *args: Any, lead_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lead_s = lead_s
        self.writes: list[Write] = []
        self.on_write: Callable[[Write], None] | None = None

    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        record = Write(time.monotonic(), samples.copy(), item, start)
        self.writes.append(record)
        if self.on_write is not None:
            self.on_write(record)


register(Backend("fake-stt", "stt", STTConfig, "speech_to_speech.testing.fakes:FakeSTT", summary="test"))
register(Backend("fake-tts", "tts", TTSConfig, "speech_to_speech.testing.fakes:FakeTTS", summary="test"))


def chained(stages: Iterable[BaseHandler]) -> Stages:
    """Stages put together by hand for a :class:`Pipeline`: the last is the ``sink``, the others
    ``stage0``, ``stage1``, … (none is a source)."""
    listed = list(stages)
    return Stages({**{f"stage{i}": s for i, s in enumerate(listed[:-1])}, "sink": listed[-1]})


def replace_stage(pipeline: Pipeline, role: str, stage: BaseHandler) -> BaseHandler:
    """Put ``stage`` in ``role`` of ``pipeline`` in place of the one there (a scripted source);
    return that one.

    Raises:
        KeyError: the pipeline has no stage in that role.
    """
    previous = pipeline.stage(role)
    pipeline.stages = Stages({r: stage if r == role else s for r, s in pipeline.stages.items()})
    return previous
