"""`coder init` and `coder doctor` run the test command once (coder.services.testprobe): real
projects, the real sandboxed runner; a warning with what to do when it finds no tests or
cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder import config as config_mod
from coder.services import testprobe
from tests.conftest import coder, git

PYTEST_NO_TESTS = {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/test_a.py": ""}
PYTEST_GREEN = {
    "pyproject.toml": "[tool.pytest.ini_options]\n",
    "tests/test_a.py": "def test_one():\n    assert 1 + 1 == 2\n",
}


def init_json(repo: Path, *args: str) -> dict[str, object]:
    code, out, err = coder(repo, "init", "--json", *args)
    assert code == 0, out + err
    return json.loads(out)  # type: ignore[no-any-return]


def test_init_warns_when_the_test_command_finds_no_tests(make_repo) -> None:
    repo = make_repo(PYTEST_NO_TESTS)
    code, out, err = coder(repo, "init")
    assert code == 0, out + err
    assert "warning: `python -m pytest -q` found no tests" in err
    assert "a test step would fail with 'no tests ran'" in err
    assert "fix: add a test" in err
    # the probe left nothing git sees in the checkout
    assert git(repo, "status", "--porcelain") == "?? coder.config.json\n"


def test_init_says_what_the_tests_found(make_repo) -> None:
    repo = make_repo(PYTEST_GREEN)
    code, out, err = coder(repo, "init")
    assert code == 0, out + err
    assert "Tests: `python -m pytest -q`: 1 passed" in out and "warning" not in err
    tests = init_json(repo, "--force")["tests"]
    assert tests == {"outcome": "ok", "detail": "`python -m pytest -q`: 1 passed", "fix": None}


def test_unittest_finding_no_tests_suggests_pytest(make_repo) -> None:
    repo = make_repo(
        {
            "coder.config.json": '{"test_command": "python -m unittest discover -v"}\n',
            "tests/test_a.py": "def test_plain():\n    pass\n",
        }
    )
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "no_tests"
    assert "unittest finds only unittest.TestCase classes" in tests["fix"]
    assert "python -m pytest -q" in tests["fix"]


def test_a_command_that_cannot_run_is_named_with_a_fix(make_repo) -> None:
    repo = make_repo({"coder.config.json": '{"test_command": "python -m nosuchrunner"}\n'})
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "not_run"
    assert "failed to run (exit 1) before any test" in tests["detail"]
    assert "No module named nosuchrunner" in tests["detail"]
    assert tests["fix"].startswith("install the test runner")


def test_a_command_the_policy_refuses_is_not_run(make_repo) -> None:
    repo = make_repo({"coder.config.json": '{"test_command": "nosuchprogram --all"}\n'})
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "not_run"
    assert "was not run" in tests["detail"] and "allowed_commands" in tests["detail"]


def test_an_empty_repository_runs_nothing(make_repo) -> None:
    repo = make_repo({"README.md": "# empty\n"})
    assert init_json(repo)["tests"] is None  # no test command: nothing to run, init stays quick


def test_no_test_probe_skips_it(make_repo) -> None:
    repo = make_repo(PYTEST_NO_TESTS)
    assert init_json(repo, "--no-test-probe")["tests"] is None
    code, out, _ = coder(repo, "doctor", "--json", "--no-test-probe")
    assert "tests" not in {c["name"] for c in json.loads(out)["checks"]}


def test_doctor_grades_the_tests(make_repo) -> None:
    repo = make_repo(PYTEST_NO_TESTS)
    _, out, _ = coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert found["tests"]["status"] == "warn"
    assert "found no tests" in found["tests"]["detail"] and found["tests"]["fix"]
    (repo / "tests" / "test_a.py").write_text("def test_one():\n    pass\n")
    _, out, _ = coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    assert found["tests"] == {
        "name": "tests",
        "status": "ok",
        "detail": "`python -m pytest -q`: 1 passed",
        "fix": None,
    }


def test_a_command_that_does_not_end_is_stopped(make_repo, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo()
    monkeypatch.chdir(repo)
    found = testprobe.probe(repo, "sleep 30", config_mod.load(repo), timeout=0.5)
    assert found.outcome == "not_run" and "did not finish within 0.5 s" in found.detail


def test_red_tests_are_reported_as_running(make_repo) -> None:
    repo = make_repo({"tests/test_a.py": "def test_one():\n    assert False\n"})
    tests = init_json(repo)["tests"]
    assert isinstance(tests, dict) and tests["outcome"] == "failing"
    assert "1 failed" in tests["detail"]
