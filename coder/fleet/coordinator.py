"""The coordinator's part of a run whose steps run on other machines (`coder run --executor`).

The run itself is an ordinary local run (manifest, checkpoint, worktree, branch): the executor
walks its DAG and lands each step's commit on the branch by cherry-pick, in file order, as it
lands a parallel level's. Only where a step runs differs: `Coordinator` is the run's
`RunContext.dispatch`. A step whose ref (`refs/coder/RUN/steps/S`) is on the remote already is
taken (a resumed run, a CI workflow's workers); any other is sent to the engine as a
WorkerJob. The pushed commit is fetched into the run's repository under the same ref name,
checked (its trailers name the run and the step), and handed back to be landed. The
coordinator never runs a step's commands itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coder.errors import CoderError
from coder.fleet import refs
from coder.fleet.engines import Engine, engine_for
from coder.fleet.jobs import WorkerJob, WorkerResult
from coder.git import picks, remotes, repository
from coder.models.usage import Usage
from coder.run.steps import StepOutcome

if TYPE_CHECKING:
    from coder.run.context import RunContext
    from coder.run.manifest import Fleet
    from coder.taskfile import Step


class Coordinator:
    """`RunContext.dispatch` for a run on an engine."""

    def __init__(self, run: RunContext, fleet: Fleet, engine: Engine) -> None:
        self.run, self.fleet, self.engine = run, fleet, engine
        self.root, self.manifest = run.repo_root, run.manifest
        self.repo = repository.open_repo(self.root)
        # workers start from the base: the remote must have it (CAS: another run's is refused)
        refs.push_base(self.root, fleet.remote, self.manifest.task_id, self.manifest.base_commit)

    def __call__(self, step: Step, tip: str) -> tuple[StepOutcome, str | None, int]:
        ref = refs.step_ref(self.manifest.task_id, step.id)
        try:
            there = remotes.remote_ref(self.root, self.fleet.remote, ref)
            if there is not None:
                result = WorkerResult(step.id, "taken", there)
            else:
                self.run.log.info("fleet.dispatched", step_id=step.id, engine=self.engine.name)
                result = self.engine.submit(self._job(step)).result()
            return self._outcome(step, result)
        except CoderError as exc:  # the remote unreachable, its refs unreadable
            return StepOutcome(False, f"{ref}: {exc.message}", errored=True), None, 0

    def _job(self, step: Step) -> WorkerJob:
        return WorkerJob(
            run_id=self.manifest.task_id,
            step_id=step.id,
            remote=self.fleet.remote,
            base=self.manifest.base_commit,
            task=dict(self.manifest.doc),
        )

    def _outcome(self, step: Step, result: WorkerResult) -> tuple[StepOutcome, str | None, int]:
        usage = (
            Usage.from_dict(result.usage)
            if result.usage
            else Usage(eval_tokens=result.tokens)  # an engine that says only how many
            if result.tokens
            else None
        )
        self.run.log.info(
            "fleet.result",
            step_id=step.id,
            status=result.status,
            commit=result.commit or "",
            error=result.error or "",
        )
        if result.status == "failed":
            return StepOutcome(False, result.error or "failed", usage=usage), None, result.attempts
        if result.status not in ("pushed", "taken") or not result.commit:
            error = result.error or f"the worker of step {step.id} gave no commit"
            return StepOutcome(False, error, errored=True, usage=usage), None, result.attempts
        run_id = self.manifest.task_id
        ref = refs.step_ref(run_id, step.id)
        remotes.fetch(self.root, self.fleet.remote, [f"+{ref}:{ref}"])
        if not refs.is_step_commit(self.repo, result.commit, run_id, step.id):
            error = f"{ref} holds {result.commit[:12]}, not a commit of step {step.id}"
            return StepOutcome(False, error, errored=True), None, result.attempts
        wrong = self._off_start(step, result.commit)
        if wrong:
            return StepOutcome(False, wrong, usage=usage), None, result.attempts
        summary = result.summary or f"run by a worker ({result.status}, {self.engine.name})"
        return StepOutcome(True, summary=summary, usage=usage), result.commit, result.attempts

    def _off_start(self, step: Step, commit: str) -> str | None:
        """Why `commit` does not start where the start rule says step `step` starts (its
        parent's tree is not the base's with its dependencies' pushed commits); None: it
        does. Landed by its diff against its parent, a commit made elsewhere would bring
        the wrong change."""
        run_id, task = self.manifest.task_id, self.run.task
        deps = refs.start_rule(task, step.id)
        wanted = [refs.step_ref(run_id, d) for d in deps]
        if wanted:
            remotes.fetch(self.root, self.fleet.remote, [f"+{r}:{r}" for r in wanted])
        pushed = {d: f"{refs.step_ref(run_id, d)}" for d in deps}
        start = refs.start_of(self.repo, self.manifest.base_commit, task, step.id, pushed)
        parent = picks.parent_of(self.repo, commit)
        if parent is not None and picks.tree_of(self.repo, parent) == picks.tree_of(
            self.repo, start
        ):
            return None
        ref = refs.step_ref(run_id, step.id)
        return (
            f"{ref} ({commit[:12]}) does not start where step {step.id} starts (the base with "
            f"{', '.join(deps) or 'no dependencies'} picked onto it): made from another start; "
            f"delete the ref on the remote (`git push REMOTE :{ref}`) and resume to run it again"
        )

    def close(self) -> None:
        self.engine.close()


def dispatcher(run: RunContext, fleet: Fleet) -> Coordinator:
    """The run's dispatch on the engine its fleet names (RunContext.Dispatcher)."""
    workers = fleet.workers or run.settings.max_parallel or 1
    engine = engine_for(fleet.executor, workers=workers, address=fleet.ray_address)
    try:
        return Coordinator(run, fleet, engine)
    except BaseException:
        engine.close()
        raise
