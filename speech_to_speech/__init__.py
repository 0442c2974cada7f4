"""speech-to-speech: a low-latency voice agent runtime (VAD → STT → LLM → TTS).

This package is the runtime: stages, queues, messages, cancellation, history,
registry and I/O. Model backends live in the top-level ``handlers`` package and
are imported lazily through :mod:`speech_to_speech.pipeline.registry`.
"""

__version__ = "0.1.0"
