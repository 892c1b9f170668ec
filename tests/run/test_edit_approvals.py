"""`--approvals per-edit` through a real pseudo-terminal, with the fake model server: each
write, patch and command is shown before it happens and the answer decides (the model gets a
refusal's reason in its next request; the user's edit is what is committed; `all` stops the
questions); refused up front without a terminal."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import git
from tests.fake_ollama import FakeOllama
from tests.helpers import ROOT, Terminal, call, chat_requests, done, taskfile

PLAIN = {"TERM": "dumb", "COLUMNS": "200"}  # no live view: the questions as plain text
BRANCH = "agent/edits-edits-with-approvals"
TASK = """
    id: edits
    title: Edits with approvals
    graph:
      - {id: work, kind: custom, goal: Change the notes and write hello.txt}
"""
ASKED = r"\[a\]ll for this step \[y\]: $"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tool_messages(fake: FakeOllama) -> list[str]:
    """The tool results each chat request carried, last request's last."""
    last = chat_requests(fake)[-1]["messages"]
    return [m["content"] for m in last if m["role"] == "tool"]


def committed(repo: Path) -> list[str]:
    """The files the step's commit (the branch's tip) changed."""
    return git(repo, "show", "--name-only", "--format=", BRANCH).split()


def events(repo: Path, name: str) -> list[dict[str, object]]:
    lines = (repo / ".coder" / "logs" / "edits.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_refuse_one_edit_with_a_reason_and_accept_another_in_the_live_view(make_repo) -> None:
    repo = make_repo({"notes.txt": "keep me\n"})
    before = sha((repo / "notes.txt").read_bytes())
    with FakeOllama() as fake:
        fake.enqueue(
            call("fs_edit", path="notes.txt", search="keep me", replace="changed"),
            call("fs_write", path="hello.txt", content="hello\n"),
            done("wrote hello.txt; the notes stay", "hello.txt"),
        )
        term = Terminal(
            ["run", "--approvals", "per-edit", "-f", str(taskfile(repo, TASK))],
            repo,
            env={"OLLAMA_HOST": fake.url},
        )
        term.see("step work: fs_edit wants to change notes.txt")
        term.see("+changed")
        assert "\x1b[32m+changed" in term.output  # the diff, in colour on a terminal
        term.expect(ASKED)
        assert term.read(1.0) == ""  # the live view stays down while it asks
        term.send("n")
        term.see("why not (the model is told)")
        term.send("use the helper in utils.py")
        term.see("step work: fs_write wants to change hello.txt")
        term.see("+hello")
        term.expect(ASKED)
        term.send("y")
        assert term.finish() == 0, term.output
        # the model's next request carried the refusal and the reason
        refusal = tool_messages(fake)[0]
        assert "the user refused this fs_edit call" in refusal
        assert "use the helper in utils.py" in refusal
    worktree = repo / ".coder" / "worktrees" / "edits"
    assert sha((worktree / "notes.txt").read_bytes()) == before
    assert sha(git(repo, "show", f"{BRANCH}:notes.txt").encode()) == before
    assert committed(repo) == ["hello.txt"]
    assert git(repo, "show", f"{BRANCH}:hello.txt") == "hello\n"
    # the decisions are in the event log, and the refusal among the step's reasons
    (refused,) = events(repo, "approval.refused")
    assert refused["reason"] == "use the helper in utils.py" and refused["tool"] == "fs_edit"
    assert [e["answer"] for e in events(repo, "approval.answered")] == ["yes"]
    state = json.loads((repo / ".coder" / "state" / "edits.json").read_text())
    assert any("use the helper in utils.py" in r for r in state["steps"]["work"]["reasons"])


def test_all_stops_asking_for_the_step_and_no_color_is_respected(make_repo) -> None:
    repo = make_repo()
    with FakeOllama() as fake:
        fake.enqueue(
            call("fs_write", path="two.txt", content="two\n"),
            call("shell_run", cmd="echo one > one.txt"),
            call("fs_write", path="three.txt", content="three\n"),
            done("wrote them", "one.txt", "two.txt", "three.txt"),
        )
        term = Terminal(
            ["run", "--approvals", "per-edit", "-f", str(taskfile(repo, TASK))],
            repo,
            env={**PLAIN, "OLLAMA_HOST": fake.url, "NO_COLOR": "1"},
        )
        term.see("step work: fs_write wants to change two.txt")
        term.see("+two")
        term.expect(ASKED)
        term.send("a")
        assert term.finish() == 0, term.output
    assert "\x1b[" not in term.output  # NO_COLOR: a plain diff
    assert term.output.count(" wants to ") == 1  # the command and the last write: not asked
    assert sorted(committed(repo)) == ["one.txt", "three.txt", "two.txt"]
    assert [e["answer"] for e in events(repo, "approval.answered")] == ["all", "all", "all"]


def test_edit_opens_the_editor_and_the_edited_content_is_committed(
    make_repo, tmp_path: Path
) -> None:
    repo = make_repo()
    editor = tmp_path / "editor.py"
    editor.write_text(
        "import sys\n"
        "path = sys.argv[1]\n"
        "seen = open(path).read()\n"
        "open(path, 'w').write('edited by the user\\n' + seen.upper())\n"
    )
    with FakeOllama() as fake:
        fake.enqueue(
            call("fs_write", path="notes.md", content="draft\n"),
            call("shell_run", cmd="cat notes.md > copy.txt"),
            done("wrote the notes", "notes.md", "copy.txt"),
        )
        term = Terminal(
            ["run", "--approvals", "per-edit", "-f", str(taskfile(repo, TASK))],
            repo,
            env={
                **PLAIN,
                "OLLAMA_HOST": fake.url,
                "EDITOR": f"{sys.executable} {editor}",
                "VISUAL": "",
            },
        )
        term.see("step work: fs_write wants to change notes.md")
        term.expect(r"\[e\]dit  " + ASKED)
        term.send("e")
        # the command, with the policy's decision on it
        term.see("step work: shell_run wants to run `cat notes.md > copy.txt`")
        term.see("policy: allowed: runs in the sandbox, network off")
        term.expect(ASKED)
        term.send("y")
        assert term.finish() == 0, term.output
        told = tool_messages(fake)[0]
        assert "the user edited your change before it was written" in told
        assert "+edited by the user" in told
    expected = "edited by the user\nDRAFT\n"
    assert git(repo, "show", f"{BRANCH}:notes.md") == expected
    assert git(repo, "show", f"{BRANCH}:copy.txt") == expected  # the command ran after it
    assert sorted(committed(repo)) == ["copy.txt", "notes.md"]
    answered = events(repo, "approval.answered")
    assert [(e["answer"], e["edited"]) for e in answered] == [("edit", ["notes.md"]), ("yes", None)]


def _without_terminal(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coder", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )


SHELL_TASK = """
    id: edits
    title: Edits with approvals
    policies: {approvals: per-edit}
    graph:
      - {id: one, kind: shell, cmd: "echo one > one.txt"}
"""


def test_without_a_terminal_per_edit_is_refused_up_front(make_repo) -> None:
    repo = make_repo()
    path = str(taskfile(repo, TASK))
    proc = _without_terminal(repo, "run", "--approvals", "per-edit", "-f", path)
    assert proc.returncode == 2, proc.stderr
    assert "approvals per-edit: coder asks before each edit and command" in proc.stderr
    assert "needs a terminal; pass --autonomous" in proc.stderr
    # the taskfile's policies.approvals asks too, unless the command line says otherwise
    shell = str(taskfile(repo, SHELL_TASK, name="shell.yaml"))
    proc = _without_terminal(repo, "run", "-f", shell)
    assert proc.returncode == 2 and "approvals per-edit" in proc.stderr, proc.stderr
    assert git(repo, "branch", "--list", "agent/*") == ""
    proc = _without_terminal(repo, "run", "--autonomous", "--approvals", "per-edit", "-f", shell)
    assert proc.returncode == 2 and "cannot go with --approvals per-edit" in proc.stderr
    proc = _without_terminal(repo, "run", "--autonomous", "-f", shell)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"{BRANCH}:one.txt") == "one\n"


def test_ctrl_c_at_the_question_stops_the_run_and_writes_nothing(make_repo) -> None:
    repo = make_repo()
    with FakeOllama() as fake:
        fake.enqueue(
            call("fs_write", path="two.txt", content="two\n"),
            done("wrote two.txt", "two.txt"),
        )
        term = Terminal(
            ["run", "--approvals", "per-edit", "-f", str(taskfile(repo, TASK))],
            repo,
            env={**PLAIN, "OLLAMA_HOST": fake.url},
            session=True,  # the terminal is coder's: Ctrl-C sends it SIGINT
        )
        term.expect(ASKED)
        os.write(term.master, b"\x03")  # Ctrl-C: the run stops, the question with it
        term.see("stopping")
        assert term.finish() == 130, term.output
    assert "Traceback" not in term.output
    (called,) = events(repo, "tool.called")  # answered as a refusal: nothing written
    assert called["tool"] == "fs_write" and called["ok"] is False
    assert events(repo, "approval.refused")[0]["reason"] == "the user stopped the run"
    assert not (repo / ".coder" / "worktrees" / "edits" / "two.txt").exists()
    assert git(repo, "rev-list", "--count", f"main..{BRANCH}").strip() == "0"


def test_the_editor_gets_a_file_name_coder_made_never_the_models(make_repo, tmp_path: Path) -> None:
    """click 8.1 runs the editor through a shell with the file name in double quotes: a
    `$(...)` in the model's file name would run. The editor's file takes only a plain
    extension from it."""
    repo = make_repo()
    seen = tmp_path / "argv.json"
    editor = tmp_path / "editor.py"
    editor.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(seen)!r}, 'w'))\n")
    hostile = "notes.$(cd; touch PWNED)"
    with FakeOllama() as fake:
        fake.enqueue(
            call("fs_write", path=hostile, content="draft\n"),
            done("wrote the notes", hostile),
        )
        term = Terminal(
            ["run", "--approvals", "per-edit", "-f", str(taskfile(repo, TASK))],
            repo,
            env={**PLAIN, "OLLAMA_HOST": fake.url, "EDITOR": f"{sys.executable} {editor}"},
        )
        term.expect(r"\[e\]dit  " + ASKED)
        term.send("e")
        term.finish()
    (opened,) = json.loads(seen.read_text())
    assert Path(opened).suffix == ".txt"
    assert "$" not in opened and ";" not in opened and " " not in opened
    assert not list(Path(os.environ["HOME"]).rglob("PWNED")) and not list(repo.rglob("PWNED"))
