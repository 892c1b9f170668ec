"""Test command choice, framework detection, and parsing of real test-runner output.

The samples follow the formats the real tools print (pytest, unittest, vitest, jest, go test,
cargo test); pytest and unittest are also run for real in a throwaway project.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coder.checks import testcommand, testreport
from coder.errors import InvalidInput

# `testreport.TestReport` / `testreport.test_command` are used through the module so pytest does not
# try to collect them from this file.
Report = testreport.TestReport

PYTEST_OUTPUT = """\
============================= test session starts ==============================
platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0
rootdir: /home/dev/shop
configfile: pyproject.toml
collected 9 items / 1 deselected / 8 selected

tests/test_api.py ..F.s                                                  [ 62%]
tests/test_db.py .xE                                                     [100%]

==================================== ERRORS ====================================
______________________ ERROR at setup of test_connection _______________________

    @pytest.fixture
    def db():
>       raise ConnectionError("database is down")
E       ConnectionError: database is down

tests/test_db.py:8: ConnectionError
=================================== FAILURES ===================================
_______________________________ test_parse_date ________________________________

    def test_parse_date():
>       assert parse_date("2024-02-30") is None
E       AssertionError: assert datetime.date(2024, 3, 1) is None
E        +  where datetime.date(2024, 3, 1) = parse_date('2024-02-30')

tests/test_api.py:21: AssertionError
----------------------------- Captured stdout call -----------------------------
parsing 2024-02-30
=========================== short test summary info ============================
FAILED tests/test_api.py::test_parse_date - AssertionError: assert datetime.date(2024, 3, 1) is None
ERROR tests/test_db.py::test_connection - ConnectionError: database is down
=== 1 failed, 4 passed, 1 skipped, 1 deselected, 1 xfailed, 1 error in 0.42s ===
"""

# pytest --color=yes, as captured from a real run
PYTEST_COLOURED_TAIL = (
    "\x1b[36m\x1b[1m=========================== short test summary info "
    "============================\x1b[0m\n"
    "\x1b[31mFAILED\x1b[0m tests/test_calc.py::\x1b[1mCalcTests::test_sub_fails\x1b[0m"
    " - AssertionError: 8 != 2 : sub is broken\n"
    "\x1b[31m\x1b[31m\x1b[1m1 failed\x1b[0m, \x1b[32m1 passed\x1b[0m, \x1b[33m1 skipped\x1b[0m"
    "\x1b[31m in 0.06s\x1b[0m\x1b[0m\n"
)

UNITTEST_OUTPUT = """\
test_add (tests.test_cart.CartTests.test_add) ... ok
test_discount (tests.test_cart.CartTests.test_discount) ... expected failure
test_remove (tests.test_cart.CartTests.test_remove) ... ok
test_slow (tests.test_cart.CartTests.test_slow) ... skipped 'slow'
test_total (tests.test_cart.CartTests.test_total) ... FAIL
test_empty (tests.test_io.LoaderTests.test_empty) ... ok
test_load (tests.test_io.LoaderTests.test_load) ... ERROR

======================================================================
ERROR: test_load (tests.test_io.LoaderTests.test_load)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/home/dev/shop/tests/test_io.py", line 12, in test_load
    data = load("missing.json")
           ^^^^^^^^^^^^^^^^^^^^
FileNotFoundError: [Errno 2] No such file or directory: 'missing.json'

======================================================================
FAIL: test_total (tests.test_cart.CartTests.test_total)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/home/dev/shop/tests/test_cart.py", line 20, in test_total
    self.assertEqual(cart.total(), 30)
AssertionError: 25 != 30

----------------------------------------------------------------------
Ran 7 tests in 0.004s

FAILED (failures=1, errors=1, skipped=1, expected failures=1)
"""

VITEST_OUTPUT = """\

 \x1b[1m\x1b[46m RUN \x1b[49m\x1b[22m \x1b[36mv1.6.0 \x1b[39m\x1b[90m/home/dev/app\x1b[39m

 \x1b[31m❯\x1b[39m src/math.test.ts \x1b[2m(\x1b[22m\x1b[2m4 tests\x1b[22m\x1b[2m | \x1b[22m\x1b[31m1 failed\x1b[39m\x1b[2m | \x1b[22m\x1b[33m1 skipped\x1b[39m\x1b[2m)\x1b[22m\x1b[90m 6\x1b[2mms\x1b[22m\x1b[39m
\x1b[31m   \x1b[31m×\x1b[31m math\x1b[2m > \x1b[22mdivides by zero safely\x1b[39m\x1b[32m 3\x1b[2mms\x1b[22m\x1b[39m
\x1b[31m     → expected Infinity to be +0 // Object.is equality\x1b[39m
 \x1b[32m✓\x1b[39m src/format.test.ts \x1b[2m(\x1b[22m\x1b[2m10 tests\x1b[22m\x1b[2m)\x1b[22m\x1b[90m 4\x1b[2mms\x1b[22m\x1b[39m

\x1b[31m⎯⎯⎯⎯⎯⎯⎯\x1b[39m\x1b[1m\x1b[41m Failed Tests 1 \x1b[49m\x1b[22m\x1b[31m⎯⎯⎯⎯⎯⎯⎯\x1b[39m

\x1b[41m\x1b[1m FAIL \x1b[22m\x1b[49m src/math.test.ts\x1b[2m > \x1b[22mmath\x1b[2m > \x1b[22mdivides by zero safely
\x1b[31m\x1b[1mAssertionError\x1b[22m: expected Infinity to be +0 // Object.is equality\x1b[39m

\x1b[32m- Expected\x1b[39m
\x1b[31m+ Received\x1b[39m

\x1b[32m- 0\x1b[39m
\x1b[31m+ Infinity\x1b[39m

\x1b[36m \x1b[2m❯\x1b[22m src/math.test.ts:\x1b[2m14:25\x1b[22m\x1b[39m
    \x1b[90m 12| \x1b[39m
    \x1b[90m 13| \x1b[39m  it(\x1b[32m'divides by zero safely'\x1b[39m, () => {
    \x1b[90m 14| \x1b[39m    expect(divide(1, 0)).toBe(0)
    \x1b[90m   | \x1b[39m                        \x1b[31m^\x1b[39m
    \x1b[90m 15| \x1b[39m  })

\x1b[31m\x1b[2m⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯[1/1]⎯\x1b[22m\x1b[39m

\x1b[2m Test Files \x1b[22m \x1b[1m\x1b[31m1 failed\x1b[39m\x1b[22m\x1b[2m | \x1b[22m\x1b[1m\x1b[32m1 passed\x1b[39m\x1b[22m\x1b[90m (2)\x1b[39m
\x1b[2m      Tests \x1b[22m \x1b[1m\x1b[31m1 failed\x1b[39m\x1b[22m\x1b[2m | \x1b[22m\x1b[1m\x1b[32m12 passed\x1b[39m\x1b[22m\x1b[2m | \x1b[22m\x1b[33m1 skipped\x1b[39m\x1b[90m (14)\x1b[39m
\x1b[2m   Start at \x1b[22m 10:15:02
\x1b[2m   Duration \x1b[22m 412ms\x1b[2m (transform 51ms, setup 0ms, collect 60ms, tests 10ms, environment 0ms, prepare 180ms)\x1b[22m

"""

VITEST_GREEN = """\
 ✓ src/format.test.ts (10 tests) 4ms

 Test Files  1 passed (1)
      Tests  10 passed (10)
   Start at  10:16:40
   Duration  301ms
"""

JEST_OUTPUT = """\
 PASS  src/format.test.js
 FAIL  src/sum.test.js
  ● Console

    console.log
      computing sum 1 2

      at log (src/sum.js:2:11)

  ● sum › adds 1 + 2 to equal 4

    expect(received).toBe(expected) // Object.is equality

    Expected: 4
    Received: 3

      3 | test('adds 1 + 2 to equal 4', () => {
    > 4 |   expect(sum(1, 2)).toBe(4);
        |                     ^
      5 | });

      at Object.toBe (src/sum.test.js:4:21)

Summary of all failing tests
 FAIL  src/sum.test.js
  ● sum › adds 1 + 2 to equal 4

    expect(received).toBe(expected) // Object.is equality

    Expected: 4
    Received: 3

      3 | test('adds 1 + 2 to equal 4', () => {
    > 4 |   expect(sum(1, 2)).toBe(4);
        |                     ^
      5 | });

      at Object.toBe (src/sum.test.js:4:21)


Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 1 skipped, 5 passed, 7 total
Snapshots:   0 total
Time:        1.234 s
Ran all test suites.
"""

JEST_SUITE_BROKEN = """\
 FAIL  src/broken.test.js
  ● Test suite failed to run

    SyntaxError: /home/dev/app/src/broken.test.js: Unexpected token (3:10)

      1 | import { sum } from './sum';
      2 |
    > 3 | test('x', ( => {});
        |           ^

Test Suites: 1 failed, 1 total
Tests:       0 total
Snapshots:   0 total
Time:        0.512 s
Ran all test suites.
"""

GO_VERBOSE = """\
=== RUN   TestAdd
--- PASS: TestAdd (0.00s)
=== RUN   TestSub
    calc_test.go:14: Sub(5, 3) = 8; want 2
--- FAIL: TestSub (0.00s)
=== RUN   TestTable
=== RUN   TestTable/zero
=== RUN   TestTable/negative
    calc_test.go:27: Abs(-2) = -2; want 2
--- FAIL: TestTable (0.00s)
    --- PASS: TestTable/zero (0.00s)
    --- FAIL: TestTable/negative (0.00s)
=== RUN   TestSlow
    calc_test.go:33: skipping in short mode
--- SKIP: TestSlow (0.00s)
FAIL
FAIL\texample.com/calc\t0.003s
=== RUN   TestFormat
--- PASS: TestFormat (0.00s)
PASS
ok  \texample.com/calc/format\t0.002s
FAIL
"""

GO_QUIET = """\
# example.com/calc/broken
broken/broken.go:5:9: undefined: strconv.Itoa2
--- FAIL: TestSub (0.00s)
    calc_test.go:14: Sub(5, 3) = 8; want 2
FAIL
FAIL\texample.com/calc\t0.003s
ok  \texample.com/calc/format\t(cached)
?   \texample.com/calc/cmd\t[no test files]
FAIL\texample.com/calc/broken [build failed]
FAIL
"""

CARGO_OUTPUT = """\
   Compiling adder v0.1.0 (/home/dev/adder)
    Finished `test` profile [unoptimized + debuginfo] target(s) in 0.52s
     Running unittests src/lib.rs (target/debug/deps/adder-1c2f3a4b5c6d7e8f)

running 4 tests
test tests::adds ... ok
test tests::big ... ignored
test tests::subtracts ... FAILED
test tests::multiplies ... ok

failures:

---- tests::subtracts stdout ----

thread 'tests::subtracts' panicked at src/lib.rs:22:9:
assertion `left == right` failed: sub is broken
  left: 8
 right: 2
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    tests::subtracts

test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s

     Running tests/integration.rs (target/debug/deps/integration-0a1b2c3d4e5f6a7b)

running 2 tests
test it_formats ... ok
test it_parses ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

   Doc-tests adder

running 0 tests

test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

error: 1 target failed:
    `--lib`
"""

CARGO_COMPILE_ERROR = """\
   Compiling adder v0.1.0 (/home/dev/adder)
error[E0308]: mismatched types
 --> src/lib.rs:2:5
  |
1 | pub fn add(a: i32, b: i32) -> i32 {
  |                               --- expected `i32` because of return type
2 |     "x"
  |     ^^^ expected `i32`, found `&str`

For more information about this error, try `rustc --explain E0308`.
error: could not compile `adder` (lib test) due to 1 previous error
"""


def counts(report: Report) -> tuple[int | None, ...]:
    return report.passed, report.failed, report.skipped, report.errors


# --- counts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output, framework, expected",
    [
        (PYTEST_OUTPUT, "pytest", (4, 1, 2, 1)),  # xfailed -> skipped, deselected ignored
        (PYTEST_COLOURED_TAIL, "pytest", (1, 1, 1, 0)),
        (
            "....                                                                     [100%]\n"
            "4 passed in 0.01s\n",
            "pytest",
            (4, 0, 0, 0),
        ),
        (
            "=" * 19 + " 2 failed, 10 passed, 3 warnings in 12.31s (0:00:12) " + "=" * 19 + "\n",
            "pytest",
            (10, 2, 0, 0),
        ),
        (
            "============================ no tests ran in 0.01s =============================\n",
            "pytest",
            (0, 0, 0, 0),
        ),
        (
            "collecting ... \rcollected 3 items\r\n...\r\n\x1b[32m3 passed\x1b[0m in 0.10s\r\n",
            "pytest",
            (3, 0, 0, 0),
        ),  # CRLF, redraws and colour codes
        (UNITTEST_OUTPUT, "unittest", (3, 1, 2, 1)),
        (
            "\n----------------------------------------------------------------------\n"
            "Ran 5 tests in 0.001s\n\nOK (skipped=1)\n",
            "unittest",
            (4, 0, 1, 0),
        ),
        ("Ran 1 test in 0.000s\n\nOK\n", "unittest", (1, 0, 0, 0)),
        (VITEST_OUTPUT, "vitest", (12, 1, 1, 0)),
        (VITEST_GREEN, "vitest", (10, 0, 0, 0)),
        (JEST_OUTPUT, "jest", (5, 1, 1, 0)),
        (JEST_SUITE_BROKEN, "jest", (0, 0, 0, 1)),  # a suite that failed to run is an error
        (GO_VERBOSE, "go", (2, 2, 1, 0)),  # top-level tests; subtests are in their parent
        (CARGO_OUTPUT, "cargo", (4, 1, 1, 0)),  # summed over the three `test result:` lines
    ],
)
def test_parse_output_counts(output: str, framework: str, expected: tuple[int, ...]) -> None:
    assert counts(testreport.parse_output(output, framework)) == expected
    detected = testreport.parse_output(output)  # no hint: every parser is tried
    assert (detected.framework, counts(detected)) == (framework, expected)


def test_go_without_verbose_counts_packages_and_says_so() -> None:
    report = testreport.parse_output(GO_QUIET, "go")
    assert counts(report) == (1, 1, 0, 1) and report.unit == "packages"
    assert report.summary() == "1 passed, 1 failed, 1 error (counted in packages)"


def test_tap_output_is_not_mistaken_for_go_packages() -> None:
    report = testreport.parse_output("TAP version 13\nok 1 - adds\nnot ok 2 - subtracts\n1..2\n")
    assert report.summary() == "no counts found" and report.framework is None


def test_a_wrong_hint_still_finds_the_real_summary() -> None:
    report = testreport.parse_output(CARGO_OUTPUT, "pytest")
    assert report.framework == "cargo" and counts(report) == (4, 1, 1, 0)


def test_output_without_a_summary_has_no_counts_and_keeps_its_tail() -> None:
    log = "".join(f"building step {i}\n" for i in range(100)) + "Segmentation fault (core dumped)\n"
    report = testreport.parse_output(log, "pytest")
    assert counts(report) == (None, None, None, None) and report.framework == "pytest"
    assert report.summary() == "no counts found"
    (tail,) = report.failures
    assert tail.splitlines()[-1] == "Segmentation fault (core dumped)"
    assert len(tail.splitlines()) == testreport.FALLBACK_LINES and "building step 40\n" not in tail


def test_green_runs_carry_no_failures_unless_the_exit_code_says_otherwise() -> None:
    assert testreport.parse_output(VITEST_GREEN).failures == ()
    assert testreport.parse_output(VITEST_GREEN, exit_code=0).failures == ()
    # all tests pass but the command still failed (here pytest-cov's threshold): show the tail
    log = (
        "..........                                                               [100%]\n"
        "FAIL Required test coverage of 90% not reached. Total coverage: 72.00%\n"
        "10 passed in 0.52s\n"
    )
    report = testreport.parse_output(log, "pytest", exit_code=1)
    assert counts(report) == (10, 0, 0, 0)
    assert any("Required test coverage of 90%" in s for s in report.failures)


# --- failing sections --------------------------------------------------------------------------


def test_pytest_sections_are_the_summary_lines_then_the_failure_blocks() -> None:
    summary, error, failure = testreport.failing_sections(PYTEST_OUTPUT, "pytest")
    assert summary.splitlines() == [
        "FAILED tests/test_api.py::test_parse_date"
        " - AssertionError: assert datetime.date(2024, 3, 1) is None",
        "ERROR tests/test_db.py::test_connection - ConnectionError: database is down",
    ]
    assert error.startswith("_" * 22 + " ERROR at setup of test_connection")
    assert "E       ConnectionError: database is down" in error and "FAILURES" not in error
    assert failure.splitlines()[0].strip("_ ") == "test_parse_date"
    assert "parse_date('2024-02-30')" in failure and "parsing 2024-02-30" in failure
    assert "short test summary" not in failure and "test session starts" not in failure


def test_unittest_sections_are_the_fail_and_error_blocks() -> None:
    error, failure = testreport.failing_sections(UNITTEST_OUTPUT, "unittest")
    assert error.startswith("ERROR: test_load") and error.endswith("'missing.json'")
    assert failure.startswith("FAIL: test_total") and failure.endswith("AssertionError: 25 != 30")
    assert "Ran 7 tests" not in failure and "test_add" not in error + failure


def test_jest_sections_skip_console_blocks_and_repeats() -> None:
    (section,) = testreport.failing_sections(JEST_OUTPUT, "jest")
    assert section.startswith("  ● sum › adds 1 + 2 to equal 4")
    assert "Received: 3" in section and "at Object.toBe (src/sum.test.js:4:21)" in section
    assert "console.log" not in section and "Summary of all failing" not in section
    (broken,) = testreport.parse_output(JEST_SUITE_BROKEN).failures
    assert "Test suite failed to run" in broken and "Unexpected token" in broken


def test_vitest_sections_are_the_fail_blocks_without_colour_codes() -> None:
    (section,) = testreport.failing_sections(VITEST_OUTPUT, "vitest")
    assert "\x1b" not in section
    assert section.startswith(" FAIL  src/math.test.ts > math > divides by zero safely")
    assert "expect(divide(1, 0)).toBe(0)" in section and "+ Infinity" in section
    assert "⎯" not in section and "Test Files" not in section and "format.test" not in section


def test_go_sections_hold_the_output_before_and_after_the_fail_line() -> None:
    sub, table = testreport.failing_sections(GO_VERBOSE, "go")
    assert sub.splitlines() == [
        "    calc_test.go:14: Sub(5, 3) = 8; want 2",
        "--- FAIL: TestSub (0.00s)",
    ]
    assert table.splitlines() == [
        "    calc_test.go:27: Abs(-2) = -2; want 2",
        "--- FAIL: TestTable (0.00s)",
        "    --- PASS: TestTable/zero (0.00s)",
        "    --- FAIL: TestTable/negative (0.00s)",
    ]
    build, quiet = testreport.failing_sections(GO_QUIET, "go")
    assert build == "# example.com/calc/broken\nbroken/broken.go:5:9: undefined: strconv.Itoa2"
    assert quiet == "--- FAIL: TestSub (0.00s)\n    calc_test.go:14: Sub(5, 3) = 8; want 2"


def test_cargo_sections_are_the_stdout_blocks_and_compile_errors() -> None:
    (section,) = testreport.failing_sections(CARGO_OUTPUT, "cargo")
    assert section.startswith("---- tests::subtracts stdout ----")
    assert "sub is broken" in section and section.endswith("display a backtrace")
    report = testreport.parse_output(
        CARGO_COMPILE_ERROR
    )  # no summary: the cargo blocks still match
    assert counts(report) == (None, None, None, None)
    mismatch, could_not = report.failures
    assert mismatch.startswith("error[E0308]: mismatched types") and "found `&str`" in mismatch
    assert could_not.startswith("error: could not compile `adder`")


def test_sections_are_capped_with_a_note_naming_what_was_cut() -> None:
    blocks = "".join(
        f"{'_' * 20} test_case_{i:02d} {'_' * 20}\n\n    def test_case_{i:02d}():\n"
        + "".join(f"        step({j})\n" for j in range(20))
        + f">       assert compute({i}) == {i + 1}\nE       assert {i} == {i + 1}\n\n"
        for i in range(40)
    )
    log = (
        "=== FAILURES ===\n"
        + blocks
        + "=== short test summary info ===\n"
        + "".join(
            f"FAILED tests/test_many.py::test_case_{i:02d} - assert {i} == {i + 1}\n"
            for i in range(40)
        )
        + "=== 40 failed in 1.00s ===\n"
    )
    sections = testreport.failing_sections(log, "pytest", limit_chars=3000)
    assert sum(map(len, sections)) <= 3000
    assert sections[0].count("FAILED tests/test_many.py") == 40  # the summary survives the cut
    note = sections[-1]
    assert "test_case_00" in sections[1] and "test_case_39" not in "".join(sections[1:-1])
    assert note.startswith("[output cut to 3000 chars: ")
    assert "more failing section(s) left out: test_case_" in note and note.endswith(" more]")
    uncut = testreport.failing_sections(log, "pytest", limit_chars=10**6)
    assert len(uncut) == 41 and not uncut[-1].startswith("[output cut")


def test_huge_blocks_keep_their_head_and_tail() -> None:
    frames = "".join(f'  File "lib.py", line {i}, in f{i}\n    f{i + 1}()\n' for i in range(200))
    log = (
        "=" * 70
        + "\nERROR: test_deep (tests.test_x.T.test_deep)\n"
        + "-" * 70
        + "\nTraceback (most recent call last):\n"
        + frames
        + "RecursionError: too deep\n\n"
        + "-" * 70
        + "\nRan 1 test in 0.1s\n\nFAILED (errors=1)\n"
    )
    (section,) = testreport.failing_sections(log, "unittest")
    assert section.startswith("ERROR: test_deep") and section.endswith("RecursionError: too deep")
    assert "lines cut ...]" in section and len(section.splitlines()) < 100


# --- which framework, which command ------------------------------------------------------------


@pytest.mark.parametrize(
    "command, expected",
    [
        ("pytest", "pytest"),
        ("python -m pytest -x tests/", "pytest"),
        ("py.test -q", "pytest"),
        (".venv/bin/pytest -q", "pytest"),
        ("uv run pytest", "pytest"),
        ("python -m unittest discover -s tests -v", "unittest"),
        ("npx vitest run", "vitest"),
        ("pnpm vitest --run", "vitest"),
        ("npx jest --ci", "jest"),
        ("node_modules/.bin/jest", "jest"),
        ("go test ./...", "go"),
        ("go vet ./... && go test -v -run TestSub ./calc", "go"),
        ("cargo test --workspace", "cargo"),
        ("cargo +nightly test", "cargo"),
        ("npm test", None),
        ("npm run test", None),
        ("yarn test", None),
        ("pnpm test", None),
        ("make test", None),
        ("pip install pytest-xdist", None),
        ("gotest", None),
    ],
)
def test_framework_of(command: str, expected: str | None) -> None:
    assert testreport.framework_of(command) == expected


def test_command_precedence_cmd_framework_configured_detected(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text("module example.com/calc\n")
    every = {"cmd": "make check", "framework": "cargo", "configured": "tox -e py311"}
    assert testreport.test_command(root=tmp_path, **every) == "make check"
    every.pop("cmd")
    assert testreport.test_command(root=tmp_path, **every) == "cargo test"
    every.pop("framework")
    assert testreport.test_command(root=tmp_path, **every) == "tox -e py311"
    assert testreport.test_command(root=tmp_path) == testcommand.detect_test_command(tmp_path)
    assert testreport.test_command(root=tmp_path) == "go test ./..."


@pytest.mark.parametrize(
    "framework, expected",
    [
        ("pytest", "python -m pytest -q"),
        ("unittest", "python -m unittest discover -v"),
        ("vitest", "npx vitest run"),
        ("jest", "npx jest"),
        ("go", "go test ./..."),
        ("cargo", "cargo test"),
    ],
)
def test_command_for_each_framework(tmp_path: Path, framework: str, expected: str) -> None:
    assert testreport.test_command(root=tmp_path, framework=framework) == expected
    assert testreport.framework_of(expected) == framework  # the parser gets the right hint


def test_command_unittest_uses_the_tests_folder_and_args_are_quoted(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    assert (
        testreport.test_command(root=tmp_path, framework="unittest", args=["-k", "cart total"])
        == "python -m unittest discover -s tests -v -k 'cart total'"
    )
    assert (
        testreport.test_command(root=tmp_path, cmd="pytest", args=["tests/a b.py", "-x;rm -rf /"])
        == "pytest 'tests/a b.py' '-x;rm -rf /'"
    )


def test_no_test_command_is_an_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        testreport.test_command(root=tmp_path)
    assert info.value.message == f"no test command could be found in {tmp_path}"
    hint = info.value.hint or ""
    assert "`test_command` in coder.config.json" in hint
    assert "`cmd`" in hint and "`framework`" in hint
    with pytest.raises(InvalidInput, match="unknown test framework 'mocha'"):
        testreport.test_command(root=tmp_path, framework="mocha")


# --- the report --------------------------------------------------------------------------------


def test_report_summary_and_dict() -> None:
    report = Report(12, 1, 2, 0, "pytest", ("FAILED t.py::x",))
    assert report.summary() == "12 passed, 1 failed, 2 skipped"
    assert Report(3, 0, None, 1, "go", ()).summary() == "3 passed, 1 error"
    assert Report(0, 0, 0, 2, None, ()).summary() == "2 errors"
    assert Report(0, 0, 0, 0, "jest", ()).summary() == "no tests ran"
    assert Report(None, None, None, None, None, ()).summary() == "no counts found"
    assert report.as_dict() == {
        "passed": 12,
        "failed": 1,
        "skipped": 2,
        "errors": 0,
        "framework": "pytest",
        "failures": ["FAILED t.py::x"],
        "unit": "tests",
    }


# --- real runs ---------------------------------------------------------------------------------

CALC = """\
def add(a, b):
    return a + b


def sub(a, b):
    return a + b  # the bug the failing test finds
"""

CALC_TESTS = """\
import unittest

from calc import add, sub


class CalcTests(unittest.TestCase):
    def test_add_passes(self):
        self.assertEqual(add(2, 3), 5)

    def test_sub_fails(self):
        self.assertEqual(sub(5, 3), 2, "sub is broken")

    @unittest.skip("not ready")
    def test_mul_skipped(self):
        pass
"""


@pytest.fixture(scope="module")
def calc_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("calc")
    (root / "calc").mkdir()
    (root / "calc" / "__init__.py").write_text(CALC)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(CALC_TESTS)
    return root


@pytest.mark.parametrize(
    "runner, argv",
    [
        ("pytest", ["-m", "pytest", "-q", "-p", "no:cacheprovider"]),
        ("unittest", ["-m", "unittest", "discover", "-s", "tests", "-v"]),  # as coder runs it
    ],
)
def test_real_runs_parse_exactly(calc_project: Path, runner: str, argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the venv's plugins (xdist, ...) are not needed
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=calc_project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + "\n" + done.stderr
    assert done.returncode == 1, output

    hint = testreport.framework_of(" ".join(["python", *argv]))
    report = testreport.parse_output(output, hint, exit_code=done.returncode)
    assert report.framework == runner and counts(report) == (1, 1, 1, 0), output
    assert testreport.parse_output(output) == report  # the same without any hint

    sections = "\n".join(report.failures)
    assert "test_sub_fails" in sections and "sub is broken" in sections
    assert "test_add_passes" not in sections and "test_mul_skipped" not in sections
    assert testreport.failing_sections(output, None) == report.failures


def _pythons() -> list[str]:
    """This interpreter and every other CPython 3.11+ on the machine (pyenv keeps them)."""
    import glob

    found = {sys.executable}
    found.update(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[1-9]*/bin/python3")))
    found.update(glob.glob("/usr/bin/python3.1[1-9]"))
    return sorted(found)


@pytest.mark.parametrize("python", _pythons())
def test_unittest_counts_are_right_on_every_python(python: str, tmp_path: Path) -> None:
    """Python 3.12.0 and 3.12.1 leave skipped tests out of "Ran N": one passed and one skipped
    test read "Ran 1 ... OK (skipped=1)", as one skipped test does elsewhere. With `-v` (the
    default command) each test's own line counts, on every version."""
    (tmp_path / "test_x.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_a(self):\n        pass\n"
        "    @unittest.skip('later')\n    def test_b(self):\n        pass\n"
        "    def test_c(self):\n        self.fail('no')\n"
    )
    done = subprocess.run(
        [python, "-m", "unittest", "discover", "-v"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = testreport.parse_output(done.stdout + "\n" + done.stderr, "unittest")
    assert (report.passed, report.failed, report.skipped, report.errors) == (1, 1, 1, 0), (
        python,
        done.stderr,
    )
