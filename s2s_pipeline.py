"""speech-to-speech entry point: ``python s2s_pipeline.py --help``."""

from speech_to_speech.main import entry

if __name__ == "__main__":
    entry()
