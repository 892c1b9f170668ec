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
    return [call for call, _ in _calls_with_ends(text, known)]


def first_call_in_text(text: str, known: Iterable[str]) -> tuple[ToolCall, int] | None:
    """The first tool call for a known tool in `text`, and where its JSON ends."""
    return next(_calls_with_ends(text, known), None)


def _calls_with_ends(text: str, known: Iterable[str]) -> Iterator[tuple[ToolCall, int]]:
    names = set(known)
    for obj, end in _json_spans(text[:MAX_SCAN]):
        call = _as_call(obj, names)
        if call is not None:
            yield call, end


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
    return (obj for obj, _ in _json_spans(text))


def _json_spans(text: str) -> Iterator[tuple[Any, int]]:
    """Each top-level JSON object in `text` and the offset just past it."""
    decoder = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        yield obj, end
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


_NAME_VALUE = re.compile(r"""["'](?:name|tool|tool_name)["']\s*:\s*["']([^"'\n]*)""", re.IGNORECASE)
NAME_SLACK = 16  # characters a call's name may run past the longest known name (a typo)


def runaway_name(text: str, known: Iterable[str]) -> bool:
    """Does the last call-shaped name in `text` run on past any tool's name, still unclosed (a
    weak model looping inside the JSON: `"name": "calc_test_calc_test_calc_...`)? Such a
    reply can never be a call, however far it is read."""
    longest = max((len(n) for n in known), default=0)
    found = list(_NAME_VALUE.finditer(text))
    if not found:
        return False
    last = found[-1]
    return last.end() == len(text) and len(last.group(1)) > longest + NAME_SLACK
