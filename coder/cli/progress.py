"""Live progress for a run, on stderr: one line per event, plus (on a terminal) a status line
with the current step and elapsed time that redraws in place. With stdout not a TTY it is plain
lines only, so logs and CI output stay readable.

`paused()` hands the terminal to someone else (the approval prompt): nothing is drawn or erased
until it ends, and event lines that arrive meanwhile are printed after it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click

SHOWN = {
    "run.started": "run started",
    "run.warning": "warning",
    "step.started": "started",
    "step.retry": "failed, retrying",
    "fix.cycle": "fixing",
    "step.succeeded": "done",
    "step.failed": "FAILED",
    "step.skipped": "skipped",
    "step.interrupted": "interrupted",
    "step.errored": "ERROR",
    "run.stop_requested": "stopping",
    "run.finished": "run finished",
}


class Progress:
    def __init__(self, total: int = 0, stream: IO[str] | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.live = self.stream.isatty() and not quiet
        self.total = total
        self.done = 0
        self.current: dict[str, float] = {}  # running step -> start time
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._paused = 0
        self._held: list[str] = []  # event lines that arrived while paused
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def __call__(self, event: dict[str, Any]) -> None:
        name = event.get("event", "")
        if name not in SHOWN or self.quiet:
            return
        step = event.get("step_id", "")
        with self._lock:
            if name == "run.started":
                self.total = int(event.get("steps", self.total))
            elif name == "step.started":
                self.current[step] = time.monotonic()
            elif name in ("step.succeeded", "step.failed", "step.skipped", "step.interrupted"):
                self.current.pop(step, None)
                self.done += 1
            line = self._line(name, step, event)
            if self._paused:
                self._held.append(line)
                return
            self._clear()
            self.stream.write(line + "\n")
            self._status()
            self.stream.flush()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the terminal alone while the block runs (a prompt is open)."""
        with self._lock:
            self._paused += 1
            self._clear()
            self.stream.flush()
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                if not self._paused:
                    for line in self._held:
                        self.stream.write(line + "\n")
                    self._held.clear()
                    self._status()
                    self.stream.flush()

    def close(self) -> None:
        self._stop.set()
        if self._ticker:
            self._ticker.join(timeout=1)
        with self._lock:
            self._clear()
            self.stream.flush()

    def _line(self, name: str, step: str, event: dict[str, Any]) -> str:
        clock = time.strftime("%H:%M:%S")
        label = SHOWN[name]
        if name == "step.started":
            detail = f"{event.get('kind', '')}: {event.get('goal', '')}"
            if int(event.get("attempt", 1)) > 1:
                detail += f" (attempt {event['attempt']})"
        elif name == "step.succeeded":
            commit = event.get("commit") or ""
            detail = f"commit {commit[:8]}" if commit else "no changes"
            if event.get("summary"):
                detail += f" · {event['summary']}"
        elif name == "fix.cycle":
            detail = f"tests red ({event.get('failing')}); fix cycle {event.get('cycle')}"
        elif name == "run.started":
            detail = f"{event.get('steps')} steps on {event.get('branch')}"
        elif name == "run.finished":
            detail = event.get("status", "") + (f": {event['error']}" if event.get("error") else "")
        else:
            detail = str(event.get("error") or event.get("reason") or event.get("message") or "")
        colour = _colour(name)
        styled = click.style(f"{label:<11}", fg=colour) if self.live and colour else f"{label:<11}"
        return f"{clock}  {step:<10} {styled} {detail}".rstrip()

    def _status(self) -> None:
        if not self.live or not self.current:
            return
        now = time.monotonic()
        running = ", ".join(f"{s} {now - t:.1f}s" for s, t in self.current.items())
        self.stream.write(
            f"  … {running} · {self.done}/{self.total} done · {now - self.started:.0f}s elapsed"
        )

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K")

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                if self._paused:
                    continue
                self._clear()
                self._status()
                self.stream.flush()


def _colour(name: str) -> str | None:
    return {
        "step.succeeded": "green",
        "step.failed": "red",
        "step.errored": "red",
        "step.skipped": "yellow",
        "step.interrupted": "yellow",
        "step.retry": "yellow",
    }.get(name)
