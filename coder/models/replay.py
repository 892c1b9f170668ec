"""Record a run's model replies, and play them back without a model.

`coder run --record FILE` wraps the real provider and appends every reply to FILE (written
atomically after each call, so a crash keeps what was recorded). `coder run --replay FILE`
answers each model call with the next recorded reply: the tools run for real, so the run's
commits come out the same. Used by `coder demo`, regression tests and bug reports.

Each recorded reply is filed under the step that asked for it, so a replayed run can also be
stopped and resumed: a step always gets its own replies, whatever ran before it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from coder.errors import InvalidInput, ModelError
from coder.models.provider import ChatResult, ModelProvider, ToolCall, Usage

FORMAT = 1


def request_digest(messages: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


def reply_to_dict(result: ChatResult) -> dict[str, Any]:
    return {
        "content": result.content,
        "thinking": result.thinking,
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in result.tool_calls],
        "done_reason": result.done_reason,
        "usage": result.usage.as_dict(),
    }


def reply_from_dict(data: dict[str, Any]) -> ChatResult:
    usage = {k: v for k, v in (data.get("usage") or {}).items() if k in Usage.__dataclass_fields__}
    return ChatResult(
        content=data.get("content", ""),
        tool_calls=tuple(
            ToolCall(c["name"], dict(c.get("arguments") or {})) for c in data.get("tool_calls", [])
        ),
        thinking=data.get("thinking", ""),
        usage=Usage(**usage),
        done_reason=data.get("done_reason"),
    )


class RecordingProvider:
    def __init__(self, inner: ModelProvider, path: Path) -> None:
        self.inner = inner
        self.model = inner.model
        self.path = path
        self.calls: list[dict[str, Any]] = []
        self.step = ""
        self._lock = threading.Lock()

    def begin_step(self, step_id: str) -> None:
        self.step = step_id

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> ChatResult:
        result = self.inner.chat(messages, **kwargs)
        with self._lock:
            self.calls.append(
                {
                    "step": self.step,
                    "request": request_digest(messages),
                    "reply": reply_to_dict(result),
                }
            )
            self._save()
        return result

    def _save(self) -> None:
        from coder.durable import write_atomic

        data = {"format": FORMAT, "model": self.model, "calls": self.calls}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(data, indent=1).encode("utf-8"))

    def __getattr__(self, name: str) -> Any:  # warm_up, context_length, close, ...
        return getattr(self.inner, name)


class ReplayProvider:
    """Answers from a recording, in order; facts about the 'model' come from the file."""

    def __init__(self, path: Path) -> None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            self.calls = list(data["calls"])
            self.model = str(data.get("model", "replay"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(
                f"{path}: not a coder recording ({exc})",
                hint="record one with `coder run --record FILE`",
            ) from None
        self.path = Path(path)
        self.queues: dict[str, list[dict[str, Any]]] = {}
        for call in self.calls:
            self.queues.setdefault(str(call.get("step", "")), []).append(call["reply"])
        self.served: dict[str, int] = {}
        self.step = ""
        self._lock = threading.Lock()

    def begin_step(self, step_id: str) -> None:
        """Later attempts of a step continue with its next replies, as when recorded."""
        self.step = step_id

    def chat(self, messages: list[dict[str, Any]], **_: Any) -> ChatResult:
        with self._lock:
            queue = self.queues.get(self.step, [])
            served = self.served.get(self.step, 0)
            if served >= len(queue):
                raise ModelError(
                    f"the recording {self.path} has no reply left for step "
                    f"{self.step or '?'} (call {served + 1}); the run diverged from "
                    "the recorded one"
                )
            self.served[self.step] = served + 1
        return reply_from_dict(queue[served])

    def warm_up(self) -> dict[str, Any]:
        return {
            "provider": "replay",
            "model": self.model,
            "recording": str(self.path),
            "calls": len(self.calls),
        }

    def close(self) -> None:
        pass
