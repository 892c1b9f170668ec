"""`python -m coder.policy.launch PROFILE -- PROGRAM ARGS...`: join the process tree
PROFILE (JSON) names (coder.policy.proctrees), confine this process as `confine.launcher_argv`
described it, then become PROGRAM.

It runs single-threaded, so a non-root user gets a user namespace of its own first
(coder.policy.userns) and with it the same view and walls as root (coder.policy.view)."""

from __future__ import annotations

import json
import os
import sys

from coder.policy import confine, proctrees, userns


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m coder.policy.launch PROFILE -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    userns.enter()  # single-threaded here: a user namespace of its own, if it needs one
    spec = json.loads(argv[0])
    try:  # before confining: the cgroup files and the pid file are outside the sandbox
        proctrees.enter(spec.get("tree") or {})
    except OSError as exc:
        print(f"coder: cannot put {argv[2]} in a process tree: {exc}", file=sys.stderr)
        return 1
    profile = confine.Profile(
        tuple(spec["writable"]),
        network=bool(spec["network"]),
        readonly=tuple(spec["readonly"]),
        visible=tuple(spec["visible"]),
    )
    confine.confine_current_thread(profile, spec["tmp"], netns_done=bool(spec["netns_done"]))
    os.environ.update(TMPDIR=spec["tmp"], TMP=spec["tmp"], TEMP=spec["tmp"])
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as exc:
        print(f"coder: cannot start {argv[2]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
