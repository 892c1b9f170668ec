"""`coder fork` and `coder compare`: a fork begins at the commit before the step's, with that
step and the later ones pending, runs with `coder resume` and merges; the parent's branch,
worktree and state are untouched (hashed before and after); status lists forks under their
parent; compare shows both. Real repositories, checked with the git CLI."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import coder, git
from tests.helpers import coder_on_terminal, manifest_of, state_of, taskfile

TASK = """
    id: rv
    title: Fork demo
    graph:
      - {id: s1, kind: shell, cmd: "echo one > a.txt"}
      - {id: s2, kind: shell, cmd: "echo two >> a.txt && echo b > b.txt", depends_on: [s1]}
      - {id: s3, kind: shell, cmd: "rm b.txt && echo c > c.txt", depends_on: [s2]}
      - {id: s4, kind: shell, cmd: "echo 4 >> a.txt", depends_on: [s3]}
"""
BRANCH = "agent/rv-fork-demo"
FORK = "rv-fork-1"
FORK_BRANCH = "agent/rv-fork-1-fork-demo"


@pytest.fixture
def finished(make_repo: Any) -> Path:
    repo = make_repo({"README.md": "# r\n"})
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    return repo


def rev(repo: Path, what: str) -> str:
    return git(repo, "rev-parse", what).strip()


def parent_fingerprint(repo: Path) -> dict[str, Any]:
    """What forking must not change of run rv: its files under .coder/ (state, journal,
    manifest, log), its branch and its worktree's HEAD and status, read with the git CLI."""
    coder_dir = repo / ".coder"
    files = [
        coder_dir / "state" / "rv.json",
        coder_dir / "state" / "rv.journal",
        coder_dir / "tasks" / "rv.json",
        coder_dir / "logs" / "rv.jsonl",
    ]
    worktree = coder_dir / "worktrees" / "rv"
    return {
        "files": {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None
            for p in files
        },
        "branch": rev(repo, f"refs/heads/{BRANCH}"),
        "head": rev(worktree, "HEAD"),
        "status": git(worktree, "status", "--porcelain", "--ignored"),
        "main": rev(repo, "main"),
    }


def trailers(repo: Path, rng: str) -> list[tuple[str, str, str, str]]:
    out = git(
        repo,
        "log",
        "--reverse",
        "--format=%T|%(trailers:key=Coder-Task,valueonly,separator=)"
        "|%(trailers:key=Coder-Step,valueonly,separator=)"
        "|%(trailers:key=Coder-Forked-From,valueonly,separator=)",
        rng,
    )
    return [tuple(line.split("|")) for line in out.splitlines()]  # type: ignore[misc]


def test_a_fork_begins_at_the_commit_before_the_step_and_the_parent_is_untouched(
    finished: Path,
) -> None:
    repo = finished
    before = parent_fingerprint(repo)
    parent = state_of(repo, "rv")
    s2, s3 = parent["steps"]["s2"]["commit"], parent["steps"]["s3"]["commit"]
    assert rev(repo, f"{s3}^") == s2

    code, out, err = coder(repo, "fork", "-t", "rv", "--at", "s3", "--note", "use c, not b")
    assert code == 2 and "no step left to run that a model works on" in err  # shell steps
    assert not (repo / ".coder" / "tasks" / f"{FORK}.json").exists()
    assert FORK_BRANCH not in git(repo, "branch", "--list")
    code, out, err = coder(repo, "fork", "-t", "rv", "--at", "s3")
    assert code == 0, out + err
    assert f"as {FORK}" in out and "pending  s3, s4" in out

    # the branch holds the parent's files right before s3: s2's commit's tree
    assert rev(repo, f"{FORK_BRANCH}^{{tree}}") == rev(repo, f"{s2}^{{tree}}")
    assert rev(repo, f"{FORK_BRANCH}~2") == rev(repo, "main")
    copies = trailers(repo, f"main..{FORK_BRANCH}")
    originals = trailers(repo, f"main..{s2}")
    assert [(t, task, step) for t, task, step, _ in copies] == [
        (tree, FORK, step) for tree, _, step, _ in originals
    ]
    assert [c[3] for c in copies] == [rev(repo, f"{s2}^"), s2]
    worktree = repo / ".coder" / "worktrees" / FORK
    assert rev(worktree, "HEAD") == rev(repo, FORK_BRANCH)
    assert git(worktree, "status", "--porcelain") == ""
    assert sorted(p.name for p in worktree.iterdir() if p.name != ".git") == [
        "README.md",
        "a.txt",
        "b.txt",
    ]

    state, manifest = state_of(repo, FORK), manifest_of(repo, FORK)
    assert manifest["parent"] == "rv"
    assert manifest["forked_at"] == {"step": "s3", "commit": s2}
    assert state["status"] == "pending" and manifest["branch"] == FORK_BRANCH
    steps = state["steps"]
    assert [steps[s]["status"] for s in ("s1", "s2", "s3", "s4")] == [
        "success",
        "success",
        "pending",
        "pending",
    ]
    assert steps["s2"]["commit"] == rev(repo, FORK_BRANCH)  # the copy, not the parent's
    assert "carried over from run rv" in steps["s2"]["reasons"][-1]
    assert steps["s3"]["commit"] is None and steps["s3"]["attempts"] == 0
    code, out, _ = coder(repo, "show", "-t", FORK)
    assert f"fork of   rv at step s3 (its commit {s2[:8]})" in out
    code, out, _ = coder(repo, "report", "-t", FORK)
    assert "| forked | from run `rv` at step `s3` |" in out
    assert parent_fingerprint(repo) == before

    # the fork is a run like any other: resume runs s3 and s4, merge lands it
    code, out, err = coder(repo, "resume", "-t", FORK)
    assert code == 0, out + err
    assert [c[2] for c in trailers(repo, f"main..{FORK_BRANCH}")] == ["s1", "s2", "s3", "s4"]
    assert rev(repo, f"{FORK_BRANCH}^{{tree}}") == rev(repo, f"{BRANCH}^{{tree}}")
    assert parent_fingerprint(repo) == before
    code, out, err = coder(repo, "merge", "-t", FORK)
    assert code == 0, out + err
    assert git(repo, "show", "main:a.txt") == "one\ntwo\n4\n"
    git(repo, "fsck", "--strict")


def test_a_fork_at_the_first_step_begins_at_the_base(finished: Path) -> None:
    before = parent_fingerprint(finished)
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s1", "--model", "other:1b")
    assert code == 0, out + err
    assert rev(finished, FORK_BRANCH) == rev(finished, "main")
    state = state_of(finished, FORK)
    assert {s["status"] for s in state["steps"].values()} == {"pending"}
    assert manifest_of(finished, FORK)["forked_at"]["commit"] == rev(finished, "main")
    manifest = json.loads((finished / ".coder" / "tasks" / f"{FORK}.json").read_text())
    assert manifest["task"]["model"] == "other:1b" and manifest["task"]["id"] == FORK
    # a second fork takes the next number
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s4", "--json")
    assert code == 0, out + err
    second = json.loads(out)
    assert second["task_id"] == "rv-fork-2" and second["done"] == ["s1", "s2", "s3"]
    # a cleaned fork whose branch was kept: its number is not taken again
    code, out, err = coder(finished, "clean", "-t", FORK, "--keep-branch")
    assert code == 0, out + err
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s2", "--json")
    assert code == 0, out + err
    assert json.loads(out)["task_id"] == "rv-fork-3"
    assert rev(finished, FORK_BRANCH) == rev(finished, "main")  # the kept branch, untouched
    assert parent_fingerprint(finished) == before


def test_a_fork_at_an_unknown_step_is_refused_creating_nothing(finished: Path) -> None:
    branches = git(finished, "branch", "--list")
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "nope")
    assert code == 2
    assert "run rv has no step 'nope'" in err and "s1, s2, s3, s4" in err
    assert "Traceback" not in err
    assert git(finished, "branch", "--list") == branches
    assert not (finished / ".coder" / "tasks" / f"{FORK}.json").exists()
    assert not (finished / ".coder" / "worktrees" / FORK).exists()


def test_status_lists_forks_under_their_parent(finished: Path) -> None:
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s2")
    assert code == 0, out + err
    other = taskfile(finished, TASK.replace("id: rv", "id: other"), "other.yaml")
    code, out, err = coder(finished, "run", "--autonomous", "-f", str(other))
    assert code == 0, out + err
    code, out, _ = coder(finished, "status")
    lines = out.splitlines()[1:]
    names = [line.split()[0] for line in lines]
    assert names == ["other", "rv", FORK]  # newest first, the fork right under its parent
    assert lines[2].startswith(f"  {FORK} ") and not lines[1].startswith(" ")
    code, out, _ = coder(finished, "status", "--json")
    rows = {row["id"]: row for row in json.loads(out)}
    assert rows[FORK]["parent"] == "rv" and rows["rv"]["parent"] is None


def test_a_fork_whose_checkpoint_was_deleted_keeps_its_parent(finished: Path) -> None:
    """The manifest holds the fork's parent and fork point: a checkpoint rebuilt from it (the
    state files deleted, `coder resume`) still knows them, and status nests the fork."""
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s3")
    assert code == 0, out + err
    forked_at = manifest_of(finished, FORK)["forked_at"]
    for name in (f"{FORK}.json", f"{FORK}.journal"):
        (finished / ".coder" / "state" / name).unlink(missing_ok=True)
    code, out, _ = coder(finished, "status", "--json")
    assert {row["id"]: row for row in json.loads(out)}[FORK]["parent"] == "rv"
    code, out, err = coder(finished, "resume", "-t", FORK)
    assert code == 0, out + err
    assert state_of(finished, FORK)["status"] == "success"
    manifest = manifest_of(finished, FORK)
    assert manifest["parent"] == "rv" and manifest["forked_at"] == forked_at
    code, out, _ = coder(finished, "status")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["rv", FORK]
    assert out.splitlines()[2].startswith(f"  {FORK} ")


def test_compare_shows_both_runs_and_the_diff_between_their_branches(finished: Path) -> None:
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s3")
    assert code == 0, out + err
    code, out, err = coder(finished, "compare", "-t", "rv", "-t", FORK)
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["STEP", "rv"] and FORK in lines[0]
    s3 = next(line for line in lines if line.startswith("s3 "))
    assert s3.split()[1] == "success" and "pending" in s3
    total = next(line for line in lines if line.startswith("total"))
    assert "success 4/4" in total and "pending 2/4" in total
    assert "fork of rv" in out
    assert "Changes from rv to rv-fork-1:" in out and "c.txt" in out and "b.txt" in out

    code, out, err = coder(finished, "compare", "-t", "rv", "-t", FORK, "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["a"]["task_id"] == "rv" and data["b"]["task_id"] == FORK
    assert data["b"]["parent"] == "rv" and data["a"]["done"] == 4 and data["b"]["done"] == 2
    assert [(r["step"], r["a"]["status"], r["b"]["status"]) for r in data["rows"]] == [
        ("s1", "success", "success"),
        ("s2", "success", "success"),
        ("s3", "success", "pending"),
        ("s4", "success", "pending"),
    ]
    assert data["identical"] is False
    assert "c.txt" in data["diff"]

    code, out, err = coder(finished, "compare", "-t", "rv", "-t", FORK, "--diff")
    assert code == 0, out + err
    assert "diff --git a/b.txt b/b.txt" in out

    code, out, err = coder(finished, "compare", "-t", "rv")
    assert code == 2 and "compare needs two runs" in err


def test_compare_diff_goes_through_the_pager_on_a_terminal(finished: Path, tmp_path: Path) -> None:
    """Through a real pseudo-terminal, as `coder diff`: the pager git would use gets the
    table and the diff, coloured."""
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s3")
    assert code == 0, out + err
    seen = tmp_path / "paged.txt"
    env = {**os.environ, "GIT_PAGER": f"cat > {seen}", "NO_COLOR": ""}
    proc = coder_on_terminal(finished, env, "compare", "-t", "rv", "-t", FORK, "--diff")
    assert proc.returncode == 0, proc.stderr
    paged = seen.read_text()
    assert paged.startswith("STEP ") and "Diff from rv to rv-fork-1:" in paged
    assert "\x1b[1mdiff --git a/b.txt b/b.txt" in paged


def test_a_fork_tries_the_step_another_way_from_the_edited_taskfile(finished: Path) -> None:
    """The taskfile still names the parent's id and branch: `resume --taskfile` of the fork
    (and of a fork of the fork) takes it for the pending steps; the parent keeps its own."""
    before = parent_fingerprint(finished)
    path = finished.parent / "task.yaml"
    path.write_text(path.read_text().replace("echo c > c.txt", "echo C > c.txt"))
    code, out, err = coder(finished, "fork", "-t", "rv", "--at", "s3")
    assert code == 0, out + err
    code, out, err = coder(finished, "resume", "-t", FORK, "--taskfile")
    assert code == 0, out + err
    assert git(finished, "show", f"{FORK_BRANCH}:c.txt") == "C\n"
    code, out, err = coder(finished, "fork", "-t", FORK, "--at", "s4")
    assert code == 0, out + err
    nested = f"{FORK}-fork-1"
    code, out, err = coder(finished, "resume", "-t", nested, "--taskfile")
    assert code == 0, out + err
    assert manifest_of(finished, nested)["parent"] == FORK
    assert git(finished, "show", f"agent/{nested}-fork-demo:c.txt") == "C\n"
    assert parent_fingerprint(finished) == before
    assert git(finished, "show", f"{BRANCH}:c.txt") == "c\n"


def test_a_fork_with_another_model_asks_that_model(fake: Any, sample: Path) -> None:
    """Real model steps against the fake Ollama: the fork's pending step goes to `--model`'s
    model, the parent's steps went to the default one, and the parent is untouched."""
    from tests.fake_ollama import DEFAULT_MODELS
    from tests.helpers import chat_requests, done

    fake.models["qwen2.5-coder:14b"] = dict(DEFAULT_MODELS["qwen2.5-coder:7b"])
    path = taskfile(
        sample,
        """
        id: m
        title: Models
        graph:
          - {id: s1, kind: analyze, goal: look}
          - {id: s2, kind: analyze, goal: look again, depends_on: [s1]}
        """,
    )
    fake.enqueue(done("first look"))
    fake.enqueue(done("second look"))
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    asked = len(chat_requests(fake))
    assert {r["model"] for r in chat_requests(fake)} == {"qwen2.5-coder:7b"}
    parent = (sample / ".coder" / "state" / "m.json").read_bytes()

    key = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"  # an OpenAI-style key
    note = f"read calc.py first, with {key}"
    code, out, err = coder(
        sample, "fork", "-t", "m", "--at", "s2", "--model", "qwen2.5-coder:14b", "--note", note
    )
    assert code == 0, out + err
    assert "note     for s2" in out
    stored = (sample / ".coder" / "state" / "m-fork-1.json").read_text()
    assert "read calc.py first" in stored and key not in stored
    fake.enqueue(done("a closer look"))
    code, out, err = coder(sample, "resume", "-t", "m-fork-1")
    assert code == 0, out + err
    later = chat_requests(fake)[asked:]
    assert later and {r["model"] for r in later} == {"qwen2.5-coder:14b"}
    sent = json.dumps(later[0]["messages"])
    assert "read calc.py first" in sent and key not in sent  # the note reached the model
    state = state_of(sample, "m-fork-1")
    [given] = state["steps"]["s2"]["notes"]
    assert given["via"] == "fork" and given["attempt"] == 1
    assert state["steps"]["s1"]["summary"] == "first look"  # carried over, not rerun
    assert state["steps"]["s2"]["summary"] == "a closer look"
    assert (sample / ".coder" / "state" / "m.json").read_bytes() == parent


def test_steps_without_a_commit_are_carried_over_when_what_they_need_is() -> None:
    """plan_fork on its own: a test step (no commit) after a kept commit is carried over; one
    after a step that is not is pending; nothing from the step on is carried."""
    from coder.git.commits import StepCommit
    from coder.services.fork import plan_fork

    order = ["e1", "t1", "e2", "t2", "e3"]
    deps = {"e1": [], "t1": ["e1"], "e2": [], "t2": ["e2"], "e3": ["t1", "t2"]}
    # parallel levels landed e2 before e1 in branch order
    commits = [StepCommit(c, s, 1, "x", s) for c, s in [("c2", "e2"), ("c1", "e1"), ("c3", "e3")]]
    done = set(order)
    plan = plan_fork(order, deps, "t2", commits, done, "base")
    assert plan.cut == "c1" and [c.step_id for c in plan.kept] == ["e2", "e1"]
    assert plan.carried == ("e1", "t1", "e2")
    plan = plan_fork(order, deps, "e2", commits, done, "base")
    assert plan.cut == "base" and plan.kept == ()
    assert plan.carried == ()  # e1's commit comes after e2's: not kept, so t1 is not either
    plan = plan_fork(order, deps, "t1", commits, done, "base")
    assert plan.carried == ()  # e2, after t1 in DAG order, committed first: nothing is kept
    in_order = [commits[1], commits[0], commits[2]]
    plan = plan_fork(order, deps, "t1", in_order, done, "base")
    assert plan.cut == "c1" and plan.carried == ("e1",)
    plan = plan_fork(order, deps, "e3", in_order, done - {"t2"}, "base")
    assert plan.carried == ("e1", "t1", "e2")  # t2 never finished: pending in the fork


def test_a_fork_of_a_run_that_took_the_checkout_keeps_its_first_commit(make_repo: Any) -> None:
    """`run --include-uncommitted`: the run's first commit holds the checkout's edits; a fork,
    even at the first step, begins on its copy (never below it), recorded as its own."""
    repo = make_repo({"README.md": "# r\n"})
    (repo / "README.md").write_text("# r, edited\n")
    path = taskfile(repo, TASK)
    code, out, err = coder(repo, "run", "--autonomous", "--include-uncommitted", "-f", str(path))
    assert code == 0, out + err
    parent = manifest_of(repo, "rv")["checkout_commit"]
    assert parent
    code, out, err = coder(repo, "fork", "-t", "rv", "--at", "s1")
    assert code == 0, out + err
    assert manifest_of(repo, FORK)["checkout_commit"] == rev(repo, FORK_BRANCH) != parent
    assert git(repo, "show", f"{FORK_BRANCH}:README.md") == "# r, edited\n"
    code, out, err = coder(repo, "resume", "-t", FORK)
    assert code == 0, out + err
    assert rev(repo, f"{FORK_BRANCH}^{{tree}}") == rev(repo, f"{BRANCH}^{{tree}}")
