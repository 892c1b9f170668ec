"""The path guard: model-supplied paths stay inside the worktree (through symlinks) and never
write `.git/`, `.coder/` or secret-looking files."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import TYPE_CHECKING

from coder.errors import PolicyViolation

if TYPE_CHECKING:
    from coder.policy.commands import Policy

# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

# Names (of any path component, case-insensitive) that are never written.
_SECRET_GLOBS = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*secret*",
    ".netrc",
    ".pypirc",
)


def is_protected(rel_posix: str, policy: Policy) -> str | None:
    """Why the model may not write `rel_posix` (a root-relative posix path), or None."""
    parts = [p for p in rel_posix.split("/") if p not in ("", ".")]
    lowered = [p.lower() for p in parts]
    if ".git" in lowered:
        return ".git belongs to coder's executor"
    if ".coder" in lowered:
        return ".coder holds coder's own state"
    if lowered == ["coder.config.json"]:  # a repo file must never widen coder's permissions
        return "coder.config.json sets coder's own permissions; only the user edits it"
    for part in lowered:
        for glob in _SECRET_GLOBS:
            if fnmatch.fnmatchcase(part, glob):
                return f"it looks like a secrets file (matches {glob})"
    rel = "/".join(parts)
    for glob in policy.protected_paths:
        # `vendor` or `vendor/` also protects everything below it
        if fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(rel, glob.rstrip("/") + "/*"):
            return f"it matches protected_paths glob {glob!r} in coder.config.json"
    return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve_in_root(root: Path, rel: str, *, write: bool, policy: Policy) -> Path:
    """The absolute, symlink-resolved path of `rel` inside `root`, or PolicyViolation.

    Refuses paths that leave the worktree lexically (`..`, absolute paths) or through a
    symlink (including a symlinked parent of a file that does not exist yet); with write=True
    also refuses protected paths (see `is_protected`), checked on both the name given and the
    resolved target.
    """
    if not rel or "\0" in rel:
        raise PolicyViolation(f"invalid path: {rel!r}")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))  # an absolute rel replaces the root
    lexical = os.path.normpath(os.path.join(real_root, rel))
    if not _inside(real, real_root):
        if _inside(lexical, real_root):
            raise PolicyViolation(f"path escapes the worktree through a symlink: {rel} -> {real}")
        raise PolicyViolation(f"path escapes the worktree: {rel}")
    if write:
        if real == real_root:
            raise PolicyViolation(f"refusing to write {rel}: it is the worktree itself")
        shown = [real] + ([lexical] if _inside(lexical, real_root) else [])
        for path in shown:
            reason = is_protected(Path(os.path.relpath(path, real_root)).as_posix(), policy)
            if reason:
                raise PolicyViolation(f"refusing to write {rel}: {reason}")
    return Path(real)
