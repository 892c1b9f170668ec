"""An endpoint's slots: how many requests it serves at once, and which slot each one takes.

A llama.cpp server started with `--parallel N` (its GET /props says `total_slots`), vLLM, or
an Ollama started with OLLAMA_NUM_PARALLEL=N decodes N requests at once. The router lets up
to N of a run's requests be in flight at such an endpoint, one per slot, so the steps of a
parallel level run side by side against one server, and no more than N: the rest wait here,
in coder, where a stop can end the wait (below), not in the server's queue.

Each of the server's slots also keeps a KV cache: the prompt of the last request it served.
A step is given a slot of its own when it is pinned to the endpoint (`assign`: the slot the
fewest live steps hold, so a level no wider than the server's slots gives each step its
own), and each request of the step takes that slot (`use`), waiting while another step's
request holds it: every request then finds its own step's prefix in its slot's cache, as it
would in a sequential run's one slot. While a request is made, `current()` is its slot, for
a server that lets the client choose (llama.cpp's `id_slot`); Ollama itself gives a request
the idle slot whose prompt shares the most with it.

Waiting for a slot is bounded like the request it is for (coder.models.bounds): the run's
stop or the step's deadline ends the wait with `Abandoned`.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from coder.models import bounds

_current: contextvars.ContextVar[int | None] = contextvars.ContextVar("slot", default=None)


class Slots:
    """The slots of one endpoint (`size` of them: 1 unless the server or the config says)."""

    def __init__(self, size: int = 1) -> None:
        self._changed = threading.Condition()
        self._holders = [0] * max(1, size)  # live steps each slot is assigned to
        self._busy = [False] * max(1, size)  # a request is in flight on the slot

    @property
    def size(self) -> int:
        return len(self._busy)

    def grow(self, size: int) -> None:
        """The endpoint serves `size` at once (learned after the pool was made); never
        shrinks, as a step may hold a slot past the new size."""
        with self._changed:
            extra = size - len(self._busy)
            if extra > 0:
                self._holders += [0] * extra
                self._busy += [False] * extra
                self._changed.notify_all()

    def assign(self) -> int:
        """A slot for a new step: the one the fewest live steps hold (ties: the first)."""
        with self._changed:
            slot = min(range(len(self._holders)), key=lambda i: self._holders[i])
            self._holders[slot] += 1
            return slot

    def release(self, slot: int) -> None:
        """The step that held `slot` ended (or moved to another endpoint)."""
        with self._changed:
            self._holders[slot] -= 1

    @contextmanager
    def use(self, slot: int) -> Iterator[None]:
        """Hold `slot` for one request (waiting while another holds it), within the current
        bound: its end raises Abandoned while waiting."""
        bound = bounds.current()
        with self._changed:
            while self._busy[slot]:
                if bound is not None:
                    bound.check()
                self._changed.wait(bounds.POLL_S if bound is not None else None)
            self._busy[slot] = True
        token = _current.set(slot)
        try:
            yield
        finally:
            _current.reset(token)
            with self._changed:
                self._busy[slot] = False
                self._changed.notify_all()


def current() -> int | None:
    """The slot of the request this thread is making, if the router gave it one."""
    return _current.get()
