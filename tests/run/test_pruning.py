"""Nothing lost when git prunes objects under a run (issue 34): `git gc --prune=now --aggressive`
in a loop while a run commits, and a run whose newest commits lost their objects before this
(pruned under an older coder, or by hand).

Every test drives the real `coder` CLI in subprocesses against a real repository and judges by
git itself (`fsck`, `log`, `rev-parse`, the pack directory) against a control twin run without
the fault, never by what coder says.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import git
from tests.helpers import state_of, visible_to_commands
from tests.run.test_crash import coder, out, write_taskfile

TASK_ID = "gc"
BRANCH = f"agent/{TASK_ID}"
BASE_FILES = {f"src/d{d}/f{i}.txt": f"{d} {i}\n" for d in range(5) for i in range(10)}


def steps() -> list[str]:
    """30 steps, each a commit of new and changed files in nested directories: mostly one
    after another, three pairs side by side (scratch worktrees, their commits cherry-picked)."""
    found, previous = [], None
    for n in range(1, 28):
        cmd = f"echo {n} > f{n:02d}.txt && mkdir -p src/d{n % 5}/n && echo {n} >> src/d{n % 5}/log"
        pair = n % 9 == 0
        ids = [f"s{n:02d}a", f"s{n:02d}b"] if pair else [f"s{n:02d}"]
        for sid in ids:
            needs = [] if previous is None else previous
            made = f"{cmd} && echo {sid} > src/d{n % 5}/n/{sid}.txt"
            found.append(
                f"  - {{id: {sid}, kind: shell, goal: step {sid}, cmd: {made!r}, "
                f"depends_on: {needs}}}"
            )
        previous = ids
    return found


TASK = f"id: {TASK_ID}\nbranch: {BRANCH}\ntitle: gc\ngraph:\n" + "\n".join(steps()) + "\n"
STEP_IDS = [line.split("id: ")[1].split(",")[0] for line in steps()]


def committed_steps(repo: Path) -> list[str]:
    log = git(repo, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)", BRANCH)
    return [line.strip() for line in log.splitlines() if line.strip()]


def fsck(repo: Path) -> None:
    found = subprocess.run(
        ["git", "fsck", "--strict", "--no-dangling"],
        cwd=repo,
        text=True,
        capture_output=True,
        check=False,
    )
    assert found.returncode == 0 and not found.stdout.strip(), found.stdout + found.stderr


class GcLoop:
    """`git gc --prune=now --aggressive` over and over in `repo` until stopped (a thread)."""

    def __init__(self, repo: Path) -> None:
        self.repo, self.done, self.count = repo, threading.Event(), 0
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.done.is_set():
            subprocess.run(
                ["git", "gc", "-q", "--prune=now", "--aggressive"],
                cwd=self.repo,
                capture_output=True,
                check=False,
            )
            self.count += 1

    def __enter__(self) -> GcLoop:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(timeout=60)


def test_git_gc_prune_now_in_a_loop_during_a_run_loses_no_step(make_repo) -> None:
    """Before: the run ended with a traceback (KeyError, then NotFoundError), or a ref lock
    that `git gc` held for a moment; the branch named a commit the prune took (`git fsck`
    failed on it, 0 of 30 steps readable), and resume failed the same way."""
    control = make_repo(BASE_FILES, name="control")
    done = coder(control, "run", "--autonomous", "-f", str(write_taskfile(control, TASK)))
    assert done.returncode == 0, out(done)

    repo = make_repo(BASE_FILES)
    path = write_taskfile(repo, TASK)
    with GcLoop(repo) as gc:
        ran = coder(repo, "run", "--autonomous", "-f", str(path), timeout=120)
        pruned = gc.count
    assert pruned >= 3, "the prunes should overlap the run"
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, out(ran)
    fsck(repo)
    assert committed_steps(repo) == committed_steps(control) and len(STEP_IDS) == 30
    assert sorted(committed_steps(repo)) == sorted(STEP_IDS)
    assert git(repo, "rev-parse", f"{BRANCH}^{{tree}}") == git(
        control, "rev-parse", f"{BRANCH}^{{tree}}"
    )
    packs = repo / ".git" / "objects" / "pack"
    assert not [p.name for p in packs.iterdir() if p.suffix == ".keep" or p.name[0] == "."]
    assert state_of(repo, TASK_ID)["status"] == "success"


# --- a run whose newest commits lost their objects before ------------------------------------


def short_task(go: Path) -> str:
    return f"""\
id: {TASK_ID}
branch: {BRANCH}
title: gc
graph:
  - {{id: s1, kind: shell, goal: one, cmd: "echo one > one.txt"}}
  - {{id: s2, kind: shell, goal: two, cmd: "mkdir -p d && echo two > d/two.txt"}}
  - {{id: s3, kind: shell, goal: three, cmd: "[ -e {go} ] && echo three > three.txt"}}
"""


def unpack_all(repo: Path) -> None:
    """Every object loose, as a prune finds the newest ones."""
    packs = repo / ".git" / "objects" / "pack"
    for pack in list(packs.glob("*.pack")):
        moved = repo.parent / pack.name
        pack.rename(moved)
        for other in packs.glob(f"{pack.stem}.*"):
            other.unlink()
        with moved.open("rb") as stream:
            subprocess.run(["git", "unpack-objects", "-q"], cwd=repo, stdin=stream, check=True)


@pytest.mark.parametrize("victim", ["commit", "blob"])
def test_resume_moves_a_branch_whose_newest_commit_lost_objects_back_and_reruns_the_step(
    make_repo, tmp_path: Path, victim: str
) -> None:
    """What a run an older coder left under `git gc --prune=now` looks like: the branch names
    s2's commit, and that commit (or the blob it adds) is gone. Before: resume ended in a
    traceback (NotFoundError), or went on from a commit `git fsck` calls broken."""
    visible_to_commands(tmp_path)
    go = tmp_path / "go"
    control = make_repo({"a.txt": "a\n"}, name="control")
    go.touch()
    assert (
        coder(
            control, "run", "--autonomous", "-f", str(write_taskfile(control, short_task(go)))
        ).returncode
        == 0
    )
    go.unlink()

    repo = make_repo({"a.txt": "a\n"})
    path = write_taskfile(repo, short_task(go))
    assert coder(repo, "run", "--autonomous", "-f", str(path)).returncode == 1  # s3 fails
    s1, s2 = git(repo, "log", "--reverse", "--format=%H", f"main..{BRANCH}").split()
    unpack_all(repo)
    gone = s2 if victim == "commit" else git(repo, "rev-parse", f"{s2}:d/two.txt").strip()
    (repo / ".git" / "objects" / gone[:2] / gone[2:]).unlink()  # what the prune took
    assert subprocess.run(["git", "fsck"], cwd=repo, capture_output=True).returncode != 0

    go.touch()
    resumed = coder(repo, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, out(resumed)
    assert f"missing from the repository (from {s2[:12]}" in resumed.stderr, out(resumed)
    fsck(repo)
    assert committed_steps(repo) == ["s1", "s2", "s3"]
    assert git(repo, "rev-parse", f"{BRANCH}~2") == s1 + "\n"  # s1 stays
    assert git(repo, "rev-parse", f"{BRANCH}~1") != s2 + "\n"  # s2 ran again
    assert git(repo, "rev-parse", f"{BRANCH}^{{tree}}") == git(
        control, "rev-parse", f"{BRANCH}^{{tree}}"
    )
    assert state_of(repo, TASK_ID)["status"] == "success"
