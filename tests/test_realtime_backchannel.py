"""Backchannels and real interruptions through the realtime server, on real speech.

The server's VAD (Silero), STT (faster-whisper) and TTS (Piper) are the embedded models; the
LLM is scripted (:class:`speech_to_speech.testing.turns.ScriptedLLM`: a long, known reply to the question),
so what the client receives and what history holds can be checked exactly. The client talks
like a microphone (:class:`speech_to_speech.testing.realtime.Microphone`: real-time audio, silence between
utterances).

A backchannel ("Yeah.", "Mm hmm.") during the reply pauses its audio and is never reported
(no ``speech_started``: clients stop playback on it); the reply then goes on, to its end, each
word sent once, and the backchannel is neither answered nor in history. A real interruption
("Wait, stop.") is reported and cancels the reply, which history keeps as far as it was sent.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from speech_to_speech.llm.prompts import INTERRUPTION_MARKER
from speech_to_speech.pipeline.registry import Backend, register
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.speech.text import remove_unspeakable
from speech_to_speech.speech.tts import TTSConfig
from speech_to_speech.testing.fakes import FakeTTS
from speech_to_speech.testing.realtime import (
    InProcessServer,
    OverReply,
    RawClient,
    audio_arrivals,
    longest_gap,
    talk_over_reply,
)
from speech_to_speech.testing.speech_data import normalize
from speech_to_speech.testing.turns import LONG_REPLY, QUESTION, speech_only, synthesize

pytestmark = pytest.mark.models

#: the longest the reply's audio may keep arriving after the user starts speaking: the VAD's
#: onset (two 32 ms chunks), the 100 ms microphone block and a loaded 2-core machine's
#: scheduling, s (what the client had received then, up to ClientSink.lead_s, plays out)
STOPS_WITHIN_S = 0.4


@pytest.fixture(scope="module")
def server() -> Any:
    started = InProcessServer("--llm_backend", "turn-script", "--turn_detection", "silence").start()
    yield started
    started.stop()
    started.wait_until_idle()


def converse(server: InProcessServer, during_reply: list[Any], responses: int) -> OverReply:
    def ended(events: list[dict[str, Any]]) -> bool:
        return sum(e["type"] == "response.done" for e in events) >= responses

    question = speech_only(load_audio(QUESTION))
    talk = talk_over_reply(server.ws_url, question, during_reply, ended, server=server)
    return asyncio.run(asyncio.wait_for(talk, 240))


def messages(history: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(str(i["role"]), str(i["content"])) for i in history if i.get("type", "message") == "message"]


def test_backchannels_pause_the_reply_which_goes_on_unanswered(server: InProcessServer) -> None:
    r = converse(server, [synthesize("Yeah."), synthesize("Mm hmm.")], responses=1)
    types = [e["type"] for e in r.events]
    # the question is the only speech the client hears of, and the only thing answered
    assert types.count("input_audio_buffer.speech_started") == 1, types
    # the question's transcripts only: "Hi there." can be endpointed at its pause and the reopened
    # turn is committed as a second item (about one run in two on a 2-core AMD EPYC); a backchannel never
    heard = [e["transcript"] for e in r.events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert heard and all(text.lower().startswith("hi there") for text in heard), heard
    assert types.count("input_audio_buffer.committed") == len(heard), types
    assert types.count("response.created") == 1, types
    done = next(e for e in r.events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", done["response"]
    # the whole reply arrived, each word once
    sent = "".join(e["delta"] for e in r.events if e["type"] == "response.output_audio_transcript.delta")
    assert normalize(sent) == normalize(remove_unspeakable(LONG_REPLY)), sent
    # the question's last revision is answered ("Hi there," can be endpointed at its pause and
    # reopened by the rest: the LLM may have begun on that revision, which was dropped unheard)
    assert "capital" in r.llm_heard[-1].lower(), r.llm_heard
    assert all(r.llm_heard[-1].lower().startswith(h.lower().rstrip(".?!")) for h in r.llm_heard), r.llm_heard
    assert messages(r.history) == [("user", r.llm_heard[-1]), ("assistant", LONG_REPLY)]
    # each backchannel paused the audio as it began, and the audio came back
    arrivals = audio_arrivals(r.events, r.times, done["response"]["id"])
    for began, _ in r.said[1:]:
        gap, gap_start = longest_gap(arrivals, began, began + 2.5)  # before the next one
        print(f"backchannel: audio paused {1000 * (gap_start - began):.0f} ms after it began, for {1000 * gap:.0f} ms")
        assert gap >= 0.3, f"the reply's audio never paused (longest gap {1000 * gap:.0f} ms)"
        assert gap_start - began < STOPS_WITHIN_S, f"paused {1000 * (gap_start - began):.0f} ms after the speech"
    # nothing was sent twice: the audio is shorter than the time it took to arrive, pauses included
    assert sum(s for _, s in arrivals) < arrivals[-1][0] - arrivals[0][0] + 0.3


def test_a_real_interruption_is_reported_and_cancels_the_reply(server: InProcessServer) -> None:
    r = converse(server, [synthesize("Wait, stop.")], responses=2)
    types = [e["type"] for e in r.events]
    assert types.count("input_audio_buffer.speech_started") == 2, types
    first, second = [e for e in r.events if e["type"] == "response.done"][:2]
    assert first["response"]["status"] == "cancelled", first["response"]
    assert second["response"]["status"] == "completed", second["response"]
    # reported in order: speech_started, then the cancelled reply's end
    started = [i for i, t in enumerate(types) if t == "input_audio_buffer.speech_started"][1]
    assert started < r.events.index(first) < r.events.index(second)
    began = r.said[1][0]
    arrivals = audio_arrivals(r.events, r.times, first["response"]["id"])
    late = [t - began for t, _ in arrivals if t > began + STOPS_WITHIN_S]
    assert not late, f"reply audio arrived {1000 * max(late):.0f} ms after the user started speaking"
    # history: the reply as far as it was sent, marked; then the interruption and its answer
    sent = "".join(
        e["delta"]
        for e in r.events
        if e["type"] == "response.output_audio_transcript.delta" and e["response_id"] == first["response"]["id"]
    )
    history = messages(r.history)
    assert [role for role, _ in history] == ["user", "assistant", "user", "assistant"], history
    heard = history[1][1]
    assert heard.endswith(INTERRUPTION_MARKER.strip()), heard
    heard_words = normalize(heard[: -len(INTERRUPTION_MARKER.strip())])
    assert heard_words and normalize(sent)[: len(heard_words)] == heard_words, (heard, sent)
    assert len(heard_words) < len(normalize(LONG_REPLY))
    assert normalize(history[2][1]) == ["wait", "stop"], history[2]


#: how long :class:`SlowTTS` takes per sentence, s
SLOW_TTS_S = 1.5


class SlowTTS(FakeTTS):
    """A voice that takes :data:`SLOW_TTS_S` before any sentence's audio (a tone): a reply's text
    is all generated long before any of its audio is sent."""

    rate = 16_000
    delay_s = SLOW_TTS_S
    lead_samples = 0
    tone_samples = 8_000
    level = 0.3


register(Backend("slow-tts", "tts", TTSConfig, "tests.test_realtime_backchannel:SlowTTS", summary="test"))


def test_a_reply_cancelled_before_any_of_its_audio_leaves_no_text_in_history() -> None:
    slow = InProcessServer("--llm_backend", "turn-script", "--tts", "slow-tts", "--turn_detection", "silence")
    slow.start()

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        client = await RawClient.open(slow.ws_url)
        log = client.log
        try:
            created = await log.wait_for("session.created", 60)
            session = slow.session(created["session"]["id"])
            question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "The capital?"}]}
            await client.send({"type": "conversation.item.create", "item": question})
            await client.send({"type": "response.create"})
            created_response = await log.wait_for("response.created", 60)
            # the whole text is generated at once (scripted LLM); the voice takes 1.5 s to speak
            await log.until(
                lambda: any(
                    isinstance(i.get("content"), str) for i in session.llm.chat.items() if i.get("role") == "assistant"
                ),
                1.0,
            )
            await client.send({"type": "response.cancel", "response_id": created_response["response"]["id"]})
            await log.wait_for("response.done", 60)
            await asyncio.sleep(0.3)
            return list(log.events), session.llm.chat.items()
        finally:
            await client.close()

    try:
        events, history = asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        slow.stop()
        slow.wait_until_idle()
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "cancelled", done["response"]
    assert not [e for e in events if e["type"] == "response.output_audio.delta"], "audio was sent: nothing to show"
    assistant = [str(i["content"]) for i in history if i.get("role") == "assistant"]
    # nothing of the reply was heard: no words of it (at most the interruption marker)
    assert all(not normalize(text.replace(INTERRUPTION_MARKER.strip(), "")) for text in assistant), assistant


def test_a_barge_in_is_reported_before_the_pipeline_cancels_the_reply() -> None:
    """The held ``speech_started`` goes out before the pipeline acts on the barge-in: the sink's
    thread sends the cancelled ``response.done`` once the reply is cut, and clients truncate the
    reply on ``speech_started``, so the order must not depend on which thread is faster."""
    from speech_to_speech.core.events import BargeIn, SpeechStarted
    from speech_to_speech.pipeline.cli import parse_args
    from speech_to_speech.realtime.session import RealtimeSession

    loop = asyncio.new_event_loop()  # the session's loop thread is this one: events are sent at once
    sent: list[dict[str, Any]] = []
    session = RealtimeSession(parse_args(["--mode", "server", "--port", "0"]), loop, sent.append)
    sent_when_cancelled: list[list[str]] = []
    cancel = session.gate.cancel

    def recording_cancel(*args: Any, **kwargs: Any) -> Any:
        sent_when_cancelled.append([event["type"] for event in sent])
        return cancel(*args, **kwargs)

    session.gate.cancel = recording_cancel  # type: ignore[method-assign]
    try:
        session.bus.publish(SpeechStarted(1, audio_ms=1200.0, pauses_reply=True))
        assert sent == []  # held: it may be a backchannel
        session.bus.publish(BargeIn(1, reason="words", text="wait, stop", at=time.monotonic(), keep_turn_ids=[1]))
        assert sent_when_cancelled == [["input_audio_buffer.speech_started"]]
        assert sent[0]["audio_start_ms"] == 1200
    finally:
        session.close()
        loop.close()
