"""The realtime client toolkit (speech_to_speech.client.realtime) and the audio pieces it shares with audio_io.

Against small scripted ``websockets`` servers on 127.0.0.1 (port 0): no models, a few seconds.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from speech_to_speech.client.realtime import (
    BLOCK_SAMPLES,
    WIRE_RATE,
    ConnectError,
    EventTimeout,
    PacedSender,
    RealtimeClient,
    decode_pcm16,
    encode_pcm16,
    load_wire_audio,
    pcm16_bytes,
    session_update,
    silence,
)
from speech_to_speech.client.talk import audio as talk_audio
from speech_to_speech.speech.audio_io import OutputBuffer, Timeline

#: the longest any scenario here may take, s
SCENARIO_S = 10.0

Handler = Callable[[ServerConnection], Awaitable[None]]


async def with_server(handler: Handler, scenario: Callable[[str], Awaitable[Any]]) -> Any:
    """Run ``scenario(url)`` while ``handler`` serves WebSocket connections on a free port."""
    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        return await asyncio.wait_for(scenario(f"ws://127.0.0.1:{port}/v1/realtime"), SCENARIO_S)


def run(handler: Handler, scenario: Callable[[str], Awaitable[Any]]) -> Any:
    return asyncio.run(with_server(handler, scenario))


# -- wire audio ---------------------------------------------------------------------------------


def test_pcm16_round_trip_and_size() -> None:
    samples = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    payload = encode_pcm16(samples)
    np.testing.assert_array_equal(decode_pcm16(payload), samples)
    assert pcm16_bytes(payload) == 2 * len(samples)
    assert pcm16_bytes(encode_pcm16(samples[:5])) == 10
    with pytest.raises(ValueError, match="even number of bytes"):
        decode_pcm16(base64.b64encode(bytes(9)).decode())  # half a sample: an error, not a silent drop
    with pytest.raises(ValueError):
        decode_pcm16("not base64!")
    assert len(silence(0.5)) == WIRE_RATE // 2


def test_load_wire_audio_resamples_to_24_khz(tmp_path: Path) -> None:
    path = tmp_path / "tone.wav"
    t = np.arange(16_000) / 16_000
    sf.write(str(path), np.stack([0.5 * np.sin(2 * np.pi * 440 * t)] * 2, axis=1), 16_000)
    samples = load_wire_audio(path)
    assert samples.dtype == np.int16 and abs(len(samples) - WIRE_RATE) <= 1
    assert 0.4 * 32767 < np.abs(samples).max() < 0.6 * 32767
    with pytest.raises(FileNotFoundError):
        load_wire_audio(tmp_path / "missing.wav")


def test_session_update_fields() -> None:
    manual = session_update(None)["session"]
    assert manual["audio"]["input"] == {"format": {"type": "audio/pcm", "rate": WIRE_RATE}, "turn_detection": None}
    assert "tools" not in manual and "instructions" not in manual
    tool = {"type": "function", "name": "add", "parameters": {"type": "object"}}
    full = session_update(
        {"type": "server_vad"}, instructions="Be brief.", voice="joe", transcription_model="whisper-1", tools=[tool]
    )["session"]
    assert full["instructions"] == "Be brief." and full["audio"]["output"]["voice"] == "joe"
    assert full["audio"]["input"]["transcription"] == {"model": "whisper-1"}
    assert full["tools"] == [tool] and full["tool_choice"] == "auto"


# -- the connection -------------------------------------------------------------------------------


def test_api_key_header_and_event_stream() -> None:
    seen: dict[str, Any] = {}

    async def handler(ws: ServerConnection) -> None:
        seen["authorization"] = ws.request.headers.get("Authorization") if ws.request else None
        await ws.send(b"\x00binary")
        await ws.send("not json")
        await ws.send("[1, 2]")
        await ws.send(json.dumps({"type": "session.created"}))
        async for message in ws:
            seen.setdefault("received", []).append(json.loads(message))
            await ws.send(json.dumps({"type": "echo", "of": json.loads(message)["type"]}))

    async def scenario(url: str) -> tuple[list[dict[str, Any]], list[str], RealtimeClient]:
        invalid: list[str] = []
        client = await RealtimeClient.connect(url, api_key="k1", on_invalid=invalid.append)
        events = [await client.recv()]
        await client.send({"type": "input_audio_buffer.commit"})
        assert await client.append_audio(np.zeros(BLOCK_SAMPLES, dtype=np.int16))
        events += [await client.recv(), await client.recv()]
        await client.close()
        assert not await client.send({"type": "response.create"})  # dropped once closed
        return events, invalid, client

    events, invalid, client = run(handler, scenario)
    assert seen["authorization"] == "Bearer k1"
    assert [e["type"] for e in events] == ["session.created", "echo", "echo"]
    assert invalid == ["not json"]
    assert [e["type"] for e in seen["received"]] == ["input_audio_buffer.commit", "input_audio_buffer.append"]
    assert pcm16_bytes(seen["received"][1]["audio"]) == 2 * BLOCK_SAMPLES
    assert client.closed and client.close_reason is None


def test_close_reason_of_a_refusing_server() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "error", "error": {"code": "max_sessions_reached"}}))
        await ws.close(1013, "try again later")

    async def scenario(url: str) -> tuple[list[dict[str, Any]], RealtimeClient]:
        client = await RealtimeClient.connect(url)
        events = [event async for event in client]
        return events, client

    events, client = run(handler, scenario)
    assert [e["type"] for e in events] == ["error"]
    assert client.closed and client.close_reason == "code 1013: try again later"


def test_connect_error_names_the_url() -> None:
    async def scenario() -> None:
        await RealtimeClient.connect("ws://127.0.0.1:9/v1/realtime", open_timeout_s=5)

    with pytest.raises(ConnectError, match=r"cannot connect to ws://127\.0\.0\.1:9/v1/realtime: "):
        asyncio.run(scenario())


def test_event_log_waits_and_times_out() -> None:
    async def handler(ws: ServerConnection) -> None:
        for index in range(3):
            await ws.send(json.dumps({"type": "tick", "index": index}))
            await asyncio.sleep(0.05)
        await ws.wait_closed()

    async def scenario(url: str) -> tuple[Any, ...]:
        client = await RealtimeClient.connect(url)
        seen: list[tuple[str, float]] = []
        log = client.start_log(lambda event, t: seen.append((event["type"], t)))
        try:
            last = await log.wait_for(lambda e: e["index"] == 2, 5.0, what="the third tick")
            later = log.of("tick", since=1)
            reached = await log.until(lambda: len(log.events) >= 3, 1.0)
            never = await log.until(lambda: len(log.events) > 3, 0.2)
            with pytest.raises(EventTimeout, match=r"no tock: 0.2 s passed; received since 0: \['tick'"):
                await log.wait_for("tock", 0.2)
            with pytest.raises(EventTimeout, match="never four ticks"):
                await log.wait_until(lambda: len(log.events) > 3, 0.2, "four ticks")
            return last, later, reached, never, seen, list(log.times), log.index(last)
        finally:
            await client.close()

    last, later, reached, never, seen, times, index = run(handler, scenario)
    assert last["index"] == 2 and index == 2
    assert [e["index"] for e in later] == [1, 2]
    assert reached and not never
    assert [kind for kind, _ in seen] == ["tick"] * 3 and [t for _, t in seen] == times == sorted(times)


def test_event_log_sees_the_close() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "session.created"}))
        await ws.close()

    async def scenario(url: str) -> BaseException | None:
        client = await RealtimeClient.connect(url)
        log = client.start_log()
        began = time.monotonic()
        with pytest.raises(EventTimeout, match="connection closed"):
            await log.wait_for("session.updated", 5.0)
        assert time.monotonic() - began < 2.0  # the close ends the wait, not the timeout
        await client.close()
        return log.closed

    assert isinstance(run(handler, scenario), ConnectionClosed)


# -- PacedSender --------------------------------------------------------------------------------


def recording_server(arrivals: list[tuple[float, int]]) -> Handler:
    """A server that records (receipt time, samples) of every input_audio_buffer.append."""

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "input_audio_buffer.append":
                arrivals.append((time.monotonic(), pcm16_bytes(event["audio"]) // 2))

    return handler


def test_paced_sender_keeps_an_absolute_schedule() -> None:
    arrivals: list[tuple[float, int]] = []
    speed = 4.0
    block_s = BLOCK_SAMPLES / WIRE_RATE / speed

    async def scenario(url: str) -> float:
        client = await RealtimeClient.connect(url)
        sender = PacedSender(client, speed=speed)
        start = time.monotonic()
        sender.say(np.ones(10 * BLOCK_SAMPLES + 100, dtype=np.int16), start=start)
        await sender.drained()
        await asyncio.sleep(0.1)
        await sender.stop()
        await client.close()
        return start

    start = run(recording_server(arrivals), scenario)
    assert [n for _, n in arrivals] == [BLOCK_SAMPLES] * 10 + [100]  # the last block is not padded
    for index, (t, _) in enumerate(arrivals):
        assert t >= start + (index + 1) * block_s - 0.005, (index, t - start)
    assert arrivals[-1][0] - start < 11 * block_s + 0.5


def test_open_mic_sends_silence_between_utterances() -> None:
    arrivals: list[tuple[float, int]] = []

    async def scenario(url: str) -> None:
        client = await RealtimeClient.connect(url)
        sender = PacedSender(client, speed=8.0, open_mic=True)
        sender.say(np.ones(BLOCK_SAMPLES + 10, dtype=np.int16))
        await sender.drained()
        await asyncio.sleep(0.1)  # silence keeps flowing
        await sender.stop()
        await client.close()

    run(recording_server(arrivals), scenario)
    assert len(arrivals) >= 3 and {n for _, n in arrivals} == {BLOCK_SAMPLES}  # padded to whole blocks


def test_paced_sender_stops_when_the_connection_closes() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.close()

    async def scenario(url: str) -> None:
        client = await RealtimeClient.connect(url)
        sender = PacedSender(client, speed=4.0)
        sender.say(np.ones(100 * BLOCK_SAMPLES, dtype=np.int16))  # 1 s at this speed
        began = time.monotonic()
        await sender.drained()
        assert time.monotonic() - began < 0.8
        await sender.stop()
        await client.close()

    run(handler, scenario)


# -- the audio pieces shared with audio_io -----------------------------------------------------------


def test_output_buffer_fills_skips_and_counts() -> None:
    buffer = OutputBuffer()
    played: dict[str, int] = {}
    buffer.append(np.full(3, 1, dtype=np.int16), "a")
    buffer.append(np.zeros(0, dtype=np.int16), "empty")  # nothing to queue
    buffer.append(np.full(4, 2, dtype=np.int16), "b")
    buffer.append(np.full(2, 3, dtype=np.int16), "c")
    out = np.full(5, 9, dtype=np.int16)

    def count(tag: str, n: int) -> None:
        played[tag] = played.get(tag, 0) + n

    buffer.fill(out, played=count)
    assert out.tolist() == [1, 1, 1, 2, 2] and played == {"a": 3, "b": 2}
    buffer.fill(out, skip=lambda tag: tag == "b", played=count)  # the rest of b is dropped unplayed
    assert out.tolist() == [3, 3, 0, 0, 0] and played == {"a": 3, "b": 2, "c": 2}
    assert not buffer
    buffer.append(np.full(4, 5, dtype=np.int16), "d")
    buffer.append(np.full(4, 6, dtype=np.int16), "e")
    buffer.keep(lambda tag: tag != "d")
    assert buffer.clear() == "e" and buffer.clear() is None


def test_timeline_places_cuts_and_renders() -> None:
    timeline = Timeline()
    timeline.place(0, np.full(4, 1.0, dtype=np.float32), "old")
    timeline.place(6, np.full(4, 2.0, dtype=np.float32), "old")
    timeline.place(2, np.full(2, 3.0, dtype=np.float32), "new")
    timeline.cut(3, where=lambda tag: tag == "old")
    assert len(timeline) == 2 and timeline.end == 4
    assert timeline.render(6, np.float32).tolist() == [1, 1, 3, 3, 0, 0]
    timeline.cut(0)
    assert len(timeline) == 0 and timeline.render(2, np.int16).tolist() == [0, 0]


# -- s2s-talk on the shared client: file in, reply on the input's timeline --------------------------------


def test_talk_file_mode_streams_paced_and_records_the_reply(
    talk: ModuleType, console_out: io.StringIO, tmp_path: Path
) -> None:
    """--no_vad file mode: the file goes out in 40 ms blocks, then commit + response.create; the reply's
    audio lands in the WAV where it arrived on the input's timeline."""
    question = tmp_path / "question.wav"
    sf.write(str(question), np.full(int(0.4 * 16_000), 0.25, dtype=np.float32), 16_000)
    received: list[dict[str, Any]] = []
    reply = np.full(WIRE_RATE // 5, 8000, dtype=np.int16)  # 0.2 s

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            event = json.loads(message)
            received.append(event)
            if event["type"] == "session.update":
                await ws.send(json.dumps({"type": "session.updated", "session": event["session"]}))
            elif event["type"] == "response.create":
                base = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
                for out in (
                    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
                    {"type": "response.output_audio.delta", **base, "delta": encode_pcm16(reply)},
                    {"type": "response.output_audio.done", **base},
                    {"type": "response.done", "response": {"id": "resp_1", "status": "completed"}},
                ):
                    await ws.send(json.dumps(out))

    out = tmp_path / "reply.wav"

    async def scenario(url: str) -> int:
        flags = ["--url", url, "--input_audio", str(question), "--output_audio", str(out), "--no_vad"]
        return await talk.run(talk.parse_args([*flags, "--idle_timeout_s", "3"]))

    assert run(handler, scenario) == 0, console_out.getvalue()
    kinds = [e["type"] for e in received]
    appends = [e for e in received if e["type"] == "input_audio_buffer.append"]
    assert kinds[0] == "session.update" and kinds[-2:] == ["input_audio_buffer.commit", "response.create"]
    assert len(appends) == 10 and {pcm16_bytes(e["audio"]) for e in appends} == {2 * BLOCK_SAMPLES}
    written, rate = sf.read(str(out), dtype="int16")
    assert rate == WIRE_RATE
    voiced = np.flatnonzero(written)
    assert len(voiced) == len(reply)
    assert voiced[0] >= int(0.4 * WIRE_RATE) - BLOCK_SAMPLES  # after the question was streamed
    assert "[saved]" in console_out.getvalue() and "[latency] response.create → first audio" in console_out.getvalue()


class FakeOutputStream:
    """Stands in for ``sounddevice.OutputStream``: the test calls the callback itself."""

    latency = 0.01

    def __init__(self, *, samplerate: int, callback: Callable[..., None], **kwargs: Any) -> None:
        self.samplerate = samplerate
        self.callback = callback

    def pull(self, frames: int) -> np.ndarray:
        out = np.full((frames, 1), 7, dtype=np.int16)
        self.callback(out, frames, None, None)
        return out[:, 0]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeSoundDevice:
    """A device that takes 24 kHz int16 mono."""

    OutputStream = FakeOutputStream

    @staticmethod
    def check_output_settings(**kwargs: Any) -> None:
        pass


def test_talk_speaker_sink_plays_in_order_and_reports_what_was_heard(
    talk: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(talk_audio, "import_sounddevice", lambda: FakeSoundDevice)
    sink = talk.SpeakerSink()
    stream: FakeOutputStream = sink._stream
    assert sink.rate == WIRE_RATE  # no resampling
    sink.push("item_1", np.full(WIRE_RATE // 10, 1, dtype=np.int16))  # 100 ms
    sink.push("item_1", np.full(WIRE_RATE // 10, 2, dtype=np.int16))
    first = stream.pull(WIRE_RATE // 20)  # 50 ms
    assert set(first.tolist()) == {1}
    assert sink.interrupt() == ("item_1", 40)  # 50 ms handed over, minus the device's 10 ms latency
    assert set(stream.pull(100).tolist()) == {0}  # dropped: silence
    assert sink.interrupt() is None  # nothing playing any more

    sink.push("item_2", np.full(480, 3, dtype=np.int16))
    sink.item_done("item_2")
    assert set(stream.pull(600).tolist()) == {0, 3}
    assert sink.interrupt() is None  # item 2 was heard in full
    asyncio.run(sink.drain())
    sink.close()
