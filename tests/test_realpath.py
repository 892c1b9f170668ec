"""`coder.files.realpath.realpath` gives what `os.path.realpath` gives, for every kind of path a
command can leave in a worktree: links (relative, absolute, chained, dangling, looping),
`..` after a link, a missing tail, a FIFO (never opened for reading: no hang), a trailing
slash on a file, a relative path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coder.files.realpath import realpath


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("x\n")
    (root / "up").symlink_to("a/b")
    (root / "abs").symlink_to(root / "a")
    (root / "chain").symlink_to("up")
    (root / "dangling").symlink_to("nowhere/at/all")
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    os.mkfifo(root / "fifo")
    return root


CASES = [
    "",
    "a",
    "a/b/f.txt",
    "a/b/f.txt/",
    "up",
    "up/f.txt",
    "up/..",
    "up/../b/f.txt",
    "abs/b",
    "chain/f.txt",
    "dangling",
    "dangling/more",
    "loop1",
    "loop1/x",
    "missing",
    "missing/deeper/f",
    "a/./b//f.txt",
    "fifo",
]


@pytest.mark.parametrize("rel", CASES)
def test_the_same_answer_as_os_path_realpath(tree: Path, rel: str) -> None:
    path = str(tree / rel) if rel else str(tree)
    assert realpath(path) == os.path.realpath(path)
    assert realpath(Path(path)) == os.path.realpath(Path(path))


def test_a_relative_path_is_taken_from_the_working_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree / "a")
    for rel in ("b/f.txt", "../up", ".", "nothing/here"):
        assert realpath(rel) == os.path.realpath(rel)
