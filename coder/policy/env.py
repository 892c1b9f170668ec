"""The environment a command sees: basic variables only, never secrets."""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping

from coder.errors import PolicyViolation

# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

# Basic variables plus toolchain locations (not secrets; go/cargo/java break without them).
_BASIC_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "TMPDIR",
        "VIRTUAL_ENV",
        "GOPATH",
        "GOROOT",
        "GOCACHE",
        "GOMODCACHE",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "JAVA_HOME",
        "PYENV_ROOT",
        "NVM_DIR",
    }
)
# Variables that make a shell, the dynamic loader, git or a runtime run code (or load options
# that run code) named in their value, whatever the command line says: a step's `env:` that set
# BASH_ENV=./x.sh would run x.sh before every command, past the allowlist. Names, then prefixes.
# Not here: IFS (bash and dash do not take it from the environment), and the search paths of
# one interpreter (PYTHONPATH, NODE_PATH, PERL5LIB, RUBYLIB, CLASSPATH): they only say where an
# interpreter the command runs finds what it imports, and the allowlist already lets that
# interpreter run the worktree's code.
_RUNS_CODE = frozenset(
    {
        # bash (every command runs in it) and sh
        "BASH_ENV",
        "ENV",
        "PROMPT_COMMAND",
        "PS4",
        "SHELLOPTS",
        "BASHOPTS",
        # the dynamic loader and glibc (every program)
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        # git reads its configuration under HOME and XDG_CONFIG_HOME (aliases, core.fsmonitor)
        "HOME",
        "XDG_CONFIG_HOME",
        # programs that other programs start
        "PAGER",
        "EDITOR",
        "VISUAL",
        "SSH_ASKPASS",
        "LESSOPEN",
        "LESSCLOSE",
        "MANPAGER",
        "BROWSER",
        # runtimes: code or options loaded at every start
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "PERL5OPT",
        "PERL5DB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
    }
)
_RUNS_CODE_PREFIXES = ("LD_", "DYLD_", "GIT_", "BASH_FUNC_")


def runs_code(name: str) -> bool:
    """Whether setting `name` can make a shell, the loader, git or a runtime run code named
    in its value (see _RUNS_CODE)."""
    return name in _RUNS_CODE or name.startswith(_RUNS_CODE_PREFIXES)


def env_refusal(name: str) -> PolicyViolation | None:
    """The refusal of a step's `env:` setting `name`, when `runs_code(name)`."""
    if not runs_code(name):
        return None
    return PolicyViolation(
        f"{name} cannot be set in a step's env: it makes the shell, the loader, git or a "
        "runtime run code that the allowlist never sees",
        hint=f"remove {name} from the step's env; run what it would load as a command of its own",
    )


def check_step_env(names: Iterable[str]) -> None:
    """PolicyViolation for the first variable of a step's `env:` that `runs_code`."""
    for name in names:
        refusal = env_refusal(name)
        if refusal is not None:
            raise refusal


_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


def scrub_env(
    passthrough: Collection[str],
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a command: basic variables of `base` (default os.environ) minus
    anything secret-looking, plus the `passthrough` names (the policy's `env_passthrough`),
    plus `extra` (a step's explicit env from the taskfile, applied last; PolicyViolation for a
    name that `runs_code`, which `coder validate` refuses first)."""
    check_step_env(extra or {})
    base = os.environ if base is None else base
    env = {  # by name first: os.environ decodes a value only when it is asked for
        name: base[name]
        for name in base
        if (name in _BASIC_ENV or name.startswith("LC_")) and not _SECRET_NAME.search(name)
    }
    env.update({name: base[name] for name in passthrough if name in base})
    env["GIT_TERMINAL_PROMPT"] = "0"  # never hang on a credential prompt
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep __pycache__ out of the worktree diff
    env.update(extra or {})
    return env
