"""Which command runs a project's tests, and what its output says.

`test_command` picks the command (a step's own `cmd`, its `framework`, the configured
`test_command`, or detection). `parse_output` reads the final counts each framework prints and
`failing_sections` cuts out the parts of the log that explain the failures, so the model gets
the tracebacks, not the whole log.

Counting rules worth knowing:
  * pytest: `xfailed` counts as skipped and `xpassed` as passed (a strict xpass is already
    reported by pytest as failed); `deselected`, `warnings` and `rerun` are ignored.
  * unittest: with `-v` (coder's default command) passed is the count of tests reported `ok`;
    without it passed = ran - failures - errors - skipped (wrong on Python 3.12.0 and 3.12.1,
    whose "Ran N" leaves skipped tests out). Expected failures count as skipped, unexpected
    successes as failed (they make the run red since Python 3.4).
  * jest / vitest: `todo` counts as skipped; a suite that failed to run (no failed test, but a
    failed suite/file) counts as an error, so such a run never looks green.
  * go: with `-v` (`=== RUN` lines present) top-level tests are counted (subtests are not, their
    parent already carries the result). Without `-v` go prints only package lines, so packages
    are counted and the report says so (`unit="packages"`). Build/setup failures are errors.
  * cargo: every `test result:` line (one per test binary and doc-tests) is summed; ignored
    counts as skipped.
  * pytest, unittest, jest and vitest print one summary per run, so the last one wins.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from coder.checks.testcommand import detect_test_command
from coder.errors import InvalidInput

FRAMEWORKS = ("pytest", "unittest", "vitest", "jest", "go", "cargo")

_FRAMEWORK_COMMANDS = {
    "pytest": "python -m pytest -q",
    "unittest": "python -m unittest discover -v",
    "vitest": "npx vitest run",
    "jest": "npx jest",
    "go": "go test ./...",
    "cargo": "cargo test",
}


def test_command(
    *,
    root: Path,
    framework: str | None = None,
    cmd: str | None = None,
    args: Sequence[str] | None = (),
    configured: str | None = None,
) -> str:
    """The shell command for a test step: `cmd` > `framework` > `configured` > detection."""
    if cmd:
        base: str | None = cmd
    elif framework:
        if framework not in _FRAMEWORK_COMMANDS:
            raise InvalidInput(
                f"unknown test framework {framework!r}", hint=f"use one of: {', '.join(FRAMEWORKS)}"
            )
        base = _FRAMEWORK_COMMANDS[framework]
        if framework == "unittest" and (root / "tests").is_dir():
            base = "python -m unittest discover -s tests -v"
    elif configured:
        base = configured
    else:
        base = detect_test_command(root)
    if not base:
        raise InvalidInput(
            f"no test command could be found in {root}",
            hint="set `test_command` in coder.config.json, or `cmd` or `framework` on the step",
        )
    if args:
        base += " " + " ".join(shlex.quote(a) for a in args)
    return base


test_command.__test__ = False  # type: ignore[attr-defined]  # not a test, despite its name


# A framework's executable as a whole word of the command line ("pytest-xdist" is not pytest).
_COMMAND_PATTERNS = tuple(
    (name, re.compile(rf"(?<![\w.-]){word}(?![\w.-])"))
    for name, word in (
        ("pytest", r"(?:py\.test|pytest)"),
        ("unittest", r"unittest"),
        ("vitest", r"vitest"),
        ("jest", r"jest"),
        ("go", r"go\s+test"),
        ("cargo", r"cargo\s+(?:\+\S+\s+)?test"),  # `cargo +nightly test`
    )
)


def framework_of(command: str) -> str | None:
    """The framework a command line runs, or None (e.g. `npm test`: parsing then tries all)."""
    for name, pattern in _COMMAND_PATTERNS:
        if pattern.search(command):
            return name
    return None


@dataclass(frozen=True)
class TestReport:
    __test__ = False  # pytest: this is not a test class

    passed: int | None
    failed: int | None
    skipped: int | None
    errors: int | None
    framework: str | None
    failures: tuple[str, ...]
    unit: str = "tests"  # "packages" for `go test` without -v

    @property
    def found(self) -> bool:
        return any(n is not None for n in (self.passed, self.failed, self.skipped, self.errors))

    def summary(self) -> str:
        """Like pytest's last line: the non-zero counts, e.g. "12 passed, 1 failed, 2 skipped"."""
        if not self.found:
            return "no counts found"
        parts = [
            f"{n} {word}"
            for n, word in (
                (self.passed, "passed"),
                (self.failed, "failed"),
                (self.skipped, "skipped"),
                (self.errors, "error" if self.errors == 1 else "errors"),
            )
            if n
        ]
        text = ", ".join(parts) or "no tests ran"
        return text if self.unit == "tests" else f"{text} (counted in {self.unit})"

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["failures"] = list(self.failures)
        return data


# ---------------------------------------------------------------------------------------------
# Counts. Each parser returns (passed, failed, skipped, errors[, unit]) or None if the output
# holds no summary of its framework. All patterns are anchored per line and free of nested
# ambiguous quantifiers, so they run in linear time on large logs.

_Counts = tuple[int, int, int, int, str]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """Drop colour/cursor codes and carriage-return redraws; keep what a terminal would show."""
    text = _ANSI.sub("", text).replace("\r\n", "\n")
    if "\r" in text:  # progress redraws: a line shows what follows its last \r
        text = "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))
    return text


_PAIR = re.compile(r"(\d+) ([a-z]+)")

_PYTEST_SUMMARY = re.compile(
    r"^=*[ \t]*(?P<counts>\d+ [a-z]+(?:, \d+ [a-z]+)*|no tests ran) in \d+(?:\.\d+)?s\b", re.M
)
_UNITTEST_SUMMARY = re.compile(
    r"^Ran (?P<ran>\d+) tests? in \S+\n(?:[ \t]*\n)*"
    r"(?P<result>OK|FAILED|NO TESTS RAN)(?: \((?P<details>[^)\n]*)\))?[ \t]*$",
    re.M,
)
_JEST_TESTS = re.compile(r"^Tests:[ \t]+(?P<counts>\d+ [a-z]+(?:, \d+ [a-z]+)*)[ \t]*$", re.M)
_JEST_SUITES = re.compile(r"^Test Suites:[ \t]+(?P<counts>\d+ [a-z]+(?:, \d+ [a-z]+)*)", re.M)
_VITEST_TESTS = re.compile(
    r"^[ \t]*Tests[ \t]+(?P<counts>\d+ [a-z]+(?: \| \d+ [a-z]+)*|no tests)", re.M
)
_VITEST_FILES = re.compile(
    r"^[ \t]*Test Files[ \t]+(?P<counts>\d+ [a-z]+(?: \| \d+ [a-z]+)*)", re.M
)
_VITEST_ERRORS = re.compile(r"^[ \t]*Errors[ \t]+(\d+) errors?", re.M)
_GO_TEST = re.compile(r"^--- (PASS|FAIL|SKIP): ", re.M)  # column 0: top-level tests only
_GO_RUN = re.compile(r"^=== RUN ", re.M)
# "ok  \tpkg\t0.01s" / "FAIL\tpkg [build failed]"; the tab keeps TAP's "ok 1 - name" out
_GO_PACKAGE = re.compile(r"^(ok|FAIL) *\t\S+(?P<broken> \[\w+ failed\])?", re.M)
_CARGO_RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", re.M)


def _pairs(counts: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for number, word in _PAIR.findall(counts):
        found[word] = found.get(word, 0) + int(number)
    return found


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    match = None
    for match in pattern.finditer(text):
        pass
    return match


def _parse_pytest(text: str) -> _Counts | None:
    match = _last(_PYTEST_SUMMARY, text)
    if match is None:
        return None
    c = _pairs(match["counts"])
    if match["counts"] != "no tests ran" and not c.keys() & {
        "passed",
        "failed",
        "skipped",
        "error",
        "errors",
        "xfailed",
        "xpassed",
        "deselected",
    }:
        return None  # some other "N things in 2s" line
    return (
        c.get("passed", 0) + c.get("xpassed", 0),
        c.get("failed", 0),
        c.get("skipped", 0) + c.get("xfailed", 0),
        c.get("error", 0) + c.get("errors", 0),
        "tests",
    )


def _parse_unittest(text: str) -> _Counts | None:
    match = _last(_UNITTEST_SUMMARY, text)
    if match is None:
        return None
    d = {key.strip(): int(n) for key, n in re.findall(r"([a-z ]+)=(\d+)", match["details"] or "")}
    failed = d.get("failures", 0) + d.get("unexpected successes", 0)
    skipped = d.get("skipped", 0) + d.get("expected failures", 0)
    errors = d.get("errors", 0)
    verbose = text[: match.start()]
    if _UNITTEST_VERBOSE.search(verbose) and "bytes omitted ...]" not in verbose:
        # `-v` names each test's result: exact on every Python (3.12.0 and 3.12.1 leave
        # skipped tests out of "Ran N", so one passed and one skipped test read "Ran 1 ...
        # OK (skipped=1)", the same as one skipped test on any other version)
        return len(_UNITTEST_OK.findall(verbose)), failed, skipped, errors, "tests"
    return max(int(match["ran"]) - failed - skipped - errors, 0), failed, skipped, errors, "tests"


_UNITTEST_VERBOSE = re.compile(
    r" \.\.\. (?:ok|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$", re.M
)
_UNITTEST_OK = re.compile(r"(?: \.\.\. |^)ok$", re.M)  # a test's own stderr may split the line


def _parse_jest(text: str) -> _Counts | None:
    tests = _last(_JEST_TESTS, text)
    if tests is None:
        return None
    c = _pairs(tests["counts"])
    suites = _last(_JEST_SUITES, text)
    broken = _pairs(suites["counts"]).get("failed", 0) if suites else 0
    return (
        c.get("passed", 0),
        c.get("failed", 0),
        c.get("skipped", 0) + c.get("todo", 0),
        broken if not c.get("failed") else 0,
        "tests",
    )


def _parse_vitest(text: str) -> _Counts | None:
    tests = _last(_VITEST_TESTS, text)
    if tests is None:
        return None
    c = _pairs(tests["counts"])
    files = _last(_VITEST_FILES, text)
    broken = _pairs(files["counts"]).get("failed", 0) if files else 0
    unhandled = _last(_VITEST_ERRORS, text)
    errors = (broken if not c.get("failed") else 0) + (int(unhandled[1]) if unhandled else 0)
    return (
        c.get("passed", 0),
        c.get("failed", 0),
        c.get("skipped", 0) + c.get("todo", 0),
        errors,
        "tests",
    )


def _parse_go(text: str) -> _Counts | None:
    packages = [(m[1], bool(m["broken"])) for m in _GO_PACKAGE.finditer(text)]
    broken = sum(1 for _, is_broken in packages if is_broken)
    if _GO_RUN.search(text):  # -v: per-test lines exist
        results = _GO_TEST.findall(text)
        return (
            results.count("PASS"),
            results.count("FAIL"),
            results.count("SKIP"),
            broken,
            "tests",
        )
    if not packages:
        return None
    return (
        sum(1 for status, _ in packages if status == "ok"),
        sum(1 for status, is_broken in packages if status == "FAIL" and not is_broken),
        0,
        broken,
        "packages",
    )


def _parse_cargo(text: str) -> _Counts | None:
    results = _CARGO_RESULT.findall(text)
    if not results:
        return None
    passed, failed, ignored = (sum(int(r[i]) for r in results) for i in range(3))
    return passed, failed, ignored, 0, "tests"


_PARSERS: dict[str, Callable[[str], _Counts | None]] = {
    "pytest": _parse_pytest,
    "unittest": _parse_unittest,
    "vitest": _parse_vitest,
    "jest": _parse_jest,
    "go": _parse_go,
    "cargo": _parse_cargo,
}


def _counts(text: str, framework: str | None) -> tuple[str, _Counts] | None:
    """The named framework's parser first, then the others: the hint may be a guess."""
    for name in sorted(FRAMEWORKS, key=lambda f: f != framework):  # stable: the hint first
        found = _PARSERS[name](text)
        if found is not None:
            return name, found
    return None


def parse_output(
    text: str, framework: str | None = None, *, exit_code: int | None = None
) -> TestReport:
    """Counts and failing sections from a test run's output (stdout and stderr together).

    Failing sections are extracted unless the run is green: no failures or errors counted and
    `exit_code` 0 (or, without an exit code, counts were found). Pass `exit_code` so that a run
    that is red for another reason (coverage threshold, crash) still gets its log tail.
    """
    text = strip_ansi(text)
    hit = _counts(text, framework)
    name = framework
    found: tuple[int | None, int | None, int | None, int | None, str]
    found = (None, None, None, None, "tests")
    if hit is not None:
        name, found = hit
    passed, failed, skipped, errors, unit = found
    red_exit = exit_code is not None and exit_code != 0
    green = not failed and not errors and not red_exit and (exit_code == 0 or hit is not None)
    failures = () if green else failing_sections(text, name)
    return TestReport(passed, failed, skipped, errors, name, failures, unit)


# ---------------------------------------------------------------------------------------------
# Failing sections. A rule opens a block on a `start` line (unless `skip` matches it) and closes
# it before a `stop` line or the next start; blocks are kept in output order, summary-line
# blocks first.


@dataclass(frozen=True)
class _Rule:
    start: re.Pattern[str]
    stop: re.Pattern[str]
    skip: re.Pattern[str] | None = None
    single_lines: bool = False  # each start line is its own section (gathered into one block)


def _rule(start: str, stop: str, skip: str | None = None, single_lines: bool = False) -> _Rule:
    return _Rule(
        re.compile(start), re.compile(stop), re.compile(skip) if skip else None, single_lines
    )


_PYTEST_END = r"^=|^!{3,}|^\d+ [a-z]+(?:, \d+ [a-z]+)* in \d"
_RULES: dict[str, tuple[_Rule, ...]] = {
    "pytest": (
        # the short test summary ("FAILED (" is unittest's last line, not pytest's)
        _rule(r"^(?:FAILED|ERROR) [^\s(]", r"^", single_lines=True),
        _rule(r"^_{3,} \S.* _{3,}$", _PYTEST_END),  # `____ test_name ____` blocks
    ),
    "unittest": (_rule(r"^(?:FAIL|ERROR|UNEXPECTED SUCCESS): ", r"^={20,}|^Ran \d+ tests? in "),),
    "jest": (
        _rule(
            r"^\s*● ",
            r"^\s*(?:PASS|FAIL)\s|^(?:Test Suites|Tests|Snapshots|Time):"
            r"|^Summary of all failing tests",
            skip=r"^\s*● Console\s*$",
        ),
    ),
    "vitest": (_rule(r"^\s*FAIL\s+\S", r"^\s*⎯{3,}|^\s*Test Files\s|^\s*Tests\s"),),
    "go": (  # `--- FAIL:` blocks are cut by _go_blocks (their output may precede them)
        _rule(r"^# \S", r"^(?:FAIL|ok|\?)\s|^FAIL$|^\s*$|^=== |^--- "),  # build/vet errors
        _rule(r"^panic: ", r"^(?:FAIL|ok)\s|^FAIL$|^exit status "),
    ),
    "cargo": (
        _rule(
            r"^---- .+ (?:stdout|stderr) ----$", r"^failures:$|^test result: |^error: test failed"
        ),
        _rule(
            r"^error(?:\[E\d+\])?: ",
            r"^\s*$",  # compile errors, not cargo's own verdict
            skip=r"^error: (?:test failed|\d+ targets? failed)",
        ),
    ),
}

_GO_FAIL = re.compile(r"^--- FAIL: ")
_GO_MARKER = re.compile(r"^(?:=== |--- )")
_SEPARATOR = re.compile(r"-{10,}|={10,}|⎯{3,}.*|")  # fullmatch on a stripped line: rule or blank

FALLBACK_LINES = 60
_MAX_BLOCK_LINES = 80  # a longer block keeps its head and tail (the assertion is usually last)
_MAX_LINE_CHARS = 400
_NOTE_RESERVE = 300


def _scan(lines: list[str], rule: _Rule) -> list[tuple[int, list[str]]]:
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    for i, line in enumerate(lines):
        if rule.start.match(line):
            current = None
            if rule.skip is None or not rule.skip.match(line):
                current = [line]
                blocks.append((i, current))
            if rule.single_lines:
                current = None
        elif current is not None:
            if rule.stop.match(line):
                current = None
            else:
                current.append(line)
    if rule.single_lines and blocks:  # one compact block of summary lines
        return [(blocks[0][0], [b[1][0] for b in blocks])]
    return blocks


def _go_blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    """A top-level `--- FAIL:` line with its indented output: before it (-v) and after it."""
    blocks: list[tuple[int, list[str]]] = []
    for i, line in enumerate(lines):
        if not _GO_FAIL.match(line):
            continue
        first = i
        while (
            first > 0
            and lines[first - 1][:1] in (" ", "\t")
            and not _GO_MARKER.match(lines[first - 1])
        ):
            first -= 1
        last = i + 1
        while last < len(lines) and lines[last][:1] in (" ", "\t"):
            last += 1
        blocks.append((first, lines[first:last]))
    return blocks


def _tidy(block: list[str]) -> str:
    while block and _SEPARATOR.fullmatch(block[-1].strip()):
        block = block[:-1]
    block = [
        line if len(line) <= _MAX_LINE_CHARS else line[:_MAX_LINE_CHARS] + " [...]"
        for line in block
    ]
    if len(block) > _MAX_BLOCK_LINES:
        head, tail = 30, _MAX_BLOCK_LINES - 30
        cut = len(block) - head - tail
        block = [*block[:head], f"[... {cut} lines cut ...]", *block[-tail:]]
    return "\n".join(block)


def _sections(lines: list[str], framework: str) -> list[str]:
    # Summary-line blocks (pytest's `FAILED ...` list) go first: if the cap cuts, they still
    # name every failure. The other blocks keep the order of the output.
    blocks = [
        (not rule.single_lines, i, block)
        for rule in _RULES[framework]
        for i, block in _scan(lines, rule)
    ]
    if framework == "go":
        blocks += [(True, i, block) for i, block in _go_blocks(lines)]
    found: dict[str, None] = {}  # ordered and deduplicated: jest repeats every failure at the end
    for _, _, block in sorted(blocks, key=lambda b: b[:2]):
        found.setdefault(_tidy(block))
    found.pop("", None)
    return list(found)


def failing_sections(text: str, framework: str | None, limit_chars: int = 6000) -> tuple[str, ...]:
    """The parts of a test log that explain its failures, at most `limit_chars` in total.

    With no framework, the one whose summary is found is used, else the first whose failure
    blocks match. Nothing matched: the last FALLBACK_LINES lines. When sections are cut, the
    last element is a note naming what was left out.
    """
    lines = strip_ansi(text).split("\n")
    if framework in _RULES:
        order = [framework]
    else:
        hit = _counts("\n".join(lines), None)
        order = [hit[0]] if hit else list(FRAMEWORKS)
    sections: list[str] = []
    for name in order:
        sections = _sections(lines, name)
        if sections:
            break
    if not sections:
        tail = "\n".join(lines).rstrip().split("\n")[-FALLBACK_LINES:]
        sections = ["\n".join(tail)] if tail != [""] else []
    return _cap(sections, limit_chars)


def _cap(sections: list[str], limit: int) -> tuple[str, ...]:
    if sum(map(len, sections)) <= limit:
        return tuple(sections)
    reserve = min(_NOTE_RESERVE, limit // 2)  # room for the note, so the total stays <= limit
    budget = limit - reserve
    kept: list[str] = []
    for section in sections:
        if len(section) > budget:
            break
        kept.append(section)
        budget -= len(section)
    cut = sections[len(kept) :]
    if budget > 200 or not kept:  # a useful part of the first section left out still fits
        kept.append(_shorten(cut[0], budget))
        cut = cut[1:]
    if cut:
        names = ", ".join(s.split("\n", 1)[0].strip("_=-⎯ ")[:60] for s in cut[:3])
        more = f" and {len(cut) - 3} more" if len(cut) > 3 else ""
        note = (
            f"[output cut to {limit} chars: {len(cut)} more failing section(s) left out: "
            f"{names}{more}]"
        )
    else:
        note = f"[output cut to {limit} chars: the last section was shortened]"
    return (*kept, note[:reserve]) if reserve else tuple(kept)


def _shorten(section: str, room: int) -> str:
    """At most `room` chars of a section: whole lines from its head (the test's name, a third of
    the room) and from its tail (where the assertion or exception usually is)."""
    marker = "[... section cut ...]"
    left = room - len(marker) - 2  # the marker and its two newlines
    if left <= 0:
        return section[:room]
    lines = section.split("\n")
    head: list[str] = []
    head_room = left // 3
    for line in lines:
        if len(line) + 1 > head_room:
            break
        head.append(line)
        head_room -= len(line) + 1
        left -= len(line) + 1
    tail: list[str] = []
    for line in reversed(lines[len(head) :]):
        if len(line) + 1 > left:
            break
        tail.append(line)
        left -= len(line) + 1
    if not head and not tail:  # one very long line
        return section[: room - len(marker) - 1] + "\n" + marker
    return "\n".join([*head, marker, *reversed(tail)])
