"""tts backends."""
