"""`coder merge` updates the user's checkout as `git checkout` would: through git's filters
(core.autocrlf, `text eol=crlf`, `ident`, filter drivers), checked byte for byte against what
the git CLI writes; a required filter that is missing is refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import coder, git

FILES = {"README.md": "# r\n", "keep.txt": "kept\n"}


def run_and_merge(repo: Path, cmd: str, *changes: str) -> tuple[int, str, str]:
    task = repo.parent / "task.yaml"
    step = {"kind": "shell", "cmd": cmd, "changes": [{"path": c} for c in changes]}
    task.write_text(f"id: f1\ntitle: t\ngraph:\n  - {json.dumps(step)}\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(task))
    assert code == 0, out + err
    return coder(repo, "merge", "-t", "f1")


def as_git_writes(repo: Path, *paths: str) -> dict[str, bytes]:
    """What coder wrote, then what `git checkout -- PATH` writes instead (byte for byte)."""
    ours = {p: (repo / p).read_bytes() for p in paths}
    for p in paths:
        (repo / p).unlink()
    git(repo, "checkout", "--", *paths)
    theirs = {p: (repo / p).read_bytes() for p in paths}
    assert ours == theirs
    return ours


def test_core_autocrlf_true(make_repo) -> None:
    repo = make_repo(FILES)
    git(repo, "config", "core.autocrlf", "true")
    code, out, err = run_and_merge(repo, "printf 'one\\ntwo\\n' > a.txt && echo more >> keep.txt")
    assert code == 0, out + err
    written = as_git_writes(repo, "a.txt", "keep.txt")
    assert written["a.txt"] == b"one\r\ntwo\r\n"
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "show", "main:a.txt") == "one\ntwo\n"  # the blob keeps LF


def test_gitattributes_eol_crlf_and_ident(make_repo) -> None:
    repo = make_repo({**FILES, ".gitattributes": "*.txt text eol=crlf\n*.c ident\n"})
    code, out, err = run_and_merge(
        repo, "printf 'x\\ny\\n' > b.txt && printf '/* $Id$ */\\nint x;\\n' > id.c"
    )
    assert code == 0, out + err
    written = as_git_writes(repo, "b.txt", "id.c")
    assert written["b.txt"] == b"x\r\ny\r\n"
    assert written["id.c"].startswith(b"/* $Id: ") and written["id.c"].endswith(b" $ */\nint x;\n")
    assert git(repo, "status", "--porcelain") == ""


def test_gitattributes_changed_by_the_run_decide_how_its_files_are_written(make_repo) -> None:
    repo = make_repo(FILES)
    code, out, err = run_and_merge(
        repo,
        "echo '*.txt text eol=crlf' > .gitattributes && printf 'z\\n' > c.txt",
        ".gitattributes",
    )
    assert code == 0, out + err
    assert as_git_writes(repo, "c.txt")["c.txt"] == b"z\r\n"


def test_a_configured_filter_driver_is_applied(make_repo) -> None:
    repo = make_repo({**FILES, ".gitattributes": "*.up filter=upper\n"})
    git(repo, "config", "filter.upper.smudge", "tr a-z A-Z")
    git(repo, "config", "filter.upper.clean", "tr A-Z a-z")
    code, out, err = run_and_merge(repo, "echo hello > x.up")
    assert code == 0, out + err
    assert as_git_writes(repo, "x.up")["x.up"] == b"HELLO\n"
    assert git(repo, "show", "main:x.up") == "hello\n"
    assert git(repo, "status", "--porcelain") == ""


def test_a_required_filter_that_is_missing_is_refused_naming_the_file(make_repo) -> None:
    repo = make_repo({**FILES, ".gitattributes": "*.bin filter=lfs\n"})
    git(repo, "config", "filter.lfs.required", "true")
    git(repo, "config", "filter.lfs.clean", "cat")  # there while the run stages big.bin...
    git(repo, "config", "filter.lfs.smudge", "cat")
    before = git(repo, "rev-parse", "main")
    task = repo.parent / "task.yaml"
    task.write_text(
        'id: f1\ntitle: t\ngraph:\n  - {"kind": "shell", "cmd": "echo data > big.bin"}\n'
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(task))
    assert code == 0, out + err
    git(repo, "config", "--remove-section", "filter.lfs")  # ...gone when it merges
    git(repo, "config", "filter.lfs.required", "true")
    code, _, err = coder(repo, "merge", "-t", "f1")
    assert code == 3
    assert err.splitlines()[0] == (
        "coder: error: big.bin needs the filter `lfs` (.gitattributes), which is required but "
        "not configured here; nothing was changed"
    )
    assert git(repo, "rev-parse", "main") == before
    assert not (repo / "big.bin").exists()


@pytest.mark.parametrize("autocrlf", ["true", "input"])
def test_a_checkout_file_already_as_git_writes_it_is_not_blocked(make_repo, autocrlf: str) -> None:
    """The plan recognises the checkout's files through the same filters (CRLF on disk is
    the committed LF blob), so the user's clean files never count as edits."""
    repo = make_repo(FILES)
    git(repo, "config", "core.autocrlf", autocrlf)
    for name in FILES:
        (repo / name).unlink()
    git(repo, "checkout", "--", *FILES)
    code, out, err = run_and_merge(repo, "echo more >> keep.txt")
    assert code == 0, out + err
    as_git_writes(repo, "keep.txt")


def test_an_ignored_file_in_the_way_gets_a_hint_that_works(make_repo) -> None:
    """`git stash -u` does not stash ignored files, so it cannot clear the way for them."""
    repo = make_repo(FILES)
    (repo / ".gitignore").write_text("*.log\n.gitignore\n")  # the user's own, not committed
    (repo / "build.log").write_text("my local log\n")
    code, _, err = run_and_merge(repo, "echo tracked > build.log")
    assert code == 3
    assert "overlap the merge: build.log; nothing was changed" in err
    assert err.splitlines()[1] == (
        "  hint: move build.log out of the way (git-ignored files, which `git stash -u` leaves "
        "in place), then run `coder merge -t f1` again"
    )
    assert (repo / "build.log").read_text() == "my local log\n"
