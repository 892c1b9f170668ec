"""A stalled model server (it takes the request and never answers, or answers the headers and
stops) cannot hold a step: a request ends with the step's time and with the run's stop
(coder.models.bounds), its connection closed so the server sees its client go, and retries
never start past the deadline; a request that times out on every attempt is the server's
problem (ModelStalled, exit 3), not the step's. Both providers, over real HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coder.errors import EXIT_ENVIRONMENT, Abandoned, ModelStalled
from coder.models import bounds
from coder.models.ollama import OllamaProvider
from coder.models.openai import OpenAIProvider
from coder.models.provider import ModelProvider
from tests.fake_ollama import FakeOllama, FakeServer, Reply
from tests.fake_openai import MODEL as OPENAI_MODEL
from tests.fake_openai import FakeOpenAI
from tests.helpers import wait_for

USER = [{"role": "user", "content": "hi"}]
SLACK_S = 0.5  # how late past its bound a request may end, on a loaded machine


class Served:
    """A fake server and a way to open a provider for it."""

    def __init__(self, fake: FakeServer, open_provider: Callable[..., ModelProvider]) -> None:
        self.fake, self.open = fake, open_provider


@pytest.fixture(params=["ollama", "openai"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    made: list[ModelProvider] = []

    def ollama(fake: FakeServer, **kw: Any) -> ModelProvider:
        kw.setdefault("first_request_timeout", kw.get("request_timeout", 600))
        return OllamaProvider("qwen2.5-coder:7b", fake.root, num_ctx=4096, **kw)

    def openai(fake: FakeServer, **kw: Any) -> ModelProvider:
        return OpenAIProvider(OPENAI_MODEL, f"{fake.root}/v1", num_ctx=4096, **kw)

    kind = {"ollama": (FakeOllama, ollama), "openai": (FakeOpenAI, openai)}[request.param]
    with kind[0]() as fake:

        def open_provider(**kw: Any) -> ModelProvider:
            made.append(kind[1](fake, **kw))
            return made[-1]

        yield Served(fake, open_provider)
        for provider in made:
            provider.close()


def abandoned(provider: ModelProvider, **bound: Any) -> tuple[Abandoned, float]:
    """The chat's Abandoned, and when it came (time.monotonic())."""
    with bounds.within(**bound), pytest.raises(Abandoned) as caught:
        provider.chat(USER)
    return caught.value, time.monotonic()


@pytest.mark.parametrize("stall", ["answer", "stream"])
def test_a_stalled_request_ends_at_the_deadline_and_its_connection_with_it(
    served: Served, stall: str
) -> None:
    served.fake.stall = stall
    provider = served.open()  # the client's own timeout (600 s) is no help here
    deadline = time.monotonic() + 1.0
    error, ended = abandoned(provider, deadline=deadline)
    assert not error.stopped
    assert deadline <= ended < deadline + SLACK_S
    wait_for(lambda: served.fake.hangups, timeout=SLACK_S, what="the client to hang up")
    assert served.fake.hangups[0] < deadline + SLACK_S
    assert len(served.fake.stalled) == 1  # not retried


def test_a_stop_ends_a_stalled_request_at_once(served: Served) -> None:
    served.fake.stall = "answer"
    provider = served.open()
    stop, stopped_at = threading.Event(), []

    def stop_now() -> None:  # as the run's signal handler does
        stopped_at.append(time.monotonic())
        stop.set()

    threading.Timer(0.5, stop_now).start()
    error, ended = abandoned(provider, cancel=stop, deadline=time.monotonic() + 60)
    assert error.stopped and ended - stopped_at[0] < SLACK_S
    wait_for(lambda: served.fake.hangups, timeout=SLACK_S, what="the client to hang up")
    assert served.fake.hangups[0] - stopped_at[0] < SLACK_S


def test_no_retry_starts_past_the_deadline(served: Served) -> None:
    served.fake.enqueue(*[Reply(http_status=500)] * 5)
    provider = served.open(retries=5, backoff=1.0)  # the next attempt would come after 1 s
    began = time.monotonic()
    error, ended = abandoned(provider, deadline=began + 0.6)
    assert not error.stopped and ended - began < 0.6 + SLACK_S
    assert served.fake.pending == 4  # one attempt, none after the deadline


def test_a_request_that_times_out_on_every_attempt_is_the_servers_problem(
    served: Served,
) -> None:
    served.fake.stall = "answer"
    provider = served.open(request_timeout=0.3, retries=2, backoff=0.1)
    with pytest.raises(ModelStalled) as caught:
        provider.chat(USER)
    assert caught.value.exit_code == EXIT_ENVIRONMENT
    assert served.fake.root in caught.value.message and "answered none in time" in (
        caught.value.message
    )
    assert "request_timeout" in (caught.value.hint or "")
    assert len(served.fake.stalled) == 2


def test_a_slow_answer_within_the_bound_is_kept(served: Served) -> None:
    """A bound ends only what outlives it: an answer that takes a while still arrives."""
    served.fake.enqueue(Reply(content="worth the wait", delay_s=0.5))
    provider = served.open()
    with bounds.within(deadline=time.monotonic() + 30, cancel=threading.Event()):
        assert provider.chat(USER).content == "worth the wait"
    assert served.fake.hangups == []
