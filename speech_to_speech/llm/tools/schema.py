"""JSON Schema → Python function signatures, for prompting local models with tools.

Small local models rarely have native function calling, but they have read a lot
of Python. A tool's JSON Schema parameters are therefore shown to them as a
Python function stub (:func:`render_signature`), built from a real
:class:`inspect.Signature` (:func:`schema_to_signature`).

Type mapping (:func:`schema_to_annotation`):

================================  ==========================================
schema                            annotation
================================  ==========================================
``"string"``                      ``str``
``"integer"``                     ``int``
``"number"``                      ``float``
``"boolean"``                     ``bool``
``"null"``                        ``None``
``"array"`` (+ ``items``)         ``list[ItemType]`` (nested; ``list[Any]``
                                  without ``items``)
``"object"``                      ``dict[str, Any]``
``const: X``                      ``Literal[X]``
``enum: [a, b]``                  ``Literal[a, b]``
``anyOf`` / ``oneOf``             ``Union[...]`` of the members, deduplicated,
                                  order kept (a single member is not wrapped)
``allOf``                         the members merged into one schema
                                  (properties and ``required`` united)
``"type": ["string", "null"]``    ``Optional[str]`` (any list of types is a
                                  ``Union``)
``"nullable": true`` (OpenAPI)    the annotation made ``Optional``
unknown / absent type             ``Any``
================================  ==========================================

Defaults (:func:`schema_to_signature`): a property with a schema ``default``
gets that default; a required property without one has no default (it must be
given); every other property defaults to ``None`` (it may be omitted).
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any, Literal, Union, get_args, get_origin

__all__ = [
    "format_annotation",
    "merge_all_of",
    "object_properties",
    "render_signature",
    "schema_to_annotation",
    "schema_to_signature",
]

_NONE_TYPE = type(None)

_SIMPLE_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": None,
    "object": dict[str, Any],
}


def merge_all_of(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its ``allOf`` members merged into it (recursively).

    ``properties`` are united (a property defined twice becomes the ``allOf`` of
    both definitions), ``required`` lists are united in order, and any other key
    keeps its first value (``spec``'s own keys first, then the members in order).
    A schema without ``allOf`` is returned as is (not copied).

    Args:
        spec: a JSON Schema object.

    Returns:
        A schema without a top-level ``allOf``.
    """
    members = spec.get("allOf")
    if not isinstance(members, list):
        return spec
    merged: dict[str, Any] = {key: value for key, value in spec.items() if key != "allOf"}
    for member in members:
        if not isinstance(member, dict):
            continue
        for key, value in merge_all_of(member).items():
            if key == "properties" and isinstance(value, dict):
                properties = dict(merged.get("properties") or {})
                for name, prop in value.items():
                    properties[name] = {"allOf": [properties[name], prop]} if name in properties else prop
                merged["properties"] = properties
            elif key == "required" and isinstance(value, list):
                merged["required"] = list(dict.fromkeys([*(merged.get("required") or []), *value]))
            else:
                merged.setdefault(key, value)
    return merged


def _literal(values: list[Any]) -> Any:
    """``Literal[*values]``, or ``Any`` when there are none or they cannot be literals (lists, dicts)."""
    if not values:
        return Any
    try:
        for value in values:
            hash(value)
    except TypeError:  # lists or dicts as enum members
        return Any
    return Literal[tuple(values)]


def _union(members: list[Any]) -> Any:
    """``Union`` of ``members`` (deduplicated, order kept); a single member is returned alone."""
    unique: list[Any] = []
    for member in members:
        if member not in unique:
            unique.append(member)
    if not unique:
        return Any
    if len(unique) == 1:
        return unique[0]
    return Union[tuple(unique)]  # noqa: UP007 - built from a runtime list


def _annotation_for_type(type_name: Any, spec: dict[str, Any]) -> Any:
    """The annotation of one JSON Schema ``type`` name, using ``spec`` for ``items``."""
    if type_name == "array":
        items = spec.get("items")
        item = schema_to_annotation(items) if isinstance(items, dict) else Any
        return list[item]
    if isinstance(type_name, str) and type_name in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[type_name]
    return Any


def schema_to_annotation(spec: Any) -> Any:
    """The Python annotation for one JSON Schema (see the module docstring for the mapping).

    Args:
        spec: a JSON Schema; anything that is not a dict (``True``, ``None``) gives ``Any``.

    Returns:
        A typing object: a builtin type, ``None``, ``Any``, ``Literal[...]``,
        ``Union[...]``/``Optional[...]``, ``list[...]`` or ``dict[str, Any]``.
    """
    if not isinstance(spec, dict):
        return Any
    spec = merge_all_of(spec)
    if "const" in spec:
        annotation = _literal([spec["const"]])
    elif isinstance(spec.get("enum"), list):
        annotation = _literal(spec["enum"])
    elif isinstance(spec.get("anyOf"), list) or isinstance(spec.get("oneOf"), list):
        members = spec.get("anyOf") if isinstance(spec.get("anyOf"), list) else spec["oneOf"]
        annotation = _union([schema_to_annotation(member) for member in members])
    else:
        type_name = spec.get("type")
        if isinstance(type_name, list):
            annotation = _union([_annotation_for_type(name, spec) for name in type_name])
        elif type_name is not None:
            annotation = _annotation_for_type(type_name, spec)
        elif isinstance(spec.get("properties"), dict):
            annotation = dict[str, Any]
        elif "items" in spec:
            annotation = _annotation_for_type("array", spec)
        else:
            annotation = Any
    if spec.get("nullable") is True and annotation is not Any:
        annotation = _union([annotation, None])
    return annotation


def object_properties(parameters: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The properties and required names of an object schema (``allOf`` merged).

    A name that is required but has no property schema is added with an empty
    schema (type ``Any``), after the declared properties.

    Args:
        parameters: an object schema (``{"type": "object", "properties": ..., "required": ...}``)
            or ``None``.

    Returns:
        ``(properties, required)``: property name → schema, in declaration order, and
        the required names.
    """
    if not isinstance(parameters, dict):
        return {}, []
    merged = merge_all_of(parameters)
    properties = dict(merged.get("properties") or {})
    required = [name for name in (merged.get("required") or []) if isinstance(name, str)]
    for name in required:
        properties.setdefault(name, {})
    return properties, required


def schema_to_signature(parameters: dict[str, Any] | None) -> inspect.Signature:
    """A keyword-only :class:`inspect.Signature` for a tool's parameter schema.

    Every property becomes a keyword-only parameter, in declaration order, annotated
    by :func:`schema_to_annotation`. Defaults: the property's schema ``default`` if it
    has one; no default if it is required; ``None`` otherwise.

    Args:
        parameters: an object schema with ``properties`` and ``required`` (``allOf``
            members are merged first); ``None`` or ``{}`` give an empty signature.

    Returns:
        The signature (its return annotation is left empty).

    Raises:
        ValueError: a property name cannot be a Python keyword argument (not an
            identifier, or a keyword such as ``class``).
    """
    properties, required = object_properties(parameters)
    params = []
    for name, spec in properties.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"parameter name {name!r} cannot be written as a Python keyword argument")
        if isinstance(spec, dict) and "default" in spec:
            default = spec["default"]
        elif name in required:
            default = inspect.Parameter.empty
        else:
            default = None
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=schema_to_annotation(spec)
            )
        )
    return inspect.Signature(params)


def format_annotation(annotation: Any) -> str:
    """A readable annotation: ``str``, ``list[int]``, ``Literal['c', 'f']``, ``Optional[int]``, ``Any``.

    A union with ``None`` and one other member reads ``Optional[X]``; with more
    members, ``Union[X, Y, None]``.
    """
    if annotation is Any:
        return "Any"
    if annotation is None or annotation is _NONE_TYPE:
        return "None"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return f"Literal[{', '.join(repr(value) for value in args)}]"
    if origin is Union:
        others = [arg for arg in args if arg is not _NONE_TYPE]
        if len(others) == 1 and len(args) == 2:
            return f"Optional[{format_annotation(others[0])}]"
        return f"Union[{', '.join(format_annotation(arg) for arg in args)}]"
    if origin is not None and args:
        name = getattr(origin, "__name__", repr(origin))
        return f"{name}[{', '.join(format_annotation(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return repr(annotation)


def _docstring(description: str, properties: dict[str, Any]) -> list[str]:
    """The docstring lines (indented by four spaces): the description, then ``Args:`` if any are described."""
    arg_lines = []
    for name, spec in properties.items():
        text = spec.get("description") if isinstance(spec, dict) else None
        if isinstance(text, str) and text.strip():
            arg_lines.append(f"{name}: {' '.join(text.split())}")
    summary = [line.rstrip() for line in description.strip().splitlines()]
    body = list(summary)
    if arg_lines:
        if body:
            body.append("")
        body.append("Args:")
        body.extend(f"    {line}" for line in arg_lines)
    if not body:
        return []
    body = [line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') for line in body]
    if len(body) == 1:
        return [f'    """{body[0]}"""']
    lines = [f'    """{body[0]}']
    lines.extend(f"    {line}" if line else "" for line in body[1:])
    lines.append('    """')
    return lines


def render_signature(name: str, description: str, parameters: dict[str, Any] | None) -> str:
    """A Python stub for one tool, as shown to a local model.

    Example::

        def get_weather(*, city: str, unit: Literal['c', 'f'] = 'c') -> None:
            \"\"\"Current weather for a city.\"\"\"

    The docstring is the tool's description; when properties have descriptions
    they are listed under ``Args:``. A tool with neither gets ``...`` as its body.

    Args:
        name: the tool's name (must be a Python identifier).
        description: what the tool does ("" for none).
        parameters: the tool's parameter schema (see :func:`schema_to_signature`).

    Returns:
        The stub, without a trailing newline.

    Raises:
        ValueError: ``name`` or a property name is not usable as a Python identifier.
    """
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"tool name {name!r} is not a Python identifier")
    signature = schema_to_signature(parameters)
    params = []
    for param in signature.parameters.values():
        text = f"{param.name}: {format_annotation(param.annotation)}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {param.default!r}"
        params.append(text)
    params_text = f"*, {', '.join(params)}" if params else ""
    properties, _ = object_properties(parameters)
    doc = _docstring(description or "", properties)
    header = f"def {name}({params_text}) -> None:"
    if not doc:
        return f"{header} ..."
    return "\n".join([header, *doc])
