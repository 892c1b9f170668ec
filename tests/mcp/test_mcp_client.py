"""External MCP servers in a run: coder starts them (fixtures/mcp_echo_server.py, written with
the official SDK), offers their tools to the model as <server>__<tool> with flattened schemas,
validates arguments against the original schema, survives a server that crashes or never
starts, and shuts them down. Model turns come from the fake Ollama server."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from coder.taskfile import Step
from tests.conftest import coder
from tests.fake_ollama import FakeOllama
from tests.helpers import ROOT, call, chat_requests, done, state_of, taskfile
from tests.prefix_cache import is_priming

pytest.importorskip("mcp")

ECHO = {
    "name": "echo",
    "command": sys.executable,
    "args": [str(ROOT / "fixtures" / "mcp_echo_server.py")],
}
TOKEN = "tok-" + "9f8e7d6c5b4a39281706"
GHOST = {"name": "ghost", "command": "/nonexistent/ghost-mcp-server"}


def configure(repo: Path, *servers: dict[str, Any]) -> None:
    """The repository lists `servers`, and the user trusted them (`coder trust`)."""
    from coder import config as config_mod

    (repo / "coder.config.json").write_text(json.dumps({"mcp_servers": list(servers)}))
    config_mod.trust(repo)


def log_events(repo: Path, task_id: str) -> list[dict[str, Any]]:
    path = repo / ".coder" / "logs" / f"{task_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


RUN = """
    id: ext
    title: external tools
    graph:
      - {id: s1, kind: analyze, goal: ask echo, tools: ["echo__*", fs_read]}
      - {id: s2, kind: edit, goal: no external tools here}
      - {id: s3, kind: custom, goal: use them all}
"""


def test_a_run_uses_external_tools_and_survives_their_failures(fake: FakeOllama, make_repo) -> None:
    repo = make_repo()
    configure(repo, {**ECHO, "env": {"ECHO_API_TOKEN": TOKEN, "ECHO_MODE": "loud"}}, GHOST)
    fake.enqueue(
        # s1 (analyze, tools: echo__*, fs_read)
        call("echo__echo", text="ping"),
        call("fs_glob", pattern="*"),  # not listed for this step
        done("echo answered ping"),
        # s2 (edit, no tools list): external tools are not for this kind
        call("echo__echo", text="nope"),
        done("nothing to do", no_change_reason="nothing needed"),
        # s3 (custom): every tool
        call("echo__locate", point={"x": -1}),  # breaks the original schema: not forwarded
        call("echo__locate", point={"x": 2, "y": 5}, label="home", mode="far"),
        call("echo__add", a="2", b=3),  # "2" coerced by the flat schema
        call("echo__getenv", var="ECHO_MODE"),  # the configured env reaches the server
        call("echo__getenv", var="ECHO_API_TOKEN"),  # ... and its secrets are redacted
        call("echo__crash"),
        call("echo__echo", text="anyone?"),
        done("used the echo server", no_change_reason="nothing to change"),
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, RUN)))
    assert code == 0, out + err
    assert fake.pending == 0
    requests = chat_requests(fake)

    # the external tools are part of the run-wide tool list, byte-stable across all requests
    tools = {t["function"]["name"]: t["function"] for t in requests[0]["tools"]}
    assert {
        "echo__echo",
        "echo__add",
        "echo__getenv",
        "echo__sleep",
        "echo__crash",
        "echo__locate",
    } <= set(tools)
    assert not any(name.startswith("ghost__") for name in tools)
    assert all(body["tools"] == requests[0]["tools"] for body in requests)
    # the warm prefix went out once they had joined: the first request finds it as it is
    primings = [b for b in fake.chat_bodies() if is_priming(b)]
    assert len(primings) == 1 and primings[0]["tools"] == requests[0]["tools"]
    assert primings[0]["messages"] == requests[0]["messages"][:1]
    locate = tools["echo__locate"]["parameters"]
    assert locate["required"] == ["point"]
    assert locate["properties"]["point"]["type"] == "object"
    assert "x (integer, required)" in locate["properties"]["point"]["description"]
    assert "minimum: 0" in locate["properties"]["point"]["description"]
    assert locate["properties"]["mode"]["enum"] == ["near", "far"]
    assert locate["properties"]["label"]["type"] == "string"  # anyOf [string, null]
    for spec in locate["properties"].values():
        assert set(spec) <= {"type", "description", "enum", "items"}

    # s1: the result of echo__echo reaches the next request; fs_glob is not for this step
    s1 = tool_results(requests[2])
    assert s1[0] == "ping"
    assert s1[1].startswith("error: fs_glob is not available in this step")
    assert "echo__echo" in s1[1] and "fs_read" in s1[1] and "fs_write" not in s1[1]
    # s2: an edit step without a tools list gets no external tools
    assert tool_results(requests[4])[0].startswith("error: echo__echo is not available")
    # s3
    s3 = tool_results(requests[-1])
    assert s3[0] == (
        "error: argument 'point.x' of echo__locate: -1 is less than the minimum "
        "of 0\nhint: echo__locate takes: point (object, required), label (string), "
        "mode (string), tags (array)"
    )
    assert s3[1] == "home at (2, 5) far"
    assert s3[2] == "5"
    assert s3[3] == "loud"
    assert s3[4].startswith("[REDACTED")
    assert s3[5].startswith("error: MCP server echo died during the call to echo__crash")
    assert s3[6].startswith(
        "error: MCP server echo is not running (it exited during a call to crash)"
    )
    assert TOKEN.encode() not in b"".join(r.raw for r in fake.requests)

    assert state_of(repo, "ext")["status"] == "success"
    events = log_events(repo, "ext")
    warnings = {e.get("kind"): e["message"] for e in events if e["event"] == "run.warning"}
    assert warnings["mcp.server_failed"] == (
        "MCP server ghost could not be started: command not found: "
        "/nonexistent/ghost-mcp-server; the run goes on without its tools"
    )
    assert warnings["mcp.server_died"].startswith("MCP server echo died")
    ready = [e for e in events if e["event"] == "mcp.server_ready"]
    assert ready[0]["server"] == "echo" and "echo__locate" in ready[0]["tools"]
    assert "ghost" in err and "could not be started" in err  # shown on the console too


def test_a_run_without_model_steps_starts_no_server(make_repo) -> None:
    repo = make_repo()
    configure(repo, GHOST)
    path = taskfile(repo, "id: sh\ntitle: t\ngraph:\n  - {kind: shell, cmd: echo hi}\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert "ghost" not in err


def test_a_server_sees_the_script_its_command_line_names(tmp_path: Path) -> None:
    """A server configured as `python /elsewhere/server.py`: its script is outside the
    worktree and the toolchain, and its view shows it (read-only), or it could not start."""
    import shutil

    from coder.mcp.client import McpBridge

    elsewhere = tmp_path / "tools"
    elsewhere.mkdir()
    script = elsewhere / "server.py"
    shutil.copy(ROOT / "fixtures" / "mcp_echo_server.py", script)
    worktree = tmp_path / "wt"
    worktree.mkdir()
    server = {**ECHO, "args": [str(script)]}
    with McpBridge([server], cwd=worktree) as bridge:
        assert bridge.call("echo__echo", {"text": "hi"}).content == "hi", bridge.warnings


def test_bridge_allow_list_timeout_and_shutdown(tmp_path: Path) -> None:
    from coder.mcp.client import McpBridge

    started = time.monotonic()
    with McpBridge([{**ECHO, "allow": ["echo", "echo__sleep", "missing"]}], cwd=tmp_path) as bridge:
        assert sorted(bridge.tools) == ["echo__echo", "echo__sleep"]
        assert bridge.warnings == [
            "MCP server echo has no tool 'missing' (named in its allow list)"
        ]
        slow = bridge.call("echo__sleep", {"seconds": 1.5}, timeout=0.3)
        assert not slow.ok and slow.content == "echo__sleep timed out after 0.3s"
        assert bridge.call("echo__echo", {"text": "still here"}).content == "still here"
        assert not bridge.call("echo__add", {"a": 1, "b": 2}).ok  # not allowed: not offered
        missing = bridge.call("echo__echo", {})
        assert not missing.ok and "'text' is a required property" in missing.content
    assert time.monotonic() - started < 15


def test_a_server_that_never_answers_is_given_up(tmp_path: Path) -> None:
    from coder.mcp.client import McpBridge

    mute = {"name": "mute", "command": "sleep", "args": ["60"]}  # never speaks MCP
    with McpBridge([mute], cwd=tmp_path, startup_timeout=1) as bridge:
        assert bridge.tools == {}
        assert bridge.warnings == [
            "MCP server mute could not be started: it did not answer "
            "within 1s; the run goes on without its tools"
        ]
        assert not bridge.call("mute__anything", {}).ok


def test_mcp_list_json(make_repo) -> None:
    repo = make_repo()
    configure(repo, ECHO, GHOST)
    code, out, _err = coder(repo, "mcp", "list", "--json")
    assert code == 3  # a configured server could not be started
    listed = {s["name"]: s for s in json.loads(out)}
    assert listed["echo"]["ok"] and listed["echo"]["error"] is None
    tools = {t["name"]: t for t in listed["echo"]["tools"]}
    assert tools["echo__add"]["tool"] == "add"
    assert tools["echo__add"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert "$defs" in tools["echo__locate"]["input_schema"]  # the original, kept
    assert listed["ghost"] == {
        "name": "ghost",
        "command": GHOST["command"],
        "args": [],
        "ok": False,
        "tools": [],
        "error": f"command not found: {GHOST['command']}",
    }
    configure(repo)
    assert coder(repo, "mcp", "list", "--json")[:2] == (0, "[]\n")


def test_flatten_keeps_what_the_ollama_client_drops_in_descriptions() -> None:
    from coder.mcp.flatten import argument_problem, flatten_schema
    from coder.tools.base import Tool, ToolResult
    from coder.tools.registry import Registry

    schema = {
        "type": "object",
        "required": ["where", "ids"],
        "additionalProperties": False,
        "definitions": {
            "Box": {
                "type": "object",
                "required": ["w"],
                "properties": {
                    "w": {"type": "integer", "minimum": 1, "description": "Width"},
                    "unit": {"type": "string", "enum": ["cm", "in"], "default": "cm"},
                },
            }
        },
        "properties": {
            "where": {"allOf": [{"$ref": "#/definitions/Box"}], "description": "The box"},
            "ids": {
                "type": "array",
                "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "maxItems": 3,
            },
            "shapes": {"type": "array", "items": {"$ref": "#/definitions/Box"}},
            "either": {"oneOf": [{"type": "string", "format": "date"}, {"type": "integer"}]},
            "anything": {},
        },
    }
    flat = flatten_schema(schema)
    props = flat["properties"]
    assert props["where"] == {
        "type": "object",
        "description": (
            "The box. An object with fields: w (integer, required): Width (minimum: 1); "
            'unit (string): (default: "cm") (one of ["cm", "in"]).'
        ),
    }
    assert props["ids"] == {
        "type": "array",
        "description": "(maxItems: 3).",
        "items": {"type": "integer"},
    }
    assert props["shapes"]["items"] == {"type": "object"}
    assert props["shapes"]["description"].startswith("Each item: An object with fields: w ")
    assert props["either"]["type"] == ["string", "integer"]
    assert 'string ((format: "date").)' in props["either"]["description"]
    assert props["anything"]["type"] == [
        "string",
        "number",
        "integer",
        "boolean",
        "object",
        "array",
    ]
    assert flat["required"] == ["where", "ids"] and flat["additionalProperties"] is False
    Registry().register(
        Tool("srv__t", "d", flat, lambda c, a: ToolResult(True, ""), read_only=False)
    )  # the registry's flat-schema check accepts it
    assert (
        argument_problem(schema, {"where": {"w": 0}, "ids": []}, "srv__t")
        == "argument 'where.w' of srv__t: 0 is less than the minimum of 1"
    )
    assert argument_problem(schema, {"where": {"w": 2}, "ids": [1, None]}, "srv__t") is None


@pytest.mark.parametrize(
    ("kind", "tools", "expected"),
    [
        ("custom", None, ["fs_read", "fs_write", "echo__echo", "step_complete"]),
        ("analyze", None, ["fs_read", "step_complete"]),
        ("analyze", ("echo__*", "fs_write"), ["echo__echo", "step_complete"]),  # never widens
        ("edit", ("fs_*",), ["fs_read", "fs_write", "step_complete"]),
        ("custom", ("nothing",), ["step_complete"]),
    ],
)
def test_allowed_tools(kind: str, tools: tuple[str, ...] | None, expected: list[str]) -> None:
    from coder.agent.modelstep import allowed_tools

    names = ["fs_read", "fs_write", "echo__echo", "step_complete"]
    kinds = {
        "custom": names,
        "analyze": ["fs_read", "step_complete"],
        "edit": ["fs_read", "fs_write", "step_complete"],
    }
    step = Step(id="s1", kind=kind, goal="g", tools=tools)
    assert allowed_tools(step, kinds[kind], names) == expected
