"""Long output on a terminal through the user's pager, chosen as git chooses it (`GIT_PAGER`,
`core.pager`, `PAGER`, then `less`; `LESS=FRX` unless set, so a text that fits the screen is
printed and the prompt comes back), and a diff in colour where colour is on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import click

_STYLES = (  # the first prefix a diff line starts with gives its style, as `git diff` colours
    (
        ("diff --git ", "index ", "--- ", "+++ ", "new file mode", "deleted file mode"),
        {"bold": True},
    ),
    (("old mode", "new mode", "similarity index", "rename from", "rename to"), {"bold": True}),
    (("@@",), {"fg": "cyan"}),
    (("+",), {"fg": "green"}),
    (("-",), {"fg": "red"}),
)


def page(text: str, *, diff: bool = False) -> None:
    """Print `text`: through the pager when stdout is a terminal, else as it is; a `diff`
    coloured where colour is on (`--color`, `NO_COLOR`, a terminal)."""
    ctx = click.get_current_context(silent=True)
    chosen = None if ctx is None else ctx.color
    tty = sys.stdout.isatty()
    colour = tty if chosen is None else chosen
    if diff and colour:
        text = coloured_diff(text)
    pager = _pager() if tty and text else None
    if pager is None:
        click.echo(text, nl=not text.endswith("\n"), color=colour)
        return
    env = {**os.environ, "LESS": os.environ.get("LESS", "FRX"), "LV": os.environ.get("LV", "-c")}
    data = text.encode(sys.stdout.encoding or "utf-8", errors="replace")
    sys.stdout.flush()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pager's, as in git
    try:
        proc = subprocess.Popen(pager, shell=True, stdin=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except BrokenPipeError:  # the pager was quit before it read everything
            pass
        proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def coloured_diff(text: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        style = next((s for prefixes, s in _STYLES if line.startswith(prefixes)), None)
        body = line.rstrip("\n")
        lines.append(click.style(body, **style) + line[len(body) :] if style else line)
    return "".join(lines)


def _pager() -> str | None:
    """The pager git would use here (None: none, as `cat` or an empty setting say)."""
    chosen = os.environ.get("GIT_PAGER")
    if chosen is None:
        try:
            chosen = subprocess.run(
                ["git", "var", "GIT_PAGER"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            chosen = ""
        chosen = chosen or os.environ.get("PAGER", "less")
    return None if chosen.strip() in ("", "cat") else chosen
