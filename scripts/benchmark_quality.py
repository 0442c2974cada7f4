"""Conversation benchmark on spoken input: multi-turn dialogues through the realtime server.

The dialogues (``scripts/data/quality_dialogues.json``, loaded and scored by
:mod:`speech_to_speech.testing.scoring`) cover facts, statements and small talk that need a reaction (never a
repeat), memory of earlier turns, follow-ups ("and in Fahrenheit?"), spoken instructions
("shorter please", "say that again"), numbers and, in dialogues that offer the sample tools of
``speech_to_speech/client/talk/sample_tools.py`` (``get_time``, ``add``), tool calls. ``--list`` prints them.

**Speech.** A turn is synthesised in its dialogue's voice, the embedded Piper voice (joe,
22,050 Hz, the one the product speaks with) or espeak-ng (``en-us+f3``, a different, robotic
voice), cached under ``$S2S_CACHE_DIR`` or the user cache dir (``speech-to-speech/
benchmark_quality_audio``, ``--audio_cache``), or is a LibriVox clip of the Debian package
``pocketsphinx-testdata`` whose reference transcript is what the user said (a clip that is not
installed is replaced by its transcript, kept in the dialogue, synthesised in the dialogue's voice).

**Run.** For each ``--model`` the server is started as a subprocess on a free port::

    python s2s_pipeline.py --mode server --host 127.0.0.1 --port PORT [--llm_model MODEL] [FLAGS AFTER --]

and, after an unscored warm-up turn (one more with the tools offered when a dialogue offers them),
each dialogue is one WebSocket session
(:mod:`speech_to_speech.client.realtime`): ``session.update`` (server VAD, audio out, the sample
tools when the dialogue offers them), then per turn its audio resampled to 24 kHz and sent like a
microphone, in 40 ms ``input_audio_buffer.append`` blocks on a real-time schedule, followed by
``--tail_s`` of silence. The next turn starts once the turn has settled: the server has ended
the user's speech (as many ``speech_stopped`` as ``speech_started``), and every response created
since has sent ``response.done``, the last after the last ``speech_stopped``. A response that
calls tools gets the outputs of ``sample_tools.execute_tool`` (``function_call_output``, every
call) and a follow-up ``response.create`` (at most :data:`MAX_TOOL_ROUNDS` per turn).

Recorded per turn: what the server heard (``conversation.item.input_audio_transcription.completed``),
the reply (the transcripts of the messages in each ``response.done`` since the turn began; cancelled
responses only when nothing else was said), the tool calls, and the **first-audio latency**: the
block carrying clip time ``t`` leaves at ``t0 + t`` (``t0``: the schedule's start, ``time.monotonic()``),
so the user stops speaking at ``t0 + speech_end``, where ``speech_end`` is the end of the clip's last
20 ms frame of speech (``speech_to_speech.testing.bench.speech_end_s``: RMS above ``max(peak - 30 dB, 2.5 x noise
floor)``); latency = receipt of the first ``response.output_audio.delta`` after that moment minus
it. It holds the VAD's endpointing silence (``--min_silence_ms``), STT, the LLM's first sentence,
its TTS and the local network hop, like the voice-to-voice of ``benchmark_latency.py``.

**Score** (:func:`speech_to_speech.testing.scoring.score_turn`): facts, echo, instructions and tool calls as that
module says. Per model the table gives the share of turns right, the statements and small-talk
turns that echoed the user (echo score > 0.5 with two content words shared or none added), mean
and max words per reply, first-audio latency p50/p90 (linear interpolation), the word error rate of what
the server heard against what was said, then a row per category and the failing turns
(heard / reply)::

    python scripts/benchmark_quality.py                                  # the default model
    python scripts/benchmark_quality.py --dialogues 2 --verbose          # a quick run
    python scripts/benchmark_quality.py --only tools                     # the dialogues that offer tools
    python scripts/benchmark_quality.py --languages                      # fr, de, es, en: one table per language
    python scripts/benchmark_quality.py --json run.json; python scripts/benchmark_quality.py --rescore run.json
    python scripts/benchmark_quality.py --model default --model other.gguf -- --temperature 0

``--languages`` runs the dialogues of ``scripts/data/language_dialogues.json`` instead: five fact
questions in each of French, German, Spanish and English (the control), said by espeak-ng's voice of
the language, against a server with the embedded multilingual Whisper detecting the language
(:data:`LANGUAGE_FLAGS`), and adds a table per language: the language the server named, facts right,
word error rate, the STT pass and voice-to-voice, and its difference from English. With
``--pin_language`` each session names its language (``transcription.language``), as a client that
knows its user's language does: what is heard and answered when detection is not in the way.

Exit status: 0 when every server started and every turn got a reply, 1 otherwise, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speech_to_speech.testing.bench import (
    REPO_ROOT,
    Child,
    cell,
    find_clips,
    free_port,
    percentile,
    print_table,
    read_transcripts,
    split_extra,
)
from speech_to_speech.testing.results import load_average
from speech_to_speech.testing.scoring import (
    CATEGORIES,
    LANGUAGE_DIALOGUES_FILE,
    REACTION_KINDS,
    Dialogue,
    Turn,
    Verdict,
    load_dialogues,
    score_turn,
)

PROG = "benchmark_quality.py"
MAIN = str(REPO_ROOT / "s2s_pipeline.py")
#: the espeak-ng voice (US English, a female variant) and its speed, words per minute; a dialogue in
#: another language is said by espeak-ng's voice of that language (``-v fr``), at the same speed
ESPEAK_VOICE, ESPEAK_WPM = "en-us+f3", 165
#: the server flags ``--languages`` adds unless the flags after ``--`` set them: the embedded
#: multilingual Whisper, detecting the language (a session keeps the one it detected)
LANGUAGE_FLAGS = {"--stt_model": "whisper-base", "--language": "auto"}
#: silence between the sentences of a Piper synthesis, s
PIPER_PAUSE_S = 0.25
#: the unscored first turn of every server
WARM_UP_TEXT = "Hello, can you hear me?"
#: follow-up responses after tool calls, at most, per turn
MAX_TOOL_ROUNDS = 3
#: a turn has settled when nothing happened for this long and no response is in flight, s
QUIET_S = 8.0
#: a turn whose speech the server has not detected this long after it was sent fails, s
NO_SPEECH_S = 10.0
#: seconds to wait for the server to listen
LOAD_TIMEOUT_S = 600.0


# -- speech ---------------------------------------------------------------------------------------


def audio_cache_dir() -> Path:
    """``$S2S_CACHE_DIR`` or the user cache dir of speech-to-speech, ``/benchmark_quality_audio``."""
    import platformdirs

    root = os.environ.get("S2S_CACHE_DIR") or platformdirs.user_cache_dir("speech-to-speech")
    return Path(root) / "benchmark_quality_audio"


class Synthesiser:
    """Writes the user's turns as WAV files, once: ``CACHE/VOICE-HASH.wav`` (the hash of voice and text)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self._piper: Any = None

    def path(self, voice: str, text: str, language: str = "en") -> Path:
        """The cached file of ``text`` said by ``voice`` in ``language`` (made when missing)."""
        import hashlib

        if language != "en":
            voice = f"{voice}-{language}"
        digest = hashlib.sha1(f"{voice}|{ESPEAK_VOICE}|{ESPEAK_WPM}|{text}".encode()).hexdigest()[:16]
        path = self.cache / f"{voice}-{digest}.wav"
        if not path.is_file():
            self.cache.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".part.wav")
            if voice == "piper":
                self._piper_to(partial, text)
            else:
                self._espeak_to(partial, text, ESPEAK_VOICE if language == "en" else language)
            partial.replace(path)
        return path

    def _piper_to(self, path: Path, text: str) -> None:
        import numpy as np
        import soundfile as sf

        from handlers.tts.piper_tts import embedded_voice, load_voice

        if self._piper is None:
            self._piper = load_voice(*embedded_voice())
        rate = int(self._piper.config.sample_rate)
        pause = np.zeros(round(PIPER_PAUSE_S * rate), dtype=np.float32)
        parts = [p for chunk in self._piper.synthesize(text) for p in (chunk.audio_float_array, pause)]
        sf.write(str(path), np.concatenate(parts[:-1]), rate)

    @staticmethod
    def _espeak_to(path: Path, text: str, espeak_voice: str) -> None:
        command = ["espeak-ng", "-v", espeak_voice, "-s", str(ESPEAK_WPM), "-w", str(path), text]
        subprocess.run(command, check=True, capture_output=True, timeout=60)


@dataclass
class Speech:
    """One turn's audio: int16 at the wire rate, where its speech ends, and the words said."""

    samples: Any
    speech_end_s: float
    said: str
    source: str


def prepare_speech(dialogues: list[Dialogue], cache: Path, notes: list[str]) -> list[list[Speech]]:
    """Every turn's :class:`Speech` (synthesised or a LibriVox clip), dialogue by dialogue.

    Raises:
        FileNotFoundError: espeak-ng is missing and a dialogue needs it.
    """
    from speech_to_speech.client.realtime import WIRE_RATE, load_wire_audio
    from speech_to_speech.core.audio import int16_to_float
    from speech_to_speech.testing.bench import speech_end_s

    clips = {clip.stem: clip for clip in find_clips()}
    transcripts = read_transcripts(list(clips.values()))
    synth = Synthesiser(cache)

    def one(turn: Turn, voice: str, language: str) -> Speech:
        if turn.clip and turn.clip in clips and turn.clip in transcripts:
            path, said, source = clips[turn.clip], transcripts[turn.clip], "librivox"
        else:
            said = turn.say
            if turn.clip:
                notes.append(f"LibriVox clip {turn.clip} not found: its transcript is synthesised ({voice})")
            path, source = synth.path(voice, said, language), voice
        samples = load_wire_audio(path)
        end = speech_end_s(int16_to_float(samples), WIRE_RATE) or len(samples) / WIRE_RATE
        return Speech(samples, end, said, source)

    return [[one(turn, d.voice, d.language) for turn in d.turns] for d in dialogues]


# -- one dialogue, one session -----------------------------------------------------------------------


@dataclass
class TurnRecord:
    """What happened in one turn, and its score."""

    dialogue: str
    number: int
    kind: str
    source: str
    said: str
    heard: str = ""
    reply: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    language: str = ""  # the language the server heard (the transcription's "languages")
    stt_ms: float | None = None  # the server's STT pass (response.done's metadata, s2s_stt_ms)
    latency_ms: float | None = None
    speech_turns: int = 0
    wer: float | None = None
    error: str | None = None
    verdict: Verdict | None = None


async def _settle(client: Any, since: int, timeout_s: float, tools: Any) -> str | None:
    """Wait until the turn begun at event ``since`` has settled (see the module docstring), answering
    tool calls with ``tools`` (a tool module, or None) on the way; returns an error, or None."""
    from speech_to_speech.client.realtime import event_type

    log = client.log
    handled: set[str] = set()
    create_sent_at: int | None = None
    rounds = 0
    began = time.monotonic()
    deadline = began + timeout_s
    while True:
        events = log.events[since:]
        kinds = [event_type(e) for e in events]
        created = {e["response"]["id"] for e, k in zip(events, kinds, strict=True) if k == "response.created"}
        dones = [e["response"] for e, k in zip(events, kinds, strict=True) if k == "response.done"]
        in_flight = created - {r["id"] for r in dones}
        for response in dones:
            calls = [o for o in response.get("output", []) if o.get("type") == "function_call"]
            if response["id"] in handled or not calls or response.get("status") == "cancelled":
                continue
            handled.add(response["id"])
            if tools is None:
                continue
            for call in calls:  # every call gets its output, so the history stays whole
                try:
                    result = await tools.execute_tool(call["name"], json.loads(call.get("arguments") or "{}"))
                except Exception as exc:  # a bad call: the model sees the error
                    result = {"error": str(exc)}
                output = {"type": "function_call_output", "call_id": call["call_id"], "output": json.dumps(result)}
                await client.send({"type": "conversation.item.create", "item": output})
            if rounds < MAX_TOOL_ROUNDS:
                create_sent_at = len(log.events)
                rounds += 1
                await client.send({"type": "response.create"})
        starts = kinds.count("input_audio_buffer.speech_started")
        stops = kinds.count("input_audio_buffer.speech_stopped")
        last_stop = max((i for i, k in enumerate(kinds) if k == "input_audio_buffer.speech_stopped"), default=None)
        last_done = max((i for i, k in enumerate(kinds) if k == "response.done"), default=None)
        waiting_create = create_sent_at is not None and "response.created" not in map(
            event_type, log.events[create_sent_at:]
        )
        quiet = bool(log.times) and time.monotonic() - log.times[-1] > QUIET_S
        answered = last_done is not None and ((last_stop is not None and last_done > last_stop) or quiet)
        if stops and starts == stops and not in_flight and not waiting_create and answered:
            return None
        if not starts and time.monotonic() > began + NO_SPEECH_S:
            return "no speech detected"
        if log.closed is not None:
            return f"connection closed: {log.closed!r}"
        if time.monotonic() > deadline:
            return f"no settled reply in {timeout_s:g} s"
        count = len(log.events)
        await log.until(lambda count=count: len(log.events) > count, 0.5)


def _read_turn(record: TurnRecord, events: list[dict[str, Any]], times: list[float], speech_end: float) -> None:
    """Fill in heard, reply, calls, statuses and latency from the turn's events."""
    heard, replies, spoken = [], [], []
    for event, at in zip(events, times, strict=True):
        kind = event.get("type")
        if kind == "conversation.item.input_audio_transcription.completed":
            heard.append(str(event.get("transcript") or "").strip())
            record.language = next((str(x.get("code")) for x in event.get("languages") or []), record.language)
        elif kind == "input_audio_buffer.speech_started":
            record.speech_turns += 1
        elif kind == "response.output_audio.delta" and record.latency_ms is None and at >= speech_end:
            record.latency_ms = (at - speech_end) * 1000
        elif kind == "response.done":
            response = event["response"]
            record.statuses.append(str(response.get("status")))
            stt = (response.get("metadata") or {}).get("s2s_stt_ms")
            if stt is not None and record.stt_ms is None:
                record.stt_ms = float(stt)
            texts = []
            for item in response.get("output", []):
                if item.get("type") == "function_call":
                    try:
                        arguments = json.loads(item.get("arguments") or "{}")
                    except json.JSONDecodeError:
                        arguments = {"<not JSON>": item.get("arguments")}
                    record.calls.append((str(item.get("name")), arguments))
                for part in item.get("content") or []:
                    texts.append(str(part.get("transcript") or part.get("text") or "").strip())
            text = " ".join(t for t in texts if t)
            spoken.append(text)
            if response.get("status") != "cancelled":
                replies.append(text)
    record.heard = " ".join(h for h in heard if h)
    record.reply = " ".join(r for r in (replies or spoken) if r)


def score_record(record: TurnRecord, turn: Turn, previous: str, tools: bool) -> None:
    """Score ``record`` (:func:`speech_to_speech.testing.scoring.score_turn`); a turn whose every
    response failed is wrong."""
    failed = bool(record.statuses) and "completed" not in record.statuses
    record.verdict = score_turn(turn, record.heard, record.reply, previous, record.calls, tools, failed=failed)


async def run_dialogue(
    url: str,
    dialogue: Dialogue,
    speech: list[Speech],
    tail_s: float,
    timeout_s: float,
    verbose: bool,
    pin_language: bool = False,
) -> list[TurnRecord]:
    """One session: every turn of ``dialogue`` spoken in turn, each waited for and scored; with
    ``pin_language`` the session pins the dialogue's language (``transcription.language``)."""
    import numpy as np

    from speech_to_speech.client.realtime import PacedSender, RealtimeClient, session_update, silence
    from speech_to_speech.client.talk import sample_tools
    from speech_to_speech.testing.speech_data import word_error_rate

    records = [
        TurnRecord(dialogue.name, n, turn.kind, s.source, s.said)
        for n, (turn, s) in enumerate(zip(dialogue.turns, speech, strict=True), 1)
    ]
    client = await RealtimeClient.connect(url, open_timeout_s=60)
    log = client.start_log()
    mic = PacedSender(client)
    try:
        await log.wait_for("session.created", 60)
        vad = {"type": "server_vad", "interrupt_response": True, "create_response": True}
        update = session_update(vad, tools=sample_tools.TOOLS if dialogue.tools else None)
        if pin_language:
            update["session"]["audio"]["input"]["transcription"] = {"language": dialogue.language}
        await client.send(update)
        await log.wait_for("session.updated", 60)
        previous = ""
        for record, turn, s in zip(records, dialogue.turns, speech, strict=True):
            since, t0 = len(log.events), time.monotonic()
            mic.say(np.concatenate([s.samples, silence(tail_s)]), start=t0)
            await mic.drained()
            record.error = await _settle(client, since, timeout_s, sample_tools if dialogue.tools else None)
            _read_turn(record, log.events[since:], log.times[since:], t0 + s.speech_end_s)
            record.wer = word_error_rate(record.said, record.heard)
            score_record(record, turn, previous, dialogue.tools)
            previous = record.reply
            if verbose:
                mark = "ok  " if record.verdict.right else "MISS"
                print(
                    f"  {mark} [{dialogue.name} #{record.number} {record.kind}] heard {record.heard!r} -> "
                    f"{record.reply!r} ({cell(record.latency_ms)} ms{'; ' + record.error if record.error else ''})",
                    file=sys.stderr,
                    flush=True,
                )
            if record.error and log.closed is not None:
                break
    finally:
        await mic.stop()
        await client.close()
    return records


# -- one model, one server ------------------------------------------------------------------------


@dataclass
class ModelResult:
    """One model's (or configuration's) run."""

    model: str
    load_s: float | None = None
    error: str | None = None
    records: list[TurnRecord] = field(default_factory=list)


def run_model(
    model: str, extra: list[str], dialogues: list[Dialogue], speech: list[list[Speech]], args: argparse.Namespace
) -> ModelResult:
    """Start the server with ``model``, warm it up, run every dialogue, stop it."""
    result = ModelResult(model)
    port = free_port()
    flags = [] if model == "default" else ["--llm_model", model]
    command = [sys.executable, MAIN, "--mode", "server", "--host", "127.0.0.1", "--port", str(port), *flags, *extra]
    started = time.monotonic()
    child = Child(command, ready=r"^realtime server listening on ")
    try:
        while child.running() and not child.ready.wait(1.0) and time.monotonic() - started < LOAD_TIMEOUT_S:
            pass
        if not child.ready.is_set():
            result.error = f"the server did not start: {child.failure()}"
            return result
        result.load_s = (child.ready_at or time.monotonic()) - started
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        print(f"{Path(model).name}: server ready in {result.load_s:.1f} s", file=sys.stderr, flush=True)
        for tools in sorted({d.tools for d in dialogues}):  # without tools, then with them if any dialogue offers them
            warm = Dialogue("warm-up", "piper", (Turn("smalltalk", WARM_UP_TEXT),), tools)
            warm_speech = prepare_speech([warm], args.audio_cache, [])[0]
            try:
                asyncio.run(run_dialogue(url, warm, warm_speech, args.tail_s, args.turn_timeout_s, False))
            except Exception as exc:  # reported by the dialogues that follow, if it lasts
                print(f"warm-up failed: {exc!r}", file=sys.stderr, flush=True)
        for number, (dialogue, turns) in enumerate(zip(dialogues, speech, strict=True), 1):
            print(f"[{number}/{len(dialogues)}] {dialogue.name} ...", file=sys.stderr, flush=True)
            try:
                records = asyncio.run(
                    run_dialogue(
                        url, dialogue, turns, args.tail_s, args.turn_timeout_s, args.verbose, args.pin_language
                    )
                )
            except Exception as exc:
                records = [TurnRecord(dialogue.name, 1, dialogue.turns[0].kind, "", "", error=repr(exc)[:200])]
            result.records.extend(records)
            if not child.running():
                result.error = f"the server exited: {child.failure()}"
                break
    finally:
        child.signal(signal.SIGINT)
        child.finish(30)
        if args.server_log:
            with open(args.server_log, "a", encoding="utf-8") as log:
                log.write(f"== {' '.join(command)}\n" + "".join(f"{line}\n" for line in child.stdout + child.stderr))
    return result


def rescore(path: Path, dialogues: list[Dialogue]) -> list[ModelResult]:
    """The results ``--json`` saved in ``path``, scored again against ``dialogues`` (turns of others are left out)."""
    by_name = {d.name: d for d in dialogues}
    results = []
    for saved in json.loads(path.read_text(encoding="utf-8")):
        records = [
            TurnRecord(**{**r, "calls": [tuple(c) for c in r["calls"]], "verdict": None}) for r in saved["records"]
        ]
        previous: dict[str, str] = {}
        for r in records:
            if (d := by_name.get(r.dialogue)) is not None and r.number <= len(d.turns):
                score_record(r, d.turns[r.number - 1], previous.get(r.dialogue, ""), d.tools)
            previous[r.dialogue] = r.reply
        results.append(ModelResult(saved["model"], saved["load_s"], saved["error"], [r for r in records if r.verdict]))
    return results


# -- report -----------------------------------------------------------------------------------------


def _pct(records: list[TurnRecord]) -> str:
    right = sum(bool(r.verdict and r.verdict.right) for r in records)
    return f"{right}/{len(records)} {100 * right / len(records):.0f}%" if records else "-"


def quality_figures(res: ModelResult) -> dict[str, Any]:
    """The figures of one model's run for docs/results.json: right turns in all and per category,
    echoed statements, first audio p50/p90 (ms)."""

    def right(kinds: tuple[str, ...]) -> tuple[int, int]:
        of = [r for r in res.records if r.kind in kinds]
        return sum(bool(r.verdict and r.verdict.right) for r in of), len(of)

    reactions = [r for r in res.records if r.kind in REACTION_KINDS]
    latency = [r.latency_ms for r in res.records if r.latency_ms is not None]
    total, facts, statements, tools = (
        right(tuple(CATEGORIES)),
        right(("fact",)),
        right(REACTION_KINDS),
        right(("tool",)),
    )
    return {
        "right": total[0],
        "turns": total[1],
        "facts_right": facts[0],
        "facts": facts[1],
        "statements_right": statements[0],
        "statements": statements[1],
        "tools_right": tools[0],
        "tools": tools[1],
        "echoed": sum(bool(r.verdict and r.verdict.echoed) for r in reactions),
        "first_audio_p50_ms": percentile(latency, 50),
        "first_audio_p90_ms": percentile(latency, 90),
    }


def report(results: list[ModelResult], dialogues: list[Dialogue], extra: list[str]) -> None:
    """The summary table, the per-category table and the failing turns of each model."""
    headers = ["model", "turns", "right", "echoed stmts", "words mean", "words max", "1st audio p50", "p90"]
    headers += ["STT WER", "failed resp"]
    rows = []
    for res in results:
        recs = res.records
        words = [r.verdict.words for r in recs if r.verdict]
        latency = [r.latency_ms for r in recs if r.latency_ms is not None]
        reactions = [r for r in recs if r.kind in REACTION_KINDS]
        echoed = sum(bool(r.verdict and r.verdict.echoed) for r in reactions)
        wers = [r.wer for r in recs if r.wer is not None]
        rows.append(
            [
                Path(res.model).name,
                str(len(recs)),
                _pct(recs),
                f"{echoed}/{len(reactions)}",
                cell(sum(words) / len(words) if words else None, 1),
                str(max(words)) if words else "-",
                cell(percentile(latency, 50)),
                cell(percentile(latency, 90)),
                cell(sum(wers) / len(wers) if wers else None, 2),
                str(sum("failed" in r.statuses for r in recs)),
            ]
        )
    print_table(headers, rows)
    print(
        f"\n{len(dialogues)} dialogues; server flags: {' '.join(extra) or '(defaults)'}. echoed stmts: statement and "
        "small-talk turns whose reply repeats > 50% of the user's content words (two or more, or adds none). 1st "
        "audio: ms from the end of the user's speech (read from the clip, on the send schedule) to the first "
        "response.output_audio.delta. "
        "STT WER: what the server heard against what was said, mean per turn. failed resp: turns with a response "
        "that ended 'failed' (e.g. the LLM's first-token timeout, --first_token_timeout_s: the server then says a "
        "fallback line); a turn whose every response failed is wrong."
    )
    categories = list(dict.fromkeys(CATEGORIES.values()))
    print()
    rows = []
    for category in categories:
        of = [[r for r in res.records if CATEGORIES.get(r.kind) == category] for res in results]
        if any(of):
            rows.append([category, *(_pct(recs) for recs in of)])
    print_table(["category", *(Path(res.model).name for res in results)], rows)
    for res in results:
        if res.error:
            print(f"\nFAILED {res.model}: {res.error}")
        missed = [r for r in res.records if not (r.verdict and r.verdict.right)]
        print(f"\n{Path(res.model).name}: {len(missed)} failing turn(s)")
        for r in missed:
            why = r.error or (r.verdict.why if r.verdict else "not scored")
            extra_flags = [f for f in (r.verdict.flags if r.verdict else []) if not why.startswith("echo")]
            status = ",".join(s for s in r.statuses if s != "completed")
            notes = "; ".join([*extra_flags, *([f"response {status}"] if status else [])])
            print(f"  [{r.dialogue} #{r.number} {r.kind}, {r.source}] {why}" + (f" ({notes})" if notes else ""))
            print(f"      heard: {r.heard!r}")
            print(f"      reply: {r.reply[:240]!r}")


def language_report(results: list[ModelResult], dialogues: list[Dialogue]) -> None:
    """Per model and spoken language: the language the server named, facts right, what it heard and
    how fast (``--languages``; issue 30 item 3)."""
    spoken = {d.name: d.language for d in dialogues}
    headers = ["model", "language", "turns", "named right", "facts right", "STT WER", "STT p50", "STT max"]
    headers += ["1st audio p50", "p90", "p50 - en"]
    rows = []
    for res in results:
        by_language: dict[str, list[TurnRecord]] = {}
        for r in res.records:
            by_language.setdefault(spoken.get(r.dialogue, "?"), []).append(r)
        english = percentile([r.latency_ms for r in by_language.get("en", []) if r.latency_ms is not None], 50)
        for language, recs in by_language.items():
            named = sum(r.language == language for r in recs)
            stt = [r.stt_ms for r in recs if r.stt_ms is not None]
            wers = [r.wer for r in recs if r.wer is not None]
            latency = [r.latency_ms for r in recs if r.latency_ms is not None]
            p50 = percentile(latency, 50)
            rows.append(
                [
                    Path(res.model).name,
                    language,
                    str(len(recs)),
                    f"{named}/{len(recs)}",
                    _pct(recs),
                    cell(sum(wers) / len(wers) if wers else None, 2),
                    cell(percentile(stt, 50)),
                    cell(max(stt) if stt else None),
                    cell(p50),
                    cell(percentile(latency, 90)),
                    cell(p50 - english if p50 is not None and english is not None else None),
                ]
            )
    print_table(headers, rows)
    print(
        "\nnamed right: turns whose transcription named the language spoken (the event's 'languages'); STT: the "
        "server's pass (response.done metadata s2s_stt_ms); 1st audio: voice-to-voice, as in the table above; "
        "p50 - en: against the English control dialogue."
    )


def summary(dialogues: list[Dialogue]) -> None:
    """Print the dialogues and the count of turns per kind and per category."""
    kinds: dict[str, int] = {}
    sources: dict[str, int] = {}
    for d in dialogues:
        counts: dict[str, int] = {}
        for t in d.turns:
            counts[t.kind] = counts.get(t.kind, 0) + 1
            kinds[t.kind] = kinds.get(t.kind, 0) + 1
            source = "librivox" if t.clip else d.voice
            sources[source] = sources.get(source, 0) + 1
        tools = ", tools offered" if d.tools else ""
        print(f"  {d.name} ({d.voice}{tools}): " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    by_category: dict[str, int] = {}
    for kind, count in kinds.items():
        by_category[CATEGORIES[kind]] = by_category.get(CATEGORIES[kind], 0) + count
    print(f"{sum(kinds.values())} turns in {len(dialogues)} dialogues")
    print("  by category: " + ", ".join(f"{c} {n}" for c, n in by_category.items()))
    print("  by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.items()))
    print("  by speech: " + ", ".join(f"{s} {n}" for s, n in sources.items()))


# -- main ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's own flags (the server's come after ``--``)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Spoken multi-turn dialogues through the realtime server, scored (see the docstring)."
    )
    parser.add_argument(
        "--model", action="append", metavar="GGUF", help="a server --llm_model to run (repeat); 'default': none given"
    )
    parser.add_argument("--dialogues", type=int, metavar="N", help="only the first N dialogues")
    parser.add_argument("--only", action="append", metavar="TEXT", help="only dialogues whose name has TEXT (repeat)")
    parser.add_argument("--verbose", action="store_true", help="print every turn as it is scored (on stderr)")
    parser.add_argument("--list", action="store_true", help="print the dialogues and exit")
    parser.add_argument("--tail_s", type=float, default=1.5, help="silence sent after each turn's speech, s")
    parser.add_argument("--turn_timeout_s", type=float, default=120.0, help="longest wait for a turn to settle, s")
    parser.add_argument("--audio_cache", type=Path, default=None, help="folder of the synthesised turns")
    parser.add_argument("--json", metavar="PATH", help="also write every turn here")
    parser.add_argument(
        "--record", action="store_true", help="append the default model's figures to docs/results.json (key quality)"
    )
    parser.add_argument("--server_log", metavar="PATH", help="append the server's output (stdout, then stderr) here")
    parser.add_argument("--rescore", type=Path, metavar="PATH", help="score the turns a --json run saved; no server")
    parser.add_argument(
        "--languages",
        action="store_true",
        help="the per-language dialogues (fact questions in fr, de, es and en, said by espeak-ng), with the server "
        "flags " + " ".join(f"{k} {v}" for k, v in LANGUAGE_FLAGS.items()) + " unless given after --",
    )
    parser.add_argument(
        "--pin_language",
        action="store_true",
        help="each session pins its dialogue's language (session.update transcription.language) instead of the "
        "server's --language",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring for the exit status."""
    own, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.dialogues is not None and args.dialogues < 1:
        parser.error("--dialogues must be at least 1")
    if args.tail_s < 0.6 or args.turn_timeout_s <= 0:
        parser.error("--tail_s must be at least 0.6 (the VAD must see the end) and --turn_timeout_s positive")
    every = load_dialogues(LANGUAGE_DIALOGUES_FILE) if args.languages else load_dialogues()
    dialogues = [d for d in every if not args.only or any(t in d.name for t in args.only)]
    dialogues = dialogues[: args.dialogues]
    if not dialogues:
        parser.error(f"no dialogue's name contains {' or '.join(map(repr, args.only))}")
    if args.list or args.rescore:
        summary(dialogues)
        if args.rescore:
            print()
            rescored = rescore(args.rescore, dialogues)
            report(rescored, dialogues, extra)
            if args.languages:
                print()
                language_report(rescored, dialogues)
        return 0
    if args.languages:
        extra = [*(a for k, v in LANGUAGE_FLAGS.items() if k not in extra for a in (k, v)), *extra]
    from speech_to_speech.pipeline.cli import parse_args

    parse_args(["--mode", "server", *extra])  # bad server flags fail here, once
    args.audio_cache = args.audio_cache or audio_cache_dir()
    notes: list[str] = []
    print(f"preparing speech in {args.audio_cache} ...", file=sys.stderr, flush=True)
    try:
        speech = prepare_speech(dialogues, args.audio_cache, notes)
    except FileNotFoundError as exc:
        print(f"{PROG}: error: {exc} (espeak-ng: apt-get install espeak-ng)", file=sys.stderr)
        return 1
    load = load_average()
    results = [run_model(model, extra, dialogues, speech, args) for model in args.model or ["default"]]
    if args.record and not args.languages and not args.only and args.dialogues is None:
        from speech_to_speech.testing.results import command_line, record

        command = command_line("benchmark_quality.py", [*own, *(["--", *extra] if extra else [])])
        entry = record("quality", command, quality_figures(results[0]), load)
        print(f"recorded in docs/results.json: {entry['figures']}", file=sys.stderr)
    print()
    summary(dialogues)
    print()
    report(results, dialogues, extra)
    if args.languages:
        print()
        language_report(results, dialogues)
    print(f"\nload average at start {load:.2f}, at end {load_average():.2f} on {os.cpu_count()} cores")
    for note in dict.fromkeys(notes):
        print(f"note: {note}")
    if args.json:
        data = [asdict(res) for res in results]
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    failed = any(res.error or any(r.error for r in res.records) for res in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
