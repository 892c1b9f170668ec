"""coder.git.snapshot: the checkout's working files as a commit on no branch, read with the git
CLI; the checkout (files, index, refs) untouched."""

from __future__ import annotations

import os
from pathlib import Path

from coder.git import repository, snapshot, workdir
from tests.conftest import git


def snap(repo: Path) -> snapshot.Snapshot | None:
    r = repository.open_repo(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    return snapshot.snapshot(r, repo, head, workdir.changed_paths(repo), task_id="t1")


def tree(repo: Path, commit: str) -> dict[str, str]:
    """path -> "mode content" of every entry of `commit`, as git shows them."""
    found = {}
    for line in git(repo, "ls-tree", "-r", commit).splitlines():
        meta, path = line.split("\t", 1)
        mode, _, oid = meta.split()
        found[path] = f"{mode} {git(repo, 'cat-file', '-p', oid)}"
    return found


def test_files_and_directories_swap_places_links_stay_links(make_repo, tmp_path: Path) -> None:
    repo = make_repo({"a": "file a\n", "d/x.txt": "x\n", "d/y.txt": "y\n", "keep.txt": "k\n"})
    (repo / "a").unlink()
    (repo / "a").mkdir()
    (repo / "a" / "inner.txt").write_text("inner\n")  # a file became a directory
    for name in ("x.txt", "y.txt"):
        (repo / "d" / name).unlink()
    (repo / "d").rmdir()
    (repo / "d").write_text("now a file\n")  # and a directory a file
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_text("never read\n")
    (repo / "ln").symlink_to(outside)
    os.mkfifo(repo / "pipe")
    index_before = (repo / ".git" / "index").read_bytes()
    made = snap(repo)
    assert made is not None
    assert tree(repo, made.commit) == {
        "a/inner.txt": "100644 inner\n",
        "d": "100644 now a file\n",
        "keep.txt": "100644 k\n",
        "ln": f"120000 {outside}",
    }
    assert made.left_out == ()  # the fifo: git does not list it either
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert git(repo, "branch", "--contains", made.commit) == ""  # on no branch
    message = git(repo, "log", "-1", "--format=%B", made.commit)
    assert message.startswith("coder: uncommitted changes from the checkout\n")
    assert "Coder-Task: t1\nCoder-Checkout: uncommitted" in message


def test_a_directory_that_became_a_link_hides_nothing_behind_it(make_repo, tmp_path) -> None:
    """The tracked files under it count as deleted; what the link points at is never read."""
    repo = make_repo({"src/app.py": "x = 1\n", "README.md": "r\n"})
    outside = tmp_path / "out"
    outside.mkdir()
    (outside / "app.py").write_text("FROM OUTSIDE\n")
    (repo / "src" / "app.py").unlink()
    (repo / "src").rmdir()
    (repo / "src").symlink_to(outside)
    made = snap(repo)
    assert made is not None
    assert tree(repo, made.commit) == {"README.md": "100644 r\n", "src": f"120000 {outside}"}


def test_a_staged_file_deleted_since_and_no_change_at_all(make_repo) -> None:
    repo = make_repo({"README.md": "r\n"})
    (repo / "new.txt").write_text("n\n")
    git(repo, "add", "new.txt")
    (repo / "new.txt").unlink()
    assert snap(repo) is None  # nothing differs from HEAD in the working files


def test_a_file_replacing_a_directory_drops_what_was_left_out_below_it(make_repo) -> None:
    """`d/keep.env` is not asked for (a protected path the run leaves out), yet `d` is now a
    file: the commit cannot hold both, so nothing stays below `d` (and a file that became a
    directory goes too); the sibling `dd/x` and `d.txt`, which sort beside them, stay."""
    repo = make_repo(
        {"d/keep.env": "K=1\n", "d/a/b.txt": "b\n", "dd/x": "x\n", "d.txt": "t\n", "f": "f\n"}
    )
    for name in ("d/keep.env", "d/a/b.txt"):
        (repo / name).unlink()
    (repo / "d" / "a").rmdir()
    (repo / "d").rmdir()
    (repo / "d").write_text("now a file\n")
    (repo / "f").unlink()
    (repo / "f").mkdir()
    (repo / "f" / "g").write_text("g\n")
    r = repository.open_repo(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    wanted = [p for p in workdir.changed_paths(repo) if p != "d/keep.env"]
    made = snapshot.snapshot(r, repo, head, wanted, task_id="t1")
    assert made is not None
    assert tree(repo, made.commit) == {
        "d": "100644 now a file\n",
        "d.txt": "100644 t\n",
        "dd/x": "100644 x\n",
        "f/g": "100644 g\n",
    }
