"""Best of N (issue 38): how often a step passes with 1 candidate and with 4, and what 4 cost.

    python bench/best_of_n.py [--runs 30] [--pace 0.2]

`coder run --autonomous` (a subprocess, what a user runs) of a taskfile with one edit step whose
assert wants `right` in answer.txt, against the fake llama.cpp server of tests/fake_openai.py
in this process (4 slots). Its scripted model solves the step for one seed in three
(tests/fake_ollama.solves, by the request's `seed`): it writes `right` then, `wrong` otherwise.
Run k sets the config's `seed` to 100 * k, once with `--candidates 1` and once with
`--candidates 4` (seeds 100k .. 100k + 3), each in a fresh repository, interleaved.

    pass rate     the runs whose step passed (the run succeeded), of `--runs`; expected about
                  1/3 for N=1 and 1 - (2/3)^4 = 80% for N=4
    wall          the median `coder run` wall time; the goal is N=4 <= 1.5x N=1, the
                  candidates sharing the server's 4 slots
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fake_ollama import Reply, seed_of, solves  # noqa: E402
from tests.fake_openai import MODEL, FakeOpenAI  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from parallel_levels import coder_cmd, sample_repo  # noqa: E402

ONE_IN = 3
WALL_GOAL = 1.5
TASK = """id: best
title: Best of N
graph:
  - id: s1
    kind: edit
    goal: Write the answer to answer.txt
    assert: [{type: text_in_file, path: answer.txt, contains: right}]
"""


def answer(body: dict[str, Any]) -> Reply:
    """The scripted model: the right answer for a seed it solves, a wrong one otherwise."""
    if any(m["role"] == "assistant" for m in body["messages"]):
        done = {"summary": "wrote the answer", "files_changed": ["answer.txt"]}
        return Reply(tool_calls=[{"name": "step_complete", "arguments": done}])
    text = "right\n" if solves(seed_of(body), ONE_IN) else "wrong\n"
    write = {"path": "answer.txt", "content": text}
    return Reply(tool_calls=[{"name": "fs_write", "arguments": write}])


def run_once(tmp: Path, k: int, candidates: int, pace: float) -> tuple[bool, float]:
    """One `coder run` with the config's seed 100 * k: (the step passed, the wall time)."""
    name = f"{k}-{candidates}"
    home, env, repo = sample_repo(tmp, name)
    taskfile = tmp / f"task{name}.yaml"
    taskfile.write_text(TASK)
    with FakeOpenAI(slots=4, pace=pace) as fake:
        fake.answer = answer
        config = {"provider": "openai", "base_url": fake.url, "model": MODEL, "seed": 100 * k}
        (home / ".config" / "coder" / "config.json").write_text(json.dumps(config))
        argv = [*coder_cmd(), "run", "--autonomous", "--candidates", str(candidates)]
        start = time.perf_counter()
        proc = subprocess.run(
            [*argv, "-f", str(taskfile)], cwd=repo, env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"coder run: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    shutil.rmtree(repo)
    return proc.returncode == 0, wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=30, help="seeded runs of each")
    parser.add_argument("--pace", type=float, default=0.2, help="model time, times this")
    args = parser.parse_args(argv)
    found: dict[int, list[tuple[bool, float]]] = {1: [], 4: []}
    with tempfile.TemporaryDirectory(prefix="coder-bench-best-of-n-") as tmp:
        for k in range(args.runs):  # interleaved: a busy spell hits both
            for n in found:
                found[n].append(run_once(Path(tmp), k, n, args.pace))
    print(
        f"one edit step its scripted model solves for 1 seed in {ONE_IN}; {args.runs} seeded "
        f"runs each, fake llama.cpp server with 4 slots at pace {args.pace}"
    )
    walls = {n: statistics.median(w for _, w in runs) for n, runs in found.items()}
    for n, runs in found.items():
        passed = sum(ok for ok, _ in runs)
        print(
            f"    N={n}  passed {passed:2d} of {len(runs)} ({passed / len(runs):.0%})  "
            f"median wall {walls[n]:.2f}s"
        )
    ratio = walls[4] / walls[1]
    verdict = "ok" if ratio <= WALL_GOAL else "OVER GOAL"
    print(f"{'wall, N=4 vs N=1':<20} {ratio:.2f}x  (goal <= {WALL_GOAL}x: {verdict})")


if __name__ == "__main__":
    main()
