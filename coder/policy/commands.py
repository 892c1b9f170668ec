"""The command allowlist: which programs a step or the model may run.

`check_command` finds every program a command line would run (`shell.programs_in`) and refuses
what is not allowed. What the allowlist can and cannot do: it bounds which programs a command
line names, so the model cannot casually run `curl` or `docker`. It is not a sandbox: an
allowed interpreter can do anything (`python3 -c "import socket ..."`, awk's `system()`, a
Makefile recipe, a script the model wrote). The network namespace in `policy.sandbox` is the
wall; the allowlist is the first, explicit layer and the clear error.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coder.config import DEFAULTS, LIMITS
from coder.errors import InvalidInput
from coder.files.realpath import realpath
from coder.policy.shellparse import basename, program_words, refuse

# Shell builtins that appear in everyday command lines (allowed; not programs to tell a
# planning model about).
SHELL_BUILTINS: tuple[str, ...] = (
    "cd",
    "export",
    "set",
    "unset",
    "shift",
    "exit",
    "return",
    "read",
    "wait",
    ":",
    "type",
    "command",
    "exec",
    "trap",
)

# Programs a coding agent needs offline. pip, tox, ... are absent on purpose: they reach the
# network. sh/bash are only accepted as `bash -c '<script>'`, whose script is checked too.
DEFAULT_ALLOWED_COMMANDS: tuple[str, ...] = (
    # languages, test runners, build tools, version control
    "python",
    "python3",
    "pytest",
    "ruff",
    "mypy",
    "black",
    "node",
    "npm",
    "npx",
    "tsc",
    "go",
    "gofmt",
    "cargo",
    "rustc",
    "make",
    "git",
    "sh",
    "bash",
    *SHELL_BUILTINS,
    # coreutils-like tools
    "echo",
    "printf",
    "cat",
    "ls",
    "mkdir",
    "rmdir",
    "cp",
    "mv",
    "rm",
    "touch",
    "ln",
    "sed",
    "awk",
    "grep",
    "egrep",
    "fgrep",
    "find",
    "head",
    "tail",
    "wc",
    "sort",
    "uniq",
    "diff",
    "cmp",
    "patch",
    "test",
    "[",
    "true",
    "false",
    "sleep",
    "tr",
    "cut",
    "basename",
    "dirname",
    "pwd",
    "env",
    "xargs",
    "timeout",
    "tee",
    "chmod",
    "realpath",
    "readlink",
    "stat",
    "du",
    "date",
    "which",
    "file",
    "od",
    "seq",
    "expr",
    "paste",
    "join",
    "comm",
    "tac",
    "rev",
    "nl",
    "fold",
    "mktemp",
    "nice",
    "nohup",
    "tar",
    "gzip",
    "gunzip",
    "zcat",
    "unzip",
    "id",
    "uname",
    "printenv",
)

# Refused while the network is off, even if a user put them in allowed_commands.
NETWORK_PROGRAMS: frozenset[str] = frozenset(
    {
        "curl",
        "wget",
        "nc",
        "ncat",
        "netcat",
        "socat",
        "ssh",
        "scp",
        "sftp",
        "rsync",
        "telnet",
        "ftp",
        "lftp",
        "tftp",
        "ping",
        "ping6",
        "dig",
        "nslookup",
        "host",
        "whois",
        "aria2c",
        "axel",
        "http",
        "https",
        "xh",
        "openssl",
        "ssh-keyscan",
        "mosh",
    }
)


@dataclass(frozen=True)
class Limits:
    """Resource limits of each command (0: none); the defaults are coder.config.LIMITS."""

    cpu_seconds: int = LIMITS["cpu_seconds"]
    memory_mb: int = LIMITS["memory_mb"]
    file_size_mb: int = LIMITS["file_size_mb"]
    processes: int = LIMITS["processes"]

    @classmethod
    def from_config(cls, value: Any) -> Limits:
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise InvalidInput(f"config key limits must be an object, got {value!r}")
        defaults = cls()
        fields = {}
        for key, number in value.items():
            if not hasattr(defaults, key):
                raise InvalidInput(
                    f"config key limits.{key} is unknown "
                    "(cpu_seconds, memory_mb, file_size_mb, processes)"
                )
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise InvalidInput(
                    f"config key limits.{key} must be an integer >= 0, got {number!r}"
                )
            fields[key] = number
        return cls(**fields)


@dataclass(frozen=True)
class Policy:
    allowed_commands: frozenset[str] = frozenset(DEFAULT_ALLOWED_COMMANDS)
    allow_network: bool = False
    env_passthrough: frozenset[str] = frozenset()
    protected_paths: tuple[str, ...] = ()  # extra globs, matched against root-relative paths
    # programs inside the worktree that may run (`allowed_commands` entries with a `/` that
    # are not absolute, e.g. `./build.sh`), as worktree-relative paths
    allowed_paths: frozenset[str] = frozenset()
    # protected paths a step's `changes` names: that step may write and commit them
    named_paths: frozenset[str] = frozenset()
    output_cap: int = 65536  # bytes kept per stream
    command_timeout: int = DEFAULTS["command_timeout"]  # seconds
    sandbox: bool = True  # run commands in the kernel sandbox (coder.policy.confine)
    limits: Limits = Limits()
    # paths shown read-only to commands in their view (coder.policy.view), `~` expanded
    visible_paths: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Policy:
        """Build the policy from coder config keys; missing keys keep the defaults.

        `allowed_commands` EXTENDS `DEFAULT_ALLOWED_COMMANDS` (it never removes a default).
        Names are compared by basename, so `/usr/bin/docker` in the config means `docker`.
        Network programs (curl, ssh, ...) additionally need `allow_network: true`.
        """

        def strings(key: str) -> list[str]:
            value = cfg.get(key) or []
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise InvalidInput(f"config key {key} must be a list of strings, got {value!r}")
            return list(value)

        def integer(key: str, default: int, minimum: int) -> int:
            value = cfg.get(key, default)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidInput(
                    f"config key {key} must be an integer >= {minimum}, got {value!r}"
                )
            return value

        allow_network = cfg.get("allow_network", False)
        if not isinstance(allow_network, bool):
            raise InvalidInput(
                f"config key allow_network must be true or false, got {allow_network!r}"
            )
        sandbox = cfg.get("sandbox", "on")
        if sandbox not in ("on", "off"):
            raise InvalidInput(f'config key sandbox must be "on" or "off", got {sandbox!r}')
        listed = strings("allowed_commands")
        extra = {basename(name) for name in listed}
        inside = {
            os.path.normpath(name) for name in listed if "/" in name and not name.startswith("/")
        }
        return cls(
            allowed_commands=frozenset(DEFAULT_ALLOWED_COMMANDS) | extra,
            allow_network=allow_network,
            allowed_paths=frozenset(inside),
            env_passthrough=frozenset(strings("env_passthrough")),
            protected_paths=tuple(strings("protected_paths")),
            output_cap=integer("output_cap", 65536, 1024),
            command_timeout=integer("command_timeout", DEFAULTS["command_timeout"], 1),
            sandbox=sandbox == "on",
            limits=Limits.from_config(cfg.get("limits")),
            visible_paths=visible_paths(strings("visible_paths")),
        )


def visible_paths(listed: list[str]) -> tuple[str, ...]:
    """The config's `visible_paths`, `~` expanded; each must then be absolute."""
    found = []
    for name in listed:
        path = os.path.normpath(os.path.expanduser(name))
        if not os.path.isabs(path):
            raise InvalidInput(
                f"config key visible_paths: {name!r} is not an absolute path",
                hint="name it from / or from ~, e.g. ~/.cargo/registry",
            )
        found.append(path)
    return tuple(found)


# Bash runs these itself when they are named without a path: PATH plays no part.
_BASH_BUILTINS = frozenset(
    {
        *SHELL_BUILTINS,
        "echo",
        "printf",
        "test",
        "[",
        "true",
        "false",
        "pwd",
        "kill",
        "ulimit",
        "umask",
        "times",
        "let",
        "declare",
        "typeset",
        "local",
        "readonly",
        "getopts",
        "hash",
        "alias",
        "jobs",
    }
)


def check_command(
    cmd: str,
    policy: Policy,
    *,
    root: Path | None = None,
    cwd: Path | None = None,
    path: str | None = None,
) -> None:
    """Raise PolicyViolation unless every program in `cmd` is allowed by `policy`.

    Without `root` this is pure (names only: what a dry run shows). With the worktree `root`,
    the `cwd` the command runs in and the `path` (PATH) it gets, each program is also resolved
    as bash would: a program inside the worktree (`./cat`, `bin/x`, or found there through
    PATH) is refused unless `allowed_commands` lists its path, and one named by a path
    elsewhere (`/tmp/x/cat`) must be the very file its name finds on PATH.
    """
    for word in program_words(cmd):
        name = basename(word)
        listed = name in policy.allowed_commands
        if name in NETWORK_PROGRAMS and not policy.allow_network:
            fix = "set allow_network: true" + ("" if listed else " and add it to allowed_commands")
            raise refuse(
                f"`{name}` is a network program and the network is off "
                f"({fix} in coder.config.json to allow it)"
            )
        if not listed:
            raise refuse(
                f"`{name}` is not in allowed_commands "
                "(add it to allowed_commands in coder.config.json)"
            )
        if root is not None:
            _check_resolves(word, policy, Path(root), Path(cwd or root), path)


def _check_resolves(word: str, policy: Policy, root: Path, cwd: Path, path: str | None) -> None:
    name = basename(word)
    if "/" not in word and name in _BASH_BUILTINS:
        return  # a builtin: bash runs no file for it, whatever PATH finds
    real_root = realpath(root)
    found = shutil.which(name, path=path)
    found_real = realpath(found) if found else None
    if "/" not in word:
        if found_real is None:
            return  # "command not found" at run time
        if _inside(found_real, real_root):
            raise refuse(
                f"`{name}` would run {found}, inside the worktree, which a step or the model "
                "could have written (fix PATH, or run it by its path and add that path to "
                "allowed_commands in coder.config.json)"
            )
        return
    target = realpath(os.path.join(cwd, os.path.expanduser(word)))
    if _inside(target, real_root):
        rel = os.path.relpath(target, real_root)
        if rel in policy.allowed_paths:
            return
        raise refuse(
            f"`{word}` is a program inside the worktree, which a step or the model could have "
            f"written (add `./{rel}` to allowed_commands in coder.config.json to allow it)"
        )
    if target != found_real:
        where = f"`{name}` on PATH is {found}" if found else f"no `{name}` is on PATH"
        raise refuse(
            f"`{word}` is not the `{name}` allowed commands run ({where}); run it by its name"
        )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
