"""Which view a long command gets: the live one (`coder.cli.live`, rich) on a terminal that
can redraw, else plain lines (`coder.cli.progress`); rich is imported only for the live one."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import IO

from coder.cli.progress import Activity, Progress, can_redraw


def progress_for(
    *,
    silent: bool = False,
    quiet: bool = False,
    verbose: bool = False,
    steps: Callable[[], Sequence[tuple[str, str, str]]] | None = None,
    stream: IO[str] | None = None,
) -> Progress:
    """The live view when stderr is a terminal that can redraw (and not `quiet`), else plain
    lines; nothing at all when `silent`. `steps` lists the DAG (id, kind, goal) for the live
    view; it is only called when there is one."""
    stream = stream or sys.stderr
    if silent or quiet or not can_redraw(stream):
        return Progress(stream, silent=silent)
    from coder.cli.live import LiveProgress

    return LiveProgress(stream, verbose=verbose, steps=steps() if steps else ())


def activity_for(
    *, silent: bool = False, quiet: bool = False, stream: IO[str] | None = None
) -> Activity:
    """A live status line when stderr can redraw (and not `quiet`), else plain notes."""
    stream = stream or sys.stderr
    if silent or quiet or not can_redraw(stream):
        return Activity(stream, silent=silent)
    from coder.cli.live import LiveActivity

    return LiveActivity(stream)
