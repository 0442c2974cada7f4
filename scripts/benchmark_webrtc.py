#!/usr/bin/env python
"""Voice-to-voice latency over WebRTC and over WebSocket, on the same clips, in one run.

The script starts the realtime server as a subprocess on a free port::

    python s2s_pipeline.py --mode server --host 127.0.0.1 --port PORT --max_sessions 2 [EXTRA FLAGS]

(flags after ``--`` go to the server unchanged), or uses a running one given with ``--url``
(``http://HOST:PORT``; its WebSocket endpoint is ``ws://HOST:PORT/v1/realtime``). Then, for each
LibriVox clip (``pocketsphinx-testdata``, or ``--clips_dir``) and each of ``--runs`` rounds, it
speaks the clip once over each transport, each time in a fresh session, alternating which transport
goes first so that a drift in machine load does not favour one:

- **websocket** (:class:`~speech_to_speech.client.realtime.RealtimeClient`): 40 ms blocks of pcm16 at
  24 kHz in ``input_audio_buffer.append`` events, sent in real time (:class:`PacedSender`, open mic:
  silence after the clip); the reply's audio arrives in ``response.output_audio.delta`` events.
- **webrtc** (:class:`~speech_to_speech.client.webrtc.WebRTCClient`): the SDP offer POSTed
  to ``/v1/realtime/calls``; the clip at 48 kHz on the microphone track (20 ms Opus frames in real
  time, silence after it); the reply's audio on the remote track, decoded.

What is measured (``time.monotonic()`` in this process):

- **v2v ms**: the end of the speech in the clip (when the client sent the clip's last sample,
  minus the clip's own trailing silence after :func:`speech_to_speech.testing.bench.speech_end_s`)
  → when the reply's first sample above -60 dBFS (``bench.FIRST_SOUND``, as every benchmark) would
  play at the client, playing what it receives at once: the first
  ``response.output_audio.delta``'s receipt plus that sample's offset in the reply (WebSocket);
  the receipt of the decoded frame that holds it plus its offset in the frame (WebRTC, so after
  Opus decoding and the client's one-frame jitter buffer). It includes the VAD's endpointing
  silence (``--min_silence_ms``), STT, the LLM's first sentence, TTS and both network hops; not
  the client's playback buffer.
- **endpoint ms**: the same start → receipt of ``input_audio_buffer.speech_stopped`` (VAD decision
  plus the uplink: the pacing of the audio, Opus and the server's jitter buffer on WebRTC).
- **server ms**: ``speech_stopped`` → the reply's first audio leaves the server (the receipt of its
  first ``response.output_audio.delta``; over WebRTC of ``output_audio_buffer.started``, which the
  server sends when the first audio frame goes out).
- **downlink ms**: from there to the first audible sample at the client: over WebSocket, the offset
  of that sample in the reply's audio (a client plays the first delta on receipt); over WebRTC, the
  receipt of the frame that holds it plus its offset in the frame (Opus, network, jitter buffer).

Each reply is cancelled (``response.cancel``) once its first audio has arrived, so runs stay short.
One unmeasured WebSocket turn warms the server up first (``--no_warmup`` skips it). Percentiles use
linear interpolation. Both clients run in this process on one asyncio loop.

Exit status: 0 when every turn was measured, 1 otherwise (or when the server could not be started
or reached), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speech_to_speech.client.realtime import (
    WIRE_RATE,
    ConnectError,
    EventLog,
    PacedSender,
    RealtimeClient,
    decode_pcm16,
)
from speech_to_speech.client.webrtc import WebRTCClient
from speech_to_speech.core.audio import float_to_int16, int16_to_float
from speech_to_speech.realtime.media import MEDIA_RATE
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.bench import (
    cell,
    find_clips,
    first_sound_index,
    free_port,
    one_line,
    percentile,
    print_table,
    speech_end_s,
    split_extra,
)
from speech_to_speech.testing.server_runs import BenchmarkError, ServerProcess

PROG = "benchmark_webrtc.py"
TRANSPORTS = ("websocket", "webrtc")
#: the server's per-turn latencies reported in ``response.done``'s metadata
#: (``speech_to_speech.pipeline.console.LATENCY_KEYS``), ms
STAGE_KEYS = ("s2s_endpoint_ms", "s2s_stt_ms", "s2s_ttft_ms", "s2s_ttfa_ms", "s2s_voice_to_voice_ms")


@dataclass
class Clip:
    """A clip at both transports' rates, and where its speech ends."""

    name: str
    wire: np.ndarray  # int16 at WIRE_RATE (WebSocket)
    media: np.ndarray  # float32 at MEDIA_RATE (WebRTC)
    trailing_s: float  # silence at its end, s

    @property
    def duration_s(self) -> float:
        return len(self.media) / MEDIA_RATE


def load_clip(path: Path) -> Clip:
    """Read ``path``; the silence after its last speech is what follows the end of speech that
    every benchmark uses (:func:`speech_to_speech.testing.bench.speech_end_s`)."""
    media = load_audio(path, MEDIA_RATE)
    duration_s = len(media) / MEDIA_RATE
    speech_end = speech_end_s(media, MEDIA_RATE) or duration_s
    wire = float_to_int16(load_audio(path, WIRE_RATE))
    return Clip(path.stem, wire, media, duration_s - speech_end)


@dataclass
class Turn:
    """One measured turn."""

    transport: str
    clip: str
    v2v_ms: float | None = None
    endpoint_ms: float | None = None
    server_ms: float | None = None
    downlink_ms: float | None = None
    #: the server's own figures for the turn (``response.done``'s metadata: ``s2s_stt_ms`` ...), ms
    stages: dict[str, float] = field(default_factory=dict)
    error: str = ""


@dataclass
class Results:
    turns: list[Turn] = field(default_factory=list)

    def of(self, transport: str) -> list[Turn]:
        return [t for t in self.turns if t.transport == transport]


async def _finish(log: EventLog, send: Any, since: int, timeout_s: float, turn: Turn) -> None:
    """Cancel the reply (its first audio is in), wait for its response.done and keep the
    server's per-stage latencies from its metadata in ``turn.stages``."""
    await send({"type": "response.cancel"})
    with contextlib.suppress(Exception):
        done = await log.wait_for("response.done", timeout_s, since)
        metadata = (done.get("response") or {}).get("metadata") or {}
        for key in STAGE_KEYS:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                turn.stages[key] = float(metadata[key])


async def websocket_turn(url: str, api_key: str, clip: Clip, timeout_s: float) -> Turn:
    """Speak ``clip`` over a WebSocket; measure the reply's first audio delta."""
    turn = Turn("websocket", clip.name)
    client = await RealtimeClient.connect(url, api_key=api_key or None)
    first_audio: list[float] = []  # when the first audible sample plays, if played on receipt
    first_delta: list[float] = []  # receipt of the reply's first audio delta (it left the server)
    played = {"samples": 0}

    def on_event(event: dict[str, Any], now: float) -> None:
        if first_audio or event.get("type") != "response.output_audio.delta":
            return
        samples = int16_to_float(decode_pcm16(str(event.get("delta", ""))))
        if not first_delta:
            first_delta.append(now)
        index = first_sound_index(samples)
        if index is None:
            played["samples"] += len(samples)
        else:  # the client plays the reply from its first delta on, without a gap
            first_audio.append(first_delta[0] + (played["samples"] + index) / WIRE_RATE)

    log = client.start_log(on_event)
    sender = PacedSender(client, open_mic=True)
    try:
        await log.wait_for("session.created", timeout_s)
        since = len(log.events)
        sender.say(clip.wire)
        await sender.drained()
        speech_end = time.monotonic() - clip.trailing_s
        stopped = await log.wait_for("input_audio_buffer.speech_stopped", timeout_s, since)
        stopped_at = log.times[log.index(stopped)]
        await log.wait_until(lambda: bool(first_audio), timeout_s, "reply audio")
        turn.v2v_ms = 1000 * (first_audio[0] - speech_end)
        turn.endpoint_ms = 1000 * (stopped_at - speech_end)
        turn.server_ms = 1000 * (first_delta[0] - stopped_at)
        turn.downlink_ms = 1000 * (first_audio[0] - first_delta[0])
        await _finish(log, client.send, since, timeout_s, turn)
    finally:
        await sender.stop()
        await client.close()
    return turn


async def webrtc_turn(base_url: str, api_key: str, clip: Clip, timeout_s: float) -> Turn:
    """Speak ``clip`` over WebRTC; measure the reply's first loud decoded frame."""
    turn = Turn("webrtc", clip.name)
    client = await WebRTCClient.connect(base_url, api_key=api_key or None, timeout_s=timeout_s)
    log = client.log
    first_audio: list[float] = []
    listening = {"from": float("inf")}

    def on_audio(now: float, samples: np.ndarray) -> None:
        if not first_audio and now >= listening["from"]:
            index = first_sound_index(samples)
            if index is not None:  # the frame plays from its receipt on
                first_audio.append(now + index / MEDIA_RATE)

    client.on_audio = on_audio
    try:
        await log.wait_for("session.created", timeout_s)
        since = len(log.events)
        clip_sent: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        # the track sends silence once the clip is out (an open microphone)
        client.say(clip.media, on_sent=lambda: clip_sent.done() or clip_sent.set_result(time.monotonic()))
        speech_end = await clip_sent - clip.trailing_s
        listening["from"] = speech_end
        stopped = await log.wait_for("input_audio_buffer.speech_stopped", timeout_s, since)
        stopped_at = log.times[log.index(stopped)]
        await log.wait_until(lambda: bool(first_audio), timeout_s, "reply audio")
        started = await log.wait_for("output_audio_buffer.started", timeout_s, since)
        started_at = log.times[log.index(started)]  # the reply's first audio left the server
        turn.v2v_ms = 1000 * (first_audio[0] - speech_end)
        turn.endpoint_ms = 1000 * (stopped_at - speech_end)
        turn.server_ms = 1000 * (started_at - stopped_at)
        turn.downlink_ms = 1000 * (first_audio[0] - started_at)
        await _finish(log, client.send, since, timeout_s, turn)
    finally:
        await client.close()
    return turn


async def measure(args: argparse.Namespace, base_url: str, ws_url: str, clips: list[Clip]) -> Results:
    results = Results()
    turns = {"websocket": lambda c: websocket_turn(ws_url, args.api_key, c, args.turn_timeout_s)}
    turns["webrtc"] = lambda c: webrtc_turn(base_url, args.api_key, c, args.turn_timeout_s)
    if not args.no_warmup:
        print("warm-up turn (not measured) ...", flush=True)
        with contextlib.suppress(Exception):
            await turns["websocket"](clips[0])
    for round_index in range(args.runs):
        for i, clip in enumerate(clips):
            order = TRANSPORTS if (i + round_index) % 2 == 0 else TRANSPORTS[::-1]
            for transport in order:
                try:
                    turn = await turns[transport](clip)
                except (ConnectError, TimeoutError, OSError) as exc:
                    turn = Turn(transport, clip.name, error=one_line(exc))
                results.turns.append(turn)
                shown = f"{turn.v2v_ms:.0f} ms" if turn.v2v_ms is not None else f"failed: {turn.error}"
                if turn.stages:
                    shown += " (server: " + ", ".join(f"{k[4:-3]} {v:.0f}" for k, v in turn.stages.items()) + ")"
                print(f"  {clip.name} over {transport}: v2v {shown}", flush=True)
                await asyncio.sleep(0.3)  # let the session close
    return results


def report(results: Results, clips: list[Clip]) -> None:
    rows = []
    for transport in TRANSPORTS:
        turns = [t for t in results.of(transport) if t.v2v_ms is not None]
        v2v = [t.v2v_ms for t in turns if t.v2v_ms is not None]
        endpoint = [t.endpoint_ms for t in turns if t.endpoint_ms is not None]
        server = [t.server_ms for t in turns if t.server_ms is not None]
        downlink = [t.downlink_ms for t in turns if t.downlink_ms is not None]
        rows.append(
            [
                transport,
                f"{len(turns)}/{len(results.of(transport))}",
                cell(percentile(v2v, 50)),
                cell(percentile(v2v, 90)),
                cell(sum(v2v) / len(v2v) if v2v else None),
                cell(percentile(endpoint, 50)),
                cell(percentile(server, 50)),
                cell(percentile(downlink, 50)),
            ]
        )
    print()
    headers = ["transport", "turns", "v2v p50 ms", "v2v p90 ms", "v2v mean ms", "endpoint p50", "server p50"]
    print_table([*headers, "downlink p50"], rows)
    print()
    per_clip = []
    for clip in clips:
        medians = []
        for transport in TRANSPORTS:
            values = [t.v2v_ms for t in results.of(transport) if t.clip == clip.name and t.v2v_ms is not None]
            medians.append(percentile(values, 50))
        diff = medians[1] - medians[0] if None not in medians else None  # type: ignore[operator]
        per_clip.append([clip.name, f"{clip.duration_s:.1f}", cell(medians[0]), cell(medians[1]), cell(diff)])
    print_table(["clip", "s", "websocket v2v ms", "webrtc v2v ms", "webrtc - websocket"], per_clip)
    print()
    print("the server's own figures (response.done metadata), p50 ms:")
    stage_rows = []
    for transport in TRANSPORTS:
        turns = results.of(transport)
        stage_rows.append(
            [transport, *(cell(percentile([t.stages[k] for t in turns if k in t.stages], 50)) for k in STAGE_KEYS)]
        )
    print_table(["transport", *(k.removeprefix("s2s_").removesuffix("_ms") for k in STAGE_KEYS)], stage_rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Voice-to-voice latency over WebRTC vs WebSocket on the same clips (flags after -- go to "
        "the server).",
    )
    parser.add_argument("--url", help="use this running server (http://HOST:PORT) instead of starting one")
    parser.add_argument("--api_key", default="", help="send 'Authorization: Bearer KEY'")
    parser.add_argument("--clips_dir", help="folder of *.wav clips (default: the pocketsphinx-testdata LibriVox clips)")
    parser.add_argument("--clips", type=int, default=5, help="how many clips, shortest first (default 5)")
    parser.add_argument("--runs", type=int, default=1, help="rounds over the clips (default 1)")
    parser.add_argument("--no_warmup", action="store_true", help="skip the unmeasured warm-up turn")
    parser.add_argument("--turn_timeout_s", type=float, default=120.0, help="wait for one step at most this long")
    parser.add_argument("--load_timeout_s", type=float, default=600.0, help="wait for the server at most this long")
    return parser


async def run(args: argparse.Namespace, server_flags: list[str]) -> int:
    paths = find_clips(args.clips_dir)
    if not paths:
        raise BenchmarkError("no clips: install pocketsphinx-testdata or pass --clips_dir")
    clips = sorted((load_clip(p) for p in paths), key=lambda c: c.duration_s)[: args.clips]
    server = None
    if args.url:
        base_url = args.url.rstrip("/")
    else:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "s2s_pipeline.py", "--mode", "server", "--host", "127.0.0.1", "--port", str(port)]
        server = ServerProcess([*command, "--max_sessions", "2", *server_flags])
        print("starting the server:", " ".join(server.command[1:]), flush=True)
        server.start()
        await asyncio.to_thread(server.wait_ready, args.load_timeout_s)
        print(f"server ready in {server.load_s:.1f} s", flush=True)
    ws_url = base_url.replace("http", "ws", 1) + "/v1/realtime"
    try:
        print(f"{len(clips)} clips x {args.runs} run(s) x 2 transports against {base_url}", flush=True)
        results = await measure(args, base_url, ws_url, clips)
    finally:
        if server is not None:
            server.stop()
    report(results, clips)
    failed = [t for t in results.turns if t.v2v_ms is None]
    for turn in failed:
        print(f"{PROG}: {turn.clip} over {turn.transport}: {turn.error}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    own, server_flags = split_extra(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if args.clips < 1 or args.runs < 1 or args.turn_timeout_s <= 0 or args.load_timeout_s <= 0:
        build_parser().error("--clips and --runs must be >= 1, the timeouts > 0")
    try:
        return asyncio.run(run(args, server_flags))
    except BenchmarkError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
