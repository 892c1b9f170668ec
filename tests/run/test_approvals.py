"""`coder run` without --autonomous: a prompt before each step, driven through a real
pseudo-terminal; refused when stdin is not a terminal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import coder, git
from tests.helpers import ROOT, Terminal, taskfile

PLAIN = {"TERM": "dumb", "COLUMNS": "200"}  # no live view: the prompts as plain text

TASK = """
    id: ask
    title: Ask first
    graph:
      - {id: one, kind: shell, cmd: "echo one > one.txt", depends_on: []}
      - {id: two, kind: shell, cmd: "echo two > two.txt", depends_on: []}
      - {id: three, kind: shell, cmd: "echo three > three.txt", depends_on: []}
"""


def test_approve_skip_diff_and_quit_through_a_terminal(make_repo) -> None:
    repo = make_repo()
    term = Terminal(["run", "-f", str(taskfile(repo, TASK))], repo, env=PLAIN)
    term.see("step one (shell): `echo one > one.txt`")
    term.send("r")
    term.see("step two (shell)")
    term.send("d")  # the diff so far: step one's file
    term.see("+one")
    term.see("step two (shell)")
    term.send("s")
    term.see("step three (shell)")
    term.send("q")
    assert term.finish() == 130
    state = json.loads((repo / ".coder" / "state" / "ask.json").read_text())
    assert {k: v["status"] for k, v in state["steps"].items()} == {
        "one": "success",
        "two": "skipped",
        "three": "pending",
    }
    assert state["steps"]["two"]["reasons"] == ["skipped by the user at the approval prompt"]
    assert git(repo, "show", "agent/ask-ask-first:one.txt") == "one\n"
    # quitting is a stop: resume continues (autonomously) with the remaining step
    code, out, err = coder(repo, "resume", "-t", "ask")
    assert code == 0, out + err
    assert git(repo, "show", "agent/ask-ask-first:three.txt") == "three\n"


@pytest.mark.parametrize("how", ["ctrl-c", "SIGTERM", "SIGHUP"])
def test_a_stop_at_the_question_is_quit_exit_130_checkpointed(make_repo, how: str) -> None:
    """The prompt waits for an answer; Ctrl-C, `coder stop`'s SIGTERM and a closed terminal
    each end it as [q]uit does, at once: exit 130, the state checkpointed, resume goes on."""
    repo = make_repo()
    term = Terminal(["run", "-f", str(taskfile(repo, TASK))], repo, env=PLAIN, session=True)
    term.see("step one (shell)")
    term.send("r")
    term.see("step two (shell)")
    asked = time.monotonic()
    if how == "ctrl-c":
        os.write(term.master, b"\x03")
    elif how == "SIGTERM":
        term.proc.send_signal(signal.SIGTERM)
    else:
        term.hang_up()
    while term.proc.poll() is None and time.monotonic() - asked < 15:
        if how != "SIGHUP":
            term.read(0.1)  # what it prints on its way out
        time.sleep(0.05)
    assert term.proc.poll() == 130, term.output

    state = json.loads((repo / ".coder" / "state" / "ask.json").read_text())
    assert state["status"] == "interrupted"
    assert {k: v["status"] for k, v in state["steps"].items()} == {
        "one": "success",
        "two": "pending",
        "three": "pending",
    }
    code, out, err = coder(repo, "resume", "-t", "ask")
    assert code == 0, out + err
    assert git(repo, "show", "agent/ask-ask-first:three.txt") == "three\n"


def test_without_a_terminal_interactive_mode_is_refused(make_repo) -> None:
    repo = make_repo()
    proc = subprocess.run(
        [sys.executable, "-m", "coder", "run", "-f", str(taskfile(repo, TASK))],
        cwd=repo,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert proc.returncode == 2
    assert "needs a terminal; pass --autonomous" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*") == ""


def test_the_live_display_leaves_an_open_prompt_alone(make_repo) -> None:
    """The live view redraws about four times a second; while a prompt is open it must not,
    or it wipes the prompt and what the user types. (A terminal that can redraw: the live
    view is on.)"""
    repo = make_repo()
    term = Terminal(["run", "-f", str(taskfile(repo, TASK))], repo)
    term.see("step one (shell): `echo one > one.txt`")
    term.see("[q]uit [r]: ")
    assert term.output.endswith("[q]uit [r]: ")
    assert term.read(1.2) == ""  # long enough for several redraws
    term.send("q")
    assert term.finish() == 130


def test_ctrl_c_at_the_trust_question_is_an_interruption_exit_130(make_repo) -> None:
    """click's prompts turn Ctrl-C into Abort ("Aborted!", exit 1); coder's edge maps it to
    an interruption like any other."""
    repo = make_repo({"coder.config.json": json.dumps({"allowed_commands": ["make"]})})
    term = Terminal(["run", "-f", str(taskfile(repo, TASK))], repo, env=PLAIN, session=True)
    term.see("Trust these settings for this repository?")
    os.write(term.master, b"\x03")
    assert term.finish() == 130, term.output
    assert "coder: interrupted" in term.output and "Aborted!" not in term.output
    assert not (repo / ".coder" / "state" / "ask.json").exists()
