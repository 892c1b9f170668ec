"""Record a run's model replies, and play them back without a model.

`coder run --record FILE` wraps the real provider and appends every reply to FILE (written
atomically after each call, so a crash keeps what was recorded). `coder run --replay FILE`
answers each model call with the next recorded reply: the tools run for real, so the run's
commits come out the same. Used by `coder demo`, regression tests and bug reports.

Each recorded reply is filed under the step that asked for it, so a replayed run can also be
stopped and resumed: a step always gets its own replies, whatever ran before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Required, TypedDict

from coder import yamldoc
from coder.errors import InvalidInput, ModelError, ModelUnavailable, StopReply
from coder.files.durable import write_atomic
from coder.models.provider import (
    Arguments,
    ChatEvent,
    ChatResult,
    Done,
    Message,
    ModelFacts,
    ModelProvider,
    Models,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSchema,
    Usage,
    UsageRecord,
)

FORMAT = 1


def request_digest(messages: list[Message]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


class RecordedCall(TypedDict, total=False):
    name: Required[str]
    arguments: Arguments
    id: str


class Reply(TypedDict, total=False):
    """A model's reply as a recording keeps it."""

    content: str
    thinking: str
    tool_calls: list[RecordedCall]
    done_reason: str | None
    usage: UsageRecord


class Recorded(TypedDict):
    """One call of a recording: the step that made it, a digest of what it sent, the reply."""

    step: str
    request: str
    reply: Reply


def reply_to_dict(result: ChatResult) -> Reply:
    return {
        "content": result.content,
        "thinking": result.thinking,
        "tool_calls": [_recorded_call(c) for c in result.tool_calls],
        "done_reason": result.done_reason,
        "usage": result.usage.as_dict(),
    }


def _recorded_call(call: ToolCall) -> RecordedCall:
    recorded: RecordedCall = {"name": call.name, "arguments": call.arguments}
    if call.id:
        recorded["id"] = call.id
    return recorded


def reply_from_dict(data: Reply) -> ChatResult:
    return ChatResult(
        content=data.get("content", ""),
        tool_calls=tuple(
            ToolCall(c["name"], dict(c.get("arguments") or {}), c.get("id"))
            for c in data.get("tool_calls", [])
        ),
        thinking=data.get("thinking", ""),
        usage=Usage.from_dict(data.get("usage")),
        done_reason=data.get("done_reason"),
    )


class RecordingModels:
    """Wraps the run's models; every reply is appended to the recording under its step."""

    def __init__(self, inner: Models, path: Path) -> None:
        self.inner = inner
        self.model = inner.model
        self.path = path
        self.calls: list[Recorded] = []
        self._lock = threading.Lock()

    def for_step(self, step_id: str, model: str | None = None) -> _StepRecorder:
        return _StepRecorder(self, self.inner.for_step(step_id, model), step_id)

    def record(self, step_id: str, messages: list[Message], result: ChatResult) -> None:
        with self._lock:
            self.calls.append(
                {
                    "step": step_id,
                    "request": request_digest(messages),
                    "reply": reply_to_dict(result),
                }
            )
            self._save()

    def _save(self) -> None:
        data = {"format": FORMAT, "model": self.model, "calls": self.calls}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(data, indent=1).encode("utf-8"))

    def warm_up(self, model: str | None = None) -> ModelFacts:
        return self.inner.warm_up(model)

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        self.inner.prime(messages, tools, model, width)  # not a reply of any step: not recorded

    def close(self) -> None:
        self.inner.close()


class _StepRecorder:
    def __init__(self, recording: RecordingModels, inner: ModelProvider, step_id: str) -> None:
        self.recording, self.inner, self.step_id = recording, inner, step_id
        self.model = inner.model

    def chat(self, messages: list[Message], **kwargs: Any) -> ChatResult:
        result = self.inner.chat(messages, **kwargs)
        self.recording.record(self.step_id, messages, result)
        return result

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self.inner.embed(texts)  # a tool's input, not a reply: not recorded

    def warm_up(self) -> ModelFacts:
        return self.inner.warm_up()

    def close(self) -> None:
        self.inner.close()


class ReplayModels:
    """Answers from a recording, in order per step; facts about the 'model' come from the
    file. Later attempts of a step continue with its next replies, as when recorded."""

    def __init__(self, path: Path) -> None:
        try:
            data = yamldoc.loads_json(Path(path).read_text(encoding="utf-8"))
            self.calls = list(data["calls"])
            self.model = str(data.get("model", "replay"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(
                f"{path}: not a coder recording ({exc})",
                hint="record one with `coder run --record FILE`",
            ) from None
        self.path = Path(path)
        self.queues: dict[str, list[Reply]] = {}
        for call in self.calls:
            self.queues.setdefault(str(call.get("step", "")), []).append(call["reply"])
        self.served: dict[str, int] = {}
        self._lock = threading.Lock()

    def for_step(self, step_id: str, model: str | None = None) -> _StepReplay:
        return _StepReplay(self, step_id)

    def next_reply(self, step_id: str) -> ChatResult:
        with self._lock:
            queue = self.queues.get(step_id, [])
            served = self.served.get(step_id, 0)
            if served >= len(queue):
                raise ModelError(
                    f"the recording {self.path} has no reply left for step "
                    f"{step_id or '?'} (call {served + 1}); the run diverged from "
                    "the recorded one"
                )
            self.served[step_id] = served + 1
        return reply_from_dict(queue[served])

    def warm_up(self, model: str | None = None) -> ModelFacts:
        return ModelFacts(
            provider="replay",
            model=self.model,
            extra={"recording": str(self.path), "calls": len(self.calls)},
        )

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        pass  # no server

    def close(self) -> None:
        pass


class _StepReplay:
    def __init__(self, replay: ReplayModels, step_id: str) -> None:
        self.replay, self.step_id, self.model = replay, step_id, replay.model

    def chat(
        self,
        messages: list[Message],
        *,
        on_event: Callable[[ChatEvent], None] | None = None,
        **_: Any,
    ) -> ChatResult:
        """The recorded reply, streamed to `on_event` as a whole (a recorded reply is already
        what it was: a StopReply from the callback changes nothing)."""
        result = self.replay.next_reply(self.step_id)
        if on_event is not None:
            with contextlib.suppress(StopReply):
                if result.content:
                    on_event(TextDelta(result.content))
                for call in result.tool_calls:
                    on_event(ToolCallEvent(call))
            on_event(Done(result))
        return result

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise ModelUnavailable(f"a replay of {self.replay.path} has no embedding model")

    def warm_up(self) -> ModelFacts:
        return self.replay.warm_up()

    def close(self) -> None:
        pass
