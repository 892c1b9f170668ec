"""The path guard: model-supplied paths stay inside the worktree (through symlinks) and never
write `.git/`, `.coder/` or secret-looking files."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
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


# Files that steer git or CI: a step that changes them changes what runs outside coder.
_GIT_ADMIN = (".gitmodules", ".gitattributes")
_CI_FILES = (".gitlab-ci.yml",)
_CI_DIRS = ((".github", "workflows"),)


def is_protected(rel_posix: str, policy: Policy) -> str | None:
    """Why `rel_posix` (a root-relative posix path) is protected, or None: the one rule for
    what the model's file tools never write and what a step commit may not add or change
    unless the step's `changes` names the path (`protected_changes`)."""
    parts = [p for p in rel_posix.split("/") if p not in ("", ".")]
    lowered = [p.lower() for p in parts]
    if ".git" in lowered:
        return ".git belongs to coder's executor"
    if ".coder" in lowered:
        return ".coder holds coder's own state"
    if "/".join(parts) in policy.named_paths:  # the step's `changes` names it
        return None
    if lowered == ["coder.config.json"]:  # a repo file must never widen coder's permissions
        return "coder.config.json sets coder's own permissions; only the user edits it"
    if lowered[-1:] and lowered[-1] in _GIT_ADMIN:
        return f"{parts[-1]} steers git (submodules, filters)"
    if lowered in ([f] for f in _CI_FILES) or any(
        tuple(lowered[i : i + len(d)]) == d for d in _CI_DIRS for i in range(len(lowered))
    ):
        return "it is a CI workflow file: it runs on your CI, outside coder's sandbox"
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


def naming(policy: Policy, changes: Iterable[Mapping[str, str]]) -> Policy:
    """`policy` for a step: the paths its `changes` names (exactly) are not protected for it
    (`.git` and `.coder` still are)."""
    from dataclasses import replace

    named = {c.get("path", "").strip("/").removeprefix("./") for c in changes}
    return replace(policy, named_paths=frozenset(named - {""}))


def protected_changes(changed: Iterable[str], policy: Policy) -> list[str]:
    """The problems with a step's changed paths (`policy` from `naming`): each protected one."""
    problems = []
    for rel in changed:
        reason = is_protected(rel, policy)
        if reason:
            problems.append(
                f"the step changed protected path {rel} ({reason}); nothing was committed. "
                f"Name it in the step's `changes` if the step is meant to change it"
            )
    return problems


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
