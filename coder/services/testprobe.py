"""The test command run once, as `coder init` and `coder doctor` do: does it find tests?

A run's test step fails with "no tests ran" when the command finds none, and a command that
cannot start (pytest not installed, a program the policy refuses) fails every test step. Both
are cheaper to learn before a run. So `probe` runs the command the way a test step does, and
where a test step does: in a throwaway worktree of the commit the user's checkout has checked
out (detached, under `.coder/worktrees/`, removed afterwards), through the sandbox with the
config's policy, inside a git guard, structured results where the runner offers them
(coder.checks.testresults), a timeout. Never in the checkout itself: the test command is the
repository's, and there it could switch the user's branch (a linked worktree's HEAD), aim
their next `git status` at another repository (its commondir) or, with no mount wall, write
`.git/hooks` and `.git/config`. So it probes HEAD as committed, and says so when the checkout
has changes it did not see. `coder init --no-test-probe` and `coder doctor --no-test-probe`
skip it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from coder import config as config_mod
from coder import project
from coder.checks import testreport, testresults
from coder.errors import CoderError, EnvironmentProblem, LinkInTheWay, PolicyViolation
from coder.files import nofollow
from coder.git import branches, repository, workdir, worktrees
from coder.git.guard import GitGuard
from coder.git.repository import common_dir, open_worktree
from coder.policy import sandbox
from coder.policy.commands import Policy
from coder.policy.confine import end_leftovers
from coder.run.steps.test import rust_nightly

if TYPE_CHECKING:
    from coder.git.repository import Repo

TIMEOUT_S = 120.0
Outcome = Literal["ok", "failing", "no_tests", "not_run", "unread"]
# The throwaway worktree's name: a dot, which no task id has, so it is never a run's
# (`ID`, `ID--STEP`); the pid, so that two probes at once do not share one.
_NAME = "test.probe-"


@dataclass(frozen=True)
class Probe:
    outcome: Outcome
    detail: str  # what happened, one line
    fix: str | None = None  # what to do about it

    @property
    def status(self) -> str:
        """As `coder doctor` grades it."""
        return "ok" if self.outcome == "ok" else "warn"


def probe(cwd: Path, cmd: str, cfg: config_mod.Config, *, timeout: float = TIMEOUT_S) -> Probe:
    """Run test command `cmd` once on the commit checked out where `cwd` is, as a test step
    would, and say what it found."""
    try:
        repo = repository.open_repo(cwd)
        with _throwaway_worktree(repo) as workdir:
            found = _probe_in(workdir, cmd, cfg, timeout)
        unseen = _uncommitted(repo)
    except CoderError as exc:
        return Probe("not_run", f"`{cmd}` was not run: {exc.message}", exc.hint)
    return replace(found, detail=f"{found.detail} ({unseen})") if unseen else found


def _probe_in(workdir: Path, cmd: str, cfg: config_mod.Config, timeout: float) -> Probe:
    """The probe in the throwaway worktree `workdir`, inside a git guard, as a step runs."""
    w = open_worktree(workdir, writing=False)
    policy = Policy.from_config(cfg.values)
    plan = testresults.structured(cmd, nightly=lambda: rust_nightly(workdir, policy))
    guard = GitGuard.take(common_dir(w), workdir, head=("(no branch)", str(w.head.target)))
    try:
        result = sandbox.run_command(
            plan.command if plan else cmd,
            cwd=workdir,
            policy=policy,
            timeout=timeout,
            root=workdir,
            results_var=testresults.RESULTS_VAR if plan and plan.results_file else None,
        )
    except PolicyViolation as exc:
        return Probe("not_run", f"`{cmd}` was not run: {exc.message}", exc.hint or _SET)
    except CoderError as exc:  # no sandbox on this machine
        return Probe("not_run", f"`{cmd}` could not be run: {exc.message}", exc.hint)
    finally:
        end_leftovers(workdir)
        changed = guard.describe(guard.restore()) + guard.drop_stashes()
    if changed:
        return Probe(
            "failing",
            f"`{cmd}` changed {', '.join(changed)} (put back): a test step running it fails",
            "make the tests leave the repository's .git alone",
        )
    if result.timed_out:
        return Probe(
            "not_run",
            f"`{cmd}` did not finish within {timeout:g} s",
            "check that the tests end on their own; a test step waits for its own timeout",
        )
    report = testresults.read_result(plan, result, testreport.framework_of(cmd))
    return _judge(cmd, result.exit_code, result.stdout + "\n" + result.stderr, report)


@contextmanager
def _throwaway_worktree(repo: Repo) -> Iterator[Path]:
    """A worktree of the commit `repo`'s checkout has checked out, detached, under the
    repository's `.coder/worktrees/` (made, never through a link), removed afterwards, also
    on an error or a timeout; a probe a kill cut short is removed by the next one."""
    commit = branches.head_commit(repo)
    if commit is None:
        raise EnvironmentProblem(
            "the repository has no commits yet", hint="commit something, then probe again"
        )
    root = repository.repo_root(repo)
    project.ensure_coder_dir(root)
    repository.ensure_excluded(repo, f"/{project.CODER_DIR}/")
    rel = f"{project.CODER_DIR}/worktrees"
    try:
        with nofollow.open_dir(root, rel):
            pass
    except LinkInTheWay as exc:
        raise EnvironmentProblem(
            f"{root / exc.rel} is a link, not coder's directory",
            hint=f"remove {root / exc.rel}, then probe again",
        ) from None
    parent = root / rel
    _remove_cut_short(repo, parent)
    name = f"{_NAME}{os.getpid()}"
    path = worktrees.add_scratch_worktree(repo, name=name, path=parent / name, commit=commit)
    try:
        yield path
    finally:
        worktrees.remove_worktree(repo, name, parent / name)


def _remove_cut_short(repo: Repo, parent: Path) -> None:
    """The throwaway worktrees of probes whose process is gone (killed mid-way)."""
    for entry in os.listdir(parent):
        pid = entry.removeprefix(_NAME).partition(".")[0]
        if entry.startswith(_NAME) and pid.isdigit() and not _alive(int(pid)):
            name = f"{_NAME}{pid}"
            worktrees.remove_worktree(repo, name, parent / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        pass
    return True


def _uncommitted(repo: Repo) -> str | None:
    """What the probe did not see: a phrase when the checkout has changes beside HEAD (but
    for coder's own config, which `coder init` writes and the tests do not read)."""
    checkout = repository.checkout_root(repo)
    if checkout is None:
        return None
    changed = workdir.status(repository.open_worktree(checkout, writing=False))
    if set(changed) - {config_mod.PROJECT_FILE}:
        return "HEAD as committed: your uncommitted changes were not probed"
    return None


_SET = "set `test_command` in coder.config.json (`coder config set test_command '...'`)"


def _judge(cmd: str, exit_code: int | None, output: str, report: testreport.TestReport) -> Probe:
    ran = (report.passed or 0) + (report.failed or 0) + (report.errors or 0)
    if report.found and ran == 0:
        return Probe(
            "no_tests",
            f"`{cmd}` found no tests ({report.summary()}); a test step would fail with "
            "'no tests ran'",
            _no_tests_fix(cmd),
        )
    if report.found and not report.failed and not report.errors and exit_code == 0:
        return Probe("ok", f"`{cmd}`: {report.summary()}")
    if report.found:
        return Probe(
            "failing",
            f"`{cmd}`: {report.summary()}: the tests run, some are red now",
            "a run's test steps start red; fix them first, or let a fix_and_retry step do it",
        )
    last = [line for line in output.strip().splitlines() if line.strip()][-3:]
    tail = "; output ends: " + " | ".join(last) if last else ""
    if exit_code == 0:
        return Probe(
            "unread",
            f"`{cmd}` passed, but its output says nothing coder can count{tail}",
            "a test step needs counted tests: use pytest, unittest, go test, cargo test, jest "
            f"or vitest, or {_SET}",
        )
    return Probe(
        "not_run",
        f"`{cmd}` failed to run (exit {exit_code}) before any test{tail}",
        _not_run_fix(cmd, exit_code, output),
    )


def _no_tests_fix(cmd: str) -> str:
    if testreport.framework_of(cmd) == "unittest":
        return (
            "unittest finds only unittest.TestCase classes in files named test*.py; for plain "
            "`def test_...` functions use pytest (`coder config set test_command 'python -m "
            "pytest -q'`), else add a test"
        )
    return f"add a test (a file the runner collects, e.g. tests/test_example.py), or {_SET}"


def _not_run_fix(cmd: str, exit_code: int | None, output: str) -> str:
    if "No module named" in output:
        return f"install the test runner for the `python` on PATH, or {_SET}"
    if exit_code == 127 or "command not found" in output:
        return f"install the program `{cmd.split()[0]}`, or {_SET}"
    return f"run `{cmd}` yourself to see why, or {_SET}"
