"""A prefetched (hidden) response of the LLM stage, held until a client claims it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from speech_to_speech.core.events import Event
from speech_to_speech.llm.prefetch import PREFETCH_STREAM_MAXSIZE, PrefetchStream, ResponsePrefetchTransaction

if TYPE_CHECKING:
    from speech_to_speech.llm.stage import BaseLLMHandler


class HiddenResponse:
    """Holds a prefetched response's events and outputs until it is claimed.

    Stands in for the event bus during the hidden generation. Outputs go through
    a bounded :class:`~speech_to_speech.llm.prefetch.PrefetchStream`; on claim the
    held events are replayed and a drain thread moves the outputs downstream.
    """

    def __init__(self, llm: BaseLLMHandler, txn: ResponsePrefetchTransaction) -> None:
        self.llm = llm
        self.real_bus = llm.bus
        self.txn = txn
        self.lock = threading.Lock()
        self.events: list[Event] = []
        self.released = False
        self.stream = PrefetchStream(4 * PREFETCH_STREAM_MAXSIZE, lambda: txn.is_discarded or llm.stop_event.is_set())

    def publish(self, event: Event) -> None:
        """Hold ``event`` until the claim (then pass it on at once)."""
        with self.lock:
            if not self.released:
                self.events.append(event)
                return
        self.real_bus.publish(event)

    def put(self, item: Any) -> bool:
        """Queue one output of the hidden response; False once it was discarded or the stage stopped."""
        return self.stream.put(item)

    def release(self) -> None:
        """Claimed: replay the held events, then stream the outputs downstream."""
        with self.lock:
            events, self.events, self.released = self.events, [], True
        for event in events:
            self.real_bus.publish(event)
        threading.Thread(target=self._drain, name=f"{self.llm.name}:prefetch-drain", daemon=True).start()

    def _drain(self) -> None:
        for item in self.stream:
            self.llm.emit(item)
