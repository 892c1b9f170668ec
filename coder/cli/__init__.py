"""The command line: a thin Click layer over the services (parse, call, render)."""

from __future__ import annotations

import click

from coder import __version__


@click.group()
@click.version_option(__version__, prog_name="coder")
def main() -> None:
    """coder: a local-first autonomous coding agent."""
