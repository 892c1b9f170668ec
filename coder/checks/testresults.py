"""Machine-readable test results, where the test runner offers them; text where it does not.

    structured(cmd)   the command to run instead of `cmd` to get results coder can read
                      without guessing: None when `cmd` is not one coder may change
    read(...)         the run's TestReport: the counts from the structured results, the
                      failing sections from the text as before (coder.checks.testreport); the text's
                      own counts when the structured results are missing or unparsable

What each runner gives:
    pytest     `--junitxml=$CODER_TEST_RESULTS`: a file in the command's private temp dir,
               outside the worktree (coder.policy.sandbox `results_var`)
    unittest   `python -m unittest ARGS` runs as `python coder/checks/testrunner.py ARGS`: the same
               run and output, and a JSON file of counts taken test by test (right on 3.12.0
               and 3.12.1 too, whose "Ran N" leaves skipped tests out)
    go         `go test -json`: JSON events on stdout; their `Output` is the text `go test -v`
               prints, which the failing sections are cut from
    cargo      `cargo test -- -Z unstable-options --format json`: libtest's JSON events; only
               on a nightly toolchain (stable refuses the flag), so asked only when the
               caller's `nightly()` says `rustc -V` is one

The rule for which commands get the flags: only a command line that is, as a whole, one coder
writes itself (`framework:` or detection: `python -m pytest -q`, `python -m unittest discover
-v`, `go test ./...`, `cargo test`, or the plain `pytest`; any `python` by its path),
optionally followed by plain arguments (a step's `args`). Whoever wrote it (a step's `cmd`
and the config's `test_command` included), such a line runs the same tests with the flags as
without. Anything else is the
user's own command and runs exactly as written, its output read as text: a wrapper (`tox`,
`make test`, `npm test`), a pipe, `&&`, a variable assignment, an expansion (`$X`), or options
that already choose an output of that kind (`--junitxml`, `-json`, `--format`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from coder.checks.testreport import TestReport, parse_output

RESULTS_VAR = "CODER_TEST_RESULTS"  # the file a run's structured results go to
RUNNER = Path(__file__).with_name("testrunner.py")  # unittest's counting runner
_PYTHONS = re.compile(r"python(?:3(?:\.\d+)?)?")
_PLAIN = re.compile(r"[\w@%+=:,./-]+")  # an argument with nothing the shell would expand
_CARGO_JSON = ("--", "-Z", "unstable-options", "--format", "json")
_SUBCOMMANDS: dict[tuple[str, ...], str] = {
    ("go", "test"): "go",
    ("cargo", "test"): "cargo",
}  # argv[:2] -> runner
# libtest's JSON events: (type, event) of a test's result, and of a suite's end
_TEST_DONE = {("test", "ok"), ("test", "failed"), ("test", "ignored")}
_SUITE_DONE = {("suite", "ok"), ("suite", "failed")}


@dataclass(frozen=True)
class Structured:
    framework: str  # pytest | unittest | go | cargo
    command: str  # what runs instead of the command asked for
    results_file: bool  # results in the file $CODER_TEST_RESULTS names; else JSON on stdout


def structured(cmd: str, *, nightly: Callable[[], bool] = lambda: False) -> Structured | None:
    """The structured form of test command `cmd` (see the module docstring), or None."""
    try:
        argv = shlex.split(cmd)
    except ValueError:
        return None
    if not argv or not all(_PLAIN.fullmatch(a) for a in argv):
        return None
    head, rest = _head(argv)
    if head == "pytest" and not any(
        a.startswith(("--junitxml", "--junit-xml", "--junit-prefix")) or "no:junitxml" in a
        for a in rest
    ):
        return Structured("pytest", f'{cmd} --junitxml="${RESULTS_VAR}"', True)
    if head == "unittest":
        runner = [argv[0], str(RUNNER), *rest]
        return Structured("unittest", shlex.join(runner), True)
    if head == "go" and not any(a.startswith(("-json", "--json")) for a in rest):
        return Structured("go", shlex.join(["go", "test", "-json", *rest]), False)
    if head == "cargo" and "--" not in rest and nightly():
        return Structured("cargo", shlex.join(["cargo", "test", *rest, *_CARGO_JSON]), False)
    return None


def _head(argv: list[str]) -> tuple[str | None, list[str]]:
    """The runner a plain command line starts with, and the arguments after it."""
    if argv[0] in ("pytest", "py.test"):
        return "pytest", argv[1:]
    if _PYTHONS.fullmatch(os.path.basename(argv[0])) and argv[1:2] == ["-m"] and len(argv) > 2:
        if argv[2] in ("pytest", "unittest"):
            return argv[2], argv[3:]
    runner = _SUBCOMMANDS.get(tuple(argv[:2]))
    return (runner, argv[2:]) if runner else (None, [])


class Finished(Protocol):
    """What `read_result` needs of a finished command (policy.sandbox.CommandResult)."""

    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def results(self) -> bytes | None: ...


def read_result(plan: Structured | None, result: Finished, framework: str | None) -> TestReport:
    """`read` of a finished command's output, exit code and results file."""
    return read(
        plan,
        stdout=result.stdout,
        stderr=result.stderr,
        exit_code=result.exit_code,
        results=result.results,
        framework=framework,
    )


def read(
    plan: Structured | None,
    *,
    stdout: str,
    stderr: str,
    exit_code: int | None,
    results: bytes | None,
    framework: str | None,
) -> TestReport:
    """The report of a test run (see the module docstring): `plan` is what `structured` gave
    for its command (None: text only), `results` the bytes of its results file."""
    text = stdout
    counts: tuple[int, int, int, int] | None = None
    if plan is not None:
        try:
            if plan.framework == "pytest" and results:
                counts = junit_counts(results)
            elif plan.framework == "unittest" and results:
                counts = unittest_counts(results)
            elif plan.framework == "go":
                text, counts = go_events(stdout)
            elif plan.framework == "cargo":
                text, counts = cargo_events(stdout)
        except (ValueError, TypeError, KeyError, RecursionError):
            counts = None  # unparsable: the text says what it can
    report = parse_output(text + "\n" + stderr, framework, exit_code=exit_code)
    if counts is None:
        return report
    assert plan is not None
    passed, failed, skipped, errors = counts
    return replace(
        report,
        passed=passed,
        failed=failed,
        skipped=skipped,
        errors=errors,
        framework=plan.framework,
        unit="tests",
    )


def refused(plan: Structured, exit_code: int | None, results: bytes | None, stderr: str) -> bool:
    """Whether the runner refused the structured flags themselves, so the plain command must
    run instead: pytest's usage error (exit 4: a config that turns the junitxml plugin off)
    with no results file written; a stable libtest refusing `-Z` (the nightly check was
    wrong)."""
    if plan.framework == "pytest":
        return exit_code == 4 and results is None
    return plan.framework == "cargo" and "only accepted on the nightly compiler" in stderr


# --- the parsers --------------------------------------------------------------------------


def junit_counts(data: bytes) -> tuple[int, int, int, int]:
    """(passed, failed, skipped, errors) of a JUnit XML report, testcase by testcase, counted
    as pytest's summary line counts them (a failed test that also errors in its teardown is
    both; xfail is skipped, xpass passed)."""
    from xml.etree import ElementTree

    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:  # pytest writes none: refuse expansions
        raise ValueError("a JUnit report with a DTD")
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"not a JUnit report: <{root.tag}>")
    passed = failed = skipped = errors = 0
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        failed += "failure" in tags
        errors += "error" in tags
        skipped += "skipped" in tags and not tags & {"failure", "error"}
        passed += not tags & {"failure", "error", "skipped"}
    return passed, failed, skipped, errors


def unittest_counts(data: bytes) -> tuple[int, int, int, int]:
    """The counts coder's unittest runner (coder/checks/testrunner.py) wrote."""
    found = json.loads(data)
    values = tuple(found[key] for key in ("passed", "failed", "skipped", "errors"))
    if not all(isinstance(v, int) and v >= 0 for v in values):
        raise ValueError("counts must be non-negative integers")
    return values[0], values[1], values[2], values[3]


def _events(stdout: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON objects among stdout's lines, and the other lines (in order, for the text)."""
    events: list[dict[str, Any]] = []
    other: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict):
                events.append(event)
                continue
        other.append(line)
    return events, other


def go_events(stdout: str) -> tuple[str, tuple[int, int, int, int] | None]:
    """`go test -json`: (the text `go test -v` would have printed, the counts of top-level
    tests: pass, fail, skip, and as errors the packages that failed with no test failing
    (a build failure)). No counts when stdout holds no event."""
    events, other = _events(stdout)
    if not events:
        return stdout, None
    text: list[str] = []
    passed = failed = skipped = 0
    failed_packages: dict[str, bool] = {}  # package -> one of its tests failed
    for event in events:
        action, test, package = event.get("Action"), event.get("Test"), event.get("Package", "")
        if action in ("output", "build-output") and isinstance(event.get("Output"), str):
            text.append(event["Output"])
        elif isinstance(test, str) and "/" not in test:  # subtests: their parent says
            passed += action == "pass"
            failed += action == "fail"
            skipped += action == "skip"
            if action == "fail":
                failed_packages[package] = True
        elif test is None and action == "fail":
            failed_packages.setdefault(package, False)
    errors = sum(1 for had_failing_test in failed_packages.values() if not had_failing_test)
    body = "".join(text)
    return body + ("\n".join(other) + "\n" if other else ""), (passed, failed, skipped, errors)


def cargo_events(stdout: str) -> tuple[str, tuple[int, int, int, int] | None]:
    """libtest's JSON (`--format json`): (text as libtest prints it without JSON, for the
    failing sections: each failed test's output and the `test result:` lines; the counts
    summed over every test binary's suite). No counts when no suite finished."""
    events, other = _events(stdout)
    text = list(other)
    finished = False
    passed = failed = ignored = 0
    failures: list[str] = []
    for event in events:
        what = event.get("event")
        if (event.get("type"), what) in _TEST_DONE:
            name = event.get("name", "?")
            text.append(f"test {name} ... {'FAILED' if what == 'failed' else what}")
            if what == "failed":
                failures.append(f"---- {name} stdout ----\n{event.get('stdout', '')}")
        elif (event.get("type"), what) in _SUITE_DONE:
            finished = True
            p, f, i = (int(event.get(k, 0)) for k in ("passed", "failed", "ignored"))
            passed, failed, ignored = passed + p, failed + f, ignored + i
            if failures:
                text += ["", "failures:", "", *failures, ""]
                failures = []
            text.append(
                f"test result: {'ok' if what == 'ok' else 'FAILED'}. {p} passed; {f} failed; "
                f"{i} ignored; {int(event.get('measured', 0))} measured; "
                f"{int(event.get('filtered_out', 0))} filtered out"
            )
    if not finished:
        return stdout, None
    return "\n".join(text) + "\n", (passed, failed, ignored, 0)


def rustc_nightly(version: str) -> bool:
    """Whether `rustc -V` printed a nightly (or locally built) compiler's version."""
    return bool(re.match(r"rustc \S+-(?:nightly|dev)\b", version.strip()))
