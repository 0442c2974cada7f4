"""The realtime server's turn detection on real speech: ``semantic_vad`` (Smart Turn) against
``server_vad`` (silence), on the in-process server with the real embedded models.

A finished LibriVox sentence is ended by Smart Turn with ``semantic_vad`` (before any silence
fallback) and by 500 ms of silence with ``server_vad``; a sentence with a 1.5 s pause in the middle
stays one committed turn with ``semantic_vad``.
Audio is sent at real-time pace in 100 ms blocks, each when its last sample is due.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
import soxr

from speech_to_speech.client.realtime import float_to_int16, session_update
from speech_to_speech.testing.realtime import WIRE_RATE, InProcessServer, RawClient, append_event, blocks
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, word_error_rate
from speech_to_speech.testing.turns import librivox_speech, mid_phrase_cuts, silence
from speech_to_speech.turns.endpointer import BY_MODEL, BY_SILENCE
from speech_to_speech.turns.turn_detection import smart_turn_installed

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(not smart_turn_installed(), reason="the Smart Turn model is not installed (smart-turn extra)"),
]

BLOCK_S = 0.1
FINISHED = "sense_and_sensibility_01_austen_64kb-0920"  # the model hears it as finished (p ~0.98)
SECOND_HALF = "sense_and_sensibility_01_austen_64kb-0890"  # "unless to be rather cold hearted and rather selfish ..."
SEMANTIC = {"type": "semantic_vad", "eagerness": "auto"}
SERVER_VAD = {"type": "server_vad", "silence_duration_ms": 500}


def clip(name: str) -> tuple[np.ndarray, str]:
    clips = librivox_speech()
    if name not in clips:
        pytest.skip(f"{name} is not installed (pocketsphinx-testdata)")
    return clips[name]


def wire(samples: np.ndarray) -> np.ndarray:
    """16 kHz float32 as int16 at the wire's rate."""
    return float_to_int16(soxr.resample(samples, 16_000, WIRE_RATE).astype(np.float32))


async def talk(server: InProcessServer, turn_detection: dict[str, Any], audio: np.ndarray, speech_end_s: float) -> Any:
    """Send ``audio`` (16 kHz) after a session update; return (events, their times, when the last
    block holding speech was sent). Ends once a response is done or 8 s after the audio."""
    client = await RawClient.open(server.ws_url)
    try:
        await client.log.wait_for("session.created", 60)
        await client.send(session_update(turn_detection))
        await client.log.wait_for("session.updated", 60)
        # time for the VAD to take the new settings (and load the model the first time)
        for payload in blocks(wire(silence(1.5)), BLOCK_S):
            await client.send(append_event(payload))
        await asyncio.sleep(3.0)
        start, speech_sent = time.monotonic(), 0.0
        for i, payload in enumerate(blocks(wire(audio), BLOCK_S)):
            due = start + (i + 1) * BLOCK_S
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await client.send(append_event(payload))
            if i * BLOCK_S < speech_end_s:
                speech_sent = time.monotonic()
        await client.log.until(lambda: bool(client.log.of("response.done")), 30)
        return list(client.log.events), list(client.log.times), speech_sent
    finally:
        await client.close()


@pytest.fixture(scope="module")
def server() -> Any:
    started = InProcessServer("--max_new_tokens", "10").start()
    yield started
    started.stop()
    started.wait_until_idle()


def test_semantic_vad_ends_a_finished_sentence_sooner_than_server_vad(server: InProcessServer) -> None:
    sentence, _ = clip(FINISHED)
    audio = np.concatenate([sentence, silence(3.0)])
    delays, ended_by = {}, {}
    for name, detection in (("semantic_vad", SEMANTIC), ("server_vad", SERVER_VAD)):
        events, times, speech_sent = asyncio.run(
            asyncio.wait_for(talk(server, detection, audio, len(sentence) / 16_000), 180)
        )
        stopped = [t for e, t in zip(events, times, strict=True) if e["type"] == "input_audio_buffer.speech_stopped"]
        assert len(stopped) == 1, [e["type"] for e in events]
        delays[name] = (stopped[0] - speech_sent) * 1000
        done = [e for e in events if e["type"] == "response.done"]
        assert len(done) == 1, [e["type"] for e in events]
        ended_by[name] = (done[0]["response"].get("metadata") or {}).get("s2s_endpoint_by")
    print(f"speech_stopped after the end of speech: {delays}, ended by {ended_by}")
    # Smart Turn ended the finished sentence before semantic_vad's silence fallback; server_vad waited
    # for its 500 ms of silence. How much sooner, in ms, is benchmark_turns.py's figure: wall-clock
    # delays on a busy machine (CI: 478 vs 603 ms) say more about the machine than the detector.
    assert ended_by == {"semantic_vad": BY_MODEL, "server_vad": BY_SILENCE}, (ended_by, delays)


def test_semantic_vad_keeps_a_sentence_with_a_1_5_s_pause_one_turn(server: InProcessServer) -> None:
    samples, reference = clip(SECOND_HALF)
    # "Unless to be rather cold hearted and rather | selfish ...": neither the model nor the words
    # ("... and rather...") say the turn is over at the pause
    cut = next(c for c in mid_phrase_cuts(samples) if c.last_word in ("rather", "and"))
    audio = np.concatenate([cut.samples, silence(1.5), samples[len(cut.samples) :], silence(3.0)])
    events, _, _ = asyncio.run(asyncio.wait_for(talk(server, SEMANTIC, audio, len(audio) / 16_000 - 3.0), 180))
    types = [e["type"] for e in events]
    completed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert types.count("input_audio_buffer.committed") == 1, types
    assert len(completed) == 1, completed
    assert word_error_rate(reference, completed[0]["transcript"]) <= TRANSCRIPT_WER_MAX, completed
