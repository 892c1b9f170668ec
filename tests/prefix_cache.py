"""A model server's slots in miniature, shared by the fake servers.

A server with N slots (llama.cpp's `--parallel N`, Ollama's OLLAMA_NUM_PARALLEL) serves N
requests at once, one per slot; a request that finds no idle slot waits in the server's queue.
Each slot keeps the prompt it served last (its KV cache): what a request reuses is its longest
common prefix with its own slot's prompt. A request goes to the slot it names (llama.cpp's
`id_slot`), else to the idle slot whose prompt shares the most with it when that is at least
half the request (llama.cpp's slot_prompt_similarity), else to the idle slot used least
recently. Every chat request is recorded (`spans`): when it came, got its slot and ended.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

POLL_S = 0.02  # how often a queued request looks whether the server is stopping


def is_priming(body: dict[str, Any]) -> bool:
    """A request with messages but no user turn: coder's warm prefix (system message and
    tools, cut at the first token). The fakes answer it without using a scripted reply."""
    messages = body.get("messages") or []
    return bool(messages) and not any(m.get("role") == "user" for m in messages)


def render(body: dict[str, Any]) -> str:
    """The request as a server's prompt would hold it: the tools, then each message, in order."""
    messages = "".join(json.dumps(m, sort_keys=True) for m in body.get("messages") or [])
    return json.dumps(body.get("tools") or [], sort_keys=True) + messages


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of a and b (binary search on slices: fast in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Span:
    """One chat request as the server served it, in time.monotonic() seconds."""

    came: float  # the request arrived
    start: float  # it got its slot
    end: float | None  # its answer ended (None: still in flight)
    slot: int
    priming: bool  # a warm prefix (is_priming)
    body: dict[str, Any]


def peak(spans: Iterable[Span], *, queued: bool = False) -> int:
    """The most requests served at once (`queued`: at the server at once, served or waiting
    for a slot)."""
    edges = []
    for span in spans:
        edges.append((span.came if queued else span.start, 1))
        edges.append((span.end if span.end is not None else float("inf"), -1))
    most = now = 0
    for _, step in sorted(edges):  # at equal times an end (-1) sorts before a start
        now += step
        most = max(most, now)
    return most


class PrefixCache:
    """`slots` slots (see the module docstring). Counts are in tokens of a quarter of the
    characters, like the fakes' prompt sizes."""

    def __init__(self, slots: int = 1) -> None:
        self.size = max(1, slots)
        self.held = [""] * self.size  # the prompt each slot served last
        self.cached: list[int] = []  # tokens served from the cache, per request
        self.prompt: list[int] = []  # prompt tokens, per request
        self.spans: list[Span] = []
        self._busy = [False] * self.size
        self._used = [0] * self.size  # when each slot was last taken (a counter)
        self._clock = 0
        self._changed = threading.Condition()

    def use(self, body: dict[str, Any], slot: int | None = None) -> int:
        """Tokens of the request's prompt served from the cache (recorded), on a slot taken
        and left at once."""
        with self.serve(body, slot) as read:
            return read()

    @contextmanager
    def serve(
        self,
        body: dict[str, Any],
        slot: int | None = None,
        stopping: threading.Event | None = None,
    ) -> Iterator[Callable[[], int]]:
        """Hold a slot for the request (`slot`, else one chosen as the module docstring says),
        waiting while there is none; yields `read`, which takes the prompt into the slot and
        gives the tokens it found cached (recorded). A server `stopping` ends the wait
        (ConnectionAbortedError)."""
        prompt = render(body)
        came = time.monotonic()
        with self._changed:
            while (chosen := self._choose(prompt, slot)) is None:
                if stopping is not None and stopping.is_set():
                    raise ConnectionAbortedError("the server is stopping")
                self._changed.wait(POLL_S)
            self._busy[chosen] = True
            self._clock += 1
            self._used[chosen] = self._clock
            span = Span(came, time.monotonic(), None, chosen, is_priming(body), body)
            self.spans.append(span)

        def read() -> int:
            with self._changed:
                reused = common_prefix(self.held[chosen], prompt) // 4
                self.held[chosen] = prompt
                self.cached.append(reused)
                self.prompt.append(len(prompt) // 4)
            return reused

        try:
            yield read
        finally:
            with self._changed:
                span.end = time.monotonic()
                self._busy[chosen] = False
                self._changed.notify_all()

    def _choose(self, prompt: str, wanted: int | None) -> int | None:
        """The slot for `prompt` if it is idle now (None: the request waits)."""
        if wanted is not None and 0 <= wanted < self.size:
            return None if self._busy[wanted] else wanted
        idle = [i for i in range(self.size) if not self._busy[i]]
        if not idle:
            return None
        similar = max(idle, key=lambda i: common_prefix(self.held[i], prompt))
        if common_prefix(self.held[similar], prompt) * 2 >= len(prompt):
            return similar
        return min(idle, key=lambda i: self._used[i])

    @property
    def share(self) -> float:
        """Cached tokens over prompt tokens, over every request so far."""
        return sum(self.cached) / sum(self.prompt) if sum(self.prompt) else 0.0

    def step_spans(self) -> list[Span]:
        """The spans of the steps' requests (warm prefixes left out)."""
        with self._changed:
            return [s for s in self.spans if not s.priming]
