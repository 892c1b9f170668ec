"""`coder plan` end to end: the real ollama client against the fake Ollama server, on a git
repository made from fixtures/pyproject-sample. Every request is recorded and checked: the
structured-output schema, num_ctx, and the precise problems sent back for a repair."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from coder import schemas
from tests.conftest import coder, git, sample_files
from tests.fake_ollama import FakeOllama, Reply, down_url
from tests.helpers import state_of, step_commits

PROMPT = "Add multiply(a, b) to calc.py, with a test and a line in the README."


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOllama]:
    with FakeOllama() as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        yield server


@pytest.fixture
def sample(make_repo) -> Path:
    return make_repo(sample_files())


def plan_doc(**changes: Any) -> dict[str, Any]:
    """A good plan, keys deliberately out of order (the written file puts them in order)."""
    doc: dict[str, Any] = {
        "graph": [
            {
                "goal": "Find where the operations and their tests live",
                "kind": "analyze",
                "id": "s1",
                "depends_on": [],
            },
            {
                "changes": [
                    {"path": "calc.py", "mode": "patch"},
                    {"path": "tests/test_calc.py", "mode": "patch"},
                ],
                "depends_on": ["s1"],
                "kind": "edit",
                "id": "s2",
                "goal": "Add multiply(a, b) to calc.py.\nAdd test_multiply to tests/test_calc.py.",
            },
            {
                "on_fail": {"strategy": "fix_and_retry", "max_cycles": 3},
                "kind": "test",
                "id": "s3",
                "depends_on": ["s2"],
            },
            {
                "id": "s4",
                "kind": "doc",
                "goal": "Document multiply in README.md",
                "depends_on": ["s3"],
                "changes": [{"path": "README.md", "mode": "patch"}],
            },
        ],
        "title": "Add multiply to calc",
        "success": {"require_green_tests": True},
        "id": "add-multiply",
        "model": "someone-elses-model",  # dropped: the config decides
    }
    doc.update(changes)
    return doc


def answer(doc: dict[str, Any]) -> Reply:
    return Reply(content=json.dumps(doc))


def chats(fake: FakeOllama) -> list[dict[str, Any]]:
    return [b for b in fake.chat_bodies() if b.get("messages")]


def repair_text(fake: FakeOllama, index: int = 1) -> str:
    messages = chats(fake)[index]["messages"]
    assert messages[-1]["role"] == "user" and messages[-2]["role"] == "assistant"
    return str(messages[-1]["content"])


def error_lines(text: str) -> list[str]:
    return [
        line for line in text.splitlines() if re.match(r"^tasks/\S+\.draft\.yaml:\d+:\d+: ", line)
    ]


def test_a_valid_plan_on_the_first_try(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(answer(plan_doc()))
    code, out, err = coder(sample, "plan", PROMPT)
    assert code == 0, out + err
    path = sample / "tasks" / "add-multiply.yaml"
    assert "Planned tasks/add-multiply.yaml: Add multiply to calc (4 steps, 1 attempt" in out
    assert "Next: coder run --autonomous -f tasks/add-multiply.yaml" in out
    assert coder(sample, "validate", "-f", str(path))[0] == 0
    text = path.read_text()
    data = yaml.safe_load(text)
    assert list(data) == ["id", "title", "spec", "success", "graph"]
    assert data["spec"] == PROMPT and "model" not in data and "branch" not in data
    assert [list(s) for s in data["graph"]] == [
        ["id", "kind", "goal", "depends_on"],
        ["id", "kind", "goal", "depends_on", "changes"],
        ["id", "kind", "depends_on", "on_fail"],
        ["id", "kind", "goal", "depends_on", "changes"],
    ]
    assert "goal: |-\n      Add multiply" in text and "depends_on: [s1]" in text  # readable
    assert "- {path: calc.py, mode: patch}" in text
    assert text.startswith("# Planned by `coder plan` from a prompt with qwen2.5-coder:7b.")
    [body] = chats(fake)
    assert body["format"] == schemas.bundled("task")
    assert body["options"]["num_ctx"] == 32768
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert "calc.py\npyproject.toml\ntests/test_calc.py" in system
    assert "test command: python -m pytest -q" in system and "A tiny calculator." in system
    assert "languages: Python (2 files)" in system and "initial" in system  # commit subjects
    assert f"<spec>\n{PROMPT}\n</spec>" in user
    assert not (sample / ".coder").exists()  # planning prepares nothing for a run


def test_a_schema_error_is_repaired_with_the_precise_errors(fake: FakeOllama, sample: Path) -> None:
    broken = plan_doc(description="not a taskfile field")
    broken["graph"][1] = {"id": "s2", "kind": "shell", "depends_on": ["s1"]}  # no cmd
    fake.enqueue(answer(broken), answer(plan_doc()))
    code, out, err = coder(sample, "plan", PROMPT)
    assert code == 0, out + err
    assert "attempt 1/3: 2 problems; asking the model to fix them" in err
    first, second = chats(fake)
    assert second["messages"][:2] == first["messages"]  # the cache-stable prefix
    assert second["messages"][2]["content"] == json.dumps(broken)
    text = repair_text(fake)
    lines = error_lines(text)
    assert len(lines) == 2, text
    assert re.fullmatch(
        r"tasks/add-multiply\.draft\.yaml:\d+:\d+: graph\[1\] \(step s2\): "
        r"missing required field 'cmd' for a shell step",
        lines[0],
    ), lines
    assert re.fullmatch(
        r"tasks/add-multiply\.draft\.yaml:\d+:1: unknown field 'description'", lines[1]
    ), lines
    # the line numbers point into the draft shown with them
    shown = text.split("```yaml\n", 1)[1].split("```", 1)[0].splitlines()
    assert shown[int(lines[0].split(":")[1]) - 1] == "  - id: s2"
    assert shown[int(lines[1].split(":")[1]) - 1].startswith("description:")
    assert PROMPT not in text and "spec: (the spec above; coder fills it in)" in text
    assert (sample / "tasks" / "add-multiply.yaml").is_file()
    assert not (sample / "tasks" / "add-multiply.draft.yaml").exists()


def test_a_cyclic_plan_is_rejected_and_repaired(fake: FakeOllama, sample: Path) -> None:
    cyclic = plan_doc()
    cyclic["graph"][0]["depends_on"] = ["s3"]
    fake.enqueue(answer(cyclic), answer(plan_doc()))
    code, out, err = coder(sample, "plan", PROMPT)
    assert code == 0, out + err
    [line] = error_lines(repair_text(fake))
    assert line.endswith("dependency cycle: s1 -> s2 -> s3 -> s1")


def test_a_non_json_answer_then_a_valid_one(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        Reply(content="Sure! First we look at calc.py, then add multiply."), answer(plan_doc())
    )
    code, out, err = coder(sample, "plan", PROMPT, "--json")
    assert code == 0, out + err
    result = json.loads(out)
    assert result["attempts"] == 2 and result["path"] == "tasks/add-multiply.yaml"
    assert result["usage"]["calls"] == 2
    [line] = error_lines(repair_text(fake))
    assert line.endswith(":1:1: the answer is not valid JSON: Expecting value")


def test_json_inside_prose_is_accepted(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(Reply(content="Here is the plan:\n```json\n" + json.dumps(plan_doc()) + "\n```"))
    code, out, err = coder(sample, "plan", PROMPT)
    assert code == 0, out + err
    assert len(chats(fake)) == 1


@pytest.mark.parametrize("as_json", [False, True])
def test_repeated_failure_reports_the_errors_and_keeps_the_draft(
    fake: FakeOllama, sample: Path, as_json: bool
) -> None:
    (sample / "coder.config.json").write_text('{"plan_attempts": 2}')
    cyclic = plan_doc()
    cyclic["graph"][0]["depends_on"] = ["s2"]
    fake.enqueue(Reply(content="no"), answer(cyclic))
    code, out, err = coder(sample, "plan", PROMPT, *(["--json"] if as_json else []))
    assert code == 1
    draft = sample / "tasks" / "add-multiply.draft.yaml"
    assert not (sample / "tasks" / "add-multiply.yaml").exists()
    assert yaml.safe_load(draft.read_text())["graph"][0]["depends_on"] == ["s2"]
    if as_json:
        result = json.loads(out)
        assert result["exit_code"] == 1 and result["draft"] == "tasks/add-multiply.draft.yaml"
        assert [p["message"] for p in result["problems"]] == ["dependency cycle: s1 -> s2 -> s1"]
    else:
        assert error_lines(err)[0].endswith("dependency cycle: s1 -> s2 -> s1")
        assert (
            "coder: error: the model did not produce a valid taskfile in 2 attempts "
            "(1 problem left); the last draft is in tasks/add-multiply.draft.yaml"
        ) in err
        assert "coder validate -f tasks/add-multiply.draft.yaml" in err
    # the draft fails validation with the same problem
    code, vout, _ = coder(sample, "validate", "-f", str(draft))
    assert code == 2 and "dependency cycle: s1 -> s2 -> s1" in vout
    assert fake.pending == 0


def test_disallowed_commands_and_paths_outside_the_repo_are_re_asked(
    fake: FakeOllama, sample: Path
) -> None:
    bad = plan_doc()
    bad["graph"][0] = {
        "id": "s1",
        "kind": "shell",
        "depends_on": [],
        "cmd": "curl -s https://example.com/calc.py > calc.py",
    }
    bad["graph"][1]["changes"] = [
        {"path": "../outside.py", "mode": "create"},
        {"path": "src/missing.py", "mode": "patch"},
        {"path": "calc.py", "mode": "create"},
    ]
    bad["graph"][3]["assert"] = [{"type": "file_exists", "path": "/etc/passwd"}]
    fake.enqueue(answer(bad), answer(plan_doc()))
    code, out, err = coder(sample, "plan", PROMPT)
    assert code == 0, out + err
    lines = error_lines(repair_text(fake))
    messages = [line.split(": ", 1)[1] for line in lines]
    assert messages == [
        "graph[0].cmd (step s1): command refused: `curl` is a network program and the network "
        "is off (set allow_network: true and add it to allowed_commands in coder.config.json to "
        "allow it); plan only with the allowed programs, offline",
        "graph[1].changes[0].path: '../outside.py' must be a path inside the repository "
        "(relative, without ..)",
        "graph[1].changes[1].path (step s2): 'src/missing.py' does not exist in the repository, "
        "so it cannot be patched (use mode create for a new file, or a path from <files>)",
        "graph[1].changes[2].path (step s2): 'calc.py' already exists (use mode patch to "
        "change it)",
        "graph[3].assert[0].path: '/etc/passwd' must be a path inside the repository "
        "(relative, without ..)",
    ], messages


def test_a_symlink_out_of_the_repo_is_refused(
    fake: FakeOllama, sample: Path, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    (sample / "ext").symlink_to(tmp_path / "elsewhere")
    git(sample, "add", "ext")
    git(sample, "commit", "-qm", "a link")
    bad = plan_doc()
    bad["graph"][1]["changes"] = [{"path": "ext/new.py", "mode": "create"}]
    fake.enqueue(answer(bad), answer(plan_doc()))
    assert coder(sample, "plan", PROMPT)[0] == 0
    [line] = error_lines(repair_text(fake))
    assert "path escapes the worktree through a symlink: ext/new.py" in line


def test_dry_run_writes_nothing(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(answer(plan_doc()))
    code, out, err = coder(sample, "plan", "--dry-run", PROMPT)
    assert code == 0, out + err
    assert yaml.safe_load(out)["id"] == "add-multiply"
    assert "Planned (dry run: not written)" in err
    assert not (sample / "tasks").exists()
    assert git(sample, "status", "--porcelain") == ""


def test_a_spec_file_and_an_id_already_in_use(fake: FakeOllama, sample: Path) -> None:
    (sample / "tasks").mkdir()
    (sample / "tasks" / "add-multiply.yaml").write_text("title: older\ngraph: [{kind: test}]\n")
    (sample / "spec.md").write_text("# Multiply\n\nAdd multiply(a, b).   \n\n- with tests\n")
    fake.enqueue(answer(plan_doc()))
    code, out, err = coder(sample, "plan", "spec.md")  # an existing path is read as the spec
    assert code == 0, out + err
    new = sample / "tasks" / f"add-multiply-to-calc-{time.strftime('%Y%m%d')}.yaml"
    data = yaml.safe_load(new.read_text())
    assert data["id"] == new.stem
    assert data["spec"] == "# Multiply\n\nAdd multiply(a, b).\n\n- with tests"
    assert "spec: |-\n  # Multiply\n" in new.read_text()
    assert "from spec.md with" in new.read_text()
    assert (sample / "tasks" / "add-multiply.yaml").read_text().startswith("title: older")
    assert "<spec>\n# Multiply\n" in chats(fake)[0]["messages"][1]["content"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["   \n"], "the spec is empty (prompt)"),
        (["-f", "missing.md"], "cannot read the spec: missing.md:1:1: no such file"),
        (["missing.md"], "spec file missing.md does not exist"),
        ([], "no spec given"),
        (["-f", "spec.md", "also a prompt"], "either as an argument or with -f FILE"),
    ],
)
def test_bad_input_is_exit_2_without_a_model_call(
    fake: FakeOllama, sample: Path, args: list[str], message: str
) -> None:
    (sample / "spec.md").write_text("x\n")
    code, out, err = coder(sample, "plan", *args)
    assert code == 2, out + err
    assert err.startswith("coder: error: ") and message in err, err
    assert fake.requests == []


def test_an_empty_spec_file_is_exit_2(fake: FakeOllama, sample: Path) -> None:
    (sample / "empty.md").write_text("\n  \n")
    code, _, err = coder(sample, "plan", "-f", "empty.md")
    assert code == 2 and "the spec is empty (empty.md)" in err


def test_a_spec_too_large_for_the_context_is_refused(fake: FakeOllama, sample: Path) -> None:
    fake.models["tiny:1b"] = {"context_length": 4096, "capabilities": ["completion"]}
    (sample / "big.md").write_text("Make it faster. " * 2500)
    code, out, err = coder(sample, "plan", "-f", "big.md", "--model", "tiny:1b")
    assert code == 2, out + err
    assert re.search(
        r"coder: error: spec is \d+ tokens \(est\.\), the model's context is 4096; "
        r"shorten it",
        err,
    ), err
    assert chats(fake) == []


def test_ollama_down_or_model_missing_is_exit_3(
    sample: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeOllama
) -> None:
    code, _, err = coder(sample, "plan", "--model", "nosuch:1b", PROMPT)
    assert code == 3 and "ollama pull nosuch:1b" in err
    monkeypatch.setenv("OLLAMA_HOST", down_url())
    code, _, err = coder(sample, "plan", PROMPT)
    assert code == 3 and "cannot reach Ollama at http://127.0.0.1:" in err
    assert not (sample / "tasks").exists()


def test_plan_run_executes_the_plan_to_success(fake: FakeOllama, sample: Path) -> None:
    doc = {
        "id": "greet",
        "title": "Add a greeting module",
        "graph": [
            {
                "id": "s1",
                "kind": "shell",
                "goal": "Write greeting.py",
                "cmd": "printf 'def greet(name):\\n    return \"hi \" + name\\n' > greeting.py",
                "assert": [{"type": "file_exists", "path": "greeting.py"}],
            },
            {"id": "s2", "kind": "test"},
        ],
    }
    fake.enqueue(answer(doc))
    code, out, err = coder(sample, "plan", "--run", "add a greeting module")
    assert code == 0, out + err
    assert "Planned tasks/greet.yaml" in out and "Run greet: success" in out
    branch = "agent/greet-add-a-greeting-module"
    assert [c[0] for c in step_commits(sample, branch)] == ["s1"]
    assert "def greet" in git(sample, "show", f"{branch}:greeting.py")
    assert state_of(sample, "greet")["steps"]["s2"]["tests"]["passed"] == 2
    assert len(chats(fake)) == 1  # shell and test steps need no model turn


def test_run_and_dry_run_cannot_be_combined(sample: Path) -> None:
    code, _, err = coder(sample, "plan", "--run", "--dry-run", PROMPT)
    assert code == 2 and "--run and --dry-run cannot be combined" in err


def test_an_existing_out_file_is_kept_unless_forced(fake: FakeOllama, sample: Path) -> None:
    (sample / "mine.yaml").write_text("keep me\n")
    code, _, err = coder(sample, "plan", "--out", "mine.yaml", PROMPT)
    assert code == 2 and "mine.yaml already exists" in err and fake.requests == []
    fake.enqueue(answer(plan_doc()))
    code, out, err = coder(sample, "plan", "--out", "mine.yaml", "--force", PROMPT)
    assert code == 0, out + err
    assert yaml.safe_load((sample / "mine.yaml").read_text())["id"] == "add-multiply"


def test_the_context_leaves_out_vendored_and_binary_files(make_repo) -> None:
    from coder import config
    from coder.git import repository
    from coder.plan import overview as plan

    repo = make_repo(
        {
            "README.md": "# r\n",
            "src/app.py": "x = 1\n",
            "logo.png": "png",
            "node_modules/left-pad/index.js": "x",
            "pkg.egg-info/PKG-INFO": "x",
        }
    )
    opened = repository.open_repo(repo)
    ctx = plan.gather_context(opened, repository.repo_root(opened), config.load(repo))
    assert ctx.listed == ("README.md", "src/app.py")
    assert "logo.png" in ctx.files  # still known, for the `changes` checks
    assert ctx.languages == (("Python", 1),) and ctx.test_command is None
    many = tuple(f"pkg/mod{i:03}.py" for i in range(400)) + ("setup.py",)
    listing = plan.format_tree(many, limit=50).splitlines()
    assert listing[-1] == "pkg/ ... 351 more files" and "setup.py" in listing


def test_a_test_step_without_a_test_command_is_re_asked(fake: FakeOllama, make_repo) -> None:
    repo = make_repo({"README.md": "# notes\n", "notes.txt": "x\n"})
    doc = {
        "id": "more-notes",
        "title": "More notes",
        "graph": [
            {
                "id": "s1",
                "kind": "edit",
                "goal": "Add a line to notes.txt",
                "changes": [{"path": "notes.txt"}],
            },
            {"id": "s2", "kind": "test"},
        ],
    }
    fake.enqueue(answer(doc), answer({**doc, "graph": doc["graph"][:1]}))
    code, out, err = coder(repo, "plan", "add a line to the notes")
    assert code == 0, out + err
    [line] = error_lines(repair_text(fake))
    assert line.endswith(
        "graph[1] (step s2): no test command is known for this project (none "
        "configured or detected): give the step a `cmd`, or leave the test "
        "step out"
    )
    assert (
        "No test command was detected in this project" in chats(fake)[0]["messages"][0]["content"]
    )


def test_the_planner_reads_the_project_instructions(fake: FakeOllama, make_repo) -> None:
    files = sample_files()
    files["AGENTS.md"] = "Every change ships with a test in tests/.\n"
    files["docs/AGENTS.md"] = "Docs are written in British English.\n"
    files["AGENTS.local.md"] = "not an instruction file\n"
    repo = make_repo(files)
    (repo / "AGENTS.md").write_text("an uncommitted edit is not read\n")
    fake.enqueue(answer(plan_doc()))
    code, out, err = coder(repo, "plan", PROMPT)
    assert code == 0, out + err
    system = chats(fake)[0]["messages"][0]["content"]
    assert (
        '<instructions path="AGENTS.md" applies-to="the whole repository">\n'
        "Every change ships with a test in tests/.\n</instructions>"
    ) in system
    assert 'applies-to="files under docs/">\nDocs are written in British English.' in system
    assert "not an instruction file" not in system and "uncommitted" not in system
