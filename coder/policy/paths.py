"""The path guard: model-supplied paths stay inside the worktree (through symlinks) and never
write `.git/`, `.coder/` or secret-looking files."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from coder.errors import PolicyViolation
from coder.files.realpath import realpath

if TYPE_CHECKING:
    from coder.policy.commands import Policy

# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

# What a step may not change unless its `changes` names the path, and the model's file tools
# never write: (pattern, why), one row per pattern. Each is a file that makes code run somewhere
# other than this sandbox (on your CI, in your editor, shell or coding agent, in git itself),
# that widens coder's own permissions, or that holds secrets. A pattern matches any run of
# path components (case-insensitively, `*` within one component), anywhere in the tree unless
# it starts with `/`; what it matches is protected with everything below it. docs/safety.md's
# Safety section lists these rows (tests/policy/test_protected_table.py holds it to them).
_EDITOR = "your editor or shell runs what it names when you open or enter the folder"
_AGENT = "coding agents start the MCP servers and hooks it names"
_CI = "it runs on your CI, outside coder's sandbox"
_SECRETS = "it looks like a secrets file"
PROTECTED: tuple[tuple[str, str], ...] = (
    ("/coder.config.json", "it sets coder's own permissions; only the user edits it"),
    (".gitmodules", "it steers git: submodules come from the URLs it names"),
    (".gitattributes", "it steers git: the filters and diff drivers it names run in git"),
    (".lfsconfig", "it steers git-lfs: where large files are fetched from and sent to"),
    (".github/", _CI),
    (".gitlab/", _CI),
    (".gitlab-ci.yml", _CI),
    (".gitea/", _CI),
    (".forgejo/", _CI),
    (".circleci/", _CI),
    ("Jenkinsfile", _CI),
    (".travis.yml", _CI),
    ("azure-pipelines.yml", _CI),
    (".azure-pipelines/", _CI),
    ("bitbucket-pipelines.yml", _CI),
    (".buildkite/", _CI),
    (".drone.yml", _CI),
    (".woodpecker.yml", _CI),
    (".woodpecker/", _CI),
    (".cirrus.yml", _CI),
    ("appveyor.yml", _CI),
    (".appveyor.yml", _CI),
    (".semaphore/", _CI),
    (".pre-commit-config.yaml", "git hooks run what it names on every commit"),
    (".husky/", "git hooks run what it names on every commit"),
    ("lefthook.yml", "git hooks run what it names on every commit"),
    (".lefthook.yml", "git hooks run what it names on every commit"),
    (".vscode/", _EDITOR),
    (".idea/", _EDITOR),
    (".zed/", _EDITOR),
    (".devcontainer/", _EDITOR),
    (".devcontainer.json", _EDITOR),
    (".gitpod.yml", _EDITOR),
    (".envrc", _EDITOR),
    (".mcp.json", _AGENT),
    (".claude/", _AGENT),
    (".cursor/", _AGENT),
    (".gemini/", _AGENT),
    (".env", _SECRETS),
    (".env.*", _SECRETS),
    ("*.pem", _SECRETS),
    ("*.key", _SECRETS),
    ("*.p12", _SECRETS),
    ("*.pfx", _SECRETS),
    ("id_rsa*", _SECRETS),
    ("id_dsa*", _SECRETS),
    ("id_ecdsa*", _SECRETS),
    ("id_ed25519*", _SECRETS),
    ("*secret*", _SECRETS),
    (".netrc", _SECRETS),
    (".pypirc", _SECRETS),
)
# Never written, whatever a step's `changes` says.
_CODERS = (
    (".git", ".git belongs to coder's executor"),
    (".coder", ".coder holds coder's own state"),
)


_HINT_EXAMPLES = 3  # patterns named per reason in the hint (the error names the one matched)


def protected_hint() -> str:
    """The path rule in one hint for the model's file tools, made from the tables: a few
    patterns of each reason PROTECTED gives, so that the hint cannot drift from the rule."""
    groups: dict[str, list[str]] = {}
    for pattern, why in PROTECTED:
        groups.setdefault(why, []).append(pattern)
    named = "; ".join(
        ", ".join(patterns[:_HINT_EXAMPLES]) + (", ..." if len(patterns) > _HINT_EXAMPLES else "")
        for patterns in groups.values()
    )
    coders = " and ".join(f"{name}/" for name, _ in _CODERS)
    return (
        f"paths must stay inside the repository (symlinks included); {coders} are never "
        f"written; files that run code elsewhere, steer git or coder, or hold secrets ({named}) "
        "only when the step's `changes` names them"
    )


def _compile(pattern: str) -> re.Pattern[str]:
    """A PROTECTED pattern as a regex over a lowered root-relative path: its components as a
    run of whole components (`*` and `?` within one), anywhere unless anchored with `/`."""
    body = re.escape(pattern.strip("/").lower()).replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    return re.compile(("^" if pattern.startswith("/") else "(?:^|/)") + body + "(?:/|$)")


_COMPILED = tuple((_compile(pattern), pattern, why) for pattern, why in PROTECTED)


def is_protected(rel_posix: str, policy: Policy) -> str | None:
    """Why `rel_posix` (a root-relative posix path) is protected, or None: the one rule for
    what the model's file tools never write and what a step commit may not add or change
    unless the step's `changes` names the path (`protected_changes`)."""
    parts = [p for p in rel_posix.split("/") if p not in ("", ".")]
    lowered = [p.lower() for p in parts]
    for name, why in _CODERS:
        if name in lowered:
            return why
    if "/".join(parts) in policy.named_paths:  # the step's `changes` names it
        return None
    lowered_path = "/".join(lowered)
    for regex, pattern, why in _COMPILED:
        if regex.search(lowered_path):
            return f"{why} (matches {pattern})"
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


def protected_changes(
    changed: Iterable[str], policy: Policy, root: Path | None = None, links: Iterable[str] = ()
) -> list[str]:
    """The problems with a step's changed paths (`policy` from `naming`): each protected one.

    With `root` (the worktree), symlinks count by what they point at too: a changed path that
    is a link to a protected path (`ci -> .github`, `x -> .git/config`) is protected, and so
    is a changed path a link in `links` (the worktree's other symlinks, root-relative) makes
    reachable under a protected name (`.github -> ci` makes `ci/workflows/x.yml` a workflow).
    Links are resolved inside `root` only (`resolve_inside`)."""
    changed = list(changed)
    targets: dict[str, str] = {}
    if root is not None:
        for rel in {*changed, *links}:
            target = _link_target(root, rel)
            if target is not None:
                targets[rel] = target
    problems = []
    for rel in changed:
        names, reason = rel, is_protected(rel, policy)
        target = targets.get(rel)
        if reason is None and target is not None and is_protected(target, policy):
            names = f"{rel} and {target or '.'}"
            reason = f"a symlink to {target or '.'}: {is_protected(target, policy)}"
        if reason is None:
            names, reason = _through_links(rel, targets, policy)
        if reason:
            problems.append(
                f"the step changed protected path {rel} ({reason}); nothing was committed. "
                f"Name {names} in the step's `changes` if the step is meant to change it"
            )
    return problems


def _through_links(rel: str, targets: Mapping[str, str], policy: Policy) -> tuple[str, str | None]:
    """(what to name, why) when a symlink ({link: resolved target}) makes `rel` reachable
    under a protected name; (rel, None) when none does."""
    for link, aim in targets.items():
        if aim and not rel.startswith(aim + "/"):
            continue
        alias = f"{link}/{rel[len(aim) + 1 :] if aim else rel}"
        why = is_protected(alias, policy)
        if why:
            return f"{rel} and {alias}", f"the symlink {link} makes it {alias}: {why}"
    return rel, None


def _link_target(root: Path, rel: str) -> str | None:
    """Where `rel` leads when its last component is a symlink ("" for the root), else None
    (not a link, or a link that leads outside `root`)."""
    head, _, name = rel.rstrip("/").rpartition("/")
    parent = resolve_inside(root, head)
    if parent is None or not os.path.islink(os.path.join(realpath(root), parent, name)):
        return None
    return resolve_inside(root, rel)


_MAX_LINKS = 40  # as the kernel's limit on links followed in one lookup (ELOOP)


def resolve_inside(root: Path, rel: str) -> str | None:
    """`rel` (root-relative) with its symlinks resolved, as a root-relative posix path ("" for
    the root itself), or None if it leads outside `root` or loops. Walks one component at a
    time and only ever looks at paths inside `root` (lstat, readlink): a link that points
    out is never followed, so a link planted by a command cannot make coder read elsewhere."""
    real_root = realpath(root)
    done: list[str] = []
    todo = [p for p in rel.split("/") if p not in ("", ".")][::-1]
    hops = 0
    while todo:
        part = todo.pop()
        if part == "..":
            if not done:
                return None
            done.pop()
            continue
        path = os.path.join(real_root, *done, part)
        if not os.path.islink(path):
            done.append(part)
            continue
        hops += 1
        if hops > _MAX_LINKS:
            return None
        target = os.readlink(path)
        if os.path.isabs(target):
            if not _inside(os.path.normpath(target), real_root):
                return None
            done = []
            target = os.path.relpath(os.path.normpath(target), real_root)
        todo += [p for p in target.split("/") if p not in ("", ".")][::-1]
    return "/".join(done)


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
    real_root = realpath(root)
    real = realpath(os.path.join(real_root, rel))  # an absolute rel replaces the root
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
