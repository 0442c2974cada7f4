"""Partial transcripts on the wire: ``conversation.item.input_audio_transcription.delta`` while the user speaks.

A LibriVox clip is sent at real-time pace to the in-process realtime server
(real embedded models). Deltas must come during speech (before speech_stopped),
conform to the OpenAI SDK's event schema, and add up to the completed transcript
or a start of it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai.types.realtime import ConversationItemInputAudioTranscriptionDeltaEvent

from speech_to_speech.testing.realtime import InProcessServer, RawClient, append_event, blocks, load_clip, silence
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, librivox_clips, normalize, word_error_rate

pytestmark = pytest.mark.models

CLIP = "sense_and_sensibility_01_austen_64kb-0870"  # 7 s
BLOCK_S = 0.1


def test_transcription_deltas_arrive_while_the_user_speaks() -> None:
    clips = {path.stem: (path, ref) for path, ref in librivox_clips().items()}
    if CLIP not in clips:
        pytest.skip(f"{CLIP} is not installed (pocketsphinx-testdata)")
    path, reference = clips[CLIP]
    server = InProcessServer("--max_new_tokens", "10").start()

    async def scenario() -> list[dict[str, Any]]:
        client = await RawClient.open(server.ws_url)
        try:
            await client.log.wait_for("session.created", 60)
            for payload in blocks(load_clip(path), BLOCK_S):  # as a microphone would send it
                await client.send(append_event(payload))
                await asyncio.sleep(BLOCK_S)
            for payload in blocks(silence(1.5), BLOCK_S):
                await client.send(append_event(payload))
            await client.log.wait_for("conversation.item.input_audio_transcription.completed", 60)
            return list(client.log.events)
        finally:
            await client.close()

    try:
        events = asyncio.run(asyncio.wait_for(scenario(), 180))
    finally:
        server.stop()
    types = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    completed = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert word_error_rate(reference, completed["transcript"]) <= TRANSCRIPT_WER_MAX
    for delta in deltas:
        ConversationItemInputAudioTranscriptionDeltaEvent.model_validate(delta)
        assert delta["item_id"] == completed["item_id"] and delta["content_index"] == 0 and delta["event_id"]
    stopped = types.index("input_audio_buffer.speech_stopped")
    during_speech = [d for d in deltas if events.index(d) < stopped]
    assert during_speech, f"no transcription delta while the user spoke: {types}"
    # the deltas add up to the words of the transcript, possibly without its first one or two
    announced = normalize("".join(d["delta"] for d in deltas))
    words = normalize(completed["transcript"])
    assert announced and any(words[k : k + len(announced)] == announced for k in range(3)), (announced, words)
