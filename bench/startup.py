"""Start-up and validation speed, as ratios against baselines measured in the same run.

    coder --help                      vs  python -c "import click"          goal <= 1.3x
    coder status (no runs yet)        vs  python -c "import click"          goal <= 1.3x
    coder status (one finished run)   vs  python -c "import click"          for information
    coder show -t (that run)          vs  python -c "import click"          for information
    coder validate (1,000 steps)      vs  python -c "yaml.safe_load(...)"   goal <= 1.5x

Each command runs in a fresh process (what a user waits for), interleaved with its baseline
(each round runs every command once); the figure is the median of the rounds' ratios, each
comparing two runs moments apart on a noisy, shared machine, with their range. Every command
reads its modules as bytecode, as an installed coder does (pip compiles a wheel's modules),
from a cache of this run's own (`bytecode_env`). `coder status` runs in a git
repository of its own; with a run there it also reads that run's state (its schema check only
the first time: `.coder/cache/state/`), and so does `coder show -t`, which prints it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 15


def bytecode_env(cache: Path) -> dict[str, str]:
    """The environment every command runs in: bytecode written to and read from `cache`.

    Click comes compiled (pip compiles what it installs); coder from a source checkout under
    PYTHONDONTWRITEBYTECODE (tox's test environments set it) has no bytecode, and compiling
    its command line's modules was a sixth of `coder --help`, which no installed coder pays.
    With one cache for every module, baseline and coder alike, both read bytecode once the
    untimed first round has written it."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def once(cmd: list[str], cwd: Path | None, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def interleaved(
    cmds: dict[str, tuple[list[str], Path | None]], runs: int, env: dict[str, str]
) -> dict[str, list[float]]:
    """The times of each command over `runs` rounds, each round running every command once
    in turn: a baseline and what is compared with it see the same moments of a noisy machine
    (measuring one after the other, a busy spell during either moves the ratio by 30%). A first
    round, not timed, writes the bytecode."""
    for cmd, cwd in cmds.values():
        once(cmd, cwd, env)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, (cmd, cwd) in cmds.items():
            times[name].append(once(cmd, cwd, env))
    return times


def big_taskfile(path: Path, steps: int = 1000) -> None:
    lines = ["title: A generated taskfile with many steps", "graph:"]
    for i in range(1, steps + 1):
        deps = f"[s{i - 1}]" if i > 1 else "[]"
        kind = ("shell", "edit", "test", "analyze")[i % 4]
        lines += [
            f"  - id: s{i}",
            f"    kind: {kind}",
            f"    goal: Step number {i} of the plan",
            f"    depends_on: {deps}",
            "    timeout: 5m",
        ]
        if kind == "shell":
            lines.append(f"    cmd: echo step {i} > out{i}.txt")
    path.write_text("\n".join(lines) + "\n")


def coder_cmd() -> list[str]:
    exe = shutil.which("coder", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "coder"]


def report(name: str, ours: list[float], base: list[float], goal: float | None) -> None:
    """The median of the rounds' ratios, judged against the goal, with their range; the
    medians' times. Each round's ratio compares two runs moments apart: under load a best of
    N compared two different moments (one quiet spell for the baseline and none for coder
    moved `--help` from 1.0x to 1.65x in one run)."""
    ratios = sorted(o / b for o, b in zip(ours, base, strict=True))
    ratio = statistics.median(ratios)
    if goal is None:
        verdict = "for information"
    else:
        verdict = f"goal <= {goal}x: {'ok' if ratio <= goal else 'OVER GOAL'}"
    print(
        f"{name:<34} {statistics.median(ours) * 1000:8.1f} ms  "
        f"baseline {statistics.median(base) * 1000:8.1f} ms  "
        f"ratio {ratio:5.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}x)  ({verdict})"
    )


def git_repo(root: Path) -> Path:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    root.mkdir()
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.name", "Bench"],
        ["config", "user.email", "bench@localhost"],
        ["commit", "-q", "--allow-empty", "-m", "init"],
    ):
        subprocess.run(["git", *args], cwd=root, env=env, check=True)
    return root


def main() -> None:
    coder = coder_cmd()
    with tempfile.TemporaryDirectory() as tmp:
        env = bytecode_env(Path(tmp) / "bytecode")
        repo = git_repo(Path(tmp) / "repo")
        fresh = git_repo(Path(tmp) / "fresh")
        task = Path(tmp) / "one.yaml"
        task.write_text("id: one\ntitle: One step\ngraph:\n  - {kind: shell, cmd: 'true'}\n")
        subprocess.run(
            [*coder, "run", "--autonomous", "-f", str(task)],
            cwd=repo,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        times = interleaved(
            {
                "click": ([sys.executable, "-c", "import click"], None),
                "help": ([*coder, "--help"], None),
                "status": ([*coder, "status"], fresh),
                "status, one run": ([*coder, "status"], repo),
                "show": ([*coder, "show", "-t", "one"], repo),
            },
            RUNS,
            env,
        )
        report("coder --help", times["help"], times["click"], 1.3)
        report("coder status (no runs yet)", times["status"], times["click"], 1.3)
        report("coder status (one finished run)", times["status, one run"], times["click"], None)
        report("coder show -t (that run)", times["show"], times["click"], None)
        path = Path(tmp) / "big.yaml"
        big_taskfile(path)
        times = interleaved(
            {
                "yaml": (
                    [sys.executable, "-c", f"import yaml; yaml.safe_load(open({str(path)!r}))"],
                    None,
                ),
                "validate": ([*coder, "validate", "-f", str(path)], None),
            },
            8,
            env,
        )
        report("coder validate (1,000 steps)", times["validate"], times["yaml"], 1.5)


if __name__ == "__main__":
    main()
