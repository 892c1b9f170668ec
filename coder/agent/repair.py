"""Recover tool calls that a small model wrote as JSON inside its text instead of calling the
tool natively: fenced ```json blocks, <tool_call> tags, or bare objects, in the shapes models
commonly use ({"name", "arguments"}, {"name", "parameters"}, {"function": {...}}, arguments
given as a JSON string)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

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
            args = json.loads(args)
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
