"""The backend registry: stage → backend name → config class, handler import path, extra.

Handlers are named by import path and imported lazily, so ``speech_to_speech``
never imports ``handlers`` at import time and optional dependencies are only
needed for the backends actually selected.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from speech_to_speech.llm.api import LlamaCppConfig, LLMConfig, OpenAICompatibleConfig
from speech_to_speech.speech.tts import TTSConfig
from speech_to_speech.turns.stt import STTConfig
from speech_to_speech.turns.vad import VADConfig

STAGES = ("vad", "stt", "llm", "tts")


class UnknownBackendError(ValueError):
    """A backend name not in the registry."""


class BackendUnavailableError(RuntimeError):
    """A registered backend whose optional dependencies are not installed."""


@dataclass(frozen=True)
class Backend:
    """One registered backend.

    Attributes:
        name: what users pass on the command line (e.g. ``"transformers"``).
        stage: one of :data:`STAGES`.
        config_cls: the dataclass holding its settings.
        handler_path: ``"module.path:ClassName"`` of its handler.
        extra: the pip extra that installs its dependencies ("" = core install).
        summary: one line for ``--help``.
    """

    name: str
    stage: str
    config_cls: type
    handler_path: str
    extra: str = ""
    summary: str = ""

    def load_handler_class(self) -> type:
        """Import and return the handler class.

        Raises:
            BackendUnavailableError: if an import fails; the message names the pip extra.
        """
        module_name, _, class_name = self.handler_path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = f"pip install 'speech-to-speech[{self.extra}]'" if self.extra else "pip install -e ."
            raise BackendUnavailableError(
                f"{self.stage} backend '{self.name}' cannot be imported ({exc}); install it with: {hint}"
            ) from exc
        return getattr(module, class_name)


REGISTRY: dict[str, dict[str, Backend]] = {stage: {} for stage in STAGES}


def register(backend: Backend) -> Backend:
    """Add ``backend`` to :data:`REGISTRY` (a later registration of a name replaces it)."""
    if backend.stage not in REGISTRY:
        raise ValueError(f"unknown stage {backend.stage!r}; expected one of {STAGES}")
    REGISTRY[backend.stage][backend.name] = backend
    return backend


def get_backend(stage: str, name: str) -> Backend:
    """Look up a backend.

    Raises:
        UnknownBackendError: with the list of known names.
    """
    backends = REGISTRY.get(stage, {})
    if name not in backends:
        known = ", ".join(sorted(backends)) or "none"
        raise UnknownBackendError(f"unknown {stage} backend '{name}' (known: {known})")
    return backends[name]


register(
    Backend("silero", "vad", VADConfig, "handlers.vad.silero_vad:SileroVADHandler", summary="Silero VAD (embedded)")
)
register(
    Backend(
        "faster-whisper",
        "stt",
        STTConfig,
        "handlers.stt.faster_whisper_stt:FasterWhisperSTTHandler",
        summary="faster-whisper (embedded Whisper tiny.en)",
    )
)
register(
    Backend(
        "llama-cpp",
        "llm",
        LlamaCppConfig,
        "handlers.llm.llama_cpp_llm:LlamaCppLLMHandler",
        summary="llama.cpp in process (embedded Qwen2.5-Coder-1.5B-Instruct Q4_K_M by default)",
    )
)
register(
    Backend(
        "transformers",
        "llm",
        LLMConfig,
        "handlers.llm.transformers_llm:TransformersLLMHandler",
        summary="Hugging Face transformers (the embedded model, converted once to safetensors)",
    )
)
register(
    Backend(
        "transformers-vlm",
        "llm",
        LLMConfig,
        "handlers.llm.transformers_vlm:TransformersVLMHandler",
        summary="a vision-language model with transformers: sees images (default SmolVLM-256M-Instruct, from the hub)",
    )
)
register(
    Backend(
        "mlx-lm",
        "llm",
        LLMConfig,
        "handlers.llm.mlx_lm_llm:MLXLMHandler",
        extra="mlx",
        summary="mlx-lm (Apple Silicon; Linux CPU via mlx[cpu])",
    )
)
register(
    Backend(
        "responses-api",
        "llm",
        OpenAICompatibleConfig,
        "handlers.llm.openai_compatible:ResponsesAPIHandler",
        summary="OpenAI-compatible /v1/responses",
    )
)
register(
    Backend(
        "chat-completions",
        "llm",
        OpenAICompatibleConfig,
        "handlers.llm.openai_compatible:ChatCompletionsHandler",
        summary="OpenAI-compatible /v1/chat/completions",
    )
)
register(
    Backend(
        "piper",
        "tts",
        TTSConfig,
        "handlers.tts.piper_tts:PiperTTSHandler",
        summary="Piper (embedded English voice; espeak-ng for languages without a voice)",
    )
)
register(
    Backend(
        "espeak-ng",
        "tts",
        TTSConfig,
        "handlers.tts.espeak_ng_tts:EspeakNGTTSHandler",
        summary="espeak-ng (the system command; ~100 languages, robotic)",
    )
)
