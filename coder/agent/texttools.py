"""How a conversation carries tool calls: natively (the server's tool calling), or as text.

`NativeTools` sends the tool schemas with each request and takes the calls the server parsed
(or, failing those, calls written as JSON in the text: coder.agent.repair), as coder always did.

`TextTools` is for a model that cannot call tools natively, or cannot as served (a chat
template that drops `tools`, a model without tool training): the tools are described in the
system prompt (one line each: name, parameters as a signature, one-line purpose; and one
worked example call in a fenced block, a shape small models imitate well), no `tools` go with
the request, the first call written in the reply is taken (what comes before it is the model's
thinking, what comes after it is dropped from the transcript: often an invented result, so the
stream ends there and the server does not generate it: `complete`), and each result goes back
as a user message naming the call. The description is appended to the run's cache-stable
system prompt, so it is byte-identical for every request with that model.

A format also says what the loop appends for a reply and a result, which messages are tool
results (context folding), and how to nudge a reply without a call. `NativeTools(fallback=...)`
is what `auto` chose without proof: its first reply in prose that names a tool switches the
conversation to the text format (`switch`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from coder.agent import prompts
from coder.agent.repair import calls_in_text, first_call_in_text
from coder.models.protocol import Choice, ToolProtocol
from coder.models.provider import ChatResult, Message, ToolCall, ToolSchema

RESULT_HEAD = "Result of "  # a text-format tool result starts so: "Result of fs_read (call_1_0):"
EXAMPLE_TOOL = "fs_read"
EXAMPLE_ARGUMENTS = {"path": "README.md"}

TOOLS_INTRO = """\
<tools>
You act by calling tools. To call one, write ONE JSON object with the tool's name and its
arguments in a fenced block, exactly in this shape:
{example}
Write one call per reply and stop after it: coder runs the call and answers in the next message
with its result. You may think in a few lines before the block. Tools:
"""


class ToolFormat(Protocol):
    """One way of carrying tool calls in a conversation (see the module docstring)."""

    @property
    def name(self) -> ToolProtocol: ...

    def system(self, base: str) -> str:
        """The system prompt for a model in this format, from the run's (`base`)."""
        ...

    def request_tools(self, tools: list[ToolSchema]) -> list[ToolSchema] | None:
        """What goes in the request's `tools`."""
        ...

    def calls(self, reply: ChatResult, known: Sequence[str]) -> list[ToolCall]:
        """The calls to run from `reply`."""
        ...

    def message(self, reply: ChatResult, calls: list[ToolCall]) -> Message:
        """The assistant message for `reply` whose calls (with their ids) are `calls`."""
        ...

    def answer(self, call: ToolCall, content: str) -> Message:
        """The message that carries a call's result back."""
        ...

    def is_result(self, message: Message) -> bool:
        """Whether `message` is a tool result (older ones are folded when context runs out)."""
        ...

    def nudge(self, cut: bool) -> str:
        """What to say to a reply without a usable call (`cut`: it was cut off as prose)."""
        ...

    def switch(self, reply: ChatResult, known: Sequence[str], turn: int) -> TextTools | None:
        """The text format to go on in, when this reply shows the model does not call tools
        natively; else None."""
        ...

    def complete(self, text: str, known: Sequence[str]) -> bool:
        """Whether the reply streamed so far (`text`) already holds all this format keeps of
        it, so the stream can end there (the server stops generating what would be dropped)."""
        ...


@dataclass(frozen=True)
class NativeTools:
    """The server's tool calling. `fallback`: auto chose native without proof; a first reply
    in prose that names a tool goes over to this text format."""

    fallback: TextTools | None = None
    name: ToolProtocol = "native"

    def system(self, base: str) -> str:
        return base

    def request_tools(self, tools: list[ToolSchema]) -> list[ToolSchema] | None:
        return tools

    def calls(self, reply: ChatResult, known: Sequence[str]) -> list[ToolCall]:
        return list(reply.tool_calls) or calls_in_text(reply.content, known)

    def message(self, reply: ChatResult, calls: list[ToolCall]) -> Message:
        return replace(reply, tool_calls=tuple(calls)).as_message()

    def answer(self, call: ToolCall, content: str) -> Message:
        message: Message = {"role": "tool", "tool_name": call.name, "content": content}
        if call.id:
            message["tool_call_id"] = call.id
        return message

    def is_result(self, message: Message) -> bool:
        return message["role"] == "tool"

    def nudge(self, cut: bool) -> str:
        return prompts.NUDGE_CUT if cut else prompts.NUDGE_NO_TOOL

    def switch(self, reply: ChatResult, known: Sequence[str], turn: int) -> TextTools | None:
        if self.fallback is None or turn != 1 or reply.tool_calls:
            return None
        return self.fallback if names_a_tool(reply.content, known) else None

    def complete(self, text: str, known: Sequence[str]) -> bool:
        return False  # the server parses the calls: the reply is read to its end


@dataclass(frozen=True)
class TextTools:
    """Tool calls written as text, described in the system prompt (`section`)."""

    section: str
    name: ToolProtocol = "text"

    def system(self, base: str) -> str:
        """The run's system prompt for a model in this format: the tools after it."""
        return f"{base}\n{self.section}"

    def request_tools(self, tools: list[ToolSchema]) -> list[ToolSchema] | None:
        return None

    def calls(self, reply: ChatResult, known: Sequence[str]) -> list[ToolCall]:
        if reply.tool_calls:  # a server that parsed a call anyway: that is the call
            return list(reply.tool_calls[:1])
        found = first_call_in_text(reply.content, known)
        return [found[0]] if found else []

    def message(self, reply: ChatResult, calls: list[ToolCall]) -> Message:
        """The reply as the model wrote it, up to the end of its call (no `tool_calls`: the
        call is in the text)."""
        if reply.tool_calls:  # the call was not in the text: write it there, as the format has it
            shown = [{"name": c.name, "arguments": c.arguments} for c in calls]
            written = "\n".join(f"```json\n{json.dumps(c)}\n```" for c in shown)
            return {"role": "assistant", "content": f"{reply.content}\n{written}".lstrip()}
        found = first_call_in_text(reply.content, [c.name for c in calls])
        content = _through_fence(reply.content, found[1]) if found else reply.content
        return {"role": "assistant", "content": content}

    def answer(self, call: ToolCall, content: str) -> Message:
        label = f"{call.name} ({call.id})" if call.id else call.name
        return {"role": "user", "content": f"{RESULT_HEAD}{label}:\n{content}"}

    def is_result(self, message: Message) -> bool:
        return message["role"] == "user" and message.get("content", "").startswith(RESULT_HEAD)

    def nudge(self, cut: bool) -> str:
        # Short (it is new to the server's cache each time); the example stays: a small model
        # imitates the shape it was just shown.
        why = "Your reply was cut off: act through tool calls, not prose. " * cut
        finish = "." if cut else " with a summary and files_changed."
        return (
            f"{why}Call a tool now: one JSON object in a fenced block, as in\n"
            f"{example_block()}\nWhen the step is done, call step_complete{finish}"
        )

    def switch(self, reply: ChatResult, known: Sequence[str], turn: int) -> TextTools | None:
        return None

    def complete(self, text: str, known: Sequence[str]) -> bool:
        """The first call is written and its fence closed (or the text goes on without one):
        what follows is dropped from the transcript anyway, so it need not be generated."""
        if "}" not in text:
            return False
        found = first_call_in_text(text, known)
        if found is None:
            return False
        rest = text[found[1] :].lstrip()
        if not rest or rest[0] in "}],:":  # nothing yet, or the call sits inside more JSON
            return False
        return rest.startswith("```") or not "```".startswith(rest[:3])


NATIVE = NativeTools()


def format_for(choice: Choice, tools: Sequence[ToolSchema]) -> ToolFormat:
    """The format of a model with this protocol `choice`: text, native, or native that goes
    over to text (`auto` without proof)."""
    if choice.protocol == "text":
        return text_tools(tools)
    return NATIVE if choice.proven else NativeTools(fallback=text_tools(tools))


def example_block() -> str:
    call = {"name": EXAMPLE_TOOL, "arguments": EXAMPLE_ARGUMENTS}
    return f"```json\n{json.dumps(call)}\n```"


def text_tools(tools: Sequence[ToolSchema]) -> TextTools:
    """The text format for `tools`: their description for the system prompt, one line each."""
    lines = [TOOLS_INTRO.format(example=example_block())]
    for tool in tools:
        function = tool["function"]
        signature = _signature(function["parameters"])
        lines.append(
            f"- {function['name']}({signature}): {_first_sentence(function['description'])}"
        )
    lines.append("</tools>\n")
    return TextTools("\n".join(lines))


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.search(r"(?<=[.!?])\s+(?=[A-Z(])", text)
    return text[: match.start()] if match else text


def _signature(schema: dict[str, Any]) -> str:
    """The parameters as a signature: `path, offset?: integer` (`?`: optional; strings untyped).
    Their descriptions are left out: on a CPU they cost a weak model more prompt time than
    they give (bench/realmodel.py), and a name with the tool's purpose says most of it."""
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        kind = "/".join(kind) if isinstance(kind, list) else str(kind)
        parts.append(
            f"{name}{'' if name in required else '?'}" + ("" if kind == "string" else f": {kind}")
        )
    return ", ".join(parts)


def _through_fence(text: str, end: int) -> str:
    """`text` up to the end of the call's JSON (at `end`), with the fence that closes it."""
    rest = text[end:]
    fence = re.match(r"\s*```", rest)
    return text[: end + (fence.end() if fence else 0)]


def names_a_tool(text: str, known: Sequence[str]) -> bool:
    """Does prose mention one of the tools by name (a model that knows of them, but whose
    server or template does not let it call them)?"""
    names = "|".join(re.escape(n) for n in known)
    return bool(names) and re.search(rf"\b(?:{names})\b", text) is not None


__all__ = [
    "NATIVE",
    "NativeTools",
    "TextTools",
    "ToolFormat",
    "format_for",
    "names_a_tool",
    "text_tools",
]
