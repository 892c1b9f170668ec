"""OpenAIProvider against the fake OpenAI-compatible server, through the real `openai` SDK."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coder.config import api_key, load
from coder.errors import (
    EnvironmentProblem,
    HostUnreachable,
    ModelError,
    ModelMissing,
    ModelUnavailable,
    StopReply,
)
from coder.models.factory import make_provider
from coder.models.openai import OpenAIProvider, to_wire
from coder.models.provider import (
    ChatEvent,
    Done,
    Retrying,
    TextDelta,
    ToolCall,
    ToolCallEvent,
)
from tests.fake_ollama import Reply, down_url, embedding
from tests.fake_openai import MODEL, FakeOpenAI

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
MakeProvider = Callable[..., OpenAIProvider]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def make(fake: FakeOpenAI) -> Iterator[MakeProvider]:
    made: list[OpenAIProvider] = []

    def make(**kw: Any) -> OpenAIProvider:
        kw.setdefault("sleep", lambda s: None)
        provider = OpenAIProvider(kw.pop("model", MODEL), kw.pop("url", fake.url), **kw)
        made.append(provider)
        return provider

    yield make
    for p in made:
        p.close()


def test_a_streamed_turn_with_tool_calls_ids_and_events(
    fake: FakeOpenAI, make: MakeProvider
) -> None:
    fake.enqueue(
        Reply(
            content="Reading both.",
            tool_calls=[
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "read_file", "arguments": {"path": "b/c/d/e.txt"}},
            ],
        )
    )
    events: list[ChatEvent] = []
    result = make().chat(USER, tools=TOOLS, on_event=events.append)
    assert result.content == "Reading both."
    assert [(c.name, c.arguments) for c in result.tool_calls] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b/c/d/e.txt"}),
    ]
    assert all(c.id and c.id.startswith("call_") for c in result.tool_calls)
    assert result.done_reason == "stop"
    kinds = [type(e) for e in events]
    assert kinds.count(ToolCallEvent) == 2 and kinds[-1] is Done and TextDelta in kinds


def test_the_request(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue("ok")
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1_0", "function": {"name": "read_file", "arguments": {"path": "a"}}}
            ],
        },
        {"role": "tool", "tool_name": "read_file", "tool_call_id": "call_1_0", "content": "text"},
    ]
    make(temperature=0.0, seed=7, max_output_tokens=512).chat(history, tools=TOOLS)
    body = fake.chat_bodies()[0]
    assert body["messages"][2]["tool_calls"] == [
        {
            "id": "call_1_0",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a"}'},
        }
    ]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1_0", "content": "text"}
    assert (body["temperature"], body["seed"], body["max_tokens"]) == (0.0, 7, 512)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == TOOLS and "response_format" not in body


def test_results_without_ids_answer_the_latest_call_to_their_tool() -> None:
    """Transcripts recorded before ids were kept still convert."""
    wire = to_wire(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
            },
            {"role": "tool", "tool_name": "f", "content": "r"},
        ]
    )
    assert wire[1]["tool_call_id"] == wire[0]["tool_calls"][0]["id"]


def test_structured_output(fake: FakeOpenAI, make: MakeProvider) -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    fake.enqueue('{"title": "x"}', "{}")
    provider = make()
    assert provider.chat(USER, format=schema).content == '{"title": "x"}'
    provider.chat(USER, format="json")
    first, second = fake.chat_bodies()
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema},
    }
    assert second["response_format"] == {"type": "json_object"}


def test_usage_with_the_servers_cache_figures(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue(Reply(content="one", eval_count=10), Reply(content="two", eval_count=20))
    provider = make()
    first = provider.chat(USER, tools=TOOLS).usage
    grown = [*USER, {"role": "assistant", "content": "one"}, {"role": "user", "content": "more"}]
    second = provider.chat(grown, tools=TOOLS).usage
    assert (first.calls, first.cache_reports, first.cached_tokens) == (1, 1, 0)
    assert first.prompt_tokens == fake.cache.prompt[0] and first.eval_tokens == 10
    assert second.cached_tokens == fake.cache.cached[1] > 0
    assert second.prompt_s == pytest.approx(
        (fake.cache.prompt[1] - fake.cache.cached[1]) * 0.25 / 1000
    )
    assert second.eval_s == pytest.approx(20 * 20 / 1000)  # llama.cpp's timings
    total = first + second
    assert total.cache_reports == 2 and total.cached_tokens == second.cached_tokens


def test_a_reply_that_hit_max_tokens(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue(Reply(content="long", done_reason="length"))
    assert make().chat(USER).done_reason == "length"


@pytest.mark.parametrize(
    "fault",
    [
        Reply(http_status=503, error="busy"),
        Reply(http_status=429, error="slow down"),
        Reply(content="a b c", error_mid_stream="slot crashed"),
        Reply(content="a b c d", drop_connection_mid_stream=True),
        Reply(content="a b c d", end_early=True),
        Reply(content="a b", malformed_line=True),
    ],
    ids=["503", "429", "error-event", "dropped", "ended-early", "malformed"],
)
def test_transient_failures_are_retried(fake: FakeOpenAI, make: MakeProvider, fault: Reply) -> None:
    fake.enqueue(fault, "fine")
    events: list[ChatEvent] = []
    slept: list[float] = []
    result = make(sleep=slept.append).chat(USER, on_event=events.append)
    assert result.content == "fine" and slept == [0.5]
    retry = next(e for e in events if isinstance(e, Retrying))
    assert retry.attempt == 1 and retry.delay_s == 0.5


def test_a_stream_without_done_is_complete(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue(Reply(content="whole reply", no_done=True), "next")
    provider = make()
    assert provider.chat(USER).content == "whole reply"
    assert provider.chat(USER).content == "next"
    assert fake.pending == 0


def test_retries_run_out(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue(*[Reply(http_status=500, error="boom")] * 3)
    with pytest.raises(ModelError) as err:
        make().chat(USER)
    assert "failed after 3 attempt(s): HTTP 500: boom" in err.value.message


def test_an_unreachable_server_names_the_url() -> None:
    url = down_url() + "/v1"
    with OpenAIProvider(MODEL, url) as provider, pytest.raises(HostUnreachable) as err:
        provider.chat(USER)
    assert url in err.value.message and err.value.endpoint == url
    assert "base_url" in str(err.value.hint)


def test_a_model_the_server_does_not_serve(fake: FakeOpenAI, make: MakeProvider) -> None:
    with pytest.raises(ModelMissing) as err:
        make(model="llama9-70b").probe()
    assert f"it serves: {MODEL}" in err.value.message and "set model" in str(err.value.hint)
    with pytest.raises(ModelMissing):
        make(model="llama9-70b").chat(USER)  # chat's 404 says the same


def test_tools_refused_by_the_server(make: MakeProvider) -> None:
    with FakeOpenAI(models={"plain": {}}) as fake, pytest.raises(ModelError) as err:
        make(model="plain", url=fake.url).chat(USER, tools=TOOLS)
    assert "tool choice" in err.value.message and "--jinja" in str(err.value.hint)


def test_a_refused_api_key(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue(Reply(http_status=401, error="invalid api key"))
    with pytest.raises(ModelUnavailable) as err:
        make().chat(USER)
    assert "refused the API key" in err.value.message and "api_key_env" in str(err.value.hint)


def test_probe_reads_the_served_context(fake: FakeOpenAI, make: MakeProvider) -> None:
    facts = make().warm_up()
    assert (facts.provider, facts.model, facts.endpoint) == ("openai", MODEL, fake.url)
    assert facts.context_length == 32768 and facts.num_ctx == 32768
    assert facts.version == "b9999-fake"
    assert make(num_ctx=8192).probe().num_ctx == 8192  # the config wins
    assert fake.chat_bodies() == []  # nothing generated


def test_a_cut_reply_closes_the_stream(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.enqueue(" ".join(["word"] * 50), "after")
    seen: list[str] = []

    def stop_early(event: ChatEvent) -> None:
        if isinstance(event, TextDelta):
            seen.append(event.text)
            if len(seen) == 3:
                raise StopReply

    provider = make()
    result = provider.chat(USER, on_event=stop_early)
    assert (result.done_reason, result.content) == ("cut", "".join(seen))
    assert result.usage.calls == 1 and result.usage.eval_tokens > 0
    assert provider.chat(USER).content == "after"  # the connection was released cleanly


@pytest.mark.parametrize("llama_cpp", [True, False], ids=["llama.cpp", "elsewhere"])
def test_a_cut_reply_records_what_the_server_said_of_the_prompt(llama_cpp: bool) -> None:
    """llama.cpp (it has /props) is asked for its timings on every chunk, so a reply cut after
    a few words still records the prompt's tokens, cache and time; a server that reports only
    at the end leaves the call "not reported" (no prompt tokens, no cache report), which the
    run's cache share leaves out instead of counting 0 cached tokens."""
    from coder.models.provider import cache_share

    with FakeOpenAI(llama_cpp=llama_cpp) as fake:
        fake.enqueue(" ".join(["word"] * 50), " ".join(["word"] * 50))
        provider = OpenAIProvider(MODEL, fake.url, api_key="x", sleep=lambda s: None)
        provider.warm_up()
        words = 0

        def stop_early(event: ChatEvent) -> None:
            nonlocal words
            if isinstance(event, TextDelta):
                words += 1
                if words == 3:
                    raise StopReply

        first = provider.chat(USER, on_event=stop_early)
        words = 0
        second = provider.chat(USER, on_event=stop_early)
        provider.close()
        asked = [body.get("timings_per_token") for body in fake.chat_bodies()]
    assert first.done_reason == second.done_reason == "cut"
    usage = first.usage + second.usage
    if llama_cpp:
        assert asked == [True, True]
        assert first.usage.prompt_tokens > 0 and first.usage.cache_reports == 1
        assert first.usage.eval_tokens == 3 and first.usage.prompt_s > 0
        assert second.usage.cached_tokens > 0  # the same prompt again: served from the cache
        assert cache_share(usage) == second.usage.cached_tokens / usage.prompt_tokens
    else:
        assert asked == [None, None]
        assert (usage.prompt_tokens, usage.cached_tokens, usage.cache_reports) == (0, 0, 0)
        assert cache_share(usage) is None  # not reported, not "0% reuse"


def test_arguments_that_are_not_json_come_back_as_text(
    fake: FakeOpenAI, make: MakeProvider
) -> None:
    # The fake sends valid JSON; a server's broken arguments are simulated at the assembler.
    from coder.models.streaming import _assemble, _Partial

    calls, text = _assemble(
        {0: _Partial("id1", "read_file", ['{"path": "a"']), 1: _Partial("id2", "f", ["{}"])}
    )
    assert calls == [ToolCall("f", {}, "id2")]
    assert text == '\n{"name": "read_file", "arguments": {"path": "a"}'


def test_the_api_key_comes_from_the_named_variable(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load(
        tmp_path,
        flags={"provider": "openai", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "MY_KEY"},
    )
    with pytest.raises(EnvironmentProblem, match="api_key_env names MY_KEY, which is not set"):
        make_provider(cfg, "http://127.0.0.1:1/v1")
    assert api_key(cfg, {"MY_KEY": "sk-123"}) == "sk-123"


def test_importing_the_provider_does_not_import_openai() -> None:
    code = "import sys, coder.models.openai, coder.models.factory; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


EMBEDDER = "nomic-embed-text-v1.5"


def test_embed_through_v1_embeddings(fake: FakeOpenAI, make: MakeProvider) -> None:
    fake.models[EMBEDDER] = {"capabilities": ["embedding"]}
    texts = ["parse the config file", "reduce a price", "parse the config"]
    vectors = make(model=EMBEDDER).embed(texts)
    assert vectors == [embedding(t) for t in texts]
    (body,) = [r.body for r in fake.requests if r.path == "/v1/embeddings"]
    assert body == {"model": EMBEDDER, "input": texts, "encoding_format": "float"}
    assert make(model=EMBEDDER).embed([]) == []  # nothing to ask


def test_embed_errors_read_as_chats_do(fake: FakeOpenAI, make: MakeProvider) -> None:
    with pytest.raises(ModelMissing, match="'nope' is not available at"):
        make(model="nope").embed(["x"])
    # a server started without --embeddings answers 501: not retried, and the fix is named
    with pytest.raises(ModelError) as err:
        make().embed(["x"])
    assert "does not support this" in err.value.message and "--embeddings" in str(err.value.hint)
    assert len([r for r in fake.requests if r.path == "/v1/embeddings"]) == 2
    url = down_url() + "/v1"
    with OpenAIProvider(EMBEDDER, url) as provider, pytest.raises(HostUnreachable) as down:
        provider.embed(["x"])
    assert url in down.value.message


@pytest.mark.parametrize("llama_cpp", [True, False], ids=["llama.cpp", "elsewhere"])
def test_the_slots_the_server_has_and_the_slot_each_request_names(llama_cpp: bool) -> None:
    """llama.cpp says how many requests it serves at once (`total_slots`) and lets a request
    name its slot (`id_slot`, with `cache_prompt`); elsewhere neither is sent, and the
    config's `slots` is what there is."""
    from coder.models.router import Router

    with FakeOpenAI(llama_cpp=llama_cpp, slots=3) as fake:
        fake.enqueue("one", "two", "three")
        router = Router(lambda e, m: OpenAIProvider(m, e, api_key="x"), [fake.url], MODEL)
        assert router.warm_up().slots == (3 if llama_cpp else None)
        first, second = router.for_step("s1"), router.for_step("s2")
        first.chat(USER), second.chat(USER), first.chat(USER)  # each keeps to its own slot
        router.close()
        bodies = fake.chat_bodies()
        declared = OpenAIProvider(MODEL, fake.url, api_key="x", slots=2)
        assert declared.warm_up().slots == 2  # the config's word wins
        declared.close()
    if llama_cpp:
        assert [b["id_slot"] for b in bodies] == [0, 1, 0]
        assert all(b["cache_prompt"] is True for b in bodies)
        assert [s.slot for s in fake.cache.spans] == [0, 1, 0]  # where the server served them
    else:
        assert not any("id_slot" in b or "cache_prompt" in b for b in bodies)
