"""`coder run --include-uncommitted` while `coder merge` of another run brings the user's
checkout along (issue 34): the run reads the checkout under the lock the merge holds from the
moment base moves until the checkout has followed, so its first commit never holds the merge's
half-written files, and landing it later never undoes the merge. Real processes: the merge is
held inside its checkout update by a smudge filter that waits for a file; or killed (kill -9)
after base moved. Judged with the git CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coder.run import lock
from tests.conftest import coder, git
from tests.helpers import wait_for

TASK = "id: {id}\ntitle: {id}\ngraph:\n  - {{id: s, kind: shell, cmd: {cmd!r}}}\n"
MERGED = {"a.txt": "a1\n", "m.dat": "m1\n", "z.txt": "z1\n"}  # what run t1 lands


def repo_with_merged_run(make_repo, tmp_path: Path) -> Path:
    """Run t1 finished (it changes a.txt, m.dat and z.txt); m.dat goes through a smudge filter
    that, once `ARM` exists, creates `PAUSED` and waits for `RELEASE`: a merge writing the
    checkout's files (in order: a.txt, m.dat, z.txt) stops half-way there. The user has an
    uncommitted edit of user.txt."""
    repo = make_repo(
        {
            "a.txt": "a\n",
            "m.dat": "m\n",
            "z.txt": "z\n",
            "user.txt": "u\n",
            ".gitattributes": "m.dat filter=slow\n",
        }
    )
    flags = tmp_path / "flags"
    flags.mkdir()
    wait = (
        f"if [ -e {flags}/ARM ]; then touch {flags}/PAUSED; "
        f"while [ ! -e {flags}/RELEASE ]; do sleep 0.02; done; fi; cat"
    )
    git(repo, "config", "filter.slow.smudge", f"sh -c '{wait}'")
    git(repo, "config", "filter.slow.clean", "cat")
    cmd = " && ".join(f"printf '{text}' > {name}" for name, text in MERGED.items())
    others = (("t2", "echo two > two.txt"), ("t3", "echo three > three.txt"))
    for task_id, command in (("t1", cmd), *others):
        (tmp_path / f"{task_id}.yaml").write_text(TASK.format(id=task_id, cmd=command))
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(tmp_path / "t1.yaml"))
    assert code == 0, out + err
    (repo / "user.txt").write_text("the user's edit\n")
    return repo


def coder_process(repo: Path, *args: str, crash: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODER_CRASH")}
    if crash:
        env["CODER_CRASH_AT"] = crash
    return subprocess.Popen(
        [sys.executable, "-m", "coder", *args],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def paused_merge(repo: Path, tmp_path: Path) -> subprocess.Popen[str]:
    """`coder merge -t t1` held inside its checkout update: base moved, a.txt written,
    m.dat being written, z.txt not yet."""
    flags = tmp_path / "flags"
    (flags / "ARM").touch()
    merging = coder_process(repo, "merge", "-t", "t1")
    wait_for(lambda: (flags / "PAUSED").exists() or merging.poll() is not None, 60, "the pause")
    assert merging.poll() is None, merging.communicate()
    assert git(repo, "show", "main:z.txt") == "z1\n"  # base has moved
    assert (repo / "a.txt").read_text() == "a1\n" and (repo / "z.txt").read_text() == "z\n"
    return merging


def release(merging: subprocess.Popen[str], tmp_path: Path) -> None:
    (tmp_path / "flags" / "RELEASE").touch()
    out, err = merging.communicate(timeout=60)
    assert merging.returncode == 0, out + err


def first_commit(repo: Path, branch: str) -> str:
    return git(repo, "rev-list", "--reverse", f"main..{branch}").split()[0]


def assert_both_landed(repo: Path) -> None:
    """Merging the second run keeps the first's work: main holds both, and the user's edit."""
    code, out, err = coder(repo, "merge", "-t", "t2")
    assert code == 0, out + err
    for name, text in {**MERGED, "user.txt": "the user's edit\n", "two.txt": "two\n"}.items():
        assert git(repo, "show", f"main:{name}") == text, name
    assert git(repo, "status", "--porcelain") == ""


def test_a_run_started_during_a_merges_checkout_update_waits_and_takes_only_the_users_edit(
    make_repo, tmp_path: Path
) -> None:
    repo = repo_with_merged_run(make_repo, tmp_path)
    merging = paused_merge(repo, tmp_path)
    merged = git(repo, "rev-parse", "main").strip()
    running = coder_process(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", str(tmp_path / "t2.yaml")
    )
    try:  # the run waits for the checkout's lock, the merge holds it
        checkout_lock = repo / ".coder" / "locks" / lock.CHECKOUT_LOCK

        def waiting() -> bool:
            return running.pid in lock.processes_holding(checkout_lock)

        wait_for(lambda: waiting() or running.poll() is not None, 60, "the run to wait")
        waited = running.poll() is None and git(repo, "branch", "--list", "agent/t2*") == ""
    finally:
        release(merging, tmp_path)
    out, err = running.communicate(timeout=60)
    assert running.returncode == 0, out + err

    first = first_commit(repo, "agent/t2-t2")
    assert git(repo, "rev-parse", f"{first}^").strip() == merged
    assert git(repo, "diff", "--name-only", f"{first}^", first) == "user.txt\n"
    assert waited  # for the merge, having read or made nothing
    assert_both_landed(repo)


def test_a_run_is_refused_when_the_merge_holds_the_checkout_too_long(
    make_repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = repo_with_merged_run(make_repo, tmp_path)
    merging = paused_merge(repo, tmp_path)
    monkeypatch.setattr(lock, "CHECKOUT_WAIT", 0.3)
    try:
        code, out, err = coder(
            repo, "run", "--autonomous", "--include-uncommitted", "-f", str(tmp_path / "t2.yaml")
        )
    finally:
        release(merging, tmp_path)
    assert code == 3, out + err
    assert err.startswith(
        f"coder: error: `coder merge` of run t1 (pid {merging.pid}) is updating your checkout"
    )
    assert "run the command again once it has finished" in err
    assert git(repo, "branch", "--list", "agent/t2*") == ""
    assert not (repo / ".coder" / "tasks" / "t2.json").exists()

    monkeypatch.undo()  # again, once the merge is done: as if nothing had happened
    code, out, err = coder(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", str(tmp_path / "t2.yaml")
    )
    assert code == 0, out + err
    first = first_commit(repo, "agent/t2-t2")
    assert git(repo, "diff", "--name-only", f"{first}^", first) == "user.txt\n"
    assert_both_landed(repo)


def test_a_merge_killed_before_the_checkout_followed_is_finished_before_it_is_read(
    make_repo, tmp_path: Path
) -> None:
    """kill -9 after base moved: the checkout's files are t1's base's, HEAD is the merge. A run
    with --include-uncommitted would take them as the user's undoing of the merge; it is
    refused (exit 3, naming the merge to finish), as is a merge of another run, until `coder
    merge -t t1` has finished; then the run takes the user's edit alone."""
    repo = repo_with_merged_run(make_repo, tmp_path)
    killed = coder_process(repo, "merge", "-t", "t1", crash="merge_after_ref")
    killed.communicate(timeout=60)
    assert killed.returncode == -9
    merged = git(repo, "rev-parse", "main").strip()
    assert git(repo, "show", "main:z.txt") == "z1\n" and (repo / "z.txt").read_text() == "z\n"

    code, out, err = coder(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", str(tmp_path / "t2.yaml")
    )
    assert code == 3, out + err
    assert err.startswith(
        f"coder: error: the merge of run t1 moved its base branch to {merged[:12]} but stopped "
        "before your checkout followed"
    )
    assert "coder merge -t t1" in err
    assert git(repo, "branch", "--list", "agent/t2*") == ""
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(tmp_path / "t3.yaml"))
    assert code == 0, out + err  # a run that leaves the checkout alone starts
    code, out, err = coder(repo, "merge", "-t", "t3")
    assert code == 3 and "the merge of run t1 moved its base branch" in err, out + err
    assert git(repo, "rev-parse", "main").strip() == merged

    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert (repo / "z.txt").read_text() == "z1\n"
    code, out, err = coder(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", str(tmp_path / "t2.yaml")
    )
    assert code == 0, out + err
    first = first_commit(repo, "agent/t2-t2")
    assert git(repo, "rev-parse", f"{first}^").strip() == merged
    assert git(repo, "diff", "--name-only", f"{first}^", first) == "user.txt\n"
    assert_both_landed(repo)
