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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coder.cli.progress import (
    COLOURS,
    LABEL_STATUS,
    Progress,
    StepActivity,
    clock_of,
    line_parts,
)

GLYPHS = {
    "success": "✔",
    "failed": "✘",
    "error": "✘",
    "running": "●",
    "interrupted": "⏸",
    "skipped": "↷",
    "pending": "◌",
}
TICK = 0.25  # seconds between redraws
TEXT_LINES = 3  # streamed text shown per running step with -v


class LiveProgress(Progress):
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
        self.console = Console(file=stream, highlight=False, soft_wrap=False)
        self._live = Live(
            console=self.console,
            auto_refresh=False,  # our ticker redraws, under our lock
            transient=True,
            redirect_stdout=False,  # stdout is the command's result; only stderr is ours
            redirect_stderr=True,
        )
        self._paused = False
        self._held: list[Text] = []  # lines that arrived while paused
        self._stop = threading.Event()
        with self.lock:
            self._live.start()
            self._redraw()
        self._ticker = threading.Thread(target=self._tick, name="coder-live", daemon=True)
        self._ticker.start()

    # --- Progress ---------------------------------------------------------------------------

    def line(self, event: dict[str, Any], clock: str) -> None:
        styled = _styled(event, clock)
        if self._paused:
            self._held.append(styled)
            return
        self._live.update(self._render())  # the region below the line shows the event too
        self.console.print(styled, overflow="fold")

    def loop_event(self, fields: dict[str, Any], event: object) -> None:
        with self.lock:  # drawn at the next tick: text streams in fast
            self.board.apply_loop(fields, event)

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
                    self._redraw()

    def close(self) -> None:
        self._stop.set()
        self._ticker.join(timeout=1)
        with self.lock:
            self._live.stop()

    # --- drawing ----------------------------------------------------------------------------

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            with self.lock:
                if not self._paused:
                    self._redraw()

    def _redraw(self) -> None:
        self._live.update(self._render(), refresh=True)

    def _render(self) -> RenderableType:
        board, now = self.board, time.monotonic()
        rows = Table.grid(padding=(0, 1))
        for _ in range(4):
            rows.add_column(no_wrap=True)
        rows.columns[3].overflow = "ellipsis"
        shown, hidden = _visible(list(board.steps.values()), self.console.height)
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
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return kept[-lines:]
