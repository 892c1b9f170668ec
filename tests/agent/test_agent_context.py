"""What a small model is shown and told, end to end (`coder run` against the fake Ollama
server): the project's AGENTS.md in the cache-stable prefix of every step, the ranked map, the
step's focus after the prefix, an edit that breaks the syntax refused on the spot, a lint
finding in the tool result."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tests.conftest import coder, git, sample_files
from tests.fake_ollama import FakeOllama
from tests.helpers import call, chat_requests, done, taskfile

TWO_STEPS = """
    id: ctx
    title: Add multiply to calc
    graph:
      - {id: s1, kind: analyze, goal: Find where subtract is defined}
      - id: s2
        kind: edit
        goal: Add multiply next to subtract
        changes: [{path: calc.py, mode: patch}]
"""

LINTER = textwrap.dedent(
    """\
    import sys
    for number, line in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
        if "print(" in line:
            print(f"{sys.argv[1]}:{number}:1: P001 no print in library code")
    """
)


def make_sample(make_repo, **extra: str) -> Path:
    files = sample_files()
    files.update(extra)
    return make_repo(files)


def test_agents_md_reaches_every_step_in_a_byte_identical_prefix(
    fake: FakeOllama, make_repo
) -> None:
    repo = make_sample(make_repo, **{"AGENTS.md": "Always use type hints on public functions.\n"})
    fake.enqueue(
        call("code_search", query="subtract two numbers"),
        done("subtract is in calc.py"),
        call(
            "fs_edit",
            path="calc.py",
            search="    return a - b\n",
            replace="    return a - b\n\n\ndef multiply(a: float, b: float) -> float:\n    return a * b\n",
        ),
        done("added multiply", "calc.py"),
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TWO_STEPS)))
    assert code == 0, out + err
    requests = chat_requests(fake)
    firsts = [r for r in requests if len(r["messages"]) == 2]  # each step's first request
    assert len(firsts) == 2
    system = requests[0]["messages"][0]
    assert all(r["messages"][0] == system for r in requests)  # byte-identical prefix
    prefix = system["content"]
    assert (
        'applies-to="the whole repository">\nAlways use type hints on public functions.' in prefix
    )
    # the ranked map: definitions with their lines, not only a file list
    assert "calc.py\n4| def add(a: float, b: float) -> float:" in prefix
    # the per-step focus goes after the prefix, in the step's own first message
    edit_first = firsts[1]["messages"][1]["content"]
    assert "Files expected to change: calc.py (patch)" in edit_first
    # one line per file, its hits in line order (each file named once)
    assert "Likely relevant code for this step:\n- calc.py: " in edit_first
    focus = [line for line in edit_first.splitlines() if line.startswith("- ")]
    assert [line.split(":")[0] for line in focus] == ["- calc.py", "- tests/test_calc.py"]
    assert "8-9 (subtract)" in focus[0]
    # code_search answered the analyze step with the function
    search_result = requests[1]["messages"][-1]
    assert search_result["role"] == "tool" and search_result["content"].startswith(
        "calc.py:8-9 (subtract)"
    )


def test_each_kind_is_described_once_in_the_prefix_not_in_every_step(
    fake: FakeOllama, make_repo
) -> None:
    """A kind's rules and tools are in the cached prefix; a step's first message (new tokens
    for the server on every step) names its tools only where its `tools:` narrows them."""
    repo = make_sample(make_repo)
    fake.enqueue(done("add and subtract"), done("calc.py has two functions"))
    task = """
        id: kinds
        title: Look at calc
        graph:
          - {id: s1, kind: analyze, goal: List the functions in calc.py}
          - {id: s2, kind: analyze, goal: Count them, tools: [fs_read]}
          - {id: s3, kind: shell, cmd: "true"}
    """
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, task)))
    assert code == 0, out + err
    requests = chat_requests(fake)
    prefix = requests[0]["messages"][0]["content"]
    kinds = prefix[prefix.index("<kinds>") : prefix.index("</kinds>")]
    rule = "Read-only: study the code and finish with step_complete"
    assert kinds.count("\n- ") == 1  # analyze only: shell steps talk to no model
    assert f"- analyze: {rule}" in kinds
    assert "Tools: fs_read, fs_glob, fs_grep, code_search, git_status," in kinds
    firsts = [r["messages"][1]["content"] for r in requests if len(r["messages"]) == 2]
    assert firsts[0].startswith("Step s1 (analyze): List the functions in calc.py")
    assert "Tools for this step" not in firsts[0] and rule not in firsts[0]
    assert firsts[1].endswith("Tools for this step: fs_read, step_complete.")
    assert rule not in firsts[1]


def test_a_syntax_breaking_edit_is_refused_and_the_model_fixes_it(
    fake: FakeOllama, make_repo
) -> None:
    repo = make_sample(make_repo)
    fake.enqueue(
        call("fs_edit", path="calc.py", search="    return a - b\n", replace="    return (a - b\n"),
        call("fs_edit", path="calc.py", search="    return a - b\n", replace="    return b - a\n"),
        done("swapped", "calc.py"),
    )
    path = taskfile(repo, "id: veto\ntitle: t\ngraph:\n  - {kind: edit, goal: swap subtract}\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    refusal = chat_requests(fake)[1]["messages"][-1]["content"]
    assert refusal.startswith(
        "error: edit refused: it would leave a syntax error in calc.py at line 9"
    )
    assert "^ '(' was never closed" in refusal
    # the refused edit never reached the file: the second edit's search text still matched
    assert "return b - a" in git(repo, "show", "agent/veto-t:calc.py")


def test_a_lint_finding_comes_back_in_the_tool_result(fake: FakeOllama, make_repo) -> None:
    repo = make_sample(
        make_repo,
        **{
            "lint.py": LINTER,
            "coder.config.json": json.dumps(
                {"lint_command": f"{Path(sys.executable).name} lint.py {{file}}"}
            ),
        },
    )
    fake.enqueue(
        call(
            "fs_edit",
            path="calc.py",
            search="    return a - b\n",
            replace="    print(a)\n    return a - b\n",
        ),
        done("added a print", "calc.py"),
    )
    path = taskfile(repo, "id: lint\ntitle: t\ngraph:\n  - {kind: edit, goal: trace subtract}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    result = chat_requests(fake)[1]["messages"][-1]["content"]
    assert "\nlint: 1 new finding (fix them now, or say why not in step_complete):\n" in result
    assert "  calc.py:9:1: P001 no print in library code\n      9|     print(a)" in result


def test_policies_turn_the_checks_off(fake: FakeOllama, make_repo) -> None:
    repo = make_sample(make_repo)
    fake.enqueue(
        call("fs_edit", path="calc.py", search="    return a - b\n", replace="    return (a - b\n"),
        done("broke it on purpose", "calc.py"),
    )
    path = taskfile(
        repo,
        "id: off\ntitle: t\npolicies: {veto_syntax_errors: false, lint_after_edit: false}\n"
        "graph:\n  - {kind: edit, goal: g}\n",
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    assert "return (a - b" in git(repo, "show", "agent/off-t:calc.py")


def test_the_prefix_is_redacted_with_the_committed_env_values(fake: FakeOllama, make_repo) -> None:
    secret = "hunter2-" + "correct-horse-battery"
    repo = make_sample(
        make_repo,
        **{
            ".env": f"DB_PASSWORD={secret}\n",
            "settings.py": f'DEFAULT_PASSWORD = "{secret}"\n\n\ndef connect():\n    return DEFAULT_PASSWORD\n',
            "AGENTS.md": f"The test database password is {secret}.\n",
        },
    )
    fake.enqueue(done("looked", no_change_reason="nothing to do"))
    path = taskfile(
        repo, "id: red\ntitle: t\ngraph:\n  - {kind: analyze, goal: look at settings.py}\n"
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    prefix = chat_requests(fake)[0]["messages"][0]["content"]
    assert "settings.py" in prefix and "DEFAULT_PASSWORD" in prefix
    assert secret not in prefix and "The test database password is [REDACTED" in prefix
