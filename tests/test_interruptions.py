"""Turn-taking machinery without models: the gate's kept turns, the semantic endpointer, the VAD
stage with a scripted end-of-turn model, the sink's pause and resume, the judge of speech
during a reply, and history for a reply cancelled before any of its audio played."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import (
    BargeIn,
    EmptyTranscript,
    Event,
    EventBus,
    FirstAudio,
    ReplyCut,
    ReplyPaused,
    ReplyResumed,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    SpeechDiscarded,
    SpeechStarted,
    SpeechStopped,
    TurnSuperseded,
    UserTranscriptDelta,
)
from speech_to_speech.core.messages import (
    END_OF_STREAM,
    EndOfResponse,
    Interrupt,
    Pause,
    Resume,
    SpeechSegment,
    Transcript,
)
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.llm.prompts import INTERRUPTION_MARKER
from speech_to_speech.pipeline.builder import Pipeline
from speech_to_speech.speech.audio_io import FileSink, StreamClock
from speech_to_speech.testing.fakes import FakeVAD, RecordingSink, Script, VADRig, chained, make_llm, vad_chunks
from speech_to_speech.testing.judge import JudgeRig
from speech_to_speech.testing.runs import BusLog
from speech_to_speech.turns.endpointer import BY_END_OF_INPUT, BY_MAX_SPEECH, BY_MODEL, BY_SILENCE, DEFAULT_PAUSE_MS
from speech_to_speech.turns.interruptions import Interruptions, TurnJudge
from speech_to_speech.turns.replies import RepliesInFlight
from speech_to_speech.turns.turn_detection import (
    EAGERNESS_MAX_SILENCE_MS,
    TurnDetector,
    resolve_turn_detection,
    smart_turn_installed,
)
from speech_to_speech.turns.vad import Endpoint, Endpointer, Speculation
from tests.helpers import wait_until
from tests.test_llm_base import ask, history
from tests.test_playback import RATE, audio
from tests.test_vad_endpointer import CONFIG, MS_PER_CHUNK, PAD, SILENCE, SPEECH, run

# in chunks: a pause of 4 is where the model is asked, 10 of silence end a turn by the plain
# rule (CONFIG), 25 end a turn the model judged unfinished
SEMANTIC = dataclasses.replace(
    CONFIG, speculative_silence_ms=int(4 * MS_PER_CHUNK), turn_max_silence_ms=int(25 * MS_PER_CHUNK)
)


# -- Gate.cancel(keep_turns) ---------------------------------------------------------------------
def test_a_cancel_keeps_the_turns_it_is_told_to() -> None:
    gate = Gate()
    reply, speech = gate.new_turn_stamp(), gate.new_turn_stamp()
    gate.cancel(keep_turns=[speech.turn_id])
    assert not gate.admits(reply) and gate.admits(speech)
    assert gate.admits(gate.stamp(speech.turn_id))  # and its new work, of the new generation
    # a later cancel that does not keep it ends it too
    gate.cancel()
    assert not gate.admits(speech)


def test_a_turn_kept_twice_is_carried_over_both_cancels() -> None:
    gate = Gate()
    speech = gate.new_turn_stamp()
    gate.cancel(keep_turns=[speech.turn_id])
    later = gate.new_turn_stamp()
    gate.cancel(keep_turns=[speech.turn_id, later.turn_id])
    assert gate.admits(speech) and gate.admits(later)


# -- the endpointer, semantic mode -----------------------------------------------------------------
def test_the_model_ends_the_turn_at_the_pause() -> None:
    endpointer = Endpointer(SEMANTIC, semantic=True)
    results = run(endpointer, [SILENCE] * 4 + [SPEECH] * 10 + [SILENCE] * 4)
    assert isinstance(results[-1][1], Speculation) and results[-1][0] == 4 + 10 + 4 - 1
    endpoint = endpointer.end_turn()
    assert isinstance(endpoint, Endpoint) and endpoint.by == BY_MODEL
    assert len(endpoint.samples) == (PAD + 10 + PAD) * 512  # pre-roll, speech, end padding
    assert not endpointer.in_speech and endpointer.end_turn() is None


def test_an_unfinished_turn_waits_for_the_longer_silence_and_speech_continues_it() -> None:
    endpointer = Endpointer(SEMANTIC, semantic=True)
    probabilities = [SPEECH] * 10 + [SILENCE] * 20 + [SPEECH] * 5 + [SILENCE] * 30
    results = run(endpointer, probabilities)
    kinds = [type(r).__name__ if not isinstance(r, str) else r for _, r in results]
    # 20 silent chunks are more than the plain rule's 10: the turn goes on
    assert kinds == ["start", "Speculation", "resumed", "Speculation", "Endpoint"]
    at, endpoint = results[-1]
    assert at == 10 + 20 + 5 + 25 - 1 and endpoint.by == BY_SILENCE


def test_noise_still_ends_after_the_plain_silence() -> None:
    endpointer = Endpointer(SEMANTIC, semantic=True)
    results = run(endpointer, [SPEECH] * 3 + [SILENCE] * 12)
    assert [r for _, r in results] == ["start"]
    assert not endpointer.in_speech  # ended after 10 silent chunks, too short to be a turn


def test_semantic_mode_asks_at_200_ms_without_speculation() -> None:
    config = dataclasses.replace(SEMANTIC, speculative_silence_ms=0)
    endpointer = Endpointer(config, semantic=True)
    assert endpointer.speculative_chunks == round(DEFAULT_PAUSE_MS / MS_PER_CHUNK)
    assert Endpointer(config).speculative_chunks == 0


def test_why_a_turn_ended() -> None:
    endpointer = Endpointer(dataclasses.replace(CONFIG, max_speech_ms=int(12 * MS_PER_CHUNK)))
    cut = [r for _, r in run(endpointer, [SPEECH] * 12) if isinstance(r, Endpoint)]
    assert [e.by for e in cut] == [BY_MAX_SPEECH]
    run(endpointer, [SPEECH] * 8)
    flushed = endpointer.flush()
    assert flushed is not None and flushed.by == BY_END_OF_INPUT


def test_turn_detection_modes() -> None:
    assert resolve_turn_detection("silence") == "silence"
    assert resolve_turn_detection("auto") in ("smart_turn", "silence")
    with pytest.raises(ValueError, match="turn_detection"):
        resolve_turn_detection("psychic")


def test_smart_turn_without_its_model_fails_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import speech_to_speech.turns.turn_detection as turn_detection
    from speech_to_speech.pipeline.builder import PipelineError, build_pipeline
    from speech_to_speech.pipeline.cli import parse_args

    monkeypatch.setattr(turn_detection, "smart_turn_installed", lambda: False)
    assert resolve_turn_detection("auto") == "silence"  # the default falls back to silence
    source = tmp_path / "in.wav"
    sf.write(str(source), np.zeros(1600, dtype=np.float32), 16_000)
    flags = ["--input_audio", str(source), "--output_audio", str(tmp_path / "out.wav")]
    with pytest.raises(PipelineError, match=r"pip install 'speech-to-speech\[smart-turn\]'"):
        build_pipeline(parse_args([*flags, "--turn_detection", "smart_turn"]))


# -- the VAD stage with a scripted end-of-turn model ------------------------------------------------
class ScriptedModel:
    """An end-of-turn model that answers each call with the next probability."""

    def __init__(self, *answers: float) -> None:
        self.answers = list(answers)
        self.lengths: list[int] = []

    def probability(self, samples: np.ndarray) -> float:
        self.lengths.append(len(samples))
        return self.answers.pop(0)


def run_semantic_vad(probabilities: list[float], *answers: float) -> tuple[list[Any], list[Event], ScriptedModel]:
    rig = VADRig.build(SEMANTIC, vad_chunks(probabilities), out_size=256)
    model = ScriptedModel(*answers)
    rig.vad.turn_detector = TurnDetector(model, 0.5)
    rig.vad.endpointer = Endpointer(SEMANTIC, semantic=True)
    out = rig.run()
    return out[:-1], rig.events, model


def test_the_vad_endpoints_a_complete_turn_at_the_first_pause() -> None:
    out, events, model = run_semantic_vad([SILENCE] * 4 + [SPEECH] * 10 + [SILENCE] * 40, 0.9)
    segments = [o for o in out if isinstance(o, SpeechSegment)]
    assert len(segments) == 1 and not segments[0].speculative
    assert model.lengths == [(PAD + 10 + PAD) * 512]  # asked once, on the audio an endpoint would send
    stopped = [e for e in events if isinstance(e, SpeechStopped)]
    assert [(e.endpoint_by, e.turn_probability) for e in stopped] == [("model", 0.9)]


def test_the_vad_waits_on_an_unfinished_turn_and_ends_it_on_silence() -> None:
    out, events, model = run_semantic_vad([SILENCE] * 4 + [SPEECH] * 10 + [SILENCE] * 40, 0.2)
    segments = [o for o in out if isinstance(o, SpeechSegment)]
    assert len(segments) == 1 and not segments[0].speculative  # no hold in this stage: no speculation
    assert len(model.lengths) == 1
    stopped = [e for e in events if isinstance(e, SpeechStopped)]
    assert [(e.endpoint_by, e.turn_probability) for e in stopped] == [("silence", 0.2)]
    assert stopped[0].audio_ms == pytest.approx((4 + 10) * MS_PER_CHUNK)


@pytest.mark.models
@pytest.mark.skipif(not smart_turn_installed(), reason="the Smart Turn model is not installed (smart-turn extra)")
def test_the_realtime_eagerness_picks_the_model_and_its_silence_bound() -> None:
    vad = FakeVAD(threading.Event(), None, None, Gate(), EventBus(), config=dataclasses.replace(CONFIG), name="vad")
    vad.set_eagerness("high")  # semantic_vad
    assert vad.turn_detector is not None and vad.endpointer.semantic
    assert vad.config.turn_max_silence_ms == EAGERNESS_MAX_SILENCE_MS["high"] == 1000
    vad.set_eagerness(None)  # server_vad
    assert vad.turn_detector is None and not vad.endpointer.semantic


# -- the VAD: pause, not cancel, while a reply is in flight ---------------------------------------
def test_speech_during_a_reply_pauses_it_instead_of_cancelling() -> None:
    rig = VADRig.build(CONFIG, vad_chunks([SILENCE] * 4 + [SPEECH] * 10 + [SILENCE] * 16))
    bus, gate, events = rig.bus, rig.gate, rig.events
    interruptions = Interruptions(bus, resume_within_ms=60_000)
    bus.subscribe(lambda event: interruptions.on_event(event) if isinstance(event, Interruptions.EVENTS) else None)
    bus.subscribe(rig.vad.replies.on_event)  # the pipeline: ReplyProgress messages, in the VAD's thread
    reply = gate.new_turn_stamp()
    bus.publish(ResponseStarted(reply.turn_id))
    rig.vad.interruptions = interruptions
    out = rig.run()
    assert gate.admits(reply), "the reply was cancelled at speech start"
    started = [e for e in events if isinstance(e, SpeechStarted)]
    assert [e.pauses_reply for e in started] == [True]
    assert [e.reply_turn_ids for e in events if isinstance(e, ReplyPaused)] == [[reply.turn_id]]
    segment = next(item for item in out if isinstance(item, SpeechSegment))
    assert segment.during_reply


# -- the sink: pause, resume, interrupt --------------------------------------------------------------
@dataclasses.dataclass
class Rig:
    sink: RecordingSink
    queue: StageQueue
    gate: Gate
    bus: EventBus
    events: list[Event]
    stop: threading.Event

    def feed(self, *items: Any) -> None:
        for item in items:
            assert self.queue.put_unless_stopped(item, self.stop)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in list(self.events) if isinstance(e, kind)]

    def finish(self) -> None:
        self.feed(END_OF_STREAM)
        self.sink.join(10.0)
        assert not self.sink.is_alive()


@pytest.fixture
def rig() -> Any:
    made: list[Rig] = []

    def make(sink_cls: type = RecordingSink, **kwargs: Any) -> Rig:
        stop, gate, bus, q = threading.Event(), Gate(), EventBus(), StageQueue(64)
        events: list[Event] = []
        bus.subscribe(events.append)
        kwargs.setdefault("sample_rate", RATE) if sink_cls is RecordingSink else None
        sink = sink_cls(stop_event=stop, input_queue=q, gate=gate, bus=bus, **kwargs)
        made.append(Rig(sink, q, gate, bus, events, stop))
        return made[-1]

    yield make
    for r in made:
        r.stop.set()
        r.sink.join(5.0)


WORDS = [" one", " two", " three", " four", " five", " six"]


def test_a_paused_reply_resumes_where_it_stopped_and_loses_nothing(rig: Callable[..., Rig]) -> None:
    r = rig()
    stamp = r.gate.new_turn_stamp()
    chunk_s = 0.2
    r.feed(*(audio(stamp, chunk_s, word) for word in WORDS), EndOfResponse(stamp, text="".join(WORDS)))
    r.sink.start()
    assert wait_until(lambda: len(r.sink.writes) >= 2)
    at = r.sink.writes[1].start + chunk_s / 2  # halfway through the second chunk
    assert wait_until(lambda: time.monotonic() >= at)
    r.feed(Pause(at))
    time.sleep(0.5)  # paused: nothing more is delivered
    during = [w for w in r.sink.writes if w.time > at + 0.05]
    assert not during, "audio delivered while paused"
    resumed_at = time.monotonic()
    r.feed(Resume())
    r.finish()
    after = [w for w in r.sink.writes if w.time >= resumed_at]
    # the second chunk's unplayed half comes first, then the rest; every sample played once
    assert after and after[0].start >= resumed_at - 0.01
    assert len(after[0].samples) == round(chunk_s / 2 * RATE)
    played = sum(len(w.samples) for w in r.sink.writes) - round(chunk_s / 2 * RATE)  # the cut half was re-sent
    assert played == round(len(WORDS) * chunk_s * RATE)
    assert [w.item.text for w in after if w.item.text] == WORDS[2:]
    assert [(e.turn_id, e.error) for e in r.of(ResponseDone)] == [(stamp.turn_id, None)]
    assert not r.of(ResponseInterrupted)


class RemotePlayerSink(RecordingSink):
    """A sink that cannot take back what it delivered (audio sent to a remote player, as over
    WebSocket): a pause starts where the delivered audio ends."""

    def on_pause(self, at: float) -> float:
        return self.delivered_until()


def test_a_sink_that_cannot_take_audio_back_pauses_after_it_and_sends_nothing_twice(
    rig: Callable[..., Rig],
) -> None:
    r = rig(RemotePlayerSink, sample_rate=RATE, lead_s=0.3)
    stamp = r.gate.new_turn_stamp()
    chunk_s = 0.1
    words = WORDS * 2
    r.feed(*(audio(stamp, chunk_s, word) for word in words), EndOfResponse(stamp, text="".join(words)))
    r.sink.start()
    assert wait_until(lambda: len(r.sink.writes) >= 5)
    at = time.monotonic()
    r.feed(Pause(at))
    assert wait_until(lambda: r.sink.paused)
    frontier = max(w.start + chunk_s for w in r.sink.writes)
    assert frontier > at + 0.1, "nothing was delivered ahead: the test shows nothing"
    delivered = len(r.sink.writes)
    time.sleep(0.5)
    assert len(r.sink.writes) == delivered, "audio delivered while paused"
    resumed_at = time.monotonic()
    r.feed(Resume())
    r.finish()
    after = r.sink.writes[delivered:]
    # every sample delivered once, in order; the rest starts after what was delivered before
    assert sum(len(w.samples) for w in r.sink.writes) == round(len(words) * chunk_s * RATE)
    assert "".join(w.item.text for w in r.sink.writes) == "".join(words)
    assert after and after[0].start >= max(resumed_at, frontier) - 0.01
    assert [(e.turn_id, e.error) for e in r.of(ResponseDone)] == [(stamp.turn_id, None)]


def test_a_paused_reply_that_is_then_cancelled_reports_what_was_heard_before_the_pause(
    rig: Callable[..., Rig],
) -> None:
    r = rig()
    stamp = r.gate.new_turn_stamp()
    r.feed(*(audio(stamp, 0.2, word) for word in WORDS), EndOfResponse(stamp))
    r.sink.start()
    assert wait_until(lambda: len(r.sink.writes) >= 3)
    at = r.sink.writes[2].start + 0.05
    assert wait_until(lambda: time.monotonic() >= at)
    r.feed(Pause(at))
    time.sleep(0.3)
    r.gate.cancel()  # the words were a real interruption
    r.feed(Interrupt(at))
    assert wait_until(lambda: bool(r.of(ResponseInterrupted)))
    writes = len(r.sink.writes)
    r.finish()
    event = r.of(ResponseInterrupted)[0]
    assert event.heard_text == "one two three"
    assert event.audio_end_ms == pytest.approx(450, abs=1)
    assert len(r.sink.writes) == writes
    assert [(e.turn_id, e.error) for e in r.of(ResponseDone)] == [(stamp.turn_id, "cancelled")]


def test_a_cut_reply_with_audio_waiting_but_none_played_reports_no_words(rig: Callable[..., Rig]) -> None:
    r = rig(lead_s=0.0)
    playing, waiting = r.gate.new_turn_stamp(), r.gate.new_turn_stamp()
    r.feed(audio(playing, 2.0, " long"), audio(waiting, 0.2, " later"), EndOfResponse(waiting))
    r.sink.start()
    assert wait_until(lambda: bool(r.of(FirstAudio)) and len(r.of(FirstAudio)) == 2)
    r.gate.cancel()
    r.feed(Interrupt(time.monotonic()))
    assert wait_until(lambda: len(r.of(ResponseInterrupted)) == 2)
    by_turn = {e.turn_id: e.heard_text for e in r.of(ResponseInterrupted)}
    assert by_turn == {playing.turn_id: "long", waiting.turn_id: ""}
    r.finish()


def test_the_file_sink_keeps_a_gap_where_the_reply_was_paused(rig: Callable[..., Rig], tmp_path: Path) -> None:
    out, clock = tmp_path / "out.wav", StreamClock()
    r = rig(FileSink, path=out, clock=clock)
    stamp = r.gate.new_turn_stamp()
    r.feed(*(audio(stamp, 0.2, word) for word in WORDS), EndOfResponse(stamp))
    r.sink.start()
    assert wait_until(lambda: len(r.sink._pieces) >= 2)
    at = time.monotonic()
    r.feed(Pause(at))
    time.sleep(0.4)
    r.feed(Resume())
    r.finish()
    written, _ = sf.read(str(out), dtype="float32")
    voiced = np.isclose(written, 0.5, atol=1e-3)
    assert voiced.sum() == pytest.approx(len(WORDS) * 0.2 * RATE, abs=4)  # all of it, once
    gap = voiced[int((at - clock.start) * RATE) + 10 : int((at - clock.start + 0.35) * RATE)]
    assert not gap.any(), "the paused reply went on playing"


# -- the judge -------------------------------------------------------------------------------------
class Judge(JudgeRig):
    def speech(self) -> int:
        """User speech starts during the reply: returns its turn id."""
        stamp = self.gate.new_turn_stamp()
        self.bus.publish(SpeechStarted(stamp.turn_id, pauses_reply=True))
        return stamp.turn_id


@pytest.fixture
def judge() -> Any:
    return lambda resume_within_ms=60_000: Judge.build(resume_within_ms)


def test_a_backchannel_resumes_the_reply_and_never_reaches_the_llm(judge: Callable[..., Judge]) -> None:
    j = judge()
    assert j.interruptions.reply_in_flight()
    turn = j.speech()
    assert [e.reply_turn_ids for e in j.of(ReplyPaused)] == [[j.reply]]
    assert j.transcript(turn, "Mm-hmm.") is False
    assert [(e.turn_id, e.reason, e.text) for e in j.of(ReplyResumed)] == [(turn, "backchannel", "Mm-hmm.")]
    assert not j.of(BargeIn) and not j.interruptions.paused


def test_words_interrupt_and_go_on_to_the_llm(judge: Callable[..., Judge]) -> None:
    j = judge()
    turn = j.speech()
    assert j.transcript(turn, "Wait, stop.") is True
    barge_in = j.of(BargeIn)
    assert [(e.turn_id, e.reason, e.keep_turn_ids) for e in barge_in] == [(turn, "words", [turn])]
    assert not j.of(ReplyResumed)
    assert j.transcript(turn, "Mm-hmm.") is True  # decided: a later transcript is not judged again


def test_no_words_and_noise_resume_the_reply(judge: Callable[..., Judge]) -> None:
    j = judge()
    j.bus.publish(SpeechDiscarded(j.speech()))
    j.bus.publish(EmptyTranscript(j.speech()))
    assert j.transcript(j.speech(), "[BLANK_AUDIO]") is False
    assert [e.reason for e in j.of(ReplyResumed)] == ["too_short", "no_words", "false_start"]


def test_no_verdict_in_time_is_an_interruption(judge: Callable[..., Judge]) -> None:
    j = judge(resume_within_ms=100)
    turn = j.speech()
    j.judge.tick()
    assert not j.of(BargeIn)
    time.sleep(0.15)
    j.judge.tick()
    assert [(e.turn_id, e.reason) for e in j.of(BargeIn)] == [(turn, "timeout")]
    assert j.transcript(turn, "Yeah.") is True  # too late to be a backchannel: answered


def test_the_words_of_speech_that_ended_get_their_time_from_its_end(judge: Callable[..., Judge]) -> None:
    j = judge(resume_within_ms=300)
    turn = j.speech()
    time.sleep(0.2)
    j.bus.publish(SpeechStopped(turn))  # the user stopped: the STT now has 300 ms
    time.sleep(0.2)
    j.judge.tick()
    assert not j.of(BargeIn), "timed out from the start of the speech, although it had ended"
    assert j.transcript(turn, "Uh-huh.") is False
    assert [e.reason for e in j.of(ReplyResumed)] == ["backchannel"]


def test_a_long_partial_interrupts_at_once_a_short_one_does_not(judge: Callable[..., Judge]) -> None:
    j = judge()
    turn = j.speech()
    j.bus.publish(UserTranscriptDelta(turn, text="and then them"))  # what tiny.en makes of a hummed "mm hmm"
    assert not j.of(BargeIn)
    j.bus.publish(UserTranscriptDelta(turn, text="No, I meant the other one"))
    assert [e.reason for e in j.of(BargeIn)] == ["words"]


def test_a_backchannel_that_goes_on_is_judged_again(judge: Callable[..., Judge]) -> None:
    j = judge()
    turn = j.speech()
    assert j.transcript(turn, "Yeah.") is False  # its speculative transcript
    j.bus.publish(TurnSuperseded(turn, revision=1))  # the user spoke on
    assert len(j.of(ReplyPaused)) == 2 and j.interruptions.paused
    assert j.transcript(turn, "Yeah, but what about Lyon?") is True
    assert [e.turn_id for e in j.of(BargeIn)] == [turn]


def test_after_the_reply_a_backchannel_is_an_answer(judge: Callable[..., Judge]) -> None:
    j = judge()
    j.bus.publish(ResponseDone(j.reply))
    assert not j.interruptions.reply_in_flight()
    turn = j.gate.new_turn_stamp().turn_id
    j.bus.publish(SpeechStarted(turn))  # the VAD did not pause anything
    assert j.transcript(turn, "Yeah.") is True and not j.of(ReplyResumed)


def test_the_judge_decides_in_its_own_thread_on_the_events_the_pipeline_queues_for_it() -> None:
    bus, gate, stop = EventBus(), Gate(), threading.Event()
    log = BusLog(bus)
    publishers: dict[type, set[str]] = {}
    bus.subscribe(lambda e: publishers.setdefault(type(e), set()).add(threading.current_thread().name))
    replies = RepliesInFlight(bus)
    interruptions = Interruptions(bus, resume_within_ms=200)
    heard, transcripts = StageQueue(8), StageQueue(8)
    judge = TurnJudge(
        stop_event=stop,
        input_queue=heard,
        output_queue=transcripts,
        gate=gate,
        bus=bus,
        interruptions=interruptions,
        name="judge",
    )
    pipeline = Pipeline(chained([judge]), stop, gate, bus, StreamClock(), None, replies, interruptions)
    bus.subscribe(pipeline.on_event)
    judge.start()
    try:
        bus.publish(ResponseStarted(gate.new_turn_stamp().turn_id))
        backchannel = gate.new_turn_stamp()
        bus.publish(SpeechStarted(backchannel.turn_id, pauses_reply=True))
        heard.put(Transcript(backchannel, "Mm-hmm.", "en"))
        assert log.wait_for(lambda: bool(log.of(ReplyResumed)), 5.0)
        # the next speech says nothing in time: the judge's own wait on its queue notices
        question = gate.new_turn_stamp()
        bus.publish(SpeechStarted(question.turn_id, pauses_reply=True))
        assert log.wait_for(lambda: bool(log.of(BargeIn)), 5.0)
        heard.put(Transcript(question, "Yeah.", "en"))  # too late to be a backchannel: answered
        passed = [transcripts.get(timeout=5.0)]  # with the pipeline's Pauses: the judge is its last stage here
        while not isinstance(passed[-1], Transcript):
            passed.append(transcripts.get(timeout=5.0))
    finally:
        stop.set()
        judge.join(5.0)
    assert [item.text for item in passed if isinstance(item, Transcript)] == ["Yeah."]
    assert [(e.turn_id, e.reason) for e in log.of(BargeIn)] == [(question.turn_id, "timeout")]
    for decision in (ReplyPaused, ReplyResumed, BargeIn):
        assert publishers[decision] == {"judge"}, decision


# -- history for a reply cancelled before any of its audio played -----------------------------------
def test_a_reply_cancelled_before_its_first_audio_leaves_no_text_in_history() -> None:
    llm, events = make_llm(Script(["Paris is the capital. ", "It is big."]), inq=StageQueue(8))
    replies = RepliesInFlight(llm.bus)
    pipeline = Pipeline(chained([llm]), llm.stop_event, llm.gate, llm.bus, StreamClock(), None, replies)
    llm.bus.subscribe(pipeline.on_event)
    ask(llm, "What is the capital of France?")
    assert history(llm)[-1] == ("assistant", "Paris is the capital. It is big.")  # written, not heard yet
    assert replies.silent() == [1]
    llm.gate.cancel()  # the user barged in before the first audio reached the sink
    pipeline.interrupt(time.monotonic(), report_silent=True)
    assert history(llm)[-1] == ("assistant", "Paris is the capital. It is big.")  # the LLM's thread cuts it:
    assert llm.input_queue is not None
    queued = [llm.input_queue.get_nowait() for _ in range(llm.input_queue.qsize())]
    assert [type(m).__name__ for m in queued] == ["CutToHeard", "Interrupt"]  # both at the head, the cut last put
    queued[0].apply(llm)
    assert history(llm) == [("user", "What is the capital of France?"), ("assistant", INTERRUPTION_MARKER.strip())]
    assert [(e.turn_id, e.heard_text) for e in events if isinstance(e, ReplyCut)] == [(1, "")]


def test_speech_that_cancelled_nothing_reports_nothing() -> None:
    """With --interrupt_response false the VAD does not cancel: the reply is still heard whole."""
    llm, events = make_llm(Script(["Paris is the capital."]))
    replies = RepliesInFlight(llm.bus)
    pipeline = Pipeline(chained([llm]), llm.stop_event, llm.gate, llm.bus, StreamClock(), None, replies)
    llm.bus.subscribe(pipeline.on_event)
    ask(llm, "What is the capital of France?")
    llm.bus.publish(SpeechStarted(2, barge_in=False))
    assert not [e for e in events if isinstance(e, ResponseInterrupted)]
    assert history(llm)[-1] == ("assistant", "Paris is the capital.")
    llm.bus.publish(SpeechStarted(3, barge_in=True))  # the VAD cancelled (it bumps the generation first)
    assert [e.heard_text for e in events if isinstance(e, ResponseInterrupted)] == [""]


def test_a_reply_with_audio_at_the_sink_is_left_to_the_sink() -> None:
    bus = EventBus()
    replies = RepliesInFlight(bus)
    bus.publish(ResponseStarted(1))
    bus.publish(ResponseStarted(2))
    bus.publish(FirstAudio(2))
    assert replies.silent() == [1] and replies.audible() == [2]
    bus.publish(ResponseDone(2))
    bus.publish(TurnSuperseded(1, revision=1))
    assert replies.turns() == []


def test_audio_of_a_kept_turn_survives_the_cancel_at_the_sink(rig: Callable[..., Rig]) -> None:
    """A real interruption's own turn stays valid: a reply to it plays after the cut."""
    r = rig()
    old, speech = r.gate.new_turn_stamp(), r.gate.new_turn_stamp()
    r.feed(audio(old, 1.0, " old"), EndOfResponse(old))
    r.sink.start()
    assert wait_until(lambda: bool(r.sink.writes))
    at = time.monotonic()
    r.feed(Pause(at))
    r.gate.cancel(keep_turns=[speech.turn_id])
    r.feed(Interrupt(at), audio(speech, 0.1, " new"), EndOfResponse(speech))
    r.finish()
    assert [w.item.text for w in r.sink.writes] == [" old", " new"]
    assert {e.turn_id: e.error for e in r.of(ResponseDone)} == {old.turn_id: "cancelled", speech.turn_id: None}
