"""The fake Ollama server is faithful to what the real `ollama` client expects (APIS.md §1-2).

Every test talks to it with the real client over HTTP, or with raw httpx to check the wire.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from tests.fake_ollama import (
    NO_REPLY_LEFT,
    NS_PER_EVAL_TOKEN,
    NS_PER_PROMPT_TOKEN,
    FakeOllama,
    Reply,
    down_url,
    estimate_prompt_tokens,
)

MODEL = "qwen2.5-coder:7b"
USER = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


@pytest.fixture
def fake() -> Iterator[FakeOllama]:
    with FakeOllama() as server:
        yield server


@pytest.fixture
def client(fake: FakeOllama) -> Iterator[ollama.Client]:
    with ollama.Client(host=fake.url, timeout=10) as c:
        yield c


def stream(client: ollama.Client, **kw: object) -> list[ollama.ChatResponse]:
    return list(client.chat(MODEL, kw.pop("messages", USER), stream=True, **kw))  # type: ignore


def test_root_and_version(fake: FakeOllama) -> None:
    with httpx.Client(base_url=fake.url) as http:
        assert http.get("/").text == "Ollama is running"
        assert http.get("/api/version").json() == {"version": "0.33.0"}
        assert http.get("/api/nope").status_code == 404


def test_streaming_chat_deltas_tool_calls_and_usage(
    fake: FakeOllama, client: ollama.Client
) -> None:
    fake.enqueue(
        Reply(
            content="I will read the file now.",
            thinking="Need the file.",
            tool_calls=[
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "read_file", "arguments": {"path": "b.txt"}},
            ],
        )
    )
    parts = stream(client, tools=TOOLS, options={"num_ctx": 8192})

    *deltas, final = parts
    assert not any(p.done for p in deltas) and final.done and final.done_reason == "stop"
    texts = [p.message.content for p in deltas if p.message.content]
    assert len(texts) > 1 and "".join(texts) == "I will read the file now."
    assert "".join(p.message.thinking or "" for p in deltas) == "Need the file."
    call_chunks = [p for p in deltas if p.message.tool_calls]
    assert [len(p.message.tool_calls or []) for p in call_chunks] == [1, 1]  # each call whole
    first = (call_chunks[0].message.tool_calls or [])[0].function
    assert first.name == "read_file" and first.arguments == {"path": "a.txt"}
    assert final.prompt_eval_count == estimate_prompt_tokens(fake.chat_bodies()[0])
    assert final.prompt_eval_duration == final.prompt_eval_count * NS_PER_PROMPT_TOKEN
    assert final.eval_duration == (final.eval_count or 0) * NS_PER_EVAL_TOKEN
    assert final.load_duration and final.total_duration


def test_wire_format_is_ndjson_with_call_ids_and_omitted_zeros(fake: FakeOllama) -> None:
    fake.enqueue(
        Reply(content="ok", tool_calls=[{"name": "f", "arguments": {"x": 1}}]),
        Reply(content="again"),
    )
    body = {"model": MODEL, "messages": USER}
    with httpx.Client(base_url=fake.url) as http:
        first = http.post("/api/chat", json=body)
        second = http.post("/api/chat", json=body)
    assert first.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in first.text.splitlines()]
    call = next(
        line["message"]["tool_calls"][0] for line in lines if "tool_calls" in line["message"]
    )
    assert call["id"].startswith("call_") and call["function"]["index"] == 0
    assert call["function"]["arguments"] == {"x": 1}
    assert "load_duration" in lines[-1]
    final = json.loads(second.text.splitlines()[-1])
    assert "load_duration" not in final  # zero once loaded, and zero values are omitted


def test_stream_false_collects_everything(fake: FakeOllama, client: ollama.Client) -> None:
    fake.enqueue(Reply(content="all of it", tool_calls=[{"name": "f", "arguments": {}}]))
    response = client.chat(MODEL, USER)
    assert response.done and response.message.content == "all of it"
    assert [c.function.name for c in response.message.tool_calls or []] == ["f"]
    assert fake.chat_bodies()[0]["stream"] is False


def test_show_tags_ps_and_load(fake: FakeOllama, client: ollama.Client) -> None:
    shown = client.show(MODEL)
    info = shown.modelinfo or {}
    assert info[f"{info['general.architecture']}.context_length"] == 32768
    assert "tools" in (shown.capabilities or [])
    assert [m.model for m in client.list().models] == [MODEL]
    assert client.ps().models == []

    loaded = client.chat(MODEL, [], options={"num_ctx": 16384}, keep_alive="10m")
    assert loaded.done_reason == "load" and fake.pending == 0
    assert [(m.model, m.context_length) for m in client.ps().models] == [(MODEL, 16384)]

    assert client.chat(MODEL, [], keep_alive=0).done_reason == "unload"
    assert client.ps().models == []


def test_allocation_is_capped_at_trained_context(client: ollama.Client) -> None:
    client.chat(MODEL, [], options={"num_ctx": 1_000_000})
    assert client.ps().models[0].context_length == 32768


def test_prompt_tokens_are_silently_truncated_to_num_ctx(
    fake: FakeOllama, client: ollama.Client
) -> None:
    fake.enqueue("short answer")
    huge = [{"role": "user", "content": "x" * 40_000}]
    final = stream(client, messages=huge, options={"num_ctx": 2048})[-1]
    assert final.prompt_eval_count == 2048


def test_unknown_model_is_404(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as shown:
        client.show("nope:1b")
    assert (shown.value.status_code, shown.value.error) == (404, "model 'nope:1b' not found")
    with pytest.raises(ollama.ResponseError) as chatted:
        list(client.chat("nope:1b", USER, stream=True))
    assert chatted.value.status_code == 404


def test_tools_on_a_model_without_them_is_400() -> None:
    models = {"gemma:2b": {"context_length": 8192, "capabilities": ["completion"], "arch": "gemma"}}
    with (
        FakeOllama(models=models) as fake,
        ollama.Client(host=fake.url, timeout=10) as client,
        pytest.raises(ollama.ResponseError) as err,
    ):
        list(client.chat("gemma:2b", USER, tools=TOOLS, stream=True))
    assert err.value.status_code == 400
    assert err.value.error == "registry.ollama.ai/library/gemma:2b does not support tools"


def test_scripted_http_error(fake: FakeOllama, client: ollama.Client) -> None:
    fake.enqueue(Reply(http_status=503, error="server busy, please try again"))
    with pytest.raises(ollama.ResponseError) as err:
        stream(client)
    assert (err.value.status_code, err.value.error) == (503, "server busy, please try again")


def test_no_scripted_reply_left_fails_loudly(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        stream(client)
    assert (err.value.status_code, err.value.error) == (500, NO_REPLY_LEFT)


def test_error_mid_stream_has_status_minus_one(fake: FakeOllama, client: ollama.Client) -> None:
    fake.enqueue(Reply(content="partial answer here", error_mid_stream="llama runner crashed"))
    seen: list[str] = []
    with pytest.raises(ollama.ResponseError) as err:
        for part in client.chat(MODEL, USER, stream=True):
            seen.append(part.message.content or "")
    assert (err.value.status_code, err.value.error) == (-1, "llama runner crashed")
    assert seen == ["partial "]


def test_dropped_connection_and_malformed_line(fake: FakeOllama, client: ollama.Client) -> None:
    fake.enqueue(
        Reply(content="a b c", drop_connection_mid_stream=True),
        Reply(content="a b c", malformed_line=True),
        "fine",
    )
    with pytest.raises(httpx.RemoteProtocolError):
        stream(client)
    with pytest.raises(json.JSONDecodeError):
        stream(client)
    assert stream(client)[-1].done  # the client and the server both recover


def test_delay_provokes_a_client_timeout(fake: FakeOllama) -> None:
    fake.enqueue(Reply(content="late", delay_s=0.5))
    with ollama.Client(host=fake.url, timeout=0.1) as client, pytest.raises(httpx.ReadTimeout):
        stream(client)


def test_requests_are_recorded(fake: FakeOllama, client: ollama.Client) -> None:
    fake.enqueue("hello")
    stream(client, options={"num_ctx": 4096, "temperature": 0}, keep_alive="5m")
    request = fake.requests[-1]
    assert (request.method, request.path) == ("POST", "/api/chat")
    assert request.body["options"] == {"num_ctx": 4096, "temperature": 0}
    assert request.body["keep_alive"] == "5m" and request.body["stream"] is True
    assert json.loads(request.raw) == request.body


def test_replies_from_dicts_and_strings() -> None:
    assert Reply.coerce("hi") == Reply(content="hi")
    assert Reply.coerce({"content": "x", "done_reason": "length"}).done_reason == "length"
    with pytest.raises(TypeError, match="unknown Reply fields"):
        Reply.coerce({"contnet": "typo"})


def test_down_url_refuses_connections() -> None:
    with ollama.Client(host=down_url(), timeout=5) as client, pytest.raises(ConnectionError):
        client.list()


def test_runs_as_a_script(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["from a script"]))
    server = Path(__file__).with_name("fake_ollama.py")
    proc = subprocess.Popen(
        [sys.executable, str(server), "--port", "0", "--script", str(script)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        with ollama.Client(host=url, timeout=10) as client:
            assert client.chat(MODEL, USER).message.content == "from a script"
    finally:
        proc.terminate()
        code = proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
    assert code == 0
