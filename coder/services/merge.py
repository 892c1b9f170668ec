"""Landing a finished run on its base branch: `coder merge` and `coder run --merge-on-success`.

The protocol; `kill -9` anywhere leaves the base branch unchanged or at exactly the new commit,
and running the merge again finishes the job:

1. Under the task lock, read the run. A merge that already landed (recorded in the state, or
   found in git after a crash: a commit on base with `Coder-Task: ID` and `Coder-Merge: MODE`
   trailers, or the run's tip itself for ff-only) is finished (tag, checkout, state), never
   made twice.
2. Build the result in memory: a squash commit (the base tip its only parent), a merge commit
   (base tip and run tip), or the run tip itself (ff-only). It is on no branch yet.
3. Refuse, changing nothing: conflicts with a base that moved, a base that cannot be
   fast-forwarded, a checkout of base whose uncommitted changes touch the merged files.
4. `--if-green`: the success criteria run on that exact commit in a throwaway worktree.
5. Move base and the tag `coder/ID` in one ref transaction, only if base still points where
   step 1 saw it (compare-and-swap).
6. Bring the checkout of base along: the merged paths only, each only if still at the old
   content, so the user's other edits survive byte for byte. Steps 5 and 6 hold the
   checkout's lock (`coder.run.lock.CheckoutLock`), so `run --include-uncommitted` never
   reads the checkout in between; a merge that moved base and stopped before the checkout
   followed leaves that lock's record, and until it is finished the lock is refused.
7. Record the merge in the state, last: a recorded merge means every step above is done.

What a kill in step 6 leaves in the user's checkout, the next merge removes: temporary files
next to the merged paths (`gitland.sweep_temp_files`), and the index's `index.lock` when the
merge journal shows that a merge of this run, now dead, was writing it
(coder.services.indexlock). Any other `index.lock` refuses the merge in step 3, before base
moves: the checkout's files could not be recorded there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder.crashpoints import crashpoint
from coder.display import counted
from coder.errors import (
    CheckoutInTheWay,
    CoderError,
    EnvironmentProblem,
    Interrupted,
    InvalidInput,
    MergeConflict,
    RunFailed,
)
from coder.files.durable import write_private
from coder.git import branches, commits, diffs, worktrees
from coder.git import land as gitland
from coder.redact import Redactor, redact
from coder.run import success
from coder.run.commitmsg import commit_title
from coder.run.eventlog import EventLog
from coder.run.lock import CheckoutLock
from coder.run.manifest import Manifest
from coder.run.opened import OpenRun, open_run
from coder.run.preflight import policy_for
from coder.run.records import RunState, StepRecord, now_iso
from coder.run.secrets import run_secrets
from coder.services import report
from coder.services.indexlock import IndexJournal, free_index

if TYPE_CHECKING:
    from coder.policy.sandbox import CommandResult

MODES = ("squash", "no-ff", "ff-only")
Notify = Callable[[str], None]


@dataclass(frozen=True)
class MergeResult:
    task_id: str
    outcome: str  # merged | already_merged | nothing_to_merge
    base: str
    mode: str
    commit: str | None  # what base points at for this run (None: nothing to merge)
    previous: str | None  # base's tip before the merge
    tag: str | None
    files: tuple[str, ...] = ()  # paths the merge changed on base
    checkout: str | None = None  # the checkout of base that was updated
    verified: bool = False  # the success criteria ran green on the merge result
    finished: tuple[str, ...] = ()  # what this call completed of an interrupted merge
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def tag_name(task_id: str) -> str:
    return f"coder/{task_id}"


def check_worktree_name(task_id: str) -> str:
    """The --if-green worktree's name; the dot keeps it apart from step scratch worktrees
    (`ID--STEP`, and step ids have no dots), and `coder clean` still removes it (`ID--*`)."""
    return f"{task_id}--merge.check"


def merge_run(
    task_id: str,
    *,
    cwd: Path,
    mode: str = "squash",
    if_green: bool = False,
    notify: Notify | None = None,
    report: bool = False,
) -> MergeResult:
    """Land run `task_id` on its base branch (see the module docstring). With `report`, the
    commit's body carries the run's report in a few lines (`coder.services.report`)."""
    if mode not in MODES:
        raise InvalidInput(f"unknown merge mode {mode!r}", hint=f"use one of: {', '.join(MODES)}")
    if report and mode == "ff-only":
        raise InvalidInput(
            "--report writes the run's summary into the merge commit, and ff-only makes none",
            hint="use --mode squash (the default) or --mode no-ff",
        )
    with open_run(cwd, task_id, holder="merge") as run, EventLog(run.coder_dir, task_id) as log:
        job = _Merge(run, mode, if_green, notify or (lambda _message: None), report)
        try:
            result = job.run()
        except CoderError as exc:
            log.warning("merge.refused", mode=mode, error=exc.message)
            raise
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, a hang-up: say where it stopped
            interrupted = job.interrupted()
            log.warning("merge.interrupted", mode=mode, error=interrupted.message)
            raise interrupted from None
        log.info(
            f"merge.{result.outcome}",
            mode=result.mode,
            base=result.base,
            commit=result.commit or "",
            tag=result.tag or "",
            finished=",".join(result.finished),
        )
        return result


class _Merge:
    """One `merge_run` call: the run's facts and the steps of the protocol."""

    def __init__(
        self, run: OpenRun, mode: str, if_green: bool, notify: Notify, report: bool = False
    ) -> None:
        self.opened, self.repo, self.root, self.coder_dir = run, run.repo, run.root, run.coder_dir
        self.manifest, self.store, self.state = run.manifest, run.store, run.state
        self.mode, self.if_green, self.notify, self.report = mode, if_green, notify, report
        self.task_id: str = run.task_id
        self.base: str = self.manifest.base
        self.branch: str = self.manifest.branch
        self.tag = tag_name(self.task_id)
        self.warnings: list[str] = []
        self.target: str | None = None  # the commit base is to point at, once known
        self.journal = IndexJournal(self.coder_dir, self.task_id)

    def run(self) -> MergeResult:
        self._drop_leftover_check()
        base_tip = self._tip(self.base, "base branch")
        run_tip = self._tip(self.branch, "branch")
        landed = self._landed(base_tip, run_tip)
        if landed is not None:
            return self._finish_landed(*landed, base_tip=base_tip)
        self._check_mergeable()
        commit = self.target = self._build(base_tip, run_tip)
        if commit is None:
            return self._result("nothing_to_merge", None, base_tip)
        checkout = gitland.checked_out_in(self.repo, self.base)
        if checkout is not None:
            self._check_checkout(checkout, base_tip, commit)
        if self.if_green:
            self._verify(commit)
            if checkout is not None:  # the tests took a while: look again
                self._check_checkout(checkout, base_tip, commit)
        crashpoint("merge_before_ref")
        with self._holding(checkout) as held:
            gitland.land(
                self.repo,
                branch=self.base,
                target=commit,
                expected_tip=base_tip,
                tag=self.tag,
                tag_expected=gitland.ref_target(self.repo, self._tagref),
                message=f"coder: merge {self.task_id} ({self.mode})",
            )
            if held is not None:
                held.landed(commit)
            crashpoint("merge_after_ref")
            if checkout is not None:
                self._update_checkout(checkout, base_tip, commit)
        crashpoint("merge_after_checkout")
        self._record(commit, self.mode)
        return self._result(
            "merged",
            commit,
            base_tip,
            checkout=checkout,
            files=diffs.changed_files_between(self.repo, base_tip, commit),
        )

    # --- reading -------------------------------------------------------------------------

    @property
    def _tagref(self) -> str:
        return f"refs/tags/{self.tag}"

    def _tip(self, branch: str, what: str) -> str:
        tip = branches.branch_tip(self.repo, branch)
        if tip is None:
            raise EnvironmentProblem(
                f"{what} {branch} of run {self.task_id} no longer exists",
                hint=f"recreate {branch}, or remove the run with `coder clean -t {self.task_id}`",
            )
        return tip

    def _landed(self, base_tip: str, run_tip: str) -> tuple[str, str, bool] | None:
        """(commit, mode, recorded) of this run's merge if base already contains it."""
        record = self.state.merge or {}
        if record.get("commit"):
            if gitland.is_ancestor(self.repo, record["commit"], base_tip):
                return record["commit"], record.get("mode", "squash"), True
            self.warnings.append(
                f"the earlier merge {record['commit'][:12]} is no longer on "
                f"{self.base}; merging again"
            )
        found = gitland.find_merge_commit(
            self.repo, branch=self.base, since=self.manifest.base_commit, task_id=self.task_id
        )
        if found is not None:
            return found[0], found[1], False
        ran = run_tip != self.manifest.base_commit  # a run without commits merges nothing
        if ran and gitland.is_ancestor(self.repo, run_tip, base_tip):
            return run_tip, "ff-only", False
        return None

    def _check_mergeable(self) -> None:
        status = self.state.status
        if status != "success":
            raise InvalidInput(
                f"run {self.task_id} is {status}; only a successful run can be merged",
                hint=f"finish it with `coder resume -t {self.task_id}`, then merge",
            )
        self.opened.refuse_foreign_commits(
            refusing="refusing to land work no run checked",
            hint=f"merge it with git yourself, or move those commits elsewhere and reset "
            f"{self.branch} to its last coder commit",
        )

    # --- building the result ---------------------------------------------------------------

    def _build(self, base_tip: str, run_tip: str) -> str | None:
        """The commit base will point at, or None when base already has every change."""
        if self.mode == "ff-only":
            if gitland.is_ancestor(self.repo, run_tip, base_tip):
                return None
            if not gitland.is_ancestor(self.repo, base_tip, run_tip):
                raise EnvironmentProblem(
                    f"cannot fast-forward {self.base} to {self.branch}: {self.base} has moved "
                    "since the run started; nothing was changed",
                    hint=f"merge with `coder merge -t {self.task_id} --mode squash` "
                    "(or --mode no-ff) instead",
                )
            return run_tip
        tree, conflicts = gitland.merged_tree(self.repo, base_tip, run_tip)
        if tree is None:
            raise MergeConflict(
                f"run {self.task_id} conflicts with {self.base} (which moved since the run "
                f"started) in {', '.join(conflicts)}; nothing was changed",
                hint=f"resolve it by hand (`git merge --squash {self.branch}`), or start a new "
                f"run from the current {self.base}",
            )
        if tree == gitland.commit_tree(self.repo, base_tip):
            return None
        parents = [base_tip] if self.mode == "squash" else [base_tip, run_tip]
        return gitland.write_commit(
            self.repo,
            tree=tree,
            parents=parents,
            message=merge_message(self.manifest, self.state, self.mode, summary=self._summary()),
        )

    def _summary(self) -> str | None:
        """The run's report in a few lines, for the commit's body (`--report`)."""
        if not self.report:
            return None

        return report.commit_summary(report.build(self.opened))

    # --- the user's checkout ---------------------------------------------------------------

    def _check_checkout(self, checkout: Path, old: str, new: str) -> None:
        plan = gitland.plan_checkout_update(checkout, old, new, taken=self.manifest.checkout_commit)
        if plan.busy:
            raise EnvironmentProblem(
                f"{self.base} is checked out in {checkout}, which is in the middle of a "
                f"{plan.busy}; nothing was changed",
                hint="finish or abort it there, then merge again",
            )
        if plan.linked:
            one = len(plan.linked) == 1
            what = "is a symbolic link or a file" if one else "are symbolic links or files"
            raise CheckoutInTheWay(
                f"{', '.join(plan.linked[:10])} in {checkout} {what} where the merge writes "
                f"{', '.join(plan.blocked[:10])}; nothing was changed",
                hint=f"move {'it' if one else 'them'} out of the way, then run "
                f"`coder merge -t {self.task_id}` again",
            )
        if plan.blocked:
            hint = "commit or stash them (`git stash -u`)"
            if plan.ignored:  # stash -u leaves ignored files; stash -a takes every ignored file
                hint = (
                    f"move {', '.join(plan.ignored[:10])} out of the way (git-ignored files, "
                    "which `git stash -u` leaves in place)"
                    + (", and commit or stash the rest" if plan.ignored != plan.blocked else "")
                )
            raise CheckoutInTheWay(
                f"uncommitted changes in {checkout} overlap the merge: "
                f"{', '.join(plan.blocked[:10])}; nothing was changed",
                hint=f"{hint}, then run `coder merge -t {self.task_id}` again",
            )
        if plan.pending:
            self._check_index_lock(checkout)

    def _check_index_lock(self, checkout: Path, *, landed: str | None = None) -> None:
        """The checkout's index must be free (coder.services.indexlock.free_index)."""
        warning = free_index(
            checkout, self.journal, task_id=self.task_id, base=self.base, landed=landed
        )
        if warning:
            self.warnings.append(warning)

    @contextmanager
    def _holding(self, checkout: Path | None) -> Iterator[CheckoutLock | None]:
        """The checkout's lock while base moves and `checkout` (None: base is checked out
        nowhere) follows it: `run --include-uncommitted` never reads it half-way."""
        if checkout is None:
            yield None
            return
        with CheckoutLock(self.coder_dir, holder="merge", task_id=self.task_id) as held:
            yield held

    def _update_checkout(self, checkout: Path, old: str, new: str) -> bool:
        """True if files were written. This comes after base moved: a failure says so, and
        that merging again finishes the job."""
        try:
            plan = gitland.plan_checkout_update(
                checkout, old, new, taken=self.manifest.checkout_commit
            )
            swept = gitland.sweep_temp_files(checkout, plan.pending + plan.done + plan.blocked)
        except CoderError as exc:
            raise self._unfinished(checkout, new, exc) from None
        if swept:
            self.warnings.append(
                f"removed {len(swept)} temporary file(s) an interrupted merge left in "
                f"{checkout}: {', '.join(swept[:10])}"
            )
        if plan.pending:
            self._check_index_lock(checkout, landed=new)
            try:
                gitland.apply_checkout_update(
                    checkout, new, plan.pending, before_index=self.journal.write
                )
            except CoderError as exc:
                raise self._unfinished(checkout, new, exc) from None
            finally:
                self.journal.clear()
        if plan.blocked:
            self.warnings.append(
                f"left {', '.join(plan.blocked[:10])} in {checkout} as they are (changed "
                f"during the merge); `git status` there shows how they differ from {self.base}"
            )
        return bool(plan.pending)

    def _unfinished(self, checkout: Path, new: str, exc: CoderError) -> EnvironmentProblem:
        return EnvironmentProblem(
            f"run {self.task_id} landed on {self.base} as {new[:12]}, but updating the "
            f"checkout {checkout} failed: {exc.message}",
            hint=f"fix that, then run `coder merge -t {self.task_id}` again to finish",
        )

    # --- --if-green --------------------------------------------------------------------------

    def _drop_leftover_check(self) -> None:
        """A check worktree left by a crash (kill -9 while its tests ran) goes first."""
        name = check_worktree_name(self.task_id)
        worktrees.remove_worktree(self.repo, name, self.coder_dir / "worktrees" / name)
        branches.delete_branch(self.repo, f"coder-scratch/{name}")

    def _verify(self, commit: str) -> None:
        # the tests run as the taskfile wrote them (the manifest keeps them redacted)
        task = self.manifest.restored_task()
        cfg = config_mod.load(self.root)
        config_mod.require_trusted(cfg)  # its settings would widen what the check runs
        name = check_worktree_name(self.task_id)
        path = worktrees.add_scratch_worktree(
            self.repo, name=name, commit=commit, path=self.coder_dir / "worktrees" / name
        )
        log = self.coder_dir / "artifacts" / self.task_id / "merge-check.log"
        try:
            crashpoint("merge_verify")
            problems = green_problems(task, path, cfg, policy_for(task, cfg), log, self.notify)
        finally:
            worktrees.remove_worktree(self.repo, name, path)
        if problems:
            raise RunFailed(
                f"the merge of run {self.task_id} into {self.base} is not green, so nothing was "
                f"landed: {'; '.join(problems)}",
                hint=f"the test output is in {log}",
            )

    # --- finishing ---------------------------------------------------------------------------

    def _finish_landed(
        self, commit: str, mode: str, recorded: bool, *, base_tip: str
    ) -> MergeResult:
        """Base already has this run's merge: report it; after a crash, finish what the
        interrupted merge left undone (tag, checkout, state)."""
        if recorded:
            return self._result("already_merged", commit, None, mode=mode)
        self.target = commit
        finished = []
        current = gitland.ref_target(self.repo, self._tagref)
        if current != commit:
            gitland.set_tag(self.repo, self.tag, commit, expected=current)
            finished.append("tag")
        checkout = gitland.checked_out_in(self.repo, self.base)
        old = (
            gitland.first_parent(self.repo, commit)
            if mode != "ff-only"
            else gitland.landed_from_reflog(self.repo, self.base, commit)
        )
        if checkout is not None and base_tip == commit:
            if old is None:
                self.warnings.append(
                    f"could not tell which files the merge changed; check "
                    f"`git status` in {checkout}"
                )
            else:
                with self._holding(checkout) as held:
                    assert held is not None
                    held.landed(commit)
                    if self._update_checkout(checkout, old, commit):
                        finished.append("checkout")
        self._record(commit, mode)
        finished.append("state")
        return self._result(
            "already_merged",
            commit,
            old,
            mode=mode,
            finished=tuple(finished),
            checkout=checkout if "checkout" in finished else None,
        )

    def interrupted(self) -> Interrupted:
        """What a signal that ended this merge leaves: by git, whether base has moved."""
        again = f"run `coder merge -t {self.task_id}` again"
        tip = branches.branch_tip(self.repo, self.base)
        if (
            self.target is None
            or tip is None
            or not gitland.is_ancestor(self.repo, self.target, tip)
        ):
            return Interrupted(
                f"the merge of run {self.task_id} stopped before anything landed; {self.base} "
                "is unchanged",
                hint=f"{again} to merge it",
            )
        return Interrupted(
            f"the merge of run {self.task_id} stopped after it landed on {self.base} as "
            f"{self.target[:12]}; the tag, the checkout or the run's record may be unfinished",
            hint=f"{again} to finish it",
        )

    def _record(self, commit: str, mode: str) -> None:
        self.state.merge = {
            "commit": commit,
            "base": self.base,
            "mode": mode,
            "tag": self.tag,
            "merged_at": now_iso(),
        }
        self.store.save(self.state)

    def _result(
        self,
        outcome: str,
        commit: str | None,
        previous: str | None,
        *,
        mode: str | None = None,
        checkout: Path | None = None,
        files: list[str] | None = None,
        finished: tuple[str, ...] = (),
    ) -> MergeResult:
        return MergeResult(
            task_id=self.task_id,
            outcome=outcome,
            base=self.base,
            mode=mode or self.mode,
            commit=commit,
            previous=previous,
            tag=self.tag if commit else None,
            files=tuple(files or ()),
            checkout=str(checkout) if checkout else None,
            verified=self.if_green and outcome == "merged",
            finished=finished,
            warnings=tuple(self.warnings),
        )


def merge_message(
    manifest: Manifest, state: RunState, mode: str, *, summary: str | None = None
) -> str:
    """Title, the steps (one line each, as their commits are titled; or the run's report
    `summary` instead), then the trailers."""
    task = manifest.task
    lines = []
    for step in task.steps:
        st = state.steps.get(step.id) or StepRecord()
        note = "" if st.commit else " (skipped)" if st.status == "skipped" else " (no changes)"
        lines.append(f"- {commit_title(step, redact)}{note}")
    if manifest.checkout_commit:  # --include-uncommitted: the run's first commit
        lines.insert(0, "- uncommitted changes from the checkout (the run's first commit)")
    what = "Squash merge" if mode == "squash" else "Merge"
    title = redact(" ".join(task.title.split())) or f"coder task {task.id}"
    n_steps = counted(len(task.steps), "step")
    intro = f"{what} of coder task {task.id} from {manifest.branch} ({n_steps}):"
    trailers = f"{commits.TRAILER_TASK}: {task.id}\n{commits.TRAILER_MERGE}: {mode}\n"
    steps = redact(summary) if summary else "\n".join(lines)
    return "\n\n".join([title, intro + "\n" + steps, trailers])


def green_problems(
    task: Any, worktree: Path, cfg: Any, policy: Any, log: Path, notify: Notify
) -> list[str]:
    """The success criteria against `worktree` (`coder.run.success.problems`), the tests
    always: green means the tests passed, whether or not the task's own criteria asked for
    them. Their output goes to `log`, redacted."""
    try:
        cmd = success.test_command(task, worktree, cfg)
    except InvalidInput:  # it names the throwaway worktree; say what it means instead
        raise InvalidInput(
            f"--if-green needs the project's test command, and none could be found for task "
            f"{task.id}; nothing was landed",
            hint="set `test_command` in coder.config.json, or add a test step to the taskfile; "
            "or merge without --if-green",
        ) from None

    def tested(cmd: str, result: CommandResult) -> None:
        roots = [r for r in (cfg.project_root, worktree) if r is not None]
        redactor = Redactor(run_secrets(roots, task, policy, cfg.values))
        write_private(log, redactor.redact(f"$ {cmd}\n{result.stdout}{result.stderr}"))

    def base() -> str:  # where the run left the base branch: what its lint compares with
        return success.fork_point(worktree, task.base)

    notify(f"checking the merge result: {cmd}")
    return success.problems(task, worktree, cfg, policy, tests=cmd, base=base, tested=tested)
