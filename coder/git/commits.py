"""Step commits and their trailers, and reading a run's history back from them.

* **Git is the truth.** Each step is one commit with ``Coder-Task``/``Coder-Step``/
  ``Coder-Attempt`` trailers; ``step_commits`` reads them back to rebuild lost state.
* **Compare-and-swap, by name.** ``commit_step`` moves the run's branch, named by the run
  (never found through the worktree's HEAD, which a process may have pointed at ``main``),
  from ``expected_tip`` to the new commit under the ref's lock: ``BranchMoved`` if anyone
  moved it in between.
* **Held from git's prune.** A commit is written on no ref, so what it brings (itself, its new
  trees and blobs) goes into a kept pack first (``write_commit``, coder.git.objects): a `git gc
  --prune=now` running meanwhile takes none of it; the ref move releases it.
* **One walk of the tree per step.** ``staging.stage`` finds and stages a step's changes in
  one scan; the verify stage checks that change set and ``commit_step`` records its tree, so
  what was checked is what is committed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import cast

import pygit2
from pygit2.enums import SortMode

from coder.errors import EnvironmentProblem, InvalidInput, ObjectsMissing, RunFailed
from coder.git import objects, trees
from coder.git.branches import (
    branch_tip,
    check_detached_head,
    check_tip,
    move_branch_ref,
    move_detached_head,
    resolve_commit,
    run_branch_ref,
)
from coder.git.repository import (
    Repo,
    git_failure,
    identity,
    open_worktree,
    retry_on_pruned_write,
)
from coder.git.restore import restore_files
from coder.git.staging import Staged, brings, settle, stage

_COMMIT_TRIES = 3  # a step's changes staged and committed, while a prune takes what was staged
TRAILER_TASK = "Coder-Task"
TRAILER_STEP = "Coder-Step"
TRAILER_ATTEMPT = "Coder-Attempt"
TRAILER_MERGE = "Coder-Merge"  # on `coder merge`'s commit: its mode
TRAILER_NOTE = "Coder-Note"  # on a step's commit: each guidance note the user gave it
TRAILER_REVERTS = "Coder-Reverts"  # on `coder revert`'s commits: the step whose commit it undoes
REFLOG_REVERT = "coder: revert"  # how `coder revert`'s branch moves start in the reflog


def commit_message(
    title: str, body: str, *, task_id: str, step_id: str, attempt: int, notes: Sequence[str] = ()
) -> str:
    """Step commit message: title, optional body, then the trailer paragraph (always last;
    `notes`, one line each, as `Coder-Note` trailers after coder's own)."""
    title = " ".join(title.split()) or f"step {step_id}"
    body = body.strip()
    parts = [title] + ([body] if body else [])
    trailers = (
        f"{TRAILER_TASK}: {task_id}\n{TRAILER_STEP}: {step_id}\n{TRAILER_ATTEMPT}: {attempt}\n"
    ) + "".join(f"{TRAILER_NOTE}: {' '.join(note.split())}\n" for note in notes)
    return "\n\n".join([*parts, trailers])


def _staged(worktree: Path, base: str, staged: Staged | None, w: Repo) -> Staged:
    """What a step's commit records: the tree the verify stage staged (taken against the same
    base), or what ``worktree`` holds now."""
    if staged is None:
        return stage(worktree, base, repo=w)
    if staged.base != base:
        raise ValueError(f"the changes were staged against {staged.base}, not {base}")
    if staged.held is not None and staged.held is not w:
        settle(staged)  # on disk, where ``w`` reads them
    return staged


def _step_commit(
    w: Repo, worktree: Path, staged: Staged, parent: pygit2.Commit, message: str
) -> pygit2.Oid:
    """The step's commit, on no ref, held with what it brings (`write_commit`), then the
    worktree's index that `staged` held (`settle`). A blob or tree a prune took since the
    verify stage staged it is staged again from the files (a few times): the same tree, or an
    EnvironmentProblem (the files changed since)."""
    who = identity(w)
    tree = pygit2.Oid(hex=staged.tree)
    for _ in range(_COMMIT_TRIES - 1):
        try:
            oid = write_commit(w, who.author, who.committer, message, tree, [parent.id], staged)
            settle(staged)
            return oid
        except ObjectsMissing:
            settle(staged)
            again = stage(worktree, staged.base, repo=w)
        if again.tree != staged.tree:
            raise EnvironmentProblem(
                f"the files of {worktree} changed between the step's checks and its commit; "
                "nothing was committed",
                hint="`coder resume` runs the step again",
            )
        staged = again
    return write_commit(w, who.author, who.committer, message, tree, [parent.id], staged)


def commit_step(
    worktree: Path,
    *,
    branch: str,
    task_id: str,
    step_id: str,
    attempt: int,
    title: str,
    body: str = "",
    expected_tip: str,
    staged: Staged | None = None,
    notes: Sequence[str] = (),
    repo: Repo | None = None,
) -> str | None:
    """Commit everything the step changed in ``worktree`` as one commit on ``branch``, the
    run's branch checked out there: the tree ``staged`` holds (what the verify stage staged
    and checked), or staged now. ``repo``: the worktree, opened already (by the verify stage
    that staged it).

    Returns the new commit's hex, or None if the tree equals ``expected_tip``'s (a step that
    changed nothing makes no commit). The commit moves ``branch`` by name, never through
    HEAD, by compare-and-swap (lock, check, set): ``BranchMoved`` if it is not at
    ``expected_tip``, EnvironmentProblem if the worktree's HEAD no longer names it.
    """
    worktree = Path(worktree)
    w = repo if repo is not None else open_worktree(worktree)
    refname = run_branch_ref(w, worktree, branch)
    check_tip(w, refname, expected_tip, worktree)
    staged = _staged(worktree, expected_tip, staged, w)
    parent = objects.commit_of(w, expected_tip, f"the tip of {branch}")
    if staged.tree == str(parent.tree_id):
        settle(staged)
        return None
    message = commit_message(
        title, body, task_id=task_id, step_id=step_id, attempt=attempt, notes=notes
    )
    try:  # the commit first, on no ref (held in a kept pack); then the branch moves to it
        oid = _step_commit(w, worktree, staged, parent, message)
        move_branch_ref(w, refname, oid, expected_tip, worktree, f"step {step_id}")
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, f"commit step {step_id}", worktree) from None
    changed = ((c.path, c.new[0] if c.new else None) for c in staged.changes)
    trees.note_commit(str(parent.tree_id), staged.tree, changed)
    return str(oid)


def commit_detached(
    workdir: Path,
    *,
    task_id: str,
    step_id: str,
    attempt: int,
    title: str,
    body: str = "",
    parent: str,
    staged: Staged | None = None,
    notes: Sequence[str] = (),
    repo: Repo | None = None,
) -> str | None:
    """``commit_step`` for a scratch worktree: the step commit advances only its detached
    HEAD (so the HEAD reflog keeps it reachable until ``cherry_pick`` lands it). Returns None
    if nothing changed."""
    workdir = Path(workdir)
    w = repo if repo is not None else open_worktree(workdir)
    if not w.head_is_detached:
        raise EnvironmentProblem(f"{workdir} is on a branch, not a scratch worktree")
    check_detached_head(w, parent, workdir)
    staged = _staged(workdir, parent, staged, w)
    base = objects.commit_of(w, parent, "the tip the step started from")
    if staged.tree == str(base.tree_id):
        settle(staged)
        return None
    message = commit_message(
        title, body, task_id=task_id, step_id=step_id, attempt=attempt, notes=notes
    )
    try:
        oid = _step_commit(w, workdir, staged, base, message)
        move_detached_head(w, oid, parent, workdir)
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, f"commit step {step_id}", workdir) from None
    return str(oid)


def cherry_pick(
    worktree: Path, commit: str, *, branch: str, expected_tip: str, trailers: Sequence[str] = ()
) -> str | None:
    """Land a scratch step commit on ``branch``, checked out in ``worktree`` (at
    ``expected_tip``, CAS on the branch by name, as ``commit_step``).

    If the commit's parent is the tip it lands as is (fast-forward); otherwise its change is
    three-way merged in memory onto the tip and committed with the same message (trailers
    included) and author. ``trailers`` ("Key: value" lines) join the message's own: the commit
    is then always written anew. Returns the commit now at the tip, None if the change was
    already there; conflicting edits raise ``RunFailed`` naming the paths, changing nothing.
    """
    worktree = Path(worktree)
    w = open_worktree(worktree)
    refname = run_branch_ref(w, worktree, branch)
    check_tip(w, refname, expected_tip, worktree)
    pick = w[resolve_commit(w, commit)].peel(pygit2.Commit)
    ours = objects.commit_of(w, expected_tip, f"the tip of {branch}")
    if len(pick.parents) != 1:
        raise InvalidInput(f"cannot cherry-pick {str(pick.id)[:12]}: it is a merge or root commit")
    try:
        if pick.parents[0].id == ours.id and not trailers:
            new = pick.id
            move_branch_ref(w, refname, new, expected_tip, worktree, "fast-forward to")
        else:
            merged = w.merge_trees(pick.parents[0].tree, ours.tree, pick.tree)
            if merged.conflicts:
                paths = sorted({(o or t or a).path for a, o, t in merged.conflicts})
                raise RunFailed(
                    f"step commit {str(pick.id)[:12]} conflicts with {branch} "
                    f"in {', '.join(paths)}",
                    hint="parallel steps edited the same lines; make one depend on the other",
                )
            tree = retry_on_pruned_write(lambda: merged.write_tree(w))
            if tree == ours.tree_id:
                return None
            committer = identity(w).committer
            brought = brings(w, ours.tree_id, tree)
            message = pick.message.rstrip("\n") + "".join(f"\n{t}" for t in trailers) + "\n"
            new = write_commit(w, pick.author, committer, message, tree, [ours.id], brought)
            move_branch_ref(w, refname, new, expected_tip, worktree, "cherry-pick")
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, f"cherry-pick {str(pick.id)[:12]}", worktree) from None
    restore_files(w, worktree, str(new), f"cherry-pick {str(pick.id)[:12]}")
    return str(new)


def write_commit(
    w: Repo,
    author: pygit2.Signature,
    committer: pygit2.Signature,
    message: str,
    tree: pygit2.Oid,
    parents: list[pygit2.Oid],
    brought: Staged | list[str],
) -> pygit2.Oid:
    """A commit on no ref yet, written straight into a kept pack with ``brought`` (the objects
    its tree has that its first parent's lacks: `Staged.brings`, `staging.brings`) until a ref
    reaches it (coder.git.objects; whoever moves the ref releases it). ObjectsMissing if one of
    ``brought`` is gone."""
    wanted = brought.brings if isinstance(brought, Staged) else brought
    ids: list[str | pygit2.Oid] = list(parents)
    try:  # libgit2 checks that the tree and the parents are there
        content = cast(str, w.create_commit_string(author, committer, message, tree, ids))
    except pygit2.GitError as exc:
        if "object not found" not in str(exc):
            raise
        raise objects.gone("writing a commit", [str(tree)]) from None  # a prune took it
    return objects.write_held_commit(w, content.encode(), wanted)


@dataclass(frozen=True)
class StepCommit:
    commit: str
    step_id: str
    attempt: int
    task_id: str
    summary: str


_TRAILER_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*)\s*:\s*(.*?)\s*$")


def parse_trailers(message: str) -> dict[str, str]:
    """``Key: value`` lines of the message's last paragraph (keys lower-cased).

    Lines that are not trailers (wrapped text, stray notes) are skipped instead of voiding the
    block, so a commit amended by hand still parses.
    """
    paragraphs = re.split(r"\n[ \t]*\n", message.replace("\r\n", "\n").strip())
    if len(paragraphs) < 2:
        return {}
    found: dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        m = _TRAILER_LINE.match(line)
        if m:
            found.setdefault(m.group(1).lower(), m.group(2))
    return found


def commits_between(repo: Repo, branch: str, base_commit: str) -> list[pygit2.Commit]:
    """Commits in ``base_commit..branch``, oldest first (empty if the branch is gone)."""
    tip = branch_tip(repo, branch)
    if tip is None:
        return []
    walker = repo.walk(pygit2.Oid(hex=tip), SortMode.TOPOLOGICAL | SortMode.REVERSE)
    walker.hide(pygit2.Oid(hex=resolve_commit(repo, base_commit)))
    return list(walker)


def step_commits(repo: Repo, *, branch: str, base_commit: str, task_id: str) -> list[StepCommit]:
    """Step commits of ``task_id`` in ``base_commit..branch``, oldest first."""
    found = []
    for commit in commits_between(repo, branch, base_commit):
        t = parse_trailers(commit.message)
        if t.get(TRAILER_TASK.lower()) != task_id or TRAILER_STEP.lower() not in t:
            continue
        try:
            attempt = int(t.get(TRAILER_ATTEMPT.lower(), "1"))
        except ValueError:
            attempt = 1
        summary = commit.message.split("\n", 1)[0]
        found.append(StepCommit(str(commit.id), t[TRAILER_STEP.lower()], attempt, task_id, summary))
    return found


def effective_step_commits(
    repo: Repo, *, branch: str, base_commit: str, task_id: str
) -> list[StepCommit]:
    """The step commits that still count, oldest first: ``step_commits`` less each one undone
    by a later ``Coder-Reverts: <step>`` commit of this task (it cancels that step's newest
    commit before it). A reverted step is not done: resume runs it again."""
    effective: list[StepCommit] = []
    by_id = {
        c.commit: c
        for c in step_commits(repo, branch=branch, base_commit=base_commit, task_id=task_id)
    }
    for commit in commits_between(repo, branch, base_commit):
        if str(commit.id) in by_id:
            effective.append(by_id[str(commit.id)])
            continue
        t = parse_trailers(commit.message)
        reverted = t.get(TRAILER_REVERTS.lower())
        if t.get(TRAILER_TASK.lower()) != task_id or reverted is None:
            continue
        for i in range(len(effective) - 1, -1, -1):
            if effective[i].step_id == reverted:
                del effective[i]
                break
    return effective


def run_base(repo: Repo, branch: str, task_id: str) -> tuple[str, int] | None:
    """Where run ``task_id`` started on ``branch``, read from its commits alone: (the base
    commit, how many of the run's commits are on it). The run's commits (steps, and `coder
    revert`'s) carry ``Coder-Task: task_id`` and follow one another from the base (parallel
    steps land as cherry-picks), so the base is the first commit without it, walking first
    parents from the tip. None when the branch is missing or its tip is not the run's."""
    tip = branch_tip(repo, branch)
    if tip is None:
        return None
    commit = repo[tip].peel(pygit2.Commit)
    count = 0
    while parse_trailers(commit.message).get(TRAILER_TASK.lower()) == task_id:
        if not commit.parents:
            return None
        count += 1
        commit = commit.parents[0]
    return (str(commit.id), count) if count else None


def task_branches(repo: Repo, task_id: str) -> list[str]:
    """Local branches whose tip is a commit of run ``task_id`` (its trailers say so)."""
    return sorted(name for name in repo.branches.local if _tip_task(repo, name) == task_id)


def branch_task_ids(repo: Repo) -> list[str]:
    """The runs whose commit is the tip of their local `agent/ID-...` branch (its `Coder-Task`
    trailer): what is left of runs whose files under `.coder/` are gone."""
    found = {(name, _tip_task(repo, name)) for name in repo.branches.local}
    # named as coder names a run's branch, `agent/ID-...`: a branch the user made at a run's
    # commit under another name is never taken for the run's
    return sorted({task for name, task in found if task and name.startswith(f"agent/{task}-")})


def _tip_task(repo: Repo, branch: str) -> str | None:
    """The run whose step (or revert) commit is `branch`'s tip; None for any other commit,
    a merge's included: a branch the user made at a squash merge on main is not a run's."""
    tip = branch_tip(repo, branch)
    trailers = parse_trailers(repo[tip].peel(pygit2.Commit).message) if tip else {}
    return None if TRAILER_MERGE.lower() in trailers else trailers.get(TRAILER_TASK.lower())


def foreign_commits(repo: Repo, *, branch: str, base_commit: str, task_id: str) -> list[str]:
    """Commits on ``branch`` that are not this task's, oldest first: everything in
    ``base_commit..branch`` without ``Coder-Task: task_id`` (so its step commits and
    `coder revert`'s ``Coder-Reverts`` commits pass), plus the tip itself if the
    branch no longer contains ``base_commit`` (it was reset or rewritten). Resume refuses
    when this is non-empty, so nobody's work is discarded."""
    foreign = [
        str(c.id)
        for c in commits_between(repo, branch, base_commit)
        if parse_trailers(c.message).get(TRAILER_TASK.lower()) != task_id
    ]
    tip = branch_tip(repo, branch)
    base = resolve_commit(repo, base_commit)
    moved_off_base = tip is not None and tip != base and not repo.descendant_of(tip, base)
    if moved_off_base and tip not in foreign:
        foreign.append(str(tip))
    return foreign


def recent_subjects(repo: Repo, head: str, limit: int) -> list[str]:
    """The first lines of the newest ``limit`` commits reachable from ``head`` (by time)."""
    subjects = []
    for commit in repo.walk(head, SortMode.TIME):
        subjects.append(commit.message.split("\n", 1)[0].strip())
        if len(subjects) == limit:
            break
    return subjects


def initial_commit(path: Path, message: str, *, branch: str = "main") -> str:
    """A new repository at ``path`` whose first commit on ``branch`` holds every file there."""
    repo = pygit2.init_repository(str(path), initial_head=branch)
    who = identity(repo)
    index = repo.index
    index.add_all()
    index.write()
    tree = index.write_tree()
    return str(repo.create_commit("HEAD", who.author, who.committer, message, tree, []))


@dataclass(frozen=True)
class LogEntry:
    commit: str
    when: datetime  # the commit time, in the committer's own time zone
    subject: str


def log(repo: Repo, limit: int) -> list[LogEntry]:
    """The newest ``limit`` commits reachable from HEAD, as ``git log`` orders them; none on
    an unborn branch."""
    if repo.head_is_unborn:
        return []
    found = []
    for commit in repo.walk(repo.head.target, SortMode.TOPOLOGICAL | SortMode.TIME):
        when = datetime.fromtimestamp(
            commit.commit_time, timezone(timedelta(minutes=commit.commit_time_offset))
        )
        subject = (commit.message or "").strip().split("\n", 1)[0]
        found.append(LogEntry(str(commit.id), when, subject))
        if len(found) >= limit:
            break
    return found


def descends_from(repo: Repo, commit: str, ancestor: str) -> bool:
    """Whether ``ancestor`` is in ``commit``'s history (and not ``commit`` itself)."""
    return bool(repo.descendant_of(commit, ancestor))


def merge_base_with_head(repo: Repo, commit: str) -> str:
    """The merge base of HEAD and ``commit``."""
    return str(repo.merge_base(repo.head.target, commit))


def last_commit(repo: Repo, candidates: list[str]) -> str | None:
    """Of ``candidates`` still in the repository, the one all others lead to, or None."""
    present = [c for c in candidates if repo.get(c) is not None]
    for commit in present:
        if all(c == commit or repo.descendant_of(commit, c) for c in present):
            return commit
    return None
