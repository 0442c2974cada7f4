"""Tool calling for local models that have no native function calling.

Such a model is shown each tool as a Python function stub and calls it by
writing ``<code>name(arg='value')</code>`` in its reply:

* :mod:`~speech_to_speech.llm.tools.schema`: JSON Schema parameters → an
  :class:`inspect.Signature` and a readable Python stub;
* :mod:`~speech_to_speech.llm.tools.prompt`: the tools block of the system prompt
  (voice and text variants);
* :mod:`~speech_to_speech.llm.tools.parse`: streaming extraction of ``<code>``
  blocks, safe AST parsing of the calls (nothing is evaluated), and validation
  against the session's tools.

Cloud backends pass tools to the provider natively and do not use this package.
"""

from speech_to_speech.llm.tools.parse import (
    CodeBlockExtractor,
    Part,
    ToolCallParseError,
    extract_calls,
    parse_call,
    parse_calls,
)
from speech_to_speech.llm.tools.prompt import CODE_CLOSE, CODE_OPEN, build_tool_prompt, function_tool_spec
from speech_to_speech.llm.tools.schema import (
    format_annotation,
    render_signature,
    schema_to_annotation,
    schema_to_signature,
)

__all__ = [
    "CODE_CLOSE",
    "CODE_OPEN",
    "CodeBlockExtractor",
    "Part",
    "ToolCallParseError",
    "build_tool_prompt",
    "extract_calls",
    "format_annotation",
    "function_tool_spec",
    "parse_call",
    "parse_calls",
    "render_signature",
    "schema_to_annotation",
    "schema_to_signature",
]
