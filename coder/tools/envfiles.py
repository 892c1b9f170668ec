"""`.env` files: their values are secrets, registered with the run's redactor before a tool
returns any text (the registry scans the worktree's top once; fs_read and fs_grep register
each one they reach). Which files are env files is `coder.redact.is_env_file`'s rule."""

from __future__ import annotations

from pathlib import Path

from coder.redact import Redactor, find_env_files, read_env_file

# How far down the registry's first scan looks: deeper ones are registered when read.
SCAN_DEPTH = 1


def register_env_file(path: Path, redactor: Redactor) -> None:
    """Register the secret values of one `.env`-style file (unreadable or huge: skipped)."""
    redactor.add(*read_env_file(path))


def register_env_files(root: Path, redactor: Redactor) -> None:
    """Register the env files at the root and one directory down, so that a command that
    prints one (`cat .env`) is redacted too. Deeper ones are registered when a tool reads them."""
    for path in find_env_files(root, depth=SCAN_DEPTH):
        register_env_file(path, redactor)
