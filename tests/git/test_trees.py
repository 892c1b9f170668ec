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


def test_links_follow_every_change_of_place(make_repo) -> None:
    repo = make_repo({"a/b/c.txt": "c\n", "a/d.txt": "d\n", "top.txt": "t\n", "x/y.txt": "y\n"})

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

    changes = [
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
    trees._LINKS.clear()
    assert trees.committed_links(repo) == links_by_git(repo) == frozenset()
    for number, change in enumerate(changes):
        change()
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"change {number}")
        assert trees.committed_links(repo) == links_by_git(repo), number
    assert links_by_git(repo) == {"x"}
