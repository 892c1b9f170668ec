"""`tool_protocol`: the demo task with a model that never calls tools natively and writes its
calls as text (in `text`, and as `auto` decides from the server's evidence), on the fake Ollama
and the fake llama.cpp server, through the real clients; a native tool caller under `auto`
sending byte for byte what it sends under `native`; the fallback to text after a first reply in
prose that names a tool; the choice in the run's state, the event log and its cache."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import coder, git, sample_files
from tests.fake_ollama import FakeOllama, Reply, down_url
from tests.fake_openai import FakeOpenAI
from tests.helpers import ROOT, chat_requests, manifest_of, state_of

_spec = importlib.util.spec_from_file_location("demo_record", ROOT / "fixtures/demo/record.py")
assert _spec is not None and _spec.loader is not None
_record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_record)
SCRIPT: list[Reply] = _record.SCRIPT  # the demo's scripted turns (a native tool caller)

TASK = ROOT / "fixtures" / "demo" / "task.yaml"
SMALL = "smollm2:135m"  # a model without tool calling
MODEL_STEPS = ("s1", "s2", "s3", "s4")  # s3 is a test step whose fix cycle asks the model


def as_text(reply: Reply) -> Reply:
    """The scripted turn as a model without tool calling writes it: a few words, then the call
    as a fenced JSON block (the format the system prompt shows), then an invented result."""
    (call,) = reply.tool_calls
    block = json.dumps({"name": call["name"], "arguments": call["arguments"]})
    return Reply(content=f"I will use {call['name']}.\n```json\n{block}\n```\nResult: ok")


TEXT_SCRIPT = [as_text(r) for r in SCRIPT]


def configure(repo: Path, **settings: Any) -> None:
    (repo / "coder.config.json").write_text(json.dumps(settings))
    git(repo, "add", "coder.config.json")
    git(repo, "commit", "-q", "-m", "config")


def run_demo(repo: Path) -> tuple[int, str]:
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(TASK))
    return code, out + err


def events(repo: Path, name: str) -> list[dict[str, Any]]:
    log = repo / ".coder" / "logs" / "demo.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines() if line]
    return [e for e in lines if e.get("event") == name]


def assert_green(repo: Path, protocol: str) -> None:
    state = state_of(repo, "demo")
    assert state["status"] == "success"
    assert {s: state["steps"][s]["tool_protocol"] for s in ("s1", "s2", "s4")} == dict.fromkeys(
        ("s1", "s2", "s4"), protocol
    )
    branch = manifest_of(repo, "demo")["branch"]
    assert "return a * b" in git(repo, "show", f"{branch}:calc.py")
    assert "multiply(2, 3)  # 6" in git(repo, "show", f"{branch}:README.md")


def assert_text_requests(bodies: list[dict[str, Any]]) -> None:
    """No tools were sent; the system prompt describes them, the same bytes in every request;
    each result went back as a user message naming its call, after the call as written."""
    assert bodies and not any(b.get("tools") for b in bodies)
    systems = {b["messages"][0]["content"] for b in bodies}
    assert len(systems) == 1
    (system,) = systems
    assert (
        "<tools>" in system
        and "- fs_edit(path, search, replace, replace_all?: boolean): " in system
    )
    assert '```json\n{"name": "fs_read", "arguments": {"path": "README.md"}}\n```' in system
    last = bodies[1]["messages"]
    assistant, result = last[-2], last[-1]
    assert assistant == {
        "role": "assistant",
        "content": as_text(SCRIPT[0]).content.removesuffix("\nResult: ok"),
    }
    assert result["role"] == "user" and result["content"].startswith("Result of fs_read (call_")
    assert "def add" in result["content"]


@pytest.fixture
def demo(make_repo) -> Path:
    return make_repo(sample_files(), name="calc")


@pytest.mark.parametrize("setting", ["text", "auto"])
def test_a_model_without_tool_calling_does_the_demo_on_ollama(
    demo: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    models = {SMALL: {"context_length": 8192, "capabilities": ["completion"], "arch": "llama"}}
    with FakeOllama(models=models) as fake:  # it answers 400 to a request with tools
        configure(demo, model=SMALL, ollama_host=fake.url, tool_protocol=setting)
        fake.enqueue(*TEXT_SCRIPT)
        code, out = run_demo(demo)
        assert code == 0, out
        assert fake.pending == 0
        bodies = chat_requests(fake)
    assert_green(demo, "text")
    assert_text_requests(bodies)
    (chosen, *_) = events(demo, "model.protocol")
    assert chosen["protocol"] == "text"
    if setting == "auto":
        assert chosen["reason"] == "the model's capabilities (completion) do not include tools"
        cache = json.loads((demo / ".coder" / "cache" / "tool-protocols.json").read_text())
        assert cache == {
            f"ollama {fake.url} {SMALL}": {"protocol": "text", "reason": chosen["reason"]}
        }
    else:
        assert chosen["reason"].startswith("tool_protocol: text (from project file")


@pytest.mark.parametrize("setting", ["text", "auto"])
def test_a_template_that_drops_tools_gets_them_as_text_on_llama_cpp(
    demo: Path, setting: str
) -> None:
    """llama.cpp serving a GGUF whose chat template drops `tools`: /apply-template renders the
    same prompt with and without them, so auto takes text."""
    models = {
        "smollm2": {"context_length": 8192, "capabilities": ["tools"], "template_tools": False}
    }
    with FakeOpenAI(models=models) as fake:
        configure(
            demo, provider="openai", base_url=fake.url, model="smollm2", tool_protocol=setting
        )
        fake.enqueue(*TEXT_SCRIPT)
        code, out = run_demo(demo)
        assert code == 0, out
        bodies = fake.chat_bodies()
        asked = [r.path for r in fake.requests if r.path == "/apply-template"]
    assert_green(demo, "text")
    assert_text_requests(bodies)
    assert len(asked) == (2 if setting == "auto" else 0)  # with and without a tool, once
    if setting == "auto":
        (chosen, *_) = events(demo, "model.protocol")
        assert "renders the same prompt with and without them" in chosen["reason"]


def test_a_native_tool_caller_sends_the_same_requests_under_auto(
    make_repo, isolated_home: Path
) -> None:
    """Under auto, a model the server says calls tools is driven exactly as under native:
    every chat request byte for byte the same."""
    port = int(down_url().rsplit(":", 1)[1])
    sent = {}
    for setting in ("native", "auto"):
        repo = make_repo(sample_files(), name="calc")  # the same path: it is in test output
        with FakeOllama(port=port) as fake:  # the same URL: it is in the config
            configure(repo, ollama_host=fake.url)
            user = isolated_home / ".config" / "coder" / "config.json"  # not in the repository
            user.parent.mkdir(parents=True, exist_ok=True)
            user.write_text(json.dumps({"tool_protocol": setting}))
            fake.enqueue(*SCRIPT)
            code, out = run_demo(repo)
            assert code == 0, out
            sent[setting] = [r.raw for r in fake.requests if r.path == "/api/chat"]
        assert_green(repo, "native")
        repo.rename(repo.with_name(f"calc-{setting}"))
    assert len(sent["auto"]) > 10
    assert sent["auto"] == sent["native"]
    assert all(b'"tools"' in raw for raw in sent["auto"][2:])  # past the load and the priming


def test_auto_goes_over_to_text_after_prose_that_names_a_tool(demo: Path) -> None:
    """A server that gives no evidence (no /apply-template, the probe fails): native,
    unproven; the model's first reply is prose naming fs_read, so the step goes on in text,
    and the model's later steps start in text (remembered for the next run too)."""
    with FakeOpenAI(templates=False) as fake:
        configure(demo, provider="openai", base_url=fake.url, model="qwen2.5-coder-7b-instruct")
        prose = Reply(content="To find the operations I should read calc.py with fs_read first.")
        fake.enqueue(Reply(http_status=400, error="no probing here"), prose, *TEXT_SCRIPT)
        code, out = run_demo(demo)
        assert code == 0, out
        bodies = fake.chat_bodies()
    assert_green(demo, "text")
    first, second, *later = bodies[1:]  # after the probe
    assert first["tools"] and "<tools>" not in first["messages"][0]["content"]
    assert "tools" not in second and "<tools>" in second["messages"][0]["content"]
    assert second["messages"][-1]["role"] == "user"  # the nudge says how to call a tool
    assert "```json" in second["messages"][-1]["content"]
    assert not any(b.get("tools") for b in later)
    (switched,) = [e for e in events(demo, "model.protocol") if e.get("turn")]
    assert switched["protocol"] == "text" and switched["level"] == "warning"
    cache = json.loads((demo / ".coder" / "cache" / "tool-protocols.json").read_text())
    (entry,) = cache.values()
    assert entry == {"protocol": "text", "reason": "answered in prose naming a tool (step s1)"}
