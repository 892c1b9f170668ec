"""`coder revert`: the branch back at a step, later steps pending, `coder resume` redoing them
(RELIABILITY.md row 7), refusals that change nothing, and kill -9 inside a revert. Real
repositories, checked with the git CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coder.crashpoints import REVERT_POINTS
from coder.git import commits, repository
from coder.run.lock import TaskLock
from coder.services.revert import RevertPlan, plan_revert
from tests.conftest import coder, git
from tests.helpers import coder_cli, snapshot, state_of, taskfile

TASK = """
    id: rv
    title: Revert demo
    graph:
      - {id: s1, kind: shell, cmd: "echo one > a.txt"}
      - {id: s2, kind: shell, cmd: "echo two >> a.txt && echo b > b.txt", depends_on: [s1]}
      - {id: s3, kind: shell, cmd: "rm b.txt && echo c > c.txt", depends_on: [s2]}
      - {id: s4, kind: shell, cmd: "echo 4 >> a.txt && mkdir -p d && echo d > d/d.txt",
         depends_on: [s3]}
"""
BRANCH = "agent/rv-revert-demo"
REASON = "reverted by `coder revert --to-step s2` ({mode})"


def run_task(make_repo: Any, name: str = "repo") -> Path:
    repo = make_repo({"README.md": "# r\n"}, name=name)
    code, out, err = coder(
        repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK, f"{name}.yaml"))
    )
    assert code == 0, out + err
    return repo


@pytest.fixture
def finished(make_repo: Any) -> Path:
    return run_task(make_repo)


def rev(repo: Path, what: str) -> str:
    return git(repo, "rev-parse", what).strip()


def effective(repo: Path) -> list[tuple[str, str]]:
    """(step, tree) of each step commit that still counts, read with the git CLI: a
    `Coder-Reverts: sX` commit cancels sX's newest commit before it."""
    out = git(
        repo,
        "log",
        "--reverse",
        "--format=%H|%T|%(trailers:key=Coder-Step,valueonly,"
        "separator=)|%(trailers:key=Coder-Reverts,valueonly,separator=)",
        f"main..{BRANCH}",
    )
    found: list[tuple[str, str]] = []
    for line in out.splitlines():
        _sha, tree, step, reverts = line.split("|")
        if step:
            found.append((step, tree))
        elif reverts:
            found.remove(next(f for f in reversed(found) if f[0] == reverts))
    return found


def step_commit(repo: Path, step: str) -> str:
    return state_of(repo, "rv")["steps"][step]["commit"]


def worktree(repo: Path) -> Path:
    return repo / ".coder" / "worktrees" / "rv"


def unchanged(repo: Path) -> tuple[str, bytes, str]:
    """What a refused revert must leave as it was: the branch, the state, the worktree."""
    return (
        rev(repo, BRANCH),
        (repo / ".coder" / "state" / "rv.json").read_bytes(),
        git(worktree(repo), "status", "--porcelain"),
    )


def assert_reverted_to_s2(repo: Path, mode: str) -> None:
    assert rev(repo, f"{BRANCH}^{{tree}}") == rev(repo, f"{step_commit(repo, 's2')}^{{tree}}")
    state = state_of(repo, "rv")
    assert state["status"] == "interrupted"
    assert [state["steps"][s]["status"] for s in ("s1", "s2", "s3", "s4")] == [
        "success",
        "success",
        "pending",
        "pending",
    ]
    for step in ("s3", "s4"):
        st = state["steps"][step]
        assert st["attempts"] == 1 and st["commit"] is None
        assert st["reasons"][-1].startswith(REASON.format(mode=mode))
    assert git(worktree(repo), "status", "--porcelain") == ""
    assert rev(worktree(repo), "HEAD") == rev(repo, BRANCH)
    assert sorted(p.name for p in worktree(repo).iterdir() if p.name != ".git") == [
        "README.md",
        "a.txt",
        "b.txt",
    ]
    git(repo, "fsck", "--strict")


def assert_resume_matches(repo: Path, golden: list[tuple[str, str]]) -> None:
    code, out, err = coder(repo, "resume", "-t", "rv")
    assert code == 0, out + err
    assert effective(repo) == golden
    assert rev(repo, f"{BRANCH}^{{tree}}") == golden[-1][1]
    state = state_of(repo, "rv")
    assert state["status"] == "success"
    assert [state["steps"][s]["attempts"] for s in ("s1", "s2", "s3", "s4")] == [1, 1, 2, 2]
    attempts = git(repo, "log", "-2", "--format=%(trailers:key=Coder-Attempt,valueonly)", BRANCH)
    assert attempts.split() == ["2", "2"]
    git(repo, "fsck", "--strict")


# --- the two modes ------------------------------------------------------------------------


def test_revert_mode_adds_revert_commits_and_resume_redoes_the_rest(
    finished: Path, make_repo: Any
) -> None:
    repo = finished
    old_tip, s3, user = rev(repo, BRANCH), step_commit(repo, "s3"), snapshot(repo)
    code, out, err = coder(repo, "revert", "-t", "rv", "--to-step", "s2")
    assert code == 0, out + err
    assert out.startswith(
        f"Reverted run rv to step s2: 2 revert commit(s) on {BRANCH} (undoing s4, s3)."
    )
    assert "pending again: s3, s4; redo them with `coder resume -t rv`" in out
    assert git(repo, "log", "-2", "--format=%(trailers)", BRANCH) == (
        "Coder-Task: rv\nCoder-Reverts: s3\n\nCoder-Task: rv\nCoder-Reverts: s4\n\n"
    )
    assert rev(repo, f"{BRANCH}~2") == old_tip  # history kept
    assert git(repo, "log", "-1", "--format=%b", BRANCH).startswith(
        f"This reverts commit {s3} (step s3, attempt 1)"
    )
    assert_reverted_to_s2(repo, "revert")
    assert snapshot(repo) == user  # the user's checkout is never touched

    again = coder(repo, "revert", "-t", "rv", "--to-step", "s2")
    assert again[0] == 0 and again[1].startswith(
        f"Nothing to revert: {BRANCH} is already at step s2"
    )

    fresh = run_task(make_repo, "fresh")
    golden = effective(fresh)
    assert [s for s, _ in golden] == ["s1", "s2", "s3", "s4"]
    assert_resume_matches(repo, golden)
    assert rev(repo, f"{BRANCH}^{{tree}}") == rev(fresh, f"{BRANCH}^{{tree}}")
    repo_ = repository.open_repo(repo)
    all_steps = commits.step_commits(repo_, branch=BRANCH, base_commit="main", task_id="rv")
    assert [c.step_id for c in all_steps] == ["s1", "s2", "s3", "s4", "s3", "s4"]


def test_reset_mode_moves_the_branch_back_and_keeps_the_old_tip(finished: Path) -> None:
    repo = finished
    old_tip, golden = rev(repo, BRANCH), effective(finished)
    code, out, err = coder(
        repo, "revert", "-t", "rv", "--to-step", "s2", "--mode", "reset", "--json"
    )
    assert code == 0, out + err
    data = json.loads(out)
    assert (data["outcome"], data["previous_tip"], data["undone"], data["pending"]) == (
        "reverted",
        old_tip,
        ["s4", "s3"],
        ["s3", "s4"],
    )
    assert rev(repo, BRANCH) == step_commit(repo, "s2") == data["tip"]
    assert git(repo, "reflog", "-1", "--format=%gs", BRANCH) == "coder: revert rv to s2 (reset)\n"
    assert rev(repo, f"{BRANCH}@{{1}}") == old_tip
    reason = state_of(repo, "rv")["steps"]["s4"]["reasons"][-1]
    assert (
        reason == f"{REASON.format(mode='reset')}; the branch was at {old_tip}, kept in its reflog"
    )
    assert_reverted_to_s2(repo, "reset")
    assert_resume_matches(repo, golden)


def test_revert_to_base_undoes_every_step_and_resume_redoes_the_first(finished: Path) -> None:
    """`--to-step base`: the way to redo the first step (no step is before it)."""
    repo = finished
    code, out, err = coder(repo, "revert", "-t", "rv", "--to-step", "base", "--mode", "reset")
    assert code == 0, out + err
    assert rev(repo, BRANCH) == rev(repo, "main")
    state = state_of(repo, "rv")
    assert [state["steps"][s]["status"] for s in ("s1", "s2", "s3", "s4")] == ["pending"] * 4
    code, out, err = coder(repo, "resume", "-t", "rv")
    assert code == 0, out + err
    assert [s for s, _ in effective(repo)] == ["s1", "s2", "s3", "s4"]
    assert state_of(repo, "rv")["steps"]["s1"]["attempts"] == 2


def test_reverting_to_the_last_step_is_a_no_op(finished: Path) -> None:
    git(finished, "tag", "coder/rv", "main")  # an earlier run's merge tag: not this run's
    before = unchanged(finished)
    code, out, _ = coder(finished, "revert", "-t", "rv", "--to-step", "s4")
    assert code == 0
    assert out == (
        f"Nothing to revert: {BRANCH} is already at step s4 "
        f"({before[0][:12]}) and no later step has work to redo.\n"
    )
    assert unchanged(finished) == before
    assert state_of(finished, "rv")["status"] == "success"


def test_a_step_without_a_commit_cuts_after_the_last_commit_before_it(make_repo: Any) -> None:
    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: nc
        title: t
        graph:
          - {id: a, kind: shell, cmd: "echo a > a.txt"}
          - {id: b, kind: shell, cmd: "true", depends_on: [a]}
          - {id: c, kind: shell, cmd: "echo c > c.txt", depends_on: [b]}
    """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, out, err = coder(repo, "revert", "-t", "nc", "--to-step", "b", "--mode", "reset")
    assert code == 0, out + err
    assert rev(repo, "agent/nc-t") == state_of(repo, "nc")["steps"]["a"]["commit"]
    steps = state_of(repo, "nc")["steps"]
    assert [steps[s]["status"] for s in "abc"] == ["success", "success", "pending"]
    assert coder(repo, "resume", "-t", "nc")[0] == 0
    assert git(repo, "ls-tree", "--name-only", "agent/nc-t").split() == [
        "README.md",
        "a.txt",
        "c.txt",
    ]


def test_the_cut_follows_branch_order_when_it_differs_from_dag_order() -> None:
    def c(step: str) -> commits.StepCommit:
        return commits.StepCommit(f"sha-{step}", step, 1, "t", step)

    order = ["a", "b", "c"]  # c, independent, landed before b (a parallel level)
    landed = [c("a"), c("c"), c("b")]
    assert plan_revert(order, "c", landed, "base") == RevertPlan("sha-b", (), ())
    assert plan_revert(order, "b", landed, "base") == RevertPlan("sha-b", (), ())
    assert plan_revert(order, "a", landed, "base") == RevertPlan(
        "sha-a", (c("c"), c("b")), ("b", "c")
    )
    assert plan_revert(order, "a", [], "base") == RevertPlan("base", (), ("b", "c"))


# --- refusals change nothing ----------------------------------------------------------------


def test_unknown_task_and_step(finished: Path) -> None:
    before = unchanged(finished)
    code, _, err = coder(finished, "revert", "-t", "nope", "--to-step", "s1")
    assert code == 2 and "no task 'nope'" in err
    code, out, err = coder(finished, "revert", "-t", "rv", "--to-step", "zz", "--json")
    assert code == 2
    assert err.startswith(
        "coder: error: run rv has no step 'zz' (its steps: s1, s2, s3, s4; `base`: before"
    )
    assert json.loads(out)["exit_code"] == 2
    assert unchanged(finished) == before


def test_a_running_task_is_refused(finished: Path) -> None:
    before = unchanged(finished)
    with TaskLock(finished / ".coder", "rv"):
        code, _, err = coder(finished, "revert", "-t", "rv", "--to-step", "s1")
    assert code == 3
    assert "cannot revert run rv while it runs" in err
    assert "stop it first with `coder stop -t rv`" in err
    assert unchanged(finished) == before


def test_foreign_changes_and_commits_are_refused(finished: Path) -> None:
    wt = worktree(finished)
    (wt / "a.txt").write_text("the user's edit\n")
    (wt / "notes.txt").write_text("mine\n")
    before = unchanged(finished)
    code, _, err = coder(finished, "revert", "-t", "rv", "--to-step", "s1")
    assert code == 3
    assert f"the worktree {wt} has changes coder did not make (a.txt, notes.txt)" in err
    assert unchanged(finished) == before
    assert (wt / "a.txt").read_text() == "the user's edit\n"

    git(wt, "add", "-A")
    git(wt, "commit", "-q", "-m", "by hand")
    before = unchanged(finished)
    code, _, err = coder(finished, "revert", "-t", "rv", "--to-step", "s1")
    assert code == 3 and f"branch {BRANCH} has commits coder did not make" in err
    assert unchanged(finished) == before


@pytest.mark.parametrize("killed", [False, True], ids=["recorded", "merge-killed-before-record"])
def test_a_merged_run_is_refused(finished: Path, killed: bool) -> None:
    if killed:  # base and tag moved, the state does not know yet
        result = coder_cli(finished, "merge", "-t", "rv", crash="merge_after_ref")
        assert result.returncode == -9, result.stdout + result.stderr
    else:
        code, out, err = coder(finished, "merge", "-t", "rv")
        assert code == 0, out + err
    before = unchanged(finished)
    code, _, err = coder(finished, "revert", "-t", "rv", "--to-step", "s2")
    assert code == 2
    assert (
        f"coder: error: run rv was merged into main at {rev(finished, 'main')[:12]}; revert "
        "the merge on main instead (git revert coder/rv)"
    ) in err
    assert unchanged(finished) == before
    if not killed:
        assert state_of(finished, "rv")["merge"]["commit"] == rev(finished, "main")


CRASHES = [(point, "revert") for point in REVERT_POINTS] + [
    ("checkpoint#1", "revert"),
    ("revert_after_ref", "reset"),
]


def test_the_crash_list_covers_every_revert_point() -> None:
    assert {at for at, _ in CRASHES} >= set(REVERT_POINTS)


@pytest.mark.parametrize(("at", "mode"), CRASHES, ids=[f"{a}-{m}" for a, m in CRASHES])
def test_kill_9_inside_revert_then_a_second_revert_finishes(
    finished: Path, at: str, mode: str
) -> None:
    repo, golden, old_tip = finished, effective(finished), rev(finished, BRANCH)
    result = coder_cli(repo, "revert", "-t", "rv", "--to-step", "s2", "--mode", mode, crash=at)
    assert result.returncode == -9, result.stdout + result.stderr
    moved = at not in ("revert_before_ref",)
    assert (rev(repo, BRANCH) != old_tip) == moved  # one ref move: all of the undo or none
    assert state_of(repo, "rv")["status"] == "success"  # the state is written last

    code, out, err = coder(repo, "revert", "-t", "rv", "--to-step", "s2", "--mode", mode)
    assert code == 0, out + err
    if at == "revert_after_ref":
        assert "finished the interrupted revert: worktree" in out
    assert_reverted_to_s2(repo, mode)
    assert git(repo, "rev-list", "--count", f"{old_tip}..{BRANCH}") == (
        "2\n" if mode == "revert" else "0\n"
    )  # never a revert commit made twice
    assert_resume_matches(repo, golden)


def test_resume_finishes_a_revert_killed_before_the_files_followed(finished: Path) -> None:
    repo, golden = finished, effective(finished)
    assert coder(repo, "revert", "-t", "rv", "--to-step", "s3")[0] == 0  # run now interrupted
    result = coder_cli(repo, "revert", "-t", "rv", "--to-step", "s1", crash="revert_after_ref")
    assert result.returncode == -9, result.stdout + result.stderr
    assert git(worktree(repo), "status", "--porcelain") != ""  # files of before the revert
    code, out, err = coder(repo, "resume", "-t", "rv", "--json")
    assert code == 0, out + err
    assert effective(repo) == golden
    steps = state_of(repo, "rv")["steps"]
    assert [steps[s]["attempts"] for s in ("s1", "s2", "s3", "s4")] == [1, 2, 2, 2]
    assert "its commit is no longer on the branch (or was reverted)" in steps["s2"]["reasons"][-1]
    events = (repo / ".coder" / "logs" / "rv.jsonl").read_text()
    assert "the worktree still had files from before an interrupted `coder revert`" in events
    git(repo, "fsck", "--strict")


def test_a_run_killed_mid_step_can_be_reverted(make_repo: Any, finished: Path) -> None:
    golden = effective(finished)
    repo = make_repo({"README.md": "# r\n"}, name="killed")
    path = taskfile(repo, TASK, "killed.yaml")
    result = coder_cli(repo, "run", "--autonomous", "-f", str(path), crash="after_checks@s4")
    assert result.returncode == -9, result.stdout + result.stderr
    assert state_of(repo, "rv")["steps"]["s4"]["status"] == "running"
    assert git(worktree(repo), "status", "--porcelain") != ""  # s4's uncommitted changes
    code, out, err = coder(repo, "revert", "-t", "rv", "--to-step", "s2")
    assert code == 0, out + err
    assert "warning: discarded the partial changes of step s4" in out
    assert_reverted_to_s2(repo, "revert")
    code, out, err = coder(repo, "resume", "-t", "rv")
    assert code == 0, out + err
    assert effective(repo) == golden
