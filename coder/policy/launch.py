"""`python -m coder.policy.launch PROFILE -- PROGRAM ARGS...`: join the process tree
PROFILE (JSON) names (coder.policy.proctrees), confine this process as `launcher_argv`
described it, then become PROGRAM.

It runs single-threaded, so a non-root user gets a user namespace of its own first
(coder.policy.userns) and with it the same view and walls as root (coder.policy.view)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from coder.errors import EnvironmentProblem
from coder.policy import confine, kernel, proctrees, userns, view, writes


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
    profile = writes.Profile(
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


def launcher_argv(
    argv: list[str],
    root: Path,
    *,
    network: bool,
    visible: Iterable[str] = (),
    tree: dict[str, str] | None = None,
) -> list[str]:
    """`argv` wrapped to run confined to `root` (as `writable_for` says) by a launcher process:
    for programs coder does not start itself (external MCP servers, started by the MCP SDK),
    where one Python start per long-lived server costs nothing that matters. The program
    sees, besides the system, the toolchain of coder's PATH and of its own directory, and
    `visible` (the config's `visible_paths`). `tree`: the process tree it joins first
    (coder.policy.proctrees)."""
    found = kernel.support()
    if not found.available:
        raise EnvironmentProblem(f"no command sandbox: {found.problem}")
    prefix = kernel.unshare_prefix() if not network and found.netns == "per-command" else None
    writable = writes.writable_for(root)
    profile = {
        "writable": list(writable),
        "readonly": list(writes.admin_files(writable)),
        "network": network,
        "tmp": confine.new_tmp_root(),
        "netns_done": prefix is not None,
        "visible": [*_toolchain(argv[0], root), *_named(argv[1:]), *visible],
        "tree": tree or {},
    }
    launcher = [sys.executable, "-I", "-m", "coder.policy.launch", json.dumps(profile), "--"]
    return [*(prefix or ()), *launcher, *argv]


def _toolchain(program: str, cwd: Path) -> tuple[str, ...]:
    """What a program started by name from `cwd` runs from (coder.policy.view.toolchain): the
    toolchain of PATH, and of the directory the program is found in."""
    path_var = os.environ.get("PATH", "")
    found = shutil.which(os.path.join(cwd, program) if "/" in program else program)
    where = os.path.dirname(os.path.abspath(found)) if found else ""
    return view.toolchain(f"{path_var}{os.pathsep}{where}")


def _named(args: list[str]) -> list[str]:
    """The files and directories a server's own command line names by absolute path (its
    script, `/home/me/tools/server.py`; its config): the server you configured runs from them,
    so its view shows them read-only (a file's whole directory, for what it imports)."""
    found = []
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        if not value.startswith("/") or not os.path.exists(value):
            continue
        found.append(value if os.path.isdir(value) else os.path.dirname(value))
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
