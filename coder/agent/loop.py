"""The model loop of one step: ask, run the tool calls, repeat, until `step_complete` is
accepted or a bound is hit.

The conversation only grows (each request starts with the previous one, byte for byte), so the
server reuses its cache. The step ends only through `step_complete`, and only when the harness
accepts the claim (`verify`); plain text gets a nudge, a call repeated unchanged gets a nudge
and then ends the step; tool calls written as JSON in the text are recovered.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coder.agent import prompts
from coder.agent.repair import calls_in_text
from coder.models.provider import ChatResult, ModelProvider, ToolCall, Usage

TERMINAL = "step_complete"
CHARS_PER_TOKEN = 4  # a conservative estimate for code and English
FILL = 0.85  # fold older tool results beyond this share of the context window
KEEP_RECENT = 2  # the newest tool results are never folded
FOLDED = "[folded to save context:"


def estimate_tokens(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> int:
    size = sum(
        len(str(m.get("content", ""))) + len(json.dumps(m.get("tool_calls", ""))) for m in messages
    )
    return (size + len(json.dumps(tools))) // CHARS_PER_TOKEN + 8 * len(messages)


def _fold(text: str) -> str:
    first = text.strip().splitlines()[0][:120] if text.strip() else ""
    return f"{FOLDED} {first} ... ({len(text)} characters; call the tool again if needed)]"


def _truncation_warning(reply: ChatResult, estimate: int) -> str | None:
    if reply.done_reason == "length":
        return "the reply hit the length limit (done_reason=length); it may be cut short"
    sent = reply.usage.prompt_tokens
    if sent and estimate > 2000 and sent < estimate // 2:
        return (
            f"the server evaluated {sent} prompt tokens for a request of about {estimate}: "
            "it probably dropped part of the conversation (num_ctx too small?)"
        )
    return None


@dataclass(frozen=True)
class Limits:
    max_turns: int = 30
    max_seconds: float = 900.0
    max_tokens: int | None = None  # prompt + generated, summed over the step's calls
    max_nudges: int = 3  # replies without a tool call
    max_repeats: int = 3  # identical consecutive calls: nudged at 2, the step fails at 3
    context_tokens: int | None = None  # the num_ctx sent to the server; None: no budgeting


@dataclass
class LoopResult:
    ok: bool
    summary: str = ""
    claim: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)


ToolRunner = Callable[[str, dict[str, Any]], str]  # (name, arguments) -> text for the model
Verifier = Callable[[dict[str, Any]], str | None]  # step_complete arguments -> rejection or None


class AgentLoop:
    def __init__(
        self,
        provider: ModelProvider,
        *,
        tools: Sequence[dict[str, Any]],
        allowed: Sequence[str],
        run_tool: ToolRunner,
        verify: Verifier,
        limits: Limits = Limits(),
        cancel: threading.Event | None = None,
        on_call: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.provider = provider
        self.tools = list(tools)
        self.known = [t["function"]["name"] for t in self.tools]
        self.allowed = list(allowed)
        self.run_tool = run_tool
        self.verify = verify
        self.limits = limits
        self.cancel = cancel
        self.on_call = on_call or (lambda _event: None)

    def run(self, messages: list[dict[str, Any]]) -> LoopResult:
        """`messages` is the prefix (system prompt) plus the step's first user message; it is
        extended in place, so the caller keeps the transcript."""
        result = LoopResult(ok=False, messages=messages)
        started = time.monotonic()
        nudges = 0
        last_call: tuple[str, str] | None = None
        repeats = 0
        while True:
            stop = self._limit_hit(result, started)
            if stop:
                result.error = stop
                return result
            folded = self._fit(messages)
            if folded:
                self.on_call(
                    {
                        "event": "context.compacted",
                        "folded": folded,
                        "estimate": estimate_tokens(messages, self.tools),
                    }
                )
            estimate = estimate_tokens(messages, self.tools)
            reply = self.provider.chat(messages, tools=self.tools)
            result.turns += 1
            result.usage = result.usage + reply.usage
            warning = _truncation_warning(reply, estimate)
            if warning:
                self.on_call({"event": "context.warning", "warning": warning})
            calls = list(reply.tool_calls) or calls_in_text(reply.content, self.known)
            messages.append(_assistant_message(reply, calls))
            self.on_call(
                {
                    "turn": result.turns,
                    "calls": [c.name for c in calls],
                    "usage": reply.usage.as_dict(),
                }
            )
            if not calls:
                nudges += 1
                if nudges > self.limits.max_nudges:
                    result.error = (
                        f"the model answered {nudges} times without calling a tool "
                        "(it must finish with step_complete)"
                    )
                    return result
                messages.append({"role": "user", "content": prompts.NUDGE_NO_TOOL})
                continue
            for call in calls:
                key = (call.name, json.dumps(call.arguments, sort_keys=True))
                repeats = repeats + 1 if key == last_call else 1
                last_call = key
                if repeats >= self.limits.max_repeats:
                    result.error = (
                        f"the model repeated the same {call.name} call {repeats} times; "
                        "stopping the step"
                    )
                    return result
                if repeats == self.limits.max_repeats - 1:
                    messages.append(
                        _tool_message(call.name, prompts.nudge_repeat(call.name, repeats))
                    )
                    continue
                if call.name not in self.allowed:
                    messages.append(
                        _tool_message(call.name, prompts.not_for_this_step(call.name, self.allowed))
                    )
                    continue
                if call.name == TERMINAL:
                    rejection = self.verify(call.arguments)
                    if rejection is None:
                        result.ok = True
                        result.summary = str(call.arguments.get("summary", "")).strip()
                        result.claim = dict(call.arguments)
                        messages.append(_tool_message(call.name, "accepted"))
                        return result
                    messages.append(_tool_message(call.name, f"rejected: {rejection}"))
                    continue
                messages.append(_tool_message(call.name, self.run_tool(call.name, call.arguments)))

    def _fit(self, messages: list[dict[str, Any]]) -> int:
        """Ollama silently drops the oldest messages of a prompt longer than num_ctx, so coder
        budgets itself: past FILL of the window, older tool results are folded into one-line
        notes (newest first kept), then an oversized last result is cut. Returns how many
        messages were changed (0: the request fits as it is, and stays a pure extension)."""
        if self.limits.context_tokens is None:
            return 0
        budget = int(self.limits.context_tokens * FILL)
        changed = 0
        tool_indexes = [i for i, m in enumerate(messages) if m["role"] == "tool"]
        for i in tool_indexes[:-KEEP_RECENT]:
            if estimate_tokens(messages, self.tools) <= budget:
                return changed
            if not messages[i]["content"].startswith(FOLDED):
                messages[i] = {**messages[i], "content": _fold(messages[i]["content"])}
                changed += 1
        for i in sorted(tool_indexes, key=lambda i: -len(messages[i]["content"])):
            excess = estimate_tokens(messages, self.tools) - budget
            if excess <= 0:
                break
            text = messages[i]["content"]
            keep = max(200, len(text) - excess * CHARS_PER_TOKEN - 200)
            if keep < len(text):
                messages[i] = {
                    **messages[i],
                    "content": text[: keep // 2]
                    + (
                        f"\n[... {len(text) - keep} characters cut to fit the context window; "
                        "ask for a smaller part (fs_read with offset/limit) ...]\n"
                    )
                    + text[-keep // 2 :],
                }
                changed += 1
        return changed

    def _limit_hit(self, result: LoopResult, started: float) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            return "interrupted"
        if result.turns >= self.limits.max_turns:
            return f"turn limit reached ({self.limits.max_turns} model turns) without step_complete"
        if time.monotonic() - started > self.limits.max_seconds:
            return f"time limit reached ({self.limits.max_seconds:.0f}s) without step_complete"
        used = result.usage.prompt_tokens + result.usage.eval_tokens
        if self.limits.max_tokens is not None and used > self.limits.max_tokens:
            return f"token budget exhausted ({used} of {self.limits.max_tokens} tokens)"
        return None


def _assistant_message(reply: ChatResult, calls: Sequence[ToolCall]) -> dict[str, Any]:
    message = reply.as_message()
    if calls and not reply.tool_calls:  # recovered from text: record them as real calls
        message["tool_calls"] = [
            {"function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def _tool_message(name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_name": name, "content": content}
