"""`success.require_no_lint_errors` (only the findings a run adds count) and the diff caps
`policies.max_diff_lines` / `max_files_changed` (a step over them fails before its commit),
with real runs of shell steps and a real linter command through the sandbox."""

from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from coder.errors import EXIT_FAILED
from coder.run.steps.verify import diff_lines
from tests.conftest import coder, git
from tests.helpers import state_of, step_commits, taskfile

LINTER = textwrap.dedent(
    """\
    import sys
    for number, line in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
        if "print(" in line:
            print(f"{sys.argv[1]}:{number}:1: P001 no print in library code")
    """
)


def linted_repo(make_repo) -> Path:
    return make_repo(
        {
            "lint.py": LINTER,
            "lib.py": "def f():\n    print('already here')\n    return 1\n",
            "coder.config.json": json.dumps(
                {"lint_command": f"{Path(sys.executable).name} lint.py {{file}}"}
            ),
        }
    )


def run(repo: Path, text: str) -> tuple[int, str]:
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, text)))
    return code, out + err


def test_require_no_lint_errors_fails_a_run_that_adds_a_finding(make_repo) -> None:
    repo = linted_repo(make_repo)
    code, out = run(
        repo,
        """
        id: adds
        title: adds a print
        success: {require_no_lint_errors: true}
        graph:
          - {kind: shell, cmd: "printf 'x = 1\\nprint(x)\\n' > new.py"}
        """,
    )
    assert code == EXIT_FAILED, out
    state = state_of(repo, "adds")
    assert state["status"] == "failed"
    assert (
        "require_no_lint_errors: 1 new lint finding: new.py:2:1: P001 no print in library code"
        in (json.dumps(state) + out)
    )


def test_require_no_lint_errors_passes_a_run_that_adds_none(make_repo) -> None:
    """lib.py's print was there before the run: touching the file does not make it new."""
    repo = linted_repo(make_repo)
    code, out = run(
        repo,
        """
        id: clean
        title: adds clean code
        success: {require_no_lint_errors: true}
        graph:
          - {kind: shell, cmd: "printf 'x = 1\\n' > new.py && printf '\\ndef g():\\n    return 2\\n' >> lib.py"}
        """,
    )
    assert code == 0, out
    assert state_of(repo, "clean")["status"] == "success"


def test_require_no_lint_errors_needs_a_linter(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n"})
    code, out = run(
        repo,
        """
        id: nolinter
        title: t
        success: {require_no_lint_errors: true}
        graph:
          - {kind: shell, cmd: "echo x > x.txt"}
        """,
    )
    assert code == EXIT_FAILED
    assert "no linter is configured or detected" in json.dumps(state_of(repo, "nolinter")) + out


def test_a_step_over_the_diff_caps_fails_before_its_commit(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n"})
    code, out = run(
        repo,
        """
        id: caps
        title: too big
        policies: {max_diff_lines: 5, max_files_changed: 2}
        graph:
          - {id: s1, kind: shell, cmd: "seq 1 3 > small.txt"}
          - {id: s2, kind: shell, cmd: "seq 1 20 > big.txt"}
        """,
    )
    assert code == EXIT_FAILED, out
    state = state_of(repo, "caps")
    assert state["steps"]["s1"]["status"] == "success"
    s2 = state["steps"]["s2"]
    assert s2["status"] == "failed" and s2["commit"] is None
    assert (
        "the step changed 20 lines (+20 -0), more than policies.max_diff_lines (5)" in s2["error"]
    )
    assert [c[0] for c in step_commits(repo, "agent/caps-too-big")] == ["s1"]
    assert "big.txt" not in git(repo, "ls-tree", "-r", "--name-only", "agent/caps-too-big")

    code, out = run(
        repo,
        """
        id: files
        title: too many files
        policies: {max_files_changed: 2}
        graph:
          - {kind: shell, cmd: "touch a.txt b.txt c.txt"}
        """,
    )
    assert code == EXIT_FAILED
    error = state_of(repo, "files")["steps"]["s1"]["error"]
    assert "the step changed 3 files, more than policies.max_files_changed (2)" in error


def test_diff_parsing() -> None:
    patch = textwrap.dedent(
        """\
        diff --git a/a.sql b/a.sql
        --- a/a.sql
        +++ b/a.sql
        @@ -1,3 +1,3 @@
         select 1;
        --- a comment removed
        +++ a comment added
         select 2;
        diff --git a/n.py b/n.py
        new file mode 100644
        --- /dev/null
        +++ b/n.py
        @@ -0,0 +1,2 @@
        +a
        +b
        """
    )
    assert diff_lines(patch) == (3, 1)


def test_added_lines_come_from_gits_structured_diff(make_repo) -> None:
    """File names git quotes in patch text (`+++ "b/caf\\303\\251.py"`) are read as they
    are: parsed back from text, the quote kept them from any linter, and a lint check passed
    unchecked."""
    from coder.git import diffs

    repo = make_repo({"a.sql": "select 1;\n-- a comment\nselect 2;\n", "café.py": "x = 1\n"})
    base = git(repo, "rev-parse", "HEAD").strip()
    worktree = repo.parent / "wt"
    git(repo, "worktree", "add", "-q", str(worktree))
    (worktree / "a.sql").write_text("select 1;\n-- changed\nselect 2;\n")
    (worktree / "café.py").write_text("x = 1\ny = 2\n")
    (worktree / 'new "quoted" name.py').write_text("a\nb\n")
    (worktree / "gone.txt").write_text("")
    assert '"b/caf\\303\\251.py"' in git(worktree, "diff")  # how git's text names it
    assert diffs.added_lines(worktree, base) == {
        "a.sql": {2},
        "café.py": {2},
        'new "quoted" name.py': {1, 2},
    }


def test_merge_if_green_checks_the_lint_of_the_exact_tree(make_repo) -> None:
    repo = linted_repo(make_repo)
    config = json.loads((repo / "coder.config.json").read_text())
    (repo / "coder.config.json").write_text(json.dumps({**config, "test_command": "true"}))
    git(repo, "commit", "-qam", "tests")
    text = """
        id: {id}
        title: t
        success: {{require_no_lint_errors: true}}
        graph:
          - {{kind: shell, cmd: "printf 'x = 1\\n' > {id}.py"}}
        """
    assert run(repo, text.format(id="ok1"))[0] == 0
    code, out, err = coder(repo, "merge", "-t", "ok1", "--if-green")
    assert code == 0, out + err
    # main moves after the run and brings a print: the merge result is checked against
    # main's new tip, so that print is not the run's doing
    assert run(repo, text.format(id="ok2"))[0] == 0
    (repo / "lib.py").write_text("print('main')\n")
    git(repo, "commit", "-qam", "print on main")
    code, out, err = coder(repo, "merge", "-t", "ok2", "--if-green")
    assert code == 0, out + err
    assert "print('main')" in git(repo, "show", "main:lib.py")


def test_a_lint_step_fails_on_a_new_finding_and_passes_without(make_repo) -> None:
    repo = linted_repo(make_repo)
    code, out = run(
        repo,
        """
        id: lintstep
        title: t
        graph:
          - {id: s1, kind: shell, cmd: "printf 'x = 1\\n' > ok.py"}
          - {id: s2, kind: lint}
          - {id: s3, kind: shell, cmd: "printf 'print(2)\\n' > bad.py"}
          - {id: s4, kind: lint}
        """,
    )
    assert code == EXIT_FAILED, out
    steps = state_of(repo, "lintstep")["steps"]
    assert steps["s2"]["status"] == "success"
    assert steps["s4"]["status"] == "failed"
    assert steps["s4"]["error"] == "lint: 1 new finding: bad.py:1:1: P001 no print in library code"


def test_a_lint_step_whose_linter_exits_non_zero_unread_fails(make_repo) -> None:
    """A linter that says something coder cannot read and exits 1 found something: the exit
    status decides, and the step's error shows what it printed."""
    repo = make_repo(
        {
            "lint.py": "import sys\nprint(f'{sys.argv[1]} -- 1 problem (unused import os)')\n"
            "sys.exit(1)\n"
        }
    )
    code, out = run(
        repo,
        f"""
        id: unread
        title: t
        graph:
          - {{id: s1, kind: shell, cmd: "printf 'import os\\n' > new.py"}}
          - {{id: s2, kind: lint, cmd: "{Path(sys.executable).name} lint.py {{file}}"}}
        """,
    )
    assert code == EXIT_FAILED, out
    s2 = state_of(repo, "unread")["steps"]["s2"]
    assert s2["status"] == "failed"
    assert s2["error"] == (
        "lint: lint_command exited with 1 on new.py, and its output names no finding coder "
        "can read, so the exit status decides: new.py -- 1 problem (unused import os)"
    )


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_a_lint_step_running_ruff_with_its_default_format_sees_the_finding(make_repo) -> None:
    repo = make_repo({"pyproject.toml": "[tool.ruff]\n", "ok.py": "x = 1\n"})
    code, out = run(
        repo,
        """
        id: ruffed
        title: t
        graph:
          - {id: s1, kind: shell, cmd: "printf 'import os\\n' > new.py"}
          - {id: s2, kind: lint, cmd: "ruff check --no-cache {file}"}
        """,
    )
    assert code == EXIT_FAILED, out
    error = state_of(repo, "ruffed")["steps"]["s2"]["error"]
    assert error.startswith("lint: 1 new finding: new.py:1:8: F401 "), error


def test_a_lint_step_without_a_linter_is_refused_before_the_run(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n"})
    code, out = run(repo, "id: nolint\ntitle: t\ngraph:\n  - {kind: lint}\n")
    assert code != 0 and "no linter is configured or detected" in out
    assert not (repo / ".coder" / "state" / "nolint.json").exists()


def test_fix_and_retry_works_on_lint_findings(fake, make_repo) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers import call, chat_requests, done

    repo = linted_repo(make_repo)
    fake.enqueue(
        call("fs_edit", path="bad.py", search="print(x)\n", replace="x += 1\n"),
        done("removed the print", "bad.py"),
    )
    code, out = run(
        repo,
        """
        id: fixlint
        title: t
        graph:
          - {id: s1, kind: shell, cmd: "printf 'x = 1\\nprint(x)\\n' > bad.py"}
          - {id: s2, kind: lint, on_fail: {strategy: fix_and_retry, max_cycles: 2}}
        """,
    )
    assert code == 0, out
    message = chat_requests(fake)[0]["messages"][1]["content"]
    assert message.startswith(
        "Step s2 (lint): lint the run's changes\nThe linter reports new findings"
    )
    assert "<lint-output>\nbad.py:2:1: P001 no print in library code\n</lint-output>" in message
    # the progress line names the kind's check: a lint step's findings are not red tests
    assert re.search(r"s2 +fixing +lint red \(1 new finding\); fix cycle 1\n", out), out
    s2 = state_of(repo, "fixlint")["steps"]["s2"]
    assert s2["status"] == "success" and s2["commit"]
    assert "after 1 fix cycle" in json.dumps(s2)
    assert git(repo, "show", "agent/fixlint-t:bad.py") == "x = 1\nx += 1\n"
