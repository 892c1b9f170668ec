"""An in-process fake model for unit tests (llm's `enqueue`/`history` fake is the model).

    fake = FakeProvider()
    fake.enqueue("Let me look.", reply(calls=[ToolCall("fs_read", {"path": "a.py"})]))
    loop = AgentLoop(fake, ...)
    fake.history[0].messages          # what the first call was sent

It streams like a real provider (word-sized `TextDelta`s, a `ToolCallEvent` per call, `Done`),
honours `StopReply` from the callback (the reply is cut, done_reason "cut"), and raises an
enqueued exception in place of a reply (ModelError, HostUnreachable, ...). `embed` gives
deterministic vectors (a hashed bag of words), or raises an exception at the head of the
queue. It is also a `Models` source: `for_step` returns the fake itself and notes the step.
The HTTP fakes in tests/ stay for the client path; this one is for the loop and the layers
above it.
"""

from __future__ import annotations

import copy
import hashlib
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coder.errors import ModelError, StopReply
from coder.models.provider import (
    ChatEvent,
    ChatResult,
    Done,
    Message,
    ModelFacts,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSchema,
    Usage,
    estimate_tokens,
)
from coder.schemas import JsonSchema

Scripted = ChatResult | str | BaseException


def reply(
    content: str = "",
    calls: Iterable[ToolCall] = (),
    *,
    done_reason: str = "stop",
    prompt_tokens: int = 100,
    cached_tokens: int | None = None,
) -> ChatResult:
    """A scripted reply; usage counts `prompt_tokens` and a quarter of the text generated."""
    calls = tuple(calls)
    generated = content + "".join(c.name + repr(c.arguments) for c in calls)
    return ChatResult(
        content,
        calls,
        "",
        Usage(
            prompt_tokens=prompt_tokens,
            eval_tokens=estimate_tokens(generated),
            eval_s=0.01,
            calls=1,
            cached_tokens=cached_tokens or 0,
            cache_reports=int(cached_tokens is not None),
        ),
        done_reason,
    )


def call(name: str, **arguments: Any) -> ChatResult:
    """A scripted reply that calls one tool."""
    return reply(calls=[ToolCall(name, arguments)])


@dataclass(frozen=True)
class FakeCall:
    step: str
    messages: list[Message]  # a deep copy, as sent
    tools: list[ToolSchema] | None
    format: JsonSchema | str | None


@dataclass
class FakeProvider:
    model: str = "fake"
    num_ctx: int | None = None
    history: list[FakeCall] = field(default_factory=list)
    closed: bool = False
    step: str = ""
    primed: list[list[Message]] = field(default_factory=list)
    embedded: list[list[str]] = field(default_factory=list)  # the texts of each embed call
    _queue: deque[Scripted] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enqueue(self, *replies: Scripted) -> None:
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def for_step(self, step_id: str, model: str | None = None) -> FakeProvider:
        self.step = step_id
        return self

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSchema] | None = None,
        format: JsonSchema | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult:
        emit = on_event or (lambda event: None)
        with self._lock:
            self.history.append(FakeCall(self.step, copy.deepcopy(messages), tools, format))
            if not self._queue:
                raise ModelError("fake provider: no scripted reply left")
            scripted = self._queue.popleft()
        if isinstance(scripted, BaseException):
            raise scripted
        result = reply(scripted) if isinstance(scripted, str) else scripted
        sent: list[str] = []
        try:
            for piece in re.findall(r"\s*\S+\s*|\s+", result.content):
                sent.append(piece)
                emit(TextDelta(piece))
            for tool_call in result.tool_calls:
                emit(ToolCallEvent(tool_call))
        except StopReply:
            text = "".join(sent)
            cut = Usage(eval_tokens=estimate_tokens(text), calls=1)
            return ChatResult(text, (), "", cut, "cut")
        emit(Done(result))
        return result

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """A hashed bag of each text's words (16 dimensions, L2-normalised): texts sharing
        words are near each other. An enqueued exception is raised here too."""
        with self._lock:
            self.embedded.append(list(texts))
            failure = self._queue[0] if self._queue else None
            if isinstance(failure, BaseException):
                self._queue.popleft()
                raise failure
        vectors = []
        for text in texts:
            vector = [0.0] * 16
            for word in re.findall(r"[a-z]+", text.lower()):
                vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % 16] += 1.0
            norm = sum(v * v for v in vector) ** 0.5 or 1.0
            vectors.append([v / norm for v in vector])
        return vectors

    def list_models(self) -> list[str]:
        return [self.model]

    def warm_up(self, model: str | None = None) -> ModelFacts:
        return ModelFacts(provider="fake", model=model or self.model, num_ctx=self.num_ctx)

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        self.primed.append(copy.deepcopy(messages))

    def close(self) -> None:
        self.closed = True
