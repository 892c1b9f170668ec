"""`coder export github|argo`: a taskfile's DAG as a file another engine runs, one job per step.

Each step's job runs `coder worker` (it clones the remote, builds the step's start by the fleet's
start rule, runs the step and pushes its commit to `refs/coder/RUN/steps/STEP` with
compare-and-swap); a last `coordinator` job runs `coder run --executor pushed`, which takes
those commits, lands them on the run's branch in DAG order, and `coder push` pushes that branch
for review. The engine only orders the jobs: the git remote is the only state they share.

RUN, the run's id, is made unique per workflow run (the task id and the engine's run id), so
that a later workflow run never takes the step refs an earlier one pushed for another base, and
its branch is its own; a re-run of a workflow's failed jobs (GitHub's "Re-run failed jobs",
`argo retry`) keeps the run id, so the steps already pushed are taken, not run again.
Workers are given RUN (`--run`); the coordinator runs a copy of the taskfile whose `id` is RUN
(`coder run` takes the run's id from the taskfile).

The model server comes from each runner's own setting (`OLLAMA_HOST`, `CODER_MODEL`: a
repository variable, a workflow parameter), never from the taskfile; the files carry no secret.
The GitHub part is here (plain YAML); the Argo part is coder.services.argo (hera, an optional
extra).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from coder import taskfile
from coder.config import find_project_root
from coder.errors import InvalidInput, InvalidTaskfile
from coder.files.durable import write_atomic
from coder.services import validate as validation
from coder.taskfile import graph

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

TARGETS = ("github", "argo")
COORDINATOR = "coordinator"  # the last job's name: no step's job takes it
DEFAULT_INSTALL = "pip install coder"
DEFAULT_IMAGE = "python:3.11"
DEFAULT_RUNS_ON = "ubuntu-latest"
PYTHON = "3.11"
MAX_RUN_ID = 64  # a task id's length (schemas/task.schema.json)
ENGINE_RUN_ID = 20  # room left for the engine's own run id after the task id's prefix
# the author of the step commits where the runner's git sets none (coder.git.repository reads
# these before git's config)
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "coder (CI)",
    "GIT_AUTHOR_EMAIL": "coder-ci@example.com",
    "GIT_COMMITTER_NAME": "coder (CI)",
    "GIT_COMMITTER_EMAIL": "coder-ci@example.com",
}

# The run's taskfile, the one every job reads (CODER_RUN_TASKFILE, outside the checkout): the
# repository's (CODER_TASKFILE) with `id` RUN, so that workers and coordinator run one task of
# that id, and without `base` or `branch`: the run starts at the commit checked out, the one
# every worker started from (a `base: main` would be main's tip, whatever the workflow ran
# on), on a branch of its own (a taskfile's `branch` would be pushed again by the next
# workflow run, refused).
WITH_RUN_ID = """\
python - "$CODER_TASKFILE" "$CODER_RUN" "$CODER_RUN_TASKFILE" <<'EOF'
import sys, yaml
with open(sys.argv[1], encoding="utf-8") as fh:
    task = yaml.safe_load(fh)
task["id"] = sys.argv[2]
task.pop("base", None)
task.pop("branch", None)
with open(sys.argv[3], "w", encoding="utf-8") as fh:
    yaml.safe_dump(task, fh, sort_keys=False, allow_unicode=True)
EOF"""


@dataclass(frozen=True)
class Export:
    """What the generated file needs of the taskfile and the command line."""

    task: taskfile.Task
    taskfile: str  # the taskfile's path in the repository (POSIX), as a checkout finds it
    run_prefix: str  # RUN's first part: the task's id (the engine's run id follows)
    remote: str  # the remote the jobs clone and push to
    install: str  # the shell command that installs coder on a runner
    runs_on: str = DEFAULT_RUNS_ON
    image: str = DEFAULT_IMAGE
    remote_given: bool = False

    def needs(self) -> dict[str, list[str]]:
        """Each step's direct dependencies, in the taskfile's order."""
        return {s.id: list(s.depends_on) for s in self.task.steps}

    def order(self) -> list[str]:
        return graph.order(graph.build(self.task.deps()))


def prepare(
    path: Path,
    *,
    cwd: Path,
    remote: str | None,
    install: str | None,
    runs_on: str | None = None,
    image: str | None = None,
) -> Export:
    """The checked taskfile and the settings, or InvalidInput (exit 2) naming the problem."""
    problems, task = validation.check(path, cwd=cwd)
    if problems:
        raise InvalidTaskfile(problems)
    assert task is not None
    root = find_project_root(path.absolute().parent)  # where the file is named, not its target
    if root is None:
        raise InvalidInput(
            f"{path} is not in a git repository",
            hint="each job checks the repository out and reads the taskfile there: "
            "export a taskfile committed in the repository the workflow runs in",
        )
    try:
        where = path.resolve().relative_to(root).as_posix()
    except ValueError:  # a link to a file outside the repository
        raise InvalidInput(
            f"{path} is outside the repository at {root}",
            hint="each job reads the taskfile from its checkout: export one in the repository",
        ) from None
    task_id = task.source.get("id") or taskfile.id_from_name(path) or "run"
    for name, value in (("--install", install), ("--runs-on", runs_on), ("--image", image)):
        if value is not None and not value.strip():
            raise InvalidInput(f"{name} is empty", hint=f"leave {name} out for its default")
    return Export(
        task=task,
        taskfile=where,
        run_prefix=task_id[: MAX_RUN_ID - ENGINE_RUN_ID].rstrip("-_"),
        remote=remote or "origin",
        install=install or DEFAULT_INSTALL,
        runs_on=runs_on or DEFAULT_RUNS_ON,
        image=image or DEFAULT_IMAGE,
        remote_given=remote is not None,
    )


def job_names(
    step_ids: Iterable[str], allowed: str, reserved: Iterable[str] = ()
) -> dict[str, str]:
    """Step id -> a job name made of lower-case letters, digits and the characters `allowed`
    adds (GitHub: `-_`; Argo: `-`), unique, none of `reserved`. Lower case because GitHub
    compares job ids ignoring case; any other character becomes `-`. An id that is already a
    good name keeps it; the others get `-2`, `-3`, ... where the name is taken."""
    ids = list(step_ids)
    bad = re.compile(f"[^a-z0-9{re.escape(allowed)}]")
    base = {sid: bad.sub("-", sid.lower()) for sid in ids}
    taken = set(reserved)
    names: dict[str, str] = {}
    # the ids that are good names first: a step named `fix-2` keeps `fix-2` even when an
    # earlier `Fix` would have been given it
    for sid in sorted(ids, key=lambda s: base[s] != s):
        name, n = base[sid], 1
        while name in taken:
            n += 1
            name = f"{base[sid]}-{n}"
        taken.add(name)
        names[sid] = name
    return {sid: names[sid] for sid in ids}


def worker_command(step: str, remote: str) -> str:
    """The one command a step's job runs (`coder worker`, fleet-interface); `step` and
    `remote` are shell words (a quoted id or `"$CODER_STEP"`; the URL the worker clones), the
    run's taskfile, base and RUN come from the job's environment."""
    return (
        f'coder worker --remote {remote} --step {step} --taskfile "$CODER_RUN_TASKFILE" '
        '--base "$CODER_BASE" --run "$CODER_RUN"'
    )


def is_url(remote: str) -> bool:
    """A URL or a path (what git clones), not a remote's name."""
    return bool(
        "://" in remote or remote.startswith(("/", ".")) or re.match(r"[\w.-]+@[\w.-]+:", remote)
    )


def remote_url(remote: str) -> str:
    """A shell word for the URL of `remote`: a URL (or path) as it is; a remote's name, the
    checkout's URL for it (`coder worker` clones a URL, from a directory of its own)."""
    if is_url(remote):
        return shlex.quote(remote)
    return f'"$(git remote get-url {shlex.quote(remote)})"'


# The job's token for the git coder runs in a GitHub job: the worker's own clone of the
# repository is not actions/checkout's, which alone has the token (in its .git/config). A
# config of the job's own, in the runner's temporary directory (emptied after each job),
# including the user's global one; checkout keeps none (two headers would be refused).
GITHUB_TOKEN_FOR_GIT = """\
umask 077
config="$RUNNER_TEMP/coder.gitconfig"
if [ -f "$HOME/.gitconfig" ]; then git config --file "$config" include.path "$HOME/.gitconfig"; fi
auth=$(printf 'x-access-token:%s' "$TOKEN" | base64 | tr -d '\\n')
git config --file "$config" "http.$GITHUB_SERVER_URL/.extraheader" "AUTHORIZATION: basic $auth"
echo "GIT_CONFIG_GLOBAL=$config" >> "$GITHUB_ENV"
"""


def coordinator_commands(spec: Export) -> list[str]:
    """The coordinator's commands: land every pushed step on the run's branch, then push it.
    It runs once every step's job succeeded, and pushes only a run that succeeded: a branch
    pushed by a failed attempt would make the push of a re-run (the same RUN, the steps pushed
    before taken) refuse, as `coder push` replaces only its own push."""
    remote = shlex.quote(spec.remote)
    return [
        f'coder run "$CODER_RUN_TASKFILE" --executor pushed --remote {remote} --autonomous',
        f'coder push -t "$CODER_RUN" --remote {remote}',
    ]


# --- GitHub Actions --------------------------------------------------------------------------


def github_workflow(spec: Export) -> dict[str, Any]:
    """The workflow as a mapping: a job per step (`needs:` its direct dependencies), then the
    coordinator, which needs them all."""
    names = job_names(spec.needs(), "-_", reserved=[COORDINATOR])
    setup = [
        {"uses": "actions/checkout@v4", "with": {"fetch-depth": 0, "persist-credentials": False}},
        {
            "name": "Give git the job's token",
            "env": {"TOKEN": "${{ github.token }}"},
            "run": GITHUB_TOKEN_FOR_GIT,
        },
        {"uses": "actions/setup-python@v5", "with": {"python-version": PYTHON}},
        {"name": "Install coder", "run": spec.install},
        {
            "name": "Name the run",  # the run's taskfile, for this step and the next ones
            "run": 'export CODER_RUN_TASKFILE="$RUNNER_TEMP/coder-task.yaml"\n'
            f"{WITH_RUN_ID}\n"
            'echo "CODER_RUN_TASKFILE=$CODER_RUN_TASKFILE" >> "$GITHUB_ENV"',
        },
    ]
    # each job pushes (a step ref, the run's branch): write there, read everywhere else
    common = {"runs-on": spec.runs_on, "permissions": {"contents": "write"}}
    jobs: dict[str, Any] = {}
    for sid, deps in spec.needs().items():
        job: dict[str, Any] = {"name": f"step {sid}"}
        if deps:
            job["needs"] = [names[d] for d in deps]
        command = worker_command(shlex.quote(sid), remote_url(spec.remote))
        jobs[names[sid]] = {
            **job,
            **common,
            "steps": [*setup, {"name": f"Run step {sid}", "run": command}],
        }
    run, push = coordinator_commands(spec)
    jobs[COORDINATOR] = {
        "name": "land the steps on the run's branch",
        "needs": [names[sid] for sid in spec.order()],
        **common,
        "steps": [
            *setup,
            {"name": "Land the pushed steps", "run": run},
            {"name": "Push the run's branch", "run": push},
        ],
    }
    return {
        "name": f"coder: {spec.task.title}"[:200],
        "on": {"workflow_dispatch": {}},
        "permissions": {"contents": "read"},
        "env": {
            "CODER_RUN": f"{spec.run_prefix}-${{{{ github.run_id }}}}",
            "CODER_TASKFILE": spec.taskfile,  # the repository's; each job names a copy RUN
            "CODER_BASE": "${{ github.sha }}",  # the commit every job checked out
            # the model server and model: the repository's variables, never the taskfile's
            "OLLAMA_HOST": "${{ vars.OLLAMA_HOST }}",
            "CODER_MODEL": "${{ vars.CODER_MODEL }}",
            **GIT_IDENTITY,
        },
        "jobs": jobs,
    }


def github_yaml(spec: Export) -> str:
    header = (
        f"# Generated by `coder export github {spec.taskfile}`: a job per step of task "
        f"{spec.run_prefix},\n"
        "# then the coordinator. Set the repository variable OLLAMA_HOST (and CODER_MODEL) to "
        "your\n# model server; see docs/journey.md, 'Running on GitHub Actions or Argo'.\n"
    )
    return header + dump_yaml(github_workflow(spec))


# --- output ----------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style, a multi-line string as a literal block (a job's script reads as written),
    every job spelled out (no anchors and aliases for the steps the jobs share)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=10**6, allow_unicode=True)


def render(target: str, spec: Export, argo: Callable[[Export], str] | None = None) -> str:
    """The file for `target`; the Argo part is passed in (coder.services.argo.argo_yaml), so
    that hera is imported only when Argo is asked for."""
    if target == "github":
        return github_yaml(spec)
    assert target == "argo" and argo is not None
    return argo(spec)


def write(out: Path, text: str, *, force: bool) -> bool:
    """Write `text` to `out`; False when it holds that already. A file that differs is kept
    unless `force` (InvalidInput, exit 2)."""
    try:
        old = out.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = None
    except (OSError, UnicodeDecodeError) as exc:
        if out.is_dir():
            raise InvalidInput(f"{out} is a directory", hint="pass a file's path to -o") from None
        if not force:
            raise InvalidInput(
                f"{out} exists and cannot be read ({exc})", hint="pass --force to replace it"
            ) from None
        old = None
    if old == text:
        return False
    if old is not None and not force:
        raise InvalidInput(
            f"{out} exists and differs from the export",
            hint="pass --force to replace it, or -o another path",
        )
    write_atomic(out, text.encode("utf-8"), new_mode=0o644, crash_point=None)
    return True
