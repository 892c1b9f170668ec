"""`coder init` and `coder doctor` run the test command once (coder.services.testprobe): real
projects, the real sandboxed runner; a warning with what to do when it finds no tests or
cannot run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coder import config as config_mod
from coder.policy import kernel
from coder.services import testprobe
from tests.conftest import coder, git

PYTEST_NO_TESTS = {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/test_a.py": ""}
PYTEST_GREEN = {
    "pyproject.toml": "[tool.pytest.ini_options]\n",
    "tests/test_a.py": "def test_one():\n    assert 1 + 1 == 2\n",
}


def init_json(repo: Path, *args: str) -> dict[str, object]:
    code, out, err = coder(repo, "init", "--json", *args)
    assert code == 0, out + err
    return json.loads(out)  # type: ignore[no-any-return]


def test_init_warns_when_the_test_command_finds_no_tests(make_repo) -> None:
    repo = make_repo(PYTEST_NO_TESTS)
    code, out, err = coder(repo, "init")
    assert code == 0, out + err
    assert "warning: `python -m pytest -q` found no tests" in err
    assert "a test step would fail with 'no tests ran'" in err
    assert "fix: add a test" in err
    # the probe left nothing git sees in the checkout
    assert git(repo, "status", "--porcelain") == "?? coder.config.json\n"


def test_init_says_what_the_tests_found(make_repo) -> None:
    repo = make_repo(PYTEST_GREEN)
    code, out, err = coder(repo, "init")
    assert code == 0, out + err
    assert "Tests: `python -m pytest -q`: 1 passed" in out and "warning" not in err
    tests = init_json(repo, "--force")["tests"]
    assert tests == {"outcome": "ok", "detail": "`python -m pytest -q`: 1 passed", "fix": None}


def test_unittest_finding_no_tests_suggests_pytest(make_repo) -> None:
    repo = make_repo(
        {
            "coder.config.json": '{"test_command": "python -m unittest discover -v"}\n',
            "tests/test_a.py": "def test_plain():\n    pass\n",
        }
    )
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "no_tests"
    assert "unittest finds only unittest.TestCase classes" in tests["fix"]
    assert "python -m pytest -q" in tests["fix"]


def test_a_command_that_cannot_run_is_named_with_a_fix(make_repo) -> None:
    repo = make_repo({"coder.config.json": '{"test_command": "python -m nosuchrunner"}\n'})
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "not_run"
    assert "failed to run (exit 1) before any test" in tests["detail"]
    assert "No module named nosuchrunner" in tests["detail"]
    assert tests["fix"].startswith("install the test runner")


def test_a_command_the_policy_refuses_is_not_run(make_repo) -> None:
    repo = make_repo({"coder.config.json": '{"test_command": "nosuchprogram --all"}\n'})
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "not_run"
    assert "was not run" in tests["detail"] and "allowed_commands" in tests["detail"]


def test_an_empty_repository_runs_nothing(make_repo) -> None:
    repo = make_repo({"README.md": "# empty\n"})
    assert init_json(repo)["tests"] is None  # no test command: nothing to run, init stays quick


def test_no_test_probe_skips_it(make_repo) -> None:
    repo = make_repo(PYTEST_NO_TESTS)
    assert init_json(repo, "--no-test-probe")["tests"] is None
    code, out, _ = coder(repo, "doctor", "--json", "--no-test-probe")
    assert "tests" not in {c["name"] for c in json.loads(out)["checks"]}


def test_doctor_grades_the_tests(make_repo) -> None:
    repo = make_repo(PYTEST_NO_TESTS)
    _, out, _ = coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert found["tests"]["status"] == "warn"
    assert "found no tests" in found["tests"]["detail"] and found["tests"]["fix"]
    (repo / "tests" / "test_a.py").write_text("def test_one():\n    pass\n")
    _, out, _ = coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}  # HEAD as committed, and said
    assert "found no tests" in found["tests"]["detail"]
    assert found["tests"]["detail"].endswith(
        "(HEAD as committed: your uncommitted changes were not probed)"
    )
    git(repo, "commit", "-qam", "a test")
    _, out, _ = coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert found["tests"] == {
        "name": "tests",
        "status": "ok",
        "detail": "`python -m pytest -q`: 1 passed",
        "fix": None,
    }


def test_a_command_that_does_not_end_is_stopped(make_repo, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo()
    monkeypatch.chdir(repo)
    found = testprobe.probe(repo, "sleep 30", config_mod.load(repo), timeout=0.5)
    assert found.outcome == "not_run" and "did not finish within 0.5 s" in found.detail
    assert_nothing_left(repo)


def assert_nothing_left(repo: Path) -> None:
    """No throwaway worktree, registration or scratch branch of a probe is left."""
    assert list((repo / ".coder" / "worktrees").iterdir()) == []
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not (repo / ".git" / "worktrees").exists() or not any(
        (repo / ".git" / "worktrees").iterdir()
    )
    assert "coder-scratch" not in git(repo, "branch", "--list", "--all")


def test_a_probe_cut_short_is_removed_by_the_next(make_repo) -> None:
    """A probe killed mid-way (its process gone) leaves its worktree; the next one removes it,
    and leaves a running probe's alone."""
    repo = make_repo(PYTEST_GREEN)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getppid()):  # gone; alive
        name = f"test.probe-{pid}"
        git(repo, "worktree", "add", "-q", "--detach", str(repo / ".coder" / "worktrees" / name))
    found = testprobe.probe(repo, "python -m pytest -q", config_mod.load(repo))
    assert found.outcome == "ok", found
    assert sorted(p.name for p in (repo / ".coder" / "worktrees").iterdir()) == [
        f"test.probe-{os.getppid()}"
    ]


def test_red_tests_are_reported_as_running(make_repo) -> None:
    repo = make_repo({"tests/test_a.py": "def test_one():\n    assert False\n"})
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "failing"
    assert "1 failed" in tests["detail"]


# --- the probe runs like a step (RELIABILITY.md row 30) ------------------------------------

# A hostile test command, committed in the repository: from wherever it runs, it points every
# worktree's HEAD at main and its commondir at a repository whose config runs a program (the
# trap, made by the test), gives each a config.worktree that runs one too, writes a hook and
# the repository's config; each write as git makes it (a new file renamed over the old), then
# in place.
HOSTILE = """\
import glob, os, subprocess
def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
own = git("rev-parse", "--path-format=absolute", "--git-dir")
common = git("rev-parse", "--path-format=absolute", "--git-common-dir")
trap = {trap!r}
run = "[core]\\n\\tfsmonitor = touch {mark}\\n"
def write(path, text):
    for how in ("rename", "in place"):
        try:
            if how == "rename":
                open(path + ".lock", "w").write(text)
                os.replace(path + ".lock", path)
            else:
                open(path, "a").write(text)
        except OSError as exc:
            print("refused:", path, how, exc)
for admin in {{own, common, *glob.glob(common + "/worktrees/*")}}:
    write(admin + "/HEAD", "ref: refs/heads/main\\n")
    write(admin + "/commondir", trap + "\\n")
    write(admin + "/config.worktree", run)
write(common + "/hooks/pre-commit", "#!/bin/sh\\ntouch {mark}\\n")
write(common + "/config", run)
"""


def git_files(common: Path, admin: Path) -> dict[str, object]:
    """What the user's git reads and a probe must not change: their checkout's admin files
    (the main checkout's are the git dir's), the repository's config, HEAD and hooks, every
    ref and the registered worktrees."""
    names = ("HEAD", "commondir", "gitdir", "config.worktree")
    hooks = common / "hooks"
    return {
        "admin": {n: (admin / n).read_bytes() for n in names if os.path.lexists(admin / n)},
        "config": (common / "config").read_bytes(),
        "HEAD": (common / "HEAD").read_bytes(),
        "hooks": {p.name: p.read_bytes() for p in sorted(hooks.iterdir())},
        "refs": git(common, "for-each-ref", "--format=%(refname) %(objectname)"),
        "worktrees": git(common, "worktree", "list", "--porcelain"),
        "pruned": sorted(p.name for p in (common / "worktrees").glob("*")),
    }


@pytest.mark.skipif(not kernel.support().available, reason="no kernel sandbox here")
@pytest.mark.parametrize("where", ["main checkout", "linked worktree"])
@pytest.mark.parametrize("who", ["root", "no CAP_SYS_ADMIN"])
def test_a_hostile_probe_changes_nothing_of_the_users_git(
    make_repo, tmp_path: Path, where: str, who: str
) -> None:
    """`coder init` and `coder doctor`, as subprocesses, with a test command that rewrites what
    git reads (above). Judged on disk and by the user's own `git status` afterwards: same
    branch, nothing run. Without CAP_SYS_ADMIN (a non-root user's walls: Landlock alone, no
    read-only mounts) the checkout's .git is not writable to the probe either."""
    if who != "root" and (os.geteuid() != 0 or not shutil.which("setpriv")):
        pytest.skip("simulating a runner without CAP_SYS_ADMIN needs root and setpriv")
    mark, trap = tmp_path / "PWNED", tmp_path / "trap"
    git(tmp_path, "init", "-q", "--bare", str(trap))  # the repository a commondir would name
    (trap / "config").write_text(f"[core]\n\tbare = false\n\tfsmonitor = touch {mark}\n")
    hostile = HOSTILE.format(trap=str(trap), mark=str(mark))
    repo = make_repo(
        {"probe.py": hostile, "coder.config.json": '{"test_command": "python probe.py"}\n'}
    )
    git(repo, "config", "extensions.worktreeConfig", "true")  # config.worktree is read
    common = repo / ".git"
    checkout, admin = repo, common
    if where == "linked worktree":
        checkout, admin = tmp_path / "feature", common / "worktrees" / "feature"
        git(repo, "worktree", "add", "-q", "-b", "feature", str(checkout))
    before = git_files(common, admin)
    branch = git(checkout, "symbolic-ref", "HEAD")
    prefix = (
        [] if who == "root" else ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
    )
    for command in (["init"], ["doctor"]):
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "coder", *command],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        said = done.stdout + done.stderr  # it ran: writes refused, or put back by the guard
        assert "refused:" in said or "(put back): a test step running it fails" in said, said
        assert git_files(common, admin) == before, command
    status = git(checkout, "status", "--porcelain")  # the user's own, with their git
    assert git(checkout, "symbolic-ref", "HEAD") == branch
    assert status in ("", "?? coder.config.json\n")
    assert not mark.exists()
    assert not list((repo / ".coder" / "worktrees").iterdir())
    assert "coder-scratch" not in git(repo, "branch", "--list", "--all")
