"""`coder merge` and `coder run --merge-on-success` on real repositories, checked with the git
CLI: squash/no-ff/ff-only, the tag, --if-green on the exact merge result, conflicts, the user's
checkout (dirty or not, checked out or not), refusals with their exit codes, and kill -9 at
every merge crash point (RELIABILITY.md row 8; DESIGN.md invariants 1 and 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from coder.crashpoints import MERGE_POINTS
from coder.run.lock import TaskLock
from coder.schemas import validator
from tests.conftest import coder, git
from tests.helpers import coder_cli

# The project's tests (unittest, found by detection) allow at most two items: a run adding
# one is green, a base adding one is green, the two merged are red.
FILES = {
    "README.md": "# r\n",
    "a.txt": "a\n",
    "old.txt": "old\n",
    "items/a": "a\n",
    "tests/test_items.py": textwrap.dedent("""\
        import pathlib
        import unittest


        class Items(unittest.TestCase):
            def test_at_most_two_items(self):
                self.assertLessEqual(len(list(pathlib.Path("items").iterdir())), 2)
    """),
}
TASK = """\
id: {id}
title: Add an item
graph:
  - {{id: add, kind: shell, goal: add item b, cmd: "echo b > items/b"}}
  - {{id: readme, kind: shell, goal: extend the readme, cmd: "echo more >> README.md",
     depends_on: [add]}}
  - {{id: tidy, kind: shell, goal: drop old.txt and add a script and a link,
     cmd: "rm old.txt && mkdir bin && echo 'echo hi' > bin/hi && chmod +x bin/hi
           && ln -s README.md link",
     depends_on: [readme]}}
  - {{id: noop, kind: shell, goal: change nothing, cmd: "true", depends_on: [tidy]}}
"""
RED_TASK = "id: {id}\ntitle: Breaks\ngraph:\n  - {{kind: shell, cmd: 'echo x > x.txt && exit 1'}}\n"


# --- helpers ---------------------------------------------------------------------------------


def finished_run(
    make_repo: Any, task_id: str = "t1", *, name: str = "repo", task: str = TASK
) -> Path:
    repo = make_repo(FILES, name=name)
    path = repo.parent / f"{name}-{task_id}.yaml"
    path.write_text(task.format(id=task_id))
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code in (0, 1), out + err
    return repo


def branch(task_id: str = "t1") -> str:
    return f"agent/{task_id}-add-an-item"


def rev(repo: Path, name: str) -> str:
    return git(repo, "rev-parse", name).strip()


def state_of(repo: Path, task_id: str = "t1") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((repo / ".coder" / "state" / f"{task_id}.json").read_text())
    assert list(validator("state").iter_errors(data)) == []
    return data


def commit_on_main(repo: Path, files: dict[str, str], message: str = "base moves") -> str:
    """Someone else commits to main in the user's checkout (main is checked out there)."""
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", *files)
    git(repo, "commit", "-q", "-m", message)
    return rev(repo, "main")


def snapshot(repo: Path) -> dict[str, Any]:
    """All a user could notice: files (bytes and modes), status, index, refs, worktrees."""
    files = {
        p.relative_to(repo).as_posix(): (
            p.read_bytes() if not p.is_symlink() else os.readlink(p),
            p.lstat().st_mode,
        )
        for p in repo.rglob("*")
        if (p.is_file() or p.is_symlink()) and ".git" not in p.parts and ".coder" not in p.parts
    }
    return {
        "files": files,
        "status": git(repo, "status", "--porcelain"),
        "index": git(repo, "diff", "--cached"),
        "head": git(repo, "symbolic-ref", "HEAD"),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
    }


def assert_nothing_landed(repo: Path, before: dict[str, Any], task_id: str = "t1") -> None:
    assert snapshot(repo) == before
    assert git(repo, "tag", "-l") == ""
    assert state_of(repo, task_id)["merge"] is None
    assert not (repo / ".coder" / "worktrees" / f"{task_id}--merge.check").exists()


def assert_squash_of_run(repo: Path, old_main: str, task_id: str = "t1") -> str:
    """main is exactly one new commit on old_main, with the run's tree, and tagged."""
    main_tip = rev(repo, "main")
    assert git(repo, "rev-list", "--parents", "-1", "main").split() == [main_tip, old_main]
    assert rev(repo, "main^{tree}") == rev(repo, f"{branch(task_id)}^{{tree}}")
    trailers = git(repo, "log", "-1", "--format=%(trailers)", "main").strip()
    assert trailers == f"Coder-Task: {task_id}\nCoder-Merge: squash"
    assert rev(repo, f"coder/{task_id}") == main_tip
    return main_tip


# --- squash, the tag, the message, --if-green ------------------------------------------------


def test_squash_merge_lands_the_runs_tree_as_one_tagged_commit(make_repo) -> None:
    repo = finished_run(make_repo)
    old_main = rev(repo, "main")
    code, out, err = coder(repo, "merge", "-t", "t1", "--if-green")
    assert code == 0, out + err
    commit = assert_squash_of_run(repo, old_main)
    assert out.startswith(
        f"Merged run t1 into main (squash, checked green) as {commit[:12]}, tagged coder/t1."
    )
    assert "checking the merge result: python -m unittest discover -s tests -v" in err
    assert git(repo, "log", "-1", "--format=%B", "main") == textwrap.dedent("""\
        Add an item

        Squash merge of coder task t1 from agent/t1-add-an-item (4 steps):
        - add: add item b
        - readme: extend the readme
        - tidy: drop old.txt and add a script and a link
        - noop: change nothing (no changes)

        Coder-Task: t1
        Coder-Merge: squash

    """)
    # main was checked out and clean: the checkout follows, files, modes, links and index
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "README.md").read_text() == "# r\nmore\n"
    assert not (repo / "old.txt").exists()
    assert os.access(repo / "bin" / "hi", os.X_OK)
    assert os.readlink(repo / "link") == "README.md"
    merge = state_of(repo)["merge"]
    assert (merge["commit"], merge["base"], merge["mode"], merge["tag"]) == (
        commit,
        "main",
        "squash",
        "coder/t1",
    )
    assert not (repo / ".coder" / "worktrees" / "t1--merge.check").exists()
    assert "t1--merge.check" not in git(repo, "worktree", "list")
    assert "coder-scratch" not in git(repo, "branch", "-a")
    events = [
        json.loads(line)["event"]
        for line in (repo / ".coder" / "logs" / "t1.jsonl").read_text().splitlines()
    ]
    assert events[-1] == "merge.merged"
    git(repo, "fsck", "--strict")

    # merging twice: reported, idempotent
    code, out, _ = coder(repo, "merge", "-t", "t1")
    assert code == 0
    assert out == f"Run t1 already merged at {commit[:12]} (squash into main, tag coder/t1).\n"
    code, out, _ = coder(repo, "merge", "-t", "t1", "--json", "--mode", "no-ff")
    data = json.loads(out)
    assert (code, data["outcome"], data["commit"], data["mode"]) == (
        0,
        "already_merged",
        commit,
        "squash",
    )
    assert rev(repo, "main") == commit


def test_if_green_runs_the_tests_on_the_merge_result_and_lands_nothing_when_red(make_repo) -> None:
    repo = finished_run(make_repo)  # the run adds items/b: two items, green
    commit_on_main(repo, {"items/c": "c\n"})  # main adds items/c: two items, green
    before = snapshot(repo)
    code, out, err = coder(repo, "merge", "-t", "t1", "--if-green")
    assert code == 1
    assert err.splitlines()[:2] == [
        "checking the merge result: python -m unittest discover -s tests -v",
        (
            "coder: error: the merge of run t1 into main is not green, so nothing was landed: "
            "`python -m unittest discover -s tests -v` exited with 1"
        ),
    ]
    assert "merge-check.log" in err
    assert_nothing_landed(repo, before)
    log = (repo / ".coder" / "artifacts" / "t1" / "merge-check.log").read_text()
    assert "AssertionError: 3 not less than or equal to 2" in log
    # without --if-green the same merge lands (both sides changed different files)
    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert sorted(os.listdir(repo / "items")) == ["a", "b", "c"]


def test_if_green_checks_required_files(make_repo) -> None:
    task = TASK.replace("graph:", "success: {{required_files: [docs/guide.md]}}\ngraph:", 1)
    repo = make_repo(FILES)
    path = repo.parent / "task.yaml"
    path.write_text(task.format(id="t1"))
    # the run itself fails its success criteria, so make it succeed: the file exists on the
    # branch, and main deletes it afterwards (the merge result lacks it)
    commit_on_main(repo, {"docs/guide.md": "guide\n"})
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    git(repo, "rm", "-q", "docs/guide.md")
    git(repo, "commit", "-q", "-m", "drop the guide")
    before = snapshot(repo)
    code, _, err = coder(repo, "merge", "-t", "t1", "--if-green")
    assert code == 1 and "required file docs/guide.md is missing" in err
    assert_nothing_landed(repo, before)


def test_if_green_without_a_test_command_and_a_run_with_nothing_to_merge(make_repo) -> None:
    repo = finished_run(make_repo)
    git(repo, "rm", "-rq", "tests")
    git(repo, "commit", "-q", "-m", "no tests any more")
    before, main_before = snapshot(repo), rev(repo, "main")
    code, _, err = coder(repo, "merge", "-t", "t1", "--if-green")
    assert code == 2
    assert err.startswith(
        "coder: error: --if-green needs the project's test command, and none "
        "could be found for task t1; nothing was landed"
    )
    assert_nothing_landed(repo, before)

    noop = repo.parent / "noop.yaml"
    noop.write_text("id: t2\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'true'}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(noop))[0] == 0
    code, out, _ = coder(repo, "merge", "-t", "t2", "--if-green")
    assert (code, out) == (0, "Nothing to merge: main already has every change of run t2.\n")
    assert rev(repo, "main") == main_before
    assert git(repo, "tag", "-l") == ""


# --- base moved: conflicts, clean merges, ff-only -----------------------------------------------


def test_a_conflicting_base_is_refused_naming_the_files(make_repo) -> None:
    repo = finished_run(make_repo)
    commit_on_main(repo, {"README.md": "# r\nmine\n", "a.txt": "changed\n"})
    before = snapshot(repo)
    code, _, err = coder(repo, "merge", "-t", "t1")
    assert code == 3
    assert err.splitlines()[0] == (
        "coder: error: run t1 conflicts with main (which moved since "
        "the run started) in README.md; nothing was changed"
    )
    assert_nothing_landed(repo, before)


def test_a_base_that_moved_without_conflict_gets_a_squash_on_its_new_tip(make_repo) -> None:
    repo = finished_run(make_repo)
    moved = commit_on_main(repo, {"a.txt": "changed\n"})
    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert git(repo, "rev-list", "--parents", "-1", "main").split()[1:] == [moved]
    assert git(repo, "show", "main:a.txt") == "changed\n"
    assert git(repo, "show", "main:README.md") == "# r\nmore\n"
    assert git(repo, "status", "--porcelain") == ""


def test_no_ff_makes_a_merge_commit_and_ff_only_moves_base_to_the_run(make_repo) -> None:
    repo = finished_run(make_repo, name="noff")
    old_main, tip = rev(repo, "main"), rev(repo, branch())
    code, out, err = coder(repo, "merge", "-t", "t1", "--mode", "no-ff")
    assert code == 0, out + err
    main_tip = rev(repo, "main")
    assert git(repo, "rev-list", "--parents", "-1", "main").split() == [main_tip, old_main, tip]
    assert rev(repo, "main^{tree}") == rev(repo, f"{tip}^{{tree}}")
    assert "Coder-Merge: no-ff" in git(repo, "log", "-1", "--format=%(trailers)", "main")
    assert rev(repo, "coder/t1") == main_tip
    assert git(repo, "status", "--porcelain") == ""

    repo = finished_run(make_repo, name="ff")
    tip = rev(repo, branch())
    code, out, err = coder(repo, "merge", "-t", "t1", "--mode", "ff-only", "--json")
    assert code == 0, out + err
    assert json.loads(out)["commit"] == tip
    assert rev(repo, "main") == tip and rev(repo, "coder/t1") == tip
    assert git(repo, "status", "--porcelain") == ""
    assert state_of(repo)["merge"]["mode"] == "ff-only"
    assert coder(repo, "merge", "-t", "t1")[1].startswith(f"Run t1 already merged at {tip[:12]}")


def test_ff_only_is_refused_when_base_moved(make_repo) -> None:
    repo = finished_run(make_repo)
    commit_on_main(repo, {"a.txt": "changed\n"})
    before = snapshot(repo)
    code, _, err = coder(repo, "merge", "-t", "t1", "--mode", "ff-only")
    assert code == 3
    assert "cannot fast-forward main to agent/t1-add-an-item: main has moved" in err
    assert "--mode squash" in err
    assert_nothing_landed(repo, before)


# --- the user's checkout -----------------------------------------------------------------------


def test_dirty_checkout_keeps_the_users_edits_byte_for_byte(make_repo) -> None:
    repo = finished_run(make_repo)
    (repo / "a.txt").write_bytes(b"my edit\r\nno newline at end")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "notes.txt").write_text("untracked\n")
    old_main = rev(repo, "main")
    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert f"checkout {repo} updated" in out
    assert_squash_of_run(repo, old_main)
    assert (repo / "a.txt").read_bytes() == b"my edit\r\nno newline at end"
    assert (repo / "notes.txt").read_text() == "untracked\n"
    assert git(repo, "status", "--porcelain").splitlines() == [
        " M a.txt",
        "A  staged.txt",
        "?? notes.txt",
    ]
    assert git(repo, "diff", "--cached", "--name-only") == "staged.txt\n"
    assert (repo / "README.md").read_text() == "# r\nmore\n"
    assert (repo / "items" / "b").read_text() == "b\n"


def test_a_full_disk_while_the_checkout_is_written_leaves_no_temp_file_and_merge_finishes(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base branch moved, then writing the files ran out of space: each file is still
    either old or new, no `.NAME.coder-tmp` half-file is left among the user's files
    (one was, per failed write), and once there is room `coder merge` finishes."""
    import errno

    from coder.files import nofollow

    repo = finished_run(make_repo)
    old_main = rev(repo, "main")

    class FullDisk:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(nofollow, "os", FullDisk())
        code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 3, out + err
    assert "No space left on device" in err and "run `coder merge -t t1` again" in err
    assert not [p.name for p in repo.rglob("*tmp") if ".git" not in p.parts]
    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert_squash_of_run(repo, old_main)
    assert git(repo, "status", "--porcelain") == ""


def test_edits_overlapping_the_merge_are_refused_naming_the_files(make_repo) -> None:
    repo = finished_run(make_repo)
    (repo / "README.md").write_text("# r\nmy unsaved line\n")
    (repo / "items" / "b").write_text("my own b\n")  # untracked, where the merge adds a file
    (repo / "a.txt").write_text("unrelated edit\n")
    before = snapshot(repo)
    code, _, err = coder(repo, "merge", "-t", "t1")
    assert code == 3
    assert err.splitlines()[0] == (
        f"coder: error: uncommitted changes in {repo} overlap the "
        "merge: README.md, items/b; nothing was changed"
    )
    assert "git stash -u" in err
    assert_nothing_landed(repo, before)


def test_base_not_checked_out_anywhere_only_the_ref_moves(make_repo) -> None:
    repo = finished_run(make_repo)
    git(repo, "switch", "-q", "-c", "elsewhere")
    (repo / "README.md").write_text("edited on another branch\n")
    before = snapshot(repo)
    old_main = rev(repo, "main")
    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert "main is not checked out; only the branch moved" in out
    assert_squash_of_run(repo, old_main)
    after = snapshot(repo)
    assert after["files"] == before["files"] and after["status"] == before["status"]
    assert after["head"] == "refs/heads/elsewhere\n"


def test_checkout_plan_writes_only_paths_at_old_or_half_written(make_repo) -> None:
    """gitland.plan_checkout_update, path by path: still old -> pending; file new but index old
    (a crash between the two writes) -> pending; both new -> done; anything else -> blocked."""
    from coder.git import land as gitland

    repo = make_repo({"a": "a\n", "b": "b\n", "c": "c\n", "d": "d\n", "gone": "x\n"})
    old = rev(repo, "main")
    git(repo, "switch", "-q", "-c", "next")
    for name in "abcd":
        (repo / name).write_text(f"{name}2\n")
    git(repo, "rm", "-q", "gone")
    git(repo, "commit", "-q", "-am", "next")
    new = rev(repo, "next")
    git(repo, "switch", "-q", "main")
    (repo / "b").write_text("b2\n")
    (repo / "c").write_text("c2\n")
    git(repo, "add", "c")
    (repo / "d").write_text("mine\n")
    plan = gitland.plan_checkout_update(repo, old, new)
    assert (plan.pending, plan.done, plan.blocked) == (("a", "b", "gone"), ("c",), ("d",))
    gitland.apply_checkout_update(repo, new, plan.pending)
    assert [(repo / n).read_text() for n in "abcd"] == ["a2\n", "b2\n", "c2\n", "mine\n"]
    assert not (repo / "gone").exists()
    assert git(repo, "diff", "--cached", "--name-status", "next").strip() == "M\td"
    assert git(repo, "diff", "--name-only", "next") == "d\n"


# --- refusals ---------------------------------------------------------------------------------


def test_a_failed_run_is_refused_and_an_unknown_task_is_bad_input(make_repo) -> None:
    repo = finished_run(make_repo, "red", task=RED_TASK)
    before = snapshot(repo)
    code, _, err = coder(repo, "merge", "-t", "red", "--if-green")
    assert code == 2
    assert err.splitlines() == [
        "coder: error: run red is failed; only a successful run can be merged",
        "  hint: finish it with `coder resume -t red`, then merge",
    ]
    assert_nothing_landed(repo, before, "red")
    code, _, err = coder(repo, "merge", "-t", "nope")
    assert code == 2 and "no task 'nope' in this project" in err
    code, _, err = coder(repo, "merge", "-t", "red", "--mode", "rebase")
    assert code == 2 and "'rebase' is not one of" in err


def test_a_running_task_is_refused(make_repo) -> None:
    repo = finished_run(make_repo)
    before = snapshot(repo)
    with TaskLock(repo / ".coder", "t1"):
        code, out, err = coder(repo, "merge", "-t", "t1", "--json")
    assert code == 3
    assert err.startswith(
        f"coder: error: cannot merge run t1 while it runs: task t1 is already "
        f"being run by pid {os.getpid()}"
    )
    assert json.loads(out)["exit_code"] == 3
    assert_nothing_landed(repo, before)


# --- crash safety (RELIABILITY.md row 8) ------------------------------------------------------

CRASHES = [  # (CODER_CRASH_AT, mode, whether base has moved when it dies)
    ("merge_verify", "squash", False),
    ("merge_before_ref", "squash", False),
    ("merge_after_ref", "squash", True),
    ("merge_file_write", "squash", True),  # README.md half written to .README.md.coder-tmp
    ("merge_after_checkout", "squash", True),
    ("checkpoint#1", "squash", True),  # inside the state write that records the merge
    ("merge_after_ref", "ff-only", True),
]


def test_the_crash_list_covers_every_merge_point() -> None:
    assert {at for at, _, _ in CRASHES} >= set(MERGE_POINTS)


@pytest.mark.parametrize(("at", "mode", "landed"), CRASHES, ids=[f"{c[0]}-{c[1]}" for c in CRASHES])
def test_kill_9_inside_merge_leaves_base_old_or_new_and_a_second_merge_finishes(
    make_repo, at: str, mode: str, landed: bool
) -> None:
    repo = finished_run(make_repo)
    (repo / "a.txt").write_text("the user's edit\n")  # must survive the crash and the finish
    old_main, tip = rev(repo, "main"), rev(repo, branch())
    result = coder_cli(repo, "merge", "-t", "t1", "--if-green", "--mode", mode, crash=at)
    assert result.returncode == -9, result.stdout + result.stderr
    now = rev(repo, "main")
    assert now == (old_main if not landed else tip if mode == "ff-only" else now)
    if landed and mode == "squash":
        assert_squash_of_run(repo, old_main)
    assert state_of(repo)["merge"] is None  # recorded last, never before the ref moved
    if at == "merge_file_write":  # the kill left the temp file: the second merge removes it
        assert (repo / ".README.md.coder-tmp").read_bytes() == b"# r\nmore\n"[:5]

    result = coder_cli(repo, "merge", "-t", "t1", "--mode", mode)
    assert result.returncode == 0, result.stdout + result.stderr
    if landed:
        assert result.stdout.startswith(f"Run t1 already merged at {now[:12]}")
        assert rev(repo, "main") == now
    else:
        assert result.stdout.startswith("Merged run t1 into main")
    if mode == "squash":
        assert_squash_of_run(repo, old_main)
    else:
        assert rev(repo, "main") == tip and rev(repo, "coder/t1") == tip
    assert state_of(repo)["merge"]["commit"] == rev(repo, "main")
    assert git(repo, "status", "--porcelain") == " M a.txt\n"
    assert (repo / "a.txt").read_text() == "the user's edit\n"
    assert "t1--merge.check" not in git(repo, "worktree", "list")
    assert not (repo / ".coder" / "worktrees" / "t1--merge.check").exists()
    git(repo, "fsck", "--strict")


# --- what a kill leaves in the user's checkout (RELIABILITY.md row 25) -----------------------
# Row 25's tests: test_kill_9_inside_merge_leaves_base_old_or_new_and_a_second_merge_finishes
# [merge_file_write-squash], test_a_temp_file_a_killed_merge_left_is_swept_though_its_path_
# is_not_written_again, test_a_merge_killed_inside_its_index_write_is_finished_by_the_next_one,
# test_an_index_lock_not_coders_refuses_the_merge_before_base_moves.


def untracked(repo: Path) -> list[str]:
    """What `git status` lists as untracked or ignored in the checkout (`.coder/` aside)."""
    status = git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored")
    listed = [line[3:] for line in status.splitlines() if line[:2] in ("??", "!!")]
    return [path for path in listed if not path.startswith(".coder/")]


def test_a_temp_file_a_killed_merge_left_is_swept_though_its_path_is_not_written_again(
    make_repo,
) -> None:
    """Killed with README.md half written to `.README.md.coder-tmp`; the user then edits
    README.md, so the second merge leaves it alone, and still removes the temp file (and one
    an earlier coder named `.NAME.coder-PID.tmp`), never a tracked file of that shape."""
    repo = finished_run(make_repo)
    (repo / "items" / ".a.coder-tmp").write_text("tracked, shaped like a temp file\n")
    git(repo, "add", "items/.a.coder-tmp")
    git(repo, "commit", "-q", "-m", "a file named like a temp file")
    old_main = rev(repo, "main")
    result = coder_cli(repo, "merge", "-t", "t1", crash="merge_file_write")
    assert result.returncode == -9, result.stdout + result.stderr
    assert untracked(repo) == [".README.md.coder-tmp"]
    (repo / "bin").mkdir()
    (repo / "bin" / ".hi.coder-31337.tmp").write_text("an older coder's half file\n")
    (repo / "README.md").write_text("# r\nthe user's line\n")

    result = coder_cli(repo, "merge", "-t", "t1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left README.md in" in result.stdout
    assert "removed 2 temporary file(s)" in result.stdout
    assert untracked(repo) == []
    assert git(repo, "rev-list", "--count", f"{old_main}..main") == "1\n"
    assert git(repo, "status", "--porcelain") == "MM README.md\n"
    assert (repo / "README.md").read_text() == "# r\nthe user's line\n"
    assert (repo / "items" / ".a.coder-tmp").read_text() == "tracked, shaped like a temp file\n"
    git(repo, "fsck", "--strict")


def kill_when_created(proc: subprocess.Popen[str], path: Path, timeout: float = 60) -> bool:
    """SIGKILL `proc` the instant `path` is created (inotify on its directory); False if the
    process ended first."""
    import ctypes
    import select
    import signal
    import struct
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, bytes(path.parent), 0x100) >= 0  # IN_CREATE
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.05)[0]:
                continue
            data = os.read(fd, 65536)
            while data:
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data)
                name = data[16 : 16 + size].rstrip(b"\0")
                data = data[16 + size :]
                if name == path.name.encode():
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.communicate(timeout=30)
                    return True
        return False
    finally:
        os.close(fd)


def test_a_merge_killed_inside_its_index_write_is_finished_by_the_next_one(make_repo) -> None:
    """SIGKILL the moment `.git/index.lock` appears (inotify; 500 more files with 1,600-byte
    paths make an 800 kB index, some 10 ms to write): the lock stays, base has moved, the files
    are written but not recorded. The next merge finds its journal, sees the writer dead,
    removes the lock and finishes: one squash commit, no lock, nothing else changed."""
    deep = "/".join(["d" * 200] * 8)
    files = {**FILES, **{f"{deep}/{i}": f"{i}\n" for i in range(500)}}
    for attempt in range(8):  # the kill may come after the rename: then start again
        repo = finished_run(lambda f, name: make_repo(files, name=name), name=f"repo{attempt}")
        (repo / "a.txt").write_text("the user's edit\n")
        old_main = rev(repo, "main")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODER_CRASH")}
        merging = subprocess.Popen(  # niced: this process reacts before it writes on
            ["nice", "-n", "19", sys.executable, "-m", "coder", "merge", "-t", "t1"],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        killed = kill_when_created(merging, repo / ".git" / "index.lock")
        if killed and (repo / ".git" / "index.lock").exists():
            break
        merging.communicate(timeout=30)
    else:
        pytest.fail("no kill landed inside the index write in 8 attempts")
    assert_squash_of_run(repo, old_main)  # base moved before the checkout was written
    assert state_of(repo)["merge"] is None
    assert (repo / ".coder" / "artifacts" / "t1" / "merge-index.json").exists()

    result = coder_cli(repo, "merge", "-t", "t1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"removed {repo}/.git/index.lock, left by a `coder merge` of this run" in result.stdout
    assert not (repo / ".git" / "index.lock").exists()
    assert not (repo / ".coder" / "artifacts" / "t1" / "merge-index.json").exists()
    assert_squash_of_run(repo, old_main)
    assert git(repo, "rev-list", "--count", f"{old_main}..main") == "1\n"
    assert state_of(repo)["merge"]["commit"] == rev(repo, "main")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == " M a.txt\n"
    git(repo, "fsck", "--strict")


def test_an_index_lock_not_coders_refuses_the_merge_before_base_moves(make_repo) -> None:
    """A lock no merge of this run left (a git process at work, or one killed) refuses the
    merge before anything changes, naming the lock and the fix; so does one found when an
    interrupted merge had already moved base. Deleting it lets the merge finish."""
    repo = finished_run(make_repo)
    lock = repo / ".git" / "index.lock"
    lock.write_bytes(b"")
    old_main = rev(repo, "main")
    before = snapshot(repo)
    result = coder_cli(repo, "merge", "-t", "t1")
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"coder: error: {lock} exists: a git process is working in {repo}, or one was killed "
        "there; nothing was changed",
        f"  hint: if no git process is running there, delete {lock}; then run "
        "`coder merge -t t1` again",
    ]
    assert_nothing_landed(repo, before)

    lock.unlink()  # killed after base moved; then a lock of someone else's appears
    result = coder_cli(repo, "merge", "-t", "t1", crash="merge_after_ref")
    assert result.returncode == -9
    landed = rev(repo, "main")
    lock.write_bytes(b"")
    before = snapshot(repo)
    result = coder_cli(repo, "merge", "-t", "t1")
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.startswith(
        f"coder: error: run t1 landed on main as {landed[:12]}, but {repo} cannot follow: "
        f"{lock} exists"
    )
    assert snapshot(repo) == before and lock.exists()

    lock.unlink()
    result = coder_cli(repo, "merge", "-t", "t1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_squash_of_run(repo, old_main)
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_the_lock_refusal_names_the_command_holding_it(make_repo) -> None:
    """Another merge of the run holds its lock: wait for it (not `coder stop`, which is for
    runs); a run holding it is still named as one, with the way to stop it."""
    repo = finished_run(make_repo)
    before = snapshot(repo)
    with TaskLock(repo / ".coder", "t1", holder="merge"):
        code, _, err = coder(repo, "merge", "-t", "t1")
    assert code == 3
    assert err.splitlines()[0].startswith(
        f"coder: error: another `coder merge` of run t1 (pid {os.getpid()}, started "
    )
    assert err.splitlines()[0].endswith(") is running; wait for it")
    assert "coder stop" not in err
    assert_nothing_landed(repo, before)


def test_ctrl_c_after_base_moved_says_it_landed_and_the_next_merge_finishes(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the checkout is written (base has moved): exit 130, and the message says
    what landed and to merge again, which finishes the job."""
    from coder.git import land as gitland

    repo = finished_run(make_repo)
    old_main = rev(repo, "main")

    def interrupted(*_args: Any, **_kw: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(gitland, "apply_checkout_update", interrupted)
        code, _, err = coder(repo, "merge", "-t", "t1")
    landed = rev(repo, "main")
    assert code == 130
    assert err.splitlines() == [
        f"coder: interrupted: the merge of run t1 stopped after it landed on main as "
        f"{landed[:12]}; the tag, the checkout or the run's record may be unfinished",
        "  hint: run `coder merge -t t1` again to finish it",
    ]
    assert state_of(repo)["merge"] is None
    code, out, err = coder(repo, "merge", "-t", "t1")
    assert code == 0, out + err
    assert_squash_of_run(repo, old_main)
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


# --- coder run --merge-on-success ---------------------------------------------------------------


def test_run_merge_on_success_lands_a_green_run_and_not_a_red_one(make_repo) -> None:
    repo = make_repo(FILES)
    green = repo.parent / "green.yaml"
    green.write_text(TASK.format(id="g1"))
    old_main = rev(repo, "main")
    code, out, err = coder(repo, "run", "--autonomous", "--merge-on-success", "-f", str(green))
    assert code == 0, out + err
    assert "Run g1: success" in out and "Merged run g1 into main (squash, checked green)" in out
    assert_squash_of_run(repo, old_main, "g1")
    assert git(repo, "status", "--porcelain") == ""

    red = repo.parent / "red.yaml"
    red.write_text(RED_TASK.format(id="r1"))
    before = rev(repo, "main")
    code, out, err = coder(
        repo, "run", "--autonomous", "--merge-on-success", "--json", "-f", str(red)
    )
    assert code == 1
    data = json.loads(out)
    assert data["status"] == "failed" and "merge" not in data
    assert rev(repo, "main") == before
    assert git(repo, "tag", "-l") == "coder/g1\n"
