"""OllamaProvider against the fake Ollama server, through the real `ollama` client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coder.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    ModelError,
    ModelStalled,
    ModelUnavailable,
)
from coder.models.ollama import OllamaProvider, normalize_host
from coder.models.provider import (
    ChatEvent,
    ChatResult,
    Done,
    ModelProvider,
    Retrying,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from tests.fake_ollama import (
    LOAD_NS,
    NS_PER_EVAL_TOKEN,
    NS_PER_PROMPT_TOKEN,
    FakeOllama,
    Reply,
    down_url,
    embedding,
)

MODEL = "qwen2.5-coder:7b"
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
SMALL = {"tiny:1b": {"context_length": 8192, "capabilities": ["completion"], "arch": "llama"}}

MakeProvider = Callable[..., OllamaProvider]


@pytest.fixture
def fake() -> Iterator[FakeOllama]:
    with FakeOllama(
        models={
            **SMALL,
            MODEL: {
                "context_length": 32768,
                "arch": "qwen2",
                "capabilities": ["completion", "tools"],
            },
        }
    ) as server:
        yield server


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make(fake: FakeOllama, sleeps: list[float]) -> Iterator[MakeProvider]:
    """Factory: a provider on the fake (sleep recorded, not slept); all closed at teardown."""
    made: list[OllamaProvider] = []

    def make(model: str = MODEL, host: str | None = None, **kw: Any) -> OllamaProvider:
        provider = OllamaProvider(model, host or fake.url, sleep=sleeps.append, **kw)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.close()


def collect(provider: OllamaProvider, **kw: Any) -> tuple[ChatResult, list[ChatEvent]]:
    events: list[ChatEvent] = []
    result = provider.chat(kw.pop("messages", USER), on_event=events.append, **kw)
    return result, events


# -- options sent ---------------------------------------------------------------------------


def test_is_a_model_provider(make: MakeProvider) -> None:
    provider: ModelProvider = make()
    assert provider.model == MODEL


def test_configured_num_ctx_and_options_in_every_request(
    fake: FakeOllama, make: MakeProvider
) -> None:
    fake.enqueue("one", "two")
    provider = make(num_ctx=8192, temperature=0.0, seed=7, keep_alive="1h")
    provider.warm_up()
    provider.chat(USER)
    provider.chat(USER)
    bodies = fake.chat_bodies()
    assert len(bodies) == 3  # the load, then two turns
    for body in bodies:
        assert body["options"] == {"num_ctx": 8192, "temperature": 0.0, "seed": 7}
        assert body["keep_alive"] == "1h"
    assert [b["stream"] for b in bodies[1:]] == [True, True]


def test_num_ctx_from_show_capped_by_max(fake: FakeOllama, make: MakeProvider) -> None:
    fake.enqueue("capped", "trained")
    capped = make(max_num_ctx=16384)
    assert capped.context_length() == 16384
    capped.chat(USER)
    trained = make("tiny:1b")  # trained 8192, below the default cap
    trained.chat(USER)
    assert [b["options"]["num_ctx"] for b in fake.chat_bodies()] == [16384, 8192]
    assert [b["options"]["temperature"] for b in fake.chat_bodies()] == [0.2, 0.2]
    assert "seed" not in fake.chat_bodies()[0]["options"]
    assert [r.path for r in fake.requests].count("/api/show") == 2  # once per provider


# -- streaming and results ------------------------------------------------------------------


def test_streams_events_and_accumulates_the_result(fake: FakeOllama, make: MakeProvider) -> None:
    fake.enqueue(
        Reply(
            content="Reading both files.",
            thinking="Two reads.",
            tool_calls=[
                {"name": "read_file", "arguments": {"path": "a.py"}},
                {"name": "read_file", "arguments": {"path": "b.py"}},
            ],
        )
    )
    result, events = collect(make(), tools=TOOLS)

    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(texts) > 1 and "".join(texts) == result.content == "Reading both files."
    calls = (ToolCall("read_file", {"path": "a.py"}), ToolCall("read_file", {"path": "b.py"}))
    assert [e.call for e in events if isinstance(e, ToolCallEvent)] == list(calls)
    assert result.tool_calls == calls
    assert result.thinking == "Two reads." and result.done_reason == "stop"
    assert events[-1] == Done(result)
    assert fake.chat_bodies()[0]["tools"][0]["function"]["name"] == "read_file"


def test_usage_is_converted_to_seconds(fake: FakeOllama, make: MakeProvider) -> None:
    fake.enqueue(
        Reply(content="x", prompt_eval_count=1000, eval_count=100),
        Reply(content="y", prompt_eval_count=10, eval_count=5),
    )
    provider = make(num_ctx=4096)
    cold = provider.chat(USER).usage
    warm = provider.chat(USER).usage

    assert (cold.prompt_tokens, cold.eval_tokens, cold.calls) == (1000, 100, 1)
    assert cold.prompt_s == pytest.approx(1000 * NS_PER_PROMPT_TOKEN / 1e9)
    assert cold.eval_s == pytest.approx(100 * NS_PER_EVAL_TOKEN / 1e9)
    assert cold.load_s == pytest.approx(LOAD_NS / 1e9)
    assert cold.total_s == pytest.approx(cold.prompt_s + cold.eval_s + cold.load_s)
    assert cold.tokens_per_s == pytest.approx(1e9 / NS_PER_EVAL_TOKEN)
    assert warm.load_s == 0  # omitted by the server once loaded: None -> 0
    total = cold + warm
    assert (total.prompt_tokens, total.calls) == (1010, 2)
    assert total.as_dict()["tokens_per_s"] == pytest.approx(total.tokens_per_s)


def test_default_prompt_tokens_follow_the_request_size(
    fake: FakeOllama, make: MakeProvider
) -> None:
    fake.enqueue("a", "b")
    provider = make(num_ctx=4096)
    small = provider.chat(USER).usage.prompt_tokens
    large = provider.chat([{"role": "user", "content": "y" * 4000}]).usage.prompt_tokens
    assert 0 < small < large


def test_assistant_message_round_trips(fake: FakeOllama, make: MakeProvider) -> None:
    fake.enqueue(
        Reply(content="", tool_calls=[{"name": "read_file", "arguments": {"path": "a"}}]), "done"
    )
    provider = make(num_ctx=4096)
    first = provider.chat(USER, tools=TOOLS)
    history = [
        *USER,
        first.as_message(),
        {"role": "tool", "tool_name": "read_file", "content": "file text"},
    ]
    provider.chat(history, tools=TOOLS)
    sent = fake.chat_bodies()[1]["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": {"path": "a"}}
    assert sent[2] == {"role": "tool", "tool_name": "read_file", "content": "file text"}


def test_structured_output_format_is_sent(fake: FakeOllama, make: MakeProvider) -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    fake.enqueue('{"title": "x"}')
    assert json.loads(make(num_ctx=4096).chat(USER, format=schema).content) == {"title": "x"}
    assert fake.chat_bodies()[0]["format"] == schema


# -- empty replies and retries --------------------------------------------------------------


def test_empty_reply_is_asked_again_once(fake: FakeOllama, make: MakeProvider) -> None:
    fake.enqueue("", "second try")
    result = make(num_ctx=4096).chat(USER)
    assert result.content == "second try" and result.usage.calls == 2


def test_empty_reply_twice_is_accepted(
    fake: FakeOllama, make: MakeProvider, sleeps: list[float]
) -> None:
    fake.enqueue(Reply(content=" ", thinking="hmm"), "", "never asked")
    result = make(num_ctx=4096).chat(USER)
    assert result.content == "" and not result.tool_calls and result.usage.calls == 2
    assert fake.pending == 1 and sleeps == []


def test_server_error_then_success_is_retried(
    fake: FakeOllama, make: MakeProvider, sleeps: list[float]
) -> None:
    fake.enqueue(Reply(http_status=500, error="llama runner process has terminated"), "ok")
    result, events = collect(make(num_ctx=4096))
    assert result.content == "ok" and sleeps == [0.5]
    retry = next(e for e in events if isinstance(e, Retrying))
    assert retry.attempt == 1 and retry.delay_s == 0.5
    assert "500" in retry.reason and "llama runner process has terminated" in retry.reason


def test_persistent_server_error_fails_after_retries(
    fake: FakeOllama, make: MakeProvider, sleeps: list[float]
) -> None:
    fake.enqueue(*[Reply(http_status=503, error="server busy")] * 5)
    with pytest.raises(ModelError) as err:
        make(num_ctx=4096, retries=3, backoff=0.25).chat(USER)
    assert err.value.exit_code == EXIT_FAILED
    assert "3 attempt" in err.value.message and "server busy" in err.value.message
    assert len(fake.chat_bodies()) == 3 and sleeps == [0.25, 0.5]


def test_backoff_is_bounded(fake: FakeOllama, make: MakeProvider, sleeps: list[float]) -> None:
    fake.enqueue(*[Reply(http_status=500)] * 9, "finally")
    assert make(num_ctx=4096, retries=10, backoff=1).chat(USER).content == "finally"
    assert sleeps == [1, 2, 4, 8, 16, 30, 30, 30, 30]


@pytest.mark.parametrize(
    "fault",
    [
        {"error_mid_stream": "an error was encountered while running the model"},
        {"drop_connection_mid_stream": True},
        {"malformed_line": True},
    ],
)
def test_broken_streams_are_retried(
    fake: FakeOllama, make: MakeProvider, sleeps: list[float], fault: dict[str, Any]
) -> None:
    fake.enqueue(Reply(content="lost words", **fault), "Recovered answer.")
    result, events = collect(make(num_ctx=4096))
    assert result.content == "Recovered answer." and sleeps == [0.5]
    kinds = [type(e).__name__ for e in events]
    # The abandoned attempt's delta came first; Retrying tells the caller to discard it.
    assert kinds[:2] == ["TextDelta", "Retrying"] and kinds[-1] == "Done"
    if "error_mid_stream" in fault:
        assert "error was encountered" in events[1].reason  # type: ignore[union-attr]


def test_timeout_is_retried(fake: FakeOllama, make: MakeProvider, sleeps: list[float]) -> None:
    fake.enqueue(Reply(content="too late", delay_s=0.5), "in time")
    provider = make(num_ctx=4096, request_timeout=0.15, first_request_timeout=0.15)
    assert provider.chat(USER).content == "in time" and sleeps == [0.5]


def test_first_request_gets_the_longer_timeout(fake: FakeOllama, make: MakeProvider) -> None:
    fake.enqueue(Reply(content="cold load", delay_s=0.3), Reply(content="warm", delay_s=0.3))
    provider = make(num_ctx=4096, request_timeout=0.1, first_request_timeout=5, retries=1)
    assert provider.chat(USER).content == "cold load"
    with pytest.raises(ModelStalled, match="timed out"):
        provider.chat(USER)


# -- fatal failures -------------------------------------------------------------------------


def test_host_down_is_model_unavailable(make: MakeProvider, sleeps: list[float]) -> None:
    url = down_url()
    calls: list[Callable[[OllamaProvider], object]] = [
        lambda p: p.chat(USER),
        lambda p: p.show_facts(),
        lambda p: p.warm_up(),
    ]
    for call in calls:
        with pytest.raises(ModelUnavailable) as err:
            call(make(host=url, num_ctx=4096))
        assert err.value.exit_code == EXIT_ENVIRONMENT
        assert err.value.message.startswith(f"cannot reach Ollama at {url}: ")
        assert "refused" in err.value.message.lower()
        assert "ollama serve" in (err.value.hint or "")
    assert sleeps == []


def test_missing_model_names_the_pull_command(fake: FakeOllama, make: MakeProvider) -> None:
    for provider in (make("llama9:70b"), make("llama9:70b", num_ctx=4096)):  # show, then chat
        with pytest.raises(ModelUnavailable) as err:
            provider.chat(USER)
        assert "llama9:70b" in err.value.message
        assert err.value.hint == f"run `OLLAMA_HOST={fake.url} ollama pull llama9:70b`"
    assert fake.chat_bodies()[0]["model"] == "llama9:70b"


def test_embed_through_api_embed(fake: FakeOllama, make: MakeProvider) -> None:
    texts = ["parse the config file", "reduce a price"]
    assert make("tiny:1b").embed(texts) == [embedding(t) for t in texts]
    (body,) = [r.body for r in fake.requests if r.path == "/api/embed"]
    assert body["model"] == "tiny:1b" and body["input"] == texts
    assert "options" not in body  # the chat's num_ctx would reload the model
    with pytest.raises(ModelUnavailable) as err:  # not pulled: the same fix as for a chat
        make("nomic-embed-text").embed(["x"])
    assert err.value.hint == f"run `OLLAMA_HOST={fake.url} ollama pull nomic-embed-text`"
    url = down_url()
    with pytest.raises(ModelUnavailable, match=f"cannot reach Ollama at {url}"):
        make("tiny:1b", host=url).embed(["x"])


def test_tools_refused_fails_at_once(
    fake: FakeOllama, make: MakeProvider, sleeps: list[float]
) -> None:
    with pytest.raises(ModelError) as err:
        make("tiny:1b").chat(USER, tools=TOOLS)
    assert "registry.ollama.ai/library/tiny:1b does not support tools" in err.value.message
    assert "tools" in (err.value.hint or "")
    assert len(fake.chat_bodies()) == 1 and sleeps == []


def test_callback_exceptions_propagate_unretried(fake: FakeOllama, make: MakeProvider) -> None:
    class Stop(Exception):
        pass

    def stop(event: ChatEvent) -> None:
        raise Stop

    fake.enqueue("some words here", "ok")
    provider = make(num_ctx=4096)
    with pytest.raises(Stop):
        provider.chat(USER, on_event=stop)
    assert provider.chat(USER).content == "ok"  # the connection was released cleanly


# -- facts ----------------------------------------------------------------------------------


def test_warm_up_loads_the_model_and_reports_facts(fake: FakeOllama, make: MakeProvider) -> None:
    facts = make(max_num_ctx=16384).warm_up()
    assert facts.as_dict() == {
        "provider": "ollama",
        "model": MODEL,
        "endpoint": fake.url,
        "version": "0.33.0",
        "arch": "qwen2",
        "context_length": 32768,
        "num_ctx": 16384,
        "allocated_ctx": 16384,
        "capabilities": ["completion", "tools"],
    }
    load = fake.chat_bodies()[0]
    assert load["messages"] == [] and load["options"]["num_ctx"] == 16384
    assert [r.path for r in fake.requests] == ["/api/version", "/api/show", "/api/chat", "/api/ps"]


def test_warm_up_reports_what_the_server_allocated() -> None:
    """/api/ps can differ from what we asked (e.g. a server-side cap); a bare name is :latest."""
    models = {"big:latest": {"context_length": 131072, "allocated_ctx": 8192, "arch": "llama"}}
    with FakeOllama(models=models) as fake, OllamaProvider("big", fake.url) as provider:
        facts = provider.warm_up()
    assert (facts.context_length, facts.num_ctx, facts.allocated_ctx) == (
        131072,
        32768,
        8192,
    )


def test_list_models(fake: FakeOllama, make: MakeProvider) -> None:
    assert sorted(make().list_models()) == sorted(["tiny:1b", MODEL])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("", "http://127.0.0.1:11434"),
        ("127.0.0.1:5000", "http://127.0.0.1:5000"),
        (":5000", "http://127.0.0.1:5000"),
        ("gpu-box", "http://gpu-box:11434"),
        ("http://gpu-box/", "http://gpu-box:80"),
        ("https://gpu-box:8443", "https://gpu-box:8443"),
    ],
)
def test_normalize_host(given: str, expected: str) -> None:
    assert normalize_host(given) == expected


def test_usage_values() -> None:
    one = Usage(prompt_tokens=5, eval_tokens=10, eval_s=0.5, calls=1)
    assert one + one == Usage(prompt_tokens=10, eval_tokens=20, eval_s=1.0, calls=2)
    assert Usage().tokens_per_s == 0.0 and one.tokens_per_s == 20.0
    assert one.as_dict() == {
        "prompt_tokens": 5,
        "eval_tokens": 10,
        "prompt_s": 0,
        "eval_s": 0.5,
        "load_s": 0,
        "total_s": 0,
        "calls": 1,
        "cached_tokens": 0,
        "cache_reports": 0,
        "tokens_per_s": 20.0,
    }


def test_importing_the_provider_does_not_import_ollama() -> None:
    code = (
        "import sys, coder.models.ollama, coder.models.provider; "
        "print(sorted(m for m in ('ollama', 'httpx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
