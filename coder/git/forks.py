"""A fork's history: the parent run's commits up to the fork point, copied for the new run.

Every command reads a run's steps from the commits that carry its own id (`Coder-Task: ID`),
so a fork cannot share its parent's commits: they would be foreign to it (resume, merge and
revert refuse foreign commits). Each copy keeps the original's tree, author, committer and
message; only the trailer names the fork, and `Coder-Forked-From: <sha>` names the original.
The copies' trees are the originals', so the fork's branch holds exactly the files the parent
had at the fork point. So the trailers say where a fork came from (`lineage`): its parent is
the run of the commit its last copy names, the fork point that commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pygit2

from coder.errors import EnvironmentProblem
from coder.git import objects
from coder.git.commits import TRAILER_STEP, TRAILER_TASK, commits_between, parse_trailers
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
    if copies:  # held from git's prune until the fork's branch has them (coder.git.objects)
        objects.hold(repo, tip, copies.values())
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


@dataclass(frozen=True)
class Lineage:
    """Where a fork came from, as the trailers of its copied commits say."""

    cut: str  # the parent's commit its history copies up to (its last copy's original)
    parent: str | None  # the run of that commit (None: the commit is gone)
    origin: str | None  # the run at the start of its chain of forks (None: a commit is gone)
    copied: tuple[str, ...]  # the steps of its copied commits, oldest first


def lineage(repo: Repo, branch: str, base_commit: str, fork_id: str) -> Lineage | None:
    """The lineage of run `fork_id` from the copies at the start of its branch (after
    `base_commit`): commits of `fork_id` that name an original (`Coder-Forked-From`). None
    when there is none: no fork, or one made at its first step (it copied nothing)."""
    copies = []
    for commit in commits_between(repo, branch, base_commit):
        trailers = parse_trailers(commit.message)
        if trailers.get(TRAILER_TASK.lower()) != fork_id or _FROM not in trailers:
            break
        copies.append(trailers)
    cut = copies[-1][_FROM] if copies else ""
    if not _SHA.fullmatch(cut):
        return None
    chain = _originals(repo, cut)
    return Lineage(
        cut=cut,
        parent=chain[0] if chain else None,
        origin=chain[-1] if chain and chain[-1] is not None else None,
        copied=tuple(t[TRAILER_STEP.lower()] for t in copies if TRAILER_STEP.lower() in t),
    )


_FROM = TRAILER_FORKED_FROM.lower()
_SHA = re.compile(r"[0-9a-f]{40}")


def _originals(repo: Repo, commit: str) -> list[str | None]:
    """The runs of `commit` and of each commit it was copied from in turn (a fork of a fork),
    ending in None where a commit is gone."""
    runs: list[str | None] = []
    seen = set()
    while commit not in seen:
        seen.add(commit)
        found = repo.get(commit) if _SHA.fullmatch(commit) else None
        if not isinstance(found, pygit2.Commit):
            return [*runs, None]
        trailers = parse_trailers(found.message)
        runs.append(trailers.get(TRAILER_TASK.lower()))
        if _FROM not in trailers:
            break
        commit = trailers[_FROM]
    return runs
