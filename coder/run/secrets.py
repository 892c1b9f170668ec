"""Every value a run knows to be secret, registered with its redactor before the first
command runs, so no step log, transcript, state file, manifest or event holds one.

The sources: the values of `.env*` files in the repository and in the run's worktree; the
runner's own secret-named variables (`*KEY*`, `*TOKEN*`, ...) and every variable passed
through to commands (`env_passthrough`), whatever its name; the environment variables the
configuration names for credentials (settings ending in `_env`, such as a provider's
`api_key_env`); and each step's `env:` values whose names look secret.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.redact import secret_name, secrets_from_environ, secrets_from_repo

if TYPE_CHECKING:
    from coder.policy.commands import Policy
    from coder.taskfile import Task


def run_secrets(
    roots: list[Path],
    task: Task,
    policy: Policy,
    settings: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    env = os.environ if environ is None else environ
    values = [v for root in roots for v in secrets_from_repo(root)]
    values += secrets_from_environ(env)
    values += [env[name] for name in sorted(policy.env_passthrough) if env.get(name)]
    values += [env[name] for name in _credential_variables(settings) if env.get(name)]
    values += [v for step in task.steps for k, v in step.env.items() if secret_name(k)]
    return list(dict.fromkeys(values))


def _credential_variables(value: Any, key: str = "") -> Iterator[str]:
    """Names of environment variables the settings point at for credentials."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _credential_variables(v, str(k))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _credential_variables(item, key)
    elif isinstance(value, str) and key.endswith("_env"):
        yield value


SECRET_ENV_MARKER = "[REDACTED:step_env]"


def stored_task(task_dict: dict[str, Any]) -> dict[str, Any]:
    """The task as the manifest and state keep it: a step's `env:` values whose names look
    secret replaced by a marker (resume reads them again from the taskfile)."""
    graph = []
    for step in task_dict.get("graph", []):
        env = step.get("env")
        if env:
            step = {
                **step,
                "env": {k: SECRET_ENV_MARKER if secret_name(k) else v for k, v in env.items()},
            }
        graph.append(step)
    return {**task_dict, "graph": graph}


def restore_env(stored: dict[str, Any], taskfile: str | None) -> dict[str, Any]:
    """The task of a manifest with the secret `env:` values `stored_task` left out read back
    from its taskfile. InvalidInput when they are needed and the taskfile no longer has them."""
    from coder import taskfile as taskfile_mod
    from coder.errors import InvalidInput

    hidden = [
        s["id"]
        for s in stored.get("graph", [])
        if SECRET_ENV_MARKER in (s.get("env") or {}).values()
    ]
    if not hidden:
        return stored
    try:
        original = {s.id: dict(s.env) for s in taskfile_mod.load(Path(str(taskfile))).steps}
    except Exception:  # noqa: BLE001 (any reason it cannot be read is the same problem)
        original = {}
    graph = []
    for step in stored["graph"]:
        if step["id"] in hidden:
            env = original.get(step["id"], {})
            missing = [k for k, v in step["env"].items() if v == SECRET_ENV_MARKER and k not in env]
            if missing:
                raise InvalidInput(
                    f"step {step['id']}: the secret env value {missing[0]} is not stored with the "
                    f"run and the taskfile {taskfile} no longer has it",
                    hint="restore the taskfile (with the same step ids and env), then resume",
                )
            step = {
                **step,
                "env": {k: env[k] if v == SECRET_ENV_MARKER else v for k, v in step["env"].items()},
            }
        graph.append(step)
    return {**stored, "graph": graph}
