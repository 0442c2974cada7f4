#!/usr/bin/env python
"""Realtime server benchmark: latency and barge-in seen by WebSocket clients, and the server's load.

The script starts the realtime server as a subprocess on a free port::

    python s2s_pipeline.py --mode server --host 127.0.0.1 --port PORT --max_sessions N [EXTRA FLAGS]

(flags after ``--`` go to the server unchanged), or uses a running one given with ``--url``.
It then talks to it through WebSocket clients that speak the OpenAI Realtime protocol
(:mod:`speech_to_speech.client.realtime`: ``session.update`` with ``server_vad``, then
``input_audio_buffer.append`` blocks of 40 ms of pcm16 at 24 kHz), in these phases:

1. **warm-up** (skip with ``--no_warmup``): one client speaks one clip and cancels the reply at
   its first audio delta, so that first-inference costs (lazy initialisation, kernel caches) do
   not land on the first measured turn. Not measured.
2. **sequential**: ``--clients`` clients, one after another, each in its own session.
3. **concurrent**: ``--clients`` clients at once (the server is started with ``--max_sessions``
   equal to ``--clients``).
4. **barge-in** (``--barge_in_runs``, default 1, one after another): a client speaks a clip and,
   right after the reply's first audio delta (plus ``--barge_in_after_s``), speaks a second clip
   over it.

Client ``i`` speaks LibriVox clip ``i`` (cycling), from the Debian package
``pocketsphinx-testdata`` (``/usr/share/pocketsphinx/test/data/librivox``) or ``--clips_dir``,
resampled to 24 kHz with soxr. Audio goes out at real-time pace (``--speed`` changes it) on an
absolute schedule (block ``i`` leaves at start + (i + 1) × 40 ms), followed by 1.5 s of silence so
the server's VAD can endpoint. With ``--open_mic`` (always in the barge-in phase) the client
keeps sending silence after that, like an open microphone, until it is done. A client is done
when the response created after its last ``speech_stopped`` has sent ``response.done`` (or after
``--turn_timeout_s``); with ``--cancel_replies`` it sends ``response.cancel`` at the reply's first
audio delta instead of listening to the whole reply (shorter runs, less server load).

What is measured (``time.monotonic()`` in this process, when an event is received):

- **v2v ms** (voice-to-voice, as everywhere in this project): the end of the user's speech in the
  audio sent (the clip's last frame of speech, :func:`speech_to_speech.testing.bench.speech_end_s`,
  placed on the paced send schedule) -> receipt of the first ``response.output_audio.delta`` of
  the reply. It holds the server's end-of-turn wait, STT, LLM, TTS and the network hop, not the
  client's playback buffer. Percentiles are over all turns of the phase (linear interpolation); a
  clip the VAD splits into two turns yields a value for the turn that holds its end.
- **after stop ms**: receipt of ``input_audio_buffer.speech_stopped`` -> the same first audio
  delta (leaves out the end-of-turn wait).
- **stop: last delta ms** (barge-in): receipt of ``speech_started`` for the second utterance ->
  receipt of the last ``response.output_audio.delta`` of the interrupted response that arrives
  after it; 0 when none arrives after it (the server stopped the audio before announcing the
  barge-in). "late audio ms" is how much audio those late deltas carried.
- **stop: done ms** (barge-in): the same start -> receipt of the interrupted response's
  ``response.done`` (expected status ``cancelled``). A reply that was over before the second
  utterance started counts as not interrupted and gives no value.
- **CPU mean/peak %**, **RSS peak MB**: the server process, sampled every ``--sample_s`` seconds
  (psutil when installed, else ``/proc/PID/stat`` and ``/proc/PID/status``; Linux only without
  psutil). CPU % is of one core (200 = two cores busy) over each sampling interval; each phase
  row covers the samples taken during that phase, "startup" the model load. With ``--url`` there
  is no process to sample unless ``--server_pid`` names it.
- **model load s**: from starting the server process to its line "realtime server listening on
  ws://..." (Python start-up, imports and loading every model once). Not known with ``--url``.

The clients run in this process, on one asyncio loop, and add their own (small) CPU load to the
machine; on a busy machine all numbers are noisy.

Exit status: 0 when every turn got a reply and every barge-in was measured, 1 otherwise (or when
the server could not be started or reached), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from speech_to_speech.testing.bench import (
    REPO_ROOT,
    ProbeUnavailable,
    ProcessProbe,
    ResourceSampler,
    cell,
    find_clips,
    free_port,
    percentile,
    print_table,
    split_extra,
)
from speech_to_speech.testing.server_runs import (
    BargeIn,
    BenchClient,
    BenchmarkError,
    Clip,
    Options,
    ServerProcess,
    Turn,
    barge_in,
    load_clip,
    short_names,
    speak_one_turn,
)

PROG = "benchmark_server.py"

#: silence sent after each clip so that the server's VAD can endpoint, s


async def run_phases(
    options: Options,
    clips: list[Clip],
    n_clients: int,
    barge_in_runs: int,
    warmup: bool,
    sampler: ResourceSampler | None,
) -> tuple[list[Turn], list[BargeIn]]:
    """Warm-up, sequential, concurrent and barge-in phases, in that order.

    Raises:
        BenchmarkError: the server cannot be reached.
    """

    def enter(phase: str) -> None:
        print(f"[{phase}] ...", file=sys.stderr, flush=True)
        if sampler is not None:
            sampler.phase = phase

    probe = await BenchClient.open(options.url, "probe", options.headers)  # fail early when unreachable
    await probe.close()
    turns: list[Turn] = []
    if warmup:
        enter("warm-up")
        warm = await speak_one_turn(options, "warm-up", "warm-up", clips[0], cancel=True)
        if all(t.v2v_ms is None for t in warm):
            options.notes.append(f"warm-up: {warm[0].status if warm else 'no turn'}")
    enter("sequential")
    for i in range(n_clients):
        clip = clips[i % len(clips)]
        turns += await speak_one_turn(options, "sequential", f"seq-{i + 1}", clip, options.cancel_replies)
    enter("concurrent")
    batches = await asyncio.gather(
        *(
            speak_one_turn(options, "concurrent", f"conc-{i + 1}", clips[i % len(clips)], options.cancel_replies)
            for i in range(n_clients)
        )
    )
    turns += [turn for batch in batches for turn in batch]
    barge_ins: list[BargeIn] = []
    if barge_in_runs:
        enter("barge-in")
        for i in range(barge_in_runs):
            first, second = clips[i % len(clips)], clips[(i + 1) % len(clips)]
            barge_ins.append(await barge_in(options, f"barge-{i + 1}", first, second))
    enter("done")
    return turns, barge_ins


# -- report -----------------------------------------------------------------------------------


def report(
    turns: list[Turn],
    barge_ins: list[BargeIn],
    sampler: ResourceSampler | None,
    load_s: float | None,
    n_clients: int,
    notes: list[str],
) -> None:
    """Print the per-turn details, then the summary table and notes."""
    print("\nper turn:")
    rows = [[t.phase, t.client, t.clip, cell(t.v2v_ms), cell(t.after_stop_ms), t.status or "-"] for t in turns]
    print_table(["phase", "client", "clip", "v2v ms", "after stop ms", "reply status"], rows)
    if barge_ins:
        print("\nbarge-in runs:")
        rows = [
            [
                b.client,
                b.clips,
                cell(b.stop_last_delta_ms),
                cell(b.stop_done_ms),
                cell(b.late_audio_ms),
                b.error or b.status or "-",
            ]
            for b in barge_ins
        ]
        headers = ["client", "clips", "stop: last delta ms", "stop: done ms", "late audio ms", "interrupted reply"]
        print_table(headers, rows)

    def resources(phase: str) -> list[str]:
        mean, peak, rss = sampler.summary(phase) if sampler is not None else (None, None, None)
        return [cell(mean), cell(peak), cell(rss)]

    print("\nsummary:")
    rows = []
    if sampler is not None and load_s is not None:
        rows.append(["startup", "-", "-", "-", "-", "-", "-", *resources("startup")])
    for phase in ("sequential", "concurrent"):
        values = [t.v2v_ms for t in turns if t.phase == phase and t.v2v_ms is not None]
        count = len([t for t in turns if t.phase == phase])
        p50, p90 = percentile(values, 50), percentile(values, 90)
        rows.append([phase, str(n_clients), f"{len(values)}/{count}", cell(p50), cell(p90), "-", "-"])
        rows[-1] += resources(phase)
    if barge_ins:
        measured = [b for b in barge_ins if b.stop_done_ms is not None]
        last = percentile([b.stop_last_delta_ms for b in measured if b.stop_last_delta_ms is not None], 50)
        done = percentile([b.stop_done_ms for b in measured if b.stop_done_ms is not None], 50)
        rows.append(["barge-in", "1", f"{len(measured)}/{len(barge_ins)}", "-", "-", cell(last), cell(done)])
        rows[-1] += resources("barge-in")
    headers = ["phase", "clients", "turns", "v2v p50 ms", "v2v p90 ms", "stop: last delta ms", "stop: done ms"]
    print_table([*headers, "CPU mean %", "CPU peak %", "RSS peak MB"], rows)
    all_rss = [rss for _, _, rss in sampler.samples] if sampler is not None else []
    print(
        f"\nmodel load s: {cell(load_s, 1)} (server start -> 'listening' line)   "
        f"server RSS peak over the whole run: {cell(max(all_rss) if all_rss else None)} MB   "
        f"CPU % is of one core ({os.cpu_count()} cores here)"
    )
    if len(barge_ins) > 1:
        print("barge-in stop values are the p50 over the runs.")
    for note in notes:
        print(f"note: {note}")


# -- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (server flags go after ``--``)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Benchmark the realtime server with WebSocket clients: voice-to-voice latency (sequential "
        "and concurrent sessions), barge-in stop time, server CPU and memory. Flags after -- go to the server.",
    )
    parser.add_argument("--url", help="use this running server (ws://HOST:PORT/v1/realtime) instead of starting one")
    parser.add_argument("--api_key", default="", help="send 'Authorization: Bearer KEY' (with --url)")
    parser.add_argument("--server_pid", type=int, help="with --url: the server's process id, to sample CPU and RSS")
    parser.add_argument("--clients", type=int, default=3, help="clients per phase (default 3)")
    parser.add_argument("--barge_in_runs", type=int, default=1, help="barge-in runs, one after another (default 1)")
    parser.add_argument("--barge_in_after_s", type=float, default=0.0, help="wait after the first reply audio (s)")
    parser.add_argument("--clips_dir", help="folder of *.wav clips (default: the pocketsphinx-testdata LibriVox clips)")
    parser.add_argument("--speed", type=float, default=1.0, help="input pace, times real time (default 1.0)")
    parser.add_argument("--open_mic", action="store_true", help="keep sending silence after each clip")
    parser.add_argument("--cancel_replies", action="store_true", help="cancel each reply at its first audio delta")
    parser.add_argument("--no_warmup", action="store_true", help="skip the unmeasured warm-up turn")
    parser.add_argument("--turn_timeout_s", type=float, default=120.0, help="wait for a reply at most this long")
    parser.add_argument("--load_timeout_s", type=float, default=600.0, help="wait for the server at most this long")
    parser.add_argument("--sample_s", type=float, default=0.25, help="seconds between CPU/RSS samples")
    parser.add_argument("--server_log", metavar="PATH", help="write the started server's output here")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    own, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.barge_in_runs < 0 or args.speed <= 0 or args.sample_s <= 0:
        parser.error("--barge_in_runs must be >= 0, --speed and --sample_s > 0")
    if args.url and extra:
        parser.error("server flags after -- need a server started by this script (no --url)")
    paths = find_clips(args.clips_dir)
    if not paths:
        print(
            f"{PROG}: error: no *.wav clips found; install pocketsphinx-testdata or pass --clips_dir", file=sys.stderr
        )
        return 1
    clips = [load_clip(path) for path in paths]
    for clip, name in zip(clips, short_names([clip.name for clip in clips]), strict=True):
        clip.name = name
    print(f"{len(clips)} clip(s) from {paths[0].parent}; {args.clients} client(s) per phase", file=sys.stderr)

    server: ServerProcess | None = None
    sampler: ResourceSampler | None = None
    log = open(args.server_log, "w") if args.server_log else None  # noqa: SIM115 (closed in finally)
    notes: list[str] = []
    try:
        pid = args.server_pid
        if args.url:
            url = args.url
        else:
            host = "127.0.0.1"
            command = [sys.executable, str(REPO_ROOT / "s2s_pipeline.py"), "--mode", "server", "--host", host]
            command += ["--port", str(free_port(host)), "--max_sessions", str(args.clients), *extra]
            print(f"starting: {' '.join(command)}", file=sys.stderr, flush=True)
            server = ServerProcess(command, log)
            server.start()
            pid = server.pid
        if pid is not None:
            try:
                sampler = ResourceSampler(ProcessProbe(pid), args.sample_s)
                sampler.start()
            except ProbeUnavailable as exc:
                notes.append(str(exc))
            except Exception as exc:  # e.g. psutil.NoSuchProcess for a wrong --server_pid
                notes.append(f"cannot sample process {pid}: {exc}")
        if server is not None:
            url = server.wait_ready(args.load_timeout_s)
            print(f"server listening on {url} after {server.load_s:.1f} s", file=sys.stderr, flush=True)
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        options = Options(
            url, headers, args.speed, args.open_mic, args.cancel_replies, args.turn_timeout_s, args.barge_in_after_s
        )
        options.notes = notes
        turns, barge_ins = asyncio.run(
            run_phases(options, clips, args.clients, args.barge_in_runs, not args.no_warmup, sampler)
        )
    except BenchmarkError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if sampler is not None:
            sampler.stop()
        if server is not None:
            server.stop()
        if log is not None:
            log.close()
    report(turns, barge_ins, sampler, server.load_s if server else None, args.clients, notes)
    ok = all(t.v2v_ms is not None or t.status == "superseded" for t in turns) and all(
        b.error is None for b in barge_ins
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
