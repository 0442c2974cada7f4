"""The WebRTC transport: a peer connection per session, as in the OpenAI Realtime WebRTC flow.

The client POSTs its SDP offer to ``/v1/realtime/calls`` and gets the answer back (201,
``application/sdp``). Then, on the peer connection (aiortc: ICE with host candidates only, DTLS,
SRTP, Opus):

- the client's microphone arrives as Opus at 48 kHz; :class:`WebRTCCall` downmixes each decoded
  frame to mono and hands it to the session (``feed_audio``), which resamples it once to the
  pipeline's 16 kHz;
- the assistant's audio leaves on an outbound track (:class:`OutputTrack`), 20 ms frames at
  48 kHz taken in real time from the session's
  :class:`~speech_to_speech.realtime.media.OutputAudioBuffer` (the sink resamples the TTS output
  once, to 48 kHz);
- the same JSON events as over WebSocket travel on the data channel the client opens, named
  ``oai-events`` (server events sent before it opens are held, then sent in order).

The call ends when the client closes the peer connection or the data channel, when ICE fails, when
``POST /v1/realtime/calls/{id}/hangup`` arrives, or when the peer has not connected within
:data:`CONNECT_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import AudioFrame, MediaStreamError, MediaStreamTrack  # AudioFrame: PyAV's, as aiortc uses it

from speech_to_speech.core.audio import float_to_int16, int16_to_float
from speech_to_speech.realtime.media import MEDIA_RATE, OutputAudioBuffer
from speech_to_speech.realtime.protocol import ProtocolError, error_event, new_id
from speech_to_speech.realtime.transport import AudioFeed
from speech_to_speech.speech.playback import PlaybackReference

logger = logging.getLogger(__name__)

#: the data channel that carries the protocol's JSON events
EVENTS_CHANNEL = "oai-events"
#: seconds a call may take from its answer to a connected peer (ICE + DTLS)
CONNECT_TIMEOUT_S = 30.0
#: server events held while the data channel is not open yet (the oldest are dropped beyond)
MAX_PENDING_EVENTS = 1000
#: frames of silence the outbound track sends after the assistant's audio before it pauses: the
#: decoder's first silent frame still holds the overlap of the last sound (Opus), and a receiver
#: that holds one frame back (aiortc's jitter buffer) would play it only with the next packet
SILENT_TAIL_FRAMES = 3
#: the outbound track resynchronises its clock when it falls this far behind, s (no burst)
MAX_LAG_S = 0.2


class OfferError(ValueError):
    """An SDP offer the server cannot answer (HTTP 400 with this message)."""


class OutputTrack(MediaStreamTrack):
    """The assistant's voice: 20 ms mono frames at 48 kHz from an :class:`OutputAudioBuffer`, in real time.

    While the assistant is silent no packet is sent (as with Opus DTX), after
    :data:`SILENT_TAIL_FRAMES` frames of silence, unless ``continuous`` (a microphone: the far
    end's VAD must hear its silence). The frames' timestamps follow the clock through the gap, so
    the receiver hears it as the pause it is. A silent track sending 50 packets a second cost the
    server 12 % of a core (Opus, SRTP and aiortc's per-packet Python, holding the GIL) and the
    client about as much (2026-12-06, 2-core Intel Xeon, an idle call: 14 % and 11 % of a core with
    them, 2 % and 1.5 % without). The frames are paced on the monotonic clock; after a stall of
    the event loop longer than :data:`MAX_LAG_S` the clock is reset rather than catching up in a
    burst.
    """

    kind = "audio"

    def __init__(self, buffer: OutputAudioBuffer, continuous: bool = False) -> None:
        super().__init__()
        self.buffer = buffer
        self.continuous = continuous
        self._start: float | None = None
        self._frames = 0
        self._pts = 0
        self._silent = 0  # frames of silence sent since the last assistant audio
        self._primed = False  # a primer went out: the frame due now follows it at once
        self._time_base = fractions.Fraction(1, buffer.rate)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        samples_per_frame = self.buffer.frame_samples
        if self._primed:
            self._primed = False
        else:
            await self._next_slot()
            if await self._skip_quiet_slots():
                # aiortc's Opus encoder stamps the first packet after a gap as if there had been
                # none (its resampler and lookahead run one frame behind): a silent primer takes
                # that stale stamp, so the reply's first packet carries its own
                self._primed = True
                return self._frame(np.zeros(samples_per_frame, dtype=np.float32), self._pts - samples_per_frame)
        samples, voiced = self.buffer.next_frame()
        self._silent = 0 if voiced else self._silent + 1
        frame = self._frame(samples, self._pts)
        self._pts += len(samples)
        return frame

    async def _next_slot(self) -> None:
        """Wait for the next frame's time on the clock (resynchronised after a long stall)."""
        frame_s = self.buffer.frame_samples / self.buffer.rate
        now = time.monotonic()
        if self._start is None or now - (self._start + self._frames * frame_s) > MAX_LAG_S:
            self._start, self._frames = now, 0
        else:
            delay = self._start + self._frames * frame_s - now
            if delay > 0:
                await asyncio.sleep(delay)
        self._frames += 1

    async def _skip_quiet_slots(self) -> int:
        """After the silent tail, while nothing is queued, let frame times pass unsent.

        Returns:
            how many frame times passed (0: something is queued, or the tail is not over).
        """
        skipped = 0
        while self._silent >= SILENT_TAIL_FRAMES and not self.continuous and not self.buffer.pending:
            self._pts += self.buffer.frame_samples
            skipped += 1
            await self._next_slot()
            if self.readyState != "live":
                raise MediaStreamError
        return skipped

    def _frame(self, samples: np.ndarray, pts: int) -> AudioFrame:
        frame = AudioFrame.from_ndarray(float_to_int16(samples).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.buffer.rate
        frame.pts = pts
        frame.time_base = self._time_base
        return frame


def frame_to_mono(frame: AudioFrame) -> np.ndarray:
    """A decoded audio frame (s16 or flt, packed or planar, any channels) as mono float32 in [-1, 1]."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        data = data.reshape(channels, -1).mean(axis=0)
    else:
        data = data.reshape(-1, channels).mean(axis=1)
    if frame.format.name.startswith("s16"):
        return int16_to_float(data)
    return data.astype(np.float32)


def low_latency_receiver(pc: RTCPeerConnection, track: MediaStreamTrack) -> None:
    """Let the receiver of ``track`` hand on each audio frame as soon as the next packet is in.

    aiortc's audio jitter buffer waits for 4 more packets (80 ms) before it releases a frame: on
    loopback and a LAN that is 60 ms of latency for reordering that does not happen. A private
    attribute, so this does nothing where a later aiortc names it otherwise.
    """
    for transceiver in pc.getTransceivers():
        if transceiver.receiver.track is track:
            buffer = getattr(transceiver.receiver, "_RTCRtpReceiver__jitter_buffer", None)
            if buffer is not None and hasattr(buffer, "_prefetch"):
                buffer._prefetch = 1


def _check_offer(sdp: str) -> None:
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError("the body must be an SDP offer (it starts with 'v=0')")
    lines = sdp.splitlines()
    if not any(line.startswith("m=audio") for line in lines):
        raise OfferError("the offer needs an audio track (the microphone)")
    if not any(line.startswith("m=application") for line in lines):
        raise OfferError(f"the offer needs a data channel named {EVENTS_CHANNEL!r}")


class WebRTCCall:
    """One WebRTC client: its peer connection, event channel and audio. A :class:`Transport`.

    Create it with :meth:`answer`, on the server's event loop.
    """

    kind = "webrtc"

    def __init__(self) -> None:
        self.id = new_id("rtc")
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only: no STUN, no TURN
        # what the voice sent, for the echo gate: the client's speakers may play it into its microphone
        self.media = OutputAudioBuffer(rate=MEDIA_RATE, reference=PlaybackReference())
        self.track = OutputTrack(self.media)
        self.channel: Any = None
        self.connected = asyncio.Event()
        #: monotonic time of the first audio frame received from the client
        self.first_audio_at: float | None = None
        #: decoded client audio handed to the session, s
        self.received_s = 0.0
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._pending: list[str] = []
        self._feed: AudioFeed | None = None
        self._ended = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._overflow_reported = False
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    @classmethod
    async def answer(cls, offer_sdp: str) -> WebRTCCall:
        """A new call answering ``offer_sdp`` (``call.pc.localDescription.sdp`` is the answer).

        Raises:
            OfferError: not an offer with audio and a data channel, or no codec in common (Opus).
        """
        _check_offer(offer_sdp)
        call = cls()
        try:
            await call.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            transceivers = [t for t in call.pc.getTransceivers() if t.kind == "audio"]
            if not transceivers:
                raise OfferError("the offer needs an audio track (the microphone)")
            transceiver = transceivers[0]
            opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
            transceiver.setCodecPreferences(opus)
            call.pc.addTrack(call.track)
            await call.pc.setLocalDescription(await call.pc.createAnswer())
        except OfferError:
            await call.pc.close()
            raise
        except Exception as exc:  # aiortc: malformed SDP, no common codec, DTLS setup
            await call.pc.close()
            raise OfferError(f"cannot answer this offer: {exc}") from exc
        call._spawn(call._watch_connect())
        return call

    @property
    def answer_sdp(self) -> str:
        """The SDP answer (with the server's ICE candidates)."""
        return self.pc.localDescription.sdp

    # -- Transport ------------------------------------------------------------------------------
    def send(self, event: dict[str, Any]) -> None:
        if self._ended:
            return
        text = json.dumps(event)
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)
            return
        self._pending.append(text)
        del self._pending[:-MAX_PENDING_EVENTS]

    async def flush(self, timeout_s: float = 1.0) -> None:
        """Wait until the data channel has sent what is queued (at most ``timeout_s``, s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        channel = self.channel
        while (
            channel is not None and channel.readyState == "open" and channel.bufferedAmount and loop.time() < deadline
        ):
            await asyncio.sleep(0.01)

    async def messages(self) -> AsyncIterator[str | bytes]:
        while True:
            message = await self._inbox.get()
            if message is None:
                return
            yield message

    def attach(self, feed: AudioFeed) -> None:
        self._feed = feed

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self._end(reason or "closed")
        self.track.stop()
        await self.pc.close()
        for task in list(self._tasks):
            task.cancel()

    # -- peer connection events ---------------------------------------------------------------
    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _end(self, why: str) -> None:
        if not self._ended:
            self._ended = True
            logger.info("call %s ended: %s", self.id, why)
            self._inbox.put_nowait(None)

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != EVENTS_CHANNEL or self.channel is not None:
            logger.info("call %s: ignoring data channel %r", self.id, channel.label)
            return
        self.channel = channel

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            if not self._ended:
                self._inbox.put_nowait(message)

        @channel.on("close")
        def on_close() -> None:
            self._end("data channel closed")

        def flush() -> None:
            pending, self._pending = self._pending, []
            for text in pending:
                channel.send(text)

        if channel.readyState == "open":
            flush()
        else:
            channel.on("open", flush)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            low_latency_receiver(self.pc, track)
            self._spawn(self._read_audio(track))

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.connected.set()
        elif state in ("failed", "closed"):
            self._end(f"peer connection {state}")

    async def _watch_connect(self) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), CONNECT_TIMEOUT_S)
        except TimeoutError:
            self._end(f"the peer did not connect within {CONNECT_TIMEOUT_S:g} s")

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        """Decoded client audio → the session (frames before :meth:`attach` are dropped)."""
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if self._feed is None or self._ended:
                continue
            samples = frame_to_mono(frame)
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            self.received_s += len(samples) / frame.sample_rate
            try:
                self._feed(samples, frame.sample_rate)
            except ProtocolError as exc:  # the session is behind: say so once, then drop quietly
                if not self._overflow_reported:
                    self._overflow_reported = True
                    self.send(error_event(exc.code, exc.message))
            except Exception:  # a bug must not end the call
                logger.exception("call %s: audio input failed", self.id)
