"""Every value a run knows to be secret, registered with its redactor before anything of the
run is stored, sent to a model or logged, so no request, step log, transcript, state file,
manifest, event or commit message holds one.

The sources: the values of `.env*` files in the repository and in the run's worktree; the
runner's own secret-named variables (`*KEY*`, `*TOKEN*`, ...) and every variable passed
through to commands (`env_passthrough`), whatever its name; the environment variables the
configuration names for credentials (settings ending in `_env`, such as a provider's
`api_key_env`); and each step's `env:` values whose names look secret. The commands that show
a run afterwards (`report`, `diff`, `show`) redact with the same sources as far as their own
process knows them (`view_redactor`): a passed-through variable not set where they run is not.

The task itself is stored redacted (`stored_task`): a literal secret in a taskfile's `cmd`,
`goal`, `env` or anywhere else stays out of the manifest and state, and so out of `show`, the
report, the DAG picture and commit messages. The command still runs with the real value: the
run holds the taskfile's task in memory, and `restore` reads the redacted values back from the
taskfile when a resumed run (or `merge --if-green`) needs them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder import taskfile as taskfile_mod
from coder.errors import CoderError, InvalidInput
from coder.redact import Redactor, secret_name, secrets_from_environ, secrets_from_repo

if TYPE_CHECKING:
    from coder.policy.commands import Policy
    from coder.taskfile import Task, TaskDoc


def run_secrets(
    roots: list[Path],
    task: Task,
    policy: Policy,
    settings: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    env = os.environ if environ is None else environ
    values = known_secrets(roots, settings, env)
    values += [env[name] for name in sorted(policy.env_passthrough) if env.get(name)]
    values += [v for step in task.steps for k, v in step.env.items() if secret_name(k)]
    return list(dict.fromkeys(values))


def known_secrets(
    roots: Iterable[Path], settings: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> list[str]:
    """What is secret without a taskfile: the values of `.env*` files under `roots`, the
    environment's secret-named variables, the passed-through ones (`env_passthrough`) and
    those the settings name for credentials."""
    env = os.environ if environ is None else environ
    values = [v for root in roots for v in secrets_from_repo(root)]
    values += secrets_from_environ(env)
    passed = settings.get("env_passthrough") or []
    values += [env[n] for n in sorted(passed) if isinstance(n, str) and env.get(n)]
    values += [env[name] for name in _credential_variables(settings) if env.get(name)]
    return list(dict.fromkeys(values))


def view_redactor(root: Path, worktrees: Iterable[str | Path] = ()) -> Redactor:
    """The redactor of a command that shows runs (`report`, `diff`, `show`): what a run
    redacts with, as far as this process knows it (`known_secrets` of the repository and the
    runs' worktrees, with this directory's configuration)."""
    roots = [root, *(Path(w) for w in worktrees if Path(w).is_dir())]
    return Redactor(known_secrets(roots, config_mod.load(root).values))


def view_redactor_at(cwd: Path) -> Redactor:
    """`view_redactor` of the repository `cwd` is in (of `cwd` itself outside one): for what a
    command shows of a taskfile (`show -f`, `run --dry-run`)."""
    from coder.git import repository

    try:
        root = repository.repo_root(repository.open_repo(cwd))
    except CoderError:
        root = cwd
    return view_redactor(root)


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
# What names the run's parts (ids, branch, models, tool names): never a secret, and needed as
# written. Every other string of a taskfile (title, spec, goal, cmd, args, env values, assert,
# changes, policies, success) is free text a secret can be written into.
_STRUCTURE = frozenset(
    {
        "id",
        "kind",
        "depends_on",
        "branch",
        "base",
        "model",
        "fallback_model",
        "created_at",
        "tools",
        "framework",
        "on_fail",
    }
)
_MARKER = re.compile(r"\[REDACTED(?::[a-z_]+|: text could not be scanned)\]")


def stored_task(task_dict: TaskDoc, redactor: Redactor) -> TaskDoc:
    """The task as the manifest and state keep it (and `show`, `report`, the DAG picture and
    the model's prefix show it): a step's `env:` values whose names look secret replaced by a
    marker, and every literal secret `redactor` finds in the free text (a token written in a
    `cmd`, a key in a goal, a passed-through value anywhere) redacted. `restore` reads them back
    from the taskfile when the run needs them again (resume, `merge --if-green`)."""
    graph = []
    for step in task_dict.get("graph", []):
        env = step.get("env")
        if env:
            step = {
                **step,
                "env": {k: SECRET_ENV_MARKER if secret_name(k) else v for k, v in env.items()},
            }
        graph.append(_redacted(step, redactor))
    return {**_redacted(task_dict, redactor), "graph": graph}


def redacted(text: str) -> bool:
    """Whether `text` holds what `stored_task` (or the redactor) cut out."""
    return _MARKER.search(text) is not None


def _redacted(doc: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    return {
        k: v if k in _STRUCTURE or k == "graph" else redactor.redact_obj(v) for k, v in doc.items()
    }


def restore(stored: TaskDoc, taskfile: str | None) -> TaskDoc:
    """The task of a manifest with what `stored_task` redacted read back from its taskfile:
    each redacted string is replaced by the taskfile's string at the same place (the same
    field of the same step), which must match it outside the redactions. InvalidInput naming
    the step and field when the taskfile no longer has it."""
    if not _MARKER.search(json.dumps(stored)):
        return stored

    try:
        original = taskfile_mod.load(Path(str(taskfile))).to_dict()
    except Exception:  # noqa: BLE001 (any reason it cannot be read is the same problem)
        original = {}
    steps = {s["id"]: s for s in original.get("graph", [])}
    place = _Restorer(str(taskfile))
    task = {k: place.value(v, original.get(k), k) for k, v in stored.items() if k != "graph"}
    task["graph"] = [
        {
            k: place.value(v, steps.get(step["id"], {}).get(k), f"step {step['id']}: its {k}")
            for k, v in step.items()
        }
        for step in stored.get("graph", [])
    ]
    return task


class _Restorer:
    def __init__(self, taskfile: str) -> None:
        self.taskfile = taskfile

    def value(self, stored: Any, original: Any, where: str) -> Any:
        if isinstance(stored, str):
            if not _MARKER.search(stored):
                return stored
            if isinstance(original, str) and _same_outside_markers(stored, original):
                return original

            raise InvalidInput(
                f"{where} holds a secret that is not stored with the run, and the taskfile "
                f"{self.taskfile} no longer has it",
                hint="restore the taskfile (with the same step ids and values), then resume",
            )
        if isinstance(stored, dict):
            known = original if isinstance(original, dict) else {}
            return {k: self.value(v, known.get(k), f"{where} {k}") for k, v in stored.items()}
        if isinstance(stored, list):
            known_list = original if isinstance(original, list) else []
            return [
                self.value(v, known_list[i] if i < len(known_list) else None, where)
                for i, v in enumerate(stored)
            ]
        return stored


def _same_outside_markers(stored: str, original: str) -> bool:
    """Whether `original` is what `stored` was before redaction: equal outside the markers,
    each marker standing for some text."""
    parts = _MARKER.split(stored)
    pattern = "(?s)" + ".+?".join(re.escape(p) for p in parts)
    return re.fullmatch(pattern, original) is not None
