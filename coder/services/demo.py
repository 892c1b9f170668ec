"""`coder demo`: the whole journey on a sample project in a fresh git repository, offline.

The sample project, the demo taskfile and a recorded model transcript ship inside the package
(`coder/_demo/`, from `fixtures/`); the run replays the recording, so no Ollama is needed.
`--live` runs the same taskfile against the configured model instead.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coder.errors import InvalidInput
from coder.git import branches, diffs, repository
from coder.git import commits as gitcommits
from coder.run.drive import RunOptions
from coder.run.start import start_run
from coder.services import merge


@dataclass(frozen=True)
class DemoAssets:
    project: Path
    taskfile: Path
    recording: Path


@dataclass(frozen=True)
class DemoResult:
    repo: Path
    run: Any  # RunResult
    merge: Any  # merge.MergeResult | None
    commits: list[str]  # the run's step commits, oldest first ("sha subject")
    stat: str  # the merged diff stat


def assets() -> DemoAssets:
    package = Path(__file__).parent.parent  # coder/
    packaged = package / "_demo"
    if packaged.is_dir():
        return DemoAssets(packaged / "project", packaged / "task.yaml", packaged / "recording.json")
    fixtures = package.resolve().parent / "fixtures"
    return DemoAssets(
        fixtures / "pyproject-sample",
        fixtures / "demo" / "task.yaml",
        fixtures / "demo" / "recording.json",
    )


def prepare(target: Path | None) -> Path:
    """A fresh git repository holding the sample project, one commit on main."""
    if target is None:
        target = Path(tempfile.mkdtemp(prefix="coder-demo-")) / "calc"
    elif target.exists() and any(target.iterdir()):
        raise InvalidInput(
            f"{target} exists and is not empty", hint="pass a new directory to --keep"
        )
    shutil.copytree(assets().project, target, dirs_exist_ok=True)
    gitcommits.initial_commit(target, "calc: add and subtract", branch="main")
    return target


def run(
    *,
    target: Path | None = None,
    live: bool = False,
    console: Any = None,
    notify: Any = None,
    loop_events: Any = None,
) -> DemoResult:
    """The demo run, then its merge. `console` and `loop_events` are the run's progress
    (`RunOptions.live`)."""
    demo = assets()
    repo_dir = prepare(target)
    options = RunOptions(replay=None if live else demo.recording, live=loop_events)
    result = start_run(demo.taskfile, cwd=repo_dir, options=options, console=console)
    landed = None
    if result.status == "success":
        landed = merge.merge_run(result.task_id, cwd=repo_dir, if_green=True, notify=notify)
    repo = repository.open_repo(repo_dir)
    manifest = result.manifest
    tip = branches.branch_tip(repo, manifest.branch)
    commits = [
        f"{c.commit[:8]} {c.summary}"
        for c in gitcommits.step_commits(
            repo, branch=manifest.branch, base_commit=manifest.base_commit, task_id=result.task_id
        )
    ]
    stat = (
        diffs.diff_stat(repo, manifest.base_commit, landed.commit)
        if landed and landed.commit
        else (diffs.diff_stat(repo, manifest.base_commit, tip) if tip else "")
    )
    return DemoResult(repo_dir, result, landed, commits, stat)
