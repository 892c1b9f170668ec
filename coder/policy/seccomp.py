"""No setuid or setgid file from a command: a seccomp filter on the spawner thread.

A setuid-root program a command leaves in a checkout runs as root for whoever starts it
later, outside every sandbox; a setgid one, with the group. Landlock has no right for modes,
and a read-only mount (coder.policy.mounts) does not cover the worktree, where commands must
write. So the spawner thread installs a classic BPF seccomp filter (after no_new_privs; it is
per thread and inherited by all the thread starts) that fails with EPERM:

- chmod, fchmod, fchmodat, fchmodat2 whose mode has S_ISUID or S_ISGID;
- open, openat (only with O_CREAT or O_TMPFILE: the mode is read only then), creat, mkdir,
  mkdirat, mknod, mknodat creating with those bits.

With `xattrs`, setxattr, lsetxattr, fsetxattr and setxattrat fail with EPERM as well: for a
command that is root in a user namespace mapped to the real root (coder as a container's root
without CAP_SYS_ADMIN), which could otherwise give a file capabilities (`security.capability`,
a setuid by another name); the filter cannot read the attribute's name.

openat2 carries its mode inside a struct the filter cannot read: it fails with ENOSYS, so libc
falls back to openat. io_uring fails with ENOSYS too: its opens carry their mode in a ring the
filter never sees (libuv and the like fall back to plain system calls). A system call of
another ABI (32-bit x86 through `int 0x80`, x32) is not covered by these numbers, so it kills
the process; so do all system calls on an architecture not in the table (see `problem`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_X32_BIT = 0x40000000

_SETID = 0o6000  # S_ISUID | S_ISGID
_CREATES = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE, the same on both architectures

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]; little-endian: the low word
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index


_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NUMBERS = {  # asm/unistd_64.h; aarch64 has only the *at forms
    "x86_64": {
        "open": 2,
        "chmod": 90,
        "fchmod": 91,
        "creat": 85,
        "mkdir": 83,
        "mknod": 133,
        "openat": 257,
        "mkdirat": 258,
        "mknodat": 259,
        "fchmodat": 268,
        "setxattr": 188,
        "lsetxattr": 189,
        "fsetxattr": 190,
    },
    "aarch64": {"setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "mknodat": 33, "mkdirat": 34}
    | {"fchmod": 52, "fchmodat": 53, "openat": 56},
}
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}
_COMMON |= {"openat2": 437, "fchmodat2": 452, "setxattrat": 463}  # alike everywhere
_MODE_ARG = {
    "chmod": 1,
    "fchmod": 1,
    "creat": 1,
    "mkdir": 1,
    "mknod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "mkdirat": 2,
    "mknodat": 2,
}
_OPEN_ARGS = {"open": (1, 2), "openat": (2, 3)}  # (flags, mode)
_NOSYS = ("openat2", "io_uring_setup", "io_uring_enter", "io_uring_register")
_XATTR = ("setxattr", "lsetxattr", "fsetxattr", "setxattrat")


class _Insn(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


_LOAD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|..|K


def problem() -> str | None:
    """Why the filter cannot be built here (an architecture without a table), or None."""
    if platform.machine() not in _AUDIT_ARCH:
        return f"no seccomp filter for this architecture ({platform.machine()})"
    return None


def refuse_setid(*, xattrs: bool = False) -> None:
    """Install the filter on the calling thread (and all it starts); see the module
    docstring. Sets no_new_privs, which the kernel requires of a thread without
    CAP_SYS_ADMIN. Raises OSError if the kernel refuses."""
    code = _program(xattrs)
    prog = _Prog(len(code), code)
    libc = ctypes.CDLL(None, use_errno=True)
    if (
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"cannot install the seccomp filter: {os.strerror(err)}")


class _Assembler:
    """Classic BPF with named forward jumps (an offset is counted from the next instruction)."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | None, str | None, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def add(self, op: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        self.code.append((op, jt, jf, k))

    def build(self) -> ctypes.Array[_Insn]:
        def offset(i: int, target: str | None) -> int:
            jump = 0 if target is None else self.labels[target] - i - 1
            assert 0 <= jump <= 255, (target, jump)  # forward, within one byte
            return jump

        insns = [
            _Insn(op, offset(i, jt), offset(i, jf), k)
            for i, (op, jt, jf, k) in enumerate(self.code)
        ]
        return (_Insn * len(insns))(*insns)


@functools.lru_cache(maxsize=2)
def _program(xattrs: bool = False) -> ctypes.Array[_Insn]:
    machine = platform.machine()
    numbers = _NUMBERS[machine] | _COMMON
    bpf = _Assembler()
    bpf.add(_LOAD, _ARCH)
    bpf.add(_JEQ, _AUDIT_ARCH[machine], jf="kill")
    bpf.add(_LOAD, _NR)
    if machine == "x86_64":
        bpf.add(_JGE, _X32_BIT, jt="kill")
    for name in _NOSYS:
        bpf.add(_JEQ, numbers[name], jt="nosys")
    for name in _XATTR if xattrs else ():
        bpf.add(_JEQ, numbers[name], jt="eperm")
    for name, arg in _MODE_ARG.items():
        if name in numbers:
            bpf.add(_JEQ, numbers[name], jt=f"mode{arg}")
    for name, (flags, _) in _OPEN_ARGS.items():
        if name in numbers:
            bpf.add(_JEQ, numbers[name], jt=f"open{flags}")
    bpf.add(_RET, _RET_ALLOW)
    for name, (flags, mode) in _OPEN_ARGS.items():  # creating a file: check its mode
        if name not in numbers:
            continue
        bpf.label(f"open{flags}")
        bpf.add(_LOAD, _arg(flags))
        bpf.add(_JSET, _CREATES, jt=f"mode{mode}", jf="allow")
    for arg in sorted({*_MODE_ARG.values(), *(mode for _, mode in _OPEN_ARGS.values())}):
        bpf.label(f"mode{arg}")
        bpf.add(_LOAD, _arg(arg))
        bpf.add(_JSET, _SETID, jt="eperm", jf="allow")
    for name, action in (
        ("allow", _RET_ALLOW),
        ("eperm", _RET_ERRNO | errno.EPERM),
        ("nosys", _RET_ERRNO | errno.ENOSYS),
        ("kill", _RET_KILL_PROCESS),
    ):
        bpf.label(name)
        bpf.add(_RET, action)
    return bpf.build()
