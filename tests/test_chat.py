"""The conversation history: bounds, function-call pairing, transactions, compaction, serialisation."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from speech_to_speech.llm.chat import MAX_TOMBSTONES, Chat
from speech_to_speech.llm.items import EARLIER_AUDIO_PLACEHOLDER, ChatItemError
from speech_to_speech.llm.serialize import to_chat_messages, to_responses_input

WAIT = 5.0  # seconds; only ever an upper bound on waiting for an Event or a worker


def user(text: str, item_id: str | None = None) -> dict:
    item = {"type": "message", "role": "user", "content": text}
    if item_id is not None:
        item["id"] = item_id
    return item


def assistant(text: str, item_id: str | None = None) -> dict:
    item = {"type": "message", "role": "assistant", "content": text}
    if item_id is not None:
        item["id"] = item_id
    return item


def call(call_id: str, name: str = "get_weather", arguments: dict | None = None) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments or {})}


def output(call_id: str, text: str = "ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def audio_user(transcript: str | None, audio: str = "UklGRg==") -> dict:
    part: dict = {"type": "input_audio", "audio": audio}
    if transcript is not None:
        part["transcript"] = transcript
    return {"type": "message", "role": "user", "content": [part]}


def texts(chat: Chat) -> list[str]:
    """A compact view of the history: message content, or ``fc:<call_id>`` / ``fco:<call_id>``."""
    view = []
    for item in chat.items():
        if item["type"] == "message":
            view.append(item["content"])
        elif item["type"] == "function_call":
            view.append(f"fc:{item['call_id']}")
        else:
            view.append(f"fco:{item['call_id']}")
    return view


def fill(chat: Chat, turns: int, start: int = 1) -> None:
    for n in range(start, start + turns):
        chat.add_item(user(f"u{n}"))
        chat.add_item(assistant(f"a{n}"))


# ---------------------------------------------------------------------- basics


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Chat(size=0)


def test_add_item_assigns_id_and_returns_stored_copy() -> None:
    chat = Chat(system_prompt="be brief")
    stored = chat.add_item(user("hello"))
    assert stored["id"].startswith("item_") and len(stored["id"]) == len("item_") + 32
    assert chat.items() == [stored]
    stored["content"] = "mutated"
    chat.items()[0]["content"] = "mutated too"
    assert chat.items()[0]["content"] == "hello"
    assert chat.add_item(user("again", item_id="mine"))["id"] == "mine"
    assert chat.system_prompt == "be brief"
    assert all(item["role"] != "system" for item in chat.items())


def test_add_item_does_not_alias_the_callers_dict() -> None:
    chat = Chat()
    item = audio_user("hi")
    chat.add_item(item)
    item["content"][0]["transcript"] = "changed"
    assert chat.items()[0]["content"][0]["transcript"] == "hi"


@pytest.mark.parametrize(
    "item",
    [
        {"type": "bogus"},
        {"type": "message", "role": "robot", "content": "x"},
        {"type": "message", "role": "user", "content": 3},
        {"type": "message", "role": "user", "content": [{"type": "input_image", "url": "x"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_audio"}]},
        {"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": 3},
    ],
)
def test_malformed_items_are_refused(item: dict) -> None:
    chat = Chat()
    chat.add_item(call("c"))
    before = chat.items()
    with pytest.raises(ChatItemError):
        chat.add_item(item)
    assert chat.items() == before


def test_duplicate_ids_and_call_ids_are_refused() -> None:
    chat = Chat()
    chat.add_item(user("u", item_id="x"))
    with pytest.raises(ChatItemError):
        chat.add_item(assistant("a", item_id="x"))
    chat.add_item(call("c1"))
    with pytest.raises(ChatItemError):
        chat.add_item(call("c1"))
    assert isinstance(ChatItemError("x"), ValueError)


def test_user_turns_counts_user_messages() -> None:
    chat = Chat()
    chat.add_item(assistant("greeting"))
    assert chat.user_turns == 0
    fill(chat, 3)
    chat.add_item({"type": "message", "role": "system", "content": "note"})
    assert chat.user_turns == 3


# ---------------------------------------------------------------------- bounds


def test_trim_without_compactor_evicts_oldest_whole_turns() -> None:
    chat = Chat(size=2)
    chat.add_item(user("u1"))
    chat.add_item(assistant("a1"))
    chat.add_item(call("c1"))
    chat.add_item(output("c1"))
    chat.add_item(assistant("a1b"))
    fill(chat, 2, start=2)
    assert chat.user_turns == 3  # add_item does not apply the soft bound
    chat.trim_if_needed()
    assert texts(chat) == ["u2", "a2", "u3", "a3"]
    chat.trim_if_needed()  # within bounds: no-op
    assert texts(chat) == ["u2", "a2", "u3", "a3"]


def test_eviction_drops_outputs_whose_call_is_gone() -> None:
    chat = Chat(size=1)
    chat.add_item(user("u1"))
    chat.add_item(call("c1"))
    chat.add_item(user("u2"))
    chat.add_item(output("c1", "sunny"))  # the output arrives in the next turn
    chat.add_item(assistant("a2"))
    chat.trim_if_needed()
    assert texts(chat) == ["u2", "a2"]


def test_eviction_also_drops_items_before_the_first_user_message() -> None:
    chat = Chat(size=1)
    chat.add_item(assistant("hello, how can I help?"))
    fill(chat, 2)
    chat.trim_if_needed()
    assert texts(chat) == ["u2", "a2"]


def test_hard_cap_evicts_inline_at_twice_the_size(caplog: pytest.LogCaptureFixture) -> None:
    chat = Chat(size=2)
    fill(chat, 4)
    assert chat.user_turns == 4
    with caplog.at_level(logging.WARNING, logger="speech_to_speech.llm.chat"):
        chat.add_item(user("u5"))
    assert chat.user_turns == 4
    assert texts(chat) == ["u2", "a2", "u3", "a3", "u4", "a4", "u5"]
    for n in range(6, 30):
        chat.add_item(user(f"u{n}"))
        assert chat.user_turns <= 4
    assert texts(chat)[-1] == "u29"


# ---------------------------------------------------------------------- function-call pairing


def test_output_for_a_call_in_history_is_appended() -> None:
    chat = Chat()
    chat.add_item(user("weather?"))
    chat.add_item(call("c1"))
    stored = chat.append_tool_output("c1", "sunny")
    assert stored["type"] == "function_call_output" and stored["output"] == "sunny"
    assert texts(chat) == ["weather?", "fc:c1", "fco:c1"]


def test_output_for_an_unknown_call_raises() -> None:
    chat = Chat()
    chat.add_item(user("hi"))
    with pytest.raises(ChatItemError):
        chat.append_tool_output("nope", "x")
    assert texts(chat) == ["hi"]


def test_second_output_for_the_same_call_raises() -> None:
    chat = Chat()
    chat.add_item(call("c1"))
    chat.append_tool_output("c1", "x")
    with pytest.raises(ChatItemError):
        chat.append_tool_output("c1", "y")


def test_output_for_an_evicted_call_reinjects_the_call(caplog: pytest.LogCaptureFixture) -> None:
    chat = Chat(size=1)
    chat.add_item(user("u1"))
    chat.add_item(call("c1", arguments={"city": "Paris"}))
    fill(chat, 1, start=2)
    chat.trim_if_needed()
    assert texts(chat) == ["u2", "a2"]
    with caplog.at_level(logging.INFO, logger="speech_to_speech.llm.chat"):
        chat.append_tool_output("c1", "sunny")
    assert "re-injecting evicted function_call" in caplog.text
    items = chat.items()
    assert texts(chat) == ["u2", "a2", "fc:c1", "fco:c1"]
    assert json.loads(items[2]["arguments"]) == {"city": "Paris"}
    with pytest.raises(ChatItemError):  # answered now: not pending any more
        chat.append_tool_output("c1", "again")


# ---------------------------------------------------------------------- transactions


def test_provisional_items_are_written_and_finalized() -> None:
    chat = Chat()
    chat.add_item(user("weather?"))
    first = chat.add_provisional_generation_items("r1", [call("c1")])
    assert first is not None and first[0]["id"].startswith("item_")
    chat.append_tool_output("c1", "sunny")
    chat.add_provisional_generation_items("r1", [assistant("It is sunny.")])
    chat.finalize_provisional_generation("r1")
    chat.rollback_provisional_generation("r1")  # nothing provisional any more: no-op
    assert texts(chat) == ["weather?", "fc:c1", "fco:c1", "It is sunny."]


def test_provisional_write_is_all_or_nothing() -> None:
    chat = Chat()
    chat.add_item(user("u1"))
    chat.add_item(call("c0"))
    chat.add_provisional_generation_items("r1", [assistant("earlier, provisional")])
    before = chat.items()
    batch = [call("c1"), output("c1"), output("unknown"), output("c0"), assistant("never")]
    with pytest.raises(ChatItemError):
        chat.add_provisional_generation_items("r1", batch)
    assert chat.items() == before
    # the pending calls are restored too: c1 was never added, c0 still awaits its output
    with pytest.raises(ChatItemError):
        chat.append_tool_output("c1", "x")
    chat.append_tool_output("c0", "fine")
    # and so is r1's provisional record: rolling back removes only its first item
    chat.rollback_provisional_generation("r1")
    assert texts(chat) == ["u1", "fc:c0", "fco:c0"]


def test_rollback_restores_history_exactly() -> None:
    chat = Chat()
    fill(chat, 1)
    chat.add_item(user("u2"))
    chat.add_item(call("c0"))
    before = chat.items()
    chat.add_provisional_generation_items("r2", [call("c1"), output("c1", "sunny")])
    chat.add_provisional_generation_items("r2", [output("c0", "done"), assistant("It is sunny.")])
    assert len(chat.items()) == len(before) + 4
    chat.rollback_provisional_generation("r2")
    assert chat.items() == before
    # c1 is forgotten, c0 is pending again
    with pytest.raises(ChatItemError):
        chat.append_tool_output("c1", "x")
    chat.append_tool_output("c0", "done")


def test_rollback_makes_an_answered_call_pending_again() -> None:
    chat = Chat(size=1)
    chat.add_item(user("u1"))
    chat.add_item(call("c1"))
    chat.add_provisional_generation_items("r1", [output("c1", "provisional answer")])
    chat.rollback_provisional_generation("r1")
    fill(chat, 1, start=2)
    chat.trim_if_needed()  # evicts u1 and the call
    assert texts(chat) == ["u2", "a2"]
    chat.append_tool_output("c1", "real answer")  # still pending: re-injected
    assert texts(chat) == ["u2", "a2", "fc:c1", "fco:c1"]


def test_rollback_keeps_items_added_meanwhile_and_drops_outputs_of_rolled_back_calls() -> None:
    chat = Chat()
    chat.add_item(user("u1"))
    chat.add_provisional_generation_items("r1", [call("c1")])
    chat.append_tool_output("c1", "client answered")  # not part of r1
    chat.add_item(user("u2"))
    chat.rollback_provisional_generation("r1")
    assert texts(chat) == ["u1", "u2"]


def test_rollback_of_one_key_leaves_other_keys() -> None:
    chat = Chat()
    chat.add_item(user("u1"))
    chat.add_provisional_generation_items("a", [assistant("from a")])
    chat.add_provisional_generation_items("b", [assistant("from b")])
    chat.rollback_provisional_generation("a")
    assert texts(chat) == ["u1", "from b"]
    chat.rollback_provisional_generation("b")
    assert texts(chat) == ["u1"]


def test_cancel_rolls_back_and_tombstones_the_key() -> None:
    chat = Chat()
    chat.add_item(user("u1"))
    before = chat.items()
    chat.add_provisional_generation_items("r1", [assistant("partial")])
    chat.cancel_provisional_generation("r1")
    assert chat.items() == before
    assert chat.add_provisional_generation_items("r1", [assistant("late")]) is None
    assert chat.items() == before
    # a cancel that arrives before any write also refuses it
    chat.cancel_provisional_generation("r2")
    assert chat.add_provisional_generation_items("r2", [call("c9")]) is None
    assert chat.items() == before
    with pytest.raises(ChatItemError):
        chat.append_tool_output("c9", "x")


def test_tombstones_are_bounded_to_the_newest() -> None:
    chat = Chat()
    for n in range(MAX_TOMBSTONES + 1):
        chat.cancel_provisional_generation(f"r{n}")
    assert chat.add_provisional_generation_items("r0", [assistant("oldest forgotten")]) is not None
    assert chat.add_provisional_generation_items("r1", [assistant("still cancelled")]) is None
    assert chat.add_provisional_generation_items(f"r{MAX_TOMBSTONES}", [assistant("x")]) is None
    assert texts(chat) == ["oldest forgotten"]


def test_copy_without_provisional_generation_is_independent() -> None:
    chat = Chat(size=3, system_prompt="sys")
    chat.add_item(user("u1"))
    chat.add_provisional_generation_items("r1", [call("c1"), assistant("provisional")])
    copied = chat.copy_without_provisional_generation("r1")
    assert texts(copied) == ["u1"]
    assert copied.system_prompt == "sys" and copied.size == 3
    assert texts(chat) == ["u1", "fc:c1", "provisional"]
    copied.add_item(user("only in the copy"))
    chat.add_item(user("only in the original"))
    assert texts(copied) == ["u1", "only in the copy"]
    assert texts(chat)[-1] == "only in the original"
    with pytest.raises(ChatItemError):  # r1's call is not in the copy
        copied.append_tool_output("c1", "x")
    chat.append_tool_output("c1", "x")


# ---------------------------------------------------------------------- background compaction


class RecordingCompactor:
    """Summarises to fixed texts, records what it saw and on which thread, optionally blocking."""

    def __init__(self, block: threading.Event | None = None, error: Exception | None = None) -> None:
        self.block = block
        self.error = error
        self.calls: list[list[dict]] = []
        self.threads: list[threading.Thread] = []
        self.entered = threading.Event()

    def __call__(self, items: list[dict]) -> tuple[str, str]:
        self.calls.append(items)
        self.threads.append(threading.current_thread())
        self.entered.set()
        if self.block is not None:
            assert self.block.wait(WAIT)
        if self.error is not None:
            raise self.error
        return "summary of earlier turns (user)", "summary of earlier turns (assistant)"


def test_compaction_splices_a_summary_pair_and_keeps_the_newest_turn() -> None:
    compactor = RecordingCompactor()
    chat = Chat(size=2, compactor=compactor)
    fill(chat, 3)
    chat.trim_if_needed()
    assert chat.wait_for_compaction(WAIT)
    assert len(compactor.calls) == 1
    assert compactor.threads[0] is not threading.main_thread()
    assert [item["content"] for item in compactor.calls[0]] == ["u1", "a1", "u2", "a2"]
    items = chat.items()
    assert [(item["role"], item["content"]) for item in items] == [
        ("user", "summary of earlier turns (user)"),
        ("assistant", "summary of earlier turns (assistant)"),
        ("user", "u3"),
        ("assistant", "a3"),
    ]
    assert all(item["id"].startswith("item_") for item in items)
    assert chat.user_turns == 2


def test_compaction_never_splits_a_call_from_its_output() -> None:
    compactor = RecordingCompactor()
    chat = Chat(size=2, compactor=compactor)
    chat.add_item(user("u1"))
    chat.add_item(call("inside"))
    chat.add_item(output("inside"))
    chat.add_item(assistant("a1"))
    chat.add_item(user("u2"))
    chat.add_item(call("straddles"))
    chat.add_item(call("pending"))
    chat.add_item(user("u3"))
    chat.add_item(output("straddles", "late result"))
    chat.add_item(assistant("a3"))
    chat.trim_if_needed()
    assert chat.wait_for_compaction(WAIT)
    summarised = [item.get("call_id", item.get("content")) for item in compactor.calls[0]]
    assert summarised == ["u1", "inside", "inside", "a1", "u2", "straddles", "pending"]
    assert texts(chat) == [
        "summary of earlier turns (user)",
        "summary of earlier turns (assistant)",
        "fc:straddles",
        "u3",
        "fco:straddles",
        "a3",
    ]
    # the summarised, still unanswered call is re-injected when its output comes
    chat.append_tool_output("pending", "finally")
    assert texts(chat)[-2:] == ["fc:pending", "fco:pending"]


def test_compaction_keeps_items_added_while_it_runs() -> None:
    release = threading.Event()
    compactor = RecordingCompactor(block=release)
    chat = Chat(size=2, compactor=compactor)
    fill(chat, 3)
    chat.trim_if_needed()
    assert compactor.entered.wait(WAIT)
    fill(chat, 1, start=4)
    release.set()
    assert chat.wait_for_compaction(WAIT)
    assert texts(chat) == [
        "summary of earlier turns (user)",
        "summary of earlier turns (assistant)",
        "u3",
        "a3",
        "u4",
        "a4",
    ]


def test_compaction_is_single_flight() -> None:
    release = threading.Event()
    compactor = RecordingCompactor(block=release)
    chat = Chat(size=2, compactor=compactor)
    fill(chat, 3)
    chat.trim_if_needed()
    assert compactor.entered.wait(WAIT)
    fill(chat, 1, start=4)
    chat.trim_if_needed()  # skipped: one is in flight
    chat.trim_if_needed()
    assert not chat.wait_for_compaction(0.01)
    release.set()
    assert chat.wait_for_compaction(WAIT)
    assert len(compactor.calls) == 1
    # once finished, a new trigger compacts again (the first summary is summarised in turn)
    chat.trim_if_needed()
    assert chat.wait_for_compaction(WAIT)
    assert len(compactor.calls) == 2
    assert compactor.calls[1][0]["content"] == "summary of earlier turns (user)"


def test_compaction_result_is_discarded_after_reset() -> None:
    reset_done = threading.Event()
    compactor = RecordingCompactor(block=reset_done)
    chat = Chat(size=2, compactor=compactor)
    fill(chat, 3)
    chat.trim_if_needed()
    assert compactor.entered.wait(WAIT)
    chat.reset()
    chat.add_item(user("fresh"))
    reset_done.set()
    assert chat.wait_for_compaction(WAIT)
    assert len(compactor.calls) == 1
    assert texts(chat) == ["fresh"]


def test_compaction_result_is_discarded_after_close() -> None:
    closed = threading.Event()
    compactor = RecordingCompactor(block=closed)
    chat = Chat(size=2, compactor=compactor)
    fill(chat, 3)
    before = chat.items()
    chat.trim_if_needed()
    assert compactor.entered.wait(WAIT)
    chat.close()
    closed.set()
    assert chat.wait_for_compaction(WAIT)
    assert chat.items() == before
    # closed: no new background work, trimming evicts synchronously instead
    chat.trim_if_needed()
    assert chat.wait_for_compaction(0)
    assert len(compactor.calls) == 1
    assert texts(chat) == ["u2", "a2", "u3", "a3"]


def test_compactor_error_leaves_history_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    compactor = RecordingCompactor(error=RuntimeError("provider down"))
    chat = Chat(size=2, compactor=compactor)
    fill(chat, 3)
    before = chat.items()
    with caplog.at_level(logging.ERROR, logger="speech_to_speech.llm.chat"):
        chat.trim_if_needed()
        assert chat.wait_for_compaction(WAIT)
    assert chat.items() == before
    assert "compaction failed" in caplog.text
    chat.trim_if_needed()  # not stuck in flight: it tries again
    assert chat.wait_for_compaction(WAIT)
    assert len(compactor.calls) == 2


def test_compaction_needs_two_older_turns_and_skips_provisional_items() -> None:
    compactor = RecordingCompactor()
    chat = Chat(size=1, compactor=compactor)
    fill(chat, 2)
    chat.trim_if_needed()  # only one turn before the newest: nothing to compact
    assert chat.wait_for_compaction(WAIT)
    assert compactor.calls == []
    chat = Chat(size=1, compactor=compactor)
    chat.add_item(user("u1"))
    chat.add_provisional_generation_items("r1", [assistant("still in flight")])
    fill(chat, 2, start=2)
    chat.trim_if_needed()  # a provisional item in turn 1 cuts the range to one turn
    assert chat.wait_for_compaction(WAIT)
    assert compactor.calls == []


# ---------------------------------------------------------------------- audio, edits, reset


def test_compact_audio_history_keeps_audio_only_in_the_newest_turns() -> None:
    chat = Chat()
    chat.add_item(audio_user("first words"))
    chat.add_item(assistant("a1"))
    chat.add_item(audio_user(None))
    chat.add_item(assistant("a2"))
    chat.add_item(user("typed"))
    chat.add_item(audio_user("latest"))
    chat.add_item(assistant("a4"))
    before = chat.items()
    chat.compact_audio_history(1)
    items = chat.items()
    assert [(i["id"], i["role"]) for i in items] == [(i["id"], i["role"]) for i in before]
    assert items[0]["content"] == [{"type": "input_text", "text": "first words"}]
    assert items[2]["content"] == [{"type": "input_text", "text": EARLIER_AUDIO_PLACEHOLDER}]
    assert items[4]["content"] == "typed"
    assert items[5]["content"] == before[5]["content"]
    chat.compact_audio_history(0)
    assert chat.items()[5]["content"] == [{"type": "input_text", "text": "latest"}]
    with pytest.raises(ValueError):
        chat.compact_audio_history(-1)


def test_replace_user_message_text() -> None:
    chat = Chat()
    first = chat.add_item(user("what's the wether"))
    spoken = chat.add_item(audio_user("whats"))
    reply = chat.add_item(assistant("a"))
    assert chat.replace_user_message_text(first["id"], "what's the weather in Paris")
    assert chat.replace_user_message_text(spoken["id"], "what's up")
    assert not chat.replace_user_message_text(reply["id"], "not a user message")
    assert not chat.replace_user_message_text("missing", "x")
    items = chat.items()
    assert items[0]["content"] == "what's the weather in Paris"
    assert items[1]["content"][0]["transcript"] == "what's up"
    assert items[1]["content"][0]["audio"] == "UklGRg=="
    assert items[2]["content"] == "a"


def test_remove_message_removes_only_a_message_of_its_role() -> None:
    chat = Chat()
    kept = chat.add_item(user("keep"))
    speculative = chat.add_item(user("speculative"))
    reply = chat.add_item(assistant("a"))
    assert chat.remove_message(speculative["id"])
    assert not chat.remove_message(speculative["id"])
    assert not chat.remove_message(reply["id"])
    assert [item["id"] for item in chat.items()] == [kept["id"], reply["id"]]
    assert chat.user_turns == 1
    assert not chat.remove_message(kept["id"], role="assistant")
    assert chat.remove_message(reply["id"], role="assistant")
    assert [item["id"] for item in chat.items()] == [kept["id"]]


def test_reset_clears_items_and_pending_calls_but_keeps_prompt_and_tombstones() -> None:
    chat = Chat(system_prompt="sys")
    fill(chat, 2)
    chat.add_item(call("c1"))
    chat.add_provisional_generation_items("r1", [assistant("x")])
    chat.cancel_provisional_generation("gone")
    chat.reset()
    assert chat.items() == [] and chat.user_turns == 0
    assert chat.system_prompt == "sys"
    with pytest.raises(ChatItemError):
        chat.append_tool_output("c1", "x")
    assert chat.add_provisional_generation_items("gone", [assistant("late")]) is None
    chat.rollback_provisional_generation("r1")  # forgotten: no-op
    assert chat.items() == []


def test_concurrent_writers_keep_the_history_consistent() -> None:
    chat = Chat(size=4)
    errors: list[BaseException] = []

    def writer(tag: str) -> None:
        try:
            for n in range(200):
                chat.add_item(user(f"{tag}{n}"))
                chat.add_provisional_generation_items(f"{tag}{n}", [call(f"{tag}c{n}"), output(f"{tag}c{n}")])
                if n % 2:
                    chat.rollback_provisional_generation(f"{tag}{n}")
                else:
                    chat.finalize_provisional_generation(f"{tag}{n}")
                chat.trim_if_needed()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 6)
    assert errors == []
    assert chat.user_turns <= 4
    items = chat.items()
    calls = [item["call_id"] for item in items if item["type"] == "function_call"]
    outputs = [item["call_id"] for item in items if item["type"] == "function_call_output"]
    assert set(outputs) <= set(calls)
    assert len({item["id"] for item in items}) == len(items)


# ---------------------------------------------------------------------- serialisation


def test_to_chat_messages_shapes() -> None:
    items = [
        user("weather in Paris and Rome?"),
        assistant("Let me check."),
        call("c1", arguments={"city": "Paris"}),
        call("c2", arguments={"city": "Rome"}),
        output("c1", "sunny"),
        output("c2", "rain"),
        assistant("Paris is sunny, Rome rainy."),
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_audio", "audio": "AAAA", "transcript": "thanks"},
                {"type": "input_audio", "audio": "BBBB"},
                {"type": "input_text", "text": "typed"},
            ],
        },
        call("c3", name="wave"),
        output("c3", "done"),
    ]
    assert to_chat_messages("be brief", items) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Paris is sunny, Rome rainy."},
        {"role": "user", "content": "thanks\n[audio message]\ntyped"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "wave", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "done"},
    ]
    assert to_chat_messages("", [user("hi")]) == [{"role": "user", "content": "hi"}]


def test_to_chat_messages_moves_outputs_after_their_call_and_drops_unanswered() -> None:
    items = [user("u1"), call("c1"), call("never answered"), user("u2"), output("c1", "late"), output("orphan")]
    assert to_chat_messages("", items) == [
        {"role": "user", "content": "u1"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "late"},
        {"role": "user", "content": "u2"},
    ]
    kept = to_chat_messages("", items, drop_unanswered=False)
    assert [call["id"] for call in kept[1]["tool_calls"]] == ["c1", "never answered"]
    assert kept[-1] == {"role": "tool", "tool_call_id": "orphan", "content": "ok"}


def test_to_chat_messages_separates_sequential_tool_rounds() -> None:
    items = [user("u"), call("c1"), output("c1"), call("c2"), output("c2")]
    roles = [(m["role"], [c["id"] for c in m.get("tool_calls", [])]) for m in to_chat_messages("", items)]
    assert roles == [("user", []), ("assistant", ["c1"]), ("tool", []), ("assistant", ["c2"]), ("tool", [])]


def test_to_responses_input_shapes() -> None:
    chat = Chat()
    chat.add_item(user("weather?"))
    chat.add_item(call("c1", arguments={"city": "Paris"}))
    chat.add_item(output("c1", "sunny"))
    chat.add_item(assistant("Sunny."))
    chat.add_item({"type": "message", "role": "system", "content": "note"})
    chat.add_item(audio_user(None))
    chat.add_item(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "one"}, {"type": "output_text", "text": "two"}],
        }
    )
    chat.add_item(call("unanswered"))
    assert to_responses_input(chat.items()) == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "note"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[audio message]"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "one"}, {"type": "output_text", "text": "two"}],
        },
    ]
    assert to_responses_input(chat.items(), drop_unanswered=False)[-1] == {
        "type": "function_call",
        "call_id": "unanswered",
        "name": "get_weather",
        "arguments": "{}",
    }
