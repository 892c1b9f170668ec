"""A level of 4 independent steps on a Ray cluster against the same steps one at a time here
(issue 39).

    python bench/fleet.py [--repeats 1] [--seconds 20]

`coder run --autonomous` (a subprocess, what a user runs) of a taskfile whose 4 shell steps
depend on nothing (one DAG level) and each take a fixed time (`sleep SECONDS`, then write a
file of their own): in a fresh copy of the sample project each time,

    sequential    the steps run here, one at a time (`--max-parallel 1`): the baseline
    ray           `--executor ray --workers 4 --remote origin` (a bare file:// remote): each
                  step a Ray task on a local Ray cluster of 4 CPUs that coder starts, its
                  `coder worker` cloning the remote, running the step and pushing its commit,
                  the coordinator landing the 4 commits
    local         the same workers as processes here (`--executor local --workers 4`), for
                  information: what of the ray figure is Ray's, what the workers' own

    level wall    from the run's event log: the level's first `step.started` to its last
                  `step.succeeded` (the steps' own time, their clones and pushes, their
                  landing; not coder's or Ray's start-up, which a run pays once whatever its
                  size); the ratio ray / sequential has the goal <= 0.4x
    run wall      the whole `coder run` (Ray's start-up included), for information

The runs land the 4 steps as one commit each, in file order, with the same tree (checked).
Interleaved, best of `--repeats` each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from parallel_levels import at, coder_cmd, git, sample_repo  # noqa: E402

TASK_ID = "fleet"
STEPS = ("w", "x", "y", "z")
WORKERS = 4
RATIO_GOAL = 0.4
MODES = {
    "sequential": ["--max-parallel", "1"],
    "ray": ["--executor", "ray", "--workers", str(WORKERS), "--remote", "origin"],
    "local": ["--executor", "local", "--workers", str(WORKERS), "--remote", "origin"],
}


def taskfile(seconds: float) -> str:
    steps = "".join(
        f'  - {{id: {s}, kind: shell, goal: "Wait, then write {s}.txt", '
        f'cmd: "sleep {seconds} && echo {s} > {s}.txt", depends_on: []}}\n'
        for s in STEPS
    )
    return f"id: {TASK_ID}\ntitle: Four independent steps\ngraph:\n{steps}"


def run_once(tmp: Path, k: int, mode: str, seconds: float) -> dict[str, Any]:
    """One `coder run` of the level in `mode`, in a fresh repository with a bare remote."""
    home, env, repo = sample_repo(tmp, f"{k}-{mode}")
    bare = tmp / f"remote{k}-{mode}.git"
    git(tmp, env, "init", "-q", "--bare", str(bare))
    git(repo, env, "remote", "add", "origin", f"file://{bare}")
    git(repo, env, "push", "-q", "origin", "main")
    path = tmp / f"task{k}-{mode}.yaml"
    path.write_text(taskfile(seconds))
    start = time.perf_counter()
    proc = subprocess.run(
        [*coder_cmd(), "run", "--autonomous", "-f", str(path), *MODES[mode]],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"coder run ({mode}) failed (exit {proc.returncode}):\n{proc.stderr}")
    events = [
        json.loads(line)
        for line in (repo / ".coder" / "logs" / f"{TASK_ID}.jsonl").read_text().splitlines()
        if line
    ]
    started = [at(e) for e in events if e["event"] == "step.started"]
    finished = [at(e) for e in events if e["event"] == "step.succeeded"]
    if len(started) != len(STEPS) or len(finished) != len(STEPS):
        raise SystemExit(f"{mode}: not every step started and succeeded once: {events}")
    manifest = json.loads((repo / ".coder" / "tasks" / f"{TASK_ID}.json").read_text())
    branch = manifest["branch"]  # what the run is: its manifest's (the state: its progress)
    landed = git(
        repo,
        env,
        "log",
        "--reverse",
        "--format=%(trailers:key=Coder-Step,valueonly)",
        "main.." + branch,
    )
    return {
        "level": max(finished) - min(started),
        "wall": wall,
        "steps": landed.split(),
        "tree": git(repo, env, "rev-parse", f"{branch}^{{tree}}").strip(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs of each, best kept")
    parser.add_argument("--seconds", type=float, default=20.0, help="each step's fixed time")
    args = parser.parse_args(argv)
    try:
        import ray  # noqa: F401  (only to say it is missing; coder imports it itself)
    except ImportError:
        raise SystemExit("bench/fleet.py needs the ray extra: pip install '.[ray]'") from None
    began = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="coder-bench-fleet-") as tmp:
        for k in range(args.repeats):  # interleaved: a busy spell hits both
            for mode in runs:
                runs[mode].append(run_once(Path(tmp), k, mode, args.seconds))
    best = {mode: min(found, key=lambda r: r["level"]) for mode, found in runs.items()}
    ray_run, here = best["ray"], best["sequential"]
    for mode, r in best.items():
        if (r["steps"], r["tree"]) != (here["steps"], here["tree"]):
            raise SystemExit(f"{mode} landed differently: {r['steps']} vs {here['steps']}")
    print(
        f"a level of {len(STEPS)} shell steps of {args.seconds:g}s each (best of "
        f"{args.repeats}, interleaved; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})"
    )
    for mode, r in best.items():
        spread = ", ".join(f"{x['level']:.2f}" for x in runs[mode])
        print(f"    {mode:<10}  level {r['level']:6.2f}s ({spread})  run {r['wall']:6.2f}s")
    ratio = ray_run["level"] / here["level"]
    print(
        f"{f'level wall, ray --workers {WORKERS} vs one at a time here':<52} {ratio:.2f}x  "
        f"(goal <= {RATIO_GOAL}x: {'ok' if ratio <= RATIO_GOAL else 'OVER GOAL'})"
    )
    share = best["local"]["level"] / here["level"]
    print(f"{'(for information) the same workers as local processes':<52} {share:.2f}x")
    print(
        f"(steps landed in file order on all, same tree; benchmark took "
        f"{time.perf_counter() - began:.0f}s)"
    )


if __name__ == "__main__":
    main()
