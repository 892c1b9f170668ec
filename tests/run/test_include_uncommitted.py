"""`coder run --include-uncommitted`: the checkout's uncommitted changes are the run's first
commit on its branch (checked with the git CLI), the checkout is left byte for byte as it was,
links are stored as links, and revert, merge and the report treat that commit as the run's."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.conftest import coder, git
from tests.helpers import fingerprint, visible_to_commands

TASK = """id: inc
title: include
graph:
  - {id: a, kind: shell, cmd: "true"}
  - {id: b, kind: shell, cmd: "echo step > step.txt"}
"""


def checkout_print(repo: Path) -> tuple[dict[str, object], str, str]:
    """The checkout's files (its .git and .coder aside), index bytes and status."""
    files = {
        k: v
        for k, v in fingerprint(repo).items()
        if k != "." and k.split("/")[0] not in (".git", ".coder")
    }
    status = git(repo, "--no-optional-locks", "status", "--porcelain", "--untracked-files=all")
    index = hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest()
    return files, index, status


def dirty_repo(make_repo, tmp_path: Path) -> Path:
    repo = make_repo(
        {"README.md": "# r\n", "app.py": "x = 1\n", "old.txt": "old\n", ".gitignore": "*.log\n"}
    )
    (repo / "tasks").mkdir()
    (repo / "tasks" / "inc.yaml").write_text(TASK)
    (repo / "app.py").write_text("x = 2\n")  # modified
    (repo / "old.txt").unlink()  # deleted
    (repo / "pkg").mkdir()
    (repo / "pkg" / "notes.txt").write_text("new\n")  # untracked
    (repo / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(repo / "tool.sh", 0o755)
    (repo / "debug.log").write_text("ignored\n")  # ignored: stays out
    (repo / ".env").write_text("TOKEN=abc123secret\n")  # protected: stays out
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the run\n")
    (repo / "out").symlink_to(outside)  # a link out of the repository: stored as a link
    (repo / "out-file").symlink_to(outside / "secret.txt")
    git(repo, "status")  # git refreshes the index's stat data once: the user's own git would
    return repo


def test_the_checkouts_changes_are_the_runs_first_commit_and_the_checkout_stays(
    make_repo, tmp_path: Path
) -> None:
    repo = dirty_repo(make_repo, tmp_path)
    before = checkout_print(repo)
    base = git(repo, "rev-parse", "main").strip()
    code, out, err = coder(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", "tasks/inc.yaml"
    )
    assert code == 0, out + err
    assert checkout_print(repo) == before  # files, index and status: untouched
    assert git(repo, "rev-parse", "main").strip() == base

    branch = "agent/inc-include"
    log = git(repo, "log", "--format=%H %s", f"{base}..{branch}").splitlines()
    assert len(log) == 2  # the checkout's commit, then step b's (a changed nothing)
    first, subject = log[-1].split(" ", 1)
    assert subject == "coder: uncommitted changes from the checkout"
    assert git(repo, "rev-parse", f"{first}^").strip() == base
    trailers = git(repo, "log", "-1", "--format=%(trailers)", first)
    assert "Coder-Task: inc" in trailers and "Coder-Checkout: uncommitted" in trailers
    assert "Coder-Step" not in trailers
    assert git(repo, "show", f"{first}:app.py") == "x = 2\n"
    assert git(repo, "show", f"{first}:pkg/notes.txt") == "new\n"
    names = git(repo, "ls-tree", "-r", "--name-only", first).split()
    assert "old.txt" not in names and "debug.log" not in names and ".env" not in names
    assert "tasks/inc.yaml" not in names  # the taskfile aside, as the left-out note has it
    tree = {
        line.split("\t")[1]: line.split()[0]
        for line in git(repo, "ls-tree", "-r", first).splitlines()
    }
    assert tree["out"] == "120000" and tree["out-file"] == "120000"
    assert tree["tool.sh"] == "100755" and tree["app.py"] == "100644"
    assert git(repo, "cat-file", "-p", f"{first}:out-file") == str(
        tmp_path / "outside" / "secret.txt"
    )
    # the steps ran on top of it
    assert (repo / ".coder" / "worktrees" / "inc" / "pkg" / "notes.txt").read_text() == "new\n"
    manifest = json.loads((repo / ".coder" / "tasks" / "inc.json").read_text())
    assert manifest["checkout_commit"] == first
    assert "first commit" in err and "left out of it: .env" in err
    # the report names it
    code, out, _ = coder(repo, "report", "-t", "inc", "--format", "json")
    report = json.loads(out)
    assert report["checkout_commit"] == first
    assert {f["path"] for f in report["checkout_files"]} >= {"app.py", "pkg/notes.txt", "old.txt"}
    code, out, _ = coder(repo, "report", "-t", "inc")
    assert f"| checkout | first commit `{first[:8]}`" in out


def test_revert_to_a_step_keeps_the_checkouts_commit(make_repo, tmp_path: Path) -> None:
    repo = dirty_repo(make_repo, tmp_path)
    code, out, err = coder(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", "tasks/inc.yaml"
    )
    assert code == 0, out + err
    first = json.loads((repo / ".coder" / "tasks" / "inc.json").read_text())["checkout_commit"]
    # step a made no commit: "right after a" is the checkout's commit, not the base
    code, out, err = coder(repo, "revert", "-t", "inc", "--to-step", "a", "--mode", "reset")
    assert code == 0, out + err
    assert git(repo, "rev-parse", "agent/inc-include").strip() == first
    assert git(repo, "show", "agent/inc-include:app.py") == "x = 2\n"


def test_the_squash_merge_includes_the_checkouts_changes(make_repo, tmp_path: Path) -> None:
    repo = dirty_repo(make_repo, tmp_path)
    code, out, err = coder(
        repo, "run", "--autonomous", "--include-uncommitted", "-f", "tasks/inc.yaml"
    )
    assert code == 0, out + err
    code, out, err = coder(repo, "merge", "-t", "inc")
    assert code == 0, out + err
    assert git(repo, "show", "main:app.py") == "x = 2\n"
    assert git(repo, "show", "main:pkg/notes.txt") == "new\n"
    assert git(repo, "show", "main:step.txt") == "step\n"
    assert "old.txt" not in git(repo, "ls-tree", "--name-only", "main").split()
    message = git(repo, "log", "-1", "--format=%B", "main")
    assert "- uncommitted changes from the checkout" in message
    # the checkout now matches main where the run's commit took the user's edits
    assert "app.py" not in git(repo, "status", "--porcelain")


def test_a_step_that_edits_a_taken_file_still_merges(make_repo) -> None:
    """The run took app.py's uncommitted edit and a step edited it further: the checkout's
    copy is the user's edit the merge carries, so the merge writes the result over it; an
    edit made after the run started is still refused, and nothing is changed."""
    repo = make_repo({"README.md": "# r\n", "app.py": "x = 1\n", "other.py": "y = 1\n"})
    (repo / "t.yaml").write_text(
        "id: edit\ntitle: edit\ngraph:\n"
        "  - {id: a, kind: shell, cmd: 'echo z = 3 >> app.py && echo y = 2 > other.py'}\n"
    )
    (repo / "app.py").write_text("x = 2\n")
    code, out, err = coder(repo, "run", "--autonomous", "--include-uncommitted", "-f", "t.yaml")
    assert code == 0, out + err
    (repo / "other.py").write_text("y = 9\n")  # the user's, after the run started
    main_before = git(repo, "rev-parse", "main").strip()
    code, out, err = coder(repo, "merge", "-t", "edit")
    assert code != 0 and "other.py" in err and "app.py" not in err, out + err
    assert git(repo, "rev-parse", "main").strip() == main_before
    assert (repo / "app.py").read_text() == "x = 2\n"
    (repo / "other.py").write_text("y = 1\n")
    code, out, err = coder(repo, "merge", "-t", "edit")
    assert code == 0, out + err
    assert git(repo, "show", "main:app.py") == "x = 2\nz = 3\n"
    assert (repo / "app.py").read_text() == "x = 2\nz = 3\n"
    assert git(repo, "status", "--porcelain", "--", "app.py", "other.py") == ""


def test_include_uncommitted_needs_the_base_checked_out(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n"})
    git(repo, "branch", "other")
    (repo / "README.md").write_text("# changed\n")
    (repo / "t.yaml").write_text(
        "id: x\ntitle: x\nbase: other\ngraph:\n  - {id: a, kind: shell, cmd: 'true'}\n"
    )
    code, out, err = coder(repo, "run", "--autonomous", "--include-uncommitted", "-f", "t.yaml")
    assert code == 2, out + err
    assert "--include-uncommitted" in err and "check out other first" in err
    assert "agent/x-x" not in git(repo, "branch")
    assert not (repo / ".coder" / "tasks" / "x.json").exists()


def test_without_changes_there_is_no_extra_commit(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n", "t.yaml": TASK})
    code, out, err = coder(repo, "run", "--autonomous", "--include-uncommitted", "-f", "t.yaml")
    assert code == 0, out + err
    assert len(git(repo, "log", "--format=%s", "main..agent/inc-include").splitlines()) == 1
    state = json.loads((repo / ".coder" / "state" / "inc.json").read_text())
    assert "checkout_commit" not in state


def test_the_left_out_note_names_the_flag(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n", "t.yaml": TASK})
    (repo / "README.md").write_text("# changed\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", "t.yaml")
    assert code == 0, out + err
    assert "run with --include-uncommitted" in err


def test_a_run_rebuilt_after_coder_dir_is_deleted_knows_its_checkout_commit(
    make_repo, tmp_path: Path
) -> None:
    """Git is the truth: with `.coder/` gone, `resume -f` finds the checkout's commit by its
    trailer, and the run finishes on top of it."""
    import shutil
    import subprocess
    import sys

    go = tmp_path / "go"
    visible_to_commands(tmp_path)
    repo = make_repo({"README.md": "# r\n", "app.py": "x = 1\n"})
    (repo / "t.yaml").write_text(
        "id: rb\ntitle: rebuild\ngraph:\n"
        '  - {id: a, kind: shell, cmd: "echo a > a.txt"}\n'
        f'  - {{id: b, kind: shell, cmd: "[ -e {go} ] && echo b > b.txt"}}\n'
    )
    (repo / "app.py").write_text("x = 2\n")
    code, out, err = coder(repo, "run", "--autonomous", "--include-uncommitted", "-f", "t.yaml")
    assert code == 1, out + err
    first = json.loads((repo / ".coder" / "tasks" / "rb.json").read_text())["checkout_commit"]
    shutil.rmtree(repo / ".coder")
    go.touch()
    resumed = subprocess.run(
        [sys.executable, "-m", "coder", "resume", "-t", "rb", "-f", "t.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    state = json.loads((repo / ".coder" / "state" / "rb.json").read_text())
    manifest = json.loads((repo / ".coder" / "tasks" / "rb.json").read_text())
    assert manifest["checkout_commit"] == first and state["status"] == "success"
    log = git(repo, "log", "--format=%s", "main..agent/rb-rebuild").splitlines()
    assert log[-1] == "coder: uncommitted changes from the checkout" and len(log) == 3
