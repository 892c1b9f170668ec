"""The live view of a run on a terminal (rich; this module is imported only when there is one).

The event lines of plain mode scroll above a region that redraws four times a second: each
step of the DAG with its status, and for a running step what it is doing (see
`coder.cli.progress.StepActivity.doing`); with `verbose`, the last lines of the model's
streamed text under it. The region goes away when the run ends (the summary follows) and
while the user is asked something (`paused`).

One lock orders everything: events, the ticker and pauses take it before rich's own, so the
region never redraws halfway through a line or over a prompt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import IO, Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from coder.cli.progress import (
    COLOURS,
    LABEL_STATUS,
    Activity,
    Progress,
    StepActivity,
    clock_of,
    line_parts,
)
from coder.display import escaped
from coder.taskfile.diagram import GLYPHS

TICK = 0.25  # seconds between redraws
TEXT_LINES = 3  # streamed text shown per running step with -v


class LiveRegion:
    """A region under the scrolling lines that redraws (`render()`, TICK times a second),
    always under `lock`; lines printed while it is `paused` wait until it resumes."""

    def __init__(
        self, stream: IO[str], lock: threading.RLock, render: Callable[[], RenderableType]
    ) -> None:
        self.lock, self.render = lock, render
        colour = click.get_current_context(silent=True)
        no_colour = colour is not None and colour.color is False  # --color never, NO_COLOR
        self.console = Console(
            file=stream, highlight=False, soft_wrap=False, no_color=no_colour or None
        )
        self._live = Live(
            console=self.console,
            auto_refresh=False,  # our ticker redraws, under our lock
            transient=True,
            redirect_stdout=False,  # stdout is the command's result; only stderr is ours
            redirect_stderr=True,
        )
        self._paused = False
        self._held: list[Text] = []
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="coder-live", daemon=True)

    def start(self) -> None:
        with self.lock:
            self._live.start()
            self.redraw()
        self._ticker.start()

    def print(self, text: Text) -> None:
        """A line above the region (the caller holds the lock)."""
        if self._paused:
            self._held.append(text)
            return
        self._live.update(self.render())  # the region below the line shows its news too
        self.console.print(text, overflow="fold")

    def redraw(self) -> None:
        self._live.update(self.render(), refresh=True)

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            self._paused = True
            self._live.stop()  # transient: the region is erased, the cursor where it began
        try:
            yield
        finally:
            with self.lock:
                self._paused = False
                for held in self._held:
                    self.console.print(held, overflow="fold")
                self._held.clear()
                if not self._stop.is_set():
                    self._live.start()
                    self.redraw()

    def close(self) -> None:
        self._stop.set()
        if self._ticker.is_alive():
            self._ticker.join(timeout=1)
        with self.lock:
            self._live.stop()

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            with self.lock:
                if not self._paused:
                    self.redraw()


class LiveProgress(Progress):
    """A run's progress: the DAG's steps and what the running ones do."""

    live = True

    def __init__(
        self,
        stream: IO[str],
        *,
        verbose: bool = False,
        steps: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        super().__init__(stream, steps=steps)
        self.verbose = verbose
        self.region = LiveRegion(stream, self.lock, self._render)
        self.region.start()

    def line(self, event: dict[str, Any], clock: str) -> None:
        self.region.print(_styled(event, clock))

    def loop_event(self, fields: dict[str, Any], event: object) -> None:
        with self.lock:  # drawn at the next tick: text streams in fast
            self.board.apply_loop(fields, event)

    def paused(self) -> AbstractContextManager[None]:
        return self.region.paused()

    def close(self) -> None:
        self.region.close()

    def _render(self) -> RenderableType:
        board, now = self.board, time.monotonic()
        rows = Table.grid(padding=(0, 1))
        for _ in range(4):
            rows.add_column(no_wrap=True)
        rows.columns[3].overflow = "ellipsis"
        shown, hidden = _visible(list(board.steps.values()), self.region.console.height)
        for step in shown:
            colour = COLOURS.get(step.status, "bright_black")
            doing = step.doing(now) if step.status == "running" else _ended(step)
            rows.add_row(
                Text(GLYPHS.get(step.status, "?"), style=colour),
                Text(step.id, style="bold" if step.status == "running" else ""),
                Text(step.kind or "", style="bright_black"),
                Text(doing, style=colour if step.status == "running" else ""),
            )
            if self.verbose and step.status == "running" and step.text:
                for text in _tail(step.text, TEXT_LINES):
                    rows.add_row("", "", "", Text(text, style="italic bright_black"))
        parts: list[RenderableType] = [rows]
        if hidden:
            parts.append(Text(f"  … {hidden}", style="bright_black"))
        footer = f"{board.done}/{board.total or len(board.steps)} steps done · "
        footer += f"{clock_of(now - board.started)} elapsed"
        parts.append(Text(footer, style="bright_black"))
        return Group(*parts)


def _styled(event: dict[str, Any], clock: str) -> Text:
    """The plain line, its label coloured by what happened."""
    head, label, detail = line_parts(event, clock)
    colour = COLOURS.get(LABEL_STATUS.get(event.get("event", ""), ""), "")
    text = Text.assemble(head, (label, colour), detail.rstrip())
    text.rstrip()
    return text


def _ended(step: StepActivity) -> str:
    if step.status == "pending":
        return ""
    if step.started is not None and step.ended is not None:
        return f"{step.status} · {clock_of(step.ended - step.started)}"
    return step.status


def _visible(steps: list[StepActivity], height: int) -> tuple[list[StepActivity], str]:
    """The rows that fit: every step when they do; else the running and failed ones, the
    last two finished and the next pending ones, and a count of the rest."""
    room = max(4, min(20, height - 8))
    if len(steps) <= room:
        return steps, ""
    keep = {s.id for s in steps if s.status in ("running", "failed", "error")}
    done = [s for s in steps if s.status in ("success", "skipped", "interrupted")]
    keep |= {s.id for s in done[-2:]}
    for s in steps:
        if len(keep) >= room:
            break
        if s.status == "pending":
            keep.add(s.id)
    shown = [s for s in steps if s.id in keep]
    rest = [s for s in steps if s.id not in keep]
    finished = sum(1 for s in rest if s.status != "pending")
    return shown, f"{len(rest)} more ({finished} finished, {len(rest) - finished} pending)"


def _tail(text: str, lines: int) -> list[str]:
    kept = [escaped(line.rstrip()) for line in text.splitlines() if line.strip()]
    return kept[-lines:]


class LiveActivity(Activity):
    """One long task (a plan, a merge's tests): its notes scroll, a status line redraws under
    them with a spinner and the time the current stage has taken."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self._since = time.monotonic()
        self.region = LiveRegion(stream, self.lock, self._render)
        self.region.start()

    def note(self, message: str) -> None:
        with self.lock:
            self.region.print(Text(escaped(message, lines=True)))

    def status(self, text: str, *, restart: bool = False) -> None:
        with self.lock:
            if restart or not self._status:
                self._since = time.monotonic()
            self._status = text

    def paused(self) -> AbstractContextManager[None]:
        return self.region.paused()

    def close(self) -> None:
        self.region.close()

    def _render(self) -> RenderableType:
        if not self._status:
            return Text("")
        line = Table.grid(padding=(0, 1))
        line.add_row(
            Spinner("dots", style="cyan"),
            Text(
                f"{escaped(self._status)} · {clock_of(time.monotonic() - self._since)}",
                style="cyan",
            ),
        )
        return line
