"""System prompts for the LLM stage, chat clean-up for local models, and language names.

Two system prompt builders, one per output channel:

* :func:`build_voice_system_prompt` for replies that will be spoken by the TTS stage.
* :func:`build_text_system_prompt` for replies that a client will only read.

Both put their parts in the same order: a short lead that says what kind of
conversation this is, then the session instructions (who the assistant is, plus
an optional block describing tools), then the channel's rules. The rules come
last on purpose: models weigh the end of a system prompt heavily, and the rules
on form (short, plain, speakable) are the constraints that must win over
anything a persona text says about style.

:func:`clean_messages_for_local_model` reshapes an OpenAI-style message list so
that strict local chat templates accept it (alternating roles, a user message
first), and :data:`INTERRUPTION_MARKER` is the note appended to an assistant
reply that the user cut short by barge-in.

:data:`WHISPER_LANGUAGES` maps every language code of the language list of
OpenAI's Whisper (the ``LANGUAGES`` table of its tokenizer, 100 codes as of
large-v3) to an English language name, and :func:`language_name` turns an STT
language code into the name used in the "reply in ..." rule.
"""

from __future__ import annotations

import copy
from typing import Any

Message = dict[str, Any]

#: Appended to the history copy of an assistant reply that was cut off by barge-in,
#: so the model knows the user did not hear the whole of it.
INTERRUPTION_MARKER = " [interrupted by the user]"

#: Content of the user message inserted when a conversation would otherwise start
#: with an assistant message (see :func:`clean_messages_for_local_model`).
PLACEHOLDER_USER_CONTENT = "Hello."

DEFAULT_VOICE_PERSONA = "You are a helpful, friendly voice assistant."
DEFAULT_TEXT_PERSONA = (
    "You are a helpful, friendly assistant. Help the user with whatever they ask, clearly and accurately."
)

# The voice prompt is kept short on purpose: every token of it is processed before the
# first word of every reply, which on a CPU is a large part of time to first audio.
# "your words are read aloud" made small models read the user's words back: the lead says who
# speaks to whom instead (measured with Qwen2.5-Coder-1.5B on spoken statements, temperature 0)
_VOICE_LEAD = (
    "You are talking with a person in a live voice conversation: you hear them through speech "
    "recognition, and your answer is spoken back to them. The session instructions below define who "
    "you are; the rules at the end only govern how you speak."
)

#: Worked examples of answer-first replies: a question answered in its first few words, a statement
#: met with a short reaction, each followed by at most one sentence more. The first sentence is the
#: reply's first chunk for TTS (:mod:`speech_to_speech.speech.text`): a short one is spoken while the
#: rest is generated, as people answer ("Jupiter.") and then explain. Small local models also repeat or
#: paraphrase what the user told them without examples of reactions. They sit in the system prompt,
#: which stays in the KV cache, so they cost nothing per turn; none is a turn of the conversation
#: benchmark (``scripts/data/quality_dialogues.json``) or of the spoken latency set
#: (``scripts/data/spoken_turns.txt``), and two statements are literary, like the
#: LibriVox sentences people read out. No example answers a number from memory: with "How many
#: days does a leap year have?" / "366." among them, the 1.5B answered two of five sums itself
#: instead of calling the add tool (``scripts/benchmark_tools.py``: 8/10 tool prompts right, 9/10
#: with this set, p(call) of every tool prompt up by 1.3-5x; with "Who painted the Mona Lisa?" in
#: place of penicillin, 8/10).
VOICE_EXAMPLES = (
    ("What is the tallest mountain in the world?", "Mount Everest. It is in the Himalayas."),
    ("Who discovered penicillin?", "Alexander Fleming. In 1928."),
    ("Is a tomato a fruit?", "Yes, it is. Botanically, a berry."),
    ("I just got back from a week in Portugal.", "Oh, nice! What was the best part?"),
    ("She had never seen the sea before that summer.", "What a moment! Where was it?"),
    ("He was not a man to be trusted with money.", "Sounds like a reputation. What did he do?"),
)

_TEXT_LEAD = (
    "You are in a text chat: the user types messages and reads your replies on a screen. The session "
    "instructions below define who you are and what you do. The text rules at the end only govern the form "
    "of your replies; they do not change your role or your knowledge."
)

#: The last rule is for a user who announces what they will say ("Listen to this line."): the 1.5B
#: invented a quotation from the book and went on quoting for the next three turns (issue 27); with
#: it, "Go ahead." and reactions to the lines (three of the conversation benchmark's dialogues typed
#: as the server had heard them: 16 of 18 turns right against 15). The first rule's examples had
#: "Yes, it is." too, which the 1.5B said to 4-6 of the benchmark's 23 statements ("He might even
#: have been made amiable himself." -> "Yes, it is."; the benchmark now counts a bare yes or no as no
#: reaction). Without it (2026-12-07, after the rule below was narrowed): conversation benchmark
#: 63/78 against 59/78, book club and baking statements answered with reactions; the voice tool
#: prompts of ``benchmark_tools.py`` 14/16 against 15/16 ("What's the sum of 9 and 16?" at p(call)
#: 0.0095, under the 0.01 threshold). In the morning, before the narrowing, dropping it had cost
#: two tool prompts (15/16 -> 13/16) and "In Paris." in its place one; the example "Do you know
#: where the Eiffel Tower is?" / "Yes: in Paris." (for "Do you remember my name?" -> "Yes, I
#: remember your name.") 13/16 with the rest. The last rule's first wording ("When they are about
#: to read, say or show you something, only say you are listening ("Go ahead.")") matched any
#: news: "My sister just moved to Lisbon.", "I think I'll go for a walk later." -> "Go ahead." (the
#: spoken latency set, 2026-12-07). Narrowed to an announcement of a reading, without a phrase to
#: copy (quoting "I'm listening." made it the reply to half the news again): typed replay of the
#: benchmark's 68 turns without tools as heard, 58 right and 9 echoes against 55 and 13; voice
#: tool prompts unchanged at 15/16.
_VOICE_RULES = (
    'Start with the answer itself, in one to four words, as a sentence of its own ("Jupiter.", "Oh, '
    'nice!"); then add at most one short sentence, unless asked for more.',
    "Write only words to be spoken: no markdown, lists, emoji or stage directions like *laughs*.",
    "The user's words are a noisy speech transcript and may be misheard: answer what they most likely "
    "meant, and do not point out or correct possible mishearings unless asked.",
    "The user is talking with you, not dictating. When they tell you something instead of asking, react "
    "in your own words: a short comment or a question about it. Never repeat, quote or rephrase their words.",
    'Only when they announce that they will now read or recite something to you ("Listen to this line."), '
    "just say you are listening and wait for it.",
)

#: added to the voice rules only when tools are offered. The third made the embedded
#: Qwen2.5-Coder-1.5B call the sample tools in 5 of the 6 tool turns of the conversation benchmark's
#: tool dialogues (with its call threshold), against 2 of 6 without it: the rules before it had
#: taught it to answer the time and sums from memory. The last is for Qwen's chat template, which
#: shows a tool's result as a user turn: the 1.5B sometimes thanked the "user" for it ("Thank you!
#: Is there anything else...") instead of answering
_VOICE_TOOL_RULES = (
    "Never say the name of a tool or its arguments out loud.",
    "Call information tools without announcing it, and say nothing between one tool call and the next.",
    "You have tools: for anything a tool provides (such as the current time or exact arithmetic), call the "
    "tool and answer from its result; never guess.",
    "A tool's result is not the user speaking: answer the user's question from it at once.",
)

#: Added to the newest tool result shown to a local model whose chat template renders tool results
#: as a user turn (Qwen's: ``<|im_start|>user <tool_response>...``). After "Hi, I need some help with a
#: few numbers." / "What numbers do you need assistance with?", the embedded 1.5B took the result
#: of add(120, 80) for the user's reply and said "Thank you! Is there anything else I can help with?"
#: (3 of 4 follow-ups; the conversation benchmark's "more sums" dialogue); with this note, 0 of 4,
#: and the 4 follow-ups without that history kept their answers ("The sum of 120 and 80 is 200.").
TOOL_RESULT_NOTE = "(Answer the user's last question from this result.)"

#: The compact voice prompt, for small models (see :func:`build_voice_system_prompt`): the
#: persona, then this. Measured on the conversation benchmark's 78 turns as typed transcripts
#: (what the server heard), Qwen2.5-Coder-0.5B, greedy, with the echo guard: 47 right (60 %)
#: against 30 (38 %) with the full voice prompt, whose many rules and examples the 0.5B follows
#: worse than it follows one sentence (it copied the examples and refused statements).
_COMPACT_VOICE_RULE = "Your replies are spoken aloud, so answer in one or two short sentences of plain text."
#: the compact prompt's tool rule (with it the 0.5B called the right tool in 3 of the 6 tool turns)
_COMPACT_TOOL_RULE = "Use a tool whenever one can answer the question."

_TEXT_RULES = (
    "Be concise: answer the question directly and add detail only when it helps or when the user asks for it.",
    "Markdown is allowed where it makes a reply easier to read, such as short lists or code blocks; do not "
    "use it for decoration.",
    "Never mention the names of tools or functions to the user; just use them and report what they found.",
)


#: the reply rule names a language in that language (its endonym), not in English: "Always reply
#: in German" primes the embedded 1.5B with Germany. "Was ist die Hauptstadt von Frankreich?":
#: P(first token "Berlin") 0.565 against "Paris" 0.321 with "German" in the rule, 0.521 against
#: 0.362 with "Deutsch" (the GGUF's chat template, greedy); through the pipeline, typed, it
#: answered "Paris." with "Deutsch" once and "Berlin." in another run: a near tie, moved a little.
#: Languages not listed keep their English name.
ENDONYMS = {
    "German": "Deutsch",
    "French": "français",
    "Spanish": "español",
    "Italian": "italiano",
    "Portuguese": "português",
    "Dutch": "Nederlands",
    "Polish": "polski",
    "Russian": "русский",
    "Ukrainian": "українська",
    "Czech": "čeština",
    "Swedish": "svenska",
    "Danish": "dansk",
    "Norwegian": "norsk",
    "Finnish": "suomi",
    "Greek": "ελληνικά",
    "Turkish": "Türkçe",
    "Romanian": "română",
    "Hungarian": "magyar",
    "Catalan": "català",
    "Chinese": "中文",
    "Japanese": "日本語",
    "Korean": "한국어",
    "Vietnamese": "Tiếng Việt",
    "Indonesian": "Bahasa Indonesia",
    "Hindi": "हिन्दी",
    "Arabic": "العربية",
    "Hebrew": "עברית",
}


def _resolve_language(language: str | None) -> str | None:
    """The language's name for the reply rule, in that language where :data:`ENDONYMS` has it;
    ``None`` for no rule.

    A language name is used as given; a Whisper code (``"fr"``, ``"fr-FR"``) passed
    by mistake is turned into its name so the rule never reads "reply in fr".
    """
    if language is None or not language.strip():
        return None
    language = language.strip()
    name = language_name(language) or language
    return ENDONYMS.get(name, name)


def _assemble(
    lead: str,
    instructions: str,
    default_persona: str,
    tools_block: str,
    rules_title: str,
    rules: tuple[str, ...],
    language: str | None,
    examples: str = "",
) -> str:
    """Join lead, session instructions (+ tools block), examples and rules, in that order."""
    session = instructions.strip() or default_persona
    tools = tools_block.strip()
    if tools:
        session = f"{session}\n\n{tools}"
    rule_lines = list(rules)
    name = _resolve_language(language)
    if name is not None:
        rule_lines.append(f"Always reply in {name}, whatever language the user's message seems to be in.")
    rules_text = "\n".join(f"- {rule}" for rule in rule_lines)
    examples = f"\n\n{examples}" if examples else ""
    return f"{lead}\n\nSESSION INSTRUCTIONS\n{session}{examples}\n\n{rules_title}\n{rules_text}"


def build_voice_system_prompt(
    instructions: str = "",
    tools_block: str = "",
    language: str | None = None,
    *,
    tools_offered: bool = False,
    compact: bool = False,
) -> str:
    """The system prompt for replies that will be spoken.

    Three parts, in this order:

    1. a lead: this is a live voice conversation with a person; the session instructions
       define who the assistant is; the voice rules only govern how it speaks;
    2. the session instructions (a default friendly voice-assistant persona when
       ``instructions`` is empty), followed by ``tools_block`` when given, then
       :data:`VOICE_EXAMPLES`, worked examples of reacting to a statement;
    3. the voice rules, last because they are the strongest constraints: one
       sentence by default (two at most unless asked), no markdown, lists, emoji
       or stage directions, treat the input as a noisy transcript and do not
       correct mishearings, react to a statement instead of repeating it; with
       tools, also never say tool names aloud, call information tools without
       announcing them, stay silent between calls, and call a tool rather than
       guess what it provides.

    The **compact** prompt, for small models (the embedded 0.5B), is the session instructions
    (or the default persona), one sentence on speaking (:data:`_COMPACT_VOICE_RULE`), the
    language rule and, with tools, one tool rule; no lead, examples or other rules.

    Args:
        instructions: the session's persona/task text ("" for the default persona).
        tools_block: optional text describing the available tools (backends without native tools).
        language: a language *name* such as ``"French"``; when given, a rule to reply
            in that language is added to the voice rules. A Whisper code (``"fr"``)
            is also accepted and turned into its name.
        tools_offered: tools are offered (natively, through the model's chat template or the
            provider's API, when ``tools_block`` is empty); adds the tool rules.
        compact: build the compact prompt.

    Returns:
        The complete system prompt.
    """
    tools_offered = tools_offered or bool(tools_block.strip())
    if compact:
        parts = [instructions.strip() or DEFAULT_VOICE_PERSONA, tools_block.strip(), _COMPACT_VOICE_RULE]
        name = _resolve_language(language)
        if name is not None:
            parts.append(f"Always reply in {name}.")
        if tools_offered:
            parts.append(_COMPACT_TOOL_RULE)
        return " ".join(part for part in parts if part)
    rules = _VOICE_RULES + (_VOICE_TOOL_RULES if tools_offered else ())
    examples = "EXAMPLES OF GOOD REPLIES (not part of this conversation)\n" + "\n".join(
        f'- User: "{said}" You: "{reply}"' for said, reply in VOICE_EXAMPLES
    )
    return _assemble(
        _VOICE_LEAD, instructions, DEFAULT_VOICE_PERSONA, tools_block, "VOICE RULES", rules, language, examples
    )


def build_text_system_prompt(instructions: str = "", tools_block: str = "", language: str | None = None) -> str:
    """The system prompt for replies that will only be read (no TTS).

    Same layout as :func:`build_voice_system_prompt` (lead, session instructions
    plus tools block, rules last), with a lead for a text chat and text rules:
    be concise, markdown allowed where it helps, never mention tool names.

    Args:
        instructions: the session's persona/task text ("" for the default persona).
        tools_block: optional text describing the available tools.
        language: a language name such as ``"French"``; adds a reply-language rule.

    Returns:
        The complete system prompt.
    """
    return _assemble(_TEXT_LEAD, instructions, DEFAULT_TEXT_PERSONA, tools_block, "TEXT RULES", _TEXT_RULES, language)


def _strip_marker(content: str) -> str:
    """``content`` without a trailing :data:`INTERRUPTION_MARKER` (and the whitespace around it)."""
    stripped = content.rstrip()
    marker = INTERRUPTION_MARKER.strip()
    if stripped.endswith(marker):
        return stripped[: -len(marker)].rstrip()
    return content


def _is_empty_assistant(message: Message) -> bool:
    """An assistant message with no tool calls and nothing to say (possibly just the marker)."""
    if message.get("role") != "assistant" or message.get("tool_calls"):
        return False
    content = message.get("content")
    if content is None:
        return True
    if isinstance(content, str):
        return not _strip_marker(content).strip()
    return not content  # an empty list of content parts


def _mergeable(previous: Message, message: Message) -> bool:
    """Whether ``message`` can be folded into the ``previous`` one."""
    return (
        previous.get("role") == message.get("role")
        and message.get("role") in ("user", "assistant")
        and not previous.get("tool_calls")
        and not message.get("tool_calls")
        and isinstance(previous.get("content"), str)
        and isinstance(message.get("content"), str)
    )


def clean_messages_for_local_model(messages: list[Message]) -> list[Message]:
    """Reshape an OpenAI-style chat for a local model's chat template.

    Many local chat templates reject anything but system, then strictly
    alternating user/assistant turns starting with the user. Barge-in and tool
    calls easily break that, so this returns a new list (deep-copied; ``messages``
    is not modified) where, in order:

    1. assistant messages with no content, or only :data:`INTERRUPTION_MARKER`
       (a reply interrupted before it said anything), are dropped, unless they
       carry ``tool_calls``;
    2. adjacent messages of the same role (user + user, assistant + assistant)
       are merged, their contents joined with ``"\\n"``; tool messages and messages
       with ``tool_calls`` are never merged;
    3. a trailing :data:`INTERRUPTION_MARKER` is removed from the last message's
       content (the model should continue from the words, not the note);
    4. if the first non-system message is not a user message, a neutral user
       message (:data:`PLACEHOLDER_USER_CONTENT`) is inserted before it.

    Args:
        messages: ``{"role": ..., "content": ..., ...}`` dicts, roles
            ``system``, ``user``, ``assistant`` or ``tool``.

    Returns:
        The cleaned list.
    """
    kept = [copy.deepcopy(m) for m in messages if not _is_empty_assistant(m)]

    merged: list[Message] = []
    for message in kept:
        if merged and _mergeable(merged[-1], message):
            merged[-1]["content"] = f"{merged[-1]['content']}\n{message['content']}"
        else:
            merged.append(message)

    if merged and isinstance(merged[-1].get("content"), str):
        merged[-1]["content"] = _strip_marker(merged[-1]["content"])

    first = next((i for i, m in enumerate(merged) if m.get("role") != "system"), None)
    if first is not None and merged[first].get("role") != "user":
        merged.insert(first, {"role": "user", "content": PLACEHOLDER_USER_CONTENT})
    return merged


#: Whisper language codes -> English language names. The codes are exactly those of
#: the language list of OpenAI's Whisper (100 codes, "yue" added with large-v3);
#: the names are written in title case, with "Burmese" for Whisper's "myanmar" and
#: "Norwegian Nynorsk" for "nynorsk" so they read as language names in a prompt.
#: Note that Whisper uses "jw" (not ISO 639-1 "jv") for Javanese.
WHISPER_LANGUAGES: dict[str, str] = {
    "en": "English",
    "zh": "Chinese",
    "de": "German",
    "es": "Spanish",
    "ru": "Russian",
    "ko": "Korean",
    "fr": "French",
    "ja": "Japanese",
    "pt": "Portuguese",
    "tr": "Turkish",
    "pl": "Polish",
    "ca": "Catalan",
    "nl": "Dutch",
    "ar": "Arabic",
    "sv": "Swedish",
    "it": "Italian",
    "id": "Indonesian",
    "hi": "Hindi",
    "fi": "Finnish",
    "vi": "Vietnamese",
    "he": "Hebrew",
    "uk": "Ukrainian",
    "el": "Greek",
    "ms": "Malay",
    "cs": "Czech",
    "ro": "Romanian",
    "da": "Danish",
    "hu": "Hungarian",
    "ta": "Tamil",
    "no": "Norwegian",
    "th": "Thai",
    "ur": "Urdu",
    "hr": "Croatian",
    "bg": "Bulgarian",
    "lt": "Lithuanian",
    "la": "Latin",
    "mi": "Maori",
    "ml": "Malayalam",
    "cy": "Welsh",
    "sk": "Slovak",
    "te": "Telugu",
    "fa": "Persian",
    "lv": "Latvian",
    "bn": "Bengali",
    "sr": "Serbian",
    "az": "Azerbaijani",
    "sl": "Slovenian",
    "kn": "Kannada",
    "et": "Estonian",
    "mk": "Macedonian",
    "br": "Breton",
    "eu": "Basque",
    "is": "Icelandic",
    "hy": "Armenian",
    "ne": "Nepali",
    "mn": "Mongolian",
    "bs": "Bosnian",
    "kk": "Kazakh",
    "sq": "Albanian",
    "sw": "Swahili",
    "gl": "Galician",
    "mr": "Marathi",
    "pa": "Punjabi",
    "si": "Sinhala",
    "km": "Khmer",
    "sn": "Shona",
    "yo": "Yoruba",
    "so": "Somali",
    "af": "Afrikaans",
    "oc": "Occitan",
    "ka": "Georgian",
    "be": "Belarusian",
    "tg": "Tajik",
    "sd": "Sindhi",
    "gu": "Gujarati",
    "am": "Amharic",
    "yi": "Yiddish",
    "lo": "Lao",
    "uz": "Uzbek",
    "fo": "Faroese",
    "ht": "Haitian Creole",
    "ps": "Pashto",
    "tk": "Turkmen",
    "nn": "Norwegian Nynorsk",
    "mt": "Maltese",
    "sa": "Sanskrit",
    "lb": "Luxembourgish",
    "my": "Burmese",
    "bo": "Tibetan",
    "tl": "Tagalog",
    "mg": "Malagasy",
    "as": "Assamese",
    "tt": "Tatar",
    "haw": "Hawaiian",
    "ln": "Lingala",
    "ha": "Hausa",
    "ba": "Bashkir",
    "jw": "Javanese",
    "su": "Sundanese",
    "yue": "Cantonese",
}

#: Common codes that differ from Whisper's: ISO 639-1 Javanese, the old Hebrew
#: code, and Norwegian Bokmål.
_CODE_ALIASES = {"jv": "jw", "iw": "he", "nb": "no"}


def reply_language(setting: str, detected: str | None) -> str | None:
    """The language name of the reply rule, or None for no rule.

    Args:
        setting: the ``--language`` value: "auto", "" or a comma-separated list (detected per
            turn: the rule names ``detected``), or one language (a rule unless it is English,
            the prompt's own language).
        detected: the turn's language code from the STT (None: unknown, no rule when detecting).
    """
    setting = setting.strip()
    if setting in ("", "auto") or "," in setting:
        return language_name(detected)
    return None if setting.split("-")[0].lower() == "en" else language_name(setting) or setting


def language_name(code: str | None) -> str | None:
    """The English name of a Whisper language code, or ``None``.

    Case-insensitive; a region or script suffix is ignored, so ``"en"``,
    ``"EN"``, ``"en-US"`` and ``"en_GB"`` all give ``"English"``. ``None``,
    ``""``, ``"auto"`` and unknown codes give ``None``.
    """
    if not code:
        return None
    base = code.strip().replace("_", "-").split("-", 1)[0].lower()
    base = _CODE_ALIASES.get(base, base)
    return WHISPER_LANGUAGES.get(base)
