"""The loop's typed events reach a live view handed to the run (RunOptions.live) with their
step's context, while the event log keeps one line per turn, never one per token: each event
says its own line (name, level, fields), or none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from coder.agent import events as ev
from coder.agent.modelstep import report
from coder.models.provider import Usage
from coder.run.drive import RunOptions
from coder.run.eventlog import EventLog
from coder.run.start import start_run as start
from tests.fake_ollama import FakeOllama, Reply
from tests.helpers import call, done, taskfile


def test_a_live_view_gets_typed_events_with_their_step(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(
        Reply(
            content="Let me write the file now.",
            tool_calls=[{"name": "fs_write", "arguments": {"path": "y.txt", "content": "y\n"}}],
        ),
        done("wrote y", "y.txt"),
        call("fs_read", path="y.txt"),
        done("tested y"),
    )
    seen: list[tuple[dict[str, Any], object]] = []
    path = taskfile(
        sample,
        """
        id: live
        title: t
        graph:
          - {id: s1, kind: edit, goal: write y}
          - {id: s2, kind: analyze, goal: read y}
        """,
    )
    result = start(
        path, cwd=sample, options=RunOptions(live=lambda ctx, e: seen.append((dict(ctx), e)))
    )
    assert result.status == "success"
    by_step = {sid: [e for c, e in seen if c.get("step_id") == sid] for sid in ("s1", "s2")}
    assert {c["task_id"] for c, _ in seen} == {"live"}
    s1 = by_step["s1"]
    text = [e for e in s1 if isinstance(e, ev.ModelText)]
    assert "".join(e.text for e in text) == "Let me write the file now."
    assert text[-1].chars == len("Let me write the file now.") and text[-1].tokens > 0
    tools = [e.label for e in s1 if isinstance(e, ev.ToolStarted)]
    assert tools == ["fs_write y.txt", "step_complete"]
    finished = [e for e in s1 if isinstance(e, ev.TurnFinished)]
    assert [t.calls for t in finished] == [("fs_write",), ("step_complete",)]
    assert isinstance(s1[-1], ev.LoopFinished) and s1[-1].ok
    assert [e.label for e in by_step["s2"] if isinstance(e, ev.ToolStarted)][0] == "fs_read y.txt"
    # The log: a line per model turn with its usage, none per streamed piece.
    log = [
        json.loads(line) for line in (sample / ".coder/logs/live.jsonl").read_text().splitlines()
    ]
    turns = [e for e in log if e["event"] == "model.turn"]
    assert [(e["step_id"], e["turn"], e["calls"]) for e in turns] == [
        ("s1", 1, ["fs_write"]),
        ("s1", 2, ["step_complete"]),
        ("s2", 1, ["fs_read"]),
        ("s2", 2, ["step_complete"]),
    ]
    assert all("usage" in e and "duration_s" in e for e in turns)
    assert not any("Let me write" in json.dumps(e) for e in log)


USAGE = Usage(prompt_tokens=900, eval_tokens=40, eval_s=2.0, calls=1)
# Each loop event, and the line the event log keeps of it (None: it is only drawn live).
EVENTS: list[tuple[ev.LoopEvent, tuple[str, str, dict[str, Any]] | None]] = [
    (ev.TurnStarted(1, 900, 0.5), None),
    (ev.ModelText(1, "Reading", 7, 2, 0.1, 20.0), None),
    (ev.ToolStarted(1, "fs_read", "calc.py"), None),
    (ev.ToolFinished(1, "fs_read", 0.2), None),
    (
        ev.TurnFinished(1, ("fs_read",), USAGE, USAGE + USAGE, "stop", 1.23456),
        (
            "info",
            "model.turn",
            {
                "turn": 1,
                "calls": ["fs_read"],
                "usage": dict(USAGE.as_dict()),
                "done_reason": "stop",
                "duration_s": 1.235,
            },
        ),
    ),
    (
        ev.Nudged(2, "no_tool_call", "stop"),
        ("info", "model.nudged", {"turn": 2, "reason": "no_tool_call", "detail": "stop"}),
    ),
    (
        ev.ContextCompacted(3, 4, 5000),
        ("warning", "context.compacted", {"turn": 3, "folded": 4, "estimate": 5000}),
    ),
    (
        ev.ContextSummarized(3, 6, 400, 3000, ""),
        (
            "info",
            "context.summarized",
            {"turn": 3, "replaced": 6, "chars": 400, "estimate": 3000},
        ),
    ),
    (
        ev.ContextSummarized(3, 0, 0, 5000, "the summary was empty"),
        (
            "warning",
            "context.summary_failed",
            {"turn": 3, "replaced": 0, "chars": 0, "reason": "the summary was empty"},
        ),
    ),
    (
        ev.ContextWarning(4, "the prompt was probably cut"),
        ("warning", "context.warning", {"turn": 4, "warning": "the prompt was probably cut"}),
    ),
    (
        ev.ModelRetrying(4, 1, "HTTP 503: busy", 0.5),
        (
            "warning",
            "model.retrying",
            {"turn": 4, "attempt": 1, "reason": "HTTP 503: busy", "delay_s": 0.5},
        ),
    ),
    (
        ev.EndpointSwitched(5, "http://a:1", "http://b:1", "refused"),
        (
            "warning",
            "model.endpoint_down",
            {
                "turn": 5,
                "endpoint": "http://a:1",
                "next_endpoint": "http://b:1",
                "reason": "refused",
            },
        ),
    ),
    (
        ev.ProtocolSwitched(5, "text", "prose naming a tool"),
        (
            "warning",
            "model.protocol",
            {"turn": 5, "protocol": "text", "reason": "prose naming a tool"},
        ),
    ),
    (ev.LoopFinished(6, True, "done", USAGE), None),
]


def test_each_loop_event_says_its_own_log_line(tmp_path: Path) -> None:
    """Every event reaches the live view; the log gets the line each event says, and only
    those, through one rendering (`report`)."""
    assert {type(event) for event, _ in EVENTS} == set(get_args(ev.LoopEvent))
    said = [event.logged() for event, _ in EVENTS]
    assert [None if s is None else (s.level, s.event, s.fields) for s in said] == [
        line for _, line in EVENTS
    ]
    seen: list[object] = []
    with EventLog(tmp_path / ".coder", "t", live=lambda fields, e: seen.append(e)) as log:
        for event, _ in EVENTS:
            report(log.bind(step_id="s1"), event)
    assert seen == [event for event, _ in EVENTS]
    lines = [json.loads(line) for line in log.path.read_text(encoding="utf-8").splitlines()]
    context = ("timestamp", "level", "event", "task_id", "step_id")
    written = [
        (e["level"], e["event"], {k: v for k, v in e.items() if k not in context}) for e in lines
    ]
    assert written == [line for _, line in EVENTS if line is not None]
