"""The client sink: the end of a session's pipeline, where paced output becomes protocol events."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from speech_to_speech.core.messages import AudioOutput, EndOfResponse, TextOutput
from speech_to_speech.realtime.wire import WIRE_RATE
from speech_to_speech.speech.playback import PacedAudioSink


class OutputTarget(Protocol):
    """Where the sink hands a session's output (a :class:`~speech_to_speech.realtime.responses.ResponseOutput`)."""

    def on_text_delta(self, item: TextOutput) -> None: ...

    def recall_audio(self) -> int | None: ...

    def on_audio(self, item: AudioOutput, samples: np.ndarray) -> None: ...

    def on_response_end(self, end: EndOfResponse) -> None: ...


class ClientSink(PacedAudioSink):
    """Paced audio and text of a session turned into protocol events (through ``target``).

    Audio is resampled once to ``sample_rate`` (the wire's 24 kHz, or 48 kHz for a WebRTC track)
    and released ``lead_s`` ahead of its play time, which keeps the
    client's buffer short, so a barge-in stops audible output quickly and the
    server knows closely how much of a reply was heard.
    """

    lead_s = 0.25

    def __init__(self, *args: Any, target: OutputTarget, sample_rate: int = WIRE_RATE, **kwargs: Any) -> None:
        super().__init__(*args, sample_rate=sample_rate, **kwargs)
        self.target = target

    def process(self, item: Any) -> Any:
        if isinstance(item, TextOutput):
            if self.gate.admits(item.stamp):  # text-only replies are not paced
                self.target.on_text_delta(item)
            return iter(())
        return super().process(item)

    def on_pause(self, at: float) -> float:
        """User speech pauses the reply. A media transport takes back its unsent audio: output
        stopped where what it sent ends (the delivered audio is back to back, so that is the
        delivered end less what was taken back; earlier or later than ``at`` by the transport's
        own pace). Audio events already sent over WebSocket play out at the client (at most
        :attr:`lead_s`), so the pause starts where they end."""
        recalled = self.target.recall_audio()
        if not recalled:  # nothing could be taken back: what was delivered plays out
            return max(at, self.delivered_until())
        return self.delivered_until() - recalled / self.sample_rate

    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        self.target.on_audio(item, samples)

    def on_response_done(self, item: EndOfResponse) -> None:
        self.target.on_response_end(item)
