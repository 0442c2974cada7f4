"""``python -m speech_to_speech.client.talk``: the same as the ``s2s-talk`` console script."""

from speech_to_speech.client.talk.cli import entry

entry()
