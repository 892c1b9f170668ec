"""A model server's prompt cache in miniature, shared by the fake servers: what a KV cache can
reuse of a request is its longest common prefix with a prompt the server still holds."""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import Any


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


class PrefixCache:
    """`slots` prompts kept; a request reuses the longest common prefix with any of them, and
    takes over that slot when the prefix is at least half the request (llama.cpp's
    slot_prompt_similarity), else the least recently used one. Counts are in tokens of a
    quarter of the characters, like the fakes' prompt sizes."""

    def __init__(self, slots: int = 1) -> None:
        self.slots: deque[str] = deque(maxlen=max(1, slots))
        self.cached: list[int] = []  # tokens served from the cache, per request
        self.prompt: list[int] = []  # prompt tokens, per request
        self._lock = threading.Lock()

    def use(self, body: dict[str, Any]) -> int:
        """Tokens of the request's prompt served from the cache (recorded)."""
        prompt = render(body)
        with self._lock:
            best, where = 0, None
            for i, held in enumerate(self.slots):
                n = common_prefix(held, prompt)
                if n > best:
                    best, where = n, i
            if where is not None and best * 2 >= len(prompt):
                del self.slots[where]
            self.slots.append(prompt)
            self.cached.append(best // 4)
            self.prompt.append(len(prompt) // 4)
            return best // 4

    @property
    def share(self) -> float:
        """Cached tokens over prompt tokens, over every request so far."""
        return sum(self.cached) / sum(self.prompt) if sum(self.prompt) else 0.0
