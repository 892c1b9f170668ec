"""A file name that is not UTF-8 (legal on Linux, and git keeps its bytes): a step that makes
one commits it, and every command after shows and lands it as git does. It gave a traceback
and a run that could not finish (a name libgit2 is handed as text), and a merge that waited
for ever (pygit2's blob reader thread died on the name)."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import coder, git
from tests.helpers import taskfile

TASK = """
    id: odd
    title: t
    graph:
      - {id: s1, kind: shell, cmd: "printf x > \\"$(printf 'bad\\\\377name.txt')\\""}
      - {id: s2, kind: shell, cmd: "echo two > two.txt"}
"""
NAME = b"bad\xffname.txt"


def test_a_name_that_is_not_utf8_is_committed_shown_and_merged_as_git_does(make_repo) -> None:
    repo = make_repo()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    listed = subprocess.run(
        ["git", "ls-tree", "-z", "--name-only", "agent/odd-t"], cwd=repo, capture_output=True
    ).stdout.split(b"\0")
    assert NAME in listed
    code, shown, err = coder(repo, "diff", "-t", "odd")
    assert code == 0, err
    assert shown == git(repo, "diff", "main..agent/odd-t")  # `"a/bad\377name.txt"`, as git
    assert coder(repo, "diff", "-t", "odd", "--stat")[1].startswith(' "bad\\377name.txt" | 1 +')
    assert coder(repo, "report", "-t", "odd")[0] == 0
    assert coder(repo, "show", "-t", "odd", "--json")[0] == 0
    code, out, err = coder(repo, "merge", "-t", "odd")
    assert code == 0, out + err
    assert (repo / os.fsdecode(NAME)).read_bytes() == b"x"
    assert git(repo, "status", "--porcelain") == ""
    git(repo, "fsck", "--strict")
