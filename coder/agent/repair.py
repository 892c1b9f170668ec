"""Recover tool calls that a small model wrote as JSON inside its text instead of calling the
tool natively: fenced ```json blocks, <tool_call> tags, or bare objects, in the shapes models
commonly use ({"name", "arguments"}, {"name", "parameters"}, {"function": {...}}, arguments
given as a JSON string)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from coder import yamldoc
from coder.models.provider import ToolCall

MAX_SCAN = 200_000  # characters of text examined; a reply longer than this is not a tool call


def calls_in_text(text: str, known: Iterable[str]) -> list[ToolCall]:
    """Tool calls for known tools found in `text`, in order of appearance."""
    names = set(known)
    found = []
    for obj in json_objects(text[:MAX_SCAN]):
        call = _as_call(obj, names)
        if call is not None:
            found.append(call)
    return found


def _as_call(obj: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name") or obj.get("tool") or obj.get("tool_name")
    if name not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", obj.get("args", {})))
    if isinstance(args, str):
        try:
            args = yamldoc.loads_json(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(str(name), args)


def json_objects(text: str) -> Iterator[Any]:
    """Every top-level {...} in the text that parses as JSON (strings and escapes respected)."""
    decoder = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        yield obj
        i = text.find("{", end)


# Text that shows an attempt at a tool call, even a malformed one: a JSON object opening with a
# key, the usual call markers of chat templates, a fenced json block, or a tool name applied
# like a function. Prose about code rarely has any of these.
_CALL_SHAPE = re.compile(
    r"""\{\s*["']|<tool_call|<function|\[TOOL_CALLS\]|```\s*(?:json|tool)|"(?:name|arguments|function)"\s*:""",
    re.IGNORECASE,
)


def looks_like_tool_call(text: str, known: Iterable[str]) -> bool:
    """Does `text` show an attempt at the tool format (the fast verdict keeps reading it)?"""
    if _CALL_SHAPE.search(text):
        return True
    names = "|".join(re.escape(n) for n in known)
    return bool(names) and re.search(rf"\b(?:{names})\s*[({{]", text) is not None
