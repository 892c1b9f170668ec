"""The scheduler: walks the task DAG and runs each step through the step protocol.

For each ready step: checkpoint `running` (with the branch tip it starts from), act, verify,
commit (the branch moves only if it is still at that tip), checkpoint `success`. A step that
fails is retried, skipped or stops the run, as its `on_fail` says; its partial changes are
always discarded. The commit is the durable proof that a step is done: `runs.reconcile` relies
on it after a crash.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import graph
from coder.crashpoints import crashpoint
from coder.errors import CoderError
from coder.git import ops as gitops
from coder.run.state import now_iso
from coder.run.steps import StepContext, StepOutcome, runner_for
from coder.run.steps.checks import GitGuard, failed_asserts, protected_paths_changed

if TYPE_CHECKING:
    from coder.config import Config
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.run.events import EventLog
    from coder.run.state import StateStore
    from coder.taskfile import Step, Task


@dataclass
class RunContext:
    """Everything one run needs; built by `coder.run.runs` for `run` and `resume`."""

    task: Task
    repo_root: Path
    coder_dir: Path
    worktree: Path
    state: dict[str, Any]
    store: StateStore
    log: EventLog
    policy: Policy
    config: Config
    redactor: Redactor
    max_parallel: int = 1
    fail_fast: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    agent: Any = None  # steps.model.AgentSession when the task has model steps
    # interactive mode: asked before each step that writes or runs; "run" | "skip" | "quit"
    approve: Callable[[Step, RunContext], str] | None = None

    @property
    def branch(self) -> str:
        return str(self.state["branch"])

    @property
    def artifacts(self) -> Path:
        return self.coder_dir / "artifacts" / self.task.id

    @property
    def owner(self) -> str:
        """Carried by every command of the run, so a resume can end those a crash left."""
        from coder.policy.sandbox import owner_token

        return owner_token(self.coder_dir, self.task.id)


class Executor:
    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.task = run.task
        self.repo = gitops.open_repo(run.repo_root)
        self.common_dir = gitops.common_dir(self.repo)
        self.dag = graph.build(self.task.deps())
        self.order = graph.order(self.dag)
        self.steps = {s.id: s for s in self.task.steps}
        self.halted = False
        self._lock = threading.RLock()

    # --- state helpers ------------------------------------------------------------------

    def step_state(self, step_id: str) -> dict[str, Any]:
        return self.run.state["steps"][step_id]  # type: ignore[no-any-return]

    def status(self, step_id: str) -> str:
        return str(self.step_state(step_id)["status"])

    def checkpoint(self, *, validate: bool = False) -> None:
        with self._lock:
            self.run.store.save(self.run.state, validate=validate)

    def _update(self, step_id: str, **fields: Any) -> None:
        for key in ("error", "summary"):  # state is shown and logged: no secrets in it
            if isinstance(fields.get(key), str):
                fields[key] = self.run.redactor.redact(fields[key])
        with self._lock:
            self.step_state(step_id).update(fields)
            self.checkpoint()

    def _add_usage(self, step_id: str, usage: dict[str, Any]) -> None:
        """Usage accumulates over a step's attempts (they all cost model time)."""
        keys = ("calls", "prompt_tokens", "eval_tokens", "prompt_s", "eval_s", "load_s", "total_s")
        with self._lock:
            total = self.step_state(step_id).get("usage") or dict.fromkeys(keys, 0)
            self.step_state(step_id)["usage"] = {
                k: round(total.get(k, 0) + usage.get(k, 0), 6)
                if isinstance(usage.get(k, 0), float)
                else total.get(k, 0) + usage.get(k, 0)
                for k in keys
            }

    def _reason(self, step_id: str, reason: str) -> None:
        with self._lock:
            self.step_state(step_id).setdefault("reasons", []).append(
                self.run.redactor.redact(reason)
            )

    # --- the walk -----------------------------------------------------------------------

    def execute(self) -> str:
        """Run every runnable step; returns the run's final status."""
        self.run.state.update(status="running", pid=os.getpid(), error=None)
        self.checkpoint(validate=True)
        self.run.log.info(
            "run.started",
            steps=len(self.order),
            branch=self.run.branch,
            worktree=str(self.run.worktree),
        )
        while not self.halted and not self.run.stop.is_set():
            self._skip_blocked()
            ready = [
                s
                for s in self.order
                if self.status(s) == "pending"
                and all(self.status(d) == "success" for d in self.steps[s].depends_on)
            ]
            if not ready:
                break
            exhausted = self._run_budget_exhausted()
            if exhausted:
                self.run.state["error"] = exhausted
                self.run.log.error("run.budget_exhausted", reason=exhausted)
                self.halted = True
                break
            batch = ready[: self.run.max_parallel if self.run.approve is None else 1]
            if self.run.approve is not None and not self._approved(self.steps[batch[0]]):
                continue
            if len(batch) == 1:
                self._run_in_place(self.steps[batch[0]])
            else:
                self._run_batch([self.steps[s] for s in batch])
        return self._finish()

    def _approved(self, step: Step) -> bool:
        """Interactive mode: ask before a step that writes or runs something (analyze steps
        only read). A skipped step is recorded as skipped by the user; quitting stops the run
        as `coder stop` would, so `coder resume` can continue it."""
        if step.kind == "analyze":
            return True
        assert self.run.approve is not None
        decision = self.run.approve(step, self.run)
        if decision == "run":
            return True
        if decision == "skip":
            self._reason(step.id, "skipped by the user at the approval prompt")
            self._update(step.id, status="skipped", ended_at=now_iso())
            self.run.log.info("step.skipped", step_id=step.id, reason="skipped by the user")
        else:
            self.run.log.warning("run.stop_requested", reason="quit at the approval prompt")
            self.run.stop.set()
        return False

    def _run_budget_exhausted(self) -> str | None:
        """The run-wide budgets (taskfile policies, else config), checked between steps."""
        from coder.taskfile import parse_duration

        policies, cfg = self.task.policies, self.run.config
        max_tokens = policies.get("run_max_tokens", cfg.get("run_max_tokens"))
        timeout = policies.get("run_timeout", cfg.get("run_timeout"))
        steps = self.run.state["steps"].values()
        used = sum(
            (s.get("usage") or {}).get("prompt_tokens", 0)
            + (s.get("usage") or {}).get("eval_tokens", 0)
            for s in steps
        )
        spent = sum(s.get("duration_s") or 0 for s in steps)
        if max_tokens is not None and used >= int(max_tokens):
            return f"run token budget exhausted ({used} of {max_tokens} tokens)"
        if timeout is not None and spent >= parse_duration(timeout):
            return f"run time budget exhausted ({spent:.0f}s of {parse_duration(timeout)}s)"
        return None

    def _skip_blocked(self) -> None:
        for sid in self.order:
            if self.status(sid) != "pending":
                continue
            skipped = [d for d in self.steps[sid].depends_on if self.status(d) == "skipped"]
            if skipped:
                reason = f"skipped: depends on skipped step {skipped[0]}"
                self._reason(sid, reason)
                self._update(sid, status="skipped", ended_at=now_iso())
                self.run.log.info("step.skipped", step_id=sid, reason=reason)

    # --- one step, in the run's worktree ------------------------------------------------

    def _run_in_place(self, step: Step) -> None:
        failures = 0
        while True:
            tip = self._tip()
            attempt = self._start(step, tip)
            outcome = self._attempt(step, self.run.worktree, attempt)
            if not outcome.ok and (outcome.cancelled or self.run.stop.is_set()):
                gitops.discard_changes(self.run.worktree, tip)
                self._interrupted(step, outcome)
                return
            if outcome.ok:
                crashpoint("after_checks", step.id)
                try:
                    commit = gitops.commit_step(
                        self.run.worktree,
                        task_id=self.task.id,
                        step_id=step.id,
                        attempt=attempt,
                        title=commit_title(step),
                        body=commit_body(step, outcome),
                        expected_tip=tip,
                    )
                except CoderError as exc:  # the branch moved under us: stop, keep everything
                    self._fail(step, StepOutcome(False, exc.message), halt=True)
                    return
                crashpoint("after_commit", step.id)
                self._succeed(step, outcome, commit, tip)
                return
            gitops.discard_changes(self.run.worktree, tip)
            failures += 1
            if failures <= self._retries(step):
                self._reason(
                    step.id,
                    f"attempt {attempt} failed: {outcome.error}; retrying "
                    f"({failures} of {self._retries(step)} retries)",
                )
                self.run.log.warning(
                    "step.retry", step_id=step.id, attempt=attempt, error=outcome.error or ""
                )
                continue
            self._fail(step, outcome)
            return

    # --- independent steps of one level, each in a scratch worktree ----------------------

    def _run_batch(self, steps: list[Step]) -> None:
        """Steps of one level run concurrently, each in its own scratch worktree from the same
        tip; their commits are then replayed onto the branch in file order, so the history is
        the same whatever finished first."""
        tip = self._tip()
        scratch: dict[str, Path] = {}
        try:
            for step in steps:
                scratch[step.id] = gitops.add_scratch_worktree(
                    self.repo,
                    name=f"{self.task.id}--{step.id}",
                    path=self.run.coder_dir / "worktrees" / f"{self.task.id}--{step.id}",
                    commit=tip,
                )
            with ThreadPoolExecutor(max_workers=len(steps)) as pool:
                futures = {
                    s.id: pool.submit(self._scratch_attempts, s, scratch[s.id], tip) for s in steps
                }
                results = {sid: f.result() for sid, f in futures.items()}
            for step in steps:
                outcome, commit = results[step.id]
                if not outcome.ok:
                    if outcome.cancelled or self.run.stop.is_set():
                        self._interrupted(step, outcome)
                    else:
                        self._fail(step, outcome)
                    continue
                if self.halted:  # an earlier step of the level failed: this one is not landed
                    self._reason(
                        step.id,
                        "finished, but not landed: an earlier step of its level "
                        "failed; runs again on resume",
                    )
                    self._update(step.id, status="pending", ended_at=now_iso())
                    continue
                current = self._tip()
                try:
                    landed = (
                        gitops.cherry_pick(self.run.worktree, commit, expected_tip=current)
                        if commit
                        else None
                    )
                except CoderError as exc:
                    self._fail(step, StepOutcome(False, exc.message))
                    continue
                crashpoint("after_commit", step.id)
                self._succeed(step, outcome, landed, current)
        finally:
            for step in steps:
                gitops.remove_worktree(self.repo, f"{self.task.id}--{step.id}")

    def _scratch_attempts(
        self, step: Step, workdir: Path, tip: str
    ) -> tuple[StepOutcome, str | None]:
        failures = 0
        while True:
            attempt = self._start(step, tip)
            outcome = self._attempt(step, workdir, attempt)
            if outcome.ok:
                crashpoint("after_checks", step.id)
                commit = gitops.commit_detached(
                    workdir,
                    task_id=self.task.id,
                    step_id=step.id,
                    attempt=attempt,
                    title=commit_title(step),
                    body=commit_body(step, outcome),
                    parent=tip,
                )
                return outcome, commit
            gitops.discard_changes(workdir, tip)
            failures += 1
            if outcome.cancelled or self.run.stop.is_set() or failures > self._retries(step):
                return outcome, None
            self._reason(
                step.id,
                f"attempt {attempt} failed: {outcome.error}; retrying "
                f"({failures} of {self._retries(step)} retries)",
            )

    # --- the step protocol's pieces -----------------------------------------------------

    def _tip(self) -> str:
        tip = gitops.branch_tip(self.repo, self.run.branch)
        assert tip is not None, f"branch {self.run.branch} disappeared"
        return tip

    def _retries(self, step: Step) -> int:
        if step.retries is not None:
            return step.retries
        return int(self.task.policies.get("retries", 0))

    def _start(self, step: Step, tip: str) -> int:
        with self._lock:
            attempt = int(self.step_state(step.id).get("attempts", 0)) + 1
            self._update(
                step.id,
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

    def _attempt(self, step: Step, workdir: Path, attempt: int) -> StepOutcome:
        """Act and verify; every failure becomes an outcome the strategy can act on."""
        ctx = StepContext(
            task=self.task,
            step=step,
            workdir=workdir,
            attempt=attempt,
            policy=self.run.policy,
            config=self.run.config,
            artifacts=self.run.artifacts,
            cancel=self.run.stop,
            log=self.run.log.bind(step_id=step.id),
            redactor=self.run.redactor,
            owner=self.run.owner,
            agent=self.run.agent,
            previous_error=self.step_state(step.id).get("error"),
        )
        guard = GitGuard.take(self.common_dir, workdir)
        started = time.monotonic()
        try:
            outcome = runner_for(step.kind)(ctx)
        except CoderError as exc:  # policy refusals, missing test command, ...
            outcome = StepOutcome(False, exc.message)
        if outcome.usage:
            self._add_usage(step.id, outcome.usage)
        touched = guard.changes()
        if touched:
            guard.restore()
            outcome = StepOutcome(
                False,
                f"the step changed {', '.join(guard.describe(touched))}; .git "
                "belongs to coder's executor (the original was restored)",
            )
        if outcome.ok:
            failures = failed_asserts(step.asserts, workdir) + protected_paths_changed(
                step, workdir, self.run.policy
            )
            if failures:
                outcome = StepOutcome(False, "; ".join(failures), tests=outcome.tests)
        self.run.log.debug(
            "step.acted",
            step_id=step.id,
            ok=outcome.ok,
            duration_s=round(time.monotonic() - started, 3),
        )
        return outcome

    def _succeed(self, step: Step, outcome: StepOutcome, commit: str | None, parent: str) -> None:
        if commit:
            diff = self.run.artifacts / f"{step.id}.diff"
            diff.parent.mkdir(parents=True, exist_ok=True)
            diff.write_text(
                self.run.redactor.redact(gitops.diff_patch(self.repo, parent, commit)),
                encoding="utf-8",
            )
        self._update(
            step.id,
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

    def _fail(self, step: Step, outcome: StepOutcome, *, halt: bool = False) -> None:
        error = outcome.error or "failed"
        strategy = step.strategy
        if strategy == "skip" and not self.run.fail_fast and not halt:
            self._reason(step.id, f"skipped after failing: {error} (on_fail: skip)")
            self._update(
                step.id,
                status="skipped",
                ended_at=now_iso(),
                error=error,
                duration_s=self._duration(step.id),
                tests=outcome.tests,
            )
            self.run.log.warning("step.skipped", step_id=step.id, reason=error)
            return
        if strategy == "fix_and_retry" and self.run.agent is None:
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
        self.run.log.error("step.failed", step_id=step.id, error=error, strategy=strategy)
        self.halted = True

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

    def _duration(self, step_id: str) -> float | None:
        from datetime import datetime

        started = self.step_state(step_id).get("started_at")
        if not started:
            return None
        begin = datetime.fromisoformat(started.replace("Z", "+00:00"))
        return round(max(0.0, time.time() - begin.timestamp()), 3)

    # --- the end of the run ---------------------------------------------------------------

    def _finish(self) -> str:
        crashpoint("before_finish")
        statuses = [self.status(s) for s in self.order]
        error = None
        if "failed" in statuses:
            failed = [s for s in self.order if self.status(s) == "failed"]
            status, error = (
                "failed",
                f"step {failed[0]} failed: {self.step_state(failed[0])['error']}",
            )
        elif self.run.stop.is_set() or "interrupted" in statuses:
            status = "interrupted"
        elif "pending" in statuses or "running" in statuses:
            status, error = "failed", self.run.state.get("error") or "some steps could not run"
        else:
            problems = success_problems(self)
            status, error = ("failed", "; ".join(problems)) if problems else ("success", None)
        self.run.state.update(
            status=status, error=self.run.redactor.redact(error) if error else None
        )
        self.checkpoint(validate=True)
        self.run.log.info("run.finished", status=status, error=error or "")
        return status


def success_problems(ex: Executor) -> list[str]:
    """The task's `success` criteria, checked against the finished worktree."""
    from coder.run import success

    worktree = ex.run.worktree
    problems = success.missing_files(ex.task, worktree)
    if ex.task.success.get("require_green_tests"):
        try:
            cmd = success.test_command(ex.task, worktree, ex.run.config)
        except CoderError as exc:
            return [*problems, f"require_green_tests: {exc.message}"]
        problem, result = success.run_tests(
            cmd, worktree, ex.run.policy, cancel=ex.run.stop, owner=ex.run.owner
        )
        ex.run.log.info("success.tests", exit_code=result.exit_code)
        if problem:
            problems.append(f"require_green_tests: {problem}")
    return problems


def commit_title(step: Step) -> str:
    from coder.redact import redact

    goal = redact(" ".join(step.goal.split()))
    title = f"{step.id}: {goal}"
    return title if len(title) <= 72 else title[:71] + "…"


def commit_body(step: Step, outcome: StepOutcome) -> str:
    from coder.redact import redact

    lines = [f"Step {step.id} ({step.kind})."]
    if step.cmd:
        lines.append(f"Command: {step.cmd}")
    if outcome.summary:
        lines.append(outcome.summary)
    return redact("\n".join(lines))
