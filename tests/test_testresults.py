"""Machine-readable test results (coder.checks.testresults): which commands get the structured
flags, real pytest and unittest projects run through the sandboxed runner, libtest and
`go test -json` output as captured from the real tools, and the fall back to the text."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from coder.checks import testresults
from coder.checks.testresults import RESULTS_VAR, Structured, read, structured
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
from tests.conftest import coder
from tests.helpers import state_of, taskfile

# `cargo test -q -- -Z unstable-options --format json` of a crate with a passing, a failing and
# an ignored test (rustc 1.95, libtest's JSON; the backtrace cut short)
CARGO_FAILED = '{ "type": "suite", "event": "started", "test_count": 3 }\n{ "type": "test", "event": "started", "name": "tests::bad" }\n{ "type": "test", "event": "started", "name": "tests::good" }\n{ "type": "test", "name": "tests::good", "event": "ok" }\n{ "type": "test", "event": "started", "name": "tests::later" }\n{ "type": "test", "name": "tests::later", "event": "ignored" }\n{"type": "test", "name": "tests::bad", "event": "failed", "stdout": "some output\\n\\nthread \'tests::bad\' (8096) panicked at src/lib.rs:6:49:\\nassertion `left == right` failed\\n  left: 3\\n right: 4\\n"}\n{ "type": "suite", "event": "failed", "passed": 1, "failed": 1, "ignored": 1, "measured": 0, "filtered_out": 0, "exec_time": 0.303936145 }\n'
# the same crate green, with a doc-test: two suites
CARGO_GREEN = '{ "type": "suite", "event": "started", "test_count": 3 }\n{ "type": "test", "event": "started", "name": "tests::bad" }\n{ "type": "test", "event": "started", "name": "tests::good" }\n{ "type": "test", "name": "tests::bad", "event": "ok" }\n{ "type": "test", "event": "started", "name": "tests::later" }\n{ "type": "test", "name": "tests::later", "event": "ignored" }\n{ "type": "test", "name": "tests::good", "event": "ok" }\n{ "type": "suite", "event": "ok", "passed": 2, "failed": 0, "ignored": 1, "measured": 0, "filtered_out": 0, "exec_time": 0.010298425 }\n{ "type": "suite", "event": "started", "test_count": 1 }\n{ "type": "test", "event": "started", "name": "src/lib.rs - doc (line 9)" }\n{ "type": "test", "name": "src/lib.rs - doc (line 9)", "event": "ok" }\n{ "type": "suite", "event": "ok", "passed": 1, "failed": 0, "ignored": 0, "measured": 0, "filtered_out": 0, "exec_time": 0.014312873 }\n{ "type": "report", "total_time": 1.015894687, "compilation_time": 0.983812747 }\n'
# `go test -json ./...` (go 1.22) of a package with a passing test (with subtests), a failing
# one and a skipped one, then a package that does not build (go 1.24's build-output events)
GO_EVENTS = """\
{"Time":"2026-11-27T10:00:00Z","Action":"start","Package":"example.com/m"}
{"Time":"2026-11-27T10:00:00Z","Action":"run","Package":"example.com/m","Test":"TestAdd"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestAdd","Output":"=== RUN   TestAdd\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"run","Package":"example.com/m","Test":"TestAdd/one"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestAdd/one","Output":"    --- PASS: TestAdd/one (0.00s)\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"pass","Package":"example.com/m","Test":"TestAdd/one","Elapsed":0}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestAdd","Output":"--- PASS: TestAdd (0.00s)\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"pass","Package":"example.com/m","Test":"TestAdd","Elapsed":0}
{"Time":"2026-11-27T10:00:00Z","Action":"run","Package":"example.com/m","Test":"TestBad"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestBad","Output":"=== RUN   TestBad\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestBad","Output":"    add_test.go:12: got 3, want 4\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"fail","Package":"example.com/m","Test":"TestBad","Elapsed":0}
{"Time":"2026-11-27T10:00:00Z","Action":"run","Package":"example.com/m","Test":"TestLater"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestLater","Output":"=== RUN   TestLater\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestLater","Output":"    add_test.go:20: later\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Test":"TestLater","Output":"--- SKIP: TestLater (0.00s)\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"skip","Package":"example.com/m","Test":"TestLater","Elapsed":0}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Output":"FAIL\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m","Output":"FAIL\\texample.com/m\\t0.002s\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"fail","Package":"example.com/m","Elapsed":0.002}
{"ImportPath":"example.com/m/broken [example.com/m/broken.test]","Action":"build-output","Output":"# example.com/m/broken [example.com/m/broken.test]\\n"}
{"ImportPath":"example.com/m/broken [example.com/m/broken.test]","Action":"build-output","Output":"broken/x_test.go:5:2: undefined: nope\\n"}
{"ImportPath":"example.com/m/broken [example.com/m/broken.test]","Action":"build-fail"}
{"Time":"2026-11-27T10:00:00Z","Action":"start","Package":"example.com/m/broken"}
{"Time":"2026-11-27T10:00:00Z","Action":"output","Package":"example.com/m/broken","Output":"FAIL\\texample.com/m/broken [build failed]\\n"}
{"Time":"2026-11-27T10:00:00Z","Action":"fail","Package":"example.com/m/broken","Elapsed":0,"FailedBuild":"example.com/m/broken [example.com/m/broken.test]"}
"""


@pytest.mark.parametrize(
    ("cmd", "framework"),
    [
        ("python -m pytest -q", "pytest"),
        ("pytest", "pytest"),
        ("python3 -m pytest -q -k add tests/test_a.py", "pytest"),  # a step's `args`
        ("python -m unittest discover -v", "unittest"),
        ("python -m unittest discover -s tests -v", "unittest"),
        ("go test ./...", "go"),
        ("go test -v ./pkg/...", "go"),
        # a user's own command line: runs as written
        ("tox", None),
        ("make test", None),
        ("npm test", None),
        ("pytest -q | tee log.txt", None),
        ("pytest && echo done", None),
        ("FOO=1 pytest", None),
        ("pytest $ARGS", None),
        ("pytest --junitxml=mine.xml", None),  # the user's own report file stays theirs
        ("pytest -p no:junitxml", None),
        ("/usr/bin/python3.12 -m pytest -q -p no:cacheprovider", "pytest"),
        ("go test -json ./...", None),
        ("python -m pytest_cov", None),
        ("python -m unittest_extra", None),
    ],
)
def test_which_commands_get_structured_flags(cmd: str, framework: str | None) -> None:
    plan = structured(cmd)
    assert (plan.framework if plan else None) == framework


def test_the_flags_are_added_to_the_command_as_given() -> None:
    assert structured("python -m pytest -q") == Structured(
        "pytest", 'python -m pytest -q --junitxml="$CODER_TEST_RESULTS"', True
    )
    plan = structured("python3 -m unittest discover -v")
    assert plan is not None
    assert plan.command == f"python3 {testresults.RUNNER} discover -v" and plan.results_file
    assert structured("go test ./...") == Structured("go", "go test -json ./...", False)


def test_cargo_gets_json_only_on_nightly() -> None:
    assert structured("cargo test") is None
    assert structured("cargo test", nightly=lambda: True) == Structured(
        "cargo", "cargo test -- -Z unstable-options --format json", False
    )
    assert structured("cargo test -- --nocapture", nightly=lambda: True) is None
    assert testresults.rustc_nightly("rustc 1.97.0-nightly (1a2b3c4d5 2026-11-20)\n")
    assert not testresults.rustc_nightly("rustc 1.95.0 (59807616e 2026-04-14)\n")
    assert testresults.refused(
        Structured("cargo", "x", False),
        101,
        None,
        "error: the option `Z` is only accepted on the nightly compiler\n",
    )


PYTEST_PROJECT = {
    "test_a.py": """\
import pytest

def test_ok():
    pass

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="later")
def test_skipped():
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_error(broken):
    pass
""",
}


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run_structured(root: Path, cmd: str) -> tuple[Structured, object]:
    plan = structured(cmd)
    assert plan is not None
    result = run_command(
        plan.command,
        cwd=root,
        policy=Policy(),
        root=root,
        results_var=RESULTS_VAR if plan.results_file else None,
    )
    return plan, result


def test_a_real_pytest_run_is_counted_from_its_junit_report(tmp_path: Path) -> None:
    root = write(tmp_path / "p", PYTEST_PROJECT)
    plan, result = run_structured(root, "python -m pytest -q")
    assert result.results is not None and b"<testsuite" in result.results  # type: ignore[attr-defined]
    report = read(
        plan,
        stdout=result.stdout,  # type: ignore[attr-defined]
        stderr=result.stderr,  # type: ignore[attr-defined]
        exit_code=result.exit_code,  # type: ignore[attr-defined]
        results=result.results,  # type: ignore[attr-defined]
        framework="pytest",
    )
    assert (report.passed, report.failed, report.skipped, report.errors) == (1, 1, 2, 1)
    # the failing sections still come from the text, as the model has always had them
    assert any("one is not two" in s for s in report.failures)
    assert not list(root.glob("**/*.xml"))  # the report went outside the project


def test_a_garbled_or_missing_results_file_falls_back_to_the_text(tmp_path: Path) -> None:
    root = write(tmp_path / "p", PYTEST_PROJECT)
    plan, result = run_structured(root, "python -m pytest -q")
    for results in (None, b"<testsuite><testcase", b"not xml at all"):
        report = read(
            plan,
            stdout=result.stdout,  # type: ignore[attr-defined]
            stderr=result.stderr,  # type: ignore[attr-defined]
            exit_code=result.exit_code,  # type: ignore[attr-defined]
            results=results,
            framework="pytest",
        )
        # pytest's own summary line: "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error"
        assert (report.passed, report.failed, report.skipped, report.errors) == (1, 1, 2, 1)


def test_a_junit_report_with_entities_is_refused() -> None:
    bomb = b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaa">]><testsuite>&a;</testsuite>'
    with pytest.raises(ValueError):
        testresults.junit_counts(bomb)


UNITTEST_PROJECT = {
    "tests/__init__.py": "",
    "tests/test_u.py": """\
import unittest

class T(unittest.TestCase):
    def test_ok(self):
        pass

    @unittest.skip("later")
    def test_skipped(self):
        pass

    def test_fails(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.expectedFailure
    def test_known(self):
        self.assertTrue(False)
""",
}


def test_a_real_unittest_run_is_counted_by_coders_runner(tmp_path: Path) -> None:
    root = write(tmp_path / "u", UNITTEST_PROJECT)
    plan, result = run_structured(root, "python -m unittest discover -s tests -v")
    assert result.exit_code == 1  # type: ignore[attr-defined]
    assert "FAIL: test_fails" in result.stderr  # type: ignore[attr-defined]  # unittest's text
    report = read(
        plan,
        stdout=result.stdout,  # type: ignore[attr-defined]
        stderr=result.stderr,  # type: ignore[attr-defined]
        exit_code=result.exit_code,  # type: ignore[attr-defined]
        results=result.results,  # type: ignore[attr-defined]
        framework="unittest",
    )
    assert (report.passed, report.failed, report.skipped, report.errors) == (1, 1, 2, 1)
    assert any("AssertionError: 1 != 2" in s for s in report.failures)


def _pythons() -> list[str]:
    """The interpreters of 3.11-3.13 this machine has (3.12.1 among them, where it is)."""
    found = {}
    for version in ("3.11", "3.12", "3.13"):
        for path in sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}")):
            found[path.parent.parent.name] = str(path)
        which = shutil.which(f"python{version}")
        if which and version not in {k[:4] for k in found}:
            found[version] = which
    return sorted(found.values())


@pytest.mark.parametrize("python", _pythons() or ["none"])
def test_the_unittest_runner_counts_skipped_tests_on_every_python(
    python: str, tmp_path: Path
) -> None:
    """One passing and one skipped test: 3.12.0 and 3.12.1 print "Ran 1", the runner counts
    1 passed, 1 skipped there as everywhere, and exits as unittest does (0)."""
    if python == "none":
        pytest.skip("no Python 3.11-3.13 interpreter found besides the running one")
    root = write(
        tmp_path / "s",
        {
            "test_s.py": "import unittest\n\nclass T(unittest.TestCase):\n"
            "    def test_ok(self):\n        pass\n\n"
            "    @unittest.skip('no')\n    def test_skip(self):\n        pass\n"
        },
    )
    out = tmp_path / "results.json"
    done = subprocess.run(
        [python, str(testresults.RUNNER), "discover", "-v"],
        cwd=root,
        env={"CODER_TEST_RESULTS": str(out), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "OK (skipped=1)" in done.stderr
    assert testresults.unittest_counts(out.read_bytes()) == (1, 0, 1, 0)


def test_libtest_json_is_counted_and_its_failures_read_as_text() -> None:
    text, counts = testresults.cargo_events(CARGO_FAILED)
    assert counts == (1, 1, 1, 0)
    report = read(
        Structured("cargo", "x", False),
        stdout=CARGO_FAILED,
        stderr="error: test failed, to rerun pass `--lib`\n",
        exit_code=101,
        results=None,
        framework="cargo",
    )
    assert (report.passed, report.failed, report.skipped) == (1, 1, 1)
    assert any("assertion `left == right` failed" in s for s in report.failures)
    assert testresults.cargo_events(CARGO_GREEN)[1] == (3, 0, 1, 0)  # the doc-test suite too


def test_go_test_json_counts_top_level_tests_and_broken_packages() -> None:
    text, counts = testresults.go_events(GO_EVENTS)
    assert counts == (1, 1, 1, 1)  # TestAdd (its subtest not again), TestBad, TestLater; broken
    assert "--- FAIL: TestBad" in text and "undefined: nope" in text
    report = read(
        Structured("go", "go test -json ./...", False),
        stdout=GO_EVENTS,
        stderr="",
        exit_code=1,
        results=None,
        framework="go",
    )
    assert (report.passed, report.failed, report.skipped, report.errors) == (1, 1, 1, 1)
    assert any("got 3, want 4" in s for s in report.failures)


def test_output_without_events_falls_back_to_the_text() -> None:
    plain = "--- FAIL: TestBad (0.00s)\nFAIL\nFAIL\texample.com/m\t0.002s\n=== RUN   TestBad\n"
    assert testresults.go_events(plain) == (plain, None)
    assert testresults.cargo_events("test result: ok. 2 passed; 0 failed; 0 ignored")[1] is None


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")
def test_a_real_go_run(tmp_path: Path) -> None:
    root = write(
        tmp_path / "g",
        {
            "go.mod": "module example.com/m\n\ngo 1.21\n",
            "m_test.go": 'package m\n\nimport "testing"\n\nfunc TestOk(t *testing.T) {}\n'
            'func TestBad(t *testing.T) { t.Fatal("nope") }\n',
        },
    )
    plan = structured("go test ./...")
    assert plan is not None
    done = subprocess.run(plan.command, shell=True, cwd=root, capture_output=True, text=True)
    text, counts = testresults.go_events(done.stdout)
    assert counts == (1, 1, 0, 0) and "nope" in text


def test_a_test_step_uses_the_structured_results(make_repo) -> None:
    """A real run: the test step ran pytest with its JUnit report (the log shows the command),
    and the counts in the state are the report's."""
    repo = make_repo(
        {
            "tests/test_x.py": "import pytest\n\ndef test_a():\n    pass\n\n"
            "@pytest.mark.xfail\ndef test_b():\n    assert False\n"
        }
    )
    path = taskfile(repo, "id: st\ntitle: t\ngraph:\n  - {kind: test, framework: pytest}\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    step = state_of(repo, "st")["steps"]["s1"]
    assert step["tests"] == {"passed": 1, "failed": 0, "skipped": 1, "exit_code": 0}
    log = (repo / ".coder" / "artifacts" / "st" / "s1-attempt1.log").read_text()
    assert log.startswith('$ python -m pytest -q --junitxml="$CODER_TEST_RESULTS"\n')
    assert not list((repo / ".coder" / "worktrees" / "st").rglob("*.xml"))


def test_a_custom_command_runs_as_written(make_repo) -> None:
    repo = make_repo({"tests/test_x.py": "def test_a():\n    pass\n"})
    path = taskfile(
        repo,
        "id: cu\ntitle: t\ngraph:\n  - {kind: test, cmd: 'python -m pytest -q tests && true'}\n",
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    log = (repo / ".coder" / "artifacts" / "cu" / "s1-attempt1.log").read_text()
    assert log.startswith("$ python -m pytest -q tests && true\n")
    assert state_of(repo, "cu")["steps"]["s1"]["tests"]["passed"] == 1
