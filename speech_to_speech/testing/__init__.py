"""What the tests and the benchmarks share (as Pipecat's ``pipecat.tests`` and LiveKit's shared test
fakes): one fake per stage (``fakes``), a scripted ``/v1/responses`` provider (``responses_server``),
the realtime server in process and its clients' helpers (``realtime``), turn-taking runs on real
speech (``turns``), LibriVox clips and word error rate (``speech_data``), a Chromium driven over
CDP (``cdp``), the benchmarks' harness (``bench``: child processes, clips, percentiles, tables),
the latency waterfall (``waterfall``), the conversation benchmark's scoring (``scoring``), the
multilingual Whisper packages (``stt_models``) and small helpers (``runs``).

Neither ``tests/`` nor ``scripts/`` imports the other; both import this. It reads test data from a
source checkout (``tests/data``, ``scripts/data`` under :data:`REPO_ROOT`).
"""

from pathlib import Path

#: the repository root of the source checkout this package was installed from (editable install)
REPO_ROOT = Path(__file__).resolve().parents[2]
