#!/usr/bin/env python
"""Voice-to-voice latency of the live microphone/speaker mode, through a real sound server.

Starts a private PulseAudio (Debian ``pulseaudio``; PortAudio reaches it through ALSA's pulse
plugin, ``libasound2-plugins``, as on a Linux laptop) with three null sinks:

- ``mic``: what is played into it is the default source (its monitor), the "microphone";
- ``speaker``: the default sink, where the program's replies play;
- ``tap``: both of the above, through two loopbacks of equal latency, recorded with ``parecord``,
  so the user's speech and the reply lie on one timeline.

Then it runs ``python s2s_pipeline.py`` with no input flags (live mode), plays each LibriVox clip
into ``mic`` and reads voice-to-voice off the recording: from the end of the clip's speech to the
first sound of the reply. Prints one row per clip and the p50, next to ``benchmark_latency.py``'s
file-mode figure for the same clips.

    python scripts/benchmark_live.py [--clips N] [-- extra s2s_pipeline flags]

The room is :mod:`speech_to_speech.testing.room`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from speech_to_speech.testing.bench import find_clips, percentile, split_extra
from speech_to_speech.testing.room import LiveProgram, SoundServer, SoundServerUnavailable, measure


def main(argv: list[str] | None = None) -> int:
    ours, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=5, help="LibriVox clips to play (default 5)")
    parser.add_argument("--gap_s", type=float, default=8.0, help="seconds after each clip for its reply")
    args = parser.parse_args(ours)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            server = SoundServer(Path(tmp))
        except SoundServerUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        try:
            tap = server.record(Path(tmp) / "tap.wav")
            program = LiveProgram(server.env, extra)
            if not program.wait_listening(300):
                print("error: the program did not start:\n" + "\n".join(program.lines[-20:]), file=sys.stderr)
                return 1
            rows: list[float] = []
            for clip in find_clips()[: args.clips]:
                v2v = measure(server, tap, clip, args.gap_s)
                print(f"{clip.name:<28} voice-to-voice {'-' if v2v is None else f'{v2v:.0f} ms'}")
                if v2v is not None:
                    rows.append(v2v)
            status = program.interrupt()
        finally:
            server.close()
    p50 = percentile(rows, 50)
    summary = "no reply heard" if p50 is None else f"p50 {p50:.0f} ms over {len(rows)} clips"
    print(f"live mode through PulseAudio: {summary}; Ctrl-C exit status {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
