"""The model loop of one step: `run()` repeats `step()`, and `step()` is `execute(query())`
(mini-swe-agent's shape): ask the model, run its tool calls, until `step_complete` is accepted
or a bound is hit. Every way out is a small exception carrying its message (`_LoopStop` and its
kinds, private to this module), so the loop itself has one exit.

The conversation only grows (each request starts with the previous one, byte for byte), so the
server reuses its cache. The step ends only through `step_complete`, and only when the harness
accepts the claim (`verify`); a reply without a tool call gets a nudge, a call repeated
unchanged gets a nudge and then ends the step; tool calls written as JSON in the text are
recovered. A model request that the bound it runs in ended (coder.models.bounds: the step's
time, the run's stop; a server that never answers cannot hold the step) ends the loop as a
stop (`interrupted`) or as the time limit.

Fast verdict: a reply that streams past `max_prose_chars` of text (or as many streamed pieces
as that much prose takes in tokens: a degenerate reply of short tokens) with no tool call and
nothing shaped like one is cut off (the stream is closed, so the server stops generating), as is
one past that bound, tool-shaped or not, whose last pieces repeat one short cycle (a weak
model's loop: `_summary_summary...`); a model whose replies show no attempt at the tool
format gets `max_blind_nudges` nudge(s), each reply after one cut at half the bound, before
the step fails with that reason; a reply that tried (malformed JSON, a wrong name) gets up to
`max_nudges`.

Tool calls travel natively or as text (`tool_format`, coder.agent.texttools): the format
decides what the request's `tools` are, which calls a reply holds, and how replies and results
are written back; everything else (policy, the claim check, nudges, budgets) is the same.

What happens is reported as typed events (`coder.agent.events`) to `on_event`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from coder.agent import prompts, summarize
from coder.agent.events import (
    ContextCompacted,
    ContextSummarized,
    ContextWarning,
    EndpointSwitched,
    LoopEvent,
    LoopFinished,
    ModelRetrying,
    ModelText,
    Nudged,
    ProtocolSwitched,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from coder.agent.repair import LOOP_PIECES, looks_like_tool_call, looping
from coder.agent.summarize import Summarizer
from coder.agent.texttools import NATIVE, ToolFormat
from coder.errors import Abandoned, ModelError, StopReply
from coder.models.provider import (
    Arguments,
    ChatEvent,
    ChatResult,
    EndpointDown,
    Message,
    ModelProvider,
    Retrying,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSchema,
    Usage,
)
from coder.models.provider import estimate_tokens as estimate_text_tokens
from coder.tools.registry import TERMINAL_TOOL

CHARS_PER_TOKEN = 4  # a conservative estimate for code and English
FILL = 0.85  # fold older tool results beyond this share of the context window
KEEP_RECENT = 2  # the newest tool results are never folded
FOLDED = "[folded to save context:"
TARGET_KEYS = ("path", "cmd", "command", "pattern", "query", "name")


def estimate_tokens(messages: Sequence[Message], tools: Sequence[ToolSchema]) -> int:
    size = sum(
        len(str(m.get("content", ""))) + len(json.dumps(m.get("tool_calls", ""))) for m in messages
    )
    return (size + len(json.dumps(tools))) // CHARS_PER_TOKEN + 8 * len(messages)


def _fold(text: str) -> str:
    first = text.strip().splitlines()[0][:120] if text.strip() else ""
    return f"{FOLDED} {first} ... ({len(text)} characters; call the tool again if needed)]"


def _truncation_warning(reply: ChatResult, estimate: int) -> str | None:
    if reply.done_reason == "length":
        return (
            "the reply hit the output cap (max_output_tokens, or the context window); "
            "it may be cut short"
        )
    sent = reply.usage.prompt_tokens
    if sent and estimate > 2000 and sent < estimate // 2 and not reply.usage.cache_reports:
        return (
            f"the server evaluated {sent} prompt tokens for a request of about {estimate}: "
            "it probably dropped part of the conversation (num_ctx too small?)"
        )
    return None


# -- the ways out -------------------------------------------------------------------------------


class _LoopStop(Exception):  # noqa: N818 (flow control)
    """Ends the loop; `message` says why (it becomes the step's error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Accepted(_LoopStop):
    """step_complete was called and its claim holds."""

    def __init__(self, claim: Arguments) -> None:
        super().__init__(str(claim.get("summary", "")).strip())
        self.claim = claim


class _Cancelled(_LoopStop):
    def __init__(self) -> None:
        super().__init__("interrupted")


class _LimitReached(_LoopStop):
    """A turn, time or token budget ran out."""


class _GaveUp(_LoopStop):
    """The model cannot make progress: no tool calls, or the same call over and over."""


class _ModelFailed(_LoopStop):
    """A model call failed after the provider's retries (ModelError): the step fails. An
    unusable server or model (ModelUnavailable) is not a step's failure and propagates."""


# -- the loop ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    max_turns: int = 30
    max_seconds: float = 900.0
    max_tokens: int | None = None  # prompt + generated, summed over the step's calls
    max_nudges: int = 3  # replies without a tool call (that tried the tool format)
    max_blind_nudges: int = 1  # replies with no attempt at the tool format at all
    max_prose_chars: int | None = 600  # cut a reply this long with nothing tool-shaped
    max_repeats: int = 3  # identical consecutive calls: nudged at 2, the step fails at 3
    context_tokens: int | None = None  # the num_ctx sent to the server; None: no budgeting
    summaries: bool = False  # before folding, the model summarises the older turns (summarize.py)


@dataclass
class LoopResult:
    ok: bool
    summary: str = ""
    claim: Arguments = field(default_factory=dict)
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    messages: list[Message] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # worth keeping with the step (output cap)
    protocol: str = "native"  # the tool format the conversation ended in (texttools)


ToolRunner = Callable[[str, Arguments], str]  # (name, arguments) -> text for the model
Verifier = Callable[[Arguments], str | None]  # step_complete arguments -> rejection or None
OnEvent = Callable[[LoopEvent], None]


class AgentLoop:
    def __init__(
        self,
        provider: ModelProvider,
        *,
        tools: Sequence[ToolSchema],
        allowed: Sequence[str],
        run_tool: ToolRunner,
        verify: Verifier,
        limits: Limits = Limits(),
        cancel: threading.Event | None = None,
        on_event: OnEvent | None = None,
        tool_format: ToolFormat = NATIVE,
    ) -> None:
        self.provider = provider
        self.format = tool_format  # native or text tool calls (coder.agent.texttools)
        self.tools = list(tools)
        self.known = [t["function"]["name"] for t in self.tools]
        self.allowed = list(allowed)
        self.run_tool = run_tool
        self.verify = verify
        self.limits = limits
        self.cancel = cancel
        self.emit: OnEvent = on_event or (lambda _event: None)

    @property
    def sent_tools(self) -> list[ToolSchema]:
        """The tool schemas a request carries (none in text: they are in the system prompt)."""
        return self.format.request_tools(self.tools) or []

    def run(self, messages: list[Message]) -> LoopResult:
        """`messages` is the prefix (system prompt) plus the step's first user message; it is
        extended in place, so the caller keeps the transcript (also when this raises)."""
        self.messages = messages
        self.result = LoopResult(ok=False, messages=messages)
        self.started = time.monotonic()
        self.nudges = self.blind = self.repeats = 0
        self.last_call: tuple[str, str] | None = None
        self.summarizer = (
            Summarizer(self.provider, self.sent_tools, KEEP_RECENT)
            if self.limits.summaries
            else None
        )
        try:
            while True:
                self.step()
        except _Accepted as accepted:
            self.result.ok, self.result.summary = True, accepted.message
            self.result.claim = accepted.claim
        except _LoopStop as stop:
            self.result.error = stop.message
        r = self.result
        r.protocol = self.format.name
        self.emit(LoopFinished(r.turns, r.ok, r.summary if r.ok else r.error or "", r.usage))
        return r

    def step(self) -> None:
        self.check_limits()
        try:
            reply = self.query()
        except Abandoned as exc:  # the step's bound ended a model request (coder.models.bounds)
            raise _Cancelled() if exc.stopped else self._out_of_time() from exc
        self.execute(reply)

    # -- query: one model call ---------------------------------------------------------------

    def query(self) -> ChatResult:
        folded = self._fit(self.messages)
        estimate = estimate_tokens(self.messages, self.sent_tools)
        turn = self.result.turns + 1
        if folded:
            self.emit(ContextCompacted(turn, folded, estimate))
        self.emit(TurnStarted(turn, estimate, time.monotonic() - self.started))
        watcher = _StreamWatcher(self, turn)
        began = time.monotonic()
        try:
            reply = self.provider.chat(
                self.messages, tools=self.format.request_tools(self.tools), on_event=watcher
            )
        except ModelError as exc:
            raise _ModelFailed(f"model call failed: {exc.message}") from exc
        if watcher.complete and reply.done_reason == "cut":  # ended after its call, not prose
            reply = replace(reply, done_reason="stop")
        self.result.turns = turn
        self.result.usage = self.result.usage + reply.usage
        calls = _with_ids(self.format.calls(reply, self.known), turn)
        self.messages.append(self.format.message(reply, calls))
        reply = replace(reply, tool_calls=tuple(calls))
        warning = _truncation_warning(reply, estimate)
        if warning:
            self.emit(ContextWarning(turn, warning))
            if reply.done_reason == "length":
                self.result.notes.append(f"turn {turn}: {warning}")
        self.emit(
            TurnFinished(
                turn,
                tuple(c.name for c in calls),
                reply.usage,
                self.result.usage,
                reply.done_reason,
                time.monotonic() - began,
            )
        )
        return reply

    # -- execute: act on the reply -----------------------------------------------------------

    def execute(self, reply: ChatResult) -> None:
        if not reply.tool_calls:
            self._no_tool_call(reply)
        for call in reply.tool_calls:
            self._execute_call(call)

    def _no_tool_call(self, reply: ChatResult) -> None:
        text = self.format.switch(reply, self.known, self.result.turns)
        if text is not None:  # auto chose native, and the model answers in prose
            self.format = text
            if self.summarizer is not None:  # its requests carry no tools either
                self.summarizer.tools = self.sent_tools
            self.messages[0] = {
                "role": "system",
                "content": text.system(self.messages[0]["content"]),
            }
            self.emit(
                ProtocolSwitched(self.result.turns, "text", "answered in prose naming a tool")
            )
            self.messages.append({"role": "user", "content": text.nudge(False)})
            return
        self.nudges += 1
        tried = reply.done_reason != "cut" and looks_like_tool_call(reply.content, self.known)
        self.blind += not tried
        if self.blind > self.limits.max_blind_nudges:
            raise _GaveUp(
                f"the model answered {self.blind} times in prose with no attempt at a tool "
                "call; steps are done through tools ("
                + (
                    "it did not write a call in the format the system prompt shows"
                    if self.format.name == "text"
                    else "use a model that supports tool calling, or tool_protocol: text"
                )
                + ")"
            )
        if self.nudges > self.limits.max_nudges:
            raise _GaveUp(
                f"the model answered {self.nudges} times without a usable tool call "
                "(it must finish with step_complete)"
            )
        nudge = self.format.nudge(reply.done_reason == "cut")
        self.emit(Nudged(self.result.turns, "no_tool_call", reply.done_reason or ""))
        self.messages.append({"role": "user", "content": nudge})

    def _execute_call(self, call: ToolCall) -> None:
        turn = self.result.turns
        key = (call.name, json.dumps(call.arguments, sort_keys=True))
        self.repeats = self.repeats + 1 if key == self.last_call else 1
        self.last_call = key
        if self.repeats >= self.limits.max_repeats:
            raise _GaveUp(
                f"the model repeated the same {call.name} call {self.repeats} times; "
                "stopping the step"
            )
        if self.repeats == self.limits.max_repeats - 1:
            self.emit(Nudged(turn, "repeated_call", call.name))
            self._answer(call, prompts.nudge_repeat(call.name, self.repeats))
            return
        if call.name not in self.allowed:
            self.emit(Nudged(turn, "not_allowed", call.name))
            self._answer(call, prompts.not_for_this_step(call.name, self.allowed))
            return
        self.emit(ToolStarted(turn, call.name, _target(call.arguments)))
        began = time.monotonic()
        if call.name == TERMINAL_TOOL:
            rejection = self.verify(call.arguments)
            self.emit(ToolFinished(turn, call.name, time.monotonic() - began))
            if rejection is None:
                self._answer(call, "accepted")
                raise _Accepted(dict(call.arguments))
            self.emit(Nudged(turn, "rejected_claim", rejection))
            self._answer(call, f"rejected: {rejection}")
            return
        text = self.run_tool(call.name, call.arguments)
        self.emit(ToolFinished(turn, call.name, time.monotonic() - began))
        self._answer(call, text)

    def _answer(self, call: ToolCall, content: str) -> None:
        self.messages.append(self.format.answer(call, content))

    # -- bounds ------------------------------------------------------------------------------

    def check_limits(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise _Cancelled
        if self.result.turns >= self.limits.max_turns:
            raise _LimitReached(
                f"turn limit reached ({self.limits.max_turns} model turns) without step_complete"
            )
        if time.monotonic() - self.started > self.limits.max_seconds:
            raise self._out_of_time()
        used = self.result.usage.prompt_tokens + self.result.usage.eval_tokens
        if self.limits.max_tokens is not None and used > self.limits.max_tokens:
            raise _LimitReached(
                f"token budget exhausted ({used} of {self.limits.max_tokens} tokens)"
            )

    def _out_of_time(self) -> _LimitReached:
        return _LimitReached(
            f"time limit reached ({self.limits.max_seconds:.0f}s) without step_complete"
        )

    def _fit(self, messages: list[Message]) -> int:
        """Ollama silently drops the oldest messages of a prompt longer than num_ctx, so coder
        budgets itself: past FILL of the window, older tool results are folded into one-line
        notes (newest first kept), then an oversized last result is cut. Returns how many
        messages were changed (0: the request fits as it is, and stays a pure extension)."""
        if self.limits.context_tokens is None:
            return 0
        budget = int(self.limits.context_tokens * FILL)
        room = budget - summarize.REPLY_TOKENS  # so the summary call itself fits the window
        if self.summarizer is not None and estimate_tokens(messages, self.sent_tools) > room:
            self._summarize(messages, self.limits.context_tokens)
        changed = 0
        tool_indexes = [i for i, m in enumerate(messages) if self.format.is_result(m)]
        for i in tool_indexes[:-KEEP_RECENT]:
            if estimate_tokens(messages, self.sent_tools) <= budget:
                return changed
            if not messages[i]["content"].startswith(FOLDED):
                messages[i] = {**messages[i], "content": _fold(messages[i]["content"])}
                changed += 1
        for i in sorted(tool_indexes, key=lambda i: -len(messages[i]["content"])):
            excess = estimate_tokens(messages, self.sent_tools) - budget
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

    def _summarize(self, messages: list[Message], window: int) -> None:
        """The model's summary of the older turns replaces them (summarize.py); when it
        cannot, `_fit` folds as before. Its call counts in the step's usage and budget."""
        assert self.summarizer is not None
        used = self.result.usage.prompt_tokens + self.result.usage.eval_tokens
        left = None if self.limits.max_tokens is None else self.limits.max_tokens - used
        turn = self.result.turns + 1
        outcome = self.summarizer.fit(
            messages, turn=turn, window=window, tokens_left=left, estimate=estimate_tokens
        )
        if outcome is None:
            return
        self.result.usage = self.result.usage + outcome.usage
        estimate = estimate_tokens(messages, self.sent_tools)
        self.emit(
            ContextSummarized(turn, outcome.replaced, outcome.chars, estimate, outcome.reason)
        )


class _StreamWatcher:
    """The provider's events during one call, turned into loop events; cuts off a reply that
    runs past the prose bound with nothing tool-shaped in it (raises StopReply)."""

    def __init__(self, loop: AgentLoop, turn: int) -> None:
        self.loop, self.turn = loop, turn
        self.text = ""
        self.began = time.monotonic()
        self.calls = self.pieces = 0  # pieces: streamed text deltas (each a token or more)
        self.recent: deque[str] = deque(maxlen=LOOP_PIECES)  # the last pieces (repair.looping)
        self.complete = False  # the stream was ended once the reply held all that is kept

    def __call__(self, event: ChatEvent) -> None:
        emit = self.loop.emit
        if isinstance(event, TextDelta):
            self.text += event.text
            self.pieces += 1
            self.recent.append(event.text)
            elapsed = time.monotonic() - self.began
            tokens = estimate_text_tokens(self.text)
            rate = tokens / elapsed if elapsed > 0 else 0.0
            emit(ModelText(self.turn, event.text, len(self.text), tokens, elapsed, rate))
            if self.loop.format.complete(self.text, self.loop.known):
                self.complete = True
                raise StopReply
            self._maybe_cut()
        elif isinstance(event, ToolCallEvent):
            self.calls += 1
        elif isinstance(event, Retrying):
            self.text, self.calls, self.pieces = "", 0, 0  # the attempt's text is void
            self.recent.clear()
            emit(ModelRetrying(self.turn, event.attempt, event.reason, event.delay_s))
        elif isinstance(event, EndpointDown):
            self.text, self.calls, self.pieces = "", 0, 0
            self.recent.clear()
            emit(EndpointSwitched(self.turn, event.endpoint, event.next_endpoint, event.reason))

    def _maybe_cut(self) -> None:
        bound = self.loop.limits.max_prose_chars
        if bound is None or self.calls:
            return
        if self.loop.blind:  # its replies showed no attempt yet, and it was told to call a tool
            bound //= 2
        # As many streamed pieces as `bound` characters of prose would take: a reply of short
        # tokens ("1. 1. 1. ...", a weak model's loop) is cut as soon as ordinary prose would be.
        if len(self.text) <= bound and self.pieces <= bound // CHARS_PER_TOKEN:
            return
        if not looks_like_tool_call(self.text, self.loop.known) or looping(self.recent):
            raise StopReply


def _with_ids(calls: list[ToolCall], turn: int) -> list[ToolCall]:
    """Every call gets an id (the server's when it sent one), so a tool result can name the
    call it answers (OpenAI-compatible servers need that); generated ids are deterministic,
    so a replayed run sends the same requests."""
    return [c if c.id else replace(c, id=f"call_{turn}_{i}") for i, c in enumerate(calls)]


def _target(arguments: Arguments) -> str:
    for key in TARGET_KEYS:
        value = arguments.get(key)
        if isinstance(value, str) and value:
            return value if len(value) <= 60 else value[:57] + "..."
    return ""


__all__ = [
    "AgentLoop",
    "Limits",
    "LoopResult",
    "estimate_tokens",
]
