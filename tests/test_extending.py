"""The goal of the registries: a new step kind is one module, one registry line and the schema
enum; a new model provider is one module and one line (and the config schema's enum). Each is
added here at test time, a throwaway module in a temporary package, and goes through what a
user runs: validate, preflight, the executor and the live view for the kind; served, `coder
doctor` and the dry run for the provider, and a run whose model step streams from a server of
a new protocol through a provider that is the three hooks of coder.models.streaming. And
nothing in coder switches on a kind's or a provider's name: behaviour lives on the registry
entries (coder.taskfile.kinds, coder.models.factory)."""

from __future__ import annotations

import ast
import json
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import coder
from coder import schemas
from coder.models.factory import PROVIDERS
from coder.run.steps.runners import RUNNERS
from coder.taskfile.kinds import KINDS, STEP_CMD, Kind, Labels
from tests.conftest import coder as run_coder
from tests.conftest import git
from tests.helpers import state_of, taskfile

STAMP = '''
"""`stamp` steps: run `cmd`, as a shell step does, in the sandbox."""

from coder.run.steps import StepContext, StepOutcome
from coder.run.steps.shell import describe_failure, run_in_step


def run(ctx: StepContext) -> StepOutcome:
    result = run_in_step(ctx, ctx.step.cmd or "")
    if result.cancelled:
        return StepOutcome(False, "interrupted while stamping", cancelled=True)
    if not result.ok:
        return StepOutcome(False, describe_failure(result))
    return StepOutcome(True, summary="stamped")
'''

ECHO = '''
"""An in-process model server that serves the models in SERVED."""

from coder.errors import ModelMissing
from coder.models.provider import ChatResult, ModelFacts, Usage

SERVED = ["small"]


class EchoProvider:
    name = "echo"
    host_label = "echo server"
    server_name = "Echo"
    caps_context = False
    tool_probe = False

    def __init__(self, model, endpoint):
        self.model, self.endpoint = model, endpoint

    @classmethod
    def open(cls, cfg, endpoint, model):
        return cls(model, endpoint)

    @staticmethod
    def endpoints(cfg):
        return [str(cfg.base_url or "http://echo.invalid/v0")]

    @staticmethod
    def serves(served, name):
        return name in served

    @staticmethod
    def missing(url, name, served, field):
        return f"is not echoed at {url}", f"add {name} to SERVED"

    def probe(self):
        if self.model not in SERVED:
            raise ModelMissing(f"{self.model} is not echoed", hint=f"add {self.model} to SERVED")
        return ModelFacts(
            "echo", self.model, self.endpoint, version="1.0", arch="echo",
            context_length=16384, num_ctx=16384, capabilities=("tools",),
        )

    def warm_up(self):
        return self.probe()

    def list_models(self):
        return list(SERVED)

    def chat(self, messages, *, tools=None, format=None, on_event=None):
        return ChatResult(messages[-1]["content"], (), "", Usage(calls=1), "stop")

    def embed(self, texts):
        return [[float(len(t))] for t in texts]

    def close(self):
        pass
'''


@pytest.fixture
def schema_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the schemas that coder reads instead of its own (their caches cleared)."""
    copy = tmp_path / "schemas"
    copy.mkdir()
    for name in schemas.NAMES:
        source = schemas.schema_dir() / f"{name}.schema.json"
        (copy / source.name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(schemas, "schema_dir", lambda: copy)
    schemas.load_schema.cache_clear()
    schemas.validator.cache_clear()
    yield copy
    schemas.load_schema.cache_clear()
    schemas.validator.cache_clear()


def extend_enum(path: Path, old: list[str], new: str) -> None:
    """Add `new` to every enum of the schema at `path` that lists `old`."""
    data = json.loads(path.read_text(encoding="utf-8"))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("enum") == old:
                node["enum"] = [*old, new]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Any:
    """A throwaway module `extra_<name>` in a temporary package directory, imported."""
    import importlib

    package = tmp_path / "extra"
    package.mkdir(exist_ok=True)
    (package / f"extra_{name}.py").write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.syspath_prepend(str(package))
    return importlib.import_module(f"extra_{name}")


@pytest.fixture
def stamp_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schema_copy: Path) -> str:
    """The `stamp` kind: its module, its registry line (and its runner's), the schema enum."""
    runner = module(tmp_path, monkeypatch, "stamp", STAMP)
    kind = Kind(
        "stamp",
        "runs `cmd` and commits what it changed",
        runner="stamp",
        fields=frozenset({"cmd", "cwd", "env"}),
        command=STEP_CMD,
        default_goal="stamp with `{cmd}`",
        labels=Labels(running="stamping: {goal}"),
    )
    monkeypatch.setitem(KINDS, kind.name, kind)
    monkeypatch.setitem(RUNNERS, kind.runner, runner.run)
    extend_enum(schema_copy / "step.schema.json", [k for k in KINDS if k != "stamp"], "stamp")
    return kind.name


def test_a_new_kind_is_validated_preflighted_run_and_shown(make_repo: Any, stamp_kind: str) -> None:
    from coder.cli.progress import Board

    repo = make_repo()
    refused = taskfile(
        repo,
        """
        id: net
        title: A stamp step whose command the policy refuses
        graph:
          - {id: s1, kind: stamp, cmd: "curl -s https://example.com"}
        """,
        name="net.yaml",
    )
    code, out, err = run_coder(repo, "validate", "-f", str(refused))
    assert code != 0 and "(step s1): command refused: `curl`" in out + err  # preflight asked it
    model = taskfile(repo, "id: m\ntitle: t\ngraph:\n  - {kind: stamp, model: m}\n", name="m.yaml")
    code, out, err = run_coder(repo, "validate", "-f", str(model))
    assert code != 0 and "`model` is only used by" in out + err  # the fields it takes
    path = taskfile(
        repo,
        """
        id: stamped
        title: Stamp a file
        graph:
          - {id: s1, kind: stamp, cmd: "echo stamped > stamp.txt"}
        """,
    )
    assert run_coder(repo, "validate", "-f", str(path))[0] == 0
    code, out, err = run_coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert "s1         started     stamp: stamp with `echo stamped > stamp.txt`" in err
    step = state_of(repo, "stamped")["steps"]["s1"]
    assert (step["status"], step["summary"]) == ("success", "stamped")
    assert git(repo, "show", f"{step['commit']}:stamp.txt") == "stamped\n"
    board = Board([("s1", "stamp", "Stamp it")])
    board.apply({"event": "step.started", "step_id": "s1", "kind": "stamp", "attempt": 1}, 0.0)
    assert board.steps["s1"].doing(2.0) == "stamping: Stamp it · 0:02"


@pytest.fixture
def echo_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schema_copy: Path) -> str:
    """The `echo` provider: its module, its line in PROVIDERS (and the config schema's enum)."""
    provider = module(tmp_path, monkeypatch, "echo", ECHO).EchoProvider
    monkeypatch.setitem(PROVIDERS, provider.name, provider)
    extend_enum(schema_copy / "config.schema.json", ["ollama", "openai"], provider.name)
    return str(provider.name)


def test_a_new_provider_is_checked_by_doctor_dry_run_and_run(
    make_repo: Any, echo_provider: str
) -> None:
    repo = make_repo(
        {
            "README.md": "# r\n",
            "coder.config.json": json.dumps({"provider": echo_provider, "model": "small"}),
        }
    )
    code, out, _ = run_coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}
    server = found["echo server"]  # its host label, and its server's name by the version
    assert (server["status"], server["detail"]) == ("ok", "http://echo.invalid/v0 (Echo 1.0)")
    assert found["model"]["status"] == "ok" and "small is available" in found["model"]["detail"]
    assert found["context window"]["detail"].startswith("num_ctx 16384 (as the server reports")
    path = taskfile(
        repo,
        """
        id: big
        title: A step on a model the server lacks
        graph:
          - {id: s1, kind: edit, goal: Edit, model: big}
        """,
    )
    code, out, _ = run_coder(repo, "run", "--dry-run", "--json", "-f", str(path))
    model = json.loads(out)["model"]
    assert (model["provider"], model["host"], model["max_num_ctx"]) == (
        "echo",
        "http://echo.invalid/v0",
        None,
    )
    code, out, err = run_coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 3, out + err
    assert "model 'big' is not echoed at http://echo.invalid/v0" in err
    assert "add big to SERVED" in err
    assert not (repo / ".coder" / "state" / "big.json").exists()


LINES = '''
"""A provider for `lines` servers: POST /chat streams the reply as JSON lines."""

import json

from coder.models.provider import ToolCall
from coder.models.streaming import Figures, Piece, StreamingProvider


class LinesProvider(StreamingProvider):
    name = "lines"

    def request(self, messages, tools, format):
        return {"model": self.model, "messages": messages, "tools": tools or []}

    def open_stream(self, request):
        with self.http().stream("POST", f"{self.endpoint}/chat", json=request) as response:
            if response.is_error:
                response.read()
                response.raise_for_status()
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)

    def read(self, chunk):
        if "call" in chunk:
            return Piece(calls=(ToolCall(chunk["call"]["name"], chunk["call"]["arguments"]),))
        if "done" in chunk:
            said = Figures(prompt_tokens=chunk["prompt_tokens"], eval_tokens=chunk["tokens"])
            return Piece(end=chunk["done"], figures=said)
        return Piece(text=chunk["text"])
'''


class LinesServer(ThreadingHTTPServer):
    """A `lines` server on 127.0.0.1: POST /v0/chat answers with the next scripted reply as
    JSON lines in a chunked stream (`{"text"}`, `{"call": {"name", "arguments"}}`), then
    `{"done": "stop", "prompt_tokens", "tokens"}` (a quarter of the request's characters, and
    of the reply's); a request with no user turn (a warm prefix) gets "ok"; a model it does not
    serve, a 404 `{"error": "model 'x' not found"}`; a status in the script, that status
    (`{"error": "busy"}`); nothing left to answer, a 500."""

    daemon_threads = True

    def __init__(self, served: str, script: list[Any]) -> None:
        super().__init__(("127.0.0.1", 0), LinesHandler)
        self.served, self.script = served, script
        self.chats: list[dict[str, Any]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v0"


class LinesHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LinesServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v0/chat" or body.get("model") != self.server.served:
            return self.answer(404, {"error": f"model '{body.get('model')}' not found"})
        if not any(m["role"] == "user" for m in body["messages"]):
            reply = [{"text": "ok"}]
        elif not self.server.script:
            return self.answer(500, {"error": "no reply left"})
        elif isinstance(self.server.script[0], int):
            return self.answer(self.server.script.pop(0), {"error": "busy"})
        else:
            self.server.chats.append(body)
            reply = self.server.script.pop(0)
        said = len(json.dumps(body)) // 4
        done = {"done": "stop", "prompt_tokens": said, "tokens": len(json.dumps(reply)) // 4}
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for line in [*reply, done]:
            data = json.dumps(line).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")

    def answer(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def lines_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schema_copy: Path) -> Any:
    """The `lines` provider: its module, its line in PROVIDERS (and the config schema's enum)."""
    provider = module(tmp_path, monkeypatch, "lines", LINES).LinesProvider
    monkeypatch.setitem(PROVIDERS, provider.name, provider)
    extend_enum(schema_copy / "config.schema.json", ["ollama", "openai"], provider.name)
    return provider


def run_with_lines(
    make_repo: Any, model: str, script: list[Any]
) -> tuple[Path, LinesServer, int, str]:
    """`coder run` of a one-step edit task with the `lines` provider, `model` configured,
    against a server that serves `small` and answers `script`: (repo, server, exit code, the
    output)."""
    server = LinesServer("small", script)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = {"provider": "lines", "base_url": server.url, "model": model}
        repo = make_repo({"README.md": "# r\n", "coder.config.json": json.dumps(config)})
        task = "id: hi\ntitle: Say hello\ngraph:\n  - {id: s1, kind: edit, goal: Hi}\n"
        code, out, err = run_coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, task)))
    finally:
        server.shutdown()
        server.server_close()
    return repo, server, code, out + err


def test_a_streaming_provider_is_three_hooks_and_runs_a_model_step(
    make_repo: Any, lines_provider: Any
) -> None:
    """The provider writes its name and the three hooks; the base retries a busy server,
    streams, puts the reply together, counts the server's figures and answers the rest of the
    protocols: a real run edits a file through the model's tool calls and commits it."""
    assert {k for k in vars(lines_provider) if not k.startswith("_")} == {
        "name",
        "request",
        "open_stream",
        "read",
    }
    write = {"name": "fs_write", "arguments": {"path": "hello.txt", "content": "hello\n"}}
    claim = {"summary": "wrote hello.txt", "files_changed": ["hello.txt"]}
    script = [
        503,
        [{"text": "I will write it."}, {"call": write}],
        [{"call": {"name": "step_complete", "arguments": claim}}],
    ]
    repo, server, code, output = run_with_lines(make_repo, "small", script)
    assert code == 0, output
    assert not server.script  # every reply was asked for
    result = server.chats[1]["messages"][-1]  # the tool's result went back to the model
    assert result["role"] == "tool" and result["tool_name"] == "fs_write"
    step = state_of(repo, "hi")["steps"]["s1"]
    assert step["status"] == "success"
    assert git(repo, "show", f"{step['commit']}:hello.txt") == "hello\n"
    assert git(repo, "rev-parse", "agent/hi-say-hello").strip() == step["commit"]
    said = sum(len(json.dumps(chat)) // 4 for chat in server.chats)
    assert (step["usage"]["calls"], step["usage"]["prompt_tokens"]) == (2, said)
    log = (repo / ".coder" / "logs" / "hi.jsonl").read_text(encoding="utf-8").splitlines()
    retried = [e for e in map(json.loads, log) if e["event"] == "model.retrying"]
    assert [e["reason"] for e in retried] == ["HTTP 503: busy"]


def test_a_streaming_providers_failures_are_named_by_the_base(
    make_repo: Any, lines_provider: Any
) -> None:
    """A model the server does not serve: its 404 is the base's ModelMissing (exit 3), with
    the base's fix; nothing was committed."""
    repo, server, code, output = run_with_lines(make_repo, "big", [])
    assert code == 3, output
    assert f"model 'big' is not available at {server.url}: model 'big' not found" in output
    assert "name a model it serves in coder.config.json, or serve big there" in output
    assert git(repo, "rev-list", "main..agent/hi-say-hello") == ""


def test_the_config_schema_lists_the_providers() -> None:
    config = schemas.load_schema("config")
    named = config["properties"]["models"]["additionalProperties"]["properties"]
    assert config["properties"]["provider"]["enum"] == list(PROVIDERS)
    assert named["provider"]["enum"] == list(PROVIDERS)


# --- no switches on names --------------------------------------------------------------------

PACKAGE = Path(coder.__file__).resolve().parent
REGISTRIES = {PACKAGE / "taskfile" / "kinds.py"}  # the one place kind names are written as entries


def name_switches(text: str, where: str, names: set[str]) -> list[str]:
    """Each comparison of a value with one of `names` in the module source `text`
    (`x == "lint"`, `x in ("test", ...)`, `case "shell":`): behaviour chosen by a registry
    entry's name instead of the entry. `where` names the module in what is found. A model
    role (`role in ("edit", "docs")`, coder.taskfile.kinds.ModelRole) is not a kind, though one kind
    shares its name."""

    def role(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == "role"

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
                equal = isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))
                member = isinstance(op, (ast.In, ast.NotIn))
                if role(left) or role(right):
                    continue
                if (equal and (named(left) or named(right))) or (member and named(right)):
                    found.append(f"{where}:{node.lineno}")
        elif isinstance(node, ast.MatchValue) and named(node.value):
            found.append(f"{where}:{node.lineno}")
    return found


def test_no_module_switches_on_a_kind_or_a_provider_name() -> None:
    names = set(KINDS) | set(PROVIDERS)
    switches = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRIES
        for hit in name_switches(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)), names
        )
    ]
    assert not switches, "ask the registry entry instead: " + ", ".join(switches)


def test_the_switch_finder_finds_switches() -> None:
    """The test above can fail: each form of a switch is found, a key lookup is not."""
    text = (
        "if kind == 'lint': pass\n"
        "if provider != 'ollama': pass\n"
        "ok = step.kind in ('test', 'x')\n"
        "match kind:\n    case 'shell': pass\n"
        "fine = 'test' in scripts\n"
        "if role in ('edit', 'docs'): pass\n"
    )
    found = name_switches(text, "scratch.py", set(KINDS) | set(PROVIDERS))
    assert found == ["scratch.py:1", "scratch.py:2", "scratch.py:3", "scratch.py:5"]
