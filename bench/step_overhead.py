"""Per-step harness overhead of `coder run --autonomous`, as ratios: against the git CLI as
repositories grow (the size axis), and against a short run as runs grow (the steps axis).

    python bench/step_overhead.py                 # N=20 steps, repos of 100 and 20,000 files
    python bench/step_overhead.py --steps 50 --sizes 100 5000 --repeats 7
    python bench/step_overhead.py --profile       # also cProfile coder's steps (largest repo)
    python bench/step_overhead.py --step-counts 10 1000 10000   # the steps axis instead
    python bench/step_overhead.py --step-counts 20 2020 --profile  # and what grew per step

Every figure is a ratio of medians over interleaved rounds (--repeats, default 5), each round
running every side once, so a busy spell of the shared machine slows a round's sides alike; the
range of the rounds' own ratios is printed beside it.

The steps axis: runs of N no-op shell steps (`true`) in a small repository, the first (w0)
and the last not measured. A step's harness overhead is the time from its start to the next
step's start, less its command's own duration (`command.finished` duration_s): scheduling,
checkpoints (one journal line per transition, the occasional compaction), the event log,
verify and the commit check. The mean over a run's steps (so the compactions count), median
over the rounds, is compared with the smallest run's:

    harness per step, N steps vs the smallest N                goal <= 1.3x

A run that rescanned every step or rewrote the whole state per transition would be quadratic
and fail this by far (10,000 steps took 0.25-0.8 s a step that way, against ~23 ms at 200).
Each count's median step, slowest step (a compaction) and last tenth against first tenth (a
per-step cost that grows with the steps done shows there, whatever the machine does between
runs) are printed for information.

For each size a repository of small text files in nested directories (50 files a directory,
20 directories a level) is generated, committed once with the git CLI and packed (`git gc`,
as a clone is). A taskfile of N `shell` steps then overwrites N different existing files
spread over the tree (`echo step 3 > d0/e2/f100.txt`): every step is one commit of one
changed file.

    coder per step     (run.finished - step.started of s1) / N, from .coder/logs/<id>.jsonl:
                       everything coder does per step, the sandboxed command included
    git, bash -c       the baseline that counts: the same N changes in a fresh linked worktree
                       of the same repository, by one bash loop that runs each step's command
                       as its own process, as any harness must:
                       `bash -c 'echo ... > FILE'; git add -A && git commit -q -m x`
    git, inline        the same loop with `echo` inside the loop's own shell (no process per
                       command; for information)

    coder per step vs git, bash -c per step                   goal <= 1.0x (each size)
    coder's growth (largest repo vs smallest) vs git's own    goal <= 1.0x

The sandbox's own cost (a confined spawn against an unconfined one) is bench/sandbox.py's
figure, apart.

Measured on quiet moments of the shared 2-core machine (best of 3, 20 steps; three runs),
before and after one scan per step (coder/git/staging.py):

    100 files      before 1.85-1.95x git's loop   now 16.0-17.8 ms vs 8.6-11.0 ms: 1.62-1.85x
    20,000 files   before 2.35-2.36x              now 76.6-78.3 ms vs 79.3-86.0 ms: 0.91-0.97x
    growth         before 10.0x vs git's 8.2x     now 4.4-4.8x vs git's 7.8-9.2x: 0.52-0.56x

At 20,000 files a step's verify is now one `git status` (stat data trusted, untracked cache),
one `git update-index` and one `git write-tree` (63-65 ms, about 50 of them git's: 19 ms of
stat calls, two index writes of 9 ms), where it was a libgit2 status walk, and the commit
another (87 and 106 ms). At 100 files libgit2 stages in process (bench/scan.py: three git
processes cost more than the scan there); what is left there is fixed per step (below).

Then, per step at 100 files, what was fixed per step (same machine, best of 5, coder's main
and this code interleaved in pairs of runs, 13 pairs; ms):

    phase      before (best run)   after (best run)
    command     4.0                 3.1     the command's output read by the waiting thread
                                            (poll), not two reader threads a command
    act         3.3                 1.9     the command's TMPDIR reused while left empty (a
                                            mkdir and an rmdir cost 1-2 ms on this disk)
    verify     10.3                 5.8     no `sh` started to end leftovers when none can be
                                            left (coder.policy.reaper); one repository open for
                                            verify and commit, not four
    commit      3.8                 2.0     the diff artifact from the change set verify staged
    next        1.3                 0.9
    per step   22.7 (git 13.0)     13.8 (git 11.6)
    ratio      1.14-3.41x          1.08-1.82x over the pairs (the machine's noise, load 2-6,
                                   is larger than the gap left; the best runs 1.75x, 1.19x)

What stayed per step at 100 files, and why (the third cut):
    the command's own process   git's loop runs `echo` inside its shell; coder starts every
                                command as a new confined process (its sandbox, its group)
    (no fsync)                  since the fourth cut neither the `running` line nor the
                                `success` line of a step that committed is fsync'd: a kill
                                keeps them, and after a power loss resume reconciles the
                                worktree against git (docs/safety.md); a step that committed
                                nothing still fsyncs its `success` line
    libgit2's writes            the blob, the changed trees, the index, the commit object, the
                                ref and its reflogs: what git's loop writes too (each file
                                created or renamed costs 0.3-0.5 ms on this disk). Turning
                                libgit2's strict object checks off changed nothing measurable
                                (tried: write_tree took the same time)
    two artifacts               the command's log and the step's diff under .coder/artifacts
    the leftover check          /proc/self/task/*/children read twice (about 0.3 ms) instead of
                                an `sh` in the sandbox (1.5-2 ms); the kill still runs whenever
                                coder has a child it does not know (see coder/policy/reaper.py)

In the same session at 20,000 files: 0.72x, 0.86x and 1.11x (three runs, best of 3; 125.8 vs
175.1, 151.6 vs 175.3, 122.8 vs 110.4 ms; verify 109-131 ms, git's own scan and writes), growth
0.48-0.74x git's; the steps axis (`--step-counts 20 2020`) 0.85x, 0.89x, 0.99x and 1.62x over
four runs (the last against a 20-step best taken in a quiet moment; no growth within that run: its
last tenth 0.99x its first), main's 0.81x; harness per no-op step 10.5-15.8 ms, main's 20.5.

Both start measuring in a settled worktree: a 20,000-file checkout leaves seconds of disk
writeback behind, which would slow whatever runs first. The taskfile's step w0 (not measured,
makes no commit) calls os.sync(); the git loop is preceded by os.sync() too.

Each coder run checks out its own worktree (as `coder run` does); the git loops check out one
worktree per size and repeat there, committing new content each time.
Also printed, for information: coder's total wall time and fixed cost (start-up, validation,
worktree checkout: the time before step w0 starts), the git CLI's own growth with repository
size, and where a coder step's time goes, from the gaps between its events:
    command    the sandboxed command itself (`command.finished` duration_s)
    act        step.started -> command.finished, less the command (guard snapshot, spawn,
               command log)
    verify     command.finished -> step.acted (.git guard check; the one scan, which stages
               the step's changes and gives the change set; asserts and checks on it)
    commit     step.acted -> step.succeeded (the commit object for the staged tree, the diff
               artifact, checkpoint "success")
    next       step.succeeded -> next step.started (scheduling, the `running` line)
The git CLI runs with global and system config ignored, the identity set in the repository's
config (never globally) and gc.auto=0. Everything lives in one temporary directory, removed at
the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
FILES_PER_DIR = 50
DIRS_PER_LEVEL = 20
PHASES = ("command", "act", "verify", "commit", "next")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=GIT_ENV,
        check=True,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ).stdout


def coder_cmd() -> list[str]:
    exe = shutil.which("coder", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "coder"]


# --- fixtures ------------------------------------------------------------------------------------


def file_path(i: int) -> str:
    """File i of a generated repository."""
    top, mid = i // (FILES_PER_DIR * DIRS_PER_LEVEL), (i // FILES_PER_DIR) % DIRS_PER_LEVEL
    return f"d{top}/e{mid}/f{i}.txt"


def make_repo(root: Path, files: int) -> Path:
    root.mkdir(parents=True)
    for i in range(files):
        path = root / file_path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {i}\nsome text that does not matter\n")
    git(root, "init", "-q", "-b", "main")
    for key, value in (
        ("user.name", "Bench"),
        ("user.email", "bench@localhost"),
        ("gc.auto", "0"),
        ("commit.gpgsign", "false"),
    ):
        git(root, "config", key, value)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", f"{files} files")
    git(root, "gc", "-q")  # packed, as a clone is: what users' repositories look like
    return root


def targets(files: int, steps: int) -> list[str]:
    """`steps` different existing files, spread over the whole tree."""
    if steps > files:
        raise SystemExit(f"--steps ({steps}) cannot exceed the smallest repository ({files} files)")
    return [file_path(k * files // steps) for k in range(steps)]


def write_taskfile(path: Path, task_id: str, paths: list[str]) -> None:
    lines = [
        f"id: {task_id}",
        "title: Step overhead benchmark",
        "graph:",
        "  - id: w0",
        "    kind: shell",
        "    goal: Let the fresh worktree settle (not measured)",
        f"    cmd: {sys.executable} -c 'import os; os.sync()'",
    ]
    for i, rel in enumerate(paths, 1):
        lines += [
            f"  - id: s{i}",
            "    kind: shell",
            f"    goal: Overwrite {rel}",
            f"    cmd: echo {task_id} step {i} > {rel}",
        ]
    path.write_text("\n".join(lines) + "\n")


def check_commits(repo: Path, revs: str, n: int) -> None:
    """`revs` holds exactly n commits of one changed file each: the benchmark measures what it
    says it does."""
    out = git(repo, "log", "--format=%x00", "--name-only", revs)
    counts = [len(chunk.split()) for chunk in out.split("\0")[1:]]
    if len(counts) != n or any(c != 1 for c in counts):
        raise SystemExit(f"expected {n} one-file commits in {revs}, got {counts}")


# --- coder ---------------------------------------------------------------------------------------


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def phases(events: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per measured step spent between consecutive events (see the module docstring)."""
    total = dict.fromkeys(PHASES, 0.0)
    steps = 0
    current: dict[str, float] = {}
    for e in events:
        name, t = e["event"], _ts(e)
        if current and name in ("step.started", "run.finished"):  # ends the step before
            total["next"] += t - current["step.succeeded"]
            current = {}
        if e.get("step_id", "w0") == "w0":
            continue
        if name == "step.started":
            current, steps = {name: t}, steps + 1
        elif name == "command.finished":
            total["command"] += e["duration_s"]
            total["act"] += t - current["step.started"] - e["duration_s"]
            current[name] = t
        elif name == "step.acted":
            total["verify"] += t - current["command.finished"]
            current[name] = t
        elif name == "step.succeeded":
            total["commit"] += t - current["step.acted"]
            current[name] = t
    return {k: v / steps for k, v in total.items()}


def coder_run(repo: Path, taskfile: Path, task_id: str) -> tuple[float, list[dict[str, Any]]]:
    """`coder run` of a taskfile: its wall time in seconds and the events it logged."""
    start = time.perf_counter()
    proc = subprocess.run(
        [*coder_cmd(), "run", "--autonomous", "--json", "-f", str(taskfile)],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"coder run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    log = repo / ".coder" / "logs" / f"{task_id}.jsonl"
    return wall, [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def run_coder(repo: Path, tmp: Path, task_id: str, paths: list[str]) -> dict[str, Any]:
    """One `coder run` in its own worktree; seconds: wall, fixed, per step, per phase."""
    taskfile = tmp / f"{task_id}.yaml"
    write_taskfile(taskfile, task_id, paths)
    wall, events = coder_run(repo, taskfile, task_id)
    started = {e["step_id"]: _ts(e) for e in events if e["event"] == "step.started"}
    finished = next(_ts(e) for e in events if e["event"] == "run.finished")
    check_commits(repo, f"main..{_branch_of(repo, task_id)}", len(paths))
    git(repo, "worktree", "remove", "--force", str(repo / ".coder" / "worktrees" / task_id))
    return {
        "wall": wall,
        "fixed": wall - (finished - started["w0"]),
        "step": (finished - started["s1"]) / len(paths),
        "phases": phases(events),
    }


def _branch_of(repo: Path, task_id: str) -> str:
    return next(
        b
        for b in git(repo, "branch", "--format=%(refname:short)").split()
        if b.startswith(f"agent/{task_id}")
    )


# --- the git CLI baseline ------------------------------------------------------------------------


class GitLoop:
    """The same changes by the git CLI, in one fresh linked worktree of the repository: each
    step's command inside the loop's own shell (`inline`), or through `bash -c` in a child
    process (`spawned`), as any harness that runs a step's command must start one."""

    def __init__(self, repo: Path, worktree: Path, paths: list[str]) -> None:
        self.repo, self.worktree, self.paths = repo, worktree, paths
        git(repo, "worktree", "add", "-q", "-b", "baseline", str(worktree), "main")
        self.runs = 0

    def run(self, spawned: bool) -> float:
        """Seconds per step of one pass over the N changes."""
        self.runs += 1
        script = "set -e\n"
        for i, rel in enumerate(self.paths, 1):
            command = f"echo baseline {self.runs} step {i} > {rel}"
            script += f"bash -c {shlex.quote(command)}\n" if spawned else f"{command}\n"
            script += "git add -A && git commit -q -m x\n"
        os.sync()
        start = time.perf_counter()
        subprocess.run(["bash", "-c", script], cwd=self.worktree, env=GIT_ENV, check=True)
        elapsed = time.perf_counter() - start
        n = len(self.paths)
        check_commits(self.repo, f"baseline~{n}..baseline", n)
        return elapsed / n

    def close(self) -> None:
        git(self.repo, "worktree", "remove", "--force", str(self.worktree))


# --- profile -------------------------------------------------------------------------------------


def profile_steps(repo: Path, tmp: Path, paths: list[str], top: int = 30) -> None:
    """cProfile coder's measured steps (s1..sN, in this process), by cumulative and own time."""
    import cProfile
    import pstats

    from coder.run import executor
    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    profiler = cProfile.Profile()
    stages = ("_attempts", "_record")  # the step pipeline: start ... commit, then record
    originals = {name: getattr(executor.Executor, name) for name in stages}

    def profiled(original: Any) -> Any:
        def stage(self: Any, step: Any, *args: Any) -> Any:
            if step.id == "w0":
                return original(self, step, *args)
            profiler.enable()
            try:
                return original(self, step, *args)
            finally:
                profiler.disable()

        return stage

    task_id = "bench-profile"
    taskfile = tmp / f"{task_id}.yaml"
    write_taskfile(taskfile, task_id, paths)
    for name, original in originals.items():
        setattr(executor.Executor, name, profiled(original))
    try:
        result = start_run(taskfile, cwd=repo, options=RunOptions())
    finally:
        for name, original in originals.items():
            setattr(executor.Executor, name, original)
    if result.status != "success":
        raise SystemExit(f"profiled run ended {result.status}: {result.state.error}")
    stats = pstats.Stats(profiler)
    per_step = stats.total_tt / len(paths)  # type: ignore[attr-defined]
    print(
        f"\ncProfile of coder's steps in {repo.name} ({per_step * 1000:.1f} ms a step under "
        "the profiler), by cumulative time:"
    )
    stats.sort_stats("cumulative").print_stats(top)
    print("by own time:")
    stats.sort_stats("tottime").print_stats(top)
    if os.environ.get("BENCH_CALLERS"):  # who calls what: e.g. BENCH_CALLERS=rmdir
        stats.print_callers(os.environ["BENCH_CALLERS"])


def profile_growth(counts: list[int], top: int = 20) -> None:
    """cProfile a whole run of each count of no-op steps (in this process) and print the
    functions whose own time per step grew most from the smallest count to the largest: a
    per-step cost that grows with the run's size is at the top of this list."""
    import cProfile
    import pstats

    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    per_step: dict[int, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="coder-steps-profile-") as tmp_name:
        tmp = Path(tmp_name)
        repo = make_repo(tmp / "repo", 10)
        for n in (counts[0], counts[-1]):
            taskfile = tmp / f"profile-{n}.yaml"
            write_noop_taskfile(taskfile, f"profile-{n}", n)
            profiler = cProfile.Profile()
            profiler.enable()
            result = start_run(taskfile, cwd=repo, options=RunOptions())
            profiler.disable()
            if result.status != "success":
                raise SystemExit(f"profiled run ended {result.status}: {result.state.error}")
            stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
            per_step[n] = {
                f"{Path(where).name}:{line}:{name}": (own / n, calls / n)
                for (where, line, name), (_, calls, own, _, _) in stats.items()
            }
    small, large = per_step[counts[0]], per_step[counts[-1]]
    grown = sorted(large, key=lambda f: large[f][0] - small.get(f, (0.0, 0.0))[0], reverse=True)[
        :top
    ]
    print(f"\nown time per step, {counts[-1]:,} vs {counts[0]:,} steps (ms; calls per step):")
    for f in grown:
        (t1, c1), (t0, c0) = large[f], small.get(f, (0.0, 0.0))
        print(f"  {t1 * 1000:7.3f} vs {t0 * 1000:7.3f}  calls {c1:7.1f} vs {c0:7.1f}  {f}")


# --- the steps axis -----------------------------------------------------------------------------


def write_noop_taskfile(path: Path, task_id: str, steps: int) -> None:
    """`steps` no-op shell steps in file order (no depends_on): w0, not measured, then s1..."""
    lines = [f"id: {task_id}", "title: Steps axis", "graph:"]
    lines += [
        f"  - {{id: {sid}, kind: shell, cmd: 'true'}}"
        for sid in ("w0", *(f"s{i}" for i in range(1, steps)))
    ]
    path.write_text("\n".join(lines) + "\n")


def harness_gaps(events: list[dict[str, Any]]) -> list[float]:
    """Seconds each measured step took, from its start to the next step's start, less its
    command's own duration (the last step, which the run's end follows, is left out)."""
    starts = [(e["step_id"], _ts(e)) for e in events if e["event"] == "step.started"]
    starts = [(sid, t) for sid, t in starts if sid != "w0"]
    command = {e["step_id"]: e["duration_s"] for e in events if e["event"] == "command.finished"}
    return [end - t - command[sid] for (sid, t), (_, end) in zip(starts, starts[1:])]


def run_noop(repo: Path, tmp: Path, task_id: str, steps: int) -> dict[str, float]:
    taskfile = tmp / f"{task_id}.yaml"
    write_noop_taskfile(taskfile, task_id, steps)
    wall, events = coder_run(repo, taskfile, task_id)
    gaps = harness_gaps(events)
    tenth = max(1, len(gaps) // 10)
    git(repo, "worktree", "remove", "--force", str(repo / ".coder" / "worktrees" / task_id))
    return {
        "wall": wall,
        "mean": statistics.fmean(gaps),
        "median": statistics.median(gaps),
        "first": statistics.fmean(gaps[:tenth]),  # the run's first and last tenth: a cost
        "last": statistics.fmean(gaps[-tenth:]),  # growing with the steps done shows here
        "max": max(gaps),
    }


def steps_axis(counts: list[int], rounds: int) -> None:
    """Rounds of one run of each count, in turn; the median over the rounds of each count's
    per-run mean, so a busy spell slows a round's runs alike rather than one count's best."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coder-steps-bench-") as tmp_name:
        tmp = Path(tmp_name)
        repo = make_repo(tmp / "repo", 10)
        runs: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
        for k in range(rounds):
            for n in counts:
                runs[n].append(run_noop(repo, tmp, f"steps-{n}-{k}", n))
        for n in counts:
            means = [r["mean"] for r in runs[n]]
            growth = [r["last"] / r["first"] for r in runs[n]]
            print(
                f"{n:,} no-op steps, {rounds} interleaved runs: coder total "
                f"{statistics.median(r['wall'] for r in runs[n]):.1f}s; harness per step mean "
                f"{_spread(means)} ms; median step "
                f"{_spread([r['median'] for r in runs[n]])} ms; slowest step "
                f"{_spread([r['max'] for r in runs[n]])} ms; last tenth vs first "
                f"{statistics.median(growth):.2f}x"
            )
        smallest = counts[0]
        base = statistics.median(r["mean"] for r in runs[smallest])
        for n in counts[1:]:
            ours = statistics.median(r["mean"] for r in runs[n])
            pairs = [a["mean"] / b["mean"] for a, b in zip(runs[n], runs[smallest], strict=True)]
            report(
                f"harness per step, {n:,} vs {smallest:,} steps",
                ours,
                base,
                1.3,
                base_name=f"{smallest:,} steps",
                rounds=pairs,
            )
    print(f"(benchmark took {time.perf_counter() - began:.0f}s)")


def _spread(values: list[float]) -> str:
    """`median (min-max)`, in ms."""
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f})"


# --- main ----------------------------------------------------------------------------------------


def report(
    name: str,
    ours: float,
    base: float,
    goal: float | None,
    base_name: str = "git CLI",
    rounds: list[float] | None = None,
) -> None:
    """One figure: the ratio of the medians, with each round's own ratio's range."""
    ratio = ours / base
    verdict = (
        "for information"
        if goal is None
        else f"goal <= {goal}x: {'ok' if ratio <= goal else 'OVER GOAL'}"
    )
    spread = f", rounds {min(rounds):.2f}-{max(rounds):.2f}x" if rounds else ""
    print(
        f"{name:<44} {ours * 1000:8.1f} ms  {base_name:>16} {base * 1000:8.1f} ms  "
        f"ratio {ratio:5.2f}x  ({verdict}{spread})"
    )


def measure_size(tmp: Path, size: int, paths: list[str], rounds: int) -> dict[str, Any]:
    """`rounds` rounds of the inline loop, the spawned loop and a coder run, in turn, in a
    packed repository of `size` files: each one's per-step times, and coder's phases in its
    median run."""
    t0 = time.perf_counter()
    repo = make_repo(tmp / f"repo{size}", size)
    made = time.perf_counter() - t0
    loop = GitLoop(repo, tmp / f"baseline{size}", paths)
    inline: list[float] = []
    spawned: list[float] = []
    coder: list[dict[str, Any]] = []
    try:
        for k in range(rounds):
            inline.append(loop.run(spawned=False))
            spawned.append(loop.run(spawned=True))
            coder.append(run_coder(repo, tmp, f"bench-{size}-{k}", paths))
    finally:
        loop.close()
    middle = sorted(coder, key=lambda r: r["step"])[len(coder) // 2]
    return {"made": made, "inline": inline, "spawned": spawned, "coder": coder, "middle": middle}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[100, 20_000],
        help="repository sizes in files (default: 100 20000)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="interleaved rounds, medians kept (default 5)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then cProfile coder's steps in the largest repository (with --step-counts: "
        "what grew per step from the shortest run to the longest)",
    )
    parser.add_argument(
        "--step-counts",
        type=int,
        nargs="+",
        metavar="N",
        help="run the steps axis instead: runs of N no-op steps (e.g. 10 1000 10000)",
    )
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be positive")
    if args.step_counts:
        if min(args.step_counts) < 2:
            parser.error("--step-counts must be at least 2")
        counts = sorted(set(args.step_counts))
        steps_axis(counts, args.repeats or 5)
        if args.profile:
            profile_growth(counts)
        return
    if args.steps < 1 or min(args.sizes) < 1:
        parser.error("--steps and --sizes must be positive")
    rounds = args.repeats or 5
    sizes = sorted(set(args.sizes))
    paths_for = {size: targets(size, args.steps) for size in sizes}

    began = time.perf_counter()
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="coder-step-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for size in sizes:
            got = measure_size(tmp, size, paths_for[size], rounds)
            steps = [r["step"] for r in got["coder"]]
            ours = statistics.median(steps)
            spawned, inline = statistics.median(got["spawned"]), statistics.median(got["inline"])
            results[size] = {"coder": ours, "spawned": spawned}
            middle = got["middle"]
            print(
                f"{size:,} files, packed (made in {got['made']:.1f}s), {args.steps} steps, "
                f"{rounds} interleaved rounds, medians: coder total {middle['wall']:.2f}s, "
                f"fixed cost {middle['fixed']:.2f}s (start-up, worktree checkout)"
            )
            report(
                f"coder per step vs bash -c loop ({size:,} files)",
                ours,
                spawned,
                1.0,
                base_name="git, bash -c",
                rounds=[c / g for c, g in zip(steps, got["spawned"], strict=True)],
            )
            report(
                f"  vs the inline loop ({size:,} files)",
                ours,
                inline,
                None,
                base_name="git, inline",
                rounds=[c / g for c, g in zip(steps, got["inline"], strict=True)],
            )
            print(
                f"{'':<4}where it goes (median run): "
                + ", ".join(f"{k} {v * 1000:.1f}" for k, v in middle["phases"].items())
                + " (ms)"
            )
        if len(sizes) > 1:
            small, large = results[sizes[0]], results[sizes[-1]]
            ours = large["coder"] / small["coder"]
            theirs = large["spawned"] / small["spawned"]
            growth = ours / theirs
            verdict = "ok" if growth <= 1.0 else "OVER GOAL"
            print(
                f"{f'growth, {sizes[-1]:,} vs {sizes[0]:,} files':<44} coder {ours:5.2f}x  "
                f"git, bash -c {theirs:5.2f}x  ratio {growth:5.2f}x  (goal <= 1.0x: {verdict})"
            )
        print(f"(benchmark took {time.perf_counter() - began:.0f}s)")
        if args.profile:
            profile_steps(tmp / f"repo{sizes[-1]}", tmp, paths_for[sizes[-1]])


if __name__ == "__main__":
    main()
