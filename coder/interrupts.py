"""Every way a terminal ends a command is Ctrl-C: SIGINT, SIGTERM and SIGHUP.

Left at their defaults, SIGTERM and SIGHUP (the terminal closed, an ssh connection dropped)
end coder at once, with no `finally` run: a step's commands, which run in sessions of their
own, would go on writing the worktree after the runner is gone. So every command takes the
three alike: outside a run's steps they raise `KeyboardInterrupt` (`interrupting`), during a
run they ask it to stop (`coder.run.runs`); either way the command ends with exit 130.

A hang-up also takes the terminal away: writes to it fail (EIO) from then on, and a message
about the interruption would turn into a traceback. `detach_terminal` points the standard
streams at /dev/null first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def detach_terminal() -> None:
    """Point stdin, stdout and stderr at /dev/null where they are a terminal. After a hang-up
    `isatty` no longer says so (the ioctl fails), so any character device is taken: the only
    other one they are likely to be is /dev/null itself."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            for fd in (0, 1, 2):
                with contextlib.suppress(OSError):
                    if stat.S_ISCHR(os.fstat(fd).st_mode):
                        os.dup2(null, fd)
        finally:
            os.close(null)


def _interrupt(signum: int, _frame: Any) -> None:
    if signum == signal.SIGHUP:
        detach_terminal()
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupting() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP interrupt as SIGINT does; the previous handlers
    come back after it. Only the main thread can set handlers: elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
