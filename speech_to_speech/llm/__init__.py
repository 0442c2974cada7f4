"""The thinking side: the LLM stage (``stage``), what a backend gets and yields (``api``), the base of
in-process models (``local``), the output processor (``output``), deadlines on provider reads
(``provider_reader``), history (``chat``, ``items``, ``serialize``), prompts, tool calls (``tools``),
and work done ahead of time for tool follow-ups (``prefetch``, ``hidden_response``).
Imports only ``core`` and ``speech``."""
