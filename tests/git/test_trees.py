"""coder.git.trees.committed_links: the symlinks of a worktree's HEAD commit, derived from its
parent's by comparing only the subtrees that differ; held equal, commit after commit, to what
`git ls-tree` says of each commit as files, folders and links change places."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from coder.git import trees
from tests.conftest import git


def links_by_git(repo: Path) -> frozenset[str]:
    lines = git(repo, "ls-tree", "-r", "HEAD").splitlines()
    return frozenset(line.split("\t", 1)[1] for line in lines if line.startswith("120000 "))


def replace(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def changes_of_place(repo: Path) -> list[Callable[[], None]]:
    """Files, folders and links changing places in ``repo``, one change a commit."""

    def link(rel: str, target: str = "top.txt") -> Callable[[], None]:
        def make() -> None:
            path = repo / rel
            replace(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, path)

        return make

    def file(rel: str) -> Callable[[], None]:
        def make() -> None:
            path = repo / rel
            replace(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{rel}\n")

        return make

    def gone(rel: str) -> Callable[[], None]:
        return lambda: replace(repo / rel)

    return [
        link("a/b/l1"),  # a link added deep down
        link("a/d.txt"),  # a file became a link
        link("x/l2", "y.txt"),
        file("a/d.txt"),  # a link became a file again
        link("a/b/l1", "c.txt"),  # a link retargeted: still a link
        file("a/b"),  # a folder holding a link became a file
        lambda: (replace(repo / "a" / "b"), link("a/b/deep/l3")()),  # a folder with a link again
        gone("x"),  # a folder with a link removed
        link("x"),  # and a link in its place
        gone("a"),
    ]


def test_links_follow_every_change_of_place(make_repo) -> None:
    repo = make_repo({"a/b/c.txt": "c\n", "a/d.txt": "d\n", "top.txt": "t\n", "x/y.txt": "y\n"})
    trees._LINKS.clear()
    assert trees.committed_links(repo) == links_by_git(repo) == frozenset()
    for number, change in enumerate(changes_of_place(repo)):
        change()
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"change {number}")
        assert trees.committed_links(repo) == links_by_git(repo), number
    assert links_by_git(repo) == {"x"}


def test_a_step_commit_leaves_its_links_derived_from_its_changes(make_repo) -> None:
    """A step's commit derives its tree's links from the base's by the changes it staged
    (`note_commit`): the next step finds them cached, and they are what git says."""
    from coder.git import commits, repository, worktrees

    repo = make_repo({"a/b/c.txt": "c\n", "a/d.txt": "d\n", "top.txt": "t\n", "x/y.txt": "y\n"})
    wt = worktrees.create_worktree(
        repository.open_repo(repo),
        name="t",
        path=repo / ".coder" / "worktrees" / "t",
        branch="agent/t",
        start="main",
    )
    trees._LINKS.clear()
    trees.committed_links(wt)
    for number, change in enumerate(changes_of_place(wt)):
        change()
        tip = git(wt, "rev-parse", "HEAD").strip()
        made = commits.commit_step(
            wt,
            branch="agent/t",
            task_id="t",
            step_id=f"s{number}",
            attempt=1,
            title=f"change {number}",
            expected_tip=tip,
        )
        assert made is not None
        tree = git(wt, "rev-parse", "HEAD^{tree}").strip()
        assert trees._LINKS.get(tree) == links_by_git(wt), number  # derived, not walked
