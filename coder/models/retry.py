"""Bounded retries for model calls, shared by the providers.

A provider's `classify(exc)` says what a failure is: it returns the reason to retry a
transient one (a `TimedOut` reason when the server did not answer in time), raises the
user-facing error for a fatal one (HostUnreachable, ModelMissing, ModelError), or returns None
for an exception that is not a transport failure at all (a bug, or the caller's own
exception), which is re-raised as is.

When the attempts run out, `failed(reason, stalled)` makes the error to raise. `stalled`: every
attempt timed out, so the server takes requests and answers none (hung, overloaded): the
environment's problem (ModelStalled, exit 3: the run stops as `error`, and resumes once the
server answers), where any other failure is the step's (ModelError).

Within a bound (coder.models.bounds: the step's time left, the run's stop) no attempt starts
once the bound is over, the wait between two attempts ends with it, and a failure after it
(the bound shut the connection down) is `Abandoned`, never retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from coder.errors import CoderError, ModelStalled
from coder.models import bounds
from coder.models.provider import ChatEvent, Retrying

T = TypeVar("T")
MAX_BACKOFF_S = 30.0


class TimedOut(str):
    """A reason to retry that says the server did not answer in time."""

    __slots__ = ()


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # at least 1
    backoff_s: float = 0.5  # doubled after each attempt, capped at MAX_BACKOFF_S
    sleep: Callable[[float], None] = time.sleep

    def run(
        self,
        action: Callable[[], T],
        classify: Callable[[Exception], str | None],
        failed: Callable[[str, bool], CoderError],
        emit: Callable[[ChatEvent], None] | None = None,
    ) -> T:
        """`action()`, retried on transient failures; `failed(reason, stalled)` is raised
        when the attempts run out. Each retry is reported to `emit` as a `Retrying` event."""
        attempts = max(1, self.attempts)
        bound = bounds.current()
        reason, stalled = "", True
        for attempt in range(1, attempts + 1):
            if bound is not None:
                bound.check()
            try:
                return action()
            except Exception as exc:
                if bound is not None:  # however its connection ended, the bound ended it
                    bound.check()
                transient = classify(exc)  # raises the fatal ones
                if transient is None:
                    raise
                reason, stalled = transient, stalled and isinstance(transient, TimedOut)
            if attempt == attempts:
                break
            delay = min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
            if emit is not None:
                emit(Retrying(attempt, reason, delay))
            (self.sleep if bound is None else bound.sleep)(delay)
        raise failed(reason, stalled)


def stalled(url: str, model: str, attempts: int, reason: str, log: str) -> ModelStalled:
    """The error for a server that answered none of `attempts` in time (`log`: where its
    side of the story is)."""
    return ModelStalled(
        f"the model server at {url} took the requests for {model} and answered none in time "
        f"({attempts} attempt(s); the last {reason})",
        hint=f"see {log}; if the model is only slow (a long prompt, a cold load), raise "
        "request_timeout in coder.config.json; `coder resume` goes on once it answers",
    )
