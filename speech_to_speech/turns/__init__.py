"""The listening side, up to a transcript: the VAD stage and its endpointer, semantic end of turn,
speculative turns, the interruption judge and its backchannel rules, and the STT stage base.
Imports only ``core`` and ``speech``."""
