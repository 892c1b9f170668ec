"""The tool registry: schemas, validation, errors as data, tool sets, secrets, shell and git
tools. File tools are in test_tools_fs.py. Real repositories and commands, no mocks."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from ollama._types import Tool as OllamaTool

from coder.config import as_config
from coder.errors import InvalidInput, PolicyViolation
from coder.policy.commands import Policy
from coder.redact import Redactor
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.registry import Registry, default_registry, doc_write_filter, tools_for_kind
from tests.conftest import git

PYTHON = shlex.quote(sys.executable)


@pytest.fixture
def ctx(make_repo) -> ToolContext:
    root = make_repo({"README.md": "# sample\n", "src/app.py": "def main():\n    return 1\n"})
    return ToolContext(root=root, policy=Policy(), redactor=Redactor())


def call(ctx: ToolContext, name: str, **args: Any) -> ToolResult:
    return default_registry().call(name, args, ctx)


# --------------------------------------------------------------------------- registry


def test_every_tool_name_is_valid_for_mcp_and_ollama() -> None:
    names = default_registry().names()
    assert len(names) == 13
    for name in names:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert len(name) <= 64


def test_definitions_have_the_ollama_function_shape_and_survive_its_client() -> None:
    defs = default_registry().definitions()
    assert [d["function"]["name"] for d in defs] == default_registry().names()
    for defn in defs:
        assert set(defn) == {"type", "function"} and defn["type"] == "function"
        fn = defn["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert fn["description"] and len(fn["description"]) < 300
        schema = fn["parameters"]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        # What the ollama client would send: every property intact (that proves flatness).
        sent = OllamaTool.model_validate(defn).model_dump(exclude_none=True)
        assert sent["function"]["parameters"].get("properties", {}) == schema["properties"], fn[
            "name"
        ]
        assert list(sent["function"]["parameters"].get("required", [])) == schema["required"]
        for spec in schema["properties"].values():
            assert set(spec) <= {"type", "description", "enum", "items"}


def test_definitions_are_restricted_and_in_registry_order() -> None:
    reg = default_registry()
    names = [d["function"]["name"] for d in reg.definitions(["step_complete", "fs_read"])]
    assert names == ["fs_read", "step_complete"]
    with pytest.raises(InvalidInput, match="nope"):
        reg.definitions(["nope"])
    defs = reg.definitions(["fs_read"])
    defs[0]["function"]["parameters"]["properties"].clear()  # a copy: the registry is intact
    assert reg.definitions(["fs_read"])[0]["function"]["parameters"]["properties"]


def test_register_refuses_bad_names_duplicates_and_nested_schemas() -> None:
    reg = Registry()

    def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
        return ToolResult(True, "ok")

    def tool(name: str, **props: Any) -> Tool:
        return Tool(name, "d", params(props), handler, read_only=True)

    reg.register(tool("ok_tool", a=prop("string", "a")))
    with pytest.raises(ValueError, match="already"):
        reg.register(tool("ok_tool"))
    for bad in ("Bad", "has-dash", "9x", "a.b"):
        with pytest.raises(ValueError, match="must match"):
            reg.register(tool(bad))
    with pytest.raises(ValueError, match="drops"):
        reg.register(tool("nested", x={"type": "object", "description": "x", "properties": {}}))
    with pytest.raises(ValueError, match="drops"):
        reg.register(tool("with_default", x={"type": "integer", "description": "x", "default": 1}))


def test_unknown_tool_suggests_the_closest_name(ctx: ToolContext) -> None:
    result = call(ctx, "fs_reed", path="README.md")
    assert not result.ok
    assert "did you mean fs_read" in result.content
    assert "fs_grep" in (result.hint or "")
    assert result.as_text().startswith("error: unknown tool 'fs_reed'")


def test_argument_errors_name_the_field_and_type(ctx: ToolContext) -> None:
    result = call(ctx, "fs_read", path="README.md", limit="many")
    assert not result.ok
    assert "'limit'" in result.content
    assert "integer" in result.content and "string" in result.content
    assert "fs_read takes: path (string, required)" in (result.hint or "")

    missing = call(ctx, "fs_read")
    assert "missing required argument(s) for fs_read: path" in missing.content
    unknown = call(ctx, "fs_read", path="README.md", lines=3)
    assert "unknown argument(s) for fs_read: lines" in unknown.content
    nested = call(ctx, "step_complete", summary="s", files_changed=[1])
    assert "'files_changed[0]'" in nested.content and "string" in nested.content
    not_object = default_registry().call("fs_read", ["README.md"], ctx)
    assert "must be a JSON object" in not_object.content


def test_common_small_model_argument_slips_are_forgiven(ctx: ToolContext) -> None:
    assert call(ctx, "fs_read", path="src/app.py", offset="2", limit=1.0).ok
    grep = call(ctx, "fs_grep", pattern="MAIN", ignore_case="true")
    assert grep.content.startswith("src/app.py:1")
    assert call(ctx, "fs_read", path="README.md", offset=None).ok
    text_args = default_registry().call("fs_read", '{"path": "README.md"}', ctx)
    assert text_args.ok
    done = call(ctx, "step_complete", summary="done", files_changed="src/app.py")
    assert done.ok and done.data["files_changed"] == ["src/app.py"]


def test_handler_failures_become_error_results() -> None:
    reg = Registry()

    def raises(exc: BaseException) -> Tool:
        def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
            raise exc

        return Tool(f"t{len(reg.names())}", "d", params({}), handler, read_only=True)

    ctx = ToolContext(root=Path("/nonexistent"), policy=Policy(), redactor=Redactor())
    cases = [
        (PolicyViolation("refused", hint="do this"), "refused", "do this"),
        (InvalidInput("bad input"), "bad input", None),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), "No such file", "fs_glob"),
        (KeyError("boom"), "internal error", "bug"),
    ]
    for exc, message, hint in cases:
        tool = raises(exc)
        reg.register(tool)
        result = reg.call(tool.name, {}, ctx)
        assert not result.ok and message in result.content
        if hint:
            assert hint in (result.hint or "")


def test_a_cancelled_step_runs_no_tool(ctx: ToolContext) -> None:
    import threading

    ctx.cancel = threading.Event()
    ctx.cancel.set()
    result = call(ctx, "fs_write", path="new.txt", content="x")
    assert not result.ok and "stopped" in result.content
    assert not (ctx.root / "new.txt").exists()


def test_tool_sets_per_step_kind() -> None:
    analyze = tools_for_kind("analyze")
    assert analyze == [
        "fs_read",
        "fs_glob",
        "fs_grep",
        "code_search",
        "git_status",
        "git_diff",
        "git_log",
        "step_complete",
    ]
    edit = tools_for_kind("edit")
    assert set(edit) == set(analyze) | {"fs_write", "fs_edit", "fs_apply_patch", "tests_run"}
    assert tools_for_kind("doc") == edit
    assert "shell_run" not in edit
    assert tools_for_kind("custom") == default_registry().names()
    for kind in ("analyze", "edit", "doc", "custom"):
        assert tools_for_kind(kind)[-1] == "step_complete"
    with pytest.raises(InvalidInput, match="shell"):
        tools_for_kind("shell")
    reg = default_registry()
    step_complete = reg.get("step_complete")
    assert step_complete is not None and step_complete.terminal
    assert [t.name for t in reg if t.terminal] == ["step_complete"]
    assert step_complete.parameters["required"] == ["summary"]
    assert set(step_complete.parameters["properties"]) == {
        "summary",
        "files_changed",
        "no_change_reason",
    }


def test_step_complete_echoes_the_claim(ctx: ToolContext) -> None:
    result = call(ctx, "step_complete", summary="Added x.", no_change_reason="already done")
    assert result.ok and "Added x." in result.content
    assert result.data["no_change_reason"] == "already done"
    assert result.data["files_changed"] == []


@pytest.mark.parametrize(
    "path",
    [
        "README.md",
        "docs/guide/setup.py",
        "doc/conf.py",
        "pkg/docs/x.yaml",
        "notes.txt",
        "CHANGELOG",
        "LICENSE",
        "Contributing.md",
        "guide.rst",
        "manual.adoc",
        "readme",
    ],
)
def test_doc_filter_allows_documentation(path: str) -> None:
    assert doc_write_filter(path) is None


@pytest.mark.parametrize("path", ["src/app.py", "setup.cfg", "docs", "Makefile", "x.md.py"])
def test_doc_filter_refuses_code(path: str) -> None:
    reason = doc_write_filter(path)
    assert reason and "documentation" in reason


# --------------------------------------------------------------------------- secrets


def aws_key_id() -> str:
    return "AKIA" + "".join(chr(ord("A") + (i * 7) % 26) for i in range(16))


@pytest.fixture
def secret_ctx(make_repo) -> tuple[ToolContext, str, str]:
    key = aws_key_id()
    token = "tok" + "9f8e7d6c5b4a" + "Qz"  # a bare value the formats would not all catch
    root = make_repo(
        {
            "config.py": f"ENDPOINT = 'https://example.com'\nAWS_ID = '{key}'\n",
            "README.md": "# sample\n",
        }
    )
    (root / ".env").write_text(f"API_TOKEN={token}\nDEBUG=1\n")
    (root / "sub").mkdir()
    (root / "sub" / "notes.txt").write_text(f"the token is {token}\n")
    return ToolContext(root=root, policy=Policy(), redactor=Redactor()), key, token


def test_secrets_never_reach_the_model(secret_ctx: tuple[ToolContext, str, str]) -> None:
    ctx, key, token = secret_ctx
    outputs = [
        call(ctx, "fs_read", path="config.py"),
        call(ctx, "fs_grep", pattern="AKIA|tok"),
        call(ctx, "fs_grep", pattern="token", glob="sub/*"),
        call(ctx, "fs_read", path=".env"),
        call(ctx, "fs_read", path="sub/notes.txt"),
        call(ctx, "shell_run", cmd="cat .env config.py sub/notes.txt"),
        call(ctx, "git_diff"),
        call(ctx, "fs_edit", path="config.py", search="AWS_ID = 'nothing'", replace="x"),
    ]
    for result in outputs:
        text = result.as_text() + repr(result.data)
        assert key not in text and token not in text, text
    assert "[REDACTED:aws_access_key_id]" in outputs[0].content
    assert "[REDACTED" in outputs[4].content  # registered from .env before the first call


def test_reading_a_nested_env_file_registers_its_values(make_repo) -> None:
    root = make_repo({"a/b/.env.local": "SESSION_SECRET=zq81-hidden-value\n", "x.txt": "x\n"})
    ctx = ToolContext(root=root, policy=Policy(), redactor=Redactor())
    (root / "log.txt").write_text("leaked zq81-hidden-value here\n")
    assert "zq81-hidden-value" not in call(ctx, "fs_read", path="a/b/.env.local").content
    assert "zq81-hidden-value" not in call(ctx, "shell_run", cmd="cat log.txt").content


def test_a_redactor_failure_fails_closed(ctx: ToolContext) -> None:
    class Broken(Redactor):
        def _scan(self, text: str) -> str:
            raise RuntimeError("scanner broke")

    ctx.redactor = Broken()
    result = call(ctx, "fs_read", path="src/app.py")
    assert "def main" not in result.content and "REDACTED" in result.content


# --------------------------------------------------------------------------- shell


def test_shell_run_returns_exit_code_and_output(ctx: ToolContext) -> None:
    result = call(ctx, "shell_run", cmd="echo hello; echo oops >&2; exit 3")
    assert result.ok
    assert result.content.startswith("exit code 3")
    assert "stdout:\nhello" in result.content and "stderr:\noops" in result.content
    assert result.data["exit_code"] == 3
    in_dir = call(ctx, "shell_run", cmd="pwd", cwd="src")
    assert in_dir.content.splitlines()[2].endswith("/src")


def test_shell_run_caps_output_and_says_so(ctx: ToolContext) -> None:
    result = call(ctx, "shell_run", cmd=f"{PYTHON} -c \"print('x' * 50000); print('END')\"")
    assert result.ok and "\nEND\nstderr: (empty)" in result.content
    assert "(last " in result.content and "of 50005 chars)" in result.content
    assert len(result.content) < 9000


def test_shell_run_refused_command_is_an_error_result(ctx: ToolContext) -> None:
    result = call(ctx, "shell_run", cmd="curl http://example.com")
    assert not result.ok
    assert "refused by policy" in result.content
    assert "curl" in (result.hint or "") and "network" in (result.hint or "")
    escape = call(ctx, "shell_run", cmd="ls", cwd="../")
    assert not escape.ok and "escapes" in escape.content


def test_shell_run_timeout_is_capped_by_the_configuration(ctx: ToolContext) -> None:
    ctx.command_timeout = 1
    result = call(ctx, "shell_run", cmd="sleep 5", timeout=100)
    assert not result.ok and result.content.startswith("timed out")
    assert result.data["timed_out"] is True


@pytest.fixture
def test_repo(make_repo) -> ToolContext:
    root = make_repo(
        {
            "tests/test_math.py": (
                "def test_ok():\n    print('PASSING-OUTPUT')\n    assert 1 + 1 == 2\n\n"
                "def test_bad():\n    value = 41\n    assert value == 42, 'MEANING'\n"
            ),
        }
    )
    return ToolContext(
        root=root,
        policy=Policy(),
        redactor=Redactor(),
        config=as_config({"test_command": f"{PYTHON} -m pytest -q -p no:cacheprovider"}),
    )


def test_tests_run_red_returns_counts_and_failing_sections_only(test_repo: ToolContext) -> None:
    result = call(test_repo, "tests_run")
    assert result.ok  # the tool worked; the tests are red
    assert result.content.startswith("tests failed: 1 passed, 1 failed")
    assert "test_bad" in result.content and "MEANING" in result.content
    assert "PASSING-OUTPUT" not in result.content
    assert result.data["failed"] == 1 and result.data["passed"] == 1
    assert result.data["green"] is False


def test_tests_run_green_is_one_line(test_repo: ToolContext) -> None:
    result = call(test_repo, "tests_run", args="-k test_ok")
    assert result.ok and "\n" not in result.content
    assert result.content.startswith("tests passed: 1 passed") and result.data["green"] is True
    bad = call(test_repo, "tests_run", args="-k 'unbalanced")
    assert not bad.ok and "cannot split" in bad.content


# --------------------------------------------------------------------------- git


def test_git_status_diff_and_log(ctx: ToolContext) -> None:
    root = ctx.root
    assert call(ctx, "git_status").content.startswith("no changes against HEAD")
    (root / "src" / "app.py").write_text("def main():\n    return 2\n")
    (root / "new.txt").write_text("brand new\n")
    (root / "README.md").unlink()
    status = call(ctx, "git_status")
    assert status.content.splitlines()[1:] == [" D README.md", "?? new.txt", " M src/app.py"]
    diff = call(ctx, "git_diff")
    assert diff.content.startswith("3 file(s) with changes: D README.md (+0 -1), A new.txt")
    assert "+brand new" in diff.content and "-    return 1" in diff.content
    one = call(ctx, "git_diff", path="src")
    assert "app.py" in one.content and "new.txt" not in one.content
    assert call(ctx, "git_diff", staged=True).content.startswith("no staged changes")
    git(root, "add", "new.txt")
    assert "A new.txt" in call(ctx, "git_diff", staged=True).content

    git(root, "commit", "-q", "-m", "second commit\n\nbody\n\nCoder-Step: s1")
    log = call(ctx, "git_log", limit=5)
    lines = log.content.splitlines()
    assert len(lines) == 2 and lines[0].endswith("second commit") and lines[1].endswith("initial")
    assert "Coder-Step" not in log.content
    assert len(call(ctx, "git_log", limit=1).content.splitlines()) == 1


def test_git_tools_leave_coder_dir_out(ctx: ToolContext) -> None:
    """coder's own files are no change of the step's, even where git does not ignore them."""
    (ctx.root / ".coder").mkdir()
    (ctx.root / ".coder" / "state.json").write_text("{}\n")
    (ctx.root / "new.txt").write_text("brand new\n")
    assert git(ctx.root, "status", "--porcelain", "-uall").count(".coder/") == 1
    assert call(ctx, "git_status").data["changed"] == ["new.txt"]
    assert call(ctx, "git_diff").data["files"] == ["new.txt"]


def test_git_diff_is_capped(ctx: ToolContext) -> None:
    (ctx.root / "big.txt").write_text("".join(f"line {i}\n" for i in range(10000)))
    result = call(ctx, "git_diff")
    assert len(result.content) < 31000 and "diff cut at 30000 chars" in result.content


def test_git_tools_outside_a_repository(tmp_path: Path) -> None:
    ctx = ToolContext(root=tmp_path, policy=Policy(), redactor=Redactor())
    result = call(ctx, "git_status")
    assert not result.ok and "not a readable git repository" in result.content


def test_tests_run_counts_from_the_junit_report_not_from_text(make_repo) -> None:
    """A conftest that prints a summary-like line after pytest's own: read as text, the run
    would count 9 passed; the JUnit report says 1."""
    root = make_repo(
        {
            "conftest.py": "import sys\n\n\ndef pytest_unconfigure(config):\n"
            '    sys.stderr.write("9 passed in 0.01s\\n")\n',
            "test_a.py": "def test_one():\n    pass\n",
        }
    )
    ctx = ToolContext(
        root=root,
        policy=Policy(),
        redactor=Redactor(),
        config=as_config({"test_command": f"{PYTHON} -m pytest -q -p no:cacheprovider"}),
    )
    result = call(ctx, "tests_run")
    assert result.ok and result.data["passed"] == 1, result.content
    assert result.content.startswith("tests passed: 1 passed")
