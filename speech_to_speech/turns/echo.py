"""Speech over the assistant's own voice: which input the voice itself can explain (echo).

With the user's speakers on, the microphone hears the assistant too. A browser's echo canceller
removes most of it: on a WebRTC call through a sound server, Chromium's left nothing above -56 dB
of the voice's level in 99 % of the 20 ms frames (``scripts/benchmark_echo.py``). Not every
client has one (a browser asked for ``echoCancellation: false``, a speakerphone, local mode's
microphone and speaker): there the voice came back at -15 to -5 dB of what was sent, as loud as
speech, and Silero VAD scores it as speech. The assistant then interrupts itself ("once upon a")
and answers its own words, over and over.

The server knows what its voice played and when: a
:class:`~speech_to_speech.speech.playback.PlaybackReference` keeps its level per 20 ms as it goes
to the speaker (local mode) or leaves on the call's track (WebRTC). :class:`EchoGate` judges every
32 ms chunk the VAD scores against the loudest voice played in the :data:`MAX_DELAY_S` before the
chunk arrived: the chunk counts as speech only if its level is above the echo's, that is above
``coupling`` × that voice level by ``margin_db``; otherwise its speech probability is 0. The
coupling (how loud the echo comes back) is measured on the input itself (:attr:`EchoGate.coupling`).
With a working echo canceller it is tiny and the gate lets everything through; without one, the
user has to be louder than the voice's echo, as in a room. The room's own noise (a fan, music)
is no echo: its level, heard while the voice is silent (:attr:`EchoGate.room_power`), is taken
out of each chunk before it is compared or measured, or the gate would learn the noise as a loud
echo and set aside a user who speaks over the voice no louder than the noise plus the margin. A
room that talks (other people, a television) keeps its level in: the gate's bar then holds that
talk back under the voice.

Measured offline on calls recorded in ``benchmark_echo.py``'s room (the frames each call sent and
received, 90 s each, replayed through Silero VAD with and without the gate):
speech onsets outside the user's speech fell from 41 to 0 (echo at -9 dB, no echo canceller) and
from 38 to 2 (echo at 0 dB), with every user utterance still heard; from 1 to 0 with the canceller.
Live, in that room with no echo canceller (the browser's gain control raises the echo to about
0 dB of the voice), 7 of 10 sentences spoken over the voice stopped it and no story stopped or
answered itself; without the gate the assistant answered its own echo without end. A margin of
3 dB heard 5 of 6 sentences but let 2 of 6 stories stop on their echo.

:mod:`speech_to_speech.turns.interruptions` has the second check: a transcript that only repeats
the words the voice just played is its echo, and the reply resumes.
"""

from __future__ import annotations

import collections
import logging
import math

import numpy as np

from speech_to_speech.core.audio import rms
from speech_to_speech.speech.playback import PlaybackReference
from speech_to_speech.turns.background import SPEECH_BACKGROUND_ON, SPEECH_SCORE

logger = logging.getLogger(__name__)

#: the echo of what was played arrives within this after it: 220-240 ms measured on loopback
#: (``benchmark_echo.py``: the browser's jitter buffer and playout, the sound server, the capture
#: and the uplink), with room for a real network, s
MAX_DELAY_S = 0.8
#: voice quieter than this (-50 dBFS) cannot come back audibly: the gate stays open
SILENT_RMS = 10 ** (-50 / 20)
#: how far above the echo's level (coupling × voice) a chunk must be to count as speech, dB
MARGIN_DB = 6.0
#: the coupling assumed until it is measured, dB: the echo as loud as the voice (a browser's gain
#: control raised an uncancelled echo to -1 dB of it), so the first reply does not hear itself
PRIOR_COUPLING_DB = 0.0
#: chunks heard with the voice playing before the measured coupling replaces the prior (0.8 s)
LEARN_MIN_CHUNKS = 25
#: chunks the coupling is measured over (the last 8 s with the voice playing)
LEARN_KEPT_CHUNKS = 250
#: the percentile of those chunks' level ratios that is the coupling: the loud end of the echo.
#: The user's own speech over the voice stays above it: they are a few % of those chunks, since
#: the voice pauses when the user speaks
COUPLING_PERCENTILE = 90.0
#: input quieter than this counts as this (a fully cancelled echo still has a finite ratio)
FLOOR_RMS = 10 ** (-90 / 20)
#: chunks of the room heard with no voice within :data:`MAX_DELAY_S` (and outside speech) kept to
#: know the room's own level (the last 5 s of them)
ROOM_KEPT_CHUNKS = 156
#: the percentile of those chunks' power that is the room's level, taken out of every chunk heard
#: with the voice playing: the loud end of a fan, music or a television, which the voice cannot
#: explain and which, left in, was measured as echo. In the room of ``scripts/benchmark_room.py``
#: (music at 10 dB under the user, the canceller on) it held the bar at -11 to -4 dB of the voice,
#: over the user's sentences at -12 to -22 dB; in a quiet room the bar fell to -24 to -42 dB
ROOM_PERCENTILE = 90.0
#: a room chunk the VAD scored under this is the room's noise; the soft edges of the user's own
#: words (between this and talk, just before speech starts and after it ends)
#: are neither, and are left out of its level
ROOM_NOISE_SCORE = 0.15
#: the room's level is taken out only once this many chunks of its noise were heard (1 s)
ROOM_MIN_CHUNKS = 31


class EchoGate:
    """Sets aside the input chunks that the assistant's voice can explain (see the module doc).

    Called from the VAD's thread only.

    Args:
        reference: the voice as it was played.
        margin_db: see :data:`MARGIN_DB`.
    """

    def __init__(self, reference: PlaybackReference, margin_db: float = MARGIN_DB) -> None:
        self.reference = reference
        self.margin = 10 ** (margin_db / 20)
        self._ratios = np.zeros(LEARN_KEPT_CHUNKS, dtype=np.float64)  # a ring: the last ones measured
        self._measured = 0  # ratios written so far (the ring holds the last LEARN_KEPT_CHUNKS)
        #: power (mean square) of the last chunks heard with no voice playing (the room), and the
        #: VAD's score of each
        self._room: collections.deque[tuple[float, float]] = collections.deque(maxlen=ROOM_KEPT_CHUNKS)
        self._room_power: float | None = 0.0  # its percentile; None: to be computed again
        #: chunks with a speech score that were set aside as echo, so far
        self.rejected = 0

    @property
    def coupling(self) -> float:
        """How loud the echo comes back: input RMS (less the room's, :attr:`room_power`) over the
        voice's RMS, a ratio (not dB).

        The :data:`COUPLING_PERCENTILE` of the ratios of the last :data:`LEARN_KEPT_CHUNKS`
        chunks heard with the voice playing, outside the user's utterances (silence included: with
        an echo canceller, silence is the echo); :data:`PRIOR_COUPLING_DB` until
        :data:`LEARN_MIN_CHUNKS` were heard.
        """
        count = min(self._measured, LEARN_KEPT_CHUNKS)
        if count < LEARN_MIN_CHUNKS:
            return 10 ** (PRIOR_COUPLING_DB / 20)
        # np.percentile's linear interpolation, from a partial sort (this runs for every chunk)
        position = (count - 1) * COUPLING_PERCENTILE / 100
        low, high = math.floor(position), math.ceil(position)
        ratios = np.partition(self._ratios[:count], (low, high))
        return float(ratios[low] + (ratios[high] - ratios[low]) * (position - low))

    @property
    def room_power(self) -> float:
        """The room's own noise without the voice, as power (mean square): the
        :data:`ROOM_PERCENTILE` of the last :data:`ROOM_KEPT_CHUNKS` chunks heard outside speech with
        no voice played within :data:`MAX_DELAY_S`, of those the VAD scored under
        :data:`ROOM_NOISE_SCORE`; 0 before :data:`ROOM_MIN_CHUNKS` of them were heard, and while at
        least :data:`~speech_to_speech.turns.background.SPEECH_BACKGROUND_ON` of the room's chunks are
        talk (scored :data:`~speech_to_speech.turns.background.SPEECH_SCORE` or more, the background
        gate's bars; babble: 94 %). A room that talks (other people, a television) keeps its level
        in: under the voice, the gate holding that talk back kept stories from stopping for it (the
        same room with babble at 10 dB: 3 of 4 stories stopped with it taken out, 1 of 10 kept in)."""
        if self._room_power is None:
            noise = [power for power, score in self._room if score < ROOM_NOISE_SCORE]
            talk = sum(score >= SPEECH_SCORE for _, score in self._room)
            talking = talk >= SPEECH_BACKGROUND_ON * len(self._room)
            known = len(noise) >= ROOM_MIN_CHUNKS
            self._room_power = float(np.percentile(noise, ROOM_PERCENTILE)) if known and not talking else 0.0
        return self._room_power

    def filter(self, chunk: np.ndarray, arrived: float, probability: float, in_speech: bool = False) -> float:
        """The speech probability of ``chunk`` with the echo set aside.

        Args:
            chunk: float32 input samples in [-1, 1] (any rate; the VAD's 32 ms chunks).
            arrived: when the chunk reached the pipeline (monotonic s).
            probability: the VAD's score of the chunk (0-1).
            in_speech: the VAD is inside an utterance: the chunk is the user's (or an echo already
                let through) and does not measure the echo. Otherwise the user's earlier
                interruptions would teach the gate that the echo is as loud as they are.

        Returns:
            ``probability``; 0.0 when the voice played within :data:`MAX_DELAY_S` before
            ``arrived`` and the chunk, less the room's own level (:attr:`room_power`), is not
            louder than its echo by the margin.
        """
        played = self.reference.level(arrived - MAX_DELAY_S, arrived)
        power = rms(chunk) ** 2
        if played < SILENT_RMS:
            if not in_speech:
                self._room.append((power, probability))
                self._room_power = None
            return probability
        # what the voice could explain is what the chunk has beyond the room's noise
        ratio = max(math.sqrt(max(power - self.room_power, 0.0)), FLOOR_RMS) / played
        threshold = self.coupling * self.margin
        if not in_speech:
            self._ratios[self._measured % LEARN_KEPT_CHUNKS] = ratio
            self._measured += 1
        if ratio >= threshold:
            return probability
        if probability > 0:
            self.rejected += 1
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "echo: set aside p=%.2f at %.1f dB of the voice (bar %.1f dB)",
                    probability,
                    20 * math.log10(ratio),
                    20 * math.log10(threshold),
                )
        return 0.0
