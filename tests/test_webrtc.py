"""The WebRTC transport, from a Python WebRTC client (aiortc), against the server in process.

The client places a call as the OpenAI Realtime WebRTC flow does (SDP offer POSTed to
``/v1/realtime/calls``, answer back), speaks a LibriVox clip on its microphone track and reads the
events on the ``oai-events`` data channel and the assistant's voice on the remote track. The models
are the real embedded VAD, STT and TTS; the LLM is the scripted ``responses-api`` endpoint of
:mod:`speech_to_speech.testing.responses_server`, so replies are known and quick. Also: the page and the HTTP routes on
the same port, ``--api_key`` and ``--max_sessions`` for calls, and the ``openai`` SDK's
``realtime.calls.create`` (multipart offer with a session config).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import ssl
import subprocess
import time
import typing
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pydantic
import pytest
import soxr
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from websockets.asyncio.client import connect

from speech_to_speech.client.realtime import RealtimeClient
from speech_to_speech.client.webrtc import CallError, WebRTCClient
from speech_to_speech.llm.prompts import INTERRUPTION_MARKER
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.realtime.media import MEDIA_RATE
from speech_to_speech.realtime.server import ssl_context
from speech_to_speech.realtime.webrtc import EVENTS_CHANNEL
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.realtime import InProcessServer, transcription_of
from speech_to_speech.testing.responses_server import STORY_REPLY, Reply, ResponsesServer, Text
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, normalize, word_error_rate
from speech_to_speech.testing.turns import synthesize
from tests.helpers import responses_api_flags, two_short_clips

pytestmark = pytest.mark.models

#: the longest any single wait for a server event may take on a slow, shared machine, s
WAIT_S = 300.0
#: a whole scenario is stopped after this, s
SCENARIO_S = 900.0
#: silence after a clip so that the server's VAD ends the turn, s
TRAILING_SILENCE_S = 1.5
#: RMS above which a received frame is assistant speech (silence decodes to ~0)
LOUD_RMS = 0.01
API_KEY = "s2s-webrtc-key"
SHORT_REPLY = Reply([Text(["Hello there, ", "this is the scripted reply. ", "It has two sentences."])])
CLIP_A, CLIP_B = two_short_clips()


def run(scenario: Coroutine[Any, Any, Any], timeout_s: float = SCENARIO_S) -> Any:
    """Run a client scenario on a fresh event loop in this thread, within ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


@pytest.fixture(scope="module")
def guarded(
    server: InProcessServer, provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]
) -> InProcessServer:
    """A second server with an API key and one session at most (the models are already loaded by ``server``)."""
    guard = ("--api_key", API_KEY, "--max_sessions", "1")
    return realtime_servers(*responses_api_flags(provider.base_url, "m"), *guard, warm_up=False)


def base_url(srv: InProcessServer) -> str:
    return f"http://127.0.0.1:{srv.port}"


def http(
    method: str,
    url: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any, bytes]:
    """One HTTP request: (status, headers, body), also for error statuses."""
    request = urllib.request.Request(url, data=body if method != "GET" else None, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def clip_48k(path: Any, trailing_s: float = TRAILING_SILENCE_S) -> np.ndarray:
    """A clip as the microphone sends it: mono float32 at 48 kHz, then silence."""
    return np.concatenate([load_audio(path, MEDIA_RATE), np.zeros(round(trailing_s * MEDIA_RATE), np.float32)])


def loud_times(client: WebRTCClient, start: float = 0.0, end: float = float("inf")) -> list[float]:
    """Receipt times of the received frames with assistant speech in them, within [start, end]."""
    return [t for t, s in client.received if start <= t <= end and float(np.sqrt(np.mean(s**2))) > LOUD_RMS]


async def a_second_into_the_reply(client: WebRTCClient, srv: InProcessServer, clip: Any) -> tuple[Any, str]:
    """Once the session is created, say ``clip`` (2 s of silence after it) and wait until a second of
    the reply's audio has been heard; the server's session and the reply's id."""
    created = await client.log.wait_for("session.created", WAIT_S)
    session = srv.session(created["session"]["id"])
    client.say(clip_48k(clip, 2.0))
    started = await client.log.wait_for("output_audio_buffer.started", WAIT_S)
    await asyncio.sleep(1.0)  # a second of the reply is heard
    return session, started["response_id"]


def is_done(event: dict[str, Any], response_id: str) -> bool:
    """``event`` is the ``response.done`` of response ``response_id``."""
    return event["type"] == "response.done" and event["response"]["id"] == response_id


def _server_event_models() -> dict[str, type[pydantic.BaseModel]]:
    union = typing.get_args(RealtimeServerEvent)[0]
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in typing.get_args(union)}


SERVER_EVENT_MODELS = _server_event_models()


def nonconforming(events: list[dict[str, Any]]) -> list[str]:
    """Events that the ``openai`` SDK's schema does not accept (unknown type or invalid fields)."""
    problems = []
    for event in events:
        model = SERVER_EVENT_MODELS.get(event["type"])
        if model is None:
            problems.append(f"unknown event type {event['type']!r}")
            continue
        try:
            model.model_validate(event)
        except pydantic.ValidationError as exc:
            problems.append(f"{event['type']}: {exc}")
    return problems


# -- the page and the HTTP routes on the realtime port ----------------------------------------------
def test_page_and_http_routes(server: InProcessServer) -> None:
    base = base_url(server)
    status, headers, body = http("GET", base + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, headers)
    assert b'src="/app.js"' in body
    status, headers, body = http("GET", base + "/app.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    assert b"oai-events" in body and b"echoCancellation: true" in body
    status, headers, _ = http("GET", base + "/style.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")
    app_js = http("GET", base + "/app.js")[2]
    for module in ("call.js", "controls.js", "eventlog.js", "latency.js", "meters.js"):  # the ES modules it imports
        assert f'"./{module}"'.encode() in app_js and http("GET", f"{base}/{module}")[0] == 200, module
    status, headers, body = http("GET", base + "/favicon.svg")
    assert status == 200 and headers["Content-Type"] == "image/svg+xml" and b"<svg" in body
    assert http("GET", base + "/.hidden.js")[0] == 404 and http("GET", base + "/static/app.js")[0] == 404
    assert http("GET", base + "/nothing-here")[0] == 404

    calls = base + "/v1/realtime/calls"
    status, _, body = http("POST", calls, b"v=0", {"Content-Type": "application/json"})
    assert status == 415 and json.loads(body)["error"]["code"] == "unsupported_content_type"
    status, _, body = http("POST", calls, b"hello", {"Content-Type": "application/sdp"})
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_offer", body
    status, _, body = http(
        "POST", calls, b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", {"Content-Type": "application/sdp"}
    )
    assert status == 400 and "data channel" in json.loads(body)["error"]["message"], body
    status, _, _ = http("POST", calls, b"x" * (300 * 1024), {"Content-Type": "application/sdp"})
    assert status == 413
    assert http("POST", base + "/v1/elsewhere", b"v=0", {"Content-Type": "application/sdp"})[0] == 404
    assert http("POST", calls + "/rtc_unknown/hangup")[0] == 404
    # a page of another origin may not place calls (--allowed_origins adds origins); the server's own page may
    status, _, body = http("OPTIONS", calls, headers={"Origin": "http://example.test"})
    assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed"
    status, headers, _ = http("OPTIONS", calls, headers={"Origin": base})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == base
    assert "Authorization" in headers["Access-Control-Allow-Headers"]

    async def websocket_still_works() -> str:
        client = await RealtimeClient.connect(f"ws://127.0.0.1:{server.port}/v1/realtime")
        try:
            return str((await client.recv())["type"])
        finally:
            await client.close()

    assert run(websocket_still_works()) == "session.created"
    server.wait_until_idle()


# -- a spoken turn over WebRTC ------------------------------------------------------------------------
def test_spoken_turn_over_webrtc(server: InProcessServer, provider: ResponsesServer) -> None:
    provider.script(SHORT_REPLY)
    clip, reference = CLIP_A

    async def scenario() -> dict[str, Any]:
        client = await WebRTCClient.connect(base_url(server))
        log = client.log
        try:
            created = await log.wait_for("session.created", WAIT_S)
            session = server.session(created["session"]["id"])
            (call,) = list(server.server.calls.values())
            assert session.media is call.media, "the session does not send its audio on the call's track"
            sent_at = time.monotonic()
            client.say(clip_48k(clip))
            await client.sent()
            done = await log.wait_for("response.done", WAIT_S)
            stopped = await log.wait_for("output_audio_buffer.stopped", WAIT_S)
            await asyncio.sleep(0.3)  # the last frames are still on their way
            return {
                "sent_at": sent_at,
                "events": list(log.events),
                "times": list(log.times),
                "done": done,
                "stopped": stopped,
                "received_s": call.received_s,
                "loud": loud_times(client),
                "frames": len(client.received),
                "location": client.call_url,
                "answer": call.answer_sdp,
            }
        finally:
            await client.close()

    r = run(scenario())
    events, times = r["events"], r["times"]
    types = [e["type"] for e in events]

    # the SDP exchange: an Opus answer with host candidates, and the call's URL
    assert "a=candidate:" in r["answer"] and " typ host" in r["answer"], r["answer"]
    assert "opus/48000" in r["answer"].lower()
    assert "/v1/realtime/calls/rtc_" in r["location"]

    # audio both ways: the server decoded the whole clip; the client heard the reply
    assert r["received_s"] >= load_audio(clip, MEDIA_RATE).size / MEDIA_RATE, r["received_s"]
    assert r["loud"], f"no assistant audio in {r['frames']} frames"
    assert len(r["loud"]) * 0.02 >= 1.0, f"only {len(r['loud'])} frames of speech"
    assert "response.output_audio.delta" not in types, "audio went into events, not onto the track"

    # the events: the same protocol as over WebSocket, in order, every one valid for the SDK
    assert not nonconforming(events), nonconforming(events)
    order = [
        "session.created",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "output_audio_buffer.started",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.done",
        "output_audio_buffer.stopped",
    ]
    assert [types.index(kind) for kind in order] == sorted(types.index(kind) for kind in order), types
    transcript = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert word_error_rate(reference, transcript["transcript"]) <= TRANSCRIPT_WER_MAX, transcript["transcript"]
    assert r["done"]["response"]["status"] == "completed"
    spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert normalize(spoken) == normalize(SHORT_REPLY.output[0].text)

    # each word is sent when its audio leaves: the first words come with the first audible frame
    first_words = times[types.index("response.output_audio_transcript.delta")]
    assert -0.1 <= r["loud"][0] - first_words <= 0.3, r["loud"][0] - first_words
    # and the response ends after its last audio
    assert times[types.index("output_audio_buffer.stopped")] >= r["loud"][-1] - 0.1
    server.wait_until_idle()


def test_barge_in_over_webrtc_cuts_the_audio_and_keeps_what_was_heard(
    server: InProcessServer, provider: ResponsesServer
) -> None:
    provider.script(STORY_REPLY)
    (clip_a, _), (clip_b, reference_b) = CLIP_A, CLIP_B

    async def scenario() -> dict[str, Any]:
        client = await WebRTCClient.connect(base_url(server))
        log = client.log
        try:
            session, reply_1 = await a_second_into_the_reply(client, server, clip_a)
            barge_in = len(log.events)
            client.say(clip_48k(clip_b))
            speech_b = await log.wait_for("input_audio_buffer.speech_started", WAIT_S, since=barge_in)
            speech_b_at = log.times[log.index(speech_b)]
            done_1 = await log.wait_for(lambda e: is_done(e, reply_1), WAIT_S, what="reply 1 done")
            cleared = await log.wait_for("output_audio_buffer.cleared", WAIT_S, since=barge_in)
            transcript_b = await transcription_of(log, speech_b, WAIT_S, "B's transcription")
            started_2 = await log.wait_for("output_audio_buffer.started", WAIT_S, since=barge_in)
            started_2_at = log.times[log.index(started_2)]
            return {
                "done_1": done_1,
                "cleared": cleared,
                "reply_1": reply_1,
                "transcript_b": transcript_b["transcript"],
                "late": loud_times(client, speech_b_at + 0.3, started_2_at),
                "history": session.llm.chat.items(),
            }
        finally:
            await client.close()

    r = run(scenario())
    assert r["done_1"]["response"]["status"] == "cancelled", r["done_1"]["response"]
    assert r["cleared"]["response_id"] == r["reply_1"]
    assert not r["late"], f"{len(r['late'])} frames of the cut reply arrived 0.3 s after speech_started"
    heard = str(next(i for i in r["history"] if i.get("role") == "assistant")["content"])
    assert heard.endswith(INTERRUPTION_MARKER.strip()), heard
    heard_words = normalize(heard[: -len(INTERRUPTION_MARKER.strip())])
    full = normalize(STORY_REPLY.output[0].text)
    assert heard_words and full[: len(heard_words)] == heard_words and len(heard_words) < len(full), heard
    assert word_error_rate(reference_b, r["transcript_b"]) <= 0.5, (reference_b, r["transcript_b"])
    server.wait_until_idle()


def test_a_backchannel_over_webrtc_pauses_the_voice_and_the_reply_goes_on(
    server: InProcessServer, provider: ResponsesServer
) -> None:
    provider.script(STORY_REPLY)
    (clip_a, _), _ = CLIP_A, CLIP_B
    yeah = soxr.resample(synthesize("Yeah."), 16_000, MEDIA_RATE).astype(np.float32)

    async def scenario() -> dict[str, Any]:
        client = await WebRTCClient.connect(base_url(server))
        log = client.log
        try:
            session, reply_1 = await a_second_into_the_reply(client, server, clip_a)
            began = await client.sent()  # the backchannel's first sample leaves now
            client.say(np.concatenate([yeah, np.zeros(round(1.5 * MEDIA_RATE), np.float32)]))
            done_1 = await log.wait_for(lambda e: is_done(e, reply_1), WAIT_S, what="reply 1 done")
            await asyncio.sleep(0.5)
            loud = loud_times(client, began - 0.5, began + 3.0)
            return {
                "events": list(log.events),
                "done_1": done_1,
                "gaps": [(b - a, a - began) for a, b in itertools.pairwise(loud)],
                "history": session.llm.chat.items(),
            }
        finally:
            await client.close()

    r = run(scenario())
    types = [e["type"] for e in r["events"]]
    assert types.count("input_audio_buffer.speech_started") == 1, types  # the backchannel is not reported
    assert types.count("response.created") == 1, types
    assert r["done_1"]["response"]["status"] == "completed", r["done_1"]["response"]
    gap, gap_at = max(r["gaps"])
    print(f"backchannel over WebRTC: the voice paused {1000 * gap_at:.0f} ms after it began, for {1000 * gap:.0f} ms")
    assert gap >= 0.3, f"the voice never paused (longest gap {1000 * gap:.0f} ms)"
    assert gap_at < 0.4, f"the voice paused {1000 * gap_at:.0f} ms after the backchannel began"
    # the reply went on to its end and history holds all of it, each word once, and no backchannel
    history = [(i.get("role"), str(i.get("content"))) for i in r["history"] if i.get("type", "message") == "message"]
    assert [role for role, _ in history] == ["user", "assistant"], history
    assert normalize(history[1][1]) == normalize(STORY_REPLY.output[0].text), history[1]
    transcript = next(e for e in r["events"] if e["type"] == "response.output_audio_transcript.done")["transcript"]
    assert normalize(transcript) == normalize(STORY_REPLY.output[0].text), transcript
    server.wait_until_idle()


def test_openai_sdk_places_a_call_with_a_session_config(server: InProcessServer, provider: ResponsesServer) -> None:
    """``client.realtime.calls.create(sdp=..., session=...)`` (multipart) and ``calls.hangup``."""
    server.wait_until_idle()  # no call of an earlier test (one that failed) is still open
    provider.script(SHORT_REPLY)

    async def scenario() -> dict[str, Any]:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("audio", direction="sendrecv")
        channel = pc.createDataChannel(EVENTS_CHANNEL)
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        channel.on("message", lambda m: events.put_nowait(json.loads(m)))
        try:
            await pc.setLocalDescription(await pc.createOffer())
            sdk = AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="unused")
            session = {"type": "realtime", "instructions": "Answer like a pirate."}
            answer = await sdk.realtime.calls.create(sdp=pc.localDescription.sdp, session=session)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            seen = []
            while not seen or seen[-1]["type"] != "session.updated":
                seen.append(await asyncio.wait_for(events.get(), WAIT_S))
            (call_id,) = list(server.server.calls)
            await sdk.realtime.calls.hangup(call_id)
            await asyncio.wait_for(_until(lambda: not server.server.calls), WAIT_S)
            return {"seen": seen}
        finally:
            await pc.close()

    r = run(scenario())
    assert [e["type"] for e in r["seen"]] == ["session.created", "session.updated"]
    assert r["seen"][-1]["session"]["instructions"] == "Answer like a pirate."
    server.wait_until_idle()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.05)


def test_api_key_and_max_sessions_guard_the_calls(guarded: InProcessServer) -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        with pytest.raises(CallError) as no_key:
            await WebRTCClient.connect(base_url(guarded))
        out["no_key"] = no_key.value.status
        with pytest.raises(CallError) as wrong_key:
            await WebRTCClient.connect(base_url(guarded), api_key="wrong")
        out["wrong_key"] = wrong_key.value.status
        first = await WebRTCClient.connect(base_url(guarded), api_key=API_KEY)
        try:
            out["first"] = (await first.log.wait_for("session.created", WAIT_S))["type"]
            with pytest.raises(CallError) as full:
                await WebRTCClient.connect(base_url(guarded), api_key=API_KEY)
            out["full"] = (full.value.status, str(full.value))
            status, _, _ = await asyncio.to_thread(
                http, "POST", first.call_url + "/hangup", b"", {"Authorization": f"Bearer {API_KEY}"}
            )
            out["hangup"] = status
            await first.log.until(lambda: first.log.closed is not None, WAIT_S)
            out["closed"] = first.log.closed is not None
        finally:
            await first.close()
        await asyncio.to_thread(guarded.wait_until_idle)
        again = await WebRTCClient.connect(base_url(guarded), api_key=API_KEY)
        try:
            out["again"] = (await again.log.wait_for("session.created", WAIT_S))["type"]
        finally:
            await again.close()
        return out

    r = run(scenario())
    assert (r["no_key"], r["wrong_key"]) == (401, 401)
    assert r["first"] == "session.created"
    assert r["full"][0] == 503 and "full" in r["full"][1], r["full"]
    assert r["hangup"] == 204 and r["closed"], r
    assert r["again"] == "session.created"
    guarded.wait_until_idle()


def test_output_audio_buffer_clear_cuts_the_reply(server: InProcessServer, provider: ResponsesServer) -> None:
    provider.script(STORY_REPLY)

    async def scenario() -> dict[str, Any]:
        client = await WebRTCClient.connect(base_url(server))
        log = client.log
        try:
            await log.wait_for("session.created", WAIT_S)
            client.say(clip_48k(CLIP_A[0]))
            started = await log.wait_for("output_audio_buffer.started", WAIT_S)
            await asyncio.sleep(0.5)
            since = len(log.events)
            await client.send({"type": "output_audio_buffer.clear"})
            cleared_at = time.monotonic()
            done = await log.wait_for("response.done", WAIT_S, since=since)
            await asyncio.sleep(1.0)
            return {
                "reply": started["response_id"],
                "done": done,
                "cleared": [e for e in log.events if e["type"] == "output_audio_buffer.cleared"],
                "late": loud_times(client, cleared_at + 0.3),
                "before": loud_times(client, 0, cleared_at),
            }
        finally:
            await client.close()

    r = run(scenario())
    assert r["before"], "no audio before the clear"
    assert r["done"]["response"]["id"] == r["reply"] and r["done"]["response"]["status"] == "cancelled"
    assert r["done"]["response"]["status_details"]["reason"] == "client_cancelled"
    assert [e["response_id"] for e in r["cleared"]] == [r["reply"]], r["cleared"]
    assert not r["late"], f"{len(r['late'])} frames of audio 0.3 s after output_audio_buffer.clear"
    server.wait_until_idle()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_and_wss_with_a_certificate(
    server: InProcessServer,
    provider: ResponsesServer,
    realtime_servers: Callable[..., InProcessServer],
    tmp_path: Any,
) -> None:
    """--ssl_certfile/--ssl_keyfile: the page over HTTPS, a WebRTC call placed over HTTPS, WebSocket over WSS."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    names = ["-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run([*request, *names, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tls = ("--ssl_certfile", str(cert), "--ssl_keyfile", str(key))
    secure = realtime_servers(*responses_api_flags(provider.base_url, "m"), *tls, warm_up=False)
    trusted = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{secure.port}"

    status, _, body = http("GET", base + "/", context=trusted)
    assert status == 200 and b"app.js" in body

    async def scenario() -> tuple[str, str]:
        async with connect(f"wss://127.0.0.1:{secure.port}/v1/realtime", ssl=trusted) as ws:
            over_wss = json.loads(await ws.recv())["type"]
        client = await WebRTCClient.connect(base, ssl_context=trusted)
        try:
            over_https = (await client.log.wait_for("session.created", WAIT_S))["type"]
        finally:
            await client.close()
        return over_wss, over_https

    assert run(scenario()) == ("session.created", "session.created")
    secure.wait_until_idle()

    with pytest.raises(RuntimeError, match="needs --ssl_certfile"):
        ssl_context(parse_args(["--mode", "server", "--ssl_keyfile", str(key)]))
    with pytest.raises(RuntimeError, match="cannot load the TLS certificate"):
        ssl_context(parse_args(["--mode", "server", "--ssl_certfile", str(tmp_path / "missing.pem")]))


def test_a_drain_ends_a_call_with_an_error_after_its_reply(
    server: InProcessServer, provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]
) -> None:
    """What SIGTERM does (tests/test_drain.py, over a WebSocket), here over WebRTC: the reply in
    progress finishes, then the call gets ``server_shutting_down`` on its data channel and ends."""
    provider.script(SHORT_REPLY)
    draining = realtime_servers(*responses_api_flags(provider.base_url, "m"), "--drain_timeout_s", "60", warm_up=False)

    async def scenario() -> list[dict[str, Any]]:
        client = await WebRTCClient.connect(base_url(draining))
        log = client.log
        try:
            await log.wait_for("session.created", WAIT_S)
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}
            await client.send({"type": "conversation.item.create", "item": item})
            await client.send({"type": "response.create"})
            await log.wait_for("response.created", WAIT_S)
            loop, stop = draining._loop, draining._stop
            assert loop is not None and stop is not None
            loop.call_soon_threadsafe(draining.server.request_drain, stop)  # as SIGTERM does
            await log.wait_for("error", WAIT_S)
            await log.until(lambda: log.closed is not None, WAIT_S)
            return list(log.events)
        finally:
            await client.close()

    events = run(scenario())
    types = [e["type"] for e in events]
    done = [e for e in events if e["type"] == "response.done"]
    assert len(done) == 1 and done[0]["response"]["status"] == "completed", done
    assert types[-1] == "error" and events[-1]["error"]["code"] == "server_shutting_down", types[-4:]
    draining._thread.join(WAIT_S)
    assert not draining._thread.is_alive()
