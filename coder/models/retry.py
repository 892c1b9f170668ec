"""Bounded retries for model calls, shared by the providers.

A provider's `classify(exc)` says what a failure is: it returns the reason to retry a
transient one, raises the user-facing error for a fatal one (HostUnreachable, ModelMissing,
ModelError), or returns None for an exception that is not a transport failure at all (a bug,
or the caller's own exception), which is re-raised as is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from coder.errors import ModelError
from coder.models.provider import ChatEvent, Retrying

T = TypeVar("T")
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # at least 1
    backoff_s: float = 0.5  # doubled after each attempt, capped at MAX_BACKOFF_S
    sleep: Callable[[float], None] = time.sleep

    def run(
        self,
        action: Callable[[], T],
        classify: Callable[[Exception], str | None],
        failed: Callable[[str], ModelError],
        emit: Callable[[ChatEvent], None] | None = None,
    ) -> T:
        """`action()`, retried on transient failures; `failed(reason)` is raised when the
        attempts run out. Each retry is reported to `emit` as a `Retrying` event."""
        attempts = max(1, self.attempts)
        reason = ""
        for attempt in range(1, attempts + 1):
            try:
                return action()
            except Exception as exc:
                transient = classify(exc)  # raises the fatal ones
                if transient is None:
                    raise
                reason = transient
            if attempt == attempts:
                break
            delay = min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
            if emit is not None:
                emit(Retrying(attempt, reason, delay))
            self.sleep(delay)
        raise failed(reason)
