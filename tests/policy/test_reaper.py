"""coder as child subreaper (coder.policy.reaper): what a command leaves behind stays coder's
child, so `end_leftovers` can skip its kill when nothing is left, still ends a daemon that
double-forked away from its command, and reaps it without taking the exit status of a process
another part of coder waits for. Each scenario runs in a fresh Python process: becoming a
subreaper is for good, and the test process's other children would make it unsure."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coder.policy import kernel, reaper
from tests.policy.test_confine import POLICY

pytestmark = [
    pytest.mark.skipif(
        not kernel.support().available,
        reason=f"no kernel sandbox here: {kernel.support().problem}",
    ),
    pytest.mark.skipif(
        not Path("/proc/self/task").is_dir() or reaper.children() is None,
        reason="no /proc/<pid>/task/<tid>/children here (CONFIG_PROC_CHILDREN)",
    ),
]

# The command returns once its grandchild runs: that one left the command's session, and its
# parent exited, so nothing of the command's tree is its ancestor any more. It keeps writing
# into the worktree until it is ended. Its pid is in daemon.pid.
DOUBLE_FORK = (
    "python3 -c 'import os, time\n"
    "r, w = os.pipe()\n"
    "if os.fork():\n"
    "    os.read(r, 1); os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    'open("daemon.pid", "w").write(str(os.getpid())); open("tick.txt", "a").write("x")\n'
    'os.write(w, b"x")\n'
    "while True:\n"
    '    open("tick.txt", "a").write("x"); time.sleep(0.005)\''
    " >/dev/null 2>&1 </dev/null"
)

PRELUDE = f"""
import os, subprocess, time
from pathlib import Path
from coder.policy import confine, writes, reaper
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
POLICY = Policy(allowed_commands=frozenset({sorted(POLICY.allowed_commands)!r}))
DOUBLE_FORK = {DOUBLE_FORK!r}

def state(pid):
    try:
        return Path(f"/proc/{{pid}}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "reaped"
"""


def run_script(tmp_path: Path, body: str) -> list[str]:
    """`body` after PRELUDE in a fresh Python in `tmp_path`; the lines it printed."""
    script = PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_daemon_whose_parent_exits_stays_coders_child_until_ended_and_reaped(
    tmp_path: Path,
) -> None:
    printed = run_script(
        tmp_path,
        """
        assert reaper.start()
        root = Path("wt"); root.mkdir()
        run_command("echo plain > plain.txt", cwd=root, policy=POLICY, root=root)
        spawner = confine.confinement(writes.profile_for(root))
        print("quiet-after-a-plain-command", reaper.quiet(spawner))
        run_command(DOUBLE_FORK, cwd=root, policy=POLICY, root=root)
        pid = int((root / "daemon.pid").read_text())
        # The daemon's parent may still be ending when the command returns: until then the
        # daemon is its child, and that parent (an orphan already) is an unknown child of ours.
        print("quiet-while-its-parent-ends", reaper.quiet(spawner))
        deadline = time.monotonic() + 5
        ours = False
        while not ours and time.monotonic() < deadline:
            ours = pid in (reaper.children() or ())
            if not ours:
                time.sleep(0.005)
        print("daemon-is-our-child", ours)
        print("quiet-with-the-daemon", reaper.quiet(spawner))
        confine.end_leftovers(root)
        print("daemon-after-end", state(pid))
        size = (root / "tick.txt").stat().st_size
        time.sleep(0.1)
        print("tick-unchanged", (root / "tick.txt").stat().st_size == size)
        print("quiet-after-end", reaper.quiet(spawner))
        """,
    )
    assert printed == [
        "quiet-after-a-plain-command",
        "True",
        "quiet-while-its-parent-ends",
        "False",
        "daemon-is-our-child",
        "True",
        "quiet-with-the-daemon",
        "False",
        "daemon-after-end",
        "reaped",
        "tick-unchanged",
        "True",
        "quiet-after-end",
        "True",
    ]


def test_reaping_leaves_the_exit_status_of_other_children_to_their_waiters(
    tmp_path: Path,
) -> None:
    """A child coder started outside the sandbox (not tracked) that has ended and not been
    waited for yet: the kill's reaping leaves it alone, so its Popen still reads its status;
    while it exists, nothing is taken as quiet."""
    printed = run_script(
        tmp_path,
        """
        assert reaper.start()
        root = Path("wt"); root.mkdir()
        run_command("true", cwd=root, policy=POLICY, root=root)
        spawner = confine.confinement(writes.profile_for(root))
        other = subprocess.Popen(["sh", "-c", "exit 7"])
        while state(other.pid) != "Z":
            time.sleep(0.005)
        print("quiet-with-an-unknown-child", reaper.quiet(spawner))
        run_command(DOUBLE_FORK, cwd=root, policy=POLICY, root=root)
        pid = int((root / "daemon.pid").read_text())
        confine.end_leftovers(root)
        print("daemon-after-end", state(pid))
        print("other-status", other.wait())
        print("quiet-then", reaper.quiet(spawner))
        """,
    )
    assert printed == [
        "quiet-with-an-unknown-child",
        "False",
        "daemon-after-end",
        "reaped",
        "other-status",
        "7",
        "quiet-then",
        "True",
    ]


def test_a_sandbox_made_before_the_subreaper_is_always_killed_in(tmp_path: Path) -> None:
    """Its commands' orphans may have gone to init, out of sight: it never counts as quiet,
    and its leftovers are ended as before."""
    printed = run_script(
        tmp_path,
        """
        root = Path("wt"); root.mkdir()
        run_command(DOUBLE_FORK, cwd=root, policy=POLICY, root=root)
        pid = int((root / "daemon.pid").read_text())
        assert reaper.start()
        spawner = confine.confinement(writes.profile_for(root))
        print("watched", spawner.watched, "is-our-child", pid in reaper.children())
        confine.end_leftovers(root)
        deadline = time.monotonic() + 5
        while state(pid) not in ("Z", "reaped") and time.monotonic() < deadline:
            time.sleep(0.01)
        print("daemon-ended", state(pid) in ("Z", "reaped"))
        """,
    )
    assert printed == ["watched", "False", "is-our-child", "False", "daemon-ended", "True"]
