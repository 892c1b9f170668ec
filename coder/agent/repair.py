"""Recover tool calls that a small model wrote as JSON inside its text instead of calling the
tool natively: fenced ```json blocks, <tool_call> tags, or bare objects, in the shapes models
commonly use ({"name", "arguments"}, {"name", "parameters"}, {"function": {...}}, arguments
given as a JSON string)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
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


# A fenced block in a programming language (```python, ```js ...; to its end, or to the end of
# the text while it is still open): code the model shows, not a call, whatever JSON it holds.
_CODE_BLOCK = re.compile(r"```[ \t]*(?!json|tool)[A-Za-z][\w+-]*[^\n]*\n.*?(?:```|\Z)", re.DOTALL)


def looks_like_tool_call(text: str, known: Iterable[str]) -> bool:
    """Does `text` show an attempt at the tool format (the fast verdict keeps reading it)?
    Code blocks in a language are left out: dicts in a Python answer are not a call."""
    text = _CODE_BLOCK.sub("", text)
    if _CALL_SHAPE.search(text):
        return True
    names = "|".join(re.escape(n) for n in known)
    # called like a function, not defined as one (`def step_complete(...)` in a code answer)
    pattern = rf"(?<!def )(?<!function )\b(?:{names})\s*[({{]"
    return bool(names) and re.search(pattern, text) is not None


LOOP_PIECES = 64  # streamed pieces (tokens) a loop must fill before a reply counts as one
LOOP_PERIOD = 3  # the longest cycle, in pieces, counted as a loop


def looping(pieces: Sequence[str]) -> bool:
    """Do the last LOOP_PIECES streamed pieces of a reply repeat a cycle of at most
    LOOP_PERIOD pieces (a weak model stuck in a loop: `_summary_summary_summary...`,
    `1. 1. 1. ...`)? Such a reply goes nowhere, tool-shaped or not, however far it is read."""
    tail = list(pieces)[-LOOP_PIECES:]
    if len(tail) < LOOP_PIECES:
        return False
    return any(
        all(tail[i] == tail[i - p] for i in range(p, len(tail))) for p in range(1, LOOP_PERIOD + 1)
    )
