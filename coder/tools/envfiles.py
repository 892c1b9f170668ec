"""`.env` files: their values are secrets, registered with the run's redactor before a tool
returns any text (the registry scans the worktree's top once; fs_read and fs_grep register
each one they reach)."""

from __future__ import annotations

import os
from pathlib import Path

from coder.redact import Redactor

_ENV_FILE_MAX_BYTES = 1 << 20


def is_env_file(name: str) -> bool:
    """`.env` and `.env.*` (the names whose values `secrets_from_env_file` understands)."""
    return name == ".env" or name.startswith(".env.")


def register_env_file(path: Path, redactor: Redactor) -> None:
    """Register the secret values of one `.env`-style file (unreadable or huge: skipped)."""
    try:
        if path.is_file() and path.stat().st_size <= _ENV_FILE_MAX_BYTES:
            redactor.add_env_file(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        pass


def register_env_files(root: Path, redactor: Redactor) -> None:
    """Register the `.env*` files at the root and one directory down, so that a command that
    prints one (`cat .env`) is redacted too. Deeper ones are registered when a tool reads them."""
    dirs = [root]
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if is_env_file(entry.name):
                    register_env_file(Path(entry.path), redactor)
                elif entry.is_dir(follow_symlinks=False) and entry.name not in (".git", ".coder"):
                    dirs.append(Path(entry.path))
        for sub in dirs[1:]:
            with os.scandir(sub) as entries:
                for entry in entries:
                    if is_env_file(entry.name):
                        register_env_file(Path(entry.path), redactor)
    except OSError:
        pass
