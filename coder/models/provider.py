"""The model-provider seam: typed values in and out of one chat call, and one small Protocol.

Messages are plain dicts in Ollama's shape, so a transcript can be stored and replayed as is:

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "thinking"?: str,
     "tool_calls"?: [{"function": {"name": str, "arguments": {...}}}]}
    {"role": "tool", "tool_name": str, "content": str}

(`ChatResult.as_message()` builds the assistant one.) Tools are Ollama/OpenAI function
schemas: `{"type": "function", "function": {"name", "description", "parameters"}}`.

Errors a provider raises (the tree continues `coder.errors`):

    CoderError
    ├── EnvironmentProblem
    │   └── ModelUnavailable  3  the host is unreachable or the model is not pulled
    └── ModelError            1  the call failed after retries, or the server refused it
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """What model calls cost; sums with `+` across the calls of a step or a run."""

    prompt_tokens: int = 0
    eval_tokens: int = 0
    prompt_s: float = 0
    eval_s: float = 0
    load_s: float = 0
    total_s: float = 0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        sums = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return Usage(**sums)

    @property
    def tokens_per_s(self) -> float:
        """Generation speed (eval tokens per second of eval time); 0 when unknown."""
        return self.eval_tokens / self.eval_s if self.eval_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class ChatResult:
    content: str
    tool_calls: tuple[ToolCall, ...]
    thinking: str
    usage: Usage
    done_reason: str | None

    def as_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation (Ollama's shape)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.thinking:
            message["thinking"] = self.thinking
        if self.tool_calls:
            message["tool_calls"] = [
                {"function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls
            ]
        return message


# Streaming events, delivered in order to `on_event` while a chat is in flight.


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    call: ToolCall


@dataclass(frozen=True)
class Retrying:
    """A transient failure; the call is repeated after `delay_s`. Deltas already delivered
    belong to the abandoned attempt (a live display should reset). Providers log nothing, so
    this is how callers learn about retries."""

    attempt: int
    reason: str
    delay_s: float


@dataclass(frozen=True)
class Done:
    result: ChatResult


ChatEvent = TextDelta | ToolCallEvent | Retrying | Done


class ModelProvider(Protocol):
    """A chat model. `chat` streams internally, calls `on_event` per event, and returns the
    accumulated result; it raises ModelUnavailable or ModelError, never a transport error."""

    model: str

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        format: dict[str, Any] | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult: ...
