"""Conversation history for the LLM stage: bounded, transactional and thread-safe.

Items are plain dicts close to the OpenAI Responses API (messages, function calls and their
outputs; shapes and validation in :mod:`speech_to_speech.llm.items`). :class:`Chat` keeps the system
prompt apart from the items. Its size is counted in user turns (a user message and everything up
to the next user message). Three mechanisms keep it valid and bounded:

- **Function-call pairing.** A ``function_call_output`` is only accepted for a known ``call_id``.
  Calls are also remembered apart (until their output arrives), so an output for a call that was
  evicted re-injects the call right before it instead of leaving an orphan.
- **Transactions.** The LLM stage writes a response's items *provisionally* under a response key as
  soon as they are exposed (a tool call must be in history before the client can answer it), then
  finalizes them on success or rolls them back on failure. Cancellation leaves a tombstone so that a
  write racing behind it is refused. A call the client has been shown is committed on its own
  (:meth:`Chat.commit_provisional_call`): a rollback of the rest of its response keeps it.
- **Bounds.** :meth:`Chat.trim_if_needed` (called after each successful response) evicts the oldest
  whole turns, or summarises them in a background thread with a compactor. :meth:`Chat.add_item`
  also enforces a hard cap of ``2 * size`` user turns inline.

Serialisation for the APIs and chat templates is in :mod:`speech_to_speech.llm.serialize`.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from speech_to_speech.llm.items import (
    ChatItemError,
    Item,
    audio_to_text,
    compact_parts,
    image_to_text,
    is_user_message,
    new_item_id,
    replace_text,
    valid_summary,
    validated_copy,
)

logger = logging.getLogger(__name__)


Compactor = Callable[[list[Item]], tuple[str, str]]
"""Summarises history items into ``(user summary text, assistant summary text)``; may raise."""

MAX_TOMBSTONES = 128
"""Cancelled response keys remembered (the newest ones)."""

MAX_PENDING_CALLS = 256
"""Function calls remembered while they wait for their output (the newest ones)."""


@dataclass
class _Provisional:
    """What one response key wrote provisionally, so it can be undone exactly."""

    item_ids: list[str] = field(default_factory=list)
    # call_ids this key added to the pending-calls map
    added_calls: list[str] = field(default_factory=list)
    # pending calls this key's outputs consumed (restored on rollback)
    consumed_calls: dict[str, Item] = field(default_factory=dict)


@dataclass
class _CompactionJob:
    gen: int
    item_ids: set[str]
    items: list[Item]


class Chat:
    """A bounded, transactional, thread-safe conversation history.

    Args:
        size: the soft bound, in user turns (>= 1). :meth:`trim_if_needed` brings the history back to
            it; :meth:`add_item` evicts inline above ``2 * size``.
        system_prompt: the system message text ("" for none); kept apart from the items, settable.
        compactor: when given, :meth:`trim_if_needed` summarises older turns with it in a background
            thread instead of evicting them. Called with a deep copy of the items to summarise, it
            returns ``(user summary text, assistant summary text)`` and may raise.

    Raises:
        ValueError: if ``size`` < 1.

    All methods take one lock (the background compaction worker included). The compactor itself runs
    outside the lock.
    """

    def __init__(self, size: int = 8, system_prompt: str = "", compactor: Compactor | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.system_prompt = system_prompt
        self.compactor = compactor
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._buffer: list[Item] = []
        self._pending_calls: OrderedDict[str, Item] = OrderedDict()
        self._provisional: dict[str, _Provisional] = {}
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        self._gen = 0
        self._closed = False
        self._compaction_gen: int | None = None  # generation of the compaction in flight, if any
        self._workers = 0  # compaction threads still running (of any generation)

    # ------------------------------------------------------------------ adding

    def add_item(self, item: dict) -> dict:
        """Append one item and return a copy of it as stored.

        An ``"id"`` is assigned if missing (``"item_" + uuid hex``). A ``function_call`` is stored and
        also remembered by ``call_id`` until its output arrives. A ``function_call_output`` must answer
        a known call: one in the history, or one evicted from it, which is then re-injected right
        before the output. If the history then holds more than ``2 * size`` user turns, the oldest
        whole turns are evicted.

        Args:
            item: a message, function_call or function_call_output dict (see the module docstring).

        Returns:
            A deep copy of the stored item (with its id).

        Raises:
            ChatItemError: malformed item, an id already in the history, a ``call_id`` already used by
                another call, or an output for an unknown call (or for a call already answered).
        """
        with self._lock:
            stored = self._add_locked(item, None)
            self._enforce_hard_cap_locked()
            return copy.deepcopy(stored)

    def append_tool_output(self, call_id: str, output: str) -> dict:
        """Add a ``function_call_output`` answering ``call_id``; see :meth:`add_item`.

        Returns:
            A copy of the stored output item.

        Raises:
            ChatItemError: the call is unknown or already answered, or the arguments are not strings.
        """
        return self.add_item({"type": "function_call_output", "call_id": call_id, "output": output})

    # ------------------------------------------------------------------ reading

    def items(self) -> list[dict]:
        """A deep copy of the history items, oldest first (without the system prompt)."""
        with self._lock:
            return copy.deepcopy(self._buffer)

    @property
    def user_turns(self) -> int:
        """The number of user messages in the history."""
        with self._lock:
            return self._user_turns_locked()

    # ------------------------------------------------------------------ transactions

    def add_provisional_generation_items(self, response_key: str, items: list[dict]) -> list[dict] | None:
        """Add a response's items atomically, recorded as provisional under ``response_key``.

        Either every item is added (with the same rules as :meth:`add_item`) or none is: on any error
        the buffer, the pending calls and the provisional records are restored, and the error is
        re-raised. May be called several times for one key (e.g. a tool call early, the assistant
        message at the end); the items accumulate under the key.

        Args:
            response_key: identifies the response (e.g. its response id).
            items: the items to add, in order.

        Returns:
            Copies of the stored items, or ``None`` if ``response_key`` was cancelled (nothing is
            written then).

        Raises:
            ChatItemError: an item is invalid (see :meth:`add_item`); the history is unchanged.
        """
        with self._lock:
            if response_key in self._tombstones:
                return None
            saved_buffer = list(self._buffer)
            saved_pending = OrderedDict(self._pending_calls)
            saved_provisional = {
                key: _Provisional(list(rec.item_ids), list(rec.added_calls), dict(rec.consumed_calls))
                for key, rec in self._provisional.items()
            }
            try:
                record = self._provisional.setdefault(response_key, _Provisional())
                stored = [self._add_locked(item, record) for item in items]
                self._enforce_hard_cap_locked()
            except BaseException:
                self._buffer = saved_buffer
                self._pending_calls = saved_pending
                self._provisional = saved_provisional
                raise
            if not record.item_ids and not record.added_calls and not record.consumed_calls:
                del self._provisional[response_key]
            return copy.deepcopy(stored)

    def commit_provisional_call(self, response_key: str, call: dict) -> None:
        """Make one function call written under ``response_key`` permanent, whatever happens to the
        rest of that response.

        For a call the client has been shown: its output, early or late, must find it. The call
        leaves the key's provisional record, so a later rollback or cancel of the response removes
        everything else it wrote but not the call. A call that is already permanent (the response
        was finalized) is left alone; one that is gone because the response was rolled back first
        (a cancel that raced ahead of the call reaching the client) is written again, at the end.

        Args:
            response_key: the response that wrote the call.
            call: the ``function_call`` item as stored (with its ``id``).

        Raises:
            ChatItemError: ``call`` is not a valid function call item.
        """
        with self._lock:
            call_id = call["call_id"]
            index = self._index_of_call_locked(call_id)
            record = self._provisional.get(response_key)
            if record is not None:
                if index is not None and self._buffer[index]["id"] in record.item_ids:
                    record.item_ids.remove(self._buffer[index]["id"])
                if call_id in record.added_calls:
                    record.added_calls.remove(call_id)
                if not record.item_ids and not record.added_calls and not record.consumed_calls:
                    del self._provisional[response_key]
            if index is not None or call_id in self._pending_calls:
                return  # permanent now (in the buffer, or evicted from it while it waits for its output)
            logger.info("function_call %s was rolled back before it reached the client; written again", call_id)
            self._add_locked(call, None)
            self._enforce_hard_cap_locked()

    def finalize_provisional_generation(self, response_key: str) -> None:
        """Make ``response_key``'s provisional items permanent (they stay; nothing to roll back)."""
        with self._lock:
            self._provisional.pop(response_key, None)

    def rollback_provisional_generation(self, response_key: str) -> None:
        """Remove exactly the items written provisionally under ``response_key``.

        Their calls leave the pending-calls map, calls their outputs had answered become pending
        again, and outputs later added for the removed calls are dropped too. Items added by anyone
        else meanwhile stay. Unknown or finalized keys are a no-op.
        """
        with self._lock:
            self._rollback_locked(response_key)

    def cancel_provisional_generation(self, response_key: str) -> None:
        """Roll back ``response_key`` and leave a tombstone so a later add for it returns ``None``.

        Only the newest :data:`MAX_TOMBSTONES` tombstones are kept.
        """
        with self._lock:
            self._rollback_locked(response_key)
            self._tombstones.pop(response_key, None)
            self._tombstones[response_key] = None
            while len(self._tombstones) > MAX_TOMBSTONES:
                self._tombstones.popitem(last=False)

    def copy_without_provisional_generation(self, response_key: str) -> Chat:
        """An independent copy of this chat without ``response_key``'s provisional items.

        The copy has the same size, system prompt, pending calls, tombstones and the other keys'
        provisional records, but no compactor (it never starts background work) and shares no state.
        """
        with self._lock:
            clone = Chat(self.size, self.system_prompt)
            clone._buffer = copy.deepcopy(self._buffer)
            clone._pending_calls = copy.deepcopy(self._pending_calls)
            clone._provisional = copy.deepcopy(self._provisional)
            clone._tombstones = OrderedDict(self._tombstones)
            clone._rollback_locked(response_key)
            return clone

    # ------------------------------------------------------------------ bounds

    def trim_if_needed(self) -> None:
        """Bring the history back to ``size`` user turns; call after each successful response.

        Without a compactor (or once closed), evicts the oldest whole turns synchronously, then drops
        ``function_call_output`` items whose call is gone. With a compactor, starts a background
        summary of the turns before the newest user message (and before any provisional item) instead,
        if at least two turns are there; nothing happens while a compaction is already in flight.
        """
        with self._lock:
            if self._user_turns_locked() <= self.size:
                return
            if self.compactor is None or self._closed:
                while self._user_turns_locked() > self.size:
                    self._evict_oldest_turn_locked()
                self._drop_orphan_outputs_locked()
                return
            if self._compaction_gen == self._gen:
                logger.debug("history compaction already in flight; skipped")
                return
            job = self._snapshot_for_compaction_locked()
            if job is None:
                return
            self._compaction_gen = job.gen
            self._workers += 1
            compactor = self.compactor
        worker = threading.Thread(
            target=self._compact_worker, args=(job, compactor), name="chat-compaction", daemon=True
        )
        try:
            worker.start()
        except BaseException:
            with self._lock:
                self._finish_worker_locked(job.gen)
            raise

    def wait_for_compaction(self, timeout: float | None = None) -> bool:
        """Wait until no compaction thread is running.

        Args:
            timeout: seconds to wait at most (None: no limit).

        Returns:
            True if none is running (any more), False on timeout.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._workers == 0, timeout)

    def compact_audio_history(self, max_audio_turns: int) -> None:
        """Keep audio only in the newest ``max_audio_turns`` user messages that have audio.

        In older user messages every ``input_audio`` part becomes ``{"type": "input_text", "text": t}``
        where ``t`` is its transcript, or :data:`EARLIER_AUDIO_PLACEHOLDER` without one. Items, roles
        and order are unchanged.

        Raises:
            ValueError: if ``max_audio_turns`` < 0.
        """
        self._compact_parts("input_audio", max_audio_turns, audio_to_text)

    def compact_image_history(self, max_image_turns: int) -> None:
        """Keep images only in the newest ``max_image_turns`` user messages that have one; in older
        ones every ``input_image`` part becomes the text :data:`EARLIER_IMAGE_PLACEHOLDER`.

        Raises:
            ValueError: if ``max_image_turns`` < 0.
        """
        self._compact_parts("input_image", max_image_turns, image_to_text)

    def _compact_parts(self, kind: str, keep: int, to_text: Callable[[dict], dict]) -> None:
        with self._lock:
            compact_parts(self._buffer, kind, keep, to_text)

    # ------------------------------------------------------------------ editing

    def replace_user_message_text(self, item_id: str, text: str) -> bool:
        """Replace the text of the user message ``item_id`` (e.g. with a better transcript).

        A string content becomes ``text``. In a list content the text parts are replaced by one
        ``input_text`` part (where the first one was) and audio parts get ``text`` as their transcript;
        a list with neither gets an ``input_text`` part appended.

        Returns:
            True if the message was found and edited, False if there is no user message ``item_id``.
        """
        with self._lock:
            for index, item in enumerate(self._buffer):
                if item.get("id") == item_id and is_user_message(item):
                    self._buffer[index] = {**item, "content": replace_text(item["content"], text)}
                    return True
            return False

    def replace_assistant_message_text(self, item_id: str, text: str) -> bool:
        """Replace the text of the assistant message ``item_id`` (e.g. cut to what was heard).

        Returns:
            True if the message was found and edited, False if there is no assistant message ``item_id``.
        """
        with self._lock:
            for index, item in enumerate(self._buffer):
                if item.get("id") == item_id and item.get("type") == "message" and item.get("role") == "assistant":
                    self._buffer[index] = {**item, "content": text}
                    return True
            return False

    def remove_message(self, item_id: str, role: str = "user") -> bool:
        """Remove the ``role`` message ``item_id`` (withdraw a speculative user turn, or a reply the
        user never heard to words they went on from).

        Returns:
            True if it was removed, False if there is no ``role`` message ``item_id``.
        """
        with self._lock:
            for index, item in enumerate(self._buffer):
                if item.get("id") == item_id and item.get("type") == "message" and item.get("role") == role:
                    del self._buffer[index]
                    for record in self._provisional.values():
                        if item_id in record.item_ids:
                            record.item_ids.remove(item_id)
                    return True
            return False

    # ------------------------------------------------------------------ life cycle

    def reset(self) -> None:
        """Forget all items, pending calls and provisional records (the system prompt stays).

        Bumps the generation, so a compaction in flight is discarded. Tombstones are kept, so a late
        write for a cancelled response is still refused.
        """
        with self._lock:
            self._buffer = []
            self._pending_calls = OrderedDict()
            self._provisional = {}
            self._gen += 1
            self._compaction_gen = None

    def close(self) -> None:
        """Discard any compaction in flight and start no new one (bumps the generation).

        The history stays usable; :meth:`trim_if_needed` evicts synchronously from now on.
        """
        with self._lock:
            self._closed = True
            self._gen += 1
            self._compaction_gen = None

    # ------------------------------------------------------------------ internals (lock held)

    def _user_turns_locked(self) -> int:
        return sum(1 for item in self._buffer if is_user_message(item))

    def _index_of_call_locked(self, call_id: str) -> int | None:
        for index, item in enumerate(self._buffer):
            if item["type"] == "function_call" and item["call_id"] == call_id:
                return index
        return None

    def _has_output_locked(self, call_id: str) -> bool:
        return any(item["type"] == "function_call_output" and item["call_id"] == call_id for item in self._buffer)

    def _add_locked(self, item: dict, record: _Provisional | None) -> Item:
        stored = validated_copy(item)
        if any(existing["id"] == stored["id"] for existing in self._buffer):
            raise ChatItemError(f"an item with id {stored['id']!r} is already in the history")
        kind = stored["type"]
        if kind == "function_call":
            call_id = stored["call_id"]
            if call_id in self._pending_calls or self._index_of_call_locked(call_id) is not None:
                raise ChatItemError(f"a function_call with call_id {call_id!r} already exists")
            self._buffer.append(stored)
            self._remember_call_locked(stored)
            if record is not None:
                record.item_ids.append(stored["id"])
                record.added_calls.append(call_id)
            return stored
        if kind == "function_call_output":
            call_id = stored["call_id"]
            in_buffer = self._index_of_call_locked(call_id) is not None
            if in_buffer and self._has_output_locked(call_id):
                raise ChatItemError(f"the function_call {call_id!r} already has an output")
            if not in_buffer and call_id not in self._pending_calls:
                raise ChatItemError(f"no function_call with call_id {call_id!r} found")
            call = self._pending_calls.pop(call_id, None)
            if record is not None and call is not None and call_id not in record.added_calls:
                record.consumed_calls[call_id] = call
            if not in_buffer:
                assert call is not None
                logger.info("re-injecting evicted function_call %s (%s)", call_id, call.get("name"))
                reinjected = copy.deepcopy(call)
                if any(existing["id"] == reinjected["id"] for existing in self._buffer):
                    reinjected["id"] = new_item_id()
                self._buffer.append(reinjected)
                if record is not None:
                    record.item_ids.append(reinjected["id"])
            self._buffer.append(stored)
            if record is not None:
                record.item_ids.append(stored["id"])
            return stored
        self._buffer.append(stored)
        if record is not None:
            record.item_ids.append(stored["id"])
        return stored

    def _remember_call_locked(self, call: Item) -> None:
        self._pending_calls[call["call_id"]] = copy.deepcopy(call)
        while len(self._pending_calls) > MAX_PENDING_CALLS:
            self._pending_calls.popitem(last=False)

    def _enforce_hard_cap_locked(self) -> None:
        limit = 2 * self.size
        if self._user_turns_locked() <= limit:
            return
        logger.warning("history over the hard cap of %d user turns; evicting the oldest", limit)
        while self._user_turns_locked() > limit:
            self._evict_oldest_turn_locked()
        self._drop_orphan_outputs_locked()

    def _evict_oldest_turn_locked(self) -> None:
        """Delete everything up to (not including) the second user message: the oldest whole turn
        together with any items before the first user message."""
        seen_user = False
        end = len(self._buffer)
        for index, item in enumerate(self._buffer):
            if is_user_message(item):
                if seen_user:
                    end = index
                    break
                seen_user = True
        del self._buffer[:end]

    def _drop_orphan_outputs_locked(self) -> None:
        calls = {item["call_id"] for item in self._buffer if item["type"] == "function_call"}
        self._buffer = [
            item for item in self._buffer if item["type"] != "function_call_output" or item["call_id"] in calls
        ]

    def _rollback_locked(self, response_key: str) -> None:
        record = self._provisional.pop(response_key, None)
        if record is None:
            return
        ids = set(record.item_ids)
        self._buffer = [item for item in self._buffer if item["id"] not in ids]
        for call_id in record.added_calls:
            self._pending_calls.pop(call_id, None)
        for call_id, call in record.consumed_calls.items():
            if not self._has_output_locked(call_id):
                self._remember_call_locked(call)
        self._drop_orphan_outputs_locked()

    def _snapshot_for_compaction_locked(self) -> _CompactionJob | None:
        user_indexes = [index for index, item in enumerate(self._buffer) if is_user_message(item)]
        if not user_indexes:
            return None
        end = user_indexes[-1]  # the newest user turn is never compacted
        provisional_ids = {item_id for record in self._provisional.values() for item_id in record.item_ids}
        for index, item in enumerate(self._buffer[:end]):
            if item["id"] in provisional_ids:
                end = index  # nor is anything a response may still roll back
                break
        span = self._buffer[:end]
        if sum(1 for item in span if is_user_message(item)) < 2:
            return None
        return _CompactionJob(self._gen, {item["id"] for item in span}, copy.deepcopy(span))

    def _finish_worker_locked(self, gen: int) -> None:
        if self._compaction_gen == gen:
            self._compaction_gen = None
        self._workers -= 1
        self._idle.notify_all()

    def _compact_worker(self, job: _CompactionJob, compactor: Compactor) -> None:
        try:
            with self._lock:
                if self._gen != job.gen:
                    return
            try:
                summary = compactor(job.items)
            except Exception:
                logger.exception("history compaction failed; history left unchanged")
                return
            with self._lock:
                if self._gen != job.gen:
                    logger.debug("history compaction result discarded (history was reset or closed)")
                    return
                if not valid_summary(summary):
                    logger.error("history compaction returned %r, not two non-empty strings; ignored", summary)
                    return
                self._apply_compaction_locked(job, summary)
        finally:
            with self._lock:
                self._finish_worker_locked(job.gen)

    def _apply_compaction_locked(self, job: _CompactionJob, summary: tuple[str, str]) -> None:
        """Replace exactly the summarised items with one user/assistant summary pair at the front.

        A summarised ``function_call`` whose output lies outside the summarised items stays (after the
        pair), so the output keeps its call. Summarised calls still without output are dropped from the
        buffer only; they stay in the pending-calls map and are re-injected when their output arrives.
        """
        outputs_outside = {
            item["call_id"]
            for item in self._buffer
            if item["type"] == "function_call_output" and item["id"] not in job.item_ids
        }
        kept: list[Item] = []
        rest: list[Item] = []
        for item in self._buffer:
            if item["id"] not in job.item_ids:
                rest.append(item)
            elif item["type"] == "function_call" and item["call_id"] in outputs_outside:
                kept.append(item)
        user_text, assistant_text = summary
        pair = [
            {"id": new_item_id(), "type": "message", "role": "user", "content": user_text},
            {"id": new_item_id(), "type": "message", "role": "assistant", "content": assistant_text},
        ]
        self._buffer = pair + kept + rest
        logger.info("history compacted: %d items summarised", len(job.item_ids))
