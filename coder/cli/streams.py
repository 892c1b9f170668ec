"""Output to a closed pipe is dropped, and coder goes on.

`coder run ... | head -2` closes the pipe after two lines; the next write raises
BrokenPipeError (Python ignores SIGPIPE), which would end a runner mid-step with its step
left `running`. git, gh and pytest go on or stop cleanly there. So stdout and stderr are
wrapped: the first write that finds its pipe closed points the descriptor at /dev/null (so
nothing else writing to it, the interpreter's last flush included, meets the error again),
and that write and every later one is dropped, as if the reader had read it. The run goes on
and is checkpointed as usual; its event log keeps everything.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class _Survivor:
    """A text or binary stream whose writes to a closed pipe are dropped."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        try:
            return int(self._stream.write(data))
        except BrokenPipeError:
            self._to_devnull()
            return len(data)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    @property
    def buffer(self) -> Any:  # click writes bytes to it when the text encoding is ASCII
        return _Survivor(self._stream.buffer)

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def survive_closed_pipes() -> None:
    """Wrap sys.stdout and sys.stderr (once; only real descriptors: a test runner's
    captured streams are left alone)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Survivor):
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        setattr(sys, name, _Survivor(stream))
