"""The primitives every wing builds on: stage threads (``handler``), bounded queues (``queues``),
validity (``cancel``: stamps, the generation counter, the ``Gate``), the pipeline's messages
(``messages``), its events and bus (``events``), models shared across sessions (``shared``) and the
audio format conventions with the one pcm16 codec (``audio``). Imports nothing from the other wings."""
