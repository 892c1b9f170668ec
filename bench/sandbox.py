"""The kernel sandbox's cost per command, as ratios against what a command cost before.

The figure that counts is the sandbox's own cost: a confined spawn against an unconfined one.
bench/step_overhead.py's baseline starts each step's command unconfined (`bash -c` in a
child process), so what the sandbox adds on top of that is measured here, apart:

    process: `bash -c true` started confined (Landlock, private network, the view of
        coder.policy.view or the read-only mount namespace, and seccomp) and waited for
        vs  a plain `bash -c true` (no namespace, no sandbox)                 goal <= 1.2x
        vs  the same under Landlock alone (the sandbox before the metadata wall)  goal <= 1.2x
        vs  `unshare --map-current-user --net -- bash -c true` (before the sandbox)  goal < 1.3x
    run_command("true") sandboxed
        vs  run_command("true") with "sandbox": "off" (the path before)      goal < 1.3x

Rounds alternate between the sides, so a busy, shared machine slows both alike; the median of
each side is reported. The walls are made once per spawner thread, so they cost nothing per
command; what a command pays is a larger mount table to copy at fork (none: a fork shares the
thread's namespace) and the seccomp filter run on each of its system calls.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from coder.policy import confine, kernel, writes

ROUNDS = 200


def main() -> None:
    from coder.policy.commands import Policy
    from coder.policy.sandbox import run_command

    found = kernel.support()
    if not found.available:
        print(f"sandbox: not available here ({found.problem}); nothing to measure")
        return
    prefix = kernel.unshare_prefix() or ()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp2:
        worktree = Path(tmp)
        spawner = confine.confinement(writes.Profile(writes.writable_for(worktree)))
        landlock_only = _without_the_wall(writes.Profile((tmp2,)))

        def process(start: Callable[..., subprocess.Popen[bytes]], argv: list[str]) -> None:
            proc = start(argv, stdin=subprocess.DEVNULL, start_new_session=True)
            assert proc.wait() == 0

        def command(policy: Policy) -> None:
            assert run_command("true", cwd=worktree, policy=policy, root=worktree).ok

        true = ["bash", "-c", "true"]
        sides: dict[str, Callable[[], None]] = {
            "plain": lambda: process(subprocess.Popen, true),
            "unshare": lambda: process(subprocess.Popen, [*prefix, *true]),
            "landlock": lambda: process(landlock_only.popen, true),
            "walled": lambda: process(spawner.popen, true),
            "command before": lambda: command(Policy(sandbox=False)),
            "command sandboxed": lambda: command(Policy()),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        for fn in sides.values():  # warm up: probes, the spawner threads
            fn()
        for _ in range(ROUNDS):
            for name, fn in sides.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        landlock_only.stop()
    ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
    wall = "mount namespace" if found.mounts_problem is None else "no mount namespace"
    wall += ", view" if found.view_problem is None else ", no view"
    wall += ", seccomp" if found.setid_problem is None else ", no seccomp"
    print(f"Landlock ABI {found.abi}, network namespace: {found.netns}, metadata wall: {wall}")
    print(f"{ROUNDS} interleaved rounds, medians; bash -c true")
    print("the sandbox's own cost:")
    _line("process, confined", ms["walled"], "unconfined", ms["plain"], 1.2)
    print("against the sandbox's earlier shapes:")
    _line("process, confined", ms["walled"], "Landlock alone", ms["landlock"], 1.2)
    _line("process, confined", ms["walled"], "unshare, no sandbox", ms["unshare"], 1.3)
    _line("run_command", ms["command sandboxed"], "sandbox off", ms["command before"], 1.3)


def _without_the_wall(profile: writes.Profile) -> confine.Confinement:
    """A spawner confined as before the metadata wall: Landlock and the network namespace."""
    found = kernel.support()
    before = dataclasses.replace(
        found, mounts_problem="off", setid_problem="off", view_problem="off"
    )
    with mock.patch.object(kernel, "support", lambda: before):
        return confine.Confinement(profile)


def _line(what: str, ours: float, than: str, base: float, goal: float) -> None:
    ratio = ours / base
    verdict = "ok" if ratio <= goal else "OVER GOAL"
    print(
        f"{what:<18} {ours:6.2f} ms  vs {than:<20} {base:6.2f} ms  ratio {ratio:4.2f}x"
        f"  (goal <= {goal}x: {verdict})"
    )


if __name__ == "__main__":
    main()
