"""A checkpoint of version 1 (it held the run's identity too: task, branch, base, worktree, ...)
read by today's coder: upgraded by `identity_moved_to_manifest`, and a run it belongs to
resumes, shows and merges. The stored file (data/state-v1.json) is the checkpoint a real run
of data/upgraded.yaml left under the coder of version 1 (step two failing)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from coder.run import manifest as manifests
from coder.run.state import StateStore, identity_moved_to_manifest
from coder.schemas import validator
from tests.conftest import coder, git
from tests.helpers import state_of, step_commits, taskfile

DATA = Path(__file__).resolve().parent / "data"
V1: dict[str, Any] = json.loads((DATA / "state-v1.json").read_text())
IDENTITY = {
    "title",
    "taskfile",
    "branch",
    "base",
    "base_commit",
    "worktree",
    "task",
    "created_at",
    "seq",
    "parent",
    "forked_at",
}
BRANCH = "agent/upgraded-made-by-coder-v1"


def test_a_v1_checkpoint_splits_into_its_progress_and_the_manifest_it_held() -> None:
    assert V1["version"] == 1 and IDENTITY <= set(V1)
    state, manifest = identity_moved_to_manifest(copy.deepcopy(V1))
    assert list(validator("state").iter_errors(state)) == []
    assert state["version"] == 2 and not IDENTITY & set(state)
    assert {k: v for k, v in state.items() if k != "version"} == {
        k: v for k, v in V1.items() if k not in IDENTITY | {"version"}
    }
    read = manifests.Manifest.from_dict(manifest)
    assert manifests._problem(manifest, "upgraded") is None
    assert (read.task_id, read.branch, read.base, read.base_commit) == (
        "upgraded",
        BRANCH,
        "main",
        V1["base_commit"],
    )
    assert (read.doc, read.taskfile, read.worktree, read.seq) == (
        V1["task"],
        V1["taskfile"],
        V1["worktree"],
        1,
    )
    assert (read.created_at, read.parent, read.forked_at) == (V1["created_at"], None, None)


def v1_run(repo: Path) -> Path:
    """Run data/upgraded.yaml with today's coder (step two fails), then put the stored v1
    checkpoint in place of its own, made to name this run (its paths, base and commits):
    the run as the coder of version 1 left it. Returns the taskfile."""
    path = taskfile(repo, (DATA / "upgraded.yaml").read_text(), name="upgraded.yaml")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1, out + err
    today = json.loads((repo / ".coder" / "state" / "upgraded.json").read_text())
    assert today["version"] == 2 and not IDENTITY & set(today)  # what today's coder writes
    base = git(repo, "rev-parse", "main").strip()
    [(one, _)] = [(c, s) for c, s in commit_steps(repo)]
    text = (DATA / "state-v1.json").read_text()
    for old, new in (
        (V1["taskfile"], str(path)),
        ("/tmp/d-v1", str(repo)),
        (V1["base_commit"], base),
        (V1["steps"]["one"]["commit"], one),
    ):
        text = text.replace(old, new)
    store = StateStore(repo / ".coder")
    store.path("upgraded").write_text(text)
    store.journal_path("upgraded").unlink(missing_ok=True)
    return path


def commit_steps(repo: Path) -> list[tuple[str, str]]:
    """(commit, step) of each commit on the run's branch after main."""
    out = git(repo, "log", "--format=%H %(trailers:key=Coder-Step,valueonly,separator=)", BRANCH)
    main = set(git(repo, "rev-list", "main").split())
    return [(c, s) for c, s in (line.split(" ", 1) for line in out.splitlines()) if c not in main]


@pytest.mark.parametrize("manifest_kept", [True, False])
def test_a_run_of_a_v1_checkpoint_resumes_shows_and_merges(
    make_repo: Any, manifest_kept: bool
) -> None:
    """Its manifest kept, or gone (then the v1 checkpoint is the only record of what the run
    is: read from it and written back before the checkpoint is rewritten as version 2)."""
    repo = make_repo()
    path = v1_run(repo)
    manifest_file = repo / ".coder" / "tasks" / "upgraded.json"
    if not manifest_kept:
        manifest_file.unlink()
    code, out, err = coder(repo, "status", "--json")
    assert code == 0, out + err
    [row] = json.loads(out)
    assert (row["id"], row["title"], row["status"], row["progress"]) == (
        "upgraded",
        "made by coder v1",
        "failed",
        "1/2",
    )
    assert (row["branch"], row["seq"], row["parent"]) == (BRANCH, 1, None)
    assert manifest_file.exists() == manifest_kept  # `status` only reads

    path.write_text(path.read_text().replace(" && exit 3", ""))
    code, out, err = coder(repo, "resume", "-t", "upgraded", "--taskfile")
    assert code == 0, out + err
    assert ("rebuilt it from its state" in err) != manifest_kept
    on_disk = json.loads((repo / ".coder" / "state" / "upgraded.json").read_text())
    assert on_disk["version"] == 2 and not IDENTITY & set(on_disk)
    state = state_of(repo, "upgraded")
    assert [s["status"] for s in state["steps"].values()] == ["success", "success"]
    assert state["steps"]["one"]["started_at"] == V1["steps"]["one"]["started_at"]  # kept
    assert [s for s, _, _ in step_commits(repo, BRANCH)] == ["one", "two"]
    manifest = json.loads(manifest_file.read_text())
    assert manifest["seq"] == 1
    assert (manifest["created_at"] == V1["created_at"]) != manifest_kept  # the v1 file's

    code, out, err = coder(repo, "show", "-t", "upgraded", "--json")
    assert code == 0, out + err
    shown = json.loads(out)
    assert (shown["title"], shown["branch"], shown["status"]) == (
        "made by coder v1",
        BRANCH,
        "success",
    )
    assert shown["worktree"] == str(repo / ".coder" / "worktrees" / "upgraded")
    code, out, err = coder(repo, "show", "-t", "upgraded")
    assert code == 0 and "made by coder v1" in out, out + err

    code, out, err = coder(repo, "merge", "-t", "upgraded")
    assert code == 0, out + err
    assert git(repo, "show", "main:one.txt") == "one\n"
    assert git(repo, "show", "main:two.txt") == "two\n"
    assert state_of(repo, "upgraded")["merge"]["base"] == "main"


def test_a_v2_checkpoint_without_its_manifest_says_how_to_rebuild_it(make_repo: Any) -> None:
    """A checkpoint of today holds no manifest: its run is rebuilt from its taskfile and the
    branch's commits, its progress kept."""
    repo = make_repo()
    path = taskfile(repo, (DATA / "upgraded.yaml").read_text(), name="upgraded.yaml")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1, out + err
    (repo / ".coder" / "tasks" / "upgraded.json").unlink()
    code, out, err = coder(repo, "show", "-t", "upgraded")
    assert code == 3 and "its manifest" in err and "-f TASKFILE" in err, out + err
    code, out, err = coder(repo, "status", "--json")
    [row] = json.loads(out)
    assert (row["id"], row["status"]) == ("upgraded", "corrupt")
    code, out, err = coder(repo, "resume", "-t", "upgraded")
    assert code == 3 and "coder resume -t upgraded -f TASKFILE" in err, out + err
    path.write_text(path.read_text().replace(" && exit 3", ""))
    code, out, err = coder(repo, "resume", "-t", "upgraded", "-f", str(path))
    assert code == 0, out + err
    assert "had no manifest; rebuilt it" in err
    assert [s["status"] for s in state_of(repo, "upgraded")["steps"].values()] == [
        "success",
        "success",
    ]


def test_clean_removes_a_run_whose_manifest_is_gone(make_repo: Any) -> None:
    """Its checkpoint no longer says where its worktree and branch are: found by its id."""
    repo = make_repo()
    path = taskfile(repo, (DATA / "upgraded.yaml").read_text(), name="upgraded.yaml")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 1
    (repo / ".coder" / "tasks" / "upgraded.json").unlink()
    code, out, err = coder(repo, "clean", "-t", "upgraded", "--delete-branch")
    assert code == 0, out + err
    assert not (repo / ".coder" / "state" / "upgraded.json").exists()
    assert not (repo / ".coder" / "worktrees" / "upgraded").exists()
    assert git(repo, "branch", "--list", BRANCH).strip() == ""
