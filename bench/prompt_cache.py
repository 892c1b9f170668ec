"""Prompt-prefix reuse of `coder run --autonomous`, from the requests a fake Ollama records.

    python bench/prompt_cache.py                  # 3 runs of the journey, best wall time kept
    python bench/prompt_cache.py --repeats 1 -v   # one run, and where each request diverges

The journey is the scripted run of tests/test_agent_fix.py (analyze -> edit -> test, which
fails -> one fix cycle -> test green -> doc; 9 model calls). `coder run` is a subprocess
(what a user runs) against tests/fake_ollama.py's FakeOllama in this process, which answers at
once; the repository is a temporary git repo made from fixtures/pyproject-sample, and HOME /
XDG_CONFIG_HOME point into the temporary directory, so no user config is read. The warm-up load
request (empty `messages`) is left out of every figure below.

    prefix stable within a step   requests whose `messages` start with the previous request's
                                  messages of the same step, byte for byte (each message as
                                  serialized JSON), out of the requests that have such a
                                  previous request; a step is told by its first user message
                                  (a fix cycle is a step of its own). Goal 100% (except right
                                  after a context compaction, which this run does not provoke;
                                  compactions found in the event log are listed).
    cached share                  sum over the run of each request's common prefix with the
                                  previous request / sum of the request sizes, both in
                                  characters of the request as a server renders it: the
                                  `tools` array serialized as JSON, then each message serialized
                                  as JSON, in order (json.dumps of the parsed body: the order
                                  and values the client sent). The first request is compared
                                  with the warm prefix (what the server holds when it comes),
                                  or counts as wholly uncached without one (warm_prefix off).
                                  This is what one KV-cache slot reuses.
                                  Goal >= 90% (an anchor agent reports ~91%; a popular minimal
                                  agent measured 61.5% on this kind of run).
    ... vs longest earlier        the same with the common prefix taken against the earlier
                                  request that shares the longest prefix (what a server with
                                  several cache slots could reuse). For information.
    harness time                  the run's wall time minus the fake's own time serving
                                  requests (every request, timed in the fake's handler from the
                                  parsed request line to the last byte written), per model
                                  call and as a share of the wall time. For information: with
                                  an instant model it is nearly all of the wall time; the test
                                  commands coder ran (from the event log) are shown apart, and
                                  the share is also projected onto the fake's nominal model
                                  speed (4,000 prompt tokens/s on the uncached part, 50
                                  generated tokens/s).
    tokens sent per step          the fake's prompt_eval_count estimate (a quarter of the JSON
                                  length of messages + tools), summed per step, and the part
                                  of it not covered by the previous request's prefix.

Serializing `tools` before `messages` is a choice: Ollama's templates differ (Qwen2.5 renders
the system message, then the tools, then the rest). The figure with the system message first
is printed too; both are equal while the system message and the tools are run-constant.
The best wall time of --repeats runs is kept (the figure least disturbed by a noisy machine);
the cache figures must be identical across runs (a difference is reported as volatile input).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fake_ollama import (  # noqa: E402
    NS_PER_EVAL_TOKEN,
    NS_PER_PROMPT_TOKEN,
    FakeOllama,
    Reply,
    estimate_prompt_tokens,
)
from tests.fake_openai import MODEL as OPENAI_MODEL  # noqa: E402
from tests.fake_openai import FakeOpenAI  # noqa: E402
from tests.prefix_cache import is_priming  # noqa: E402

SAMPLE = ROOT / "fixtures" / "pyproject-sample"
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}
TASK_ID = "fix"  # JOURNEY's id
CACHED_GOAL = 0.90
SERVER_CACHED_GOAL = 0.95


# --- the journey (tests/test_agent_fix.py) -------------------------------------------------------


def journey() -> tuple[str, list[Reply]]:
    """JOURNEY and the replies of test_analyze_edit_failing_test_fix_doc_merge: analyze, edit
    (a buggy multiply and its test), the failing test's fix cycle, then the doc step."""
    from tests.agent.test_agent_fix import JOURNEY, edit_replies
    from tests.helpers import call, done

    return JOURNEY, [
        *edit_replies(),
        call("fs_edit", path="calc.py", search="return a ** b", replace="return a * b"),
        done("multiply used ** instead of *", "calc.py"),
        call(
            "fs_edit",
            path="README.md",
            search="add(2, 3)  # 5\n",
            replace="add(2, 3)  # 5\nmultiply(2, 3)  # 6\n",
        ),
        done("documented multiply", "README.md"),
    ]


class TimedFake(FakeOllama):
    """FakeOllama that also notes how long its handler spends on each request (the fake does
    not expose timestamps; its handler class is wrapped)."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies=replies)
        self.serving: list[tuple[str, float]] = []  # (path, seconds)
        fake, base = self, self._server.RequestHandlerClass

        class Timed(base):  # type: ignore[misc, valid-type]
            def _time(self, handler: Any) -> None:
                start = time.perf_counter()
                try:
                    handler()
                finally:
                    fake.serving.append((self.path, time.perf_counter() - start))

            def do_GET(self) -> None:
                self._time(super().do_GET)

            def do_POST(self) -> None:
                self._time(super().do_POST)

            def do_HEAD(self) -> None:
                self._time(super().do_HEAD)

        self._server.RequestHandlerClass = Timed


# --- one run -------------------------------------------------------------------------------------


def git(cwd: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def coder_cmd() -> list[str]:
    exe = shutil.which("coder", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "coder"]


def as_text(reply: Reply) -> Reply:
    """A scripted tool call as a model without tool calling writes it (tool_protocol text)."""
    (call,) = reply.tool_calls
    block = json.dumps({"name": call["name"], "arguments": call["arguments"]})
    return Reply(content=f"Next: {call['name']}.\n```json\n{block}\n```")


def run_once(tmp: Path, k: int, provider: str = "ollama", protocol: str = "auto") -> dict[str, Any]:
    """One `coder run` of the journey against a fresh fake (Ollama, or OpenAI-compatible), in
    a fresh repository; with `protocol` text, the tools go in the system prompt and the model
    writes its calls as text."""
    text, replies = journey()
    if protocol == "text":
        replies = [as_text(r) for r in replies]
        k += 100  # its own directories
    home = tmp / f"home{k}-{provider}"
    (home / ".config").mkdir(parents=True)
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Bench\n\temail = bench@localhost\n[init]\n\tdefaultBranch = main\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OLLAMA_HOST", "CODER_MODEL", "CODER_CONFIG", "GIT_DIR", "GIT_WORK_TREE")
    }
    env.update(GIT_ENV, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    repo = tmp / f"repo{k}-{provider}"
    shutil.copytree(SAMPLE, repo)
    git(repo, env, "init", "-q", "-b", "main")
    git(repo, env, "add", "-A")
    git(repo, env, "commit", "-q", "-m", "initial")
    taskfile = tmp / f"task{k}-{provider}.yaml"
    taskfile.write_text(textwrap.dedent(text).lstrip())

    fake: Any = TimedFake(replies) if provider == "ollama" else FakeOpenAI(replies=list(replies))
    with fake:
        if provider == "ollama":
            env["OLLAMA_HOST"] = fake.url
        else:
            (home / ".config" / "coder").mkdir(parents=True)
            (home / ".config" / "coder" / "config.json").write_text(
                json.dumps(
                    {
                        "provider": "openai",
                        "base_url": fake.url,
                        "model": OPENAI_MODEL,
                        "tool_protocol": protocol,
                    }
                )
            )
        start = time.perf_counter()
        proc = subprocess.run(
            [*coder_cmd(), "run", "--autonomous", "-f", str(taskfile)],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall = time.perf_counter() - start
        pending = fake.pending
    if proc.returncode != 0 or pending:
        raise SystemExit(
            f"coder run failed (exit {proc.returncode}, {pending} scripted replies "
            f"left):\n{proc.stdout}\n{proc.stderr}"
        )
    events = [
        json.loads(line)
        for line in (repo / ".coder" / "logs" / f"{TASK_ID}.jsonl").read_text().splitlines()
        if line
    ]
    state = json.loads((repo / ".coder" / "state" / f"{TASK_ID}.json").read_text())
    summary = state["steps"]["s3"].get("summary", "")
    if "after 1 fix cycle" not in summary:
        raise SystemExit(f"the journey did not go as scripted: s3 ended with {summary!r}")
    chats = [r.body for r in fake.requests if r.path.endswith("chat") and r.body]
    reported = [s.get("usage") or {} for s in state["steps"].values()]
    return {
        # The first request a fake saw is the warm prefix; the rest are the steps' calls.
        "server_cached": sum(fake.cache.cached[1:]),
        "server_prompt": sum(fake.cache.prompt[1:]),
        "priming": (fake.cache.cached[0], fake.cache.prompt[0]),
        "reported_cached": sum(u.get("cached_tokens", 0) for u in reported),
        "reported_prompt": sum(u.get("prompt_tokens", 0) for u in reported),
        "wall": wall,
        "serving": sum(s for _, s in getattr(fake, "serving", [])),
        "served": len(getattr(fake, "serving", [])),
        "all_chats": chats,
        "requests": [b for b in chats if b.get("messages") and not is_priming(b)],
        "events": events,
    }


# --- analysis ------------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render(body: dict[str, Any], system_first: bool = False) -> str:
    """The request as a server renders it: tools, then the messages in order (or the system
    message, the tools, the rest)."""
    messages = [dumps(m) for m in body["messages"]]
    tools = dumps(body.get("tools") or [])
    if system_first and body["messages"] and body["messages"][0].get("role") == "system":
        return messages[0] + tools + "".join(messages[1:])
    return tools + "".join(messages)


def common(a: str, b: str) -> int:
    """Length of the common prefix of a and b."""
    n = min(len(a), len(b))
    lo, hi = 0, n  # binary search on slices: fast in C, fine for strings of any size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def step_key(body: dict[str, Any]) -> str:
    first_user = next((m for m in body["messages"] if m.get("role") == "user"), {})
    return dumps(first_user)


def step_label(body: dict[str, Any]) -> str:
    """'s1 (analyze)', 's3 (test) fix 1', from the step's first user message."""
    content = json.loads(step_key(body)).get("content", "")
    head = content.split(":", 1)[0].removeprefix("Step ") if content else "?"
    return head + (
        " fix " + content.split("Fix cycle ", 1)[1].split(" ", 1)[0]
        if "Fix cycle " in content
        else ""
    )


def divergence(prev: dict[str, Any], cur: dict[str, Any]) -> str:
    """Where cur stops repeating prev: 'tools', or the first differing message."""
    if dumps(prev.get("tools")) != dumps(cur.get("tools")):
        return "tools"
    for i, (a, b) in enumerate(zip(prev["messages"], cur["messages"])):
        if dumps(a) != dumps(b):
            return f"messages[{i}] ({b.get('role')})"
    return "none (pure extension)"


def analyse(requests: list[dict[str, Any]], all_chats: list[dict[str, Any]]) -> dict[str, Any]:
    rendered = [render(b) for b in requests]
    rendered_sys = [render(b, system_first=True) for b in requests]
    sizes = [len(r) for r in rendered]
    # The warm prefix, if coder sent one, is what the server holds when the first call comes.
    primed = next((b for b in all_chats if b.get("messages") and is_priming(b)), None)
    first = common(render(primed), rendered[0]) if primed else 0
    first_sys = common(render(primed, system_first=True), rendered_sys[0]) if primed else 0
    prev_prefix = [first] + [common(a, b) for a, b in zip(rendered, rendered[1:])]
    prev_prefix_sys = [first_sys] + [common(a, b) for a, b in zip(rendered_sys, rendered_sys[1:])]
    longest = [first] + [
        max(common(rendered[j], rendered[i]) for j in range(i)) for i in range(1, len(rendered))
    ]

    stable, checked, breaks = 0, 0, []
    last_of_step: dict[str, int] = {}
    for i, body in enumerate(requests):
        key = step_key(body)
        if key in last_of_step:
            prev = requests[last_of_step[key]]["messages"]
            checked += 1
            if [dumps(m) for m in body["messages"][: len(prev)]] == [dumps(m) for m in prev]:
                stable += 1
            else:
                breaks.append((i, divergence(requests[last_of_step[key]], body)))
        last_of_step[key] = i

    steps: dict[str, dict[str, Any]] = {}
    for i, body in enumerate(requests):
        row = steps.setdefault(step_label(body), {"calls": 0, "tokens": 0, "new": 0})
        row["calls"] += 1
        row["tokens"] += estimate_prompt_tokens(body)
        row["new"] += (sizes[i] - prev_prefix[i]) // 4
    first_of_step = [
        i for i in range(1, len(requests)) if step_key(requests[i]) != step_key(requests[i - 1])
    ]
    missed = [s - p for s, p in zip(sizes, prev_prefix)]
    boundaries = [
        (
            i,
            step_label(requests[i]),
            prev_prefix[i],
            sizes[i],
            divergence(requests[i - 1], requests[i]),
        )
        for i in first_of_step
    ]
    constant = {"model", "options", "keep_alive", "format", "think"}
    settings = {dumps({k: b.get(k) for k in sorted(constant)}) for b in all_chats}
    systems = {dumps(b["messages"][0]) for b in requests}
    tools = {dumps(b.get("tools")) for b in requests}
    return {
        "stable": stable,
        "checked": checked,
        "breaks": breaks,
        "cached": sum(prev_prefix) / sum(sizes),
        "cached_sys": sum(prev_prefix_sys) / sum(sizes),
        "longest": sum(longest) / sum(sizes),
        "sizes": sizes,
        "prev_prefix": prev_prefix,
        "steps": steps,
        "boundaries": boundaries,
        "primed": primed is not None,
        "same_settings": len(settings) == 1,
        "same_system": len(systems) == 1,
        "same_tools": len(tools) == 1,
        "rendered": rendered,
        "missed": (
            missed[0],
            sum(missed[i] for i in first_of_step),
            sum(missed[1:]) - sum(missed[i] for i in first_of_step),
        ),
        "warm": sum(prev_prefix[1:]) / (sum(sizes) - sizes[0]) if len(sizes) > 1 else 1.0,
        "tools_chars": len(dumps(requests[0].get("tools") or [])),
        "system_chars": len(dumps(requests[0]["messages"][0])),
        "prompt_tokens": sum(estimate_prompt_tokens(b) for b in requests),
        "new_tokens": sum(s - p for s, p in zip(sizes, prev_prefix)) // 4,
    }


def compactions(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if "compact" in dumps(e))


def command_seconds(events: list[dict[str, Any]]) -> float:
    return sum(e.get("duration_s", 0.0) for e in events if e.get("event") == "command.finished")


def eval_tokens(requests: int, replies: list[Reply]) -> int:
    """Generated tokens as the fake counts them (a quarter of the reply's JSON)."""
    total = 0
    for reply in replies[:requests]:
        generated = json.dumps(reply.tool_calls) if reply.tool_calls else ""
        total += max(1, len(reply.thinking + reply.content + generated) // 4)
    return total


# --- main ----------------------------------------------------------------------------------------


def verdict(ok: bool, under: bool = False) -> str:
    return "ok" if ok else ("UNDER GOAL" if under else "OVER GOAL")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of the journey, best wall time kept (default 3)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print each request: size, cached prefix, divergence",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be positive")

    began = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="coder-cache-bench-") as tmp_name:
        for k in range(args.repeats):
            one = run_once(Path(tmp_name), k)
            one["analysis"] = analyse(one["requests"], one["all_chats"])
            runs.append(one)
        openai_run = run_once(Path(tmp_name), 0, provider="openai")
        text_run = run_once(Path(tmp_name), 0, provider="openai", protocol="text")
    best = min(runs, key=lambda r: r["wall"])
    a = best["analysis"]
    volatile = {json.dumps(r["analysis"]["rendered"]) for r in runs}
    n = len(best["requests"])
    _, replies = journey()

    print(
        f"journey analyze -> edit -> test (red) -> fix -> test (green) -> doc: {n} model "
        f"calls, best wall time of {args.repeats}: {best['wall']:.2f}s"
    )
    print(
        f"prefix: tools {a['tools_chars']:,} chars + system message {a['system_chars']:,} "
        f"chars; identical in every request: tools {'yes' if a['same_tools'] else 'NO'}, "
        f"system {'yes' if a['same_system'] else 'NO'}; model/options/keep_alive identical "
        f"incl. warm-up: {'yes' if a['same_settings'] else 'NO (the server reloads)'}; "
        f"identical across runs: {'yes' if len(volatile) == 1 else 'NO (volatile input)'}"
    )
    share = a["stable"] / a["checked"] if a["checked"] else 1.0
    print(
        f"{'prefix stable within a step':<34} {a['stable']:>3} of {a['checked']:<3} "
        f"{share * 100:6.1f}%  (goal 100%: {verdict(share == 1.0, under=True)})"
    )
    print(
        f"{'cached share vs previous request':<34} {'':9}{a['cached'] * 100:6.1f}%  "
        f"(goal >= {CACHED_GOAL:.0%}: {verdict(a['cached'] >= CACHED_GOAL, under=True)})"
    )
    print(
        f"{'cached share vs longest earlier':<34} {'':9}{a['longest'] * 100:6.1f}%  "
        f"(for information; system message before tools: {a['cached_sys'] * 100:.1f}%)"
    )
    cold, openings, turns = a["missed"]
    first = "first request beyond the warm prefix" if a["primed"] else "first request, cold"
    print(
        f"{'':<4}not cached: {cold + openings + turns:,} of {sum(a['sizes']):,} chars = "
        f"{first} {cold:,} ({cold / (cold + openings + turns):.0%}) + steps' first "
        f"messages {openings:,} ({openings / (cold + openings + turns):.0%}) + new turns within "
        f"steps {turns:,} ({turns / (cold + openings + turns):.0%}); without the first "
        f"request: {a['warm'] * 100:.1f}% cached"
    )

    harness = best["wall"] - best["serving"]
    commands = command_seconds(best["events"])
    evals = eval_tokens(n, replies)
    model_s = (a["new_tokens"] * NS_PER_PROMPT_TOKEN + evals * NS_PER_EVAL_TOKEN) / 1e9
    print(
        f"{'harness time per model call':<34} {harness / n * 1000:7.1f} ms  "
        f"= {harness / best['wall']:.1%} of wall {best['wall']:.2f}s (fake served "
        f"{best['served']} requests in {best['serving'] * 1000:.0f} ms; for information)"
    )
    print(
        f"{'':<4}of which test commands {commands:.2f}s; the rest (start-up, worktree, tools, "
        f"commits, client) {(harness - commands) / n * 1000:.1f} ms a call"
    )
    print(
        f"{'':<4}at the fake's nominal model speed ({a['new_tokens']:,} uncached prompt "
        f"tokens, {evals} generated: {model_s:.1f}s of model time) the harness would be "
        f"{harness / (harness + model_s):.0%} of the wall time"
    )
    print(
        "tokens sent per step (prompt_eval_count estimate; 'not cached': beyond the common "
        "prefix with the previous request):"
    )
    for label, row in a["steps"].items():
        print(
            f"    {label:<16} {row['calls']} calls  {row['tokens']:6,} tokens sent  "
            f"{row['new']:6,} not cached  ({row['tokens'] // row['calls']:,} a call)"
        )
    print(
        f"    {'total':<16} {n} calls  {a['prompt_tokens']:6,} tokens sent  "
        f"{a['new_tokens']:6,} not cached"
    )
    print("step boundaries (the first request of a step vs the last of the step before):")
    for i, label, prefix, size, where in a["boundaries"]:
        print(
            f"    request {i + 1:<2} {label:<16} {prefix:6,} of {size:6,} chars reused "
            f"({prefix / size:.0%}); diverges at {where}"
        )
    for i, where in a["breaks"]:
        print(f"    WITHIN-STEP BREAK at request {i + 1}: diverges at {where}")
    print(
        "server-measured cache reuse over the steps' calls (each fake's own prompt cache: one "
        "slot, reused for a common prefix, as llama.cpp's server does; the warm prefix, "
        f"{best['priming'][1]:,} tokens, was sent first):"
    )
    ollama_share = best["server_cached"] / best["server_prompt"]
    print(
        f"    {'fake Ollama':<34} {ollama_share * 100:6.1f}%  of {best['server_prompt']:,} "
        "prompt tokens (Ollama reports none on the wire: read from the fake)"
    )
    server_share = openai_run["server_cached"] / openai_run["server_prompt"]
    reported = openai_run["reported_cached"] / max(1, openai_run["reported_prompt"])
    print(
        f"    {'fake OpenAI-compatible':<34} {server_share * 100:6.1f}%  of "
        f"{openai_run['server_prompt']:,} prompt tokens; coder recorded {reported * 100:.1f}% "
        f"from the server's cached_tokens (goal >= {SERVER_CACHED_GOAL:.0%}: "
        f"{verdict(reported >= SERVER_CACHED_GOAL, under=True)})"
    )
    text_share = text_run["reported_cached"] / max(1, text_run["reported_prompt"])
    print(
        f"    {'the same, text tools':<34} {text_share * 100:6.1f}%  of "
        f"{text_run['reported_prompt']:,} prompt tokens (tool_protocol text: the tools "
        "described in the system prompt, no `tools` sent)"
    )
    found = compactions(best["events"])
    if found:
        print(f"    {found} context compaction event(s) in the log")
    if args.verbose:
        print("requests:")
        prev = None
        for i, body in enumerate(best["requests"]):
            print(
                f"    {i + 1:<2} {step_label(body):<16} {len(body['messages']):2} messages "
                f"{a['sizes'][i]:6,} chars  cached {a['prev_prefix'][i]:6,}  "
                f"{'' if prev is None else divergence(prev, body)}"
            )
            prev = body
    print(f"(benchmark took {time.perf_counter() - began:.0f}s)")


if __name__ == "__main__":
    main()
