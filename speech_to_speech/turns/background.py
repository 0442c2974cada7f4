"""Other people in the room: speech no louder than the room's background is not the user.

Silero VAD tells speech from noise, not the user from a television or a table of people
talking: four LibriVox readers mixed (babble) score as speech in 95 % of their 32 ms chunks.
In local mode that means a turn that never ends on silence, a reply that pauses or stops for
the room's talk, and answers to it. What tells the user apart is level: the person talking to
the assistant is near the microphone, the others are not.

:class:`BackgroundGate` follows the room's background level, the median of the smoothed level
of the chunks heard while nobody spoke (the last :data:`HISTORY_CHUNKS` of them, about 5 s),
and passes on the VAD's score of a chunk only where the chunk stands out from it:

* to start speech a chunk must be :data:`ONSET_DB` above the background;
* once speech has started, :data:`HOLD_DB` above the background as it was at the start (the
  floor does not learn from the user's own speech, so a long utterance is not cut).

Elsewhere the score is 0. The gate only acts while the room's background is itself speech: at
least :data:`SPEECH_BACKGROUND_ON` of the background chunks of the last 5 s scored as speech by the
VAD (babble: 94 %; pink noise and music: 0 %, also 20 and 30 dB quieter), until fewer than
:data:`SPEECH_BACKGROUND_OFF` do, and during its first second, before it knows the room. The room
is judged while the assistant's voice is not playing: under it, the echo canceller's suppressor
holds the room's talk down, and in the room of ``scripts/benchmark_room.py`` a gate that judged it
then too stood aside during the first story, after which the talk was one 30 s turn after
another. Under a fan, music or in a quiet room the VAD's own score tells speech from the room,
and the level rules would only cut the user's soft words: in the room of
``scripts/benchmark_room.py`` (pink noise at 10 dB SNR, 2026-12-07) a gate that always acted
ended "He was not an ill disposed young man" at "He was not." (the soft "an ill" within 4 dB of
the fan), doubling the questions' word error rate (0.20 against 0.10).

Noise that starts while the room is quiet (a television switched on) is speech at first; a
segment that goes :data:`NO_PAUSE_CHUNKS` (10 s) without one chunk that would not have started
speech is the room, not a person (people pause between sentences, down to the room's level):
its last 5 s become the background, and the segment ends on the next stretch of room.

Measured offline (``tests/test_background_gate.py``: the 5 LibriVox clips of
pocketsphinx-testdata, each read over the other four mixed as babble, or over pink noise, at
10 dB SNR, with 4 s of the noise before and after the reader; Silero VAD and the VAD stage's
endpointer): with babble and no gate, a turn started in the first 0.1 s and ended 3.3-4.1 s
after the reader; with the gate the only turn started 0.29-0.38 s into the reader and ended
0.26 s before to 0.63 s after them. Over pink noise, and in a quiet room, the turns were the
same within 0.3 s. Babble switched on in a quiet room was one turn of 10 s, then the room; the
reader was heard over it. At 5 dB SNR babble is nearly as loud as the user, and the gate cannot
tell them apart.
"""

from __future__ import annotations

import collections
import logging
import math

import numpy as np

from speech_to_speech.core.audio import rms

logger = logging.getLogger(__name__)

#: a chunk must be this far above the background to start speech, dB. Babble's smoothed level
#: was at most 7.5 dB above its median over 5 s (p99 7.0 dB); a reader at 10 dB SNR over it
#: reached 9-13 dB within their first 0.3 s
ONSET_DB = 8.0
#: once speech has started, a chunk goes on being speech this far above the background at its
#: start, dB: the room's talk after the user stopped was at most 2-3 dB above it in 90 % of its
#: chunks, so the turn ends on the user's pause
HOLD_DB = 4.0
#: how many chunks heard outside speech the background is the median of (5 s of 32 ms chunks)
HISTORY_CHUNKS = 156
#: a segment this long without a chunk below the onset level (a pause) is the room getting louder
#: (10 s of 32 ms chunks); the LibriVox readers' sentences, 3-7 s, have none
NO_PAUSE_CHUNKS = 312
#: each chunk's power is averaged with the running average this much (an exponential average
#: with a time constant of about 46 ms): babble's chunks swing less, speech's onsets stay sharp
SMOOTHING = 0.5
#: the gate starts acting once this share of the background chunks scored as speech (the VAD's
#: score >= 0.5): four LibriVox readers mixed at 10 dB under a reader, 94 % of their 32 ms chunks
#: (70 % 20 dB quieter, 0 % 30 dB quieter); pink noise and the synthesised music, 0 % at each level
SPEECH_BACKGROUND_ON = 0.5
#: and stops once it falls under this share (hysteresis: a few quiet seconds in a talking room do
#: not turn it off)
SPEECH_BACKGROUND_OFF = 0.1
#: until it has heard this many chunks of the room (1 s), the gate acts: a program started in a
#: room already talking would otherwise take the first voices for the user (Silero scores the
#: third 32 ms chunk of babble as speech) and never hear the room again
KNOWN_AFTER_CHUNKS = 31
#: input quieter than this counts as this (digital silence has a finite level), dB
FLOOR_DB = -100.0
#: a chunk the VAD scored this high counts as speech for :data:`SPEECH_BACKGROUND_ON` (the
#: default ``--vad_threshold``)
SPEECH_SCORE = 0.5


class BackgroundGate:
    """Sets aside speech no louder than the room's background (see the module doc).

    Fed every 32 ms chunk the VAD scores, in order, from the VAD's thread.

    Args:
        onset_db: how far above the background a chunk must be to start speech, dB.
        hold_db: how far above the background at its start speech must stay, dB.
    """

    def __init__(self, onset_db: float = ONSET_DB, hold_db: float = HOLD_DB) -> None:
        self.onset_db = onset_db
        self.hold_db = hold_db
        self._history: collections.deque[float] = collections.deque(maxlen=HISTORY_CHUNKS)
        #: whether each chunk of :attr:`_history` scored as speech
        self._history_speech: collections.deque[bool] = collections.deque(maxlen=HISTORY_CHUNKS)
        #: smoothed levels of the speech in progress (its last 5 s), dB, and whether each scored as speech
        self._segment: collections.deque[float] = collections.deque(maxlen=HISTORY_CHUNKS)
        self._segment_speech: collections.deque[bool] = collections.deque(maxlen=HISTORY_CHUNKS)
        #: the level rules apply: the room's background is speech (other people talking), or the
        #: gate has not yet heard :data:`KNOWN_AFTER_CHUNKS` of it
        self.acting = True
        self._power: float | None = None  # the smoothed power, mean square
        self._floor_at_start: float | None = None  # the background when the speech in progress began, dB
        self._since_pause = 0  # chunks of the speech in progress since one below the onset level

    @property
    def background_db(self) -> float | None:
        """The room's background level now (median smoothed chunk level, dBFS); None before the
        first chunk (a microphone hears the room before anyone speaks to a program just started)."""
        if not self._history:
            return None
        return float(np.median(self._history))

    def filter(self, chunk: np.ndarray, probability: float, in_speech: bool, voice_playing: bool = False) -> float:
        """The chunk's speech probability, or 0 where it does not stand out from the background.

        Args:
            chunk: one float32 chunk at 16 kHz (any length; the VAD's are 512 samples).
            probability: the VAD's score of it (0-1).
            in_speech: the endpointer was in speech before this chunk.
            voice_playing: the assistant's voice is playing (a reply reached the speaker): the
                chunk does not count in judging whether the room talks (the echo canceller's
                suppressor holds the room down under the voice).

        Returns:
            ``probability`` or 0.0.
        """
        power = rms(chunk) ** 2
        self._power = power if self._power is None else SMOOTHING * self._power + (1 - SMOOTHING) * power
        level = max(FLOOR_DB, 10 * math.log10(self._power + 1e-20))
        speech = probability >= SPEECH_SCORE
        if in_speech:
            self._segment.append(level)
            self._segment_speech.append(speech)
            self._follow_the_room(level)
            floor = self._floor_at_start
            needed = None if floor is None else floor + self.hold_db
        else:
            self._segment.clear()
            self._segment_speech.clear()
            self._since_pause = 0
            floor = self.background_db
            self._floor_at_start = floor
            self._history.append(level)
            if not voice_playing:
                self._history_speech.append(speech)
                self._update_acting()
        if not self.acting or floor is None:
            return probability
        needed = floor + (self.hold_db if in_speech else self.onset_db)
        return probability if level >= needed else 0.0

    def _update_acting(self) -> None:
        """Act while the background is speech (:data:`SPEECH_BACKGROUND_ON`, :data:`SPEECH_BACKGROUND_OFF`)."""
        if len(self._history_speech) < KNOWN_AFTER_CHUNKS:
            return
        share = sum(self._history_speech) / len(self._history_speech)
        acting = share >= SPEECH_BACKGROUND_ON if not self.acting else share >= SPEECH_BACKGROUND_OFF
        if acting != self.acting:
            self.acting = acting
            logger.info(
                "the room's background %s speech (%.0f %% of its chunks): the background gate %s",
                "is" if acting else "is not",
                100 * share,
                "acts" if acting else "stands aside",
            )

    def _follow_the_room(self, level: float) -> None:
        """Count the speech's chunks since a pause; after :data:`NO_PAUSE_CHUNKS`, the room got louder."""
        if self._floor_at_start is not None and level < self._floor_at_start + self.onset_db:
            self._since_pause = 0
            return
        self._since_pause += 1
        if self._since_pause < NO_PAUSE_CHUNKS:
            return
        self._history.extend(self._segment)
        self._history_speech.extend(self._segment_speech)
        self._update_acting()
        self._floor_at_start = self.background_db
        self._since_pause = 0
        logger.info(
            "%.0f s of speech without a pause: the room's background is now %.0f dBFS",
            NO_PAUSE_CHUNKS * 0.032,
            self._floor_at_start or 0.0,
        )
