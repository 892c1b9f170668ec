"""Bounds on model requests: the time a step has left, and the run's stop.

A model request blocks in a socket read for as long as the server takes: minutes for a long
prompt, for ever for a server that accepted the connection and hung. A Python signal handler
runs only between bytecodes of the main thread, and the run's (coder.run.drive) only sets the
run's `stop` event: the read goes on after it, and a step's `timeout` is only looked at
between two requests. So a step's requests run within a `Bound` (`within(deadline, cancel)`):
a watcher thread that, once `cancel` is set or the deadline passes, shuts down the connection
of every request in flight under it. The blocked read returns at once, the server sees its
client go (Ollama stops generating), and the request ends with `Abandoned`, which says which
of the two happened: the caller makes a stop an interrupted step and a deadline the step's
time limit (coder.agent.loop).

The providers take part in two places: their HTTP clients (httpx, or the httpx-like client of
the `openai` SDK) hand each new connection to the current bound through httpcore's documented
`trace` extension (`trace_requests`, a request event hook), and never reuse a connection
(`ONE_CONNECTION_PER_REQUEST`), so the connection of a request is its own to shut down; and the
retry loop (coder.models.retry) asks the bound before each attempt, after each failure and
while it waits between attempts, so no retry starts past the deadline.

The current bound is a context variable: it holds in the thread that entered it (a step's) and
reaches a pool's threads only through `contextvars.copy_context()` (coder.models.router).
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from coder.errors import Abandoned

T = TypeVar("T")
POLL_S = 0.1  # how often the watcher looks at the deadline and at the bound's end
# A request header: the server closes the connection after its answer, so the next request
# opens its own (a connection made and closed per request costs well under a millisecond
# on the local machine, a TLS handshake on a remote one: little beside a model's answer).
ONE_CONNECTION_PER_REQUEST = {"Connection": "close"}

_current: contextvars.ContextVar[Bound | None] = contextvars.ContextVar("bound", default=None)


class Bound:
    """The bound of the requests made within it (see the module docstring): `deadline` in
    `time.monotonic()` seconds, `cancel` the run's stop; either may be None."""

    def __init__(self, deadline: float | None, cancel: threading.Event | None) -> None:
        self.deadline = deadline
        self.cancel = cancel
        self._lock = threading.Lock()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._over = False  # set by the watcher: every connection is shut down from then on
        self._ended = threading.Event()

    # -- asked by the requests -----------------------------------------------------------------

    def check(self) -> None:
        """Raise Abandoned when the run is stopping or the deadline has passed."""
        if self.cancel is not None and self.cancel.is_set():
            raise Abandoned(stopped=True)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise Abandoned(stopped=False)

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (between two attempts), or less when the bound ends first: then
        raise Abandoned."""
        until = time.monotonic() + seconds
        if self.deadline is not None:
            until = min(until, self.deadline)
        while (left := until - time.monotonic()) > 0:
            self.check()
            if self.cancel is not None:
                self.cancel.wait(min(left, POLL_S))
            else:
                time.sleep(left)
        self.check()

    def join(self, thread: threading.Thread) -> bool:
        """Wait for `thread` to end; False when the bound ended first."""
        while thread.is_alive():
            try:
                self.check()
            except Abandoned:
                return False
            thread.join(POLL_S)
        return True

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's `trace` callback: a connection the request made (plain or TLS) is
        watched; shut down at once if the bound is already over."""
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.add(sock)
            over = self._over
        if over:
            _shut_down(sock)

    # -- the watcher ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.cancel is None and self.deadline is None:
            return
        threading.Thread(target=self._watch, name="model-bound", daemon=True).start()

    def end(self) -> None:
        self._ended.set()

    def _watch(self) -> None:
        while not self._ended.is_set():
            try:
                self.check()
            except Abandoned:
                self._shut_down_all()
                return
            step = POLL_S
            if self.deadline is not None:
                step = min(step, max(0.0, self.deadline - time.monotonic()))
            woken_by = self.cancel if self.cancel is not None else self._ended
            woken_by.wait(step)  # a stop wakes it at once

    def _shut_down_all(self) -> None:
        with self._lock:
            self._over = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut_down(sock)


def _shut_down(sock: socket.socket) -> None:
    """Both directions: a read blocked on the socket in another thread returns (a close()
    would not wake it, and would keep the connection open until the read ended), and the
    server sees the connection end. Through socket.socket's own method, also for a TLS
    socket (whose override would tear down its TLS state under the reading thread)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


@contextlib.contextmanager
def within(deadline: float | None = None, cancel: threading.Event | None = None) -> Iterator[Bound]:
    """Model requests made in this block (in this thread) are bounded by `deadline` (a
    `time.monotonic()` value) and `cancel` (see the module docstring)."""
    bound = Bound(deadline, cancel)
    token = _current.set(bound)
    bound.start()
    try:
        yield bound
    finally:
        bound.end()
        _current.reset(token)


def current() -> Bound | None:
    """The bound of the requests this thread makes now, if any."""
    return _current.get()


def trace_requests(request: Any) -> None:
    """An httpx `request` event hook: the request's connections go to the current bound."""
    bound = current()
    if bound is not None:
        request.extensions["trace"] = bound.trace


def in_context(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, to be run once in another thread within this thread's bound (a copy of its
    context: one copy per call, as a context is entered by one thread at a time)."""
    context = contextvars.copy_context()
    return lambda *args: context.run(fn, *args)
