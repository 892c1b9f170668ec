"""A run's manifest (`.coder/tasks/ID.json`): what the run is, written before anything else.

The manifest alone holds what a run is: its resolved task, the taskfile it started from, base,
base commit, branch and worktree; the checkpoint (coder.run.state) holds its progress, and is
rebuilt from the manifest and the branch's commits when it is lost (a checkpoint of version 1
held the manifest's facts too: a run whose manifest file is gone is read from it). When the
manifest is gone (`.coder/` deleted by hand) the run is
found again by its branch: its commits carry `Coder-Task: ID`, the commit below them is the
base, and the taskfile supplies the task (`coder resume -t ID -f FILE`); a fork's is the
taskfile of the run it was first forked from, and its copied commits (`Coder-Forked-From`)
name its parent and fork point (coder.git.forks.lineage). A run exists while
its manifest or its checkpoint does; that is what `run`, `status` and every `-t ID` agree on.

Runs are ordered by coder's own count, never by the clock (a clock set back would make a new
run look older): each run gets the next number of `.coder/sequence` when it is made (`seq`);
a run made before there was one is older than every run with one, ordered by its time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import project
from coder.errors import (
    CoderError,
    CorruptState,
    EnvironmentProblem,
    InvalidInput,
    LinkInTheWay,
    ManifestGone,
    UnknownTask,
)
from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_atomic
from coder.run.records import ForkPoint, RunState, check_task_id, now_iso
from coder.run.state import StateStore
from coder.schemas import TASK_ID

if TYPE_CHECKING:
    from coder.git.repository import Repo
    from coder.redact import Redactor
    from coder.taskfile import Task, TaskDoc

FORK_SUFFIX = "-fork-"  # a fork's id: its parent's, then this and a number
MAX_ID = 64
_STRINGS = ("task_id", "base", "base_commit", "branch", "worktree", "created_at")


@dataclass(frozen=True)
class Fleet:
    """Where a run's steps run when not here (`coder run --executor`: coder.fleet), decided
    at its start and kept in its manifest, so `coder resume` goes on the same way."""

    executor: str  # local | ray | pushed (coder.fleet.engines)
    remote: str  # the remote's URL (a remote's name is resolved at the start)
    workers: int | None = None  # workers at once; None: the run's max_parallel
    ray_address: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Fleet | None:
        if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) for k in ("executor", "remote")
        ):
            return None
        workers, address = data.get("workers"), data.get("ray_address")
        return cls(
            data["executor"],
            data["remote"],
            workers if type(workers) is int else None,
            address if isinstance(address, str) else None,
        )


@dataclass(frozen=True)
class Manifest:
    """What a run is, fixed when it starts (only `coder resume --taskfile` replaces its task
    and taskfile, by writing a new manifest). Its task is kept as the file stores it (`doc`)
    and read typed (`task`, `restored_task()`): every reader parses it the same way."""

    task_id: str
    doc: TaskDoc  # the resolved task as stored, secrets left out (the file's "task")
    taskfile: str | None  # the taskfile the run started from (absolute), if any
    base: str
    base_commit: str
    branch: str
    worktree: str
    created_at: str
    checkout_commit: str | None = None  # --include-uncommitted: the run's first commit
    # A fork's (coder.services.fork): the id and branch its taskfile names, those of the run
    # it was first forked from, which `resume --taskfile` accepts for the fork's own.
    origin: dict[str, str] | None = None
    # A fork's parent run and where it left it (RunState's own): a checkpoint rebuilt from
    # the manifest keeps them, so status, compare and show still know the fork's parent.
    parent: str | None = None
    forked_at: ForkPoint | None = None
    seq: int | None = None  # its place in the order runs were made (None: made before it)
    fleet: Fleet | None = None  # its steps run on other machines (None: here)

    @property
    def worktree_path(self) -> Path:
        return Path(self.worktree)

    @cached_property
    def task(self) -> Task:
        """The run's task as stored (secrets left out), parsed once, when first asked for:
        `coder status` reads manifests and never needs it (nor the taskfile parser's import)."""
        return parse_task(self.doc)

    def restored_task(self) -> Task:
        """The run's task with the secrets the manifest leaves out read back from its taskfile
        (coder.run.secrets.restore): what runs commands (`resume`, `merge --if-green`)."""
        from coder.run.secrets import restore

        return parse_task(restore(self.doc, self.taskfile))

    @property
    def step_ids(self) -> list[str]:
        """The task's step ids, from the checked document (no parse: `clean` reads them)."""
        return [step["id"] for step in self.doc["graph"]]

    def as_dict(self) -> dict[str, Any]:
        """The manifest file's JSON object (its keys in the file's order)."""
        data = asdict(self)
        data = {"task_id": data.pop("task_id"), "task": data.pop("doc"), **data}  # the file's
        if self.checkout_commit is None:
            del data["checkout_commit"]
        for key in ("origin", "parent", "forked_at", "seq", "fleet"):  # unset: as before them
            if data[key] is None:
                del data[key]
        return data

    @property
    def start_commit(self) -> str:
        """Where the run's own work begins: below it, nothing of the run is undone."""
        return self.checkout_commit or self.base_commit

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """From a checked manifest object (`_problem` found nothing)."""
        return cls(
            task_id=data["task_id"],
            doc=data["task"],
            taskfile=data.get("taskfile"),
            base=data["base"],
            base_commit=data["base_commit"],
            branch=data["branch"],
            worktree=data["worktree"],
            created_at=data["created_at"],
            checkout_commit=_commit_id(data.get("checkout_commit")),
            origin=_origin(data.get("origin")),
            parent=data["parent"] if isinstance(data.get("parent"), str) else None,
            forked_at=_fork_point(data.get("forked_at")),
            seq=data["seq"] if type(data.get("seq")) is int else None,
            fleet=Fleet.from_dict(data.get("fleet")),
        )

    @property
    def order(self) -> tuple[bool, int, str]:
        """Its place in the order runs were made, to sort by (`made_order`)."""
        return made_order(self.seq, self.created_at)


def parse_task(doc: TaskDoc) -> Task:
    """A task as a run stores it (the manifest's and the checkpoint's `task`), typed: the one
    place a stored task is parsed, so every reader sees it the same way."""
    from coder import taskfile  # here: it imports the YAML parser, which `status` never needs

    return taskfile.from_dict(doc)


def made_order(seq: int | None, at: str) -> tuple[bool, int, str]:
    """A run's place in the order runs were made, to sort by (the newest last): coder's
    count, and for a run made before there was one, its time `at`, before every counted one."""
    return (seq is not None, seq or 0, at)


SEQUENCE = "sequence"  # .coder/sequence: the number the last run made got


def next_seq(coder_dir: Path) -> int:
    """The number of a run being made: one more than the last given (`.coder/sequence`, read
    and written under its lock, so two runs made at once get two), or, when that file is
    missing or unreadable, than any run's. Written through to the disk before the run's
    manifest is, so no crash gives a number twice."""
    make_private_dirs(coder_dir)
    fd = nofollow.open_file(coder_dir / SEQUENCE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 32, 0).strip()
        last = int(text) if text.isdigit() else _highest_seq(coder_dir)
        data = f"{last + 1}\n".encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    return last + 1


def _highest_seq(coder_dir: Path) -> int:
    found = []
    for task_id in run_ids(coder_dir):
        try:
            found.append(load_manifest(coder_dir, task_id).seq or 0)
        except CoderError:  # unreadable: it counts for nothing
            pass
    return max(found, default=0)


def _commit_id(value: Any) -> str | None:
    return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{40}", value) else None


def _origin(value: Any) -> dict[str, str] | None:
    if isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("id", "branch")):
        return {"id": value["id"], "branch": value["branch"]}
    return None


def _fork_point(value: Any) -> ForkPoint | None:
    if (
        isinstance(value, dict)
        and isinstance(value.get("step"), str)
        and _commit_id(value.get("commit"))
    ):
        return {"step": value["step"], "commit": value["commit"]}
    return None


def fork_id(parent: str, free: Callable[[str], bool]) -> str:
    """`PARENT-fork-N`, N the smallest whose id is `free` (the parent's id cut short to fit
    the 64 characters of an id)."""
    n = 1
    while True:
        suffix = f"{FORK_SUFFIX}{n}"
        candidate = f"{parent[: MAX_ID - len(suffix)]}{suffix}"
        if free(candidate):
            return check_task_id(candidate)
        n += 1


def named_as_fork_of(task_id: str, run_id: str) -> bool:
    """Whether `task_id` is an id `fork_id` gives a fork of run `run_id`, or a fork of one
    of its forks (each level's parent cut short only where it had to be)."""
    head = task_id
    while found := re.fullmatch(rf"(.+)({FORK_SUFFIX}[1-9][0-9]*)", head):
        head, suffix = found[1], found[2]
        cut = len(head) + len(suffix) == MAX_ID
        if head == run_id or cut and run_id.startswith(head):
            return True
    return False


def manifest_path(coder_dir: Path, task_id: str) -> Path:
    return coder_dir / "tasks" / f"{check_task_id(task_id)}.json"


def run_ids(coder_dir: Path) -> list[str]:
    """Every run of the project: each task with a manifest or a checkpoint."""
    try:
        names = nofollow.listdir(coder_dir / "tasks")
    except (FileNotFoundError, NotADirectoryError):
        names = []
    manifests = {name.removesuffix(".json") for name in names if name.endswith(".json")}
    ids = manifests | set(StateStore(coder_dir).list_ids())
    return sorted(i for i in ids if TASK_ID.fullmatch(i))


def run_exists(coder_dir: Path, task_id: str) -> bool:
    if StateStore(coder_dir).exists(task_id):
        return True
    try:
        nofollow.lstat(manifest_path(coder_dir, task_id))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def load_manifest(coder_dir: Path, task_id: str) -> Manifest:
    """The run's manifest; when its file is missing, the one a version 1 checkpoint holds
    (`from_v1_state`). UnknownTask when the run has neither; CorruptState (naming the file)
    when the manifest, or the checkpoint standing in for it, cannot be read back (ManifestGone:
    only a checkpoint of version 2 is left, which holds no manifest)."""
    try:
        return read_manifest(coder_dir, task_id)
    except UnknownTask:
        pass
    manifest = from_v1_state(coder_dir, task_id)
    if manifest is not None:  # written back: the checkpoint's next write is of version 2
        with contextlib.suppress(OSError, EnvironmentProblem):  # read-only: read it next time
            write(coder_dir, manifest)
        return manifest
    if StateStore(coder_dir).exists(task_id):
        raise ManifestGone(manifest_path(coder_dir, task_id), task_id)
    raise UnknownTask(task_id, run_ids(coder_dir))


def from_v1_state(coder_dir: Path, task_id: str) -> Manifest | None:
    """The manifest a version 1 checkpoint of a run holds (coder.run.state.
    identity_moved_to_manifest); None when the run's checkpoint is missing or of version 2.
    CorruptState (naming the checkpoint) when what it holds is no manifest of the run."""
    store = StateStore(coder_dir)
    data = store.v1_manifest(task_id)
    if data is None:
        return None
    problem = _problem(data, task_id)
    if problem:
        raise CorruptState(store.path(task_id), task_id, problem)
    return Manifest.from_dict(data)


@dataclass(frozen=True)
class Listed:
    """What `coder status` shows of a run's manifest (`read_listed`)."""

    title: str
    branch: str
    created_at: str
    steps: int
    seq: int | None
    parent: str | None


def read_listed(coder_dir: Path, task_id: str) -> Listed:
    """The few fields `coder status` lists of run `task_id`, from its manifest file, or the
    version 1 checkpoint standing in for it: checked only as far as they are read (the
    whole check, `_problem`, loads the taskfile package for its kinds, which `status` would
    pay for every run). UnknownTask, CorruptState and ManifestGone as `load_manifest`."""
    path, store = manifest_path(coder_dir, task_id), StateStore(coder_dir)
    try:
        data = json.loads(nofollow.read_bytes(path))
    except FileNotFoundError:
        data = store.v1_manifest(task_id)
        if data is None:
            if store.exists(task_id):
                raise ManifestGone(path, task_id) from None
            raise UnknownTask(task_id, run_ids(coder_dir)) from None
        path = store.path(task_id)
    except LinkInTheWay as exc:
        raise exc.problem() from None
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptState(path, task_id, str(exc), manifest=True) from None
    problem = _listed_problem(data, task_id)
    if problem:
        raise CorruptState(path, task_id, problem, manifest=True)
    task = data["task"]
    graph = task["graph"]
    return Listed(
        title=task["title"],
        branch=data["branch"],
        created_at=data["created_at"],
        steps=len(graph),
        seq=data["seq"] if type(data.get("seq")) is int else None,
        parent=data["parent"] if isinstance(data.get("parent"), str) else None,
    )


def _listed_problem(data: Any, task_id: str) -> str | None:
    """What makes `data` no manifest of `task_id`, as far as `read_listed` reads it."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key in ("task_id", "branch", "created_at"):
        if not isinstance(data.get(key), str):
            return f"its {key} is missing"
    if data["task_id"] != task_id:
        return f"it belongs to task {data['task_id']!r}"
    task = data.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("title"), str):
        return "no task"
    return None if isinstance(task.get("graph"), list) else "no task graph"


def read_manifest(coder_dir: Path, task_id: str) -> Manifest:
    """The manifest file itself: UnknownTask when it is missing, CorruptState when it is no
    manifest of `task_id`."""
    from coder.yamldoc import loads_json

    path = manifest_path(coder_dir, task_id)
    try:
        data = loads_json(nofollow.read_bytes(path))
    except FileNotFoundError:
        raise UnknownTask(task_id, run_ids(coder_dir)) from None
    except LinkInTheWay as exc:
        raise exc.problem() from None
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptState(path, task_id, str(exc), manifest=True) from None
    problem = _problem(data, task_id)
    if problem:
        raise CorruptState(path, task_id, problem, manifest=True)
    return Manifest.from_dict(data)


def _problem(data: Any, task_id: str) -> str | None:
    """What makes `data` no manifest of `task_id` (the fields every command reads)."""
    from coder.taskfile.kinds import KINDS

    if not isinstance(data, dict):
        return "not a JSON object"
    for key in _STRINGS:
        if not isinstance(data.get(key), str):
            return f"its {key} is missing"
    problem = _listed_problem(data, task_id)
    if problem:
        return problem
    if not all(
        isinstance(s, dict) and isinstance(s.get("id"), str) and s.get("kind") in KINDS
        for s in data["task"]["graph"]
    ):
        return "no task graph"
    return None


def build(
    task: TaskDoc,
    *,
    taskfile: Path | None,
    base: str,
    base_commit: str,
    worktree: Path,
    created_at: str,
    checkout_commit: str | None = None,
    seq: int | None = None,
    fleet: Fleet | None = None,
) -> Manifest:
    """A manifest: `task` is the resolved task as stored (secret env values left out)."""
    return Manifest(
        task_id=task["id"],
        doc=task,
        taskfile=str(taskfile.resolve()) if taskfile else None,
        base=base,
        base_commit=base_commit,
        branch=task["branch"],
        worktree=str(worktree),
        created_at=created_at,
        checkout_commit=checkout_commit,
        seq=seq,
        fleet=fleet,
    )


def write(coder_dir: Path, manifest: Manifest) -> None:
    write_path(manifest_path(coder_dir, manifest.task_id), manifest)


def write_path(path: Path, manifest: Manifest) -> None:
    write_atomic(path, json.dumps(manifest.as_dict(), indent=2).encode("utf-8"))


def new_run(manifest: Manifest) -> RunState:
    """The first checkpoint of a run: every step pending."""
    return RunState.new(manifest.task_id, manifest.step_ids)


def rebuild(
    repo: Repo, coder_dir: Path, task_id: str, path: Path, model: str, redactor: Redactor
) -> tuple[Manifest, int]:
    """The manifest of run `task_id`, whose manifest and checkpoint are both gone, from the
    taskfile at `path` and its branch's commits: (the manifest, how many of the run's commits
    the branch holds). Refused, with the way back, when the branch holds none: then nothing
    of the run was committed and it can simply start again."""
    from coder import taskfile
    from coder.git import branches, commits
    from coder.run.secrets import stored_task

    task = taskfile.load(path)
    forked: dict[str, Any] = {}
    if not task.source.get("id"):  # an id was generated when the run started: it is this one
        task = task.renamed(task_id)
    elif task.id != task_id:  # the taskfile of the run `task_id` is a fork of?
        task, forked = _as_fork(repo, task, task_id, path)
    found = commits.run_base(repo, task.branch, task_id)
    if found is None:
        raise EnvironmentProblem(
            f"run {task_id} has no manifest or checkpoint under .coder/ and its branch "
            f"{task.branch} holds none of its commits: there is nothing of it to rebuild",
            hint=_start_again(repo, task_id, task.branch, str(path)),
        )
    base_commit, count = found
    base = task.base or branches.current_branch(repo)
    tip = branches.branch_tip(repo, base)
    if tip is None or not (tip == base_commit or commits.descends_from(repo, tip, base_commit)):
        raise EnvironmentProblem(
            f"run {task_id} started from commit {base_commit[:12]}, which branch {base} does "
            "not contain",
            hint="check out the branch the run started from (or set `base` in the taskfile), "
            "then resume again",
        )
    resolved = task.resolved(base=base, model=model)
    from coder.git import snapshot

    checkout = snapshot.checkout_commit(
        repo, branch=task.branch, base_commit=base_commit, task_id=task_id
    )
    manifest = build(
        stored_task(resolved.to_dict(), redactor),
        taskfile=path,
        base=base,
        base_commit=base_commit,
        worktree=coder_dir / "worktrees" / task_id,
        created_at=now_iso(),
        checkout_commit=checkout,
        seq=next_seq(coder_dir),
    )
    return replace(manifest, **forked), count


def _as_fork(repo: Repo, task: Task, fork_id: str, path: Path) -> tuple[Task, dict[str, Any]]:
    """The task of run `task`'s fork `fork_id` (renamed, on the fork's branch) and the
    manifest's fork fields, read from the fork's branch: its copied commits name the parent
    and the fork point (coder.git.forks.lineage), and the forked step is the first one they
    do not hold. InvalidInput when neither they nor its id say `fork_id` is a fork of
    `task` (or of a fork of it)."""
    from coder import taskfile
    from coder.git import commits, forks
    from coder.taskfile import graph

    named = taskfile.default_branch(fork_id, task.title)
    holding = commits.task_branches(repo, fork_id)
    branch = named if named in holding or not holding else holding[0]
    found = commits.run_base(repo, branch, fork_id)
    line = forks.lineage(repo, branch, found[0], fork_id) if found else None
    if not (line.origin == task.id if line and line.origin else named_as_fork_of(fork_id, task.id)):
        raise InvalidInput(
            f"{path} is the taskfile of task {task.id}, not of {fork_id}",
            hint=f"pass the taskfile run {fork_id} started from (for a fork: its first parent's)",
        )
    renamed = task.renamed(fork_id, branch)
    fields: dict[str, Any] = {"origin": {"id": task.id, "branch": task.branch}}
    if line is not None:
        order = graph.order(graph.build(renamed.deps()))
        at = next((s for s in order if s not in line.copied), order[-1])
        fields |= {"parent": line.parent, "forked_at": {"step": at, "commit": line.cut}}
    return renamed, fields


def missing_run(repo: Repo, coder_dir: Path, task_id: str) -> CoderError:
    """What to say of a task with neither manifest nor checkpoint: when a branch still holds
    its commits (`.coder/` was deleted by hand), how to rebuild the run or remove the branch
    (exit 3); when only its worktree's registration is left, how to start again; else no
    such task (exit 2)."""
    from coder.git import branches, commits, forks

    taskfile = _taskfile_hint(repo, task_id)
    for branch in commits.task_branches(repo, task_id):
        found = commits.run_base(repo, branch, task_id)
        count = found[1] if found else 0
        line = forks.lineage(repo, branch, found[0], task_id) if found else None
        if line is not None and line.origin is not None:  # a fork runs its origin's taskfile
            taskfile = _taskfile_hint(repo, line.origin)
        return EnvironmentProblem(
            f"run {task_id} has no manifest or checkpoint under .coder/ (deleted?), but its "
            f"branch {branch} holds {count} commit{'s' * (count != 1)} of the run",
            hint=f"rebuild the run from them with `coder resume -t {task_id} -f {taskfile}` "
            f"(the taskfile it started from), or delete the branch with `coder clean -t "
            f"{task_id} --delete-branch`",
        )
    registered = branches.registered_branch(repo, task_id)
    if registered is not None and branches.branch_tip(repo, registered) is not None:
        return EnvironmentProblem(
            f"run {task_id} has no manifest or checkpoint under .coder/ (deleted?), and its "
            f"branch {registered} holds none of its commits: nothing of it was kept",
            hint=_start_again(repo, task_id, registered, taskfile),
        )
    return UnknownTask(task_id, run_ids(coder_dir))


def _start_again(repo: Repo, task_id: str, branch: str, taskfile: str) -> str:
    """How to start a run again whose branch holds nothing of it: `clean` deletes the
    branch while the run's worktree still has it checked out (`clean` finds it there), else
    git does (its worktree deleted by hand no longer holds it once pruned)."""
    from coder.git import branches, worktrees

    if branches.registered_branch(repo, task_id) == branch:
        remove = f"`coder clean -t {task_id} --delete-branch`"
    else:
        worktrees.prune_stale_worktrees(repo)
        remove = f"`git branch -D {branch}`"
    return f"start it again: {remove}, then `coder run --autonomous -f {taskfile}`"


def _taskfile_hint(repo: Repo, task_id: str) -> str:
    """The taskfile in the checkout's tasks/ with this id, else a placeholder."""
    from coder.git import repository

    try:
        return str(project.find_taskfile(repository.repo_root(repo), task_id))
    except (CoderError, OSError):
        return "TASKFILE"
