"""Whole words from a stream of text deltas, for TTS engines that take streaming text.

:class:`~speech_to_speech.speech.text.SentenceStreamer` cuts a reply into chunks that are each spoken
as a whole; engines that synthesise from a text stream get words instead (``--stream_words``), never
a word cut in two by the deltas.
"""

from __future__ import annotations

import re
from collections.abc import Iterator


class WordStreamer:
    """Re-chunks a stream of text deltas into whole words, for TTS engines that take streaming text.

    A word is released once the whitespace after it arrives; it carries a single
    leading space (except the very first word), so joining the words rebuilds the
    text with runs of whitespace collapsed. :meth:`flush` releases the last word.
    Splitting words across deltas would make such engines mispronounce them.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._first = True

    def push(self, delta: str) -> Iterator[str]:
        """Add ``delta``; yield every word it completed."""
        self._buffer += delta
        parts = re.split(r"\s+", self._buffer)
        self._buffer = parts.pop()  # unfinished (or empty, after trailing whitespace)
        for word in parts:
            if word:
                yield from self._emit(word)

    def flush(self) -> Iterator[str]:
        """Yield the last, unterminated word, if any."""
        word, self._buffer = self._buffer, ""
        if word:
            yield from self._emit(word)

    def _emit(self, word: str) -> Iterator[str]:
        yield word if self._first else " " + word
        self._first = False
