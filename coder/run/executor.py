"""The executor: walks the task DAG and runs each step through the one step pipeline.

    start    checkpoint `running` (not fsync'd), with the branch tip the attempt starts from
    act      the step kind's runner, in the step's working directory
    verify   no process the step started still running (one that left its command's
             group would change the worktree behind the checks), .git untouched, then every
             check in steps/checks.CHECKS (asserts, protected paths, ...) on the step's
             changes, scanned and staged once (git/staging.py)
    commit   one commit of the tree verify staged, or none when it changed nothing
    record   land the commit, checkpoint the outcome, tell the schedule

A step works in the run's worktree when it runs alone, in a scratch worktree when it runs
beside others of its level, or on another machine (`RunContext.dispatch`: coder.fleet), its
batch at once (coder.run.places says how each commit lands). The landing is the
only difference: both go through `_attempts` and `_record`, with the same events.

An attempt ends `ok`, `failed` (its own command, tests or checks: retried, skipped or stopping
the run as its `on_fail` says), `cancelled` (a stop: the step runs again on resume) or
`errored` (an EnvironmentProblem: the model host gone, the branch moved, the disk full; the
run stops as `error` and the step runs again on resume). The partial changes of an attempt
that did not succeed are always discarded. The commit is the durable proof that a step is
done: `resume.reconcile` relies on it after a crash.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.crashpoints import crashpoint
from coder.errors import CoderError, EnvironmentProblem, RunFilesGone
from coder.files.durable import write_private
from coder.git import branches, diffs, repository, restore
from coder.git.guard import GitGuard
from coder.policy import reaper
from coder.policy.confine import end_leftovers
from coder.run import filesgone, success
from coder.run.candidates import Candidates
from coder.run.commitmsg import CommitParts, commit_parts
from coder.run.context import RunContext
from coder.run.notes import texts
from coder.run.places import Elsewhere, InPlace, Place, Scratch
from coder.run.records import RunStatus, SkipCause, StepRecord, now_iso, seconds_since
from coder.run.schedule import Schedule
from coder.run.settings import budget_exhausted
from coder.run.steps import StepContext, StepOutcome
from coder.run.steps.runners import runner_for
from coder.run.steps.verify import Verification, verify
from coder.taskfile.kinds import KINDS

if TYPE_CHECKING:
    from coder.git.staging import Change
    from coder.models.provider import Usage
    from coder.taskfile import Step


@dataclass(frozen=True)
class Attempted:
    """How a step's last attempt ended, before it is recorded."""

    outcome: StepOutcome
    tip: str  # the tip the attempt started from
    commit: str | None = None  # the step's commit, not landed yet for a scratch worktree
    changes: tuple[Change, ...] = ()  # what the commit changes against `tip`, as verify saw it


class Executor:
    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.task = run.task
        self.repo = repository.open_repo(run.repo_root)
        self.common_dir = repository.common_dir(self.repo)
        self.steps = {s.id: s for s in self.task.steps}
        self.schedule = Schedule(self.task, {sid: r.status for sid, r in run.state.steps.items()})
        self.halted = False
        self.error: str | None = None  # the environment problem that stopped the run
        self.gone = False  # the checkpoint was deleted under the run: nothing is written back
        self._lock = threading.RLock()
        steps = run.state.steps.values()
        self._tokens = sum(r.tokens for r in steps)  # run budgets, kept up to date
        self._seconds = sum(r.duration_s or 0 for r in steps)

    # --- state helpers ------------------------------------------------------------------

    def record(self, step_id: str) -> StepRecord:
        return self.run.state.steps[step_id]

    def checkpoint(self) -> None:
        """The whole state as a snapshot (the run's start and end). Not checked against the
        schema again, as the journal lines it folds in are not: a state read or made for the
        run was checked then, and the run changes it only through its typed records (the
        check costs 0.1 ms a step: 0.2 s at each end of a 2,000-step run)."""
        with self._lock:
            self._write(lambda: self.run.store.save(self.run.state, validate=False))

    def _write(self, write: Callable[[], None]) -> None:
        """A checkpoint write, unless the checkpoint was deleted under the run: then it stops
        (RunFilesGone naming everything of the run that vanished) and writes no more."""
        if self.gone:
            return
        try:
            write()
        except RunFilesGone:
            self.gone = True
            self._check_files(assume_state=True)  # the checkpoint at least

    def _update(self, step_id: str, *, sync: bool = True, **changes: Any) -> None:
        """Change a step's record and journal it (one line, fsync'd unless not `sync`: see
        StateStore.record)."""
        for key in ("error", "summary"):  # state is shown and logged: no secrets in it
            if isinstance(changes.get(key), str):
                changes[key] = self.run.redactor.redact(changes[key])
        with self._lock:
            record = self.record(step_id)
            if "duration_s" in changes:
                self._seconds += (changes["duration_s"] or 0) - (record.duration_s or 0)
            for key, value in changes.items():
                setattr(record, key, value)
            self._write(lambda: self.run.store.record(self.run.state, step_id, sync=sync))

    def _add_usage(self, step_id: str, usage: Usage) -> None:
        """Usage accumulates over a step's attempts (they all cost model time)."""
        with self._lock:
            record = self.record(step_id)
            self._tokens -= record.tokens
            record.usage = record.usage + usage if record.usage else usage
            self._tokens += record.tokens

    def message(self, step: Step, attempt: int, outcome: StepOutcome) -> CommitParts:
        """What the step's commit says (coder.run.commitmsg), the user's notes included."""
        return commit_parts(
            self.task, step, attempt, outcome, self.run.redactor.redact, self.notes(step)
        )

    def notes(self, step: Step) -> tuple[str, ...]:
        """The guidance notes the user gave the step so far (coder.run.notes)."""
        with self._lock:
            return texts(self.record(step.id).notes)

    def _reason(self, step_id: str, reason: str) -> None:
        with self._lock:
            self.record(step_id).reasons.append(self.run.redactor.redact(reason))

    # --- the walk -----------------------------------------------------------------------

    def execute(self) -> str:
        """Run every runnable step; returns the run's final status."""
        reaper.start()  # what a command leaves stays coder's: no kill per step to find it
        state = self.run.state
        state.status, state.pid, state.error = "running", os.getpid(), None
        self.checkpoint()
        self.run.log.info(
            "run.started",
            steps=len(self.steps),
            branch=self.run.branch,
            worktree=str(self.run.worktree),
            max_parallel=self.run.settings.max_parallel,  # a level at once (coder.models.slots)
        )
        try:
            self._skip_required(self.schedule.blocked)
            self._walk()
        except EnvironmentProblem as exc:
            self._stop_for(exc.stopped_with)
        return self._finish()

    def _walk(self) -> None:
        while not self.halted and not self.run.stop.is_set():
            asks = self.run.approve is not None or self.run.approve_edit is not None
            # one at a time while someone is asked
            batch = self.schedule.take(1 if asks else self.run.settings.max_parallel)
            if not batch:
                return
            exhausted = budget_exhausted(self.run.settings, self._tokens, self._seconds)
            if exhausted:  # the batch stays pending
                self.run.state.error = exhausted
                self.run.log.error("run.budget_exhausted", reason=exhausted)
                self.halted = True
                return
            if self.run.approve is not None and not self._approved(self.steps[batch[0]]):
                continue
            if len(batch) == 1 and self.run.dispatch is None:
                step = self.steps[batch[0]]
                place: Place = InPlace(self.run, self._tip, self.message)
                if step.candidates > 1:
                    place = Candidates(self.run, self.repo, self._tip, self._tip, self.message)
                self._record(step, self._attempts(step, place), place)
            else:
                self._run_level([self.steps[s] for s in batch])

    def _approved(self, step: Step) -> bool:
        """Interactive mode: ask before a step that writes or runs something (not before a
        read-only kind, such as analyze). A skipped step is recorded as skipped by the user;
        quitting stops the run as `coder stop` would, so `coder resume` can continue it."""
        if KINDS[step.kind].read_only:
            return True
        assert self.run.approve is not None
        decision = self.run.approve(step, self.run)
        if decision == "run":
            return True
        if decision == "skip":
            self._skip(step.id, "user", "skipped by the user at the approval prompt")
        else:
            self.run.log.warning("run.stop_requested", reason="quit at the approval prompt")
            self.run.stop.set()
        return False

    def _run_level(self, steps: list[Step]) -> None:
        """Independent steps run concurrently, each in its own scratch worktree from the same
        tip; their commits then land in file order, so the history is the same whatever
        finished first."""
        tip = self._tip()
        places: dict[str, Place] = {}
        try:
            for step in steps:
                places[step.id] = (
                    Elsewhere(self.run, step, tip, self._tip)
                    if self.run.dispatch is not None
                    else Candidates(self.run, self.repo, lambda: tip, self._tip, self.message)
                    if step.candidates > 1
                    else Scratch(self.run, self.repo, step, tip, self._tip, self.message)
                )
            attempts = self._attempts if self.run.dispatch is None else self._elsewhere
            try:
                with ThreadPoolExecutor(max_workers=len(steps)) as pool:
                    futures = {s.id: pool.submit(attempts, s, places[s.id]) for s in steps}
                    results = {sid: f.result() for sid, f in futures.items()}
            finally:  # every step of the level is done: what the run's MCP servers started
                end_leftovers(self.run.worktree)  # (confined to its worktree) ends with them
            for step in steps:
                done = results[step.id]
                if self.halted and done.outcome.ok:  # an earlier step of the level failed
                    self._reason(
                        step.id,
                        "finished, but not landed: an earlier step of its level "
                        "failed; runs again on resume",
                    )
                    self._update(step.id, status="pending", ended_at=now_iso())
                    continue
                self._record(step, done, places[step.id])
        finally:
            for place in places.values():
                if isinstance(place, Scratch):  # a round removes its candidates' own
                    place.remove()

    # --- the step pipeline --------------------------------------------------------------

    def _attempts(self, step: Step, place: Place) -> Attempted:
        """Start, act, verify and commit, again while the step's retries allow."""
        failures = 0
        while True:
            tip = place.start()
            attempt = self._start(step, tip)
            try:
                with self._files_kept(place.workdir):
                    outcome, commit, changes = self._try(step, place, attempt, tip)
            except EnvironmentProblem as exc:
                return Attempted(StepOutcome(False, exc.stopped_with, errored=True), tip)
            if outcome.result != "failed" or self.run.stop.is_set():
                return Attempted(outcome, tip, commit, changes)
            failures += 1
            if failures > self.task.retries(step):
                return Attempted(outcome, tip)
            self._reason(
                step.id,
                f"attempt {attempt} failed: {outcome.error}; retrying "
                f"({failures} of {self.task.retries(step)} retries)",
            )
            self.run.log.warning(
                "step.retry", step_id=step.id, attempt=attempt, error=outcome.error or ""
            )

    def _elsewhere(self, step: Step, place: Place) -> Attempted:
        """The step run on another machine (RunContext.dispatch), recorded as if here."""
        assert self.run.dispatch is not None
        tip = place.start()
        self._start(step, tip)
        outcome, commit, attempts = self.run.dispatch(step, tip)
        if outcome.usage:
            self._add_usage(step.id, outcome.usage)
        self._update(step.id, sync=False, attempts=max(attempts, 1))
        return Attempted(outcome, tip, commit)

    def _try(
        self, step: Step, place: Place, attempt: int, tip: str
    ) -> tuple[StepOutcome, str | None, tuple[Change, ...]]:
        """One attempt in its place, or a round of candidates at once, judged
        (coder.run.candidates): the winner's outcome, commit and changes."""
        if not isinstance(place, Candidates):
            return self._attempt(step, place, attempt, tip)
        done = place.run_round(step, tip, attempt, lambda p: self._attempt(step, p, attempt, tip))
        self._update(step.id, candidates=done.records)
        if done.usage:  # the judge's request (`judge: model`) is the step's too
            self._add_usage(step.id, done.usage)
        done.log(self.run.log, step.id, attempt)
        return done.outcome, done.commit, done.changes

    def _start(self, step: Step, tip: str) -> int:
        self._check_files()  # no step starts on a run whose files were deleted
        with self._lock:
            attempt = self.record(step.id).attempts + 1
            self._update(
                step.id,
                # not fsync'd: a kill keeps it (the page cache outlives coder), and a power
                # loss that drops it drops the step's unsynced files too; resume finds them
                # against git (runs.reconcile) and reruns the step
                sync=False,
                status="running",
                attempts=attempt,
                start_tip=tip,
                started_at=now_iso(),
                ended_at=None,
                error=None,
            )
        self.run.log.info(
            "step.started", step_id=step.id, attempt=attempt, kind=step.kind, goal=step.goal
        )
        crashpoint("before_step", step.id)
        return attempt

    def _attempt(
        self, step: Step, place: Place, attempt: int, tip: str
    ) -> tuple[StepOutcome, str | None, tuple[Change, ...]]:
        """One attempt: act, verify, then commit what it did or discard it (the outcome, the
        commit, its changes)."""
        guard = GitGuard.take(self.common_dir, place.workdir, head=place.head(tip))
        started = time.monotonic()
        acted = self._act(step, place.workdir, attempt, place.candidate)
        end_leftovers(place.workdir)
        self._check_files(place.workdir)  # deleted while it ran: nothing to check or commit
        seen = Verification(step, place.workdir, self.run.settings, tip)
        # what it cost stays with the outcome whatever verify found (a round's judge weighs it)
        outcome = replace(verify(seen, acted, guard, self.task.id), usage=acted.usage)
        self.run.log.debug(
            "step.acted",
            step_id=step.id,
            ok=outcome.ok,
            duration_s=round(time.monotonic() - started, 3),
        )
        if not outcome.ok:
            restore.discard_changes(place.workdir, tip)
            return outcome, None, ()
        crashpoint("after_checks", step.id)
        commit = place.commit(step, attempt, outcome, seen)
        return outcome, commit, seen.staged.changes if commit else ()

    def _act(
        self, step: Step, workdir: Path, attempt: int, candidate: int | None = None
    ) -> StepOutcome:
        """The step kind's runner. A CoderError it raises is the step's own failure (its
        command refused, no test command, ...), except an EnvironmentProblem: that errors."""
        ctx = StepContext(
            task=self.task,
            step=step,
            workdir=workdir,
            attempt=attempt,
            settings=self.run.settings,
            artifacts=self.run.artifacts,
            cancel=self.run.stop,
            log=self.run.log.bind(step_id=step.id),
            redactor=self.run.redactor,
            owner=self.run.owner,
            agent=self.run.agent,
            previous_error=self.record(step.id).error,
            approve_edit=self.run.approve_edit,
            notes=self.notes(step),
            candidate=candidate,
        )
        try:
            outcome = runner_for(step.kind)(ctx)
        except EnvironmentProblem:
            raise
        except CoderError as exc:
            outcome = StepOutcome(False, exc.message)
        if outcome.usage:
            self._add_usage(step.id, outcome.usage)
        if outcome.protocol:  # journaled with the step's next transition, as usage is
            with self._lock:
                self.record(step.id).tool_protocol = outcome.protocol
        for note in outcome.notes:
            self._reason(step.id, note)
        return outcome

    def _record(self, step: Step, done: Attempted, place: Place) -> None:
        """Land the step's commit and checkpoint how the step ended."""
        outcome = done.outcome
        if outcome.errored:
            self._errored(step, outcome.error or "environment problem", place.workdir, done.tip)
            return
        if not outcome.ok and (outcome.cancelled or self.run.stop.is_set()):
            self._interrupted(step, outcome)
            return
        if not outcome.ok:
            self._fail(step, outcome)
            return
        try:
            landed, parent = place.land(done.commit, done.tip)
        except EnvironmentProblem as exc:
            self._errored(step, exc.stopped_with, None, done.tip)
            return
        except CoderError as exc:  # parallel steps edited the same lines
            self._fail(step, StepOutcome(False, exc.message))
            return
        crashpoint("after_commit", step.id)
        # the commit landed as it was made, on the tip it was made on: its diff is what
        # verify staged (no second walk of the trees for the diff artifact)
        same = landed == done.commit and parent == done.tip
        self._succeed(step, outcome, landed, parent, done.changes if same else None)

    def _tip(self) -> str:
        tip = branches.branch_tip(self.repo, self.run.branch)
        if tip is None:
            raise EnvironmentProblem(f"branch {self.run.branch} disappeared during the run")
        return tip

    # --- how a step ended ---------------------------------------------------------------

    def _succeed(
        self,
        step: Step,
        outcome: StepOutcome,
        commit: str | None,
        parent: str,
        changes: tuple[Change, ...] | None = None,
    ) -> None:
        if commit:
            patch = (
                diffs.step_patch(self.repo, parent, commit)
                if changes is None
                else diffs.changes_patch(self.repo, changes)
            )
            write_private(self.run.artifacts / f"{step.id}.diff", self.run.redactor.redact(patch))
        self._update(
            step.id,
            sync=commit is None,  # a commit on the branch is the step's durable proof
            status="success",
            commit=commit,
            ended_at=now_iso(),
            duration_s=self._duration(step.id),
            summary=outcome.summary,
            tests=outcome.tests,
            error=None,
        )
        self.run.log.info(
            "step.succeeded", step_id=step.id, commit=commit or "", summary=outcome.summary or ""
        )
        self._skip_required(self.schedule.resolve(step.id, "success"))

    def _fail(self, step: Step, outcome: StepOutcome) -> None:
        error = outcome.error or "failed"
        if step.strategy == "skip" and not self.run.settings.fail_fast:
            self._skip(
                step.id,
                "failed",
                f"skipped after failing: {error} (on_fail: skip)",
                error=error,
                duration_s=self._duration(step.id),
                tests=outcome.tests,
            )
            return
        if step.strategy == "fix_and_retry" and self.run.agent is None:
            self._reason(
                step.id,
                "fix_and_retry needs a model and this run has none (no model "
                "steps); stopped as revert_and_stop",
            )
        self._update(
            step.id,
            status="failed",
            ended_at=now_iso(),
            error=error,
            duration_s=self._duration(step.id),
            tests=outcome.tests,
        )
        self.run.log.error("step.failed", step_id=step.id, error=error, strategy=step.strategy)
        self.halted = True

    def _skip(self, step_id: str, cause: SkipCause, reason: str, **fields: Any) -> None:
        """Record a skip by the step's own on_fail or by the user, and go on after it."""
        self._mark_skipped(step_id, cause, reason, **fields)
        self._skip_required(self.schedule.resolve(step_id, "skipped"))

    def _skip_required(self, blocked: list[tuple[str, str]]) -> None:
        for step_id, required in blocked:
            self._mark_skipped(
                step_id, "requirement", f"skipped: depends on skipped step {required}"
            )

    def _mark_skipped(self, step_id: str, cause: SkipCause, reason: str, **fields: Any) -> None:
        self._reason(step_id, reason)
        self._update(step_id, status="skipped", skip_cause=cause, ended_at=now_iso(), **fields)
        level = self.run.log.warning if cause == "failed" else self.run.log.info
        level("step.skipped", step_id=step_id, reason=fields.get("error") or reason, cause=cause)

    def _interrupted(self, step: Step, outcome: StepOutcome) -> None:
        self._reason(
            step.id,
            f"interrupted: {outcome.error or 'stop requested'}; its changes were "
            "discarded and `coder resume` runs it again",
        )
        self._update(
            step.id,
            status="interrupted",
            ended_at=now_iso(),
            duration_s=self._duration(step.id),
            error=outcome.error,
        )
        self.run.log.warning("step.interrupted", step_id=step.id)

    def _errored(self, step: Step, error: str, workdir: Path | None, tip: str) -> None:
        """An environment problem stopped the step: not its failure. Its changes are
        discarded when git still lets us (a deleted worktree took them along); otherwise it
        stays `running`, and resume discards them as after a crash. Either way `coder resume`
        runs it again."""
        try:
            if workdir is not None and workdir.is_dir():
                restore.discard_changes(workdir, tip)
        except EnvironmentProblem:
            self._reason(step.id, f"stopped by an environment problem: {error}")
        else:
            self._reason(
                step.id,
                f"stopped by an environment problem: {error}; its changes were discarded "
                "and `coder resume` runs it again",
            )
            self._update(
                step.id,
                status="interrupted",
                ended_at=now_iso(),
                duration_s=self._duration(step.id),
                error=error,
            )
        self.run.log.error("step.errored", step_id=step.id, error=error)
        self._stop_for(error)

    def _check_files(self, workdir: Path | None = None, *, assume_state: bool = False) -> None:
        filesgone.check(self.run, workdir, assume_state=assume_state)

    @contextmanager
    def _files_kept(self, workdir: Path) -> Iterator[None]:
        """An OSError of what it wraps is RunFilesGone when the run's files were deleted (a
        file of the run's vanished mid-way through an attempt's pipeline)."""
        try:
            yield
        except OSError:
            self._check_files(workdir)
            raise

    def _stop_for(self, error: str) -> None:
        self.halted = True
        if self.error is None:
            self.error = error

    def _duration(self, step_id: str) -> float | None:
        started = self.record(step_id).started_at
        return seconds_since(started) if started else None

    # --- the end of the run ---------------------------------------------------------------

    def _finish(self) -> str:
        crashpoint("before_finish")
        status, error = self._verdict()
        state = self.run.state
        state.status = status
        state.error = self.run.redactor.redact(error) if error else None
        try:
            self.checkpoint()
        except RunFilesGone as exc:  # deleted after the last step: the run ends on that
            self._stop_for(exc.stopped_with)
            status, error = "error", self.error
            state.status, state.error = status, self.run.redactor.redact(self.error or "")
        note = state.skipped_note()
        self.run.log.info("run.finished", status=status, error=error or "", skipped=note or "")
        return status

    def _verdict(self) -> tuple[RunStatus, str | None]:
        """The run's status and what went wrong: an environment problem first (the run is not
        judged then), a failed step, a stop, steps left over, no step done, red criteria."""
        if self.error is not None:
            return "error", self.error
        records = self.run.state.steps
        failed = [sid for sid, r in records.items() if r.status == "failed"]
        if failed:
            return "failed", f"step {failed[0]} failed: {records[failed[0]].error}"
        if self.run.stop.is_set() or any(r.status == "interrupted" for r in records.values()):
            return "interrupted", None
        if any(r.status in ("pending", "running") for r in records.values()):
            return "failed", self.run.state.error or "some steps could not run"
        if not any(r.status == "success" for r in records.values()):
            return "failed", f"no step did its work ({self.run.state.skipped_note()})"
        try:
            problems = success.run_problems(self.run)
        except EnvironmentProblem as exc:
            return "error", exc.stopped_with
        return ("failed", "; ".join(problems)) if problems else ("success", None)
