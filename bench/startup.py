"""Start-up and validation speed, as ratios against baselines measured in the same run.

    coder --help                      vs  python -c "import click"          goal <= 1.5x
    coder validate (1,000 steps)      vs  python -c "yaml.safe_load(...)"   goal <= 3x

Each command runs in a fresh process (what a user waits for); the best of N runs is kept,
which is the figure least disturbed by a noisy, shared machine.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 15


def best_of(cmd: list[str], runs: int = RUNS) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


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


def report(name: str, ours: float, base: float, goal: float) -> None:
    ratio = ours / base
    verdict = "ok" if ratio <= goal else "OVER GOAL"
    print(
        f"{name:<34} {ours * 1000:8.1f} ms  baseline {base * 1000:8.1f} ms  "
        f"ratio {ratio:5.2f}x  (goal <= {goal}x: {verdict})"
    )


def main() -> None:
    coder = coder_cmd()
    click_base = best_of([sys.executable, "-c", "import click"])
    report("coder --help", best_of([*coder, "--help"]), click_base, 1.5)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.yaml"
        big_taskfile(path)
        yaml_base = best_of(
            [sys.executable, "-c", f"import yaml; yaml.safe_load(open({str(path)!r}))"], runs=5
        )
        report(
            "coder validate (1,000 steps)",
            best_of([*coder, "validate", "-f", str(path)], 5),
            yaml_base,
            3.0,
        )


if __name__ == "__main__":
    main()
