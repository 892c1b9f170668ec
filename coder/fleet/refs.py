"""A run's refs on the remote, the only state its workers and coordinator share.

    refs/coder/RUN/base        the run's base commit, pushed by the coordinator when the
                               remote lacks it
    refs/coder/RUN/steps/STEP  the step's commit (parent: the step's start), pushed once by the
                               worker that ran it: compare-and-swap "must not exist", so a
                               second worker's push is refused and the first one stands

A pushed ref is the only result anyone takes: a worker killed before its push leaves nothing.

The start rule (the one definition: workers build by it, the coordinator checks by it):
start(S) is the run's base with the step commits of S's transitive dependencies
cherry-picked onto it in the task's topological order. A step with no dependencies starts
at the base. (A run here starts a level at the level's tip: for steps that do not touch
each other's files the trees are the same.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coder.errors import EnvironmentProblem
from coder.git import picks, remotes
from coder.git.commits import TRAILER_STEP, TRAILER_TASK
from coder.git.repository import Repo
from coder.taskfile import Task
from coder.taskfile.graph import ancestors, build, order


def run_prefix(run_id: str) -> str:
    return f"refs/coder/{run_id}"


def step_ref(run_id: str, step_id: str) -> str:
    return f"{run_prefix(run_id)}/steps/{step_id}"


def base_ref(run_id: str) -> str:
    return f"{run_prefix(run_id)}/base"


def fetch_run(root: Path, remote: str, run_id: str) -> dict[str, str]:
    """Fetch every ref of run `run_id` from `remote` into the repository at `root` (under the
    same names, so they keep what they reach): step id -> commit, of the steps pushed."""
    found = remotes.remote_refs(root, remote, f"{run_prefix(run_id)}/*")
    if found:
        prefix = run_prefix(run_id)
        remotes.fetch(root, remote, [f"+{prefix}/*:{prefix}/*"])
    steps = f"{run_prefix(run_id)}/steps/"
    return {name.removeprefix(steps): sha for name, sha in found.items() if name.startswith(steps)}


def is_step_commit(repo: Repo, commit: str, run_id: str, step_id: str) -> bool:
    """Whether `commit` (in `repo`) is a commit of step `step_id` of run `run_id` (trailers)."""
    said = picks.trailers_at(repo, commit)
    return (
        said is not None
        and said.get(TRAILER_TASK.lower()) == run_id
        and said.get(TRAILER_STEP.lower()) == step_id
    )


@dataclass(frozen=True)
class Pushed:
    commit: str  # what the step's ref holds now
    taken: bool  # True: another worker's, pushed first; ours was refused


def push_step(
    root: Path, repo: Repo, remote: str, run_id: str, step_id: str, commit: str
) -> Pushed:
    """Push `commit` to the step's ref, which must not exist yet. Refused because another
    worker pushed the step first: that commit (fetched) is `taken` when its trailers say it
    is this step's; anything else there is an EnvironmentProblem."""
    ref = step_ref(run_id, step_id)
    result = remotes.push(root, remote, [f"{commit}:{ref}"], lease=(ref, ""))
    if result.ok and not result.rejected(ref):
        return Pushed(commit, taken=False)
    there = remotes.remote_ref(root, remote, ref)
    if there is None:
        raise EnvironmentProblem(
            f"cannot push {ref} to {remotes.shown_url(remote)}: {result.message}"
        )
    if there == commit:  # our own push, whose answer was lost
        return Pushed(commit, taken=False)
    remotes.fetch(root, remote, [f"+{ref}:{ref}"])
    if not is_step_commit(repo, there, run_id, step_id):
        raise EnvironmentProblem(
            f"{ref} on {remotes.shown_url(remote)} holds {there[:12]}, not a commit of step "
            f"{step_id} of run {run_id}",
            hint=f"delete that ref on the remote (`git push REMOTE :{ref}`) and run the step again",
        )
    return Pushed(there, taken=True)


def push_base(root: Path, remote: str, run_id: str, commit: str) -> None:
    """The run's base on the remote (`refs/coder/RUN/base`), unless it is there already:
    workers start from it. Another base there is an EnvironmentProblem."""
    ref = base_ref(run_id)
    there = remotes.remote_ref(root, remote, ref)
    if there == commit:
        return
    if there is None:
        result = remotes.push(root, remote, [f"{commit}:{ref}"], lease=(ref, ""))
        there = commit if result.ok else remotes.remote_ref(root, remote, ref)
    if there != commit:
        raise EnvironmentProblem(
            f"{ref} on {remotes.shown_url(remote)} is {str(there)[:12]}, not this run's base "
            f"{commit[:12]}: another run of the same id pushed there",
            hint="give the run another `id:`, or delete the remote's refs/coder/ID/ refs",
        )


def start_rule(task: Task, step_id: str) -> list[str]:
    """The step's transitive dependencies in the task's topological order: what its start
    cherry-picks onto the base."""
    dag = build(task.deps())
    needed = ancestors(dag, step_id)
    return [s for s in order(dag) if s in needed]


def start_of(repo: Repo, base: str, task: Task, step_id: str, pushed: dict[str, str]) -> str:
    """The step's start in `repo` by the start rule, from its dependencies' `pushed` commits
    (step id -> commit, each in `repo`)."""
    return picks.stack(repo, base, [pushed[d] for d in start_rule(task, step_id)])
