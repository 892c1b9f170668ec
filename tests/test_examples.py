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
