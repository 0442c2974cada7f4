"""The speaking side: sentence splitting of the reply text (``text``), the TTS stage base (``tts``),
paced playback that knows which words were heard (``playback``), and audio in and out of the
process: microphone, speaker, files (``audio_io``). Imports only ``core``."""
