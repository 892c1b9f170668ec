"""The run's questions at the terminal, which a stop always ends.

`click.prompt` waits in `input()`, which a signal handler that only sets the run's stop event
does not end (the read is simply restarted): Ctrl-C printed "stopping" and went on waiting,
SIGTERM (`coder stop`) was not heard until someone answered. These read the answer while
watching the run's stop event (set by Ctrl-C, SIGTERM and a hang-up alike), so a stop during a
question ends it as `[q]uit` would: the run stops gracefully, checkpointed, exit 130. End of
input (the terminal closed) is a stop too.
"""

from __future__ import annotations

import select
import sys
import threading
from collections.abc import Sequence

import click

_POLL_S = 0.1  # how soon a stop is noticed


def line(question: str, stop: threading.Event, *, default: str = "") -> str | None:
    """A line typed after `question` (stripped; `default` when empty), or None when the run
    was stopped meanwhile or the input ended."""
    shown = f" [{default}]" if default else ""
    click.echo(f"{question}{shown}: ", nl=False, err=True)
    while not stop.is_set():
        try:
            ready, _, _ = select.select([sys.stdin], [], [], _POLL_S)
        except (OSError, ValueError):  # stdin closed under us
            return None
        if ready:
            typed = sys.stdin.readline()
            if not typed:  # end of input: nobody is there to answer
                stop.set()
                return None
            return typed.strip() or default
    click.echo("", err=True)
    return None


def choose(
    question: str, keys: Sequence[str], stop: threading.Event, *, default: str
) -> str | None:
    """One of `keys` typed after `question` (asked again until it is one), or None when the
    run was stopped meanwhile."""
    while (answer := line(question, stop, default=default)) is not None:
        if answer in keys:
            return answer
        click.echo(f"Error: {answer!r} is not one of {', '.join(map(repr, keys))}.", err=True)
    return None
