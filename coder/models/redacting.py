"""The one door to a model: every request a run or a plan sends passes the run's redactor here,
right before the provider, whatever built the message (the prefix, a step's first message with
its focus list, a tool result, a nudge, an external tool's description, a text to embed). So no
message kind, present or future, reaches a model unredacted.

`open_models` and `open_embedder` (coder.models.factory) wrap what they return, and take the
redactor as a required argument. Redaction is deterministic: the same text with the same known
secrets gives the same bytes, so the cache-stable prefix stays byte-identical from request to
request (a secret registered mid-run changes only the messages that held it, which is the
point). Each text is redacted once per set of known secrets (a memo keyed by the text), so a
conversation that only grows costs one scan per new message.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from coder.models.provider import (
    ChatEvent,
    ChatResult,
    Message,
    ModelFacts,
    ModelProvider,
    Models,
    ToolSchema,
)
from coder.redact import Redactor
from coder.schemas import JsonSchema

MEMO_LIMIT = 4096  # texts remembered per wrapper (a step's messages, the prefix, the tools)


class Scrubber:
    """Redacts requests with `redactor`, remembering what it already redacted."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._lock = threading.Lock()
        self._memo: dict[str, Any] = {}
        self._known = -1

    def text(self, text: str) -> str:
        redacted: str = self._memoized(text, text, self.redactor.redact)
        return redacted

    def value(self, value: Any) -> Any:
        """A JSON value (tool calls, tool definitions), every string in it redacted."""
        if isinstance(value, str):
            return self.text(value)
        key = "\0" + json.dumps(value, sort_keys=True, default=str)  # never a text's own key
        return copy.deepcopy(self._memoized(key, value, self.redactor.redact_obj))

    def _memoized(self, key: str, value: Any, redact: Callable[[Any], Any]) -> Any:
        with self._lock:
            if self._known != len(self.redactor):  # a new secret: what was clean may not be
                self._memo, self._known = {}, len(self.redactor)
            hit = self._memo.get(key)
        if hit is None:
            hit = redact(value)
            with self._lock:
                if len(self._memo) < MEMO_LIMIT:
                    self._memo[key] = hit
        return hit

    def messages(self, messages: Sequence[Message]) -> list[Message]:
        # every field, tool calls too: the model's own arguments go back to it
        return [cast(Message, {key: self.value(v) for key, v in m.items()}) for m in messages]

    def tools(self, tools: Sequence[ToolSchema] | None) -> list[ToolSchema] | None:
        if tools is None:
            return None
        redacted: list[ToolSchema] = self.value(list(tools))
        return redacted


class RedactedProvider:
    """A provider whose every chat and embedding request is redacted first."""

    def __init__(self, inner: ModelProvider, scrub: Scrubber) -> None:
        self.inner, self.scrub = inner, scrub
        self.model = inner.model

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSchema] | None = None,
        format: JsonSchema | str | None = None,
        on_event: Callable[[ChatEvent], None] | None = None,
    ) -> ChatResult:
        return self.inner.chat(
            self.scrub.messages(messages),
            tools=self.scrub.tools(tools),
            format=format,
            on_event=on_event,
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self.inner.embed([self.scrub.text(t) for t in texts])

    def warm_up(self) -> ModelFacts:
        return self.inner.warm_up()

    def close(self) -> None:
        self.inner.close()


class RedactedModels:
    """A run's (or a plan's) models with every request redacted (see the module docstring)."""

    def __init__(self, inner: Models, redactor: Redactor) -> None:
        self.inner = inner
        self.model = inner.model
        self.scrub = Scrubber(redactor)

    def for_step(self, step_id: str, model: str | None = None) -> RedactedProvider:
        return RedactedProvider(self.inner.for_step(step_id, model), Scrubber(self.scrub.redactor))

    def warm_up(self, model: str | None = None) -> ModelFacts:
        return self.inner.warm_up(model)

    def prime(
        self,
        messages: list[Message],
        tools: list[ToolSchema],
        model: str | None = None,
        width: int = 1,
    ) -> None:
        scrub = self.scrub
        self.inner.prime(scrub.messages(messages), scrub.tools(tools) or [], model, width)

    def close(self) -> None:
        self.inner.close()
