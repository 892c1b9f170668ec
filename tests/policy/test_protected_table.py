"""The protected paths are one table (coder.policy.paths.PROTECTED), which docs/safety.md lists;
symlinks count by where they point, resolved inside the worktree only. The variables a step's
`env:` cannot set are one list (coder.policy.env), which it lists too."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from coder.policy import env as env_mod
from coder.policy.commands import Policy
from coder.policy.paths import PROTECTED, is_protected, protected_changes, resolve_inside
from tests.helpers import ROOT

SAFETY = (ROOT / "docs" / "safety.md").read_text()
POLICY = Policy()


def example(pattern: str) -> str:
    """A concrete path a pattern protects (a file below it, for a directory)."""
    name = pattern.strip("/").replace("*", "x")
    return f"{name}/inner.yml" if pattern.endswith("/") else name


def examples() -> list[str]:
    return [example(pattern) for pattern, _ in PROTECTED]


def test_the_safety_page_lists_the_table() -> None:
    start = SAFETY.index("  - coder's permissions: ")
    listed = SAFETY[start : SAFETY.index("and your `protected_paths` globs", start)]
    assert set(re.findall(r"`([^`]+)`", listed)) == {pattern for pattern, _ in PROTECTED}


def test_the_safety_page_lists_the_variables() -> None:
    start = SAFETY.index("variable that makes the shell, the loader, git or a runtime run code")
    listed = SAFETY[start : SAFETY.index("(`coder validate`", start)]
    names = set(re.findall(r"`([^`]+)`", listed))
    assert names == set(env_mod._RUNS_CODE) | {f"{p}*" for p in env_mod._RUNS_CODE_PREFIXES}


@pytest.mark.parametrize("rel", examples())
def test_every_row_protects_its_path_anywhere_and_in_any_case(rel: str) -> None:
    assert is_protected(rel, POLICY), rel
    assert is_protected(rel.upper(), POLICY), rel
    if rel != "coder.config.json":  # anchored at the root
        assert is_protected(f"sub/dir/{rel}", POLICY), rel
    named = Policy(named_paths=frozenset({rel}))
    assert is_protected(rel, named) is None  # the step's `changes` names it


@pytest.mark.parametrize(
    "rel",
    [
        "src/app.py",
        "sub/coder.config.json",
        ".envrc.example.md",
        "docs/github/workflows.md",
        "vscode/settings.json",
        "claude.md",
        "Makefile",
        "package.json",
    ],
)
def test_near_misses_are_not_protected(rel: str) -> None:
    assert is_protected(rel, POLICY) is None


def test_git_and_coder_stay_protected_when_named() -> None:
    named = Policy(named_paths=frozenset({".git/config", ".coder/x"}))
    assert is_protected(".git/config", named) == ".git belongs to coder's executor"
    assert is_protected(".coder/x", named) == ".coder holds coder's own state"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "wt"
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / "ci" / "workflows").mkdir(parents=True)
    (root / "src").mkdir()
    (tmp_path / "outside").mkdir()
    return root


def test_resolve_inside_never_leaves_the_root(tree: Path) -> None:
    os.symlink(".github", tree / "gh")
    os.symlink(str(tree / ".github"), tree / "abs")
    os.symlink("../outside", tree / "out")
    os.symlink("/etc", tree / "etc")
    os.symlink("loop2", tree / "loop1")
    os.symlink("loop1", tree / "loop2")
    assert resolve_inside(tree, "gh/workflows/x.yml") == ".github/workflows/x.yml"
    assert resolve_inside(tree, "abs") == ".github"
    assert resolve_inside(tree, "src/../ci") == "ci"
    for rel in ("out", "out/x", "etc/passwd", "..", "loop1", "src/../../x"):
        assert resolve_inside(tree, rel) is None, rel


def test_a_link_to_a_protected_path_is_protected(tree: Path) -> None:
    os.symlink(".github", tree / "ci-link")
    os.symlink(".git/config", tree / "x")
    os.symlink("src", tree / "fine")
    os.symlink("../outside", tree / "out")
    problems = protected_changes(["ci-link", "x", "fine", "out"], POLICY, tree)
    assert len(problems) == 2
    assert problems[0].startswith(
        "the step changed protected path ci-link (a symlink to .github: it runs on your CI"
    )
    assert "Name ci-link and .github in the step's `changes`" in problems[0]
    assert problems[1].startswith("the step changed protected path x (a symlink to .git/config")
    named = Policy(named_paths=frozenset({"ci-link", ".github"}))
    assert protected_changes(["ci-link"], named, tree) == []


def test_a_path_a_link_names_as_protected_is_protected(tree: Path) -> None:
    """With `.github -> ci` in the tree, ci/workflows/x.yml is what GitHub reads."""
    (tree / ".github" / "workflows").rmdir()
    (tree / ".github").rmdir()
    os.symlink("ci", tree / ".github")
    os.symlink(".", tree / "root-link")
    problems = protected_changes(["ci/workflows/x.yml", "src/a.py"], POLICY, tree, [".github"])
    assert problems == [
        "the step changed protected path ci/workflows/x.yml (the symlink .github makes it "
        ".github/workflows/x.yml: it runs on your CI, outside coder's sandbox (matches "
        ".github/)); nothing was committed. Name ci/workflows/x.yml and "
        ".github/workflows/x.yml in the step's `changes` if the step is meant to change it"
    ]
    # a link to the root names every path again: `.github -> .` makes workflows/ a workflow
    (tree / ".github").unlink()
    os.symlink(".", tree / ".github")
    (tree / "workflows").mkdir()
    assert protected_changes(["workflows/y.yml"], POLICY, tree, [".github"])


def test_a_command_never_gets_a_step_env_that_runs_code(tmp_path: Path) -> None:
    """The last wall, for a run whose manifest predates the validate check (resume does not
    validate again): the command is refused before bash starts. Bash itself would run it."""
    import subprocess

    from coder.errors import PolicyViolation
    from coder.policy.sandbox import run_command

    (tmp_path / "evil.sh").write_text("echo ran > pwned\n")
    subprocess.run(["bash", "-c", "true"], cwd=tmp_path, env={"BASH_ENV": "./evil.sh"})
    assert (tmp_path / "pwned").read_text() == "ran\n"  # what BASH_ENV does
    (tmp_path / "pwned").unlink()
    policy = Policy(sandbox=False)
    with pytest.raises(PolicyViolation, match="BASH_ENV cannot be set in a step's env"):
        run_command("echo hi", cwd=tmp_path, policy=policy, env={"BASH_ENV": "./evil.sh"})
    assert not (tmp_path / "pwned").exists()
    assert run_command("echo hi", cwd=tmp_path, policy=policy, env={"PYTHONPATH": "src"}).ok
