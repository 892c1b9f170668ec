"""fix_and_retry on test steps, through the real ollama client against the fake server:
red tests -> the failing sections go to the model -> it fixes -> tests rerun."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import coder, git
from tests.fake_ollama import FakeOllama
from tests.helpers import call, chat_requests, done, state_of, step_commits, taskfile

BUGGY = "\n\ndef multiply(a: float, b: float) -> float:\n    return a ** b\n"
TEST = (
    "\n    def test_multiply(self) -> None:\n"
    "        from calc import multiply\n\n"
    "        self.assertEqual(multiply(2, 3), 6)\n"
)

JOURNEY = """
    id: fix
    title: Multiply, with a fix
    graph:
      - {id: s1, kind: analyze, goal: Find the operations, depends_on: []}
      - {id: s2, kind: edit, goal: "Add multiply(a, b) and its test", depends_on: [s1]}
      - id: s3
        kind: test
        depends_on: [s2]
        on_fail: {strategy: fix_and_retry, max_cycles: 2}
      - {id: s4, kind: doc, goal: Document multiply, depends_on: [s3]}
"""


def edit_replies() -> list:
    return [
        call("fs_read", path="calc.py"),
        done("operations are in calc.py"),
        call(
            "fs_edit",
            path="calc.py",
            search="    return a - b\n",
            replace="    return a - b\n" + BUGGY,
        ),
        call(
            "fs_edit",
            path="tests/test_calc.py",
            search="        self.assertEqual(subtract(5, 3), 2)\n",
            replace="        self.assertEqual(subtract(5, 3), 2)\n" + TEST,
        ),
        done("added multiply and a test", "calc.py", "tests/test_calc.py"),
    ]


def test_analyze_edit_failing_test_fix_doc_merge(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        *edit_replies(),
        call("fs_edit", path="calc.py", search="return a ** b", replace="return a * b"),
        done("multiply used ** instead of *", "calc.py"),
        call(
            "fs_edit",
            path="README.md",
            search="add(2, 3)  # 5\n",
            replace="add(2, 3)  # 5\nmultiply(2, 3)  # 6\n",
        ),
        done("documented multiply", "README.md"),
    )
    code, out, err = coder(
        sample, "run", "--autonomous", "--merge-on-success", "-f", str(taskfile(sample, JOURNEY))
    )
    assert code == 0, out + err
    branch = "agent/fix-multiply-with-a-fix"
    assert [c[:2] for c in step_commits(sample, branch)] == [("s2", "1"), ("s3", "1"), ("s4", "1")]
    assert git(sample, "show", f"{branch}~1:calc.py").count("return a * b") == 1  # s3's commit
    step = state_of(sample, "fix")["steps"]["s3"]
    assert step["summary"] == "tests green (exit 0): 3 passed after 1 fix cycle"
    assert step["usage"]["calls"] == 2
    # the model saw the failing test, not the whole log
    fix_request = next(
        r for r in chat_requests(fake) if "Fix cycle 1 of 2" in r["messages"][1]["content"]
    )
    first = fix_request["messages"][1]["content"]
    assert "test_multiply" in first and "AssertionError" in first and "test_add" not in first
    # the fix rule and tools are the prefix's (cached), said once for the run, not per cycle
    rule = "Change the code so the failing tests pass. Change a test only if the test itself"
    prefix = fix_request["messages"][0]["content"]
    assert f"- test (its fix cycles): {rule}" in prefix
    assert rule not in first and "Tools for this step" not in first
    assert first.endswith(
        "call step_complete with a summary and files_changed; coder then reruns the tests."
    )
    # merged on main, as one squash commit
    assert "def multiply" in git(sample, "show", "main:calc.py")
    assert git(sample, "rev-parse", "coder/fix") == git(sample, "rev-parse", "main")


def test_repeated_failure_is_reported_after_max_cycles(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        *edit_replies(),
        call("fs_edit", path="calc.py", search="return a ** b", replace="return b ** a"),
        done("swapped the operands", "calc.py"),
        call("fs_edit", path="calc.py", search="return b ** a", replace="return a + b"),
        done("another try", "calc.py"),
    )
    code, _, _ = coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, JOURNEY)))
    assert code == 1
    state = state_of(sample, "fix")
    assert state["steps"]["s3"]["status"] == "failed"
    assert (
        state["steps"]["s3"]["error"]
        == "tests still failing after 2 fix cycles: 2 passed, 1 failed"
    )
    assert state["steps"]["s4"]["status"] == "pending"
    second = next(
        r for r in chat_requests(fake) if "Fix cycle 2 of 2" in r["messages"][1]["content"]
    )
    assert "The previous fix did not change these failures" in second["messages"][1]["content"]
    # the failed step's edits were discarded: the branch ends at s2
    assert [c[0] for c in step_commits(sample, "agent/fix-multiply-with-a-fix")] == ["s2"]


def test_a_fix_that_changes_nothing_stops_early(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*edit_replies(), done("looks fine to me", no_change_reason="the code is right"))
    code, _, _ = coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, JOURNEY)))
    assert code == 1
    error = state_of(sample, "fix")["steps"]["s3"]["error"]
    assert error == "fix cycle 1 changed nothing; stopping early (2 passed, 1 failed)"
