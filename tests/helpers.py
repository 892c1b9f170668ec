"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from coder.schemas import validator
from tests.conftest import git
from tests.fake_ollama import FakeOllama, Reply
from tests.prefix_cache import is_priming

ROOT = Path(__file__).resolve().parent.parent  # the repository: fixtures/, tasks/, README.md


def taskfile(repo: Path, text: str, name: str = "task.yaml") -> Path:
    """Write a (dedented) taskfile beside the repository, so it is not part of the checkout."""
    path = repo.parent / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def state_of(repo: Path, task_id: str) -> dict[str, Any]:
    """A run's state as coder reads it (the snapshot and its journal), checked against its
    schema."""
    from coder.run.state import StateStore

    data = StateStore(repo / ".coder").load(task_id).to_dict()
    assert list(validator("state").iter_errors(data)) == []
    return data


def step_commits(repo: Path, branch: str) -> list[tuple[str, str, str]]:
    """(step id, attempt, subject) of each commit on the branch after main, oldest first."""
    out = git(
        repo,
        "log",
        "--reverse",
        "--format=%(trailers:key=Coder-Step,valueonly,separator=)"
        "|%(trailers:key=Coder-Attempt,valueonly,separator=)|%s",
        f"main..{branch}",
    )
    return [tuple(line.split("|", 2)) for line in out.splitlines()]  # type: ignore[misc]


def snapshot(repo: Path) -> dict[str, Any]:
    """Everything a user could notice about their own checkout."""
    files = {
        p.relative_to(repo).as_posix(): p.read_bytes()
        for p in repo.rglob("*")
        if p.is_file() and ".git" not in p.parts and ".coder" not in p.parts
    }
    return {
        "files": files,
        "status": git(repo, "status", "--porcelain"),
        "head": git(repo, "symbolic-ref", "HEAD"),
        "index": git(repo, "diff", "--cached"),
        "main": git(repo, "rev-parse", "main"),
    }


def call(name: str, **arguments: Any) -> Reply:
    """A scripted model turn that calls one tool."""
    return Reply(tool_calls=[{"name": name, "arguments": arguments}])


def done(summary: str, *files: str, **extra: Any) -> Reply:
    """A scripted model turn that ends the step."""
    return call("step_complete", summary=summary, files_changed=list(files), **extra)


def chat_requests(fake: FakeOllama) -> list[dict[str, Any]]:
    """The chat requests the fake server received: the warm-up load (no messages) and the
    warm prefix (no user message) left out."""
    return [b for b in fake.chat_bodies() if b.get("messages") and not is_priming(b)]
