"""``s2s-talk``, the terminal client: talk to a realtime server from a microphone and speaker, or
feed it audio files and text turns and record its answers (see :mod:`.cli` for the modes).

Modules: ``cli`` (flags, the run, exit status), ``conversation`` (the server events it acts on),
``audio`` (microphone, file, speaker and WAV ends), ``console`` (what it prints and logs),
``tools`` (client-side ``--tool-module`` calls), ``sample_tools`` (an example tool module).
"""
