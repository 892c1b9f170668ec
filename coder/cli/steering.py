"""Guidance notes on the command line (coder.run.notes): `--note TEXT`, `--note-file PATH`
(`-` for stdin) and `--step ID` for `coder resume` and `coder revert`."""

from __future__ import annotations

from typing import Any

import click

from coder.cli.common import complete_steps
from coder.errors import InvalidInput

MAX_FILE_BYTES = 64 * 1024  # read no further: a note is a few lines (coder.run.notes.MAX_CHARS)


def note_options(func: Any) -> Any:
    """Adds `--note`, `--note-file` and `--step` (the command gets note, note_file, step)."""
    for option in reversed(
        [
            click.option(
                "--note",
                metavar="TEXT",
                help="Guidance for the model: reaches the next attempt of the step as a "
                "message, and its commit as a Coder-Note trailer.",
            ),
            click.option(
                "--note-file",
                metavar="PATH",
                help="Read the note from PATH ('-': standard input).",
            ),
            click.option(
                "--step",
                "step",
                metavar="STEP",
                shell_complete=complete_steps,
                help="The step the note is for (default: the next step to run that a model "
                "works on).",
            ),
        ]
    ):
        func = option(func)
    return func


def given_note(note: str | None, note_file: str | None, step: str | None) -> str | None:
    """The note's text from --note or --note-file (None: no note); a usage error for both,
    or for --step without a note."""
    if note is not None and note_file is not None:
        raise click.UsageError("pass one of --note TEXT or --note-file PATH, not both")
    if note_file is not None:
        note = _read(note_file)
    if note is None and step is not None:
        raise click.UsageError("--step names the step a note is for: give --note or --note-file")
    return note


def _read(path: str) -> str:
    import sys

    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the note file {path}: {exc.strerror or exc}",
            hint="give the note as --note TEXT, or a readable file with --note-file",
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidInput(
            f"the note file {path} is larger than {MAX_FILE_BYTES // 1024} KiB",
            hint="a note is guidance for the next attempt: a few lines",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(
            f"the note file {path} is not UTF-8 text", hint="save it as UTF-8"
        ) from None
