"""The latency waterfall of spoken turns: where the time between the end of speech and the first
reply audio goes, per turn, as a table and as a PNG.

Each clip runs through local mode's pipeline in this process (``build_pipeline``, file in, file
out, fed at real-time pace as the main command feeds it) with an event bus; the events give, per
turn, on one clock (``time.monotonic``), in ms after the **end of speech** (the endpoint's time
minus its ``endpoint_delay_ms``):

- **endpoint**: the VAD ended the turn (``SpeechStopped``); how it ended (model, text, silence);
- **STT**: the transcript pass of the revision that was answered (``UserTranscript.stt_ms``),
  drawn as ending where the LLM request starts (``ResponseStarted``);
- **first token** (``FirstToken``), **first chunk** (``FirstChunk``: the first phrase sent to TTS)
  and **first audio** (``FirstAudio``: it reached the sink), of that revision.

With speculative turns the STT pass and the LLM may start before the endpoint (negative times
relative to it, never before the end of speech): the waterfall shows that overlap. First audio is
never before the endpoint. Voice-to-voice is the end of speech to the first audio; the benchmark
that calls this also reads it from the audio files (:mod:`benchmark_latency`).

Used by ``scripts/benchmark_latency.py --waterfall PNG``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the waterfall's stages: (label, start milestone, end milestone); milestones are Turn fields
STAGES = (
    ("end of turn", "speech_end", "endpoint"),
    ("STT pass", "stt_start", "llm_start"),
    ("LLM to first token", "llm_start", "first_token"),
    ("first phrase", "first_token", "first_chunk"),
    ("TTS to first audio", "first_chunk", "first_audio"),
)


@dataclass
class Turn:
    """One answered turn's milestones, ms after the end of its speech (None: not reached)."""

    clip: str
    turn_id: int
    endpoint_by: str
    speech_end: float = 0.0
    endpoint: float | None = None
    stt_start: float | None = None
    llm_start: float | None = None
    first_token: float | None = None
    first_chunk: float | None = None
    first_audio: float | None = None
    stt_ms: float | None = None
    first_phrase: str = ""

    @property
    def voice_to_voice(self) -> float | None:
        """End of speech to the first reply audio, ms (the event clock's reading)."""
        return self.first_audio


def turns_from_events(clip: str, events: list[Any]) -> list[Turn]:
    """The waterfall of every answered turn in ``events`` (one run's bus, in order)."""
    from speech_to_speech.core.events import (
        FirstAudio,
        FirstChunk,
        FirstToken,
        ResponseStarted,
        SpeechStopped,
        UserTranscript,
    )

    def of(kind: type, turn_id: int) -> list[Any]:
        return [e for e in events if isinstance(e, kind) and e.turn_id == turn_id]

    turns = []
    for stop in [e for e in events if isinstance(e, SpeechStopped)]:
        audio = of(FirstAudio, stop.turn_id)
        started = [e for e in of(ResponseStarted, stop.turn_id) if not audio or e.time <= audio[0].time]
        if not started:
            continue
        start = started[-1]
        end_s = stop.time - stop.endpoint_delay_ms / 1000

        def ms(t: float | None, end_s: float = end_s) -> float | None:
            return None if t is None else 1000 * (t - end_s)

        token = next((e.time for e in of(FirstToken, stop.turn_id) if e.time >= start.time), None)
        chunk = next((e for e in of(FirstChunk, stop.turn_id) if e.revision == start.revision), None)
        transcript = of(UserTranscript, stop.turn_id)
        stt_ms = transcript[-1].stt_ms if transcript else None
        turn = Turn(clip, stop.turn_id, stop.endpoint_by, endpoint=ms(stop.time), llm_start=ms(start.time))
        turn.stt_ms = stt_ms
        turn.stt_start = None if stt_ms is None or turn.llm_start is None else turn.llm_start - stt_ms
        turn.first_token, turn.first_audio = ms(token), ms(audio[0].time if audio else None)
        turn.first_chunk = ms(chunk.time if chunk else None)
        turn.first_phrase = chunk.text if chunk else ""
        turns.append(turn)
    return turns


def run_clip(clip: Path, extra: list[str], out: Path) -> list[Turn]:
    """Run local mode on ``clip`` (reply written to ``out``) and return its turns' waterfalls."""
    from speech_to_speech.core.events import EventBus
    from speech_to_speech.pipeline.cli import parse_args
    from speech_to_speech.testing.runs import run_local

    args = parse_args(["--input_audio", str(clip), "--output_audio", str(out), *extra])
    bus = EventBus()
    events: list[Any] = []
    bus.subscribe(events.append)
    run_local(args, bus)
    return turns_from_events(clip.stem, events)


def print_waterfall(turns: list[Turn]) -> None:
    """One row per turn: each milestone in ms after the end of speech, and the first phrase."""
    from speech_to_speech.testing.bench import cell, percentile, print_table

    names = ("endpoint", "stt_ms", "llm_start", "first_token", "first_chunk", "first_audio")
    headers = ["clip", "turn", "ended by", "endpoint", "STT pass", "LLM start", "1st token", "1st chunk", "1st audio"]
    rows = [
        [t.clip, str(t.turn_id), t.endpoint_by, *(cell(getattr(t, n)) for n in names), repr(t.first_phrase[:40])]
        for t in turns
    ]
    rows.append([])
    for q in (50, 90):
        values = [percentile([v for t in turns if (v := getattr(t, n)) is not None], q) for n in names]
        rows.append([f"p{q}", "", "", *(cell(v) for v in values), ""])
    print_table([*headers, "first phrase"], rows)


def plot_waterfall(turns: list[Turn], path: Path, title: str) -> None:
    """Draw the turns' stages as horizontal bars, one row per turn, ms after the end of speech.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = ("#9e9e9e", "#4c72b0", "#dd8452", "#c44e52", "#55a868")
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(turns) + 2.0))
    labelled: set[str] = set()
    for row, turn in enumerate(turns):
        y = len(turns) - 1 - row
        for (label, start, end), colour in zip(STAGES, colours, strict=True):
            a, b = getattr(turn, start), getattr(turn, end)
            if a is not None and b is not None and b > a:
                ax.barh(y, b - a, left=a, height=0.6, color=colour, label=None if label in labelled else label)
                labelled.add(label)
        if turn.first_audio is not None:
            ax.text(turn.first_audio + 15, y, f"{turn.first_audio:.0f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(turns)), [f"{t.clip[-24:]} #{t.turn_id}" for t in reversed(turns)], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("ms after the end of the user's speech (first audio = voice-to-voice)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(right=ax.get_xlim()[1] * 1.08)  # room for the last label
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5 / (0.45 * len(turns) + 1.6) - 0.12), ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
