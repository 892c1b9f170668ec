"""Undoing the end of a run: `coder revert -t ID --to-step sX [--mode revert|reset]`.

The branch goes back to the state right after step sX (`--to-step base`: where the run
started, unless a step is named `base`), and every later step becomes `pending`
again (attempts kept, the reason recorded), with the run `interrupted`, so `coder resume` redoes
them. Git decides what "right after sX" is: the *cut* is the newest commit, in branch order, of
sX or of a step before it in DAG order (the run's base when there is none); every step commit
after the cut is undone. Steps after sX in DAG order that keep no commit become pending too
(they may have built on undone work, or changed nothing, or were skipped).

    revert  one new commit per undone step commit, newest first (history kept), each with the
            trailers `Coder-Task: ID` and `Coder-Reverts: STEP` and no `Coder-Step`, so it is
            never taken for a step's own commit (`commits.effective_step_commits` in coder.git).
    reset   the branch moves back to the cut; the old tip stays in the reflog and in the
            pending steps' reasons.

The protocol; `kill -9` anywhere leaves something a second `coder revert` with the same
arguments (or `coder resume`) finishes:

1. Under the task lock, refuse (changing nothing) an unknown step, a merged run, commits on
   the branch coder did not make, and uncommitted changes in the worktree that are not coder's
   (a runner killed mid-step, or a revert killed before its files were updated, are coder's).
2. Revert mode builds the chain of revert commits in memory, on no branch.
3. One ref move, compare-and-swap against the tip seen in step 1, with a reflog message
   starting "coder: revert": the branch holds either all of the undo or none of it.
4. The worktree's files follow the branch.
5. The state marks the later steps pending, last. A second revert finds nothing left to undo
   in git and finishes the state; resume also recognises the worktree of step 4 left behind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coder.crashpoints import crashpoint
from coder.errors import CoderError, EnvironmentProblem, InvalidInput, MergedRun
from coder.git import branches, repository, restore, workdir
from coder.git import commits as gitcommits
from coder.git import land as gitland
from coder.run import notes
from coder.run.eventlog import EventLog
from coder.run.manifest import Manifest
from coder.run.opened import OpenRun, open_run
from coder.run.secrets import view_redactor
from coder.services.merge import tag_name
from coder.taskfile import graph

MODES = ("revert", "reset")
START = "base"  # `--to-step base`: back where the run started, every step to do again


@dataclass(frozen=True)
class RevertPlan:
    cut: str  # the commit whose tree the branch ends with
    undo: tuple[gitcommits.StepCommit, ...]  # step commits after the cut, oldest first
    pending: tuple[str, ...]  # steps to run again, DAG order


@dataclass(frozen=True)
class RevertResult:
    task_id: str
    to_step: str
    mode: str
    outcome: str  # reverted (the branch moved now) | already_there
    branch: str
    previous_tip: str  # the branch before this call
    tip: str  # the branch now
    target: str  # the commit whose tree the branch now has (the cut)
    undone: tuple[str, ...] = ()  # steps whose commits were undone now, newest first
    note_step: str | None = None  # the step the note given went to
    revert_commits: tuple[str, ...] = ()  # revert mode: the commits made, in order
    pending: tuple[str, ...] = ()  # steps this call marked pending again, DAG order
    finished: tuple[str, ...] = ()  # what this call completed of an interrupted revert
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def revert_run(
    task_id: str,
    *,
    cwd: Path,
    to_step: str,
    mode: str = "revert",
    note: str | None = None,
    note_step: str | None = None,
) -> RevertResult:
    """Bring run `task_id` back to the state right after `to_step` (see the module docstring).
    `note`: guidance for the next attempt of `note_step` (default: the first step a model
    works on that runs again), checked before anything changes (coder.run.notes)."""
    if mode not in MODES:
        raise InvalidInput(f"unknown revert mode {mode!r}", hint=f"use one of: {', '.join(MODES)}")
    stop = f"stop it first with `coder stop -t {task_id}`"
    with open_run(cwd, task_id, holder="revert", hint=stop) as run:
        order = step_order(run.manifest)
        if to_step not in order and to_step != START:
            raise InvalidInput(
                f"run {task_id} has no step {to_step!r} (its steps: {', '.join(order)}; "
                f"`{START}`: before the first)"
            )
        with EventLog(run.coder_dir, task_id) as log:
            job = _Revert(run, order, to_step, mode)
            job.note = (note_step, note) if note is not None else None
            try:
                result = job.run()
            except CoderError as exc:
                log.warning("revert.refused", to_step=to_step, mode=mode, error=exc.message)
                raise
            log.info(
                f"revert.{result.outcome}",
                to_step=to_step,
                mode=mode,
                previous_tip=result.previous_tip,
                commit=result.tip,
                undone=",".join(result.undone),
                pending=",".join(result.pending),
            )
            return result


def step_order(manifest: Manifest) -> list[str]:
    """The run's steps in DAG order (the executor's order)."""
    return graph.order(graph.build(manifest.task.deps()))


def plan_revert(
    order: list[str], to_step: str, commits: list[gitcommits.StepCommit], start_commit: str
) -> RevertPlan:
    """What to undo: `commits` are the effective step commits in branch order; with none kept
    the cut is `start_commit`, where the run's work begins (its base, or its commit of the
    checkout's uncommitted changes, which no revert undoes)."""
    upto = set(order[: order.index(to_step) + 1]) if to_step in order else set()  # START
    last = max((i for i, c in enumerate(commits) if c.step_id in upto), default=-1)
    cut = commits[last].commit if last >= 0 else start_commit
    kept = {c.step_id for c in commits[: last + 1]}
    pending = tuple(s for s in order if s not in upto and s not in kept)
    return RevertPlan(cut, tuple(commits[last + 1 :]), pending)


def revert_message(task_id: str, to_step: str, undone: gitcommits.StepCommit) -> str:
    """Like `git revert`'s, with coder's trailers (and no Coder-Step) as the last paragraph."""
    title = f'Revert "{undone.summary}"'
    body = (
        f"This reverts commit {undone.commit} (step {undone.step_id}, attempt "
        f"{undone.attempt}): `coder revert --to-step {to_step}`."
    )
    trailers = (
        f"{gitcommits.TRAILER_TASK}: {task_id}\n{gitcommits.TRAILER_REVERTS}: {undone.step_id}\n"
    )
    return "\n\n".join([title, body, trailers])


class _Revert:
    """One `revert_run` call: the run's facts and the steps of the protocol."""

    def __init__(self, run: OpenRun, order: list[str], to_step: str, mode: str) -> None:
        self.opened, self.repo, self.coder_dir = run, run.repo, run.coder_dir
        self.manifest, self.store, self.state = run.manifest, run.store, run.state
        self.order, self.to_step, self.mode = order, to_step, mode
        self.task_id: str = run.task_id
        self.branch: str = run.manifest.branch
        self.worktree = run.manifest.worktree_path
        self.warnings: list[str] = []
        self.finished: list[str] = []
        self.note: tuple[str | None, str] | None = None  # (its step or None, its text)

    def run(self) -> RevertResult:
        self._refuse_merged()
        tip = self._tip()
        self._refuse_foreign()
        commits = gitcommits.effective_step_commits(
            self.repo,
            branch=self.branch,
            base_commit=self.manifest.base_commit,
            task_id=self.task_id,
        )
        plan = plan_revert(self.order, self.to_step, commits, self.manifest.start_commit)
        note_step = self._note_target(plan)  # a bad note changes nothing
        self.warnings += self.opened.repair_worktree(tip)  # what resume repairs too
        self._settle_worktree(tip)
        moves = plan.cut != tip if self.mode == "reset" else bool(plan.undo)
        new_tip, made = self._move(plan, tip) if moves else (tip, ())
        undone = tuple(c.step_id for c in reversed(plan.undo)) if moves else ()
        was = (
            tip
            if moves
            else gitland.landed_from_reflog(
                self.repo, self.branch, tip, prefix=gitcommits.REFLOG_REVERT
            )
        )
        pending = self._mark_pending(plan, {c.step_id for c in plan.undo}, was, note_step)
        return RevertResult(
            task_id=self.task_id,
            to_step=self.to_step,
            mode=self.mode,
            outcome="reverted" if moves else "already_there",
            branch=self.branch,
            previous_tip=tip,
            tip=new_tip,
            target=plan.cut,
            undone=undone,
            revert_commits=made,
            pending=pending,
            finished=tuple(self.finished),
            warnings=tuple(self.warnings),
            note_step=note_step,
        )

    def _note_target(self, plan: RevertPlan) -> str | None:
        """The step the note goes to: of those that run again once the revert is done."""
        if self.note is None:
            return None
        task = self.manifest.task
        later = notes.will_run(task, self.state, also=plan.pending)
        notes.checked_text(self.note[1])
        return notes.target(task, later, self.note[0])

    # --- refusals ----------------------------------------------------------------------------

    def _refuse_merged(self) -> None:
        record = self.state.merge or {}
        tag = tag_name(self.task_id)
        commit = record.get("commit") or self._tagged(tag)
        if not commit:
            return
        base = record.get("base") or self.manifest.base
        undo = {
            "no-ff": f"git revert -m 1 {tag}",
            "ff-only": f"git revert --no-edit {self.manifest.base_commit[:12]}..{tag}",
        }
        how = undo.get(record.get("mode", ""), f"git revert {tag}")
        raise MergedRun(
            f"run {self.task_id} was merged into {base} at {commit[:12]}; revert the "
            f"merge on {base} instead ({how})"
        )

    def _tagged(self, tag: str) -> str | None:
        """The commit tag coder/ID names, if it is this run's merge: `coder merge` moves base
        and tag together, so a tag without a recorded merge is a merge killed before its
        checkpoint. A tag older than the run's base is an earlier run's of the same id."""
        if gitland.ref_target(self.repo, f"refs/tags/{tag}") is None:
            return None
        commit = branches.resolve_commit(self.repo, f"refs/tags/{tag}")
        base_commit = self.manifest.base_commit
        return None if gitland.is_ancestor(self.repo, commit, base_commit) else commit

    def _tip(self) -> str:
        tip = branches.branch_tip(self.repo, self.branch)
        if tip is None:
            raise EnvironmentProblem(
                f"branch {self.branch} of run {self.task_id} no longer "
                "exists; there is nothing to revert",
                hint=f"remove the run with `coder clean -t {self.task_id}`",
            )
        return tip

    def _refuse_foreign(self) -> None:
        self.opened.refuse_foreign_commits(
            refusing="refusing to revert so none of that work is lost",
            hint=f"move those commits to another branch and reset {self.branch} to its last "
            "coder commit, then revert again",
        )

    # --- the worktree ------------------------------------------------------------------------

    def _settle_worktree(self, tip: str) -> None:
        """Uncommitted changes are refused unless they are coder's own to throw away."""
        if workdir.is_clean(self.worktree):
            return
        if gitland.left_behind_at(self.repo, self.worktree, reflog_prefix=gitcommits.REFLOG_REVERT):
            restore.discard_changes(self.worktree, tip)  # an earlier revert was killed mid-way
            self.finished.append("worktree")
            return
        running = [s for s, st in self.state.steps.items() if st.status == "running"]
        if running:  # the lock is ours, so that runner is dead: resume would discard them too
            restore.discard_changes(self.worktree, tip)
            self.warnings.append(
                f"discarded the partial changes of step {running[0]}, which "
                "was running when its runner was killed"
            )
            return
        changed = workdir.changed_paths(self.worktree)
        raise EnvironmentProblem(
            f"the worktree {self.worktree} has changes coder did not make "
            f"({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''}); refusing to "
            "revert so they are not lost",
            hint=f"commit or stash them elsewhere (e.g. `git -C {self.worktree} stash -u`), "
            "then revert again",
        )

    # --- moving the branch -------------------------------------------------------------------

    def _move(self, plan: RevertPlan, tip: str) -> tuple[str, tuple[str, ...]]:
        """Steps 2-4: the new tip and the revert commits made (none in reset mode)."""
        target, made = tip, []
        if self.mode == "reset":
            target = plan.cut
        else:
            for undone in reversed(plan.undo):
                target = gitland.write_revert(
                    self.repo,
                    undone.commit,
                    onto=target,
                    message=revert_message(self.task_id, self.to_step, undone),
                )
                made.append(target)
        crashpoint("revert_before_ref")
        branches.move_branch(
            self.worktree,
            target,
            branch=self.branch,
            expected_tip=tip,
            message=f"{gitcommits.REFLOG_REVERT} {self.task_id} to {self.to_step} ({self.mode})",
        )
        crashpoint("revert_after_ref")
        restore.discard_changes(self.worktree, target)
        crashpoint("revert_after_worktree")
        return target, tuple(made)

    # --- the state ---------------------------------------------------------------------------

    def _mark_pending(
        self, plan: RevertPlan, undone: set[str], was: str | None, note_step: str | None
    ) -> tuple[str, ...]:
        """Step 5: the steps after the cut run again (`note_step` gets the note); returns
        those whose state changed."""
        reason = f"reverted by `coder revert --to-step {self.to_step}` ({self.mode})"
        if self.mode == "reset" and was:
            reason += f"; the branch was at {was}, kept in its reflog"
        changed = []
        for step_id in plan.pending:
            st = self.state.steps[step_id]
            if st.status == "pending" and not st.commit and step_id not in undone:
                continue
            st.status, st.commit, st.error = "pending", None, None
            st.reasons.append(reason)
            changed.append(step_id)
        if changed:
            self.state.status, self.state.error, self.state.pid = "interrupted", None, None
        if note_step is not None and self.note is not None:
            redactor = view_redactor(repository.repo_root(self.repo), [self.worktree])
            notes.give(self.state, note_step, self.note[1], via="revert", redactor=redactor)
        if changed or note_step is not None:
            self.store.save(self.state)
        return tuple(changed)
