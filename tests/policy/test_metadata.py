"""The metadata wall with real processes: outside its writable dirs a command cannot change a
file's mode, owner, times, extended attributes or name (a read-only mount namespace), and
nowhere can it make a setuid or setgid file (seccomp); what commands need still works."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from coder.errors import EnvironmentProblem
from coder.policy import confine, kernel, launch, seccomp, writes
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
from tests.conftest import git
from tests.helpers import fingerprint

FOUND = kernel.support()
needs_mounts = pytest.mark.skipif(
    not FOUND.available or FOUND.mounts_problem is not None,
    reason=f"no read-only mount namespace here: {FOUND.problem or FOUND.mounts_problem}",
)
needs_seccomp = pytest.mark.skipif(
    not FOUND.available or FOUND.setid_problem is not None,
    reason=f"no seccomp filter here: {FOUND.problem or FOUND.setid_problem}",
)
# How the kernel refuses a change outside: in the view (coder.policy.view) a path outside is
# not there at all; with the read-only wall alone it is there, read-only.
ABSENT = "No such file or directory" if FOUND.view_problem is None else "Read-only file system"
EXTRA = {"chown", "install", "truncate", "chattr", "script"}
POLICY = Policy(allowed_commands=Policy().allowed_commands | EXTRA)

# Each changes a file's metadata or name, never its contents ({f}: the file, {d}: its dir).
METADATA = {
    "chmod": "chmod 777 {f}",
    "chown": "chown $(id -u):$(id -g) {f}",  # to its own owner: allowed inside, a change
    "utime": "touch -d 2000-01-01 {f}",
    "setxattr": "python3 -c \"import os; os.setxattr('{f}', 'user.coder', b'x')\"",
    "truncate": "truncate -s 0 {f}",
    "rename": "mv {f} {d}/renamed",
    "link": "ln {f} {d}/hard",
    "unlink": "rm {f}",
}


def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A worktree and a directory outside it, each with one file."""
    root, outside = tmp_path / "wt", tmp_path / "outside"
    for where in (root, outside):
        where.mkdir()
        (where / "f.txt").write_text("keep\n")
        os.utime(where / "f.txt", (1_600_000_000, 1_600_000_000))  # touch -d now would differ
    return root, outside


def run(root: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    result = run_command(cmd, cwd=root, policy=POLICY, root=root)
    return subprocess.CompletedProcess(cmd, result.exit_code, result.stdout, result.stderr)


@needs_mounts
@pytest.mark.parametrize("op", METADATA)
def test_metadata_outside_the_worktree_is_read_only_and_inside_it_is_not(
    tmp_path: Path, op: str
) -> None:
    root, outside = tree(tmp_path)
    before = fingerprint(outside)
    done = run(root, METADATA[op].format(f=outside / "f.txt", d=outside))
    assert done.returncode != 0 and ABSENT in done.stderr, done
    assert fingerprint(outside) == before

    before = fingerprint(root), (root / "f.txt").stat().st_ctime_ns
    done = run(root, METADATA[op].format(f=root / "f.txt", d=root))
    assert done.returncode == 0, done
    changed = fingerprint(root) != before[0]  # chown to its own owner: only the ctime moves
    assert changed or (root / "f.txt").stat().st_ctime_ns != before[1]


@needs_mounts
def test_home_tmp_and_inode_flags_are_read_only_too(tmp_path: Path, isolated_home: Path) -> None:
    root, outside = tree(tmp_path)
    (isolated_home / ".bashrc").write_text("# mine\n")
    before = fingerprint(isolated_home), fingerprint(outside)
    done = run(
        root,
        f"chmod 777 ~/.bashrc; touch -d 2000-01-01 ~; chattr +A {outside}/f.txt;"
        f' mkdir /tmp/coder-meta-$$; echo ok > "$TMPDIR/mine" && chmod 600 "$TMPDIR/mine"',
    )
    # ~ and /tmp are there (read-only) in the view too; ~/.bashrc and the file outside are not
    signs = ("Read-only file system", ABSENT)
    refused = [line for line in done.stderr.splitlines() if any(s in line for s in signs)]
    assert len(refused) == 4, done.stderr
    assert (fingerprint(isolated_home), fingerprint(outside)) == before
    assert not list(Path("/tmp").glob("coder-meta-*"))


@needs_mounts
def test_what_commands_need_still_works(tmp_path: Path) -> None:
    """/proc, devices, /dev/stdout on a pipe, POSIX shared memory, pseudo-terminals and
    multiprocessing: all on mounts that are read-only or bound for the sandbox."""
    root, _ = tree(tmp_path)
    cmd = """
grep -q '^Pid:' /proc/self/status && echo proc
echo x > /dev/null && head -c 1 /dev/urandom > /dev/null && echo devices
echo stdout > /dev/stdout
echo shm > /dev/shm/coder-meta-$$ && rm /dev/shm/coder-meta-$$ && echo shm
python3 -c 'import os, pty; m, s = pty.openpty(); os.write(s, b"pty"); print(os.read(m, 3).decode())'
script -qec 'echo in-a-tty' /dev/null | tr -d '\\r'
python3 -c '
import multiprocessing as mp
if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("pool", sum(pool.map(abs, [-1, -2])), mp.Semaphore(1).acquire())
'
"""
    done = run(root, cmd)
    assert done.returncode == 0, done
    words = done.stdout.split()
    assert words == ["proc", "devices", "stdout", "shm", "pty", "in-a-tty", "pool", "3", "True"]


@needs_mounts
def test_git_in_a_linked_worktree_still_works(make_repo) -> None:
    """The worktree and its admin dir are writable: status, diff, and an add that needs only
    the index. (An add of new contents needs the repository's objects, which commands have
    never been able to write; one of contents already there used to touch the object's mtime,
    which the read-only mount now refuses.)"""
    repo = make_repo({"a.txt": "a\n"})
    wt = repo.parent / "wt"
    git(repo, "worktree", "add", "-q", str(wt), "-b", "wt")
    done = run(
        wt,
        "echo more >> a.txt && git status --short && git diff --stat"
        " && git checkout -q -- a.txt && git mv a.txt b.txt && git status --short",
    )
    assert done.returncode == 0, done
    assert done.stdout.startswith(" M a.txt\n a.txt | 1 +\n 1 file changed, 1 insertion(+)\n")
    assert done.stdout.endswith("\nR  a.txt -> b.txt\n"), done.stdout


ADMIN_FILES = ("HEAD", "commondir", "gitdir", "config.worktree")
# Each rewrites {f}, an admin file, as a command could: in place, as git does (a new file
# renamed over it), or by removing it or putting a link in its place.
REWRITES = (
    "echo 'ref: refs/heads/main' > {f}",
    "echo 'ref: refs/heads/main' > {f}.lock && mv {f}.lock {f}",
    "rm -f {f}",
    "ln -sf ../../refs/heads/main {f}",
    "chmod 666 {f}",
)


def admin_files(admin: Path) -> dict[str, tuple[bytes, int]]:
    return {n: ((admin / n).read_bytes(), (admin / n).lstat().st_mode) for n in ADMIN_FILES}


@needs_mounts
@pytest.mark.parametrize("launcher", [False, True], ids=["command", "launched program"])
def test_a_linked_worktrees_admin_files_are_read_only_to_commands(
    make_repo, launcher: bool
) -> None:
    """What git reads to know a worktree's branch, repository and config (HEAD, commondir,
    gitdir, config.worktree) is read-only in its writable admin dir, to commands and to the
    programs coder does not start itself (external MCP servers); config.worktree, absent
    before, is made empty so that none can create it. git still works there: its index is
    writable."""
    repo = make_repo({"a.txt": "a\n"})
    wt, admin = repo.parent / "wt", repo / ".git" / "worktrees" / "wt"
    git(repo, "worktree", "add", "-q", str(wt), "-b", "wt")
    script = "; ".join(r.format(f=f"{admin}/{n}") for n in ADMIN_FILES for r in REWRITES)
    script += "; git mv a.txt b.txt && git status --short"
    if launcher:  # the profile is made here, and config.worktree with it
        argv = launch.launcher_argv(["bash", "-c", script], wt, network=False)
    else:
        run(wt, "true")
    assert (admin / "config.worktree").read_bytes() == b""
    before = admin_files(admin)
    if launcher:
        done = subprocess.run(argv, cwd=wt, capture_output=True, text=True, check=False)
    else:
        done = run(wt, script)
    assert admin_files(admin) == before
    assert done.stdout.endswith("R  a.txt -> b.txt\n"), done
    assert done.stderr.count("Read-only file system") + done.stderr.count("busy") >= 20, done
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/wt\n"


SETID = {
    "chmod u+s": "chmod u+s {f}",
    "chmod 4755": "chmod 4755 {f}",
    "chmod g+s": "chmod g+s {f}",
    "chmod 2755 dir": "chmod 2755 {d}",
    "install -m 4755": "install -m 4755 {f} {d}/installed",
    "os.open 0o4755": "python3 -c \"import os; os.open('{d}/new', os.O_CREAT | os.O_WRONLY, 0o4755)\"",
    "mkdir -m 2755": "mkdir -m 2755 {d}/sub",
    "mknod": "python3 -c \"import os, stat; os.mknod('{d}/node', stat.S_IFREG | 0o6755)\"",
}


@needs_seccomp
@pytest.mark.parametrize("where", ["worktree", "tmpdir", "shm"])
@pytest.mark.parametrize("how", SETID)
def test_no_setuid_or_setgid_file_anywhere(tmp_path: Path, how: str, where: str) -> None:
    root, _ = tree(tmp_path)
    d = {"worktree": str(root), "tmpdir": "$TMPDIR", "shm": "/dev/shm/coder-meta-$$"}[where]
    cmd = f"mkdir -p {d} && echo x > {d}/f && {SETID[how].format(f=f'{d}/f', d=d)}"
    cmd += f"; code=$?; find {d} -perm /6000; rm -rf /dev/shm/coder-meta-$$; exit $code"
    done = run(root, cmd)
    assert done.returncode != 0 and "Operation not permitted" in done.stderr, done
    assert done.stdout == ""  # find named no setuid or setgid file
    assert not [p for p in root.rglob("*") if p.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)]


@needs_seccomp
def test_ordinary_modes_are_untouched(tmp_path: Path) -> None:
    root, _ = tree(tmp_path)
    done = run(
        root,
        "chmod +x f.txt && install -m 755 f.txt g && mkdir -m 700 d && chmod 1777 d"
        " && python3 -c \"import os; os.close(os.open('h', os.O_CREAT | os.O_WRONLY, 0o640))\"",
    )
    assert done.returncode == 0, done
    assert stat.S_IMODE((root / "f.txt").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "d").stat().st_mode) == 0o1777
    assert stat.S_IMODE((root / "h").stat().st_mode) & 0o7000 == 0


SYSCALL = "import ctypes; libc = ctypes.CDLL(None, use_errno=True); r = libc.syscall({args});"
SYSCALL += " print(r, ctypes.get_errno())"


@needs_seccomp
def test_calls_the_filter_cannot_read_fall_back_or_die(tmp_path: Path) -> None:
    """openat2 (its mode in a struct) and io_uring (opens in a ring) get ENOSYS, so libc and
    libuv fall back; without the filter they fail differently (EINVAL, EFAULT)."""
    root, _ = tree(tmp_path)
    for args in ("437, -100, b'x', None, 0", "425, 1, None"):
        done = run(root, f'python3 -c "{SYSCALL.format(args=args)}"')
        assert done.stdout.split() == ["-1", "38"], done  # ENOSYS
    if os.uname().machine == "x86_64":  # an x32 system call: a different ABI, killed
        done = run(root, f'python3 -c "{SYSCALL.format(args="0x40000027")}"')
        assert done.returncode in (-signal.SIGSYS, 128 + signal.SIGSYS), done


def test_the_filter_is_assembled_with_every_jump_in_range() -> None:
    if seccomp.problem() is not None:
        pytest.skip(seccomp.problem())
    code = seccomp._program()
    assert code[-1].code == 0x06 and all(i + insn.jt < len(code) for i, insn in enumerate(code))


@needs_mounts
def test_a_read_only_carve_out_inside_a_writable_dir(tmp_path: Path) -> None:
    """What `coder mcp serve` needs: the user's checkout writable, its .git not."""
    root, _ = tree(tmp_path)
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    before = fingerprint(root / ".git")
    profile = writes.Profile((str(root),), readonly=(str(root / ".git"),))
    script = (
        "echo ok > new.txt; echo x >> .git/config; chmod 777 .git/config;"
        " echo hook > .git/hooks/pre-commit; rm .git/config; mv .git moved; rm -r .git"
    )
    spawner = confine.Confinement(profile)
    try:
        proc = spawner.popen(["bash", "-c", script], cwd=root, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=30)
    finally:
        spawner.stop()
    assert (root / "new.txt").read_text() == "ok\n"
    assert fingerprint(root / ".git") == before
    assert err.decode().count("Read-only file system") >= 5, err


def test_a_carve_out_without_the_mount_wall_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    if not FOUND.available:
        pytest.skip(FOUND.problem or "")
    walls = dataclasses.replace(FOUND, mounts_problem="no reason", view_problem="no reason")
    monkeypatch.setattr(kernel, "support", lambda: walls)
    profile = writes.Profile((str(tmp_path),), readonly=(str(tmp_path / ".git"),))
    with pytest.raises(EnvironmentProblem, match=r"cannot keep .*\.git read-only for commands"):
        confine.Confinement(profile)


@needs_mounts
def test_the_wall_changes_nothing_for_the_rest_of_coder(tmp_path: Path) -> None:
    """The namespace is the spawner thread's: coder's own threads still write everywhere."""
    root, outside = tree(tmp_path)
    assert run(root, f"chmod 600 {outside / 'f.txt'}").returncode != 0
    os.chmod(outside / "f.txt", 0o600)  # this (main) thread
    assert stat.S_IMODE((outside / "f.txt").stat().st_mode) == 0o600
    assert str(root) not in Path("/proc/thread-self/mountinfo").read_text()  # no bind here


CAPS = (  # cap_setuid in the effective set of f.txt (VFS_CAP_REVISION_2)
    "python3 -c \"import os, struct; os.setxattr('f.txt', 'security.capability',"
    " struct.pack('<5I', 0x02000001, 1 << 7, 0, 0, 0))\""
)


@pytest.mark.skipif(
    not FOUND.available or os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="simulating a runner without CAP_SYS_ADMIN needs root, setpriv and Landlock",
)
def test_without_cap_sys_admin_setuid_is_still_refused_but_metadata_outside_is_not(
    tmp_path: Path,
) -> None:
    """What a non-root user (or a container's root) gets: no mount namespace in a thread, so
    chmod outside the worktree goes through (docs/safety.md: what is not contained); the seccomp
    filter needs no privilege, so setuid bits are refused all the same. A container's root
    keeps CAP_SETFCAP for `unshare`: its commands are refused extended attributes, or they
    could give a file capabilities (cap_setuid here), as good as setuid root."""
    import sys

    root, outside = tree(tmp_path)
    os.chmod(outside / "f.txt", 0o644)
    script = f"""
from pathlib import Path
from coder.policy import confine, kernel
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
found = kernel.support()
assert found.mounts_problem and found.setid_problem is None, found
cmd = "chmod 4755 f.txt; chmod 2755 .; chmod 600 {outside / "f.txt"}; " + {CAPS!r}
print(run_command(cmd, cwd=Path("{root}"), policy=Policy(), root=Path("{root}")).stderr)
"""
    done = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
        + [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Operation not permitted") == 3, done.stdout
    assert not (root / "f.txt").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert os.listxattr(root / "f.txt") == []  # no file capabilities either
    assert not root.stat().st_mode & stat.S_ISGID
    assert stat.S_IMODE((outside / "f.txt").stat().st_mode) == 0o600  # not contained
