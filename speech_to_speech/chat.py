"""Conversation history for the LLM stage."""

from __future__ import annotations

import copy
import threading
from typing import Any

Message = dict[str, Any]


class Chat:
    """A bounded, thread-safe list of chat messages (OpenAI-style role/content dicts).

    The system prompt is kept apart and always comes first. History holds at
    most ``max_turns`` user turns; committing a newer one evicts the oldest
    whole turn (the user message and everything up to the next user message).

    Args:
        system_prompt: the system message text ("" for none).
        max_turns: user turns kept (>= 1).

    Raises:
        ValueError: if ``max_turns`` < 1.
    """

    def __init__(self, system_prompt: str = "", max_turns: int = 8) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._messages: list[Message] = []

    def messages_for(self, user_text: str) -> list[Message]:
        """The request for a new user turn: system prompt, history, then ``user_text``.

        Does not modify the history (see :meth:`commit`).
        """
        with self._lock:
            history = copy.deepcopy(self._messages)
        prefix = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return prefix + history + [{"role": "user", "content": user_text}]

    def commit(self, user_text: str, assistant_text: str) -> None:
        """Append one completed exchange, then evict the oldest turns over the bound."""
        with self._lock:
            self._messages.append({"role": "user", "content": user_text})
            self._messages.append({"role": "assistant", "content": assistant_text})
            while self._user_turns() > self.max_turns:
                self._evict_oldest_turn()

    def snapshot(self) -> list[Message]:
        """A deep copy of the history (without the system prompt)."""
        with self._lock:
            return copy.deepcopy(self._messages)

    def reset(self) -> None:
        """Forget all turns (the system prompt stays)."""
        with self._lock:
            self._messages.clear()

    def _user_turns(self) -> int:
        return sum(1 for m in self._messages if m["role"] == "user")

    def _evict_oldest_turn(self) -> None:
        end = 1
        while end < len(self._messages) and self._messages[end]["role"] != "user":
            end += 1
        del self._messages[:end]
