"""A level of 4 independent model steps against one server: 4 slots against 1 (issue 37).

    python bench/parallel_levels.py [--repeats 3] [--pace 1.0]

`coder run --autonomous` (a subprocess, what a user runs) of a taskfile whose 4 edit steps
depend on nothing (one DAG level), each step two model turns: it writes its own module with
`fs_write` (~90 generated tokens), then calls `step_complete`. The model is the fake
llama.cpp server of tests/fake_openai.py in this process, answering at a fixed rate per slot:
each answer takes the time its timings report (the uncached part of the prompt at 4,000
tokens/s, then 50 generated tokens/s), times `--pace`, and serves as many requests at once as
it has slots (`total_slots` in its /props; the rest queue). The same run, in a fresh
repository each time, against a server with 4 slots and one with 1 slot, `max_parallel`
unset: coder runs as many steps of a level at once as the server has slots, so the 1-slot run
is the sequential one (today's behaviour on a one-slot server). Interleaved, best of
`--repeats` each.

    level wall             the executor's walk of the DAG, this one level, from the run's event
                           log (`run.started` to `run.finished`): the steps' worktrees, the
                           wait for the warm prefix, the steps, their landing; the ratio 4
                           slots / 1 slot has the goal <= 0.35x
    run wall               the whole `coder run` (start-up, the server's checks, the prompt
                           prefix), for information
    cache reuse            the prompt tokens the server reported cached over those it was sent,
                           over the steps' requests, as coder recorded them (the run's state):
                           goal, the same as the sequential run's (within a point)
    served at once         the most requests the server served at once (its own record)

The steps land as one commit each, in file order, on both; the trees are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fake_ollama import Reply  # noqa: E402
from tests.fake_openai import MODEL, FakeOpenAI  # noqa: E402
from tests.prefix_cache import peak  # noqa: E402

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
TASK_ID = "level"
STEPS = ("add", "sub", "mul", "div")
RATIO_GOAL = 0.35
SHARE_GOAL = 0.01  # the parallel run's cache reuse within a point of the sequential one's
TASK = f"id: {TASK_ID}\ntitle: Four independent modules\ngraph:\n" + "".join(
    f'  - {{id: {s}, kind: edit, goal: "Write ops_{s}.py with a function {s}(a, b) and its '
    'docstring", depends_on: []}\n'
    for s in STEPS
)


def module(name: str) -> str:
    """What the step writes: a small module (~90 tokens to generate)."""
    return (
        f'"""The {name} operation of the calculator, kept apart so it can grow."""\n\n\n'
        f"def {name}(a: float, b: float) -> float:\n"
        f'    """{name.capitalize()} b to a: both numbers, any sign; the result as a float."""\n'
        f"    return float(a) {dict(add='+', sub='-', mul='*', div='/')[name]} float(b)\n"
    )


def answer(body: dict[str, Any]) -> Reply:
    """Each step's two turns, whatever order the steps' requests come in."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    found = re.search(r"Write ops_(\w+)\.py", user)
    assert found, user
    name = found.group(1)
    if not any(m["role"] == "assistant" for m in body["messages"]):
        path, text = f"ops_{name}.py", module(name)
        return Reply(
            tool_calls=[{"name": "fs_write", "arguments": {"path": path, "content": text}}]
        )
    summary = {"summary": f"wrote ops_{name}.py", "files_changed": [f"ops_{name}.py"]}
    return Reply(tool_calls=[{"name": "step_complete", "arguments": summary}])


def git(cwd: Path, env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


def coder_cmd() -> list[str]:
    exe = shutil.which("coder", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "coder"]


def sample_repo(tmp: Path, name: str) -> tuple[Path, dict[str, str], Path]:
    """A fresh copy of the sample project committed on main, with a HOME of its own whose
    config coder reads: (home, the environment to run coder in, the repository)."""
    home = tmp / f"home{name}"
    (home / ".config" / "coder").mkdir(parents=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("OLLAMA_HOST", "CODER_MODEL", "CODER_CONFIG", "GIT_DIR", "GIT_WORK_TREE")
    }
    env.update(GIT_ENV, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    repo = tmp / f"repo{name}"
    shutil.copytree(SAMPLE, repo)
    git(repo, env, "init", "-q", "-b", "main")
    git(repo, env, "add", "-A")
    git(repo, env, "commit", "-q", "-m", "initial")
    return home, env, repo


def run_once(tmp: Path, k: int, slots: int, pace: float) -> dict[str, Any]:
    """One `coder run` of the level against a fresh fake with `slots`, in a fresh repository."""
    home, env, repo = sample_repo(tmp, str(k))
    taskfile = tmp / f"task{k}.yaml"
    taskfile.write_text(TASK)
    with FakeOpenAI(slots=slots, pace=pace) as fake:
        fake.answer = answer
        config = {"provider": "openai", "base_url": fake.url, "model": MODEL}
        (home / ".config" / "coder" / "config.json").write_text(json.dumps(config))
        start = time.perf_counter()
        proc = subprocess.run(
            [*coder_cmd(), "run", "--autonomous", "-f", str(taskfile)],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        spans = fake.cache.step_spans()
    if proc.returncode != 0:
        raise SystemExit(
            f"coder run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    events = [
        json.loads(line)
        for line in (repo / ".coder" / "logs" / f"{TASK_ID}.jsonl").read_text().splitlines()
        if line
    ]
    walked = {e["event"]: at(e) for e in events if e["event"] in ("run.started", "run.finished")}
    state = json.loads((repo / ".coder" / "state" / f"{TASK_ID}.json").read_text())
    usage = [s["usage"] for s in state["steps"].values()]
    manifest = json.loads((repo / ".coder" / "tasks" / f"{TASK_ID}.json").read_text())
    branch = manifest["branch"]  # what the run is: its manifest's (the state: its progress)
    landed = git(repo, env, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)")
    return {
        "level": walked["run.finished"] - walked["run.started"],
        "wall": wall,
        "cached": sum(u["cached_tokens"] for u in usage),
        "prompt": sum(u["prompt_tokens"] for u in usage),
        "at_once": peak(spans),
        "steps": landed.split(),
        "tree": git(repo, env, "rev-parse", f"{branch}^{{tree}}").strip(),
    }


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, best kept")
    parser.add_argument("--pace", type=float, default=1.0, help="model time, times this")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    runs: dict[int, list[dict[str, Any]]] = {4: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="coder-bench-levels-") as tmp:
        for k in range(args.repeats):  # interleaved: a busy spell hits both
            for slots in runs:
                runs[slots].append(run_once(Path(tmp), k * 10 + slots, slots, args.pace))
    best = {slots: min(found, key=lambda r: r["level"]) for slots, found in runs.items()}
    four, one = best[4], best[1]
    if (four["steps"], four["tree"]) != (one["steps"], one["tree"]):
        raise SystemExit(f"the two runs landed differently: {four['steps']} vs {one['steps']}")
    ratio = four["level"] / one["level"]
    shares = {slots: r["cached"] / r["prompt"] for slots, r in best.items()}
    print(
        f"a level of {len(STEPS)} model steps, fake llama.cpp server at pace {args.pace} "
        f"(best of {args.repeats}, interleaved; load {os.getloadavg()[0]:.1f})"
    )
    for slots, r in best.items():
        spread = ", ".join(f"{x['level']:.2f}" for x in runs[slots])
        print(
            f"    {slots} slot{'s' if slots > 1 else ' '}  level {r['level']:6.2f}s ({spread})  "
            f"run {r['wall']:6.2f}s  served at once {r['at_once']}  cache reuse "
            f"{shares[slots]:.1%} ({r['cached']:,} of {r['prompt']:,} prompt tokens)"
        )
    print(
        f"{'level wall, 4 slots vs 1 (sequential)':<44} {ratio:.2f}x  "
        f"(goal <= {RATIO_GOAL}x: {'ok' if ratio <= RATIO_GOAL else 'OVER GOAL'})"
    )
    gap = shares[4] - shares[1]
    print(
        f"{'cache reuse, 4 slots vs 1':<44} {gap * 100:+.1f} points  (goal: the same, within "
        f"{SHARE_GOAL * 100:.0f}: {'ok' if abs(gap) <= SHARE_GOAL else 'NOT THE SAME'})"
    )
    print(
        f"(steps landed in file order on both, same tree; benchmark took "
        f"{time.perf_counter() - began:.0f}s)"
    )


if __name__ == "__main__":
    main()
