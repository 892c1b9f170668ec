"""Commits stacked in memory, for a step that runs on another machine (coder.fleet): its start
built from the base and its dependencies' step commits, an empty step commit when the step
changed nothing, and what a commit's trailers say. No working tree is touched."""

from __future__ import annotations

from collections.abc import Sequence

import pygit2

from coder.errors import EnvironmentProblem, RunFailed
from coder.git.branches import resolve_commit
from coder.git.commits import commit_message, parse_trailers
from coder.git.repository import Repo, identity


def trailers_at(repo: Repo, rev: str) -> dict[str, str] | None:
    """The trailers of the commit `rev` names (keys lower-cased); None: no such commit."""
    try:
        commit = repo.revparse_single(rev).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return parse_trailers(commit.message)


def parent_of(repo: Repo, rev: str) -> str | None:
    commit = repo[resolve_commit(repo, rev)].peel(pygit2.Commit)
    return str(commit.parents[0].id) if len(commit.parents) == 1 else None


def tree_of(repo: Repo, rev: str) -> str:
    return str(repo[resolve_commit(repo, rev)].peel(pygit2.Commit).tree_id)


def stack(repo: Repo, base: str, picks: Sequence[str]) -> str:
    """`base` with each of `picks` cherry-picked onto it in order (three-way, in memory, each
    with its own message and author): the last commit's id. RunFailed naming the paths when
    two of them edit the same lines."""
    tip = repo[resolve_commit(repo, base)].peel(pygit2.Commit)
    committer = identity(repo).committer
    for rev in picks:
        pick = repo[resolve_commit(repo, rev)].peel(pygit2.Commit)
        if len(pick.parents) != 1:
            raise EnvironmentProblem(f"step commit {str(pick.id)[:12]} is a merge or root commit")
        merged = repo.merge_trees(pick.parents[0].tree, tip.tree, pick.tree)
        if merged.conflicts:
            paths = sorted({(o or t or a).path for a, o, t in merged.conflicts})
            raise RunFailed(
                f"step commit {str(pick.id)[:12]} conflicts with the others in {', '.join(paths)}",
                hint="steps of one level edited the same lines; make one depend on the other",
            )
        tree = merged.write_tree(repo)
        oid = repo.create_commit(None, pick.author, committer, pick.message, tree, [tip.id])
        tip = repo[oid].peel(pygit2.Commit)
    return str(tip.id)


def empty_step_commit(
    repo: Repo, parent: str, *, task_id: str, step_id: str, attempt: int, title: str
) -> str:
    """A commit of `parent`'s own tree with the step's trailers: the proof, on a step's ref,
    that a step which changed nothing is done."""
    base = repo[resolve_commit(repo, parent)].peel(pygit2.Commit)
    who = identity(repo)
    message = commit_message(title, "", task_id=task_id, step_id=step_id, attempt=attempt)
    oid = repo.create_commit(None, who.author, who.committer, message, base.tree_id, [base.id])
    return str(oid)
