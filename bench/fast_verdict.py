"""Time to a clear verdict when the model cannot use tools (issue: a real 135M model answered
every call with ~1,300 characters of prose and no tool call; coder needed four full calls).

    python bench/fast_verdict.py [--chunk-delay 0.01]

The agent loop, the real OpenAI-compatible provider and the fake server over HTTP, with the
fake streaming word by word at a fixed pace (`--chunk-delay` seconds before each chunk, a
stand-in for a model's generation speed). Two models are scripted:

    rambler     every reply ~1,300 characters of prose, no tool call
    tool user   a sentence, then a tool call; then step_complete (the loop must not lose it)

Each runs twice: with the fast verdict (the defaults: prose cut at max_prose_chars, one nudge
for replies with no attempt at the tool format) and without it (the previous behaviour: replies
read to the end, three nudges). Printed: model calls, characters streamed, wall time, and the
ratio of the two wall times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coder.agent.loop import AgentLoop, Limits, LoopResult  # noqa: E402
from coder.models.openai import OpenAIProvider  # noqa: E402
from tests.fake_ollama import Reply  # noqa: E402
from tests.fake_openai import MODEL, FakeOpenAI  # noqa: E402

RAMBLE = (
    "To address this task, I will first consider the overall structure of the project and "
    "the purpose of each module, because understanding the context is essential before any "
    "change is made. The calculator module appears to provide basic arithmetic operations, "
    "and it would be natural to extend it with additional functionality in a consistent way. "
) * 4  # ~1,300 characters, as the 135M model wrote
TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {}}}
    for n in ("fs_read", "step_complete")
]
OLD = Limits(max_prose_chars=None, max_blind_nudges=3, max_nudges=3)
NEW = Limits()


def script(kind: str, delay: float) -> list[Reply]:
    if kind == "rambler":
        return [Reply(content=RAMBLE, chunk_delay_s=delay) for _ in range(6)]
    return [
        Reply(
            content="Let me read the file first.",
            tool_calls=[{"name": "fs_read", "arguments": {"path": "calc.py"}}],
            chunk_delay_s=delay,
        ),
        Reply(
            tool_calls=[{"name": "step_complete", "arguments": {"summary": "read it"}}],
            chunk_delay_s=delay,
        ),
    ]


def run(kind: str, limits: Limits, delay: float) -> tuple[LoopResult, float, int]:
    with FakeOpenAI(replies=list(script(kind, delay))) as fake:
        provider = OpenAIProvider(MODEL, fake.url)
        streamed = 0

        def count(event: Any) -> None:
            nonlocal streamed
            streamed += len(getattr(event, "text", ""))

        loop = AgentLoop(
            provider,
            tools=TOOLS,
            allowed=["fs_read", "step_complete"],
            run_tool=lambda name, args: "def add(a, b):\n    return a + b\n",
            verify=lambda claim: None,
            limits=limits,
            on_event=count,
        )
        started = time.perf_counter()
        result = loop.run([{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}])
        wall = time.perf_counter() - started
        provider.close()
    return result, wall, streamed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--chunk-delay", type=float, default=0.01)
    args = parser.parse_args()
    print(f"fake model pace: {args.chunk_delay * 1000:.0f} ms a word")
    for kind in ("rambler", "tool user"):
        rows = {}
        for label, limits in (("without fast verdict", OLD), ("with fast verdict", NEW)):
            result, wall, streamed = run(kind, limits, args.chunk_delay)
            rows[label] = wall
            verdict = "ok" if result.ok else f"failed: {result.error}"
            print(
                f"{kind:<10} {label:<21} {result.turns} calls  {streamed:5,} chars streamed  "
                f"{wall:6.2f}s  {verdict[:90]}"
            )
        ratio = rows["with fast verdict"] / rows["without fast verdict"]
        print(f"{'':<10} time to verdict with / without: {ratio:.2f}x")


if __name__ == "__main__":
    main()
