"""The agent loop against the in-process fake provider: its exits, its nudges, the fast
verdict, tool-call ids and the typed events it reports (the HTTP fakes cover the client path)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from coder.agent import events as ev
from coder.agent import prompts
from coder.agent.loop import AgentLoop, Limits, LoopResult
from coder.agent.repair import looks_like_tool_call
from coder.errors import HostUnreachable, ModelError
from coder.models.fake import FakeProvider, call, reply
from coder.models.provider import ToolCall

TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {}}}
    for n in ("fs_read", "fs_edit", "step_complete")
]
PROSE = "I think the best approach is to carefully consider the problem at hand. " * 20


class Harness:
    def __init__(self, **limits: Any) -> None:
        self.fake = FakeProvider()
        self.events: list[ev.LoopEvent] = []
        self.ran: list[tuple[str, dict[str, Any]]] = []
        self.rejections: list[str | None] = []
        self.cancel = threading.Event()
        self.loop = AgentLoop(
            self.fake,
            tools=TOOLS,
            allowed=["fs_read", "step_complete"],
            run_tool=self.run_tool,
            verify=lambda claim: self.rejections.pop(0) if self.rejections else None,
            limits=Limits(**limits),
            cancel=self.cancel,
            on_event=self.events.append,
        )

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        self.ran.append((name, arguments))
        return f"contents of {arguments.get('path')}"

    def run(self, *replies: Any) -> LoopResult:
        self.fake.enqueue(*replies)
        return self.loop.run(
            [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        )

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def test_tool_calls_run_until_step_complete_is_accepted() -> None:
    h = Harness()
    result = h.run(call("fs_read", path="a.py"), call("step_complete", summary="read it"))
    assert (result.ok, result.summary, result.turns, result.error) == (True, "read it", 2, None)
    assert h.ran == [("fs_read", {"path": "a.py"})]
    assert result.usage.calls == 2 and h.fake.pending == 0
    assert [m["role"] for m in result.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert result.messages[-1]["content"] == "accepted"


def test_every_call_has_an_id_and_its_result_names_it() -> None:
    h = Harness()
    server_id = reply(calls=[ToolCall("fs_read", {"path": "a.py"}, id="call_server_1")])
    result = h.run(
        server_id,
        reply(calls=[ToolCall("fs_read", {"path": "b.py"}), ToolCall("fs_read", {"path": "c"})]),
        call("step_complete", summary="done"),
    )
    assistants = [m for m in result.messages if m["role"] == "assistant"]
    tools = [m for m in result.messages if m["role"] == "tool"]
    ids = [c["id"] for m in assistants for c in m["tool_calls"]]
    assert ids == ["call_server_1", "call_2_0", "call_2_1", "call_3_0"]
    assert [m["tool_call_id"] for m in tools] == ids
    # Each request starts with the previous one, byte for byte (ids included).
    first, second = h.fake.history[1].messages, h.fake.history[2].messages
    assert second[: len(first)] == first


def test_events_are_typed_and_in_order() -> None:
    h = Harness()
    h.run(
        reply("Reading it.", [ToolCall("fs_read", {"path": "app.py"})]),
        call("step_complete", summary="ok"),
    )
    kinds = [type(e).__name__ for e in h.events]
    assert kinds == [
        "TurnStarted",
        "ModelText",
        "ModelText",
        "TurnFinished",
        "ToolStarted",
        "ToolFinished",
        "TurnStarted",
        "TurnFinished",
        "ToolStarted",
        "ToolFinished",
        "LoopFinished",
    ]
    started = h.of(ev.ToolStarted)[0]
    assert (started.turn, started.label) == (1, "fs_read app.py")
    text = h.of(ev.ModelText)
    assert (text[-1].chars, text[-1].text) == (len("Reading it."), "it.")
    finished = h.of(ev.TurnFinished)
    assert finished[0].calls == ("fs_read",) and finished[1].total.calls == 2
    assert h.of(ev.LoopFinished)[0] == ev.LoopFinished(2, True, "ok", finished[1].total)


def test_prose_with_no_tool_call_is_cut_and_nudged_once_then_the_step_fails() -> None:
    """The fast verdict: the stream is cut at the prose bound, the model gets one nudge, and
    its reply to that nudge is cut at half the bound."""
    h = Harness(max_prose_chars=200)
    result = h.run(PROSE, PROSE, "never asked for")
    assert not result.ok and result.turns == 2
    assert "2 times in prose with no attempt at a tool call" in str(result.error)
    assert h.fake.pending == 1
    turns = h.of(ev.TurnFinished)
    assert [t.done_reason for t in turns] == ["cut", "cut"]
    first, second = [m["content"] for m in result.messages if m["role"] == "assistant"]
    assert 200 < len(first) < 200 + 80  # cut right after the bound
    assert 100 < len(second) < 100 + 80  # after a nudge for no attempt at all: half the bound
    assert [m["content"] for m in result.messages if m["role"] == "user"][1:] == [prompts.NUDGE_CUT]
    assert [n.reason for n in h.of(ev.Nudged)] == ["no_tool_call"]


def test_a_reply_of_short_tokens_is_cut_as_soon_as_prose_would_be() -> None:
    """A weak model's loop ("1. 1. 1. ...") takes a token per two or three characters: the
    bound also counts streamed pieces (max_prose_chars / 4, what that much prose takes)."""
    h = Harness(max_prose_chars=200)
    result = h.run("1. " * 300, PROSE)
    turns = h.of(ev.TurnFinished)
    assert [t.done_reason for t in turns] == ["cut", "cut"]
    first = [m["content"] for m in result.messages if m["role"] == "assistant"][0]
    assert first == "1. " * 51  # 50 pieces read, cut at the 51st
    assert not result.ok and "2 times in prose" in str(result.error)


def test_a_reply_stuck_in_a_loop_is_cut_even_when_tool_shaped() -> None:
    """A weak model looping inside the JSON (`"json_summary_summary ...`): tool-shaped, but its
    last 64 pieces repeat one short cycle, so it is cut past the prose bound and counts as no
    attempt; a long call of a known tool, however repetitive its start, is read to its end."""
    looping = '```json\n{"name": "fs_read", "json": "' + "summary " * 200
    h = Harness(max_prose_chars=200)
    result = h.run(looping, looping)
    assert [t.done_reason for t in h.of(ev.TurnFinished)] == ["cut", "cut"]
    first = [m["content"] for m in result.messages if m["role"] == "assistant"][0]
    assert len(first.split()) < 70  # cut once the loop filled 64 pieces past the bound
    assert not result.ok and "2 times in prose with no attempt" in str(result.error)
    path = " ".join(f"dir{i}" for i in range(100)) + " x.py"
    long_call = '{"name": "fs_read", "arguments": {"path": "' + path + '"}}'
    h = Harness(max_prose_chars=200)
    result = h.run(long_call, call("step_complete", summary="ok"))
    assert result.ok and h.ran == [("fs_read", {"path": path})]


def test_code_defining_a_tool_is_prose_and_calling_one_is_an_attempt() -> None:
    """`fs_read("a.py")` is an attempt at a call, read on; a code answer that defines a
    function named like a tool (`def step_complete(...)`, as a weak model wrote) is prose."""
    known = [t["function"]["name"] for t in TOOLS]
    assert looks_like_tool_call('I will run fs_read("a.py") first.', known)
    assert not looks_like_tool_call("```python\ndef step_complete(output_file):\n", known)
    assert not looks_like_tool_call("function fs_edit(path) {", known)
    # JSON inside a block of code in a language is code, not a call; in a json block, it is
    python = '```python\nsteps = [\n    {"name": "s1", "kind": "analyze"'
    assert not looks_like_tool_call(python, known)
    assert looks_like_tool_call(python + '\n```\nNow: {"name": "fs_read"', known)
    assert looks_like_tool_call('```json\n{"name": "fs_read"', known)
    h = Harness(max_prose_chars=200)
    code = "Here is how:\n```python\ndef step_complete(output_file, output_dir):\n" + PROSE
    result = h.run(code, code)
    assert [t.done_reason for t in h.of(ev.TurnFinished)] == ["cut", "cut"]
    assert not result.ok and "2 times in prose with no attempt" in str(result.error)


def test_short_prose_is_not_cut_but_counts_as_no_attempt() -> None:
    h = Harness(max_prose_chars=200)
    result = h.run("All done, I believe.", "Yes, it is done.")
    assert [t.done_reason for t in h.of(ev.TurnFinished)] == ["stop", "stop"]
    assert not result.ok and "no attempt at a tool call" in str(result.error)
    assert prompts.NUDGE_NO_TOOL in [m["content"] for m in result.messages]


def test_a_model_that_tries_the_tool_format_gets_more_nudges() -> None:
    """Malformed tool-call text is an attempt: not cut, nudged up to max_nudges."""
    broken = '{"name": "fs_read", "arguments": {"path": ' + "x" * 300  # never closed
    h = Harness(max_prose_chars=100, max_nudges=3)
    result = h.run(broken, broken, broken, broken)
    assert [t.done_reason for t in h.of(ev.TurnFinished)] == ["stop"] * 4
    assert "4 times without a usable tool call" in str(result.error)
    assert h.fake.pending == 0


def test_tool_shaped_text_is_read_to_the_end() -> None:
    h = Harness(max_prose_chars=50)
    shaped = reply("Sure: <tool_call>" + "x" * 200, [ToolCall("fs_read", {"path": "a"})])
    result = h.run(shaped, call("step_complete", summary="ok"))
    assert result.ok and h.ran == [("fs_read", {"path": "a"})]
    assert h.of(ev.TurnFinished)[0].done_reason == "stop"


def test_calls_written_as_json_text_are_recovered_and_get_ids() -> None:
    h = Harness(max_prose_chars=100)
    text = 'I will read it.\n```json\n{"name": "fs_read", "arguments": {"path": "a.py"}}\n```'
    result = h.run(text, call("step_complete", summary="ok"))
    assert result.ok and h.ran == [("fs_read", {"path": "a.py"})]
    assert result.messages[2]["tool_calls"][0]["id"] == "call_1_0"


def test_a_repeated_call_is_nudged_then_stops_the_step() -> None:
    h = Harness()
    same = call("fs_read", path="a.py")
    result = h.run(same, same, same)
    assert not result.ok and "repeated the same fs_read call 3 times" in str(result.error)
    assert [n.reason for n in h.of(ev.Nudged)] == ["repeated_call"]
    assert len(h.ran) == 1


def test_a_tool_not_allowed_in_the_step_is_answered_not_run() -> None:
    h = Harness()
    result = h.run(call("fs_edit", path="a.py"), call("step_complete", summary="ok"))
    assert result.ok and h.ran == []
    assert "fs_edit is not available in this step" in result.messages[3]["content"]


def test_a_rejected_claim_goes_back_to_the_model() -> None:
    h = Harness()
    h.rejections = ["files_changed lists x.py, which did not change"]
    result = h.run(call("step_complete", summary="a"), call("step_complete", summary="b"))
    assert result.ok and result.summary == "b"
    assert result.messages[3]["content"].startswith("rejected: files_changed lists x.py")


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"max_turns": 2}, "turn limit reached (2 model turns)"),
        ({"max_tokens": 150}, "token budget exhausted"),
        ({"max_seconds": 0}, "time limit reached"),
    ],
)
def test_limits_end_the_loop_with_their_message(limits: dict[str, Any], expected: str) -> None:
    h = Harness(**limits)
    reads = [call("fs_read", path=f"{i}.py") for i in range(5)]
    result = h.run(*reads)
    assert not result.ok and expected in str(result.error)
    assert h.of(ev.LoopFinished)[0].reason == result.error


def test_cancel_interrupts_between_turns() -> None:
    h = Harness()
    h.cancel.set()
    result = h.run(call("fs_read", path="a.py"))
    assert (result.ok, result.error, result.turns) == (False, "interrupted", 0)


def test_a_failed_model_call_fails_the_step_and_keeps_the_usage() -> None:
    h = Harness()
    result = h.run(call("fs_read", path="a.py"), ModelError("HTTP 500 after 3 attempts"))
    assert not result.ok and result.error == "model call failed: HTTP 500 after 3 attempts"
    assert result.usage.calls == 1 and result.turns == 1


def test_an_unreachable_server_is_not_a_step_failure() -> None:
    h = Harness()
    with pytest.raises(HostUnreachable):
        h.run(HostUnreachable("cannot reach Ollama at http://x:1", endpoint="http://x:1"))


def test_a_reply_that_hit_the_output_cap_is_noted() -> None:
    h = Harness()
    capped = reply(calls=[ToolCall("fs_read", {"path": "a"})], done_reason="length")
    result = h.run(capped, call("step_complete", summary="ok"))
    assert result.ok
    assert [w.message for w in h.of(ev.ContextWarning)][0].startswith(
        "the reply hit the output cap"
    )
    assert result.notes and result.notes[0].startswith("turn 1: the reply hit the output cap")
