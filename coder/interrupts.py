"""Every way a terminal ends a command is Ctrl-C: SIGINT, SIGTERM and SIGHUP.

Left at their defaults, SIGTERM and SIGHUP (the terminal closed, an ssh connection dropped)
end coder at once, with no `finally` run: a step's commands, which run in sessions of their
own, would go on writing the worktree after the runner is gone. So every command takes the
three alike (`taken`): outside a run's steps they raise `KeyboardInterrupt` (`interrupting`),
during a run they ask it to stop (`coder.run.drive`); either way the command ends with exit 130.

Each handler is coder's own, never Python's default: Python sets its SIGINT handler only when
SIGINT was not ignored as it started, and a shell without job control starts its background
commands (`tox &` in a script) with SIGINT ignored; such a `coder merge` went on after Ctrl-C,
where `coder run` stopped. A hang-up ignored from the start stays ignored: under `nohup` the
user asked for the command to outlive its terminal.

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


def taken() -> tuple[signal.Signals, ...]:
    """The stop signals coder acts on: all three, but a hang-up ignored from the start (nohup)."""
    return tuple(
        s
        for s in STOP_SIGNALS
        if s != signal.SIGHUP or signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
    )


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
    """Within the block the stop signals coder takes (`taken`) raise KeyboardInterrupt; the
    previous handlers come back after it. Only the main thread can set handlers: elsewhere,
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _interrupt) for s in taken()}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
