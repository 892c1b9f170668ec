"""The kernel sandbox's cost per command, as ratios against what a command cost before it.

    process: `bash -c true` started confined (Landlock, private network) and waited for
        vs  `unshare --map-current-user --net -- bash -c true` (before)      goal < 1.3x
    run_command("true") sandboxed
        vs  run_command("true") with "sandbox": "off" (the path before)      goal < 1.3x

Rounds alternate between the sides, so a busy, shared machine slows both alike; the median of
each side is reported.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROUNDS = 200


def main() -> None:
    from coder.policy import confine
    from coder.policy.commands import Policy
    from coder.policy.sandbox import run_command

    found = confine.support()
    if not found.available:
        print(f"sandbox: not available here ({found.problem}); nothing to measure")
        return
    prefix = confine.unshare_prefix() or ()
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp)
        spawner = confine.confinement(confine.Profile(confine.writable_for(worktree)))

        def process(start: Callable[..., subprocess.Popen[bytes]], argv: list[str]) -> None:
            proc = start(argv, stdin=subprocess.DEVNULL, start_new_session=True)
            assert proc.wait() == 0

        def command(policy: Policy) -> None:
            assert run_command("true", cwd=worktree, policy=policy, root=worktree).ok

        sides: dict[str, Callable[[], None]] = {
            "process before": lambda: process(subprocess.Popen, [*prefix, "bash", "-c", "true"]),
            "process sandboxed": lambda: process(spawner.popen, ["bash", "-c", "true"]),
            "command before": lambda: command(Policy(sandbox=False)),
            "command sandboxed": lambda: command(Policy()),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        for fn in sides.values():  # warm up: probes, the spawner thread
            fn()
        for _ in range(ROUNDS):
            for name, fn in sides.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    print(f"Landlock ABI {found.abi}, network namespace: {found.netns}; {ROUNDS} rounds")
    for what in ("process", "command"):
        before = statistics.median(times[f"{what} before"])
        ours = statistics.median(times[f"{what} sandboxed"])
        ratio = ours / before
        print(
            f"{what + ' (bash -c true)':<24} sandboxed {ours * 1000:6.2f} ms  "
            f"before {before * 1000:6.2f} ms  ratio {ratio:4.2f}x  "
            f"(goal < 1.3x: {'ok' if ratio < 1.3 else 'OVER GOAL'})"
        )


if __name__ == "__main__":
    sys.exit(main())
