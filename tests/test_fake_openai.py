"""The fake OpenAI-compatible server is faithful to what the real `openai` SDK expects: every
test talks to it with the SDK over HTTP, or with raw httpx to check the wire."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fake_ollama import NO_REPLY_LEFT, Reply, embedding
from tests.fake_openai import MODEL, FakeOpenAI
from tests.prefix_cache import PrefixCache

USER = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def client(fake: FakeOpenAI) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.url, api_key="x", max_retries=0, timeout=10) as c:
        yield c


def stream(client: openai.OpenAI, **kw: Any) -> list[Any]:
    return list(
        client.chat.completions.create(
            model=MODEL,
            messages=kw.pop("messages", USER),
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
    )


def sse_lines(fake: FakeOpenAI, body: dict[str, Any]) -> list[str]:
    with httpx.Client() as http:
        response = http.post(f"{fake.url}/chat/completions", json=body)
    assert response.headers["content-type"] == "text/event-stream"
    return [line for line in response.text.split("\n\n") if line]


def test_models_props_and_health(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    listed = client.models.list().data
    assert [m.id for m in listed] == [MODEL]
    assert (listed[0].model_extra or {})["max_model_len"] == 32768
    with httpx.Client() as http:
        root = fake.url.removesuffix("/v1")
        assert http.get(f"{root}/props").json()["default_generation_settings"]["n_ctx"] == 32768
        assert http.get(f"{root}/health").json() == {"status": "ok"}
        assert http.get(f"{root}/nope").status_code == 404


def test_streamed_text_tool_call_deltas_and_usage(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    args = {"path": "some/long/path/to/a/file.txt"}
    fake.enqueue(
        Reply(content="I will read it.", tool_calls=[{"name": "read_file", "arguments": args}])
    )
    chunks = stream(client, tools=TOOLS)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "I will read it."
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert len(deltas) >= 3  # the name first, the arguments split over several chunks
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "read_file"
    assert all(d.index == 0 for d in deltas) and all(d.id is None for d in deltas[1:])
    assert json.loads("".join(d.function.arguments for d in deltas)) == args
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.prompt_tokens_details.cached_tokens == 0  # nothing cached yet
    assert (chunks[-1].model_extra or {})["timings"]["prompt_n"] == usage.prompt_tokens


def test_the_wire_is_sse_ending_with_done(fake: FakeOpenAI) -> None:
    fake.enqueue("hello there")
    lines = sse_lines(fake, {"model": MODEL, "messages": USER, "stream": True})
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["choices"][0]["finish_reason"] == "stop" and "usage" not in last  # not asked


def test_a_repeated_prefix_is_reported_as_cached(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue("one", "two", "three")
    first = stream(client, tools=TOOLS)[-1].usage
    grown = [*USER, {"role": "assistant", "content": "one"}, {"role": "user", "content": "more"}]
    second = stream(client, tools=TOOLS, messages=grown)[-1].usage
    assert first.prompt_tokens_details.cached_tokens == 0
    cached = second.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.prompt_tokens
    assert cached >= first.prompt_tokens - 1  # the whole first request was reused
    other = stream(client, messages=[{"role": "user", "content": "something else"}])[-1].usage
    assert other.prompt_tokens_details.cached_tokens < 5  # a different prompt reuses nothing
    assert fake.cache.cached == [0, cached, other.prompt_tokens_details.cached_tokens]


def test_the_prefix_cache_keeps_slots() -> None:
    def body(text: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}]}

    cache = PrefixCache(slots=2)
    assert cache.use(body("a" * 400)) == 0
    assert cache.use(body("b" * 400)) < 10  # only the JSON around the text is shared
    assert cache.use(body("a" * 800)) > 100  # the first slot still holds the a's
    one = PrefixCache(slots=1)
    one.use(body("a" * 400)), one.use(body("b" * 400))
    assert one.use(body("a" * 400)) < 10  # evicted
    assert len(one.cached) == len(one.prompt) == 3 and 0 < one.share < 1


def test_not_streamed(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(tool_calls=[{"name": "read_file", "arguments": {"path": "a"}}]))
    answer = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
    call = answer.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"path": "a"}
    assert answer.choices[0].finish_reason == "tool_calls" and answer.usage.total_tokens > 0


def test_length_finish(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(content="cut", done_reason="length"))
    assert [c.choices[0].finish_reason for c in stream(client) if c.choices][-1] == "length"


@pytest.mark.parametrize(
    ("body", "status"),
    [({"model": "nope", "messages": USER}, 404), ({"model": MODEL}, 400)],
)
def test_errors_have_the_openai_shape(fake: FakeOpenAI, body: dict[str, Any], status: int) -> None:
    with httpx.Client() as http:
        response = http.post(f"{fake.url}/chat/completions", json=body)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "code"}


def test_an_unknown_model_is_a_not_found_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="`nope` does not exist"):
        client.chat.completions.create(model="nope", messages=USER)  # type: ignore[arg-type]


def test_tools_on_a_model_without_them(client: openai.OpenAI) -> None:
    with (
        FakeOpenAI(models={"plain": {}}) as fake,
        openai.OpenAI(base_url=fake.url, api_key="x", max_retries=0) as c,
    ):
        with pytest.raises(openai.BadRequestError, match="tool choice"):
            c.chat.completions.create(model="plain", messages=USER, tools=TOOLS)  # type: ignore[arg-type]


EMBEDDER = "nomic-embed-text-v1.5"


def test_embeddings_as_floats_and_as_base64(fake: FakeOpenAI) -> None:
    fake.models[EMBEDDER] = {"capabilities": ["embedding"]}
    texts = ["parse the config file", "reduce a price"]
    with openai.OpenAI(base_url=fake.url, api_key="x", max_retries=0, timeout=10) as c:
        floats = c.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
        packed = c.embeddings.create(model=EMBEDDER, input=texts)  # the SDK asks for base64
    assert [d.index for d in floats.data] == [0, 1]
    assert [d.embedding for d in floats.data] == [embedding(t) for t in texts]
    for d, text in zip(packed.data, texts, strict=True):  # float32 on the wire
        assert d.embedding == pytest.approx(embedding(text), abs=1e-6)
    assert floats.usage.prompt_tokens > 0 and floats.model == EMBEDDER
    bodies = [r.body for r in fake.requests if r.path == "/v1/embeddings"]
    assert [b["encoding_format"] for b in bodies] == ["float", "base64"]
    with httpx.Client() as http:  # one string is one input
        one = http.post(f"{fake.url}/embeddings", json={"model": EMBEDDER, "input": "a b"})
    assert one.json()["data"][0]["embedding"] == embedding("a b")


def test_embeddings_of_a_model_the_server_does_not_embed_with(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="`nope` does not exist"):
        client.embeddings.create(model="nope", input=["x"])
    with pytest.raises(openai.APIStatusError, match="Start it with `--embeddings`") as err:
        client.embeddings.create(model=MODEL, input=["x"])  # a chat model: llama.cpp's 501
    assert err.value.status_code == 501


def test_scripted_status_and_no_reply_left(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(http_status=503, error="busy"))
    with pytest.raises(openai.InternalServerError, match="busy"):
        stream(client)
    with pytest.raises(openai.InternalServerError, match=NO_REPLY_LEFT):
        stream(client)


def test_an_error_event_mid_stream(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(content="a b c", error_mid_stream="slot crashed"))
    with pytest.raises(openai.APIError, match="slot crashed"):
        stream(client)


def test_a_dropped_connection(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(content="a b c d", drop_connection_mid_stream=True), "after")
    with pytest.raises(openai.APIConnectionError):
        stream(client)
    assert stream(client)[1].choices[0].delta.content == "after"  # the server is fine


def test_a_malformed_line(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(content="a b", malformed_line=True))
    with pytest.raises(json.JSONDecodeError):
        stream(client)


def test_a_clean_end_before_the_final_chunk(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue(Reply(content="a b c d", end_early=True))
    chunks = stream(client)  # the SDK does not notice: no finish_reason, no usage
    assert all(c.choices[0].finish_reason is None for c in chunks) and chunks[-1].usage is None


def test_a_stream_without_done(fake: FakeOpenAI) -> None:
    fake.enqueue(Reply(content="whole reply", no_done=True))
    lines = sse_lines(fake, {"model": MODEL, "messages": USER, "stream": True})
    assert "[DONE]" not in lines[-1]
    assert json.loads(lines[-1][6:])["choices"][0]["finish_reason"] == "stop"


def test_every_request_is_recorded(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.enqueue("x")
    stream(client, temperature=0.1, max_tokens=64)
    body = fake.chat_bodies()[0]
    assert (body["temperature"], body["max_tokens"], body["stream"]) == (0.1, 64, True)
    assert fake.pending == 0


def test_runs_as_a_script(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["from a script"]))
    root = Path(__file__).resolve().parent.parent
    with subprocess.Popen(
        [sys.executable, str(root / "tests" / "fake_openai.py"), "--script", str(script)],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[-1]
            with openai.OpenAI(base_url=url, api_key="x", max_retries=0) as c:
                answer = c.chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
            assert answer.choices[0].message.content == "from a script"
        finally:
            proc.terminate()
