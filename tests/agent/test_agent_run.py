"""Model steps end to end: `coder run` with the real ollama client against the fake Ollama
server, scripted turn by turn; every request is recorded and checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import coder, git, sample_files
from tests.fake_ollama import FakeOllama, Reply, down_url
from tests.helpers import call, chat_requests, done, state_of, step_commits, taskfile

FEATURE = """
    id: mul
    title: Add multiply to calc
    graph:
      - {id: s1, kind: analyze, goal: Find where the operations live, depends_on: []}
      - {id: s2, kind: edit, goal: "Add multiply(a, b) to calc.py", depends_on: [s1]}
      - {id: s3, kind: test, depends_on: [s2]}
      - {id: s4, kind: doc, goal: Document multiply in README.md, depends_on: [s3]}
"""

MULTIPLY = "\n\ndef multiply(a: float, b: float) -> float:\n    return a * b\n"


def feature_script() -> list[Reply]:
    return [
        call("fs_read", path="calc.py"),
        done("add and subtract live in calc.py; tests in tests/test_calc.py"),
        call(
            "fs_edit",
            path="calc.py",
            search="    return a - b\n",
            replace="    return a - b\n" + MULTIPLY,
        ),
        done("added multiply", "calc.py"),
        call(
            "fs_edit",
            path="README.md",
            search="add(2, 3)  # 5\n",
            replace="add(2, 3)  # 5\nmultiply(2, 3)  # 6\n",
        ),
        done("documented multiply", "README.md"),
    ]


def test_analyze_edit_test_doc_runs_to_green(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*feature_script())
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, FEATURE)))
    assert code == 0, out + err
    assert [c[0] for c in step_commits(sample, "agent/mul-add-multiply-to-calc")] == ["s2", "s4"]
    branch = "agent/mul-add-multiply-to-calc"
    assert "def multiply" in git(sample, "show", f"{branch}:calc.py")
    assert "multiply(2, 3)  # 6" in git(sample, "show", f"{branch}:README.md")
    state = state_of(sample, "mul")
    assert state["steps"]["s3"]["tests"]["passed"] == 2
    assert state["steps"]["s2"]["usage"]["calls"] == 2
    assert state["steps"]["s2"]["usage"]["prompt_tokens"] > 0
    # the analyze step's findings reached the edit step, after the prefix
    requests = chat_requests(fake)
    edit_first = requests[2]["messages"]
    assert '<notes from="s1">\nadd and subtract live in calc.py' in edit_first[1]["content"]
    assert fake.pending == 0


def test_every_request_carries_num_ctx_and_the_same_prefix(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*feature_script())
    assert coder(sample, "run", "--autonomous", "-f", str(taskfile(sample, FEATURE)))[0] == 0
    requests = chat_requests(fake)
    assert len(requests) == 6
    system = requests[0]["messages"][0]
    for body in requests:
        assert body["options"]["num_ctx"] == 32768 and body["keep_alive"] == "30m"
        assert body["messages"][0] == system  # the run-wide prefix, byte for byte
        assert body["tools"] == requests[0]["tools"]
    for prev, cur in zip(requests, requests[1:]):
        same_step = prev["messages"][1] == cur["messages"][1]
        if same_step:  # within a step each request starts with the previous one
            assert cur["messages"][: len(prev["messages"])] == prev["messages"]
    assert "calc.py" in system["content"] and "<repository files=" in system["content"]


def test_an_unsupported_claim_is_rejected_then_corrected(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        done("added it", "calc.py"),  # nothing changed yet: rejected
        call("fs_write", path="mul.py", content="def mul(a, b):\n    return a * b\n"),
        done("added mul.py", "mul.py"),
    )
    path = taskfile(sample, "id: claim\ntitle: t\ngraph:\n  - {kind: edit, goal: add mul.py}\n")
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    second = chat_requests(fake)[1]["messages"][-1]
    assert second["role"] == "tool" and second["content"].startswith(
        "rejected: files_changed lists calc.py, which did not change"
    )
    assert git(sample, "show", "agent/claim-t:mul.py").startswith("def mul")


def test_an_edit_step_that_changes_nothing_needs_a_reason(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(done("nothing to do"), done("nothing to do", no_change_reason="already there"))
    path = taskfile(sample, "id: nochange\ntitle: t\ngraph:\n  - {kind: edit, goal: g}\n")
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 0
    assert chat_requests(fake)[1]["messages"][-1]["content"].startswith(
        "rejected: no file was changed"
    )
    assert state_of(sample, "nochange")["steps"]["s1"]["commit"] is None


def test_tool_calls_written_as_json_text_are_recovered(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        Reply(
            content='I will write the file.\n```json\n{"name": "fs_write", "arguments": '
            '{"path": "x.txt", "content": "x\\n"}}\n```'
        ),
        Reply(
            content='<tool_call>{"name": "step_complete", "arguments": {"summary": "wrote x", '
            '"files_changed": ["x.txt"]}}</tool_call>'
        ),
    )
    path = taskfile(sample, "id: text\ntitle: t\ngraph:\n  - {kind: edit, goal: write x.txt}\n")
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert git(sample, "show", "agent/text-t:x.txt") == "x\n"


def test_plain_text_gets_a_nudge(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        Reply(content="Sure, I can help with that."),
        done("looked", no_change_reason="nothing needed"),
    )
    path = taskfile(sample, "id: nudge\ntitle: t\ngraph:\n  - {kind: analyze, goal: look}\n")
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 0
    nudge = chat_requests(fake)[1]["messages"][-1]
    assert nudge["role"] == "user" and "Continue by calling a tool" in nudge["content"]


def test_a_repeated_call_loop_is_stopped(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(*[call("fs_read", path="calc.py") for _ in range(3)])
    path = taskfile(sample, "id: loop\ntitle: t\ngraph:\n  - {kind: analyze, goal: look}\n")
    code, _, _ = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 1
    step = state_of(sample, "loop")["steps"]["s1"]
    assert step["error"] == "the model repeated the same fs_read call 3 times; stopping the step"
    assert (
        "called fs_read with the same arguments 2 times"
        in chat_requests(fake)[2]["messages"][-1]["content"]
    )


def test_path_traversal_and_symlink_escape_are_refused(
    fake: FakeOllama, sample: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret plans\n")
    os.symlink(outside, sample / "link.txt")
    git(sample, "add", "link.txt")
    git(sample, "commit", "-qm", "a link")
    fake.enqueue(
        call("fs_read", path="../../outside.txt"),
        call("fs_read", path="link.txt"),
        call("fs_write", path="../escape.txt", content="x"),
        done("could not", no_change_reason="refused"),
    )
    path = taskfile(sample, "id: esc\ntitle: t\ngraph:\n  - {kind: custom, goal: escape}\n")
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 0
    results = [m["content"] for m in chat_requests(fake)[-1]["messages"] if m["role"] == "tool"]
    assert all(r.startswith("error: ") for r in results[:3]), results
    assert "escapes" in results[0] and "escapes" in results[1]
    assert not (tmp_path / "escape.txt").exists()
    assert all("secret plans" not in json.dumps(b) for b in fake.chat_bodies())


def test_a_secret_in_a_file_never_reaches_the_model_or_the_logs(
    fake: FakeOllama, make_repo
) -> None:
    key = "AKIA" + "QWERTYUIOPASDFGH"
    token = "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345"
    repo = make_repo(
        {"config.py": f'AWS_KEY = "{key}"\n', ".env": f"API_TOKEN={token}x\n", "README.md": "# r\n"}
    )
    fake.enqueue(
        call("fs_read", path="config.py"),
        call("fs_read", path=".env"),
        call("fs_grep", pattern="AKIA"),
        done("read the config"),
    )
    path = taskfile(repo, "id: sec\ntitle: t\ngraph:\n  - {kind: analyze, goal: read config}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    raw = b"".join(r.raw for r in fake.requests)
    assert key.encode() not in raw and token.encode() not in raw
    for file in (repo / ".coder").rglob("*"):
        if file.is_file() and "tasks" not in file.parts and "worktrees" not in file.parts:
            text = file.read_text(errors="replace")
            assert key not in text and token not in text, file


def test_server_down_is_an_environment_error_naming_the_host(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = down_url()
    monkeypatch.setenv("OLLAMA_HOST", url)
    path = taskfile(sample, "title: t\ngraph:\n  - {kind: edit, goal: g}\n")
    code, _, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 3 and url in err
    assert not list((sample / ".coder" / "tasks").glob("*"))  # nothing was started


def test_a_missing_model_names_the_pull_command(fake: FakeOllama, sample: Path) -> None:
    path = taskfile(sample, "title: t\nmodel: llama9:70b\ngraph:\n  - {kind: edit, goal: g}\n")
    code, _, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 3 and "ollama pull llama9:70b" in err


def test_a_500_mid_stream_is_retried(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        Reply(content="partial", error_mid_stream="boom"),
        call("fs_write", path="y.txt", content="y\n"),
        done("wrote y", "y.txt"),
    )
    path = taskfile(sample, "id: retry\ntitle: t\ngraph:\n  - {kind: edit, goal: write y}\n")
    code, out, err = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert git(sample, "show", "agent/retry-t:y.txt") == "y\n"


def test_record_then_replay_reproduces_the_commits(
    fake: FakeOllama, sample: Path, make_repo, tmp_path: Path
) -> None:
    fake.enqueue(*feature_script())
    recording = tmp_path / "run.json"
    task = taskfile(sample, FEATURE)
    assert coder(sample, "run", "--autonomous", "-f", str(task), "--record", str(recording))[0] == 0
    copy = make_repo(sample_files(), name="copy")
    before = len(fake.requests)
    code, out, err = coder(copy, "run", "--autonomous", "-f", str(task), "--replay", str(recording))
    assert code == 0, out + err
    assert len(fake.requests) == before  # no model was asked
    branch = "agent/mul-add-multiply-to-calc"
    assert step_commits(copy, branch) == step_commits(sample, branch)
    assert git(copy, "rev-parse", f"{branch}^{{tree}}") == git(
        sample, "rev-parse", f"{branch}^{{tree}}"
    )
