"""Each built-in tool's handler (and preview) takes a TypedDict of its arguments, and the
TypedDict says what the tool's schema says: the same names, the same required ones. The
registry checks a call against the schema before the handler sees it, so the two must agree
for the handler's types to be true (coder.tools.base.Handler)."""

from __future__ import annotations

import inspect
from typing import Any, NotRequired, Required, get_origin, get_type_hints, is_typeddict

import pytest

from coder.mcp.tasks import TASK_TOOLS
from coder.tools.base import Tool
from coder.tools.registry import default_registry

TOOLS = [*default_registry(), *TASK_TOOLS]


def arguments_type(function: Any) -> Any:
    """The annotation of a handler's or preview's second parameter (the arguments)."""
    second = list(inspect.signature(function).parameters)[1]
    return get_type_hints(function)[second]


def required(typed: Any) -> set[str]:
    """The keys a TypedDict requires, read from its hints (`__required_keys__` misses a
    `Required[...]` written as a string, under `from __future__ import annotations`)."""
    hints = get_type_hints(typed, include_extras=True)
    return {
        key
        for key, hint in hints.items()
        if get_origin(hint) is Required or (typed.__total__ and get_origin(hint) is not NotRequired)
    }


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_the_arguments_typeddict_is_the_schema(tool: Tool) -> None:
    typed = arguments_type(tool.handler)
    assert is_typeddict(typed), f"{tool.name}: its handler takes {typed}, not a TypedDict"
    schema = tool.parameters
    assert set(typed.__annotations__) == set(schema["properties"]), tool.name
    assert required(typed) == set(schema.get("required", [])), tool.name
    if tool.preview is not None:
        assert arguments_type(tool.preview) is typed, f"{tool.name}: preview and handler differ"
