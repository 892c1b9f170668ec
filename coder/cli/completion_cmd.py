"""`coder completion SHELL`: the script that makes a shell complete coder's commands, options,
run ids (`-t`) and step ids (`--step`, `--to-step`; `coder.cli.common` completes those),
through click's completion protocol."""

from __future__ import annotations

import click

from coder.cli import main

PROG, VARIABLE = "coder", "_CODER_COMPLETE"
INSTALL = {
    "bash": 'eval "$(coder completion bash)"     # in ~/.bashrc',
    "zsh": 'eval "$(coder completion zsh)"      # in ~/.zshrc',
    "fish": "coder completion fish | source     # in ~/.config/fish/config.fish",
}


@click.command(
    epilog="\b\nInstall (one line in your shell's start-up file):\n"
    + "\n".join(f"  {line}" for line in INSTALL.values())
)
@click.argument("shell", type=click.Choice(sorted(INSTALL)))
def completion(shell: str) -> None:
    """Print the shell completion script for bash, zsh or fish."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # every choice is one click knows
    click.echo(cls(main, {}, PROG, VARIABLE).source())
