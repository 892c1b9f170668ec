"""Summaries when the context folds (coder.agent.summarize), through the agent loop with the
in-process fake model: the summary replaces the older turns and keeps what they held, its
request starts with the conversation the server has cached, it counts in the step's usage and
budget, and every way it can fail falls back to folding."""

from __future__ import annotations

import re
from typing import Any

import pytest

from coder.agent import events as ev
from coder.agent import summarize
from coder.agent.loop import FOLDED, AgentLoop, Limits, LoopResult
from coder.errors import ModelError
from coder.models.fake import FakeProvider, call, reply
from coder.models.provider import ChatResult, Message

TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {}}}
    for n in ("fs_read", "step_complete")
]
FACT = re.compile(r"FACT \w+: \S+")
READS = 12
FILLER = "".join(f"    line {i}: nothing to see here, keep reading\n" for i in range(8))


def page(n: int) -> str:
    """A tool result with a fact in its middle (folding keeps only a first line)."""
    return f"page {n} of the log\n{FILLER}FACT f{n}: value-{n}\n{FILLER}"


def quoting_summary(messages: list[Message]) -> str:
    """What a model that follows the summary prompt writes: the facts the turns held."""
    turns = [m for m in messages[1:] if not summarize.is_summary(m)]
    return "Facts found so far:\n" + "\n".join(
        FACT.findall("\n".join(str(m.get("content", "")) for m in turns))
    )


class SummarizingFake(FakeProvider):
    """The fake model, answering the summary request with `summary(messages)` (or raising /
    returning a scripted result) and every other request from its script."""

    def __init__(self, summary: Any = quoting_summary) -> None:
        super().__init__()
        self.summary = summary
        self.summary_requests: list[list[Message]] = []

    def chat(self, messages: list[Message], **kwargs: Any) -> ChatResult:
        if messages[-1].get("content") != summarize.PROMPT:
            return super().chat(messages, **kwargs)
        self.summary_requests.append([dict(m) for m in messages])  # type: ignore[misc]
        answer = self.summary(messages)
        if isinstance(answer, BaseException):
            raise answer
        return answer if isinstance(answer, ChatResult) else reply(answer, prompt_tokens=500)


def run(
    fake: FakeProvider, reads: int = READS, **limits: Any
) -> tuple[LoopResult, list[ev.LoopEvent]]:
    events: list[ev.LoopEvent] = []
    fake.enqueue(*[call("fs_read", path=f"p{n}") for n in range(1, reads + 1)])
    fake.enqueue(call("step_complete", summary="read the log"))
    loop = AgentLoop(
        fake,
        tools=TOOLS,
        allowed=["fs_read", "step_complete"],
        run_tool=lambda name, arguments: page(int(str(arguments["path"])[1:])),
        verify=lambda claim: None,
        limits=Limits(**{"context_tokens": 2000, "summaries": True, **limits}),
        on_event=events.append,
    )
    result = loop.run([{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}])
    assert result.ok, result.error
    return result, events


def facts_in(messages: list[Message]) -> list[str]:
    return FACT.findall("\n".join(str(m.get("content", "")) for m in messages))


ALL = [f"FACT f{n}: value-{n}" for n in range(1, READS + 1)]


def test_the_summary_replaces_the_older_turns_and_keeps_their_facts() -> None:
    fake = SummarizingFake()
    result, events = run(fake)
    last = fake.history[-1].messages  # the request that ends the step
    assert facts_in(last) == ALL
    assert not any(str(m.get("content", "")).startswith(FOLDED) for m in last)
    summaries = [m for m in last if str(m["content"]).startswith(summarize.HEAD)]
    assert summaries and all(m["role"] == "assistant" for m in summaries)
    # no two user or two assistant messages in a row (strict chat templates refuse them)
    roles = [m["role"] for m in last[1:]]
    assert not any(a == b != "tool" for a, b in zip(roles, roles[1:])), roles
    assert last[:2] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    done = [e for e in events if isinstance(e, ev.ContextSummarized)]
    assert done and all(e.replaced >= 4 and not e.reason for e in done)
    # the summary calls count in the step's usage (the fake's summaries cost 500 prompt tokens)
    turns = sum(1 for e in events if isinstance(e, ev.TurnFinished))
    assert result.usage.calls == turns + len(fake.summary_requests)


def test_the_summary_request_reuses_the_cached_conversation() -> None:
    fake = SummarizingFake()
    run(fake)
    requests = [h.messages for h in fake.history]
    for asked in fake.summary_requests:
        before = max(
            (r for r in requests if r[-1].get("content") != summarize.PROMPT and r != asked),
            key=lambda r: _common(r, asked),
        )
        # everything but the question is a prefix of a request the server already saw
        assert _common(before, asked) == len(asked) - 1
        assert asked[-1] == {"role": "user", "content": summarize.PROMPT}


def _common(a: list[Message], b: list[Message]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_without_summaries_the_folded_facts_are_lost() -> None:
    fake = SummarizingFake()
    run(fake, summaries=False)
    last = fake.history[-1].messages
    assert "FACT f1: value-1" not in facts_in(last) and set(facts_in(last)) < set(ALL)
    assert any(str(m.get("content", "")).startswith(FOLDED) for m in last)
    assert fake.summary_requests == []


@pytest.mark.parametrize(
    ("summary", "reason"),
    [
        (ModelError("the server said 500"), "the summary call failed: the server said 500"),
        ("", "the summary was empty"),
        ("x" * (summarize.MAX_CHARS + 1), "characters long"),
        (reply(calls=[call("fs_read").tool_calls[0]]), "answered the summary request with a tool"),
    ],
)
def test_a_failed_summary_falls_back_to_folding(summary: Any, reason: str) -> None:
    fake = SummarizingFake(lambda _messages: summary)
    result, events = run(fake)
    failed = [e for e in events if isinstance(e, ev.ContextSummarized)]
    assert failed and reason in failed[0].reason and all(e.replaced == 0 for e in failed)
    assert any(isinstance(e, ev.ContextCompacted) for e in events)
    last = fake.history[-1].messages
    assert any(str(m.get("content", "")).startswith(FOLDED) for m in last)
    assert not any(str(m["content"]).startswith(summarize.HEAD) for m in last)
    # a model that cannot summarise is asked once, then again only RETRY_AFTER turns later
    asked = [e.turn for e in failed]
    assert all(b - a >= summarize.Summarizer.RETRY_AFTER for a, b in zip(asked, asked[1:]))


def test_a_summary_over_the_step_budget_is_not_asked_for() -> None:
    """The fake's turns cost 100 prompt tokens each; a summary request about 1,700."""
    fake = SummarizingFake()
    run(fake, max_tokens=10**6)
    assert fake.summary_requests  # with room in the budget it is asked for
    fake = SummarizingFake()
    _, events = run(fake, max_tokens=2000)
    skipped = [e for e in events if isinstance(e, ev.ContextSummarized)]
    assert fake.summary_requests == []
    assert skipped and "token budget has" in skipped[0].reason
