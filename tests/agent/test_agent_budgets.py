"""Budgets and the context window: each limit ends the step or the run with its reason, and a
conversation that outgrows num_ctx is compacted instead of being silently cut by the server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from coder.agent import summarize
from coder.agent.loop import FOLDED
from tests.conftest import coder
from tests.fake_ollama import FakeOllama, estimate_prompt_tokens
from tests.helpers import call, chat_requests, done, quoting_summaries, state_of, taskfile


def test_turn_budget(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(call("fs_read", path="calc.py"), call("fs_read", path="README.md"))
    path = taskfile(
        sample,
        """
        id: turns
        title: t
        policies: {max_turns: 2}
        graph:
          - {kind: analyze, goal: read everything}
    """,
    )
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 1
    error = state_of(sample, "turns")["steps"]["s1"]["error"]
    assert error == "turn limit reached (2 model turns) without step_complete"


def test_step_token_budget(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(call("fs_read", path="calc.py"), call("fs_read", path="README.md"))
    path = taskfile(
        sample,
        """
        id: tokens
        title: t
        policies: {max_tokens: 500}
        graph:
          - {kind: analyze, goal: read everything}
    """,
    )
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 1
    error = state_of(sample, "tokens")["steps"]["s1"]["error"]
    assert error.startswith("token budget exhausted (") and error.endswith(" of 500 tokens)")


def test_run_token_budget_stops_between_steps(fake: FakeOllama, sample: Path) -> None:
    fake.enqueue(call("fs_read", path="calc.py"), done("read it"))
    path = taskfile(
        sample,
        """
        id: runbudget
        title: t
        policies: {run_max_tokens: 100}
        graph:
          - {kind: analyze, goal: read}
          - {kind: shell, cmd: "echo never > never.txt"}
    """,
    )
    code, out, _ = coder(sample, "run", "--autonomous", "-f", str(path))
    assert code == 1
    state = state_of(sample, "runbudget")
    assert state["steps"]["s1"]["status"] == "success"
    assert state["steps"]["s2"]["status"] == "pending"
    assert state["error"].startswith("run token budget exhausted (")
    assert "run token budget exhausted" in out


def test_time_budget_from_config(fake: FakeOllama, sample: Path) -> None:
    (sample / "coder.config.json").write_text(json.dumps({"run_timeout": 1}))
    path = taskfile(
        sample,
        """
        id: slow
        title: t
        graph:
          - {kind: shell, cmd: "sleep 1.2 && echo a > a.txt"}
          - {kind: shell, cmd: "echo b > b.txt"}
    """,
    )
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 1
    assert state_of(sample, "slow")["error"].startswith("run time budget exhausted (1s of 1s)")


def test_policy_durations_apply_as_written(fake: FakeOllama, sample: Path) -> None:
    """`policies.timeout` and `policies.run_timeout` as durations ("1s"): a shell step over
    the first is ended, a run over the second stops before its next step."""
    path = taskfile(
        sample,
        """
        id: stepslow
        title: t
        policies: {timeout: 1s}
        graph:
          - {kind: shell, cmd: "sleep 5 && echo a > a.txt"}
    """,
    )
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 1
    assert "timed out" in state_of(sample, "stepslow")["steps"]["s1"]["error"]
    assert not (sample / ".coder" / "worktrees" / "stepslow" / "a.txt").exists()
    path = taskfile(
        sample,
        """
        id: runslow
        title: t
        policies: {run_timeout: 1s}
        graph:
          - {kind: shell, cmd: "sleep 1.2 && echo a > a.txt"}
          - {kind: shell, cmd: "echo b > b.txt"}
    """,
        name="runslow.yaml",
    )
    assert coder(sample, "run", "--autonomous", "-f", str(path))[0] == 1
    state = state_of(sample, "runslow")
    assert state["error"].startswith("run time budget exhausted (1s of 1s)")
    assert state["steps"]["s2"]["status"] == "pending"


@pytest.fixture
def small_context(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOllama]:
    models = {
        "small:3b": {
            "context_length": 4096,
            "capabilities": ["completion", "tools"],
            "arch": "llama",
        }
    }
    with FakeOllama(models=models) as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        yield server


def test_a_conversation_that_outgrows_num_ctx_is_compacted(
    small_context: FakeOllama, make_repo
) -> None:
    big = "".join(f"line {i}: " + "lorem ipsum dolor sit amet " * 3 + "\n" for i in range(600))
    repo = make_repo({"big.txt": big, "README.md": "# r\n"})
    # folding alone (summaries off; tests/agent/test_summarize.py has them)
    (repo / "coder.config.json").write_text(json.dumps({"fold_summaries": False}))
    reads = [call("fs_read", path="big.txt", offset=1 + 100 * i, limit=100) for i in range(6)]
    small_context.enqueue(*reads, done("read the file in pages"))
    path = taskfile(
        repo,
        "id: ctx\ntitle: t\nmodel: small:3b\ngraph:\n  - {kind: analyze, goal: read big.txt}\n",
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    requests = chat_requests(small_context)
    assert all(r["options"]["num_ctx"] == 4096 for r in requests)
    # every request fits the window (by the server's own estimate), none is silently cut
    assert max(estimate_prompt_tokens(r) for r in requests) <= 4096
    folded = [
        m
        for m in requests[-1]["messages"]
        if m["role"] == "tool" and m["content"].startswith("[folded to save context:")
    ]
    assert folded, "older tool results should have been folded"
    events = [
        json.loads(line)
        for line in (repo / ".coder" / "logs" / "ctx.jsonl").read_text().splitlines()
    ]
    assert any(e["event"] == "context.compacted" for e in events)


PAGE, PAGES = 30, 12
FACTS = range(PAGE // 2, PAGE * PAGES, PAGE)  # one in the middle of each page read
FACT = r"FACT \d+: \w+"


def test_with_summaries_the_facts_of_folded_turns_stay_in_the_request(
    monkeypatch: pytest.MonkeyPatch, make_repo
) -> None:
    """Over HTTP: the summary request goes to the server with the cached conversation first,
    its answer replaces the older turns, and a fact planted in the middle of an early tool
    result is still in the request that ends the step (folding keeps only a first line)."""
    lines = [f"line {i}: " + "lorem ipsum dolor sit amet " * 3 for i in range(400)]
    for i in FACTS:
        lines[i] = f"FACT {i}: value{i}"
    repo = make_repo({"big.txt": "\n".join(lines) + "\n", "README.md": "# r\n"})
    models = {"small:3b": {"context_length": 8192, "capabilities": ["completion", "tools"]}}
    with FakeOllama(models=models) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        fake.answer = quoting_summaries(FACT)
        pages = [
            call("fs_read", path="big.txt", offset=1 + PAGE * i, limit=PAGE) for i in range(PAGES)
        ]
        fake.enqueue(*pages, done("read the file in pages"))
        path = taskfile(
            repo,
            "id: ctx\ntitle: t\nmodel: small:3b\ngraph:\n  - {kind: analyze, goal: read it}\n",
        )
        code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
        assert code == 0, out + err
        requests = chat_requests(fake)
    asked = [r for r in requests if r["messages"][-1]["content"] == summarize.PROMPT]
    assert asked, "a summary should have been asked for"
    for summary in asked:  # the conversation so far, then the question
        earlier = requests[requests.index(summary) - 1]["messages"]
        assert summary["messages"][:-1] == earlier[: len(summary["messages"]) - 1]
        assert summary["tools"] == requests[0]["tools"]
    last = "\n".join(m.get("content", "") for m in requests[-1]["messages"])
    assert re.findall(FACT, last) == [f"FACT {i}: value{i}" for i in FACTS]
    assert max(estimate_prompt_tokens(r) for r in requests) <= 8192
    assert not any(FOLDED in m.get("content", "") for r in requests for m in r["messages"])
    events = [
        json.loads(line)
        for line in (repo / ".coder" / "logs" / "ctx.jsonl").read_text().splitlines()
    ]
    assert any(e["event"] == "context.summarized" for e in events)
    assert re.search(r"summarized\s+\d+ older messages into \d+ characters", err)  # shown
    usage = state_of(repo, "ctx")["steps"]["s1"]["usage"]
    assert usage["calls"] == PAGES + 1 + len(asked)  # the summary calls count in the step's usage
