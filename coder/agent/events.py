"""What the agent loop reports while it works: typed events, delivered in order to the
`on_event` callback the step passes in (the step logs some, a live view draws all).

    TurnStarted        a model call begins
    ModelText          a piece of the reply's text streamed in (with running counts)
    ToolStarted        a tool call begins (`fs_edit app.py`, `tests_run`)
    ToolFinished       it returned
    TurnFinished       the model call ended: its calls, usage, why it stopped
    Nudged             the model was told to act differently (no tool call, a repeat, ...)
    ContextCompacted   older tool results were folded to fit the context window
    ContextSummarized  before folding, the model summarised the older turns (or why not)
    ContextWarning     the server probably cut the prompt, or a reply hit the output cap
    ModelRetrying      a transient failure; the call is repeated (text so far is void)
    EndpointSwitched   the step's endpoint refused; the call goes on at another
    ProtocolSwitched   the model does not call tools natively: the step goes on with text tools
    LoopFinished       the loop ended: accepted, or why not

Every event carries `turn` (1-based; 0 before the first call). Times are seconds. An event
worth keeping says how the event log keeps it (`logged()`: its name, level and fields); the
others are only drawn live (a line per token would drown the log).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from coder.models.provider import Usage

Level = Literal["info", "warning"]


@dataclass(frozen=True)
class LogLine:
    """A loop event as the event log keeps it."""

    event: str  # the line's name: "model.turn"
    level: Level
    fields: dict[str, Any]


class Logged:
    """What a loop event says of itself in the event log: `log_name` (None: not written),
    `log_level`, and `log_fields()` (all of its own fields, unless it says otherwise)."""

    log_name: ClassVar[str | None] = None
    log_level: ClassVar[Level] = "info"

    def log_fields(self) -> dict[str, Any]:
        return dict(vars(self))  # a dataclass's fields, in their order

    def logged(self) -> LogLine | None:
        """The event's line in the event log, or None when it is only drawn live."""
        if self.log_name is None:
            return None
        return LogLine(self.log_name, self.log_level, self.log_fields())


@dataclass(frozen=True)
class TurnStarted(Logged):
    turn: int
    prompt_estimate: int  # tokens, estimated from the request's size
    elapsed_s: float  # since the loop started


@dataclass(frozen=True)
class ModelText(Logged):
    turn: int
    text: str  # this delta
    chars: int  # the reply's text so far
    tokens: int  # estimated tokens generated so far in this call
    elapsed_s: float  # since the call started
    tokens_per_s: float  # tokens / elapsed_s


@dataclass(frozen=True)
class ToolStarted(Logged):
    turn: int
    name: str
    target: str  # what the call is about: a path, a command, a pattern ("" if none)

    @property
    def label(self) -> str:
        return f"{self.name} {self.target}".strip()


@dataclass(frozen=True)
class ToolFinished(Logged):
    turn: int
    name: str
    duration_s: float


@dataclass(frozen=True)
class TurnFinished(Logged):
    log_name = "model.turn"

    turn: int
    calls: tuple[str, ...]  # tool names, as called (recovered from text included)
    usage: Usage  # this call's
    total: Usage  # the loop's so far
    done_reason: str | None  # stop | length (output cap) | cut (prose with no tool call)
    duration_s: float

    def log_fields(self) -> dict[str, Any]:  # the call's usage, not the loop's total
        return {
            "turn": self.turn,
            "calls": list(self.calls),
            "usage": self.usage.as_dict(),
            "done_reason": self.done_reason,
            "duration_s": round(self.duration_s, 3),
        }


@dataclass(frozen=True)
class Nudged(Logged):
    log_name = "model.nudged"

    turn: int
    reason: str  # no_tool_call | repeated_call | not_allowed | rejected_claim
    detail: str


@dataclass(frozen=True)
class ContextCompacted(Logged):
    log_name = "context.compacted"
    log_level = "warning"

    turn: int
    folded: int  # messages changed
    estimate: int  # tokens after folding


@dataclass(frozen=True)
class ContextSummarized(Logged):
    turn: int
    replaced: int  # messages the summary replaced (0: it fell back to folding)
    chars: int  # the summary's length
    estimate: int  # tokens after it
    reason: str  # why it fell back ("" when it did not)

    def logged(self) -> LogLine:
        said = {"turn": self.turn, "replaced": self.replaced, "chars": self.chars}
        if self.replaced:
            return LogLine("context.summarized", "info", {**said, "estimate": self.estimate})
        # folding goes on as before
        return LogLine("context.summary_failed", "warning", {**said, "reason": self.reason})


@dataclass(frozen=True)
class ContextWarning(Logged):
    log_name = "context.warning"
    log_level = "warning"

    turn: int
    message: str

    def log_fields(self) -> dict[str, Any]:
        return {"turn": self.turn, "warning": self.message}


@dataclass(frozen=True)
class ModelRetrying(Logged):
    log_name = "model.retrying"
    log_level = "warning"

    turn: int
    attempt: int
    reason: str
    delay_s: float


@dataclass(frozen=True)
class EndpointSwitched(Logged):
    log_name = "model.endpoint_down"
    log_level = "warning"

    turn: int
    endpoint: str
    next_endpoint: str
    reason: str


@dataclass(frozen=True)
class ProtocolSwitched(Logged):
    log_name = "model.protocol"
    log_level = "warning"

    turn: int
    protocol: str  # the tool protocol the conversation goes on in ("text")
    reason: str


@dataclass(frozen=True)
class LoopFinished(Logged):
    turn: int
    ok: bool
    reason: str  # the summary when ok, else why the step did not finish
    usage: Usage


LoopEvent = (
    TurnStarted
    | ModelText
    | ToolStarted
    | ToolFinished
    | TurnFinished
    | Nudged
    | ContextCompacted
    | ContextSummarized
    | ContextWarning
    | ModelRetrying
    | EndpointSwitched
    | ProtocolSwitched
    | LoopFinished
)
