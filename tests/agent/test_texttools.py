"""The text tool format in the agent loop (the in-process fake provider): what the model is
shown, what goes in the request, how a call written as text is taken and answered, the fast
verdict on text shaped like the example call, and the fallback of an unproven native choice."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from coder.agent import events as ev
from coder.agent.loop import AgentLoop, Limits, LoopResult
from coder.agent.texttools import NATIVE, NativeTools, format_for, text_tools
from coder.models.fake import FakeProvider, call, reply
from coder.models.protocol import Choice
from coder.models.provider import ToolCall
from coder.tools.registry import default_registry

TOOLS = default_registry().definitions()
SECTION = text_tools(TOOLS)


def written(name: str, before: str = "Let me look.", after: str = "", **arguments: Any) -> str:
    block = json.dumps({"name": name, "arguments": arguments})
    return f"{before}\n```json\n{block}\n```{after}"


class Harness:
    def __init__(self, tool_format: Any = SECTION, **limits: Any) -> None:
        self.fake = FakeProvider()
        self.events: list[ev.LoopEvent] = []
        self.ran: list[tuple[str, dict[str, Any]]] = []
        self.loop = AgentLoop(
            self.fake,
            tools=TOOLS,
            allowed=["fs_read", "step_complete"],
            run_tool=lambda name, args: self.ran.append((name, args)) or f"text of {args}",
            verify=lambda claim: None,
            limits=Limits(**limits),
            cancel=threading.Event(),
            on_event=self.events.append,
            tool_format=tool_format,
        )

    def run(self, *replies: Any) -> LoopResult:
        self.fake.enqueue(*replies)
        system = self.loop.format.system("RULES")
        return self.loop.run(
            [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
        )


def test_the_system_prompt_describes_each_tool_with_one_example_call() -> None:
    text = SECTION.system("RULES")
    assert text.startswith("RULES\n<tools>\n") and text.endswith("</tools>\n")
    assert text.count("```json") == 1  # one worked example, in one fenced block
    assert '{"name": "fs_read", "arguments": {"path": "README.md"}}' in text
    for tool in TOOLS:
        assert f"\n- {tool['function']['name']}(" in text
    # one line each: the parameters as a signature (`?` optional, strings untyped), the purpose
    assert (
        "- fs_read(path, offset?: integer, limit?: integer): Read a text file with line "
        "numbers, a page at a time" in text
    )
    assert "- step_complete(summary, files_changed?: array, no_change_reason?): Finish" in text
    assert "- git_status(): List the files changed" in text
    assert not [line for line in text.splitlines() if line.startswith("    ")]
    assert text_tools(TOOLS) == SECTION  # the same bytes every time: the prefix stays cached


def test_text_calls_run_and_their_results_come_back_as_user_messages() -> None:
    h = Harness()
    first = written("fs_read", after="\nResult: def main(): ...", path="a.py")
    result = h.run(first, written("step_complete", summary="read a.py"))
    assert result.ok and result.summary == "read a.py" and result.protocol == "text"
    assert h.ran == [("fs_read", {"path": "a.py"})]
    assert all(c.tools is None for c in h.fake.history)  # no `tools` in any request
    messages = result.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"] * 1 + [
        "assistant",
        "user",
    ]
    # the call as written, without the result the model invented after it
    assert messages[2] == {"role": "assistant", "content": first.split("\nResult:")[0]}
    assert messages[3] == {
        "role": "user",
        "content": "Result of fs_read (call_1_0):\ntext of {'path': 'a.py'}",
    }


def test_one_call_per_reply_is_taken() -> None:
    h = Harness()
    both = written("fs_read", path="a.py") + "\n" + written("fs_read", before="", path="b.py")
    h.run(both, written("step_complete", summary="ok"))
    assert h.ran == [("fs_read", {"path": "a.py"})]


def test_the_stream_ends_once_the_first_call_is_written() -> None:
    """What follows the call is dropped from the transcript, so it is not read (the stream is
    closed and the server stops generating it); the turn ends as a reply with a call."""
    h = Harness(max_prose_chars=100)
    invented = "\nResult: def main(): pass" + " and so on" * 100
    result = h.run(written("fs_read", after=invented, path="a.py"), written("step_complete"))
    assert result.ok and h.ran == [("fs_read", {"path": "a.py"})]
    assert result.messages[2]["content"] == written("fs_read", path="a.py")
    turns = [e for e in h.events if isinstance(e, ev.TurnFinished)]
    assert [t.done_reason for t in turns] == ["stop", "stop"]
    assert turns[0].usage.eval_tokens < 30  # the invented result was never streamed
    streamed = "".join(e.text for e in h.events if isinstance(e, ev.ModelText) and e.turn == 1)
    assert streamed.startswith(written("fs_read", path="a.py")) and "Result" not in streamed


@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ('```json\n{"name": "fs_read", "arguments": {"path": "a"}}', False),  # fence open
        ('```json\n{"name": "fs_read", "arguments": {"path": "a"}}\n``', False),
        ('```json\n{"name": "fs_read", "arguments": {"path": "a"}}\n```', True),
        ('{"name": "fs_read", "arguments": {"path": "a"}}\nNow I wait.', True),  # no fence
        ('{"name": "fs_read", "arguments": {"path": "a"}}', False),  # more may follow
        ('{"function": {"name": "fs_read", "arguments": {"path": "a"}}', False),  # inner only
        ('{"function": {"name": "fs_read", "arguments": {"path": "a"}}}\nok', True),
        ('```json\n{"name": "no_such_tool", "arguments": {}}\n```', False),
        ("Let me think about {this} first.", False),
    ],
)
def test_a_reply_is_complete_once_its_first_call_and_fence_are_written(
    text: str, complete: bool
) -> None:
    known = [t["function"]["name"] for t in TOOLS]
    assert SECTION.complete(text, known) is complete
    assert NATIVE.complete(text, known) is False  # the server parses native calls


def test_a_call_the_server_parsed_anyway_is_written_into_the_text() -> None:
    h = Harness()
    result = h.run(call("fs_read", path="a.py"), written("step_complete", summary="ok"))
    assert h.ran == [("fs_read", {"path": "a.py"})]
    assert result.messages[2]["content"] == (
        '```json\n{"name": "fs_read", "arguments": {"path": "a.py"}}\n```'
    )
    assert "tool_calls" not in result.messages[2]


def test_text_shaped_like_the_example_counts_as_an_attempt() -> None:
    """The fast verdict: a long call in the block is not cut at the prose bound (the fence is
    tool-shaped), and a broken call gets the nudges of an attempt, not one blind nudge."""
    h = Harness(max_prose_chars=100, max_nudges=3, max_blind_nudges=1)
    long = " ".join(f"x{i}" for i in range(200))  # long, not a loop (repair.looping)
    broken = f'I will write it.\n```json\n{{"name": "fs_write", "arguments": {{"content": "{long}", }}\n```'
    result = h.run(broken, broken, written("step_complete", summary="done"))
    assert result.ok
    turns = [e for e in h.events if isinstance(e, ev.TurnFinished)]
    assert [t.done_reason for t in turns] == ["stop", "stop", "stop"]
    nudge = result.messages[3]["content"]
    assert nudge.startswith("Call a tool now: one JSON object in a fenced block")


def test_prose_is_still_cut_and_the_step_fails_with_a_text_hint() -> None:
    h = Harness(max_prose_chars=100)
    result = h.run("I would rather explain the code in words. " * 10, "More words. " * 20)
    assert not result.ok
    assert "did not write a call in the format the system prompt shows" in (result.error or "")


def test_an_unproven_native_choice_goes_over_to_text_after_prose_naming_a_tool() -> None:
    unproven = format_for(Choice("native", "the server does not say", proven=False), TOOLS)
    assert isinstance(unproven, NativeTools) and unproven.fallback == SECTION
    h = Harness(tool_format=unproven)
    result = h.run(
        "I will read the file with fs_read and then finish.",
        written("fs_read", path="a.py"),
        written("step_complete", summary="done"),
    )
    assert result.ok and result.protocol == "text"
    first, second, third = h.fake.history
    assert first.tools == TOOLS and second.tools is None and third.tools is None
    assert first.messages[0]["content"] == "RULES"
    assert second.messages[0]["content"] == SECTION.system("RULES")
    (switched,) = [e for e in h.events if isinstance(e, ev.ProtocolSwitched)]
    assert (switched.turn, switched.protocol) == (1, "text")


def test_a_proven_native_choice_never_switches() -> None:
    assert format_for(Choice("native", "capabilities"), TOOLS) is NATIVE
    h = Harness(tool_format=NATIVE, max_blind_nudges=0)
    result = h.run("I will read the file with fs_read and then finish.")
    assert not result.ok and result.protocol == "native"
    assert not [e for e in h.events if isinstance(e, ev.ProtocolSwitched)]


def test_prose_without_a_tool_name_does_not_switch() -> None:
    unproven = format_for(Choice("native", "?", proven=False), TOOLS)
    h = Harness(tool_format=unproven)
    result = h.run("Sure, I can help with that.", call("step_complete", summary="done"))
    assert result.ok and result.protocol == "native"
    assert all(c.tools == TOOLS for c in h.fake.history)


def test_text_results_are_folded_when_the_context_runs_out() -> None:
    h = Harness(context_tokens=3000)
    big = {"path": "big.py"}
    h.loop.run_tool = lambda name, args: "x" * 6000  # each result about 1500 tokens
    reads = [written("fs_read", before=f"read {i}", **big, offset=i) for i in range(1, 5)]
    result = h.run(*reads, written("step_complete", summary="done"))
    assert result.ok
    folded = [m for m in result.messages if m["content"].startswith("[folded to save context:")]
    assert folded and folded[0]["role"] == "user"
    assert "Result of fs_read (call_1_0):" in folded[0]["content"]


def test_a_reply_with_ids_from_the_server_keeps_them() -> None:
    h = Harness()
    server = reply(calls=[ToolCall("fs_read", {"path": "a.py"}, id="call_x")])
    result = h.run(server, written("step_complete", summary="done"))
    assert result.messages[3]["content"].startswith("Result of fs_read (call_x):")
