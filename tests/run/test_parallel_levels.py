"""A level of independent model steps against one server with several slots (issue 37): the
real `coder run` and the real `openai` SDK over HTTP against the fake llama.cpp server, whose
own record (`cache.spans`: when each request came, got its slot and ended) says what ran at
once; git says what landed.

- 4 slots, `max_parallel` unset: the level's 4 steps are served at once, each on a slot of its
  own for all its requests (`id_slot`), so each request finds its own step's prefix cached;
- 1 slot: one request at a time, also with `--max-parallel 4` (the steps run side by side, their
  requests wait in coder for the slot); the step commits and the tree are the same either way;
- a stop ends every request in flight and every wait for a slot; `coder resume` finishes;
- a step's `timeout` ends its wait for a slot too.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coder.errors import EXIT_INTERRUPTED
from tests.conftest import git
from tests.fake_ollama import FakeOllama, Reply
from tests.fake_openai import MODEL, FakeOpenAI
from tests.helpers import call, done, state_of, taskfile, wait_for
from tests.prefix_cache import Span, peak
from tests.run.test_crash import coder, out, spawn

TASK_ID = "level"
BRANCH = f"agent/{TASK_ID}"
STEPS = ("a", "b", "c", "d")
EXIT_S = 15.0  # a stopped run has exited by then (a loaded machine's room)


def level(repo: Path, timeout: int | None = None) -> Path:
    """Four independent steps (one level), each writing its own file through the model."""
    limit = f", timeout: {timeout}" if timeout else ""
    steps = "".join(
        f"  - {{id: {s}, kind: edit, goal: Write {s}.txt, depends_on: []{limit}}}\n" for s in STEPS
    )
    return taskfile(repo, f"id: {TASK_ID}\nbranch: {BRANCH}\ntitle: A level\ngraph:\n{steps}")


def configure(home: Path, url: str, **extra: Any) -> None:
    path = home / ".config" / "coder" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provider": "openai", "base_url": url, "model": MODEL, **extra}))


def step_of(body: dict[str, Any]) -> str:
    """The step a request is for, from its first user message ("... Write a.txt ...")."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    found = re.search(r"Write (\w)\.txt", user)
    assert found, user
    return found.group(1)


def answers(together: threading.Barrier | None = None) -> Any:
    """The fake's `answer`: each step writes its file, then ends; the steps' requests may come
    in any order. `together`: each step's first request waits there for the others (they
    are all being served at once, or the barrier breaks)."""

    def answer(body: dict[str, Any]) -> Reply:
        step = step_of(body)
        if not any(m["role"] == "assistant" for m in body["messages"]):
            if together is not None:
                together.wait()
            return call("fs_write", path=f"{step}.txt", content=f"{step}\n")
        return done(f"wrote {step}.txt", f"{step}.txt")

    return answer


def steps_spans(fake: FakeOpenAI | FakeOllama) -> dict[str, list[Span]]:
    """Each step's requests, in the order the server served them."""
    found: dict[str, list[Span]] = {}
    for span in fake.cache.step_spans():
        found.setdefault(step_of(span.body), []).append(span)
    return found


def landed(repo: Path) -> tuple[list[str], str]:
    """The steps of the branch's commits, oldest first, and the branch's tree (git CLI)."""
    log = git(repo, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)", BRANCH)
    return log.split(), git(repo, "rev-parse", f"{BRANCH}^{{tree}}").strip()


def run_level(repo: Path, *flags: str) -> None:
    ran = coder(repo, "run", "--autonomous", *flags, "-f", str(level(repo)), timeout=120)
    assert ran.returncode == 0, out(ran)


def test_a_level_runs_on_the_servers_slots_at_once_and_lands_as_one_at_a_time(
    make_repo, isolated_home: Path
) -> None:
    together = threading.Barrier(len(STEPS), timeout=10)
    with FakeOpenAI(slots=4, pace=0.2) as four:
        four.answer = answers(together)
        configure(isolated_home, four.url)
        parallel = make_repo(name="parallel")
        run_level(parallel)
    assert not together.broken
    spans = steps_spans(four)
    assert peak(four.cache.step_spans()) == 4  # the four steps were served at once
    # each step kept to one slot of its own, named in every request, and found its own
    # prefix there: the second request reused the whole first one
    slots = {step: {s.slot for s in spans[step]} for step in STEPS}
    assert sorted(min(s) for s in slots.values()) == [0, 1, 2, 3]
    assert all(len(s) == 1 for s in slots.values()), slots
    assert all(s.body["id_slot"] == s.slot for spans_ in spans.values() for s in spans_)
    usage = state_of(parallel, TASK_ID)["steps"]
    assert all(usage[s]["usage"]["cache_reports"] == 2 for s in STEPS)

    with FakeOpenAI(slots=1, pace=0.2) as one:
        one.answer = answers()
        configure(isolated_home, one.url)
        sequential = make_repo(name="sequential")
        run_level(sequential)
    assert peak(one.cache.step_spans(), queued=True) == 1  # one request at the server at a time
    assert landed(parallel) == landed(sequential)
    assert landed(parallel)[0] == list(STEPS)  # in file order, whatever finished first
    shares = [cache_share(r) for r in (parallel, sequential)]
    assert abs(shares[0] - shares[1]) < 0.01, shares  # as much of the prompts from the cache


def cache_share(repo: Path) -> float:
    """The share of the steps' prompt tokens the server reported cached (the run's state)."""
    usage = [r["usage"] for r in state_of(repo, TASK_ID)["steps"].values()]
    return sum(u["cached_tokens"] for u in usage) / sum(u["prompt_tokens"] for u in usage)


def test_a_one_slot_server_gets_one_request_at_a_time_whatever_max_parallel(
    make_repo, isolated_home: Path
) -> None:
    """--max-parallel 4 runs the steps side by side (their tools, checks and commits); their
    requests wait in coder for the server's one slot."""
    with FakeOpenAI(slots=1, pace=0.5) as one:
        one.answer = answers()
        configure(isolated_home, one.url)
        repo = make_repo()
        run_level(repo, "--max-parallel", "4")
    assert peak(one.cache.step_spans(), queued=True) == 1
    assert len(one.cache.step_spans()) == 2 * len(STEPS)
    assert landed(repo)[0] == list(STEPS)
    assert git(repo, "show", f"{BRANCH}:c.txt") == "c\n"


def test_ollama_takes_its_slots_from_the_config(
    make_repo, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ollama does not say how many requests it serves at once (OLLAMA_NUM_PARALLEL): the
    config's `slots` does."""
    together = threading.Barrier(len(STEPS), timeout=10)
    path = isolated_home / ".config" / "coder" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"slots": 4}))
    with FakeOllama(slots=4) as server:
        server.answer = answers(together)
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        repo = make_repo()
        run_level(repo)
    assert not together.broken and peak(server.cache.step_spans()) == 4
    assert landed(repo)[0] == list(STEPS)


@pytest.mark.parametrize("slots", [4, 1], ids=["in-flight-on-4-slots", "waiting-for-1-slot"])
def test_a_stop_ends_every_request_and_every_wait_for_a_slot(
    make_repo, isolated_home: Path, slots: int
) -> None:
    with FakeOpenAI(slots=slots) as server:
        configure(isolated_home, server.url, warm_prefix=False, max_parallel=4)
        server.stall = "answer"
        repo = make_repo()
        runner = spawn(repo, "run", "--autonomous", "-f", str(level(repo)))
        try:
            wait_for(lambda: len(server.stalled) == slots, timeout=30, what="the requests")
            time.sleep(0.5)  # the others wait for a slot, in coder: none reaches the server
            assert len(server.stalled) == slots
        finally:
            sent = time.monotonic()
            runner.send_signal(signal.SIGINT)
            try:
                _, err = runner.communicate(timeout=30)
            finally:
                if runner.poll() is None:
                    runner.kill()
                    runner.communicate()
        assert runner.returncode == EXIT_INTERRUPTED, err
        assert time.monotonic() - sent < EXIT_S
        assert len(server.hangups) == slots  # the server saw each client go
        state = state_of(repo, TASK_ID)
        assert state["status"] == "interrupted"
        assert {r["status"] for r in state["steps"].values()} <= {"interrupted", "pending"}
        assert git(repo, "rev-list", f"main..{BRANCH}") == ""

        server.stall = None
        server.answer = answers()
        resumed = coder(repo, "resume", "-t", TASK_ID, timeout=120)
        assert resumed.returncode == 0, out(resumed)
    assert landed(repo)[0] == list(STEPS)
    assert git(repo, "show", f"{BRANCH}:d.txt") == "d\n"


def test_a_step_timeout_ends_its_wait_for_a_slot(make_repo, isolated_home: Path) -> None:
    """One slot, the server stalled: the step whose request is in flight and the steps that
    wait for the slot all end at their `timeout`, as failed steps."""
    with FakeOpenAI(slots=1) as server:
        configure(isolated_home, server.url, warm_prefix=False, max_parallel=4)
        server.stall = "answer"
        repo = make_repo()
        path = level(repo, timeout=3)
        started = time.monotonic()
        ran = coder(repo, "run", "--autonomous", "-f", str(path), timeout=120)
        took = time.monotonic() - started
        came, went = list(server.stalled), list(server.hangups)
    assert ran.returncode != 0, out(ran)
    assert took < 3 + EXIT_S, f"took {took:.1f}s"
    steps = state_of(repo, TASK_ID)["steps"].values()
    assert [(r["status"], r["error"]) for r in steps] == [
        ("failed", "time limit reached (3s) without step_complete")
    ] * len(STEPS)
    # one request at a time: the next came only once the one before had gone
    assert len(came) == len(went) and all(c >= w for c, w in zip(came[1:], went)), (came, went)
