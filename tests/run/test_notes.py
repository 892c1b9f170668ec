"""Guidance notes (coder.run.notes): `coder resume --note`, `coder revert --note` and `[n]ote`
at the prompt, against real git, the fake Ollama server and the real CLI. A note reaches the
next attempt's request after the unchanged prefix, is kept in the state (journaled), shown by
`show` and `report`, and carried by the step's commit as a Coder-Note trailer; a secret in it
is redacted everywhere; a bad one changes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import coder, git, sample_files
from tests.fake_ollama import FakeOllama
from tests.helpers import (
    Terminal,
    call,
    chat_requests,
    done,
    fingerprint,
    plain,
    state_of,
    taskfile,
)
from tests.prefix_cache import common_prefix, render

SECRET = "ghp_" + "R8d2Kq7LmZ0xWv3Ny5Tb9Hc1Jf6Gs4Pa2Qe8"
BRANCH = "agent/steer-add-mul"
TASK = """
    id: steer
    title: Add mul
    policies: {max_turns: 2}
    graph:
      - {id: s1, kind: shell, cmd: "echo one > one.txt"}
      - {id: s2, kind: edit, goal: "Add mul(a, b) to calc.py", depends_on: [s1]}
      - {id: s3, kind: shell, cmd: "echo three > three.txt", depends_on: [s2]}
"""
PLAIN = {"TERM": "dumb", "COLUMNS": "200"}  # no live view: the prompts as plain text
NOTE = "use the helper in utils.py, not a new function"


def edit_calc() -> list:
    return [
        call("fs_write", path="mul.py", content="def mul(a, b):\n    return a * b\n"),
        done("added mul", "mul.py"),
    ]


def failed_run(fake: FakeOllama, repo: Path) -> None:
    """The run, with s2 failing (it reads twice and hits max_turns)."""
    fake.enqueue(call("fs_read", path="README.md"), call("fs_read", path="calc.py"))
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 1, out + err
    assert state_of(repo, "steer")["steps"]["s2"]["status"] == "failed"


def trailers(repo: Path, step: str, branch: str = BRANCH) -> list[str]:
    """The Coder-Note trailers of the step's newest commit on the run's branch."""
    log = git(repo, "log", "--format=%B%x00", branch)
    message = next(m for m in log.split("\0") if f"Coder-Step: {step}\n" in m)
    return [line for line in message.splitlines() if line.startswith("Coder-Note: ")]


def test_a_resume_note_reaches_the_next_attempt_and_is_kept_everywhere(
    fake: FakeOllama, sample: Path
) -> None:
    failed_run(fake, sample)
    first = chat_requests(fake)
    fake.enqueue(*edit_calc())
    code, out, err = coder(sample, "resume", "-t", "steer", "--note", NOTE)
    assert code == 0, out + err

    # the next attempt's first request: the same prefix byte for byte, then the step's own
    # message, which ends with the note
    retry = chat_requests(fake)[len(first)]
    assert retry["messages"][0] == first[0]["messages"][0]
    assert retry["tools"] == first[0]["tools"]
    head = render({"tools": retry["tools"], "messages": retry["messages"][:1]})
    assert common_prefix(render(first[0]), render(retry)) >= len(head)  # the cache still hits
    assert [m["role"] for m in retry["messages"]] == ["system", "user"]
    opening = retry["messages"][1]["content"]
    assert "attempt 2" in opening and opening.endswith(f"<note>\n{NOTE}\n</note>")
    # ...and every later request of the attempt keeps it
    assert chat_requests(fake)[-1]["messages"][1] == retry["messages"][1]

    [note] = state_of(sample, "steer")["steps"]["s2"]["notes"]
    assert (note["text"], note["via"], note["attempt"]) == (NOTE, "resume", 2)
    assert trailers(sample, "s2") == [f"Coder-Note: {NOTE}"]
    assert trailers(sample, "s3") == []  # the note was for s2 only

    code, out, _ = coder(sample, "show", "-t", "steer")
    assert code == 0
    assert f"s2: for attempt 2 (via resume): {NOTE}" in out
    code, out, _ = coder(sample, "report", "-t", "steer")
    assert code == 0
    assert f"**Guidance for attempt 2** (via resume): {NOTE}" in out
    code, out, _ = coder(sample, "report", "-t", "steer", "--format", "json")
    [s2] = [s for s in json.loads(out)["steps"] if s["id"] == "s2"]
    assert [n["text"] for n in s2["notes"]] == [NOTE]


def test_a_secret_in_a_note_is_redacted_everywhere(fake: FakeOllama, sample: Path) -> None:
    failed_run(fake, sample)
    fake.enqueue(*edit_calc())
    note = sample.parent / "note.txt"
    note.write_text(f"the token is {SECRET}; do not print it\n")
    code, out, err = coder(sample, "resume", "-t", "steer", "--note-file", str(note))
    assert code == 0, out + err
    sent = json.dumps(chat_requests(fake))
    assert "the token is [REDACTED" in sent and SECRET not in sent
    assert SECRET not in (sample / ".coder" / "state" / "steer.json").read_text()
    assert SECRET not in (sample / ".coder" / "logs" / "steer.jsonl").read_text()
    assert SECRET not in git(sample, "log", "--format=%B", BRANCH)
    assert trailers(sample, "s2")[0].startswith("Coder-Note: the token is [REDACTED")
    for args in (("show", "-t", "steer"), ("report", "-t", "steer")):
        code, out, _ = coder(sample, *args)
        assert code == 0 and "the token is [REDACTED" in out and SECRET not in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--step", "s9"), "run steer has no step 's9'"),
        (("--step", "s1"), "step s1 of run steer is a shell step"),
        (("--step", "s3"), "step s3 of run steer is a shell step"),
    ],
)
def test_a_note_for_a_step_that_cannot_take_one_changes_nothing(
    fake: FakeOllama, sample: Path, args: tuple[str, ...], says: str
) -> None:
    failed_run(fake, sample)
    before = fingerprint(sample / ".coder" / "state"), git(sample, "rev-parse", BRANCH)
    code, out, err = coder(sample, "resume", "-t", "steer", "--note", NOTE, *args)
    assert code == 2, out + err
    assert says in err and "steps that can take a note: s2" in err
    assert "Traceback" not in err
    assert (fingerprint(sample / ".coder" / "state"), git(sample, "rev-parse", BRANCH)) == before
    assert fake.pending == 0 and len(chat_requests(fake)) == 2  # no model was asked


def test_a_note_for_a_done_step_is_refused(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*edit_calc(), call("fs_read", path="a"), call("fs_read", path="b"))
    shell = '{id: s3, kind: shell, cmd: "echo three > three.txt"'
    path = taskfile(sample, TASK.replace(shell, "{id: s3, kind: edit, goal: g"))
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 1
    code, _, err = coder(sample, "resume", "-t", "steer", "--note", NOTE, "--step", "s2")
    assert code == 2
    assert "step s2 of run steer is done and will not run again" in err
    assert "steps that can take a note: s3" in err


def test_a_revert_note_reaches_the_redone_step(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*edit_calc())
    assert coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, TASK)))[0] == 0
    code, out, err = coder(sample, "revert", "-t", "steer", "--to-step", "s1", "--note", NOTE)
    assert code == 0, out + err
    assert "note kept for the next attempt of step s2" in out
    [note] = state_of(sample, "steer")["steps"]["s2"]["notes"]
    assert (note["via"], note["attempt"]) == ("revert", 2)
    asked = len(chat_requests(fake))
    fake.enqueue(*edit_calc())
    code, out, err = coder(sample, "resume", "-t", "steer")
    assert code == 0, out + err
    redo = chat_requests(fake)[asked]["messages"]
    assert f"<note>\n{NOTE}\n</note>" in redo[1]["content"]
    assert trailers(sample, "s2") == [f"Coder-Note: {NOTE}"]


def test_a_bad_revert_note_reverts_nothing(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*edit_calc())
    assert coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, TASK)))[0] == 0
    before = fingerprint(sample / ".coder" / "state"), git(sample, "rev-parse", BRANCH)
    code, _, err = coder(
        sample, "revert", "-t", "steer", "--to-step", "s1", "--note", NOTE, "--step", "s3"
    )
    assert code == 2
    assert "step s3 of run steer is a shell step" in err and "can take a note: s2" in err
    assert (fingerprint(sample / ".coder" / "state"), git(sample, "rev-parse", BRANCH)) == before


def test_a_note_at_the_prompt_reaches_the_step(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*edit_calc())
    term = Terminal(["run", "-f", str(taskfile(sample, TASK))], sample, env=PLAIN)
    term.see("step s1 (shell)")
    assert "[n]ote" not in plain(term.output)  # no model reads a shell step's notes
    term.send("r")
    term.see("[d]iff so far  [n]ote  [q]uit")
    term.send("n")
    term.see("note for step s2")
    term.send(f"{NOTE} ({SECRET})")
    term.see("noted for attempt 1 of step s2")
    term.expect(r"s2\s+noted\s+for attempt 1: " + re.escape(NOTE) + r" \(\[REDACTED")  # the log
    term.send("r")
    term.see("step s3 (shell)")
    term.send("r")
    assert term.finish() == 0
    [note] = state_of(sample, "steer")["steps"]["s2"]["notes"]
    assert (note["via"], note["attempt"]) == ("prompt", 1)
    assert note["text"].startswith(NOTE) and SECRET not in note["text"]
    first = chat_requests(fake)[0]["messages"]
    assert f"<note>\n{NOTE} ([REDACTED" in first[1]["content"]
    assert trailers(sample, "s2")[0].startswith(f"Coder-Note: {NOTE} ([REDACTED")


FIX = """
    id: fixit
    title: Fix subtract
    policies: {max_turns: 2}
    graph:
      - id: s1
        kind: test
        on_fail: {strategy: fix_and_retry, max_cycles: 2}
"""


def test_every_fix_cycle_sees_the_notes_given_so_far(fake: FakeOllama, make_repo) -> None:
    files = sample_files()
    files["calc.py"] = files["calc.py"].replace("return a - b", "return a - b + 1")
    repo = make_repo(files)
    fake.enqueue(call("fs_read", path="calc.py"), call("fs_read", path="calc.py"))
    assert coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, FIX)))[0] == 1
    asked = len(chat_requests(fake))
    fake.enqueue(
        call("fs_write", path="notes.txt", content="not the fix\n"),
        done("a first try", "notes.txt"),
        call("fs_edit", path="calc.py", search="return a - b + 1", replace="return a - b"),
        done("fixed subtract", "calc.py"),
    )
    code, out, err = coder(repo, "resume", "-t", "fixit", "--note", NOTE)  # s1: the default
    assert code == 0, out + err
    cycles = [r for r in chat_requests(fake)[asked:] if "Fix cycle" in r["messages"][1]["content"]]
    assert [c["messages"][1]["content"].count("Fix cycle 2") for c in cycles] == [0, 0, 1, 1]
    for request in cycles:
        assert f"<note>\n{NOTE}\n</note>" in request["messages"][1]["content"]
    assert trailers(repo, "s1", "agent/fixit-fix-subtract") == [f"Coder-Note: {NOTE}"]


@pytest.mark.parametrize("snapshot", ["kept", "corrupt"])
def test_a_prompt_note_survives_a_crash_and_reaches_the_resumed_step(
    fake: FakeOllama, sample: Path, snapshot: str
) -> None:
    """The note is journaled when it is given: a runner killed right after (at the same
    prompt) loses nothing, and the resumed run's attempt of the step gets it; so it does when
    the snapshot is then found corrupt, and the state is rebuilt from the branch's commits
    with what the journal still holds."""
    term = Terminal(["run", "-f", str(taskfile(sample, TASK))], sample, env=PLAIN)
    term.see("step s1 (shell)")
    term.send("r")
    term.see("[n]ote  [q]uit")
    term.send("n")
    term.see("note for step s2")
    term.send(NOTE)
    term.expect(r"noted for attempt 1 of step s2\s+step s2 \(edit\)")  # asked again
    term.proc.kill()
    term.finish()
    journal = (sample / ".coder" / "state" / "steer.journal").read_text()
    assert NOTE in journal  # not in a snapshot yet: the journal line holds it
    [note] = state_of(sample, "steer")["steps"]["s2"]["notes"]
    assert (note["text"], note["via"]) == (NOTE, "prompt")
    if snapshot == "corrupt":
        (sample / ".coder" / "state" / "steer.json").write_text('{"version": 1, "ta')
    fake.enqueue(*edit_calc())
    code, out, err = coder(sample, "resume", "-t", "steer")
    assert code == 0, out + err
    if snapshot == "corrupt":
        assert (
            "rebuilding the state from the branch's commits and what the checkpoint still "
            "held of 2 steps (s1, s2: their notes, attempts and usage)" in err
        ), err
        assert "run `coder resume -t steer` to rebuild" not in err  # it is resuming already
    assert f"<note>\n{NOTE}\n</note>" in chat_requests(fake)[0]["messages"][1]["content"]
    assert trailers(sample, "s2") == [f"Coder-Note: {NOTE}"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--step", "s2"), "--step names the step a note is for"),
        (("--note", "a", "--note-file", "-"), "pass one of --note TEXT or --note-file PATH"),
        (("--note", "   "), "the note is empty"),
        (("--note-file", "/nonexistent/note.txt"), "cannot read the note file"),
    ],
)
def test_a_malformed_note_is_refused_before_anything(
    fake: FakeOllama, sample: Path, args: tuple[str, ...], says: str
) -> None:
    failed_run(fake, sample)
    before = fingerprint(sample / ".coder" / "state")
    code, out, err = coder(sample, "resume", "-t", "steer", *args)
    assert code == 2, out + err
    assert says in err and "Traceback" not in err
    assert fingerprint(sample / ".coder" / "state") == before
