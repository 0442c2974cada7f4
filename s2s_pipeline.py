"""speech-to-speech entry point: ``python s2s_pipeline.py --help``."""

import sys

from speech_to_speech.main import main

if __name__ == "__main__":
    sys.exit(main())
