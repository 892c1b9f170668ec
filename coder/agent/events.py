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

Every event carries `turn` (1-based; 0 before the first call). Times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from coder.models.provider import Usage


@dataclass(frozen=True)
class TurnStarted:
    turn: int
    prompt_estimate: int  # tokens, estimated from the request's size
    elapsed_s: float  # since the loop started


@dataclass(frozen=True)
class ModelText:
    turn: int
    text: str  # this delta
    chars: int  # the reply's text so far
    tokens: int  # estimated tokens generated so far in this call
    elapsed_s: float  # since the call started
    tokens_per_s: float  # tokens / elapsed_s


@dataclass(frozen=True)
class ToolStarted:
    turn: int
    name: str
    target: str  # what the call is about: a path, a command, a pattern ("" if none)

    @property
    def label(self) -> str:
        return f"{self.name} {self.target}".strip()


@dataclass(frozen=True)
class ToolFinished:
    turn: int
    name: str
    duration_s: float


@dataclass(frozen=True)
class TurnFinished:
    turn: int
    calls: tuple[str, ...]  # tool names, as called (recovered from text included)
    usage: Usage  # this call's
    total: Usage  # the loop's so far
    done_reason: str | None  # stop | length (output cap) | cut (prose with no tool call)
    duration_s: float


@dataclass(frozen=True)
class Nudged:
    turn: int
    reason: str  # no_tool_call | repeated_call | not_allowed | rejected_claim
    detail: str


@dataclass(frozen=True)
class ContextCompacted:
    turn: int
    folded: int  # messages changed
    estimate: int  # tokens after folding


@dataclass(frozen=True)
class ContextSummarized:
    turn: int
    replaced: int  # messages the summary replaced (0: it fell back to folding)
    chars: int  # the summary's length
    estimate: int  # tokens after it
    reason: str  # why it fell back ("" when it did not)


@dataclass(frozen=True)
class ContextWarning:
    turn: int
    message: str


@dataclass(frozen=True)
class ModelRetrying:
    turn: int
    attempt: int
    reason: str
    delay_s: float


@dataclass(frozen=True)
class EndpointSwitched:
    turn: int
    endpoint: str
    next_endpoint: str
    reason: str


@dataclass(frozen=True)
class ProtocolSwitched:
    turn: int
    protocol: str  # the tool protocol the conversation goes on in ("text")
    reason: str


@dataclass(frozen=True)
class LoopFinished:
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
