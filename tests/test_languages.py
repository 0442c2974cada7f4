"""Languages end to end: hearing (multilingual Whisper), answering, speaking (a voice per language,
espeak-ng for the rest), the realtime session's transcription language, the ``--tts_voice`` flag.

The tests marked ``models`` speak questions in French, German and Spanish with espeak-ng, run them
through the whole pipeline (multilingual Whisper base, the embedded Qwen 0.5B, Piper with the
espeak-ng fallback) and transcribe the replies back with Whisper base to check their language.
"""

from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr

from speech_to_speech.core.audio import float_to_pcm16
from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import EventBus, FirstAudio, ResponseDone, TurnMetrics
from speech_to_speech.core.messages import AudioOutput, ResponseRequest, Transcript, TTSInput
from speech_to_speech.llm.prompts import reply_language
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.pipeline.console import ConsoleReporter, MetricsCollector
from speech_to_speech.speech.tts import TTSConfig, parse_voices
from speech_to_speech.testing import fakes
from speech_to_speech.testing.fakes import FakeTTS, Script
from speech_to_speech.testing.speech_data import word_error_rate
from speech_to_speech.turns.stt import STTConfig
from tests.helpers import REPO_ROOT, new_stage, run_local

#: the questions, by language, as espeak-ng speaks them (chosen among 12 that Whisper base
#: names the language of: it hears espeak-ng's French poorly, see docs/languages.md)
QUESTIONS = {
    "fr": "Quel est le plus grand océan du monde ?",
    # espeak-ng's German: the one of five questions Whisper base names German among the four on
    # every machine tried ("Was ist die Hauptstadt von Deutschland?" was English on one of them)
    "de": "Guten Tag, wie geht es Ihnen heute?",
    "es": "¿Cuál es la capital de España?",
    "en": "What is the capital of France?",
}
#: short words common in each language and rare in the three others (a reply's language, roughly)
COMMON_WORDS = {
    "fr": {"le", "la", "les", "est", "du", "des", "une", "et", "je", "vous", "bien", "merci", "oui"},
    "de": {"der", "die", "das", "ist", "und", "ich", "mir", "es", "gut", "danke", "sie", "ihnen", "geht"},
    "es": {"el", "la", "los", "las", "es", "del", "una", "y", "muy", "bien", "gracias", "estoy", "que"},
    "en": {"the", "is", "of", "and", "it", "you", "i", "am", "thanks", "what", "are"},
}
#: the languages the multilingual tests detect among
CANDIDATES = "en,fr,de,es"

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (apt install espeak-ng)")


# -- --tts_voice -----------------------------------------------------------------------------------


def test_voices_by_language() -> None:
    assert parse_voices("") == {}
    assert parse_voices("voices/joe.onnx") == {"": "voices/joe.onnx"}
    assert parse_voices("fr=fr.onnx, de_DE=de.onnx,en.onnx") == {"fr": "fr.onnx", "de": "de.onnx", "": "en.onnx"}
    assert parse_voices("pt-BR=C:/voices/pt.onnx") == {"pt": "C:/voices/pt.onnx"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fr=", "names no voice"),
        ("fr=a.onnx,,b.onnx", "names no voice"),
        ("french=a.onnx", "not a language code"),
        ("fr=a.onnx,fr-CA=b.onnx", "language 'fr' twice"),
        ("a.onnx,b.onnx", "default voice twice"),
    ],
)
def test_bad_voice_lists_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_voices(spec)


def test_tts_voice_is_repeatable_and_comma_separated() -> None:
    args = parse_args(["--tts_voice", "fr=fr.onnx", "--tts_voice", "de=de.onnx,es=es.onnx"])
    assert parse_voices(args.tts_voice) == {"fr": "fr.onnx", "de": "de.onnx", "es": "es.onnx"}


@pytest.mark.parametrize("flags", [["--tts_voice", "fr="], ["--tts_voice", "fr=a.onnx", "--tts_voice", "fr=b.onnx"]])
def test_bad_tts_voice_is_one_error_line(flags: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "s2s_pipeline.py"), *flags, "--print_system_prompt"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2 and not done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("s2s_pipeline.py: error: argument --tts_voice:"), done.stderr


# -- the language travels: transcript → reply rule, history, TTSInput → audio → console ---------------


def test_reply_rule_follows_the_setting() -> None:
    assert reply_language("auto", "fr") == "French"
    assert reply_language("en,fr,de", "de") == "German"
    assert reply_language("auto", None) is None
    assert reply_language("en", "fr") is None  # English pinned: no rule, whatever the STT said
    assert reply_language("fr", "fr") == "French"  # another language pinned: its rule


def test_the_turns_language_reaches_tts_and_history() -> None:
    llm, _ = fakes.make_llm(Script(["Paris est la capitale."]), Script(["Berlin."]), Script(["Oui."]))
    llm.config.language = "auto"
    stamp = llm.gate.new_turn_stamp()
    out = list(llm.process(Transcript(stamp, "Quelle est la capitale ?", language="fr")))
    spoken = [item for item in out if isinstance(item, TTSInput)]
    assert spoken and all(item.language == "fr" for item in spoken)
    assert "français" in llm.requests[0][0]["content"]
    out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "And Germany?", language="en")))
    assert [item.language for item in out if isinstance(item, TTSInput)] == ["en"]
    users = [item for item in llm.chat.items() if item.get("role") == "user"]
    assert [item.get("language") for item in users] == ["fr", "en"]
    # a reply to no transcript (a client's response.create) is in the latest turn's language
    assert llm.latest_language() == "en"
    llm.chat.add_item({"type": "message", "role": "user", "content": "Et l'Espagne ?", "language": "fr"})
    out = list(llm.process(ResponseRequest(llm.gate.new_turn_stamp())))
    assert [item.language for item in out if isinstance(item, TTSInput)] == ["fr"]
    assert "français" in llm.requests[2][0]["content"]


class TwoEngines(FakeTTS):
    """A fake voice that speaks French with a second engine at another rate."""

    def speak(self, text: str, language: str | None) -> tuple[Any, int, str]:
        if language == "fr":
            return (np.full(2000, 0.5, np.float32),), 2000, "other"
        return self.synthesize(text), self.sample_rate, "fake"


def test_audio_says_which_engine_spoke_and_the_console_shows_it() -> None:
    gate, bus = Gate(), EventBus()
    tts = TwoEngines(threading.Event(), None, None, gate, bus, config=TTSConfig(tts_chunk_ms=100), name="tts")
    tts.setup()
    french = list(tts.process(TTSInput(gate.new_turn_stamp(), "Bonjour.", "fr")))
    english = list(tts.process(TTSInput(gate.new_turn_stamp(), "Hello.", "en")))
    assert {(a.sample_rate, a.engine, a.language) for a in french} == {(2000, "other", "fr")}
    assert sum(len(a.samples) for a in french) == 2000 and len(french) == 10  # 100 ms chunks at 2000 Hz
    assert {(a.sample_rate, a.engine, a.language) for a in english} == {(1000, "fake", "en")}
    stream = io.StringIO()
    ConsoleReporter(bus, stream)
    MetricsCollector(bus)
    bus.publish(FirstAudio(7, engine="espeak-ng", language="fr"))
    bus.publish(ResponseDone(7))
    assert "| voice espeak-ng fr" in stream.getvalue()


def test_metrics_carry_the_voice() -> None:
    bus = EventBus()
    metrics: list[TurnMetrics] = []
    bus.subscribe(lambda e: metrics.append(e) if isinstance(e, TurnMetrics) else None)
    MetricsCollector(bus)
    bus.publish(FirstAudio(1, engine="piper", language="en"))
    bus.publish(ResponseDone(1))
    bus.publish(FirstAudio(2))
    bus.publish(ResponseDone(2))
    assert [m.voice for m in metrics] == ["piper en", None]


# -- espeak-ng ------------------------------------------------------------------------------------


def wav_as_piped(samples: np.ndarray, rate: int) -> bytes:
    """A 16-bit mono WAV as espeak-ng writes it to a pipe: the data size is a placeholder."""
    pcm = float_to_pcm16(samples)
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 0x7FFFF024) + b"WAVE" + fmt + b"data" + struct.pack("<I", 0x7FFFF000) + pcm


def test_wav_from_a_pipe_is_decoded() -> None:
    from handlers.tts.espeak_ng_tts import EspeakNGError, decode_wav

    samples = np.linspace(-0.5, 0.5, 101, dtype=np.float32)
    decoded, rate = decode_wav(wav_as_piped(samples, 22_050))
    assert rate == 22_050 and len(decoded) == 101
    assert np.allclose(decoded, samples, atol=1e-4)
    with pytest.raises(EspeakNGError):
        decode_wav(b"")


@needs_espeak
def test_espeak_picks_a_voice_per_language() -> None:
    from handlers.tts.espeak_ng_tts import DEFAULT_VOICE, EspeakNG

    espeak = EspeakNG({"de": "de-ch"})
    assert espeak.voice_for("fr") == "fr"  # espeak-ng lists "fr-fr"; "fr" selects it
    assert espeak.voice_for("de-DE") == "de-ch"
    assert espeak.voice_for("xx") == DEFAULT_VOICE and espeak.voice_for(None) == DEFAULT_VOICE
    french, rate = espeak.synthesize("Bonjour tout le monde.", "fr")
    english, _ = espeak.synthesize("Bonjour tout le monde.", "en")
    assert rate == 22_050 and np.abs(french).max() > 0.1
    assert not np.array_equal(french, english)  # the French voice, not the English one


@needs_espeak
def test_espeak_backend_speaks_each_language_with_its_voice() -> None:
    from handlers.tts.espeak_ng_tts import EspeakNGTTSHandler

    tts = new_stage(EspeakNGTTSHandler, config=TTSConfig(tts_voice="de=de-ch"), name="tts")
    tts.setup()
    said = {}
    for language in ("fr", "de", None):
        out = list(tts.process(TTSInput(tts.gate.new_turn_stamp(), "Un, deux, trois.", language)))
        assert {(a.engine, a.language, a.sample_rate) for a in out} == {("espeak-ng", language, 22_050)}
        said[language] = np.concatenate([a.samples for a in out])
    assert len({len(audio) for audio in said.values()}) == 3  # three voices, three renditions


# -- the realtime session's transcription language ---------------------------------------------------


def update(session: dict[str, Any]) -> Any:
    from openai.types.realtime import RealtimeSessionCreateRequest

    return RealtimeSessionCreateRequest.model_validate({"type": "realtime", **session})


def test_session_transcription_language() -> None:
    from speech_to_speech.realtime.config import SessionConfig, apply_update

    args = parse_args(["--language", "en"])
    config = SessionConfig.from_args(args)
    assert config.stt_language(args.language) == "en"
    pinned, problems = apply_update(config, update({"audio": {"input": {"transcription": {"language": "fr"}}}}), args)
    assert not problems and pinned.stt_language(args.language) == "fr"
    assert pinned.session_object("s", "m")["audio"]["input"]["transcription"]["language"] == "fr"
    listed, problems = apply_update(
        config, update({"audio": {"input": {"transcription": {"languages": ["fr", "de"]}}}}), args
    )
    assert not problems and listed.stt_language(args.language) == "fr,de"
    bad, problems = apply_update(pinned, update({"audio": {"input": {"transcription": {"language": "French"}}}}), args)
    assert [p.param for p in problems] == ["session.audio.input.transcription.language"]
    assert bad.stt_language(args.language) == "fr"  # unchanged


def test_stt_settings_reach_the_stt_through_the_vad() -> None:
    from speech_to_speech.realtime.controls import STTSettings

    stt = new_stage(fakes.FakeSTT, config=STTConfig(), name="stt")
    stt._control(STTSettings("de"))
    assert stt.config.language == "de"


def test_language_settings_are_parsed() -> None:
    from handlers.stt.faster_whisper_stt import parse_language

    assert parse_language("auto") == (None, frozenset())
    assert parse_language("") == (None, frozenset())
    assert parse_language("fr") == ("fr", frozenset())
    assert parse_language("en, fr,de") == (None, frozenset({"en", "fr", "de"}))


# -- real speech -------------------------------------------------------------------------------------


def as_the_vad_cuts(samples: np.ndarray) -> np.ndarray:
    """16 kHz ``samples`` with the VAD's speech pad (``VADConfig.speech_pad_ms`` of silence) before
    and after, as a segment reaches the STT."""
    from speech_to_speech.turns.vad import VADConfig

    pad = np.zeros(VADConfig().speech_pad_ms * 16_000 // 1000, np.float32)
    return np.concatenate([pad, samples, pad])


def speak(text: str, language: str) -> np.ndarray:
    """``text`` spoken by espeak-ng in ``language``, 16 kHz float32."""
    from handlers.tts.espeak_ng_tts import EspeakNG

    audio, rate = EspeakNG().synthesize(text, language)
    return soxr.resample(audio, rate, 16_000).astype(np.float32)


def test_another_language_with_the_english_only_default_switches_or_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    import handlers.stt.embedded_whisper as embedded

    assert embedded.model_for_language("", "en") == ""  # the default, in English
    assert embedded.model_for_language("large-v3", "fr") == "large-v3"  # a model the user named
    try:
        switched = embedded.model_for_language("", "auto")
    except FileNotFoundError:
        pytest.skip("the multilingual extra is not installed")
    assert switched == embedded.model_for_language("whisper-tiny.en", "en,fr") == "whisper-base"

    def missing(package: str, model: Any) -> Any:
        raise FileNotFoundError(package)

    monkeypatch.setattr(embedded, "_data_folder", missing)
    with pytest.raises(FileNotFoundError) as refused:
        embedded.model_for_language("", "fr")
    message = str(refused.value)
    assert "\n" not in message and "--language fr" in message and "speech-to-speech[multilingual]" in message


@pytest.mark.models
def test_the_command_line_with_another_language_hears_it(tmp_path: Any) -> None:
    """``--language es`` with no STT model named: Spanish is heard, by whisper-base, and said so."""
    from tests.helpers import run_pipeline

    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng (apt install espeak-ng)")
    wav = tmp_path / "es.wav"
    sf.write(str(wav), speak(QUESTIONS["es"], "es") * 0.8, 16_000)
    done = run_pipeline("--input_audio", str(wav), "--output_audio", str(tmp_path / "out.wav"), "--language", "es")
    if "pip install" in done.stderr:
        pytest.skip("the multilingual extra is not installed")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "using the embedded whisper-base" in done.stdout + done.stderr
    heard = next(line for line in done.stdout.splitlines() if line.startswith("[turn 1] user:"))
    assert word_error_rate(QUESTIONS["es"], heard.split(":", 1)[1]) <= 0.5, heard


@pytest.mark.models
@needs_espeak
def test_piper_speaks_other_languages_with_espeak() -> None:
    from handlers.tts.piper_tts import PiperTTSHandler

    tts = new_stage(PiperTTSHandler, config=TTSConfig(), name="tts")
    tts.setup()
    engines = {}
    for language, text in (("fr", "Bonjour."), ("en", "Hello."), (None, "Hello."), ("de-DE", "Hallo.")):
        out = [
            a for a in tts.process(TTSInput(tts.gate.new_turn_stamp(), text, language)) if isinstance(a, AudioOutput)
        ]
        assert out and sum(len(a.samples) for a in out) > 0.2 * out[0].sample_rate  # never silent
        engines[language] = {a.engine for a in out}
    assert engines == {"fr": {"espeak-ng"}, "en": {"piper"}, None: {"piper"}, "de-DE": {"espeak-ng"}}
    # a Piper voice given for German (here the embedded one, under de=) speaks German text
    from handlers.tts.piper_tts import embedded_voice

    tts = new_stage(PiperTTSHandler, config=TTSConfig(tts_voice=f"de={embedded_voice()[0]}"), name="tts")
    tts.setup()
    out = list(tts.process(TTSInput(tts.gate.new_turn_stamp(), "Hallo.", "de")))
    assert out and {a.engine for a in out} == {"piper"}


@pytest.mark.models
@needs_espeak
@pytest.mark.parametrize("setting", ["auto", CANDIDATES])
def test_multilingual_stt_hears_each_language(setting: str) -> None:
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler

    stt = new_stage(FasterWhisperSTTHandler, config=STTConfig(stt_model="whisper-base", language=setting), name="stt")
    try:
        stt.setup()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    for language, question in QUESTIONS.items():
        if setting == "auto" and language in ("fr", "de"):
            # espeak-ng's French and German: Whisper base names them only among candidates, in the
            # short context of a pass (docs/languages.md)
            continue
        # as the VAD cuts it, with its speech pad around: unpadded, Whisper base read espeak-ng's German
        # as "Guten Tag, Regate Siebenhoiter" on an AMD EPYC (the pipeline never sends such audio)
        text, heard = stt.transcribe(as_the_vad_cuts(speak(question, language)), 16_000)
        assert heard == language, (question, text, heard)
        assert word_error_rate(question, text) <= 0.5, (question, text)


class _Detections:
    """Stands in for CTranslate2's Whisper: ``detect_language`` returns the next scripted ranking."""

    def __init__(self, *rankings: dict[str, float]) -> None:
        self.rankings = list(rankings)
        self.model = self  # the handler reads ``model.model.detect_language``

    def detect_language(self, _encoded: Any) -> list[list[tuple[str, float]]]:
        ranking = self.rankings.pop(0)
        return [[(f"<|{code}|>", p) for code, p in sorted(ranking.items(), key=lambda kv: -kv[1])]]


def test_a_session_keeps_its_language_unless_the_evidence_to_switch_is_strong() -> None:
    from handlers.stt.faster_whisper_stt import LANGUAGE_SWITCH_RATIO, FasterWhisperSTTHandler

    stt = FasterWhisperSTTHandler.__new__(FasterWhisperSTTHandler)
    stt.candidates, stt.session_language = frozenset(), None
    stt.model = _Detections(
        {"fr": 0.99, "pt": 0.004},  # a clear French turn: the session is French
        {"he": 0.48, "fr": 0.045},  # a French turn Whisper base named Hebrew (measured): kept French
        {"de": 0.9, "fr": 0.9 / (LANGUAGE_SWITCH_RATIO + 1)},  # just clear enough: German now
        {"en": 0.7, "de": 0.1},  # "Yes." after German: too short to judge, and not kept as the session's
        {"en": 0.5, "de": 0.2},  # a partial: its own language, but the session's stays
        {"es": 0.6, "de": 0.3},
    )
    assert stt.detect_language(None, 2.0) == "fr" and stt.session_language == "fr"
    assert stt.detect_language(None, 2.0) == "fr"
    assert stt.detect_language(None, 2.0) == "de" and stt.session_language == "de"
    assert stt.detect_language(None, 0.6) == "de" and stt.session_language == "de"
    assert stt.detect_language(None, 2.0, final=False) == "de"
    assert stt.detect_language(None, 2.0) == "de"  # 2x is no evidence to switch
    stt.candidates = frozenset({"en", "fr"})  # among candidates: the first judged pass sets it
    stt.session_language = None
    stt.model = _Detections({"de": 0.8, "fr": 0.1, "en": 0.05})
    assert stt.detect_language(None, 2.0) == "fr" and stt.session_language == "fr"


@pytest.mark.models
@needs_espeak
def test_a_french_session_stays_french_where_whisper_names_another_language() -> None:
    """espeak-ng's French that Whisper base names Malay or Hebrew alone (docs/languages.md) is
    heard as French once the session is French; a clear English question still switches it."""
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler

    stt = new_stage(FasterWhisperSTTHandler, config=STTConfig(stt_model="whisper-base", language="auto"), name="stt")
    try:
        stt.setup()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    turns = [
        ("fr", "Quel est le plus grand océan du monde ?"),
        ("fr", "Bonjour ! Quelle est la capitale de l'Italie ?"),
        ("fr", "J'ai passé une longue journée au travail."),
        ("en", "What is the capital of France?"),
    ]
    heard = [stt.transcribe(speak(question, language), 16_000) for language, question in turns]
    assert [language for _, language in heard] == [language for language, _ in turns], heard
    assert word_error_rate(turns[1][1], heard[1][0]) < 1.0, heard[1]  # French words, not "Ufoo! Kele la kapita"


@pytest.mark.models
@needs_espeak
def test_an_improbable_pass_is_kept_not_redone_in_the_30_s_window() -> None:
    """espeak-ng's "Wie viele Tage hat eine Woche?" pinned to German: Whisper base's short-context
    reading is improbable (mean log-probability about -1.7, under LOG_PROB_MIN's -1.0) but not
    looping; the 30 s window reads it no better and cost 1.3-4 s, so the reading is kept."""
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler

    stt = new_stage(FasterWhisperSTTHandler, config=STTConfig(stt_model="whisper-base", language="de"), name="stt")
    try:
        stt.setup()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    text, language = stt.transcribe(speak("Wie viele Tage hat eine Woche?", "de"), 16_000)
    assert text and language == "de"
    assert stt.full_window_passes == 0, text


@pytest.fixture(scope="module")
def four_languages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One spoken conversation, French, German, Spanish, then English, through the whole pipeline
    (file mode, real time): its events, the reply audio of each turn and the question offsets."""
    from speech_to_speech.core.events import Event

    tmp = tmp_path_factory.mktemp("languages")
    rate, gap_s = 16_000, 9.0  # each reply is spoken before the next question
    parts, starts, at = [], [], 0
    for language, question in QUESTIONS.items():
        audio = speak(question, language) * 0.8
        parts += [np.zeros(rate // 2, np.float32), audio, np.zeros(int(gap_s * rate), np.float32)]
        starts.append(at + rate // 2)
        at += rate // 2 + len(audio) + int(gap_s * rate)
    sf.write(str(tmp / "in.wav"), np.concatenate(parts), rate)
    flags = ["--input_audio", str(tmp / "in.wav"), "--output_audio", str(tmp / "out.wav")]
    args = parse_args([*flags, "--stt_model", "whisper-base", "--language", CANDIDATES])
    bus = EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    MetricsCollector(bus)  # per-turn metrics, with the voice that spoke, as the console gets them
    run_local(args, bus)
    out, out_rate = sf.read(str(tmp / "out.wav"), dtype="float32")
    assert out_rate == rate
    bounds = [*starts, len(out)]
    replies = [out[bounds[i] : bounds[i + 1]] for i in range(len(starts))]
    return {"events": events, "replies": replies}


@pytest.mark.models
@needs_espeak
def test_each_turn_is_heard_answered_and_spoken_in_its_language(
    four_languages: dict[str, Any],
) -> None:
    from speech_to_speech.core.events import AssistantText, UserTranscript

    events = four_languages["events"]
    heard = [e.language for e in events if isinstance(e, UserTranscript) and e.stt_ms is not None]
    assert heard == list(QUESTIONS), heard
    assert len([e for e in events if isinstance(e, AssistantText)]) == len(QUESTIONS)
    voices = [e.voice for e in events if isinstance(e, TurnMetrics)]
    assert voices == ["espeak-ng fr", "espeak-ng de", "espeak-ng es", "piper en"]  # English switches back
    texts = [e.text for e in events if isinstance(e, AssistantText)]
    for language, reply, text in zip(QUESTIONS, four_languages["replies"], texts, strict=True):
        assert np.abs(reply).max() > 0.05, f"no reply audio in the {language} turn"
        # the reply is written in the question's language: its own short words, not English ones
        # (Whisper's detection on the reply's audio is no judge: an answer-first reply such as
        # "Berlin. Die Hauptstadt ..." reads as English to it)
        words = set(re.findall(r"\w+", text.lower()))
        # a name alone ("Océan Pacifique.", answer-first) has none of the language's short words
        assert words & COMMON_WORDS[language] or len(words) <= 3, (language, text)
        if language != "en":
            assert not words & COMMON_WORDS["en"], (language, text)


@pytest.mark.models
@needs_espeak
def test_session_update_sets_the_language_the_server_hears(realtime_servers: Any) -> None:
    """A server pinned to English hears German once a client lists the languages to detect among."""
    import asyncio

    from speech_to_speech.core.audio import float_to_int16
    from speech_to_speech.testing.realtime import WIRE_RATE, RawClient, append_event, blocks, silence

    try:
        from handlers.stt.embedded_whisper import resolve_stt_model

        resolve_stt_model("whisper-base")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from speech_to_speech.turns.stt import BaseSTTHandler

    server = realtime_servers("--stt_model", "whisper-base", "--language", "en")
    question = "Wie spät ist es jetzt?"
    audio = float_to_int16(soxr.resample(speak(question, "de"), 16_000, WIRE_RATE) * 0.8)
    stt_languages: list[str] = []

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        client = await RawClient.open(server.ws_url)
        log = client.log
        try:
            created = await log.wait_for("session.created", 300)
            stt = server.session(created["session"]["id"]).pipeline.stage("stt", BaseSTTHandler)
            stt_languages.append(stt.config.language)
            transcription = {"languages": CANDIDATES.split(",")}
            audio_in = {"transcription": transcription, "turn_detection": {"type": "server_vad"}}
            await client.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio_in}}})
            updated = await log.wait_for("session.updated", 300)
            for payload in blocks(np.concatenate([audio, silence(1.5)])):
                await client.send(append_event(payload))
            heard = await log.wait_for("conversation.item.input_audio_transcription.completed", 300)
            stt_languages.append(stt.config.language)
            await log.wait_for("response.done", 300)
            return updated, heard
        finally:
            await client.close()

    updated, heard = asyncio.run(asyncio.wait_for(scenario(), 600))
    assert updated["session"]["audio"]["input"]["transcription"]["languages"] == CANDIDATES.split(",")
    assert stt_languages == ["en", CANDIDATES]  # the server's --language, then the session's
    assert heard["languages"] == [{"code": "de"}], heard
    assert heard["transcript"].strip()
