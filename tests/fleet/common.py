"""What the fleet tests share: a repository with a bare remote (file://), and the six-step
taskfile with two parallel levels ([a, b, c], then [d, e], then f) of shell steps."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import git
from tests.helpers import coder_cli, taskfile

TASK_ID = "fleet1"
BRANCH = f"agent/{TASK_ID}"
STEPS = ("a", "b", "c", "d", "e", "f")
TASKFILE = f"""\
id: {TASK_ID}
branch: {BRANCH}
title: fleet
graph:
  - {{id: a, kind: shell, goal: write a, cmd: "echo a > a.txt", depends_on: []}}
  - {{id: b, kind: shell, goal: write b, cmd: "echo b > b.txt", depends_on: []}}
  - {{id: c, kind: shell, goal: write c, cmd: "echo c > c.txt", depends_on: []}}
  - {{id: d, kind: shell, goal: join a and b, cmd: "cat a.txt b.txt > d.txt", depends_on: [a, b]}}
  - {{id: e, kind: shell, goal: copy c, cmd: "cat c.txt > e.txt", depends_on: [c]}}
  - {{id: f, kind: shell, goal: join d and e, cmd: "cat d.txt e.txt > f.txt", depends_on: [d, e]}}
"""


def with_remote(repo: Path, text: str = TASKFILE) -> tuple[Path, str, Path]:
    """`repo` with a bare remote `origin` holding its main branch: (the taskfile, the remote's
    file:// URL, the bare repository)."""
    bare = repo.parent / "remote.git"
    git(repo.parent, "init", "-q", "--bare", str(bare))
    url = f"file://{bare}"
    git(repo, "remote", "add", "origin", url)
    git(repo, "push", "-q", "origin", "main")
    return taskfile(repo, text), url, bare


def remote_refs(bare: Path) -> dict[str, str]:
    """refs/coder/... on the remote: name -> sha (the git CLI's view)."""
    out = git(bare, "for-each-ref", "--format=%(refname) %(objectname)", "refs/coder/")
    return dict(line.split(" ") for line in out.splitlines() if line)


def worker(repo: Path, step: str, path: Path, url: str, *extra: str, crash: str | None = None):
    """`coder worker --json` for `step` (the taskfile way, as a CI job runs it)."""
    base = git(repo, "rev-parse", "main").strip()
    args = ["worker", "--remote", url, "--step", step, "--taskfile", str(path), "--base", base]
    return coder_cli(repo, *args, "--json", *extra, crash=crash)


def result(proc) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(proc.stdout)
