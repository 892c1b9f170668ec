"""The loop's typed events reach a live view handed to the run (RunOptions.live) with their
step's context, while the event log keeps one line per turn, never one per token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coder.agent import events as ev
from coder.run.runs import RunOptions, start
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
