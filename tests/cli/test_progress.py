"""A run's progress on stderr: the live view on a real pseudo-terminal (the DAG's steps, the
tool in progress, never drawn over a prompt), and plain lines, byte for byte, everywhere else."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from coder.cli.progress import Board, Progress, format_line
from coder.cli.views import progress_for
from tests.conftest import coder
from tests.fake_ollama import FakeOllama, Reply
from tests.helpers import ROOT, Terminal, call, done, plain, taskfile

ERASE = "\x1b[2K"  # what a redraw writes: erase the line

SLOW_TOOL = """
    id: slow
    title: A model step with a slow tool
    graph:
      - {id: prep, kind: shell, cmd: "echo prep > prep.txt"}
      - {id: work, kind: custom, goal: Write hi.txt}
"""
ASK = """
    id: ask
    title: Ask first
    graph:
      - {id: one, kind: shell, cmd: "echo one > one.txt", depends_on: []}
      - {id: two, kind: shell, cmd: "echo two > two.txt", depends_on: [one]}
"""


def test_live_view_shows_the_steps_and_the_tool_in_progress(make_repo) -> None:
    repo = make_repo()
    with FakeOllama() as fake:
        fake.enqueue(
            Reply(
                content="First I write hi.txt, slowly.",
                tool_calls=call("shell_run", cmd="sleep 2 && echo hi > hi.txt").tool_calls,
            ),
            Reply(content="", tool_calls=done("wrote hi.txt", "hi.txt").tool_calls, delay_s=1),
        )
        term = Terminal(
            ["run", "--autonomous", "-v", "-f", str(taskfile(repo, SLOW_TOOL))],
            repo,
            env={"OLLAMA_HOST": fake.url},
        )
        # while the tool runs, the region redraws: the running step, its turn and the tool
        # call with its target, tokens and tokens/s so far, and the steps around it; with -v
        # the model's streamed text under it
        tool = term.expect(
            r"● work +custom +turn 1 · shell_run sleep 2 && echo hi > hi.txt · ([\d,]+) "
            r"tokens · [\d.]+ tok/s · 0:0\d\s+First I write hi.txt, slowly."
        )
        assert int(tool.group(1).replace(",", "")) > 0
        term.expect(r"✔ prep +shell +success")
        term.expect(r"1/2 steps done · \d+:\d\d elapsed")
        # the model's second call is slow: its turn is shown while it thinks
        term.expect(r"● work +custom +turn 2 · waiting for the model")
        assert term.finish() == 0
    screen = plain(term.output)
    assert ERASE in term.output  # it did redraw
    # the event lines stay, in order, as in plain mode; the region is gone at the end
    lines = [line for line in screen.splitlines() if re.match(r"\d\d:\d\d:\d\d  ", line)]
    assert [" ".join(line[10:].split()[:2]) for line in lines] == [
        "run started",
        "prep started",
        "prep done",
        "work started",
        "work done",
        "run finished",
    ]
    assert screen.rstrip().splitlines()[-1].startswith("  model ")  # the summary comes last


def test_the_live_view_never_draws_over_the_approval_prompt(make_repo) -> None:
    repo = make_repo()
    term = Terminal(["run", "-f", str(taskfile(repo, ASK))], repo)
    term.expect(r"step one \(shell\): `echo one > one.txt`\s+\[r\]un  \[s\]kip")
    term.expect(r"\[q\]uit \[r\]: $")
    # waiting for the answer: the live region (redrawn 4 times a second) stays down
    assert term.read(1.2) == ""
    term.send("d")  # the diff so far (nothing yet), then asked again
    term.expect(r"\(no changes yet\)")
    term.expect(r"\[q\]uit \[r\]: $")
    assert term.read(0.8) == ""
    term.send("r")
    term.expect(r"step two \(shell\)")
    term.expect(r"\[q\]uit \[r\]: $")
    asked = len(term.output)
    assert term.read(0.8) == ""
    term.send("q")
    assert term.finish() == 130
    # between the prompt and the answer's echo nothing was erased or redrawn
    answered = term.output[asked:]
    assert ERASE not in answered.split("q", 1)[0]
    # and the region came back between the questions: one's line, then the live rows
    assert re.search(r"one +started", plain(term.output))


def test_quiet_and_dumb_terminals_get_plain_lines(make_repo) -> None:
    repo = make_repo()
    path = taskfile(repo, ASK)
    term = Terminal(["run", "--autonomous", "--quiet", "-f", str(path)], repo)
    assert term.finish() == 0
    assert ERASE not in term.output and "\x1b[?25l" not in term.output  # no cursor games
    assert re.search(r"\d\d:\d\d:\d\d  two +done +commit [0-9a-f]{8}", term.output)

    repo2 = make_repo(name="repo2")
    term = Terminal(["run", "--autonomous", "-f", str(path)], repo2, env={"TERM": "dumb"})
    assert term.finish() == 0
    assert ERASE not in term.output


def test_plain_lines_are_byte_stable() -> None:
    events = [
        {"event": "run.started", "steps": 2, "branch": "agent/x"},
        {"event": "step.started", "step_id": "s1", "kind": "edit", "goal": "Edit", "attempt": 1},
        {"event": "model.turn", "step_id": "s1", "turn": 1, "calls": ["fs_edit"], "usage": {}},
        {"event": "tool.called", "step_id": "s1", "tool": "fs_edit"},
        {"event": "step.retry", "step_id": "s1", "attempt": 1, "error": "claim rejected"},
        {"event": "step.started", "step_id": "s1", "kind": "edit", "goal": "Edit", "attempt": 2},
        {"event": "step.succeeded", "step_id": "s1", "commit": "0123456789ab", "summary": "ok"},
        {"event": "step.started", "step_id": "s2", "kind": "test", "goal": "Test", "attempt": 1},
        {
            "event": "fix.cycle",
            "step_id": "s2",
            "cycle": 1,
            "failing": "1 passed, 1 failed",
            "kind": "test",
        },
        {"event": "step.failed", "step_id": "s2", "error": "tests failed"},
        {"event": "run.finished", "status": "failed", "error": ""},
    ]
    expected = (
        "10:00:00             run started 2 steps on agent/x\n"
        "10:00:00  s1         started     edit: Edit\n"
        "10:00:00  s1         failed, retrying claim rejected\n"
        "10:00:00  s1         started     edit: Edit (attempt 2)\n"
        "10:00:00  s1         done        commit 01234567 · ok\n"
        "10:00:00  s2         started     test: Test\n"
        "10:00:00  s2         fixing      tests red (1 passed, 1 failed); fix cycle 1\n"
        "10:00:00  s2         FAILED      tests failed\n"
        "10:00:00             run finished failed\n"
    )
    for _ in range(2):
        stream = io.StringIO()
        progress = Progress(stream, clock=lambda: "10:00:00")
        for event in events:
            progress(dict(event))
        with progress.paused():
            pass
        progress.close()
        assert stream.getvalue() == expected
    # not a terminal: plain, whatever TERM says; --json: nothing at all
    assert type(progress_for(stream=io.StringIO())) is Progress
    silent = io.StringIO()
    quiet = progress_for(silent=True, stream=silent)
    quiet(events[0])
    assert silent.getvalue() == ""


def test_plain_mode_never_loads_rich() -> None:
    probe = (
        "import io, sys\n"
        "from coder.cli.views import progress_for\n"
        "p = progress_for(stream=io.StringIO())\n"
        "p({'event': 'run.started', 'steps': 1, 'branch': 'b'})\n"
        "print('rich' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_a_piped_run_writes_only_whole_plain_lines(make_repo) -> None:
    repo = make_repo()
    proc = subprocess.run(
        [sys.executable, "-m", "coder", "run", "--autonomous", "-f", str(taskfile(repo, ASK))],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr
    assert all(re.match(r"\d\d:\d\d:\d\d  ", line) for line in proc.stderr.splitlines())
    code, out, _ = coder(repo, "show", "-t", "ask", "--json")
    assert json.loads(out)["status"] == "success"


def test_the_board_follows_the_logged_events() -> None:
    board = Board([("s1", "edit", "Edit"), ("s2", "test", "Test")])
    board.apply({"event": "run.started", "steps": 2}, 0.0)
    board.apply({"event": "step.started", "step_id": "s1", "kind": "edit", "attempt": 1}, 10.0)
    s1 = board.steps["s1"]
    assert (s1.status, s1.doing(12.0)) == ("running", "waiting for the model · 0:02")
    usage = {"prompt_tokens": 1000, "eval_tokens": 20, "tokens_per_s": 40.0}
    board.apply(
        {
            "event": "model.turn",
            "step_id": "s1",
            "turn": 1,
            "calls": ["fs_read", "fs_edit"],
            "usage": usage,
        },
        13.0,
    )
    assert s1.doing(13.0) == "turn 1 · fs_read · 1,020 tokens · 40.0 tok/s · 0:03"
    board.apply({"event": "tool.called", "step_id": "s1", "tool": "fs_read"}, 13.5)
    assert s1.tool == "fs_edit"
    board.apply({"event": "tool.called", "step_id": "s1", "tool": "fs_edit"}, 14.0)
    assert s1.doing(75.0).startswith("turn 1 · waiting for the model · 1,020 tokens")
    assert s1.doing(75.0).endswith("1:05")
    board.apply({"event": "step.succeeded", "step_id": "s1"}, 80.0)
    board.apply({"event": "step.started", "step_id": "s2", "kind": "test", "attempt": 1}, 80.0)
    assert board.steps["s2"].doing(81.0) == "running the tests · 0:01"
    board.apply({"event": "fix.cycle", "step_id": "s2", "cycle": 2}, 82.0)
    assert board.steps["s2"].doing(82.0).startswith("fix cycle 2 · waiting for the model")
    assert (board.done, board.total, s1.status) == (1, 2, "success")
    board.apply(
        {"event": "model.turn", "step_id": "s2", "turn": 1, "calls": ["fs_edit"], "usage": {}}, 83.0
    )
    assert board.steps["s2"].doing(83.0).startswith("fix cycle 2 · turn 1 · fs_edit")
    board.apply(
        {
            "event": "model.turn",
            "step_id": "s2",
            "turn": 2,
            "calls": ["step_complete"],
            "usage": {},
        },
        84.0,
    )
    assert board.steps["s2"].doing(84.0) == "fix cycle 2 · running the tests · 0:04"


def test_a_lint_step_is_shown_in_its_own_words() -> None:
    """A lint step running its linter is not "waiting for the model", and its fix cycle is
    not "tests red": the live view and the event lines ask the kind (coder.taskfile.kinds.Kind.labels)."""
    board = Board([("l1", "lint", "Lint")])
    board.apply({"event": "step.started", "step_id": "l1", "kind": "lint", "attempt": 1}, 0.0)
    l1 = board.steps["l1"]
    assert l1.doing(1.0) == "running the linter · 0:01"
    cycle = {"event": "fix.cycle", "step_id": "l1", "cycle": 1, "failing": "2 new findings"}
    board.apply({**cycle, "kind": "lint"}, 2.0)
    assert l1.doing(2.0) == "fix cycle 1 · waiting for the model · 0:02"
    board.apply(
        {"event": "model.turn", "step_id": "l1", "turn": 1, "calls": ["step_complete"]}, 3.0
    )
    assert l1.doing(3.0) == "fix cycle 1 · running the linter · 0:03"
    line = format_line({**cycle, "kind": "lint"}, "10:00:00")
    assert line == "10:00:00  l1         fixing      lint red (2 new findings); fix cycle 1"
    assert format_line({**cycle, "kind": "test"}, "10:00:00").endswith(
        "tests red (2 new findings); fix cycle 1"
    )


def test_the_board_follows_the_model_loops_typed_events() -> None:
    from coder.agent import events as ev
    from coder.models.provider import Usage

    board = Board([("s1", "test", "Test")])
    board.apply({"event": "step.started", "step_id": "s1", "kind": "test", "attempt": 1}, 0.0)
    board.apply({"event": "fix.cycle", "step_id": "s1", "cycle": 1}, 1.0)
    fields = {"task_id": "t", "step_id": "s1", "fix_cycle": 1}
    board.apply_loop(fields, ev.TurnStarted(1, 900, 0.0))
    board.apply_loop(fields, ev.ModelText(1, "Reading ", 8, 2, 0.5, 4.0))
    board.apply_loop(fields, ev.ModelText(1, "calc.py", 15, 4, 1.0, 4.0))
    s1 = board.steps["s1"]
    assert (
        s1.doing(3.0)
        == "fix cycle 1 · turn 1 · waiting for the model · 4 tokens · 4.0 tok/s · 0:03"
    )
    assert s1.text == "Reading calc.py"
    usage = {"prompt_tokens": 900, "eval_tokens": 10, "tokens_per_s": 10.0}
    board.apply(
        {"event": "model.turn", "step_id": "s1", "turn": 1, "calls": ["fs_edit"], "usage": usage},
        3.0,
    )
    board.apply_loop(fields, ev.ToolStarted(1, "fs_edit", "calc.py"))
    assert (
        s1.doing(4.0) == "fix cycle 1 · turn 1 · fs_edit calc.py · 910 tokens · 10.0 tok/s · 0:04"
    )
    board.apply({"event": "tool.called", "step_id": "s1", "tool": "fs_edit"}, 4.5)
    assert s1.tool == "fs_edit calc.py"  # the typed events say when it ends
    board.apply_loop(fields, ev.ToolFinished(1, "fs_edit", 0.5))
    board.apply_loop(fields, ev.LoopFinished(2, True, "fixed", Usage()))
    assert s1.tool == ""


SLOW_TESTS = {
    "README.md": "# x\n",
    "tests/test_slow.py": (
        "import time\nimport unittest\n\n\nclass Slow(unittest.TestCase):\n"
        "    def test_slow(self) -> None:\n        time.sleep(1.5)\n"
    ),
}


def test_merge_if_green_shows_the_tests_running_on_the_merge_result(make_repo) -> None:
    repo = make_repo(SLOW_TESTS)
    path = taskfile(
        repo,
        """
        id: green
        title: Green
        graph:
          - {id: add, kind: shell, cmd: "echo new > new.txt"}
          - {id: check, kind: test, cmd: "python3 -m unittest discover -s tests"}
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    term = Terminal(["merge", "-t", "green", "--if-green"], repo)
    term.expect(r"\S checking the merge result: python3 -m unittest discover -s tests · 0:0[1-9]")
    assert term.finish() == 0
    screen = plain(term.output)
    assert "checking the merge result: python3 -m unittest discover -s tests\r\n" in screen
    assert "Merged run green into main (squash, checked green) as " in screen


def test_plan_shows_the_draft_and_the_problems_sent_back(sample: Path) -> None:
    from tests.plan.test_plan import PROMPT, plan_doc

    broken = plan_doc()
    broken["graph"][1] = {"id": "s2", "kind": "shell", "depends_on": ["s1"]}  # no cmd
    with FakeOllama() as fake:
        fake.enqueue(
            Reply(content=json.dumps(broken), delay_s=1.5),
            Reply(content=json.dumps(plan_doc()), delay_s=1.5),
        )
        term = Terminal(["plan", PROMPT], sample, env={"OLLAMA_HOST": fake.url})
        term.expect(r"\S draft 1 of 3: waiting for the model · 0:0\d")
        term.expect(r"attempt 1/3: 1 problem; asking the model to fix them\r\n")
        term.expect(r"[\r\n]  tasks/add-multiply\.draft\.yaml:\d+:\d+: graph\[1\] \(step s2\): ")
        term.expect(r"\S draft 2 of 3: waiting for the model · 0:0\d")
        assert term.finish() == 0
    assert "Planned tasks/add-multiply.yaml" in plain(term.output)


def test_plain_mode_says_a_step_is_still_working_after_a_silence() -> None:
    """A 148 s test step printed nothing in a CI log: plain lines get a `working` line per
    running step when nothing was printed for `heartbeat` seconds, and none after the end."""
    import time

    stream = io.StringIO()
    progress = Progress(stream, clock=lambda: "10:00:00", heartbeat=0.3)
    progress({"event": "run.started", "steps": 1, "branch": "agent/x"})
    progress({"event": "step.started", "step_id": "s4", "kind": "test", "goal": "run them"})
    time.sleep(0.9)
    progress({"event": "step.succeeded", "step_id": "s4", "commit": "abc"})
    progress.close()
    time.sleep(0.5)
    lines = stream.getvalue().splitlines()
    working = [line for line in lines if " working " in line]
    assert working and all(
        re.fullmatch(r"10:00:00  s4         working     running the tests · 0:00", line)
        for line in working
    )
    assert " working " not in lines[-1]  # nothing after the step ended
