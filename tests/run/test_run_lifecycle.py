"""`coder run` end to end on real repositories, checked with the git CLI: one commit per
changing step with trailers, the user's checkout untouched, strategies, checks, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from coder.schemas import validator
from tests.conftest import coder, git
from tests.fake_ollama import down_url
from tests.helpers import ROOT, snapshot, state_of, step_commits, taskfile, visible_to_commands

SEQUENCE = """
    id: seq
    title: Sequence of changes
    graph:
      - {id: create, kind: shell, cmd: "echo new > new.txt"}
      - {id: modify, kind: shell, cmd: "echo more >> README.md", depends_on: [create]}
      - {id: noop, kind: shell, cmd: "true", depends_on: [modify]}
      - {id: delete, kind: shell, cmd: "rm old.txt", depends_on: [noop]}
      - {id: ignored, kind: shell, cmd: "mkdir -p build && echo bin > build/out.bin",
         depends_on: [delete]}
"""


def test_one_commit_per_changing_step_with_trailers(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n", "old.txt": "bye\n", ".gitignore": "build/\n"})
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SEQUENCE)))
    assert code == 0, out + err
    assert "Run seq: success" in out
    branch = "agent/seq-sequence-of-changes"
    assert step_commits(repo, branch) == [
        ("create", "1", "create: run `echo new > new.txt`"),
        ("modify", "1", "modify: run `echo more >> README.md`"),
        ("delete", "1", "delete: run `rm old.txt`"),
    ]
    trailers = git(repo, "log", "-1", "--format=%(trailers)", branch)
    assert trailers == "Coder-Task: seq\nCoder-Step: delete\nCoder-Attempt: 1\n\n"
    assert git(repo, "ls-tree", "-r", "--name-only", branch).split() == [
        ".gitignore",
        "README.md",
        "new.txt",
    ]
    git(repo, "fsck", "--strict")
    worktree = repo / ".coder" / "worktrees" / "seq"
    assert f"{worktree}  " in git(repo, "worktree", "list") or str(worktree) in git(
        repo, "worktree", "list"
    )
    assert (worktree / "build" / "out.bin").exists()  # ignored output stays, uncommitted
    state = state_of(repo, "seq")
    assert state["status"] == "success"
    assert [s["status"] for s in state["steps"].values()] == ["success"] * 5
    assert state["steps"]["noop"]["commit"] is None
    assert state["steps"]["noop"]["reasons"] == []
    diff = (repo / ".coder" / "artifacts" / "seq" / "modify.diff").read_text()
    assert "+more" in diff
    for line in (repo / ".coder" / "logs" / "seq.jsonl").read_text().splitlines():
        assert list(validator("log").iter_errors(json.loads(line))) == []


def test_the_users_checkout_is_never_touched(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n", "old.txt": "bye\n"})
    (repo / "README.md").write_text("# r\nmy unsaved edit\n")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "old.txt").write_text("staged change\n")
    git(repo, "add", "old.txt")
    before = snapshot(repo)
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SEQUENCE)))
    assert code == 0, out + err
    assert snapshot(repo) == before
    # the run started from the committed main, not from the dirty files
    assert git(repo, "show", "agent/seq-sequence-of-changes:README.md") == "# r\nmore\n"


def test_coder_dir_is_never_committed_and_user_gitignore_untouched(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n", ".gitignore": "*.log\n"})
    path = taskfile(
        repo,
        """
        id: t1
        title: t
        graph:
          - {kind: shell, cmd: "mkdir -p .coder && echo x > .coder/sneaky && echo y > a.txt"}
    """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert git(repo, "ls-tree", "-r", "--name-only", "agent/t1-t").split() == [
        ".gitignore",
        "README.md",
        "a.txt",
    ]
    assert (repo / ".gitignore").read_text() == "*.log\n"


def test_retries_then_success_records_the_reason(make_repo) -> None:
    repo = make_repo()
    # Attempts are counted where the step may write and a retry does not reset: its worktree's
    # git admin dir (anything outside the worktree is read-only to the sandboxed command).
    counter = "$(git rev-parse --git-dir)/count"
    path = taskfile(
        repo,
        f"""
        id: flaky
        title: flaky step
        graph:
          - kind: shell
            retries: 2
            cmd: echo x >> "{counter}"; echo partial > partial.txt; test $(wc -l < "{counter}") -ge 2
    """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    step = state_of(repo, "flaky")["steps"]["s1"]
    assert step["attempts"] == 2
    assert step["reasons"][0].startswith("attempt 1 failed: `echo x >>")
    assert "retrying (1 of 2 retries)" in step["reasons"][0]
    assert step_commits(repo, "agent/flaky-flaky-step")[0][:2] == ("s1", "2")


def test_revert_and_stop_discards_the_failed_step(make_repo) -> None:
    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: stop
        title: stops
        graph:
          - {kind: shell, cmd: "echo one > one.txt"}
          - {kind: shell, cmd: "echo half > half.txt && echo oops >&2 && exit 3"}
          - {kind: shell, cmd: "echo never > never.txt"}
    """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1
    state = state_of(repo, "stop")
    assert [s["status"] for s in state["steps"].values()] == ["success", "failed", "pending"]
    assert (
        state["steps"]["s2"]["error"] == "`echo half > half.txt && echo oops >&2 && exit 3`"
        " exited with 3; output ends: oops"
    )
    assert state["error"].startswith("step s2 failed: ")
    worktree = repo / ".coder" / "worktrees" / "stop"
    assert not (worktree / "half.txt").exists() and not (worktree / "never.txt").exists()
    assert [c[0] for c in step_commits(repo, "agent/stop-stops")] == ["s1"]
    assert "continue with `coder resume -t stop`" in out


def test_skip_strategy_skips_dependents_and_the_rest_goes_on(tmp_path: Path, make_repo) -> None:
    repo = make_repo()
    code, out, err = coder(
        repo, "run", "--autonomous", "-f", str(ROOT / "tasks" / "parallel-levels.yaml")
    )
    assert code == 0, out + err
    steps = state_of(repo, "parallel-demo")["steps"]
    assert steps["optional"]["status"] == "skipped"
    assert steps["optional"]["reasons"][-1].startswith(
        "skipped after failing: `false` exited with 1"
    )
    assert steps["after-optional"]["status"] == "skipped"
    assert steps["after-optional"]["reasons"] == ["skipped: depends on skipped step optional"]
    assert steps["index"]["status"] == "success"


def test_fail_fast_stops_even_a_skip_step(make_repo) -> None:
    repo = make_repo()
    code, _, _ = coder(
        repo,
        "run",
        "--autonomous",
        "--fail-fast",
        "-f",
        str(ROOT / "tasks" / "parallel-levels.yaml"),
    )
    assert code == 1
    assert state_of(repo, "parallel-demo")["steps"]["optional"]["status"] == "failed"


def test_parallel_levels_land_in_file_order_with_the_same_result(make_repo) -> None:
    sequential, parallel = make_repo(name="seq"), make_repo(name="par")
    task = ROOT / "tasks" / "parallel-levels.yaml"
    for repo, width in ((sequential, "1"), (parallel, "3")):
        code, out, err = coder(
            repo, "run", "--autonomous", "--max-parallel", width, "-f", str(task)
        )
        assert code == 0, out + err  # (seen once under load: exit 3, the message not kept)
    branch = "agent/parallel-demo-generate-docs-and-data-in-parallel"
    assert [c[0] for c in step_commits(parallel, branch)] == ["setup", "docs", "data", "index"]
    assert step_commits(parallel, branch) == step_commits(sequential, branch)
    assert git(parallel, "rev-parse", f"{branch}^{{tree}}") == git(
        sequential, "rev-parse", f"{branch}^{{tree}}"
    )
    assert "parallel-demo--" not in git(parallel, "worktree", "list")  # scratch worktrees gone
    git(parallel, "fsck", "--strict")
    # each step's diff artifact is its landed commit's diff (made from the change set verify
    # staged when the commit landed as made, from the two trees when it was cherry-picked)
    from coder.git import diffs, repository

    for repo in (sequential, parallel):
        r = repository.open_repo(repo)
        for step, _attempt, _title in step_commits(repo, branch):
            commit = git(repo, "log", "-1", "--format=%H", f"--grep=Coder-Step: {step}$", branch)
            commit = commit.strip()
            artifact = repo / ".coder" / "artifacts" / "parallel-demo" / f"{step}.diff"
            assert artifact.read_text() == diffs.step_patch(r, f"{commit}^", commit), step
            assert "diff --git" in artifact.read_text()


def test_asserts_fail_the_step(make_repo) -> None:
    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: asserts
        title: t
        graph:
          - kind: shell
            cmd: echo hello > a.txt
            assert:
              - {type: file_exists, path: a.txt}
              - {type: text_in_file, path: a.txt, contains: goodbye}
              - {type: file_not_exists, path: README.md}
    """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    assert state_of(repo, "asserts")["steps"]["s1"]["error"] == (
        "assert text_in_file a.txt: 'goodbye' not found; "
        "assert file_not_exists README.md: the file exists"
    )


def test_success_criteria(make_repo) -> None:
    repo = make_repo(
        {
            "README.md": "# r\n",
            "tests/conftest.py": "",
            "tests/test_x.py": "def test_x():\n    assert False\n",
        }
    )
    path = taskfile(
        repo,
        """
        id: crit
        title: t
        success:
          required_files: [docs/guide.md]
          require_green_tests: true
        graph:
          - {kind: shell, cmd: "echo x > a.txt"}
    """,
    )
    code, out, _ = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1
    error = state_of(repo, "crit")["error"]
    assert error == (
        "required file docs/guide.md is missing; require_green_tests: "
        "`python -m pytest -q` exited with 1"
    )


def test_test_step_counts_and_log_artifact(make_repo) -> None:
    repo = make_repo({"tests/test_x.py": "def test_a():\n    pass\n\ndef test_b():\n    pass\n"})
    path = taskfile(repo, "id: tt\ntitle: t\ngraph:\n  - {kind: test, framework: pytest}\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    step = state_of(repo, "tt")["steps"]["s1"]
    assert step["tests"] == {"passed": 2, "failed": 0, "skipped": 0, "exit_code": 0}
    log = (repo / ".coder" / "artifacts" / "tt" / "s1-attempt1.log").read_text()
    assert log.startswith("$ python -m pytest -q --junitxml=") and "2 passed" in log


def test_a_step_that_edits_git_config_or_hooks_fails_and_is_undone(make_repo) -> None:
    repo = make_repo()
    config_before = (repo / ".git" / "config").read_bytes()
    path = taskfile(
        repo,
        """
        id: hook
        title: t
        graph:
          - {kind: shell, cmd: "echo 'exit 0' > ../../../.git/hooks/post-commit && echo y > y.txt"}
    """,
    )
    # The kernel sandbox refuses the write itself; without it the guard is the second line.
    assert coder(repo, "run", "--autonomous", "-f", str(path), "--no-sandbox")[0] == 1
    error = state_of(repo, "hook")["steps"]["s1"]["error"]
    assert error == (
        "the step changed .git/hooks/post-commit; .git belongs to coder's executor "
        "(the original was restored)"
    )
    assert not (repo / ".git" / "hooks" / "post-commit").exists()
    assert (repo / ".git" / "config").read_bytes() == config_before


def test_secrets_in_command_output_never_reach_state_or_logs(make_repo) -> None:
    repo = make_repo()
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    path = taskfile(
        repo,
        f"""
        id: leak
        title: t
        graph:
          - {{kind: shell, cmd: "echo token={secret} && exit 1"}}
    """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    for file in (repo / ".coder").rglob("*"):
        if file.is_file() and file.suffix in (".json", ".jsonl", ".log"):
            if file.parent.name == "tasks":
                continue  # the manifest holds the taskfile itself, as the user wrote it
            text = file.read_text()
            assert secret not in text, file


def test_json_output(make_repo) -> None:
    repo = make_repo()
    path = taskfile(repo, "id: js\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'echo a > a'}\n")
    code, out, _ = coder(repo, "run", "--autonomous", "--json", "-f", str(path))
    assert code == 0
    data = json.loads(out)
    assert data["status"] == "success" and data["branch"] == "agent/js-t"
    assert data["steps"]["s1"]["status"] == "success" and len(data["steps"]["s1"]["commit"]) == 40


# --- bad input: a clear message, the right exit code, nothing created ----------------------


def nothing_created(repo: Path) -> bool:
    branches = git(repo, "branch", "--format=%(refname:short)").split()
    tasks = list((repo / ".coder" / "tasks").glob("*")) if (repo / ".coder").exists() else []
    return branches == ["main"] and not tasks


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        ("docker ps", "`docker` is not in allowed_commands"),
        ("echo hi; curl http://example.com", "`curl` is a network program"),
        ("echo $(wget -qO- x)", "`wget` is a network program"),
        ("bash -c 'nc -l 80'", "`nc` is a network program"),
        ("echo `ssh host`", "`ssh` is a network program"),
    ],
)
def test_commands_outside_the_policy_are_refused_before_anything_happens(
    make_repo, cmd: str, message: str
) -> None:
    repo = make_repo()
    path = taskfile(repo, f"title: t\ngraph:\n  - {{kind: shell, cmd: {json.dumps(cmd)}}}\n")
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 2
    assert err.startswith("coder: error: step s1: command refused: ") and message in err
    assert nothing_created(repo)


def test_a_hung_command_with_background_children_is_killed(make_repo) -> None:
    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: hung
        title: t
        graph:
          - {kind: shell, timeout: 1, cmd: "sleep 1000.51 & sleep 1000.52"}
    """,
    )
    code, _, _ = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1
    assert "timed out" in state_of(repo, "hung")["steps"]["s1"]["error"]
    survivors = subprocess.run(["pgrep", "-f", "sleep 1000.5"], capture_output=True, text=True)
    assert survivors.stdout == ""


def test_invalid_taskfile_model_steps_and_missing_autonomous(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo()
    bad = taskfile(repo, "title: t\ngraph:\n  - {kind: shel}\n")
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(bad))
    assert code == 2 and "'shel' is not one of" in err
    model = taskfile(repo, "title: t\ngraph:\n  - {kind: edit, goal: g}\n", "m.yaml")
    monkeypatch.setenv("OLLAMA_HOST", down_url())
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(model))
    assert code == 3 and "cannot reach Ollama at " in err
    code, _, err = coder(repo, "run", "-f", str(model))
    assert code == 2 and "pass --autonomous" in err
    assert nothing_created(repo)


def test_a_second_run_of_the_same_task_id_is_refused(make_repo) -> None:
    repo = make_repo()
    path = taskfile(repo, "id: twice\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'echo a > a'}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    tip = git(repo, "rev-parse", "agent/twice-t")
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 2 and "a run of task twice already exists" in err
    assert git(repo, "rev-parse", "agent/twice-t") == tip


def test_resume_of_unknown_or_finished_runs(make_repo) -> None:
    repo = make_repo()
    code, _, err = coder(repo, "resume", "-t", "nope")
    assert code == 2 and "nope" in err
    path = taskfile(repo, "id: done\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'echo a > a'}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    before = (repo / ".coder" / "state" / "done.json").read_bytes()
    code, _, err = coder(repo, "resume", "-t", "done")
    assert code == 2 and "run done already finished successfully; nothing to resume" in err
    assert "merge it with `coder merge -t done`" in err
    assert (repo / ".coder" / "state" / "done.json").read_bytes() == before
    assert coder(repo, "merge", "-t", "done")[0] == 0
    code, _, err = coder(repo, "resume", "-t", "done")
    assert code == 2 and err.splitlines() == [
        "coder: error: run done already finished successfully and was merged into main; "
        "nothing to resume",
        "  hint: see `coder show -t done`; remove it with `coder clean -t done`",
    ]


def test_resume_after_a_failure_retries_the_failed_step(make_repo, tmp_path: Path) -> None:
    repo = make_repo()
    flag = tmp_path / "fixed"
    visible_to_commands(tmp_path)
    path = taskfile(
        repo,
        f"""
        id: again
        title: t
        graph:
          - {{kind: shell, cmd: "echo a > a.txt"}}
          - {{kind: shell, cmd: "test -f {flag} && echo b > b.txt"}}
    """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    flag.write_text("the user fixed the environment")
    code, out, err = coder(repo, "resume", "-t", "again")
    assert code == 0, out + err
    state = state_of(repo, "again")
    assert state["steps"]["s1"]["attempts"] == 1  # never rerun
    assert state["steps"]["s2"]["reasons"][0] == "failed in the previous run; retried on resume"
    assert [c[0] for c in step_commits(repo, "agent/again-t")] == ["s1", "s2"]


def test_status_lists_runs(make_repo) -> None:
    repo = make_repo()
    assert "No runs yet" in coder(repo, "status")[1]
    path = taskfile(repo, "id: st\ntitle: Status demo\ngraph:\n  - {kind: shell, cmd: 'true'}\n")
    coder(repo, "run", "--autonomous", "-f", str(path))
    code, out, _ = coder(repo, "status", "--json")
    [row] = json.loads(out)
    assert (row["id"], row["status"], row["progress"], row["title"]) == (
        "st",
        "success",
        "1/1",
        "Status demo",
    )


def test_status_tells_merged_and_pushed_runs_from_waiting_ones(make_repo, tmp_path) -> None:
    """The table says what became of a run; `--json` keeps the status a status and says it
    in fields of their own."""
    repo = make_repo()
    git(tmp_path, "init", "-q", "--bare", "remote.git")
    git(repo, "remote", "add", "origin", str(tmp_path / "remote.git"))
    for task_id in ("waits", "pushes", "lands"):
        path = taskfile(
            repo,
            f"id: {task_id}\ntitle: t\ngraph:\n  - {{kind: shell, cmd: 'echo {task_id} > {task_id}.txt'}}\n",
            f"{task_id}.yaml",
        )
        assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    assert coder(repo, "push", "-t", "pushes", "-o", str(tmp_path / "pr.md"))[0] == 0
    assert coder(repo, "merge", "-t", "lands")[0] == 0
    code, out, _ = coder(repo, "status")
    shown = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert shown == {"waits": "success", "pushes": "success,", "lands": "merged"}
    assert "pushes  success, pushed" in out
    rows = {row["id"]: row for row in json.loads(coder(repo, "status", "--json")[1])}
    assert {row["status"] for row in rows.values()} == {"success"}
    assert rows["lands"]["merged"] == git(repo, "rev-parse", "main").strip()
    assert rows["pushes"]["pushed"] == "origin/agent/pushes-t" and rows["waits"]["pushed"] is None
    assert not any(row["runner_gone"] for row in rows.values())


def test_a_long_command_validates_and_runs_and_a_too_long_one_is_refused(make_repo) -> None:
    repo = make_repo()
    body = "\n".join(f"row {i}" for i in range(25_000))  # ~200 KB
    cmd = f"cat > data.txt <<'EOF'\n{body}\nEOF"
    task = taskfile(repo, "id: big\ntitle: t\ngraph:\n  - kind: shell\n    cmd: " + json.dumps(cmd))
    code, out, _ = coder(repo, "validate", "-f", str(task))
    assert code == 0, out[:500]
    code, out, _ = coder(repo, "run", "--dry-run", "-f", str(task))  # shown, not whole
    assert code == 0 and len(out) < 5_000 and "the whole command is in the taskfile" in out
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(task))
    assert code == 0, (out + err)[-2000:]
    assert git(repo, "show", "agent/big-t:data.txt") == body + "\n"
    assert len(out) + len(err) < 5_000  # the command is not echoed whole
    # nor kept whole in the step's commit message
    message = git(repo, "log", "-1", "--format=%B", "agent/big-t")
    assert len(message) < 2_500
    assert "Command: cat > data.txt <<'EOF'\nrow 0\n" in message
    assert f"more characters of {len(cmd):,}; the whole command is in the taskfile)" in message
    task.write_text("title: t\ngraph:\n  - kind: shell\n    cmd: " + json.dumps("x" * 300_000))
    code, out, _ = coder(repo, "validate", "-f", str(task))
    assert code == 2
    assert "is too long (300,000 characters; at most 262,144 allowed)" in out
    assert len(out) < 500
