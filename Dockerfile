# syntax=docker/dockerfile:1
# The realtime server on CPU, with the embedded models (Silero VAD, Whisper tiny.en, Qwen2.5-Coder-0.5B
# in llama.cpp, Piper): no network needed at run time. See docs/deployment.md.
#
#   docker build -t speech-to-speech .
#   docker run --rm -p 8765:8765 speech-to-speech
#
# The install is the README's: constrained by requirements.lock, torch at the release the lock names.
FROM python:3.11-slim-bookworm

# a C/C++ compiler and CMake for llama-cpp-python (no wheels on PyPI); PortAudio for sounddevice's import
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ cmake libportaudio2 \
    && rm -rf /var/lib/apt/lists/*

# llama.cpp is built for a generic x86-64/arm64 CPU, not -march=native: the image runs on other
# machines than the one that built it (native builds crash with SIGILL on older CPUs)
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF" \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    S2S_CACHE_DIR=/models

ARG TORCH_VERSION=2.13.0
ARG EXTRAS=smart-turn,otel
WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY speech_to_speech ./speech_to_speech
COPY handlers ./handlers
COPY configs ./configs
COPY s2s_pipeline.py ./
RUN pip install -c requirements.lock "torch==${TORCH_VERSION}" ".[${EXTRAS}]"

# a non-root user; the embedded LLM is assembled once, at build time, into $S2S_CACHE_DIR
RUN useradd --create-home --uid 1000 s2s && mkdir -p /models && chown s2s /models
USER s2s
RUN s2s-pipeline --input_text "Hello." --output_audio /tmp/warm.wav && rm -f /tmp/warm.wav

EXPOSE 8765
# /healthz: alive; /readyz (503 while loading, draining or full) is for the load balancer
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8765/healthz', timeout=2).status != 200)"
# SIGTERM drains: active replies finish (up to --drain_timeout_s), then sessions close with 1001;
# give the container more than that to stop (compose: stop_grace_period)
STOPSIGNAL SIGTERM
ENTRYPOINT ["s2s-pipeline", "--mode", "server", "--host", "0.0.0.0", "--port", "8765"]
CMD ["--drain_timeout_s", "30"]
