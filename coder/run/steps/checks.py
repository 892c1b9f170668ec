"""Checks the executor runs around a step: asserts, and the guard that keeps `.git` the
executor's own (a command that edits .git/config or .git/hooks fails its step)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coder.taskfile import Assertion


def failed_asserts(asserts: tuple[Assertion, ...], workdir: Path) -> list[str]:
    failures = []
    for a in asserts:
        path = workdir / a.path
        if a.type == "file_exists" and not path.is_file():
            failures.append(f"assert file_exists {a.path}: no such file")
        elif a.type == "file_not_exists" and path.exists():
            failures.append(f"assert file_not_exists {a.path}: the file exists")
        elif a.type == "text_in_file":
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                failures.append(f"assert text_in_file {a.path}: cannot read the file")
                continue
            if a.contains is not None and a.contains not in text:
                failures.append(f"assert text_in_file {a.path}: {a.contains!r} not found")
    return failures


@dataclass(frozen=True)
class GitGuard:
    """A copy of the parts of .git a command could use to escape (config, hooks), so a step
    that changed them can be failed and the originals put back."""

    common_dir: Path
    saved: dict[str, bytes]

    @classmethod
    def take(cls, common_dir: Path) -> GitGuard:
        return cls(common_dir, _snapshot(common_dir))

    def changes(self) -> list[str]:
        now = _snapshot(self.common_dir)
        return sorted(k for k in self.saved.keys() | now.keys() if self.saved.get(k) != now.get(k))

    def restore(self) -> None:
        for rel in self.changes():
            path = self.common_dir / rel
            if rel in self.saved:
                path.write_bytes(self.saved[rel])
            else:
                path.unlink(missing_ok=True)


def _snapshot(common_dir: Path) -> dict[str, bytes]:
    out = {}
    for path in [common_dir / "config", *sorted((common_dir / "hooks").glob("*"))]:
        try:
            out[path.relative_to(common_dir).as_posix()] = path.read_bytes()
        except OSError:
            continue
    return out
