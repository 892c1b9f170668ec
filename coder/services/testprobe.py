"""The test command run once, as `coder init` and `coder doctor` do: does it find tests?

A run's test step fails with "no tests ran" when the command finds none, and a command that
cannot start (pytest not installed, a program the policy refuses) fails every test step. Both
are cheaper to learn before a run. So `probe` runs the command the way a test step does:
through the sandbox with the config's policy, structured results where the runner offers them
(coder.testresults), a timeout; in the checkout itself (what `pytest` typed there does too,
caches and all; coder sets PYTHONDONTWRITEBYTECODE). `coder init --no-test-probe` and
`coder doctor --no-test-probe` skip it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from coder import config as config_mod
from coder import testreport, testresults
from coder.errors import CoderError, PolicyViolation

TIMEOUT_S = 120.0
Outcome = Literal["ok", "failing", "no_tests", "not_run", "unread"]


@dataclass(frozen=True)
class Probe:
    outcome: Outcome
    detail: str  # what happened, one line
    fix: str | None = None  # what to do about it

    @property
    def status(self) -> str:
        """As `coder doctor` grades it."""
        return "ok" if self.outcome == "ok" else "warn"


def probe(root: Path, cmd: str, cfg: config_mod.Config, *, timeout: float = TIMEOUT_S) -> Probe:
    """Run test command `cmd` once in `root` and say what it found."""
    from coder.policy import sandbox
    from coder.policy.commands import Policy
    from coder.run.steps.test import rust_nightly

    policy = Policy.from_config(cfg.values)
    plan = testresults.structured(cmd, nightly=lambda: rust_nightly(root, policy))
    try:
        result = sandbox.run_command(
            plan.command if plan else cmd,
            cwd=root,
            policy=policy,
            timeout=timeout,
            env={"PYTHONDONTWRITEBYTECODE": "1"},
            root=root,
            results_var=testresults.RESULTS_VAR if plan and plan.results_file else None,
        )
    except PolicyViolation as exc:
        return Probe("not_run", f"`{cmd}` was not run: {exc.message}", exc.hint or _SET)
    except CoderError as exc:  # no sandbox on this machine
        return Probe("not_run", f"`{cmd}` could not be run: {exc.message}", exc.hint)
    if result.timed_out:
        return Probe(
            "not_run",
            f"`{cmd}` did not finish within {timeout:g} s",
            "check that the tests end on their own; a test step waits for its own timeout",
        )
    report = testresults.read_result(plan, result, testreport.framework_of(cmd))
    return _judge(cmd, result.exit_code, result.stdout + "\n" + result.stderr, report)


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
