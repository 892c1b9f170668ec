"""The environment a command sees: basic variables only, never secrets."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coder.policy.commands import Policy

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
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


def scrub_env(
    policy: Policy, extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a command: basic variables of `base` (default os.environ) minus
    anything secret-looking, plus `policy.env_passthrough` names, plus `extra` (a step's
    explicit env from the taskfile, applied last and trusted as written)."""
    base = os.environ if base is None else base
    env = {
        name: value
        for name, value in base.items()
        if (name in _BASIC_ENV or name.startswith("LC_")) and not _SECRET_NAME.search(name)
    }
    env.update({name: base[name] for name in policy.env_passthrough if name in base})
    env["GIT_TERMINAL_PROMPT"] = "0"  # never hang on a credential prompt
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep __pycache__ out of the worktree diff
    env.update(extra or {})
    return env
