"""Every example in tasks/ validates, and the ones that need no model run as documented, on
a fresh copy of the sample project."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder import taskfile
from tests.conftest import coder, git, sample_files
from tests.helpers import ROOT, state_of

EXAMPLES = sorted((ROOT / "tasks").glob("*.yaml"))


def needs_model(path: Path) -> bool:
    return any(s.uses_model for s in taskfile.load(path).steps)


def test_there_is_an_example_per_feature() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "hello-shell.yaml",
        "parallel-levels.yaml",
        "revert-and-stop.yaml",
        "success-criteria.yaml",
        "add-health-endpoint.yaml",
        "mcp-tools.yaml",
    } <= names
    assert [p.name for p in EXAMPLES if needs_model(p)] == [
        "add-health-endpoint.yaml",
        "mcp-tools.yaml",
    ]


@pytest.mark.parametrize(
    ("name", "exit_code", "statuses"),
    [
        ("hello-shell.yaml", 0, {"s1": "success", "s2": "success", "s3": "success"}),
        (
            "parallel-levels.yaml",
            0,
            {
                "setup": "success",
                "docs": "success",
                "data": "success",
                "optional": "skipped",
                "after-optional": "skipped",
                "index": "success",
            },
        ),
        ("revert-and-stop.yaml", 1, {"notes": "success", "lint": "failed", "publish": "pending"}),
        (
            "success-criteria.yaml",
            0,
            {"code": "success", "test": "success", "run-tests": "success"},
        ),
    ],
)
def test_examples_without_a_model_run_as_documented(
    make_repo, name: str, exit_code: int, statuses: dict[str, str]
) -> None:
    repo = make_repo(sample_files())
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(ROOT / "tasks" / name))
    assert code == exit_code, out + err
    task = taskfile.load(ROOT / "tasks" / name)
    state = state_of(repo, task.id) if task.source.get("id") else None
    if state is None:  # a generated id: the only run of this repository
        [path] = (repo / ".coder" / "state").glob("*.json")
        state = state_of(repo, path.stem)
    assert {k: v["status"] for k, v in state["steps"].items()} == statuses
    git(repo, "fsck", "--strict")


@pytest.mark.parametrize(
    "project",
    [
        {"README.md": "# new\n"},  # nothing to detect
        {
            "tests/test_old.py": "import unittest\n\n\nclass T(unittest.TestCase):\n"
            "    def test_ok(self):\n        pass\n"
        },  # init detects unittest
    ],
    ids=["empty", "unittest"],
)
def test_the_first_run_in_a_fresh_repository_is_green(make_repo, project: dict[str, str]) -> None:
    """As docs/journey.md's first steps say: init, write the example, run it, merge it. The
    example ships in the package and works under the test runner init detected."""
    repo = make_repo(project)
    code, out, err = coder(repo, "init", "--example", "hello-shell")
    assert code == 0, out + err
    assert "Next: `coder run --autonomous -f tasks/hello-shell.yaml`" in out
    code, out, err = coder(repo, "run", "--autonomous", "-f", "tasks/hello-shell.yaml")
    assert code == 0, out + err
    [state] = (repo / ".coder" / "state").glob("*.json")
    code, out, err = coder(repo, "merge", "-t", state.stem)
    assert code == 0, out + err
    assert (repo / "tests" / "test_greeting.py").is_file()
    git(repo, "fsck", "--strict")


def test_init_names_the_examples_and_refuses_an_unknown_one(repo: Path) -> None:
    code, out, _ = coder(repo, "init", "--example", "list")
    assert code == 0 and "hello-shell" in out.split()
    code, _, err = coder(repo, "init", "--example", "nope")
    assert code == 2
    assert "no example named 'nope'" in err and "hello-shell" in err
    assert not (repo / "tasks").exists()
