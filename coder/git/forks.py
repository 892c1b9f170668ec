"""A fork's history: the parent run's commits up to the fork point, copied for the new run.

Every command reads a run's steps from the commits that carry its own id (`Coder-Task: ID`),
so a fork cannot share its parent's commits: they would be foreign to it (resume, merge and
revert refuse foreign commits). Each copy keeps the original's tree, author, committer and
message; only the trailer names the fork, and `Coder-Forked-From: <sha>` names the original.
The copies' trees are the originals', so the fork's branch holds exactly the files the parent
had at the fork point.
"""

from __future__ import annotations

import re

import pygit2

from coder.errors import EnvironmentProblem
from coder.git.commits import TRAILER_TASK, parse_trailers
from coder.git.repository import Repo

TRAILER_FORKED_FROM = "Coder-Forked-From"


def copy_history(
    repo: Repo, *, base_commit: str, upto: str, parent_id: str, fork_id: str
) -> dict[str, str]:
    """Copies of the commits from `base_commit` (excluded) to `upto` (included), oldest first,
    each naming `fork_id` in its trailer: {original: copy}, in order (the last copy is the
    commit the fork's branch starts at; none when `upto` is `base_commit`). EnvironmentProblem
    when the chain holds a commit that is not `parent_id`'s, or a merge: the fork would carry
    someone else's work."""
    chain: list[pygit2.Commit] = []
    commit = repo[upto].peel(pygit2.Commit)
    while str(commit.id) != base_commit:
        task = parse_trailers(commit.message).get(TRAILER_TASK.lower())
        if task != parent_id or len(commit.parents) != 1:
            raise EnvironmentProblem(
                f"commit {str(commit.id)[:12]} on run {parent_id}'s branch is not one of its "
                "step commits; refusing to fork so nobody else's work is carried into the fork",
                hint="fork at an earlier step, or move that commit off the run's branch",
            )
        chain.append(commit)
        commit = commit.parents[0]
    tip = base_commit
    copies: dict[str, str] = {}
    for original in reversed(chain):
        message = renamed(original.message, parent_id, fork_id, str(original.id))
        oid = repo.create_commit(
            None,
            original.author,
            original.committer,
            message,
            original.tree_id,
            [pygit2.Oid(hex=tip)],
        )
        tip = copies[str(original.id)] = str(oid)
    return copies


def renamed(message: str, parent_id: str, fork_id: str, original: str) -> str:
    """`message` with its trailer paragraph's `Coder-Task: parent_id` naming `fork_id`, and
    the original commit named after it."""
    head, sep, trailers = message.rstrip("\n").rpartition("\n\n")
    pattern = re.compile(rf"^{TRAILER_TASK}\s*:\s*{re.escape(parent_id)}\s*$", re.MULTILINE)
    new = f"{TRAILER_TASK}: {fork_id}\n{TRAILER_FORKED_FROM}: {original}"
    replaced, count = pattern.subn(lambda _m: new, trailers, count=1)
    if not count:  # parse_trailers found it, so it is there; never leave the parent's id
        raise EnvironmentProblem(f"cannot read the trailers of commit {original[:12]}")
    return f"{head}{sep}{replaced}\n"
