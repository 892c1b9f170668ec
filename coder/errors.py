"""Every error coder raises on purpose, in one place. The message is safe to show the user.

    CoderError                   exit 2 unless a subclass says otherwise
    ├── InvalidInput             2  a taskfile, config file or argument is wrong
    │   ├── PolicyViolation      2  a command, path or setting refused by policy
    │   ├── DocumentError        2  a file that cannot be read as one YAML document
    │   ├── InvalidTaskfile      2  a taskfile's problems, each with FILE:LINE:COL
    │   ├── UnknownTask          2  no run with that task id in this project
    │   ├── MergedRun            2  revert of a run that already landed on its base
    │   ├── TaskfileEdited       2  resume: the taskfile changed, and which version is not said
    │   ├── BadSpec              2  `coder plan`: the spec is missing, empty or unreadable
    │   └── PatchProblem         2  fs_apply_patch: the patch does not parse or apply
    ├── EnvironmentProblem       3  something outside the run broke; the run stops as `error`
    │   ├── ConcurrentRun        3  another runner holds the task lock
    │   ├── CorruptState         3  a run's state file or manifest cannot be read back
    │   │   └── ManifestGone     3  a run's state file is left, its manifest is not
    │   ├── RunFilesGone         3  a run's checkpoint, manifest or worktree vanished as it ran
    │   ├── ObjectsMissing       3  git objects coder needs were pruned (`git gc --prune=now`)
    │   ├── BranchMoved          3  the agent branch is not where coder left it
    │   ├── RemoteBranchMoved    3  `coder push`: the remote branch is not where coder pushed it
    │   ├── ModelUnavailable     3  the model host is unreachable or lacks the model
    │   │   ├── HostUnreachable  3  nothing answers at the server's address (named)
    │   │   ├── ModelMissing     3  the server lacks the model (the hint: how to get it)
    │   │   └── ModelStalled     3  the server takes requests and answers none in time
    │   ├── MergeConflict        3  the base moved and changed the same lines
    │   ├── CheckoutInTheWay     3  uncommitted changes in the base checkout block a merge
    │   └── RunNotStarted        3  an MCP `task_run` whose `coder run` exited before starting
    ├── Interrupted            130  a signal ended a command part-way; it says what was done
    └── RunFailed                1  the work ran and did not succeed
        ├── ModelError           1  a model call failed after retries: its step fails
        └── PlanFailed           1  `coder plan` found no valid taskfile within its attempts

A step that meets an EnvironmentProblem is not failed: the run stops as `error` (exit 3) with
everything kept for `coder resume` (DESIGN.md invariant 10). Any other CoderError raised by a
step is the step's own failure. The CLI turns each into one line on stderr (plus a hint) and
the exit code; anything else is a bug and gets a traceback. A stopped run is not an error: it
ends with status `interrupted` and exit 130.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coder.display import counted

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERRUPTED = 130
MAX_MESSAGE = 400  # a backstop: no problem's message is longer than this


@dataclass(frozen=True)
class Problem:
    """One finding, printed as `FILE:LINE:COL: message` (line and column are 1-based)."""

    file: str
    line: int
    col: int
    message: str
    path: str = ""  # JSON path of the offending field, e.g. $.graph[1].cmd

    def __post_init__(self) -> None:
        if len(self.message) > MAX_MESSAGE:
            object.__setattr__(self, "message", self.message[: MAX_MESSAGE - 1] + "…")

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "path": self.path,
            "message": self.message,
        }


class CoderError(Exception):
    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


# --- bad input (2) --------------------------------------------------------------------------


class InvalidInput(CoderError):
    exit_code = EXIT_USAGE


class TaskfileEdited(InvalidInput):
    """`coder resume`: the taskfile changed since the run started, and the resume did not
    say which version to go on with; `differences` say what changed ("step s2 changed")."""

    def __init__(self, message: str, task_id: str, differences: tuple[str, ...]) -> None:
        super().__init__(
            message,
            hint=f"take the new version for the steps not yet done: `coder resume -t {task_id} "
            f"--taskfile`; or go on with the run's own copy: `coder resume -t {task_id} "
            "--ignore-edits`",
        )
        self.differences = differences


class PolicyViolation(InvalidInput):
    """A command, path or setting refused by policy; the message names the thing and the fix."""


class DocumentError(InvalidInput):
    """The file could not be read as a document; `problems` say where and why (at least one,
    e.g. every duplicate key)."""

    def __init__(self, problem: Problem, *more: Problem) -> None:
        also = f" (and {counted(len(more), 'more problem')})" if more else ""
        super().__init__(f"{problem}{also}")
        self.problems = [problem, *more]

    @property
    def problem(self) -> Problem:
        return self.problems[0]


class InvalidTaskfile(InvalidInput):
    def __init__(self, problems: list[Problem]) -> None:
        first = problems[0]
        more = f" (and {counted(len(problems) - 1, 'more problem')})" if len(problems) > 1 else ""
        super().__init__(f"{first}{more}", hint="run `coder validate -f FILE` to see every problem")
        self.problems = problems


class UnknownTask(InvalidInput):
    def __init__(self, task_id: str, known: list[str]) -> None:
        listing = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
        super().__init__(
            f"no task {task_id!r} in this project",
            hint=f"known tasks: {listing}" if known else "run `coder status` to list tasks",
        )
        self.task_id = task_id


class MergedRun(InvalidInput):
    """The run already landed on its base branch: undoing its branch would not undo that."""


class BadSpec(InvalidInput):
    """The spec is missing, empty, unreadable or too large."""


class PatchProblem(InvalidInput):
    """The patch text cannot be understood or does not match the files."""


# --- the environment (3) --------------------------------------------------------------------


class EnvironmentProblem(CoderError):
    exit_code = EXIT_ENVIRONMENT

    @property
    def stopped_with(self) -> str:
        """What stopped a run, with the fix when there is one ("run `ollama pull M`"): a run's
        error is all a user sees of it in the summary, `coder show` and `--json`."""
        return f"{self.message}; {self.hint}" if self.hint else self.message


class ConcurrentRun(EnvironmentProblem):
    """`holder` names the command holding the task lock: run (also resume), merge, revert."""

    def __init__(self, message: str, hint: str | None = None, *, holder: str = "run") -> None:
        super().__init__(message, hint)
        self.holder = holder


class RunFilesGone(EnvironmentProblem):
    """A running run's own files (its checkpoint, manifest or worktree) were deleted under it:
    it stops, and writes nothing back of what was deleted."""


class ObjectsMissing(EnvironmentProblem):
    """Git objects coder needs are gone from the repository (`oids`): pruned under it, as a
    `git gc --prune=now` can (coder.git.objects), or deleted by hand."""

    def __init__(self, message: str, hint: str | None = None, *, oids: Iterable[str] = ()):
        super().__init__(message, hint)
        self.oids = frozenset(oids)


class CorruptState(EnvironmentProblem):
    """A run's file that cannot be read back (torn, edited, wrong schema): its checkpoint
    (which resume rebuilds from the branch's commits) or its manifest (which it cannot)."""

    def __init__(self, path: Path, task_id: str, reason: str, *, manifest: bool = False) -> None:
        if manifest:
            super().__init__(
                f"run file {display_path(path)} is corrupt ({reason}); it holds run "
                f"{task_id}'s task, so the run cannot go on without it",
                hint=f"restore the file, or remove the run with `coder clean -t {task_id}` "
                "(its branch is kept)",
            )
        else:
            super().__init__(
                f"state file {display_path(path)} is corrupt ({reason}); run "
                f"`coder resume -t {task_id}` to rebuild it from the branch's commits",
                hint=f"or delete {display_path(path)} and start the task again",
            )
        self.path = path
        self.task_id = task_id
        self.reason = reason


class ManifestGone(CorruptState):
    """A run's checkpoint is left but not its manifest (deleted by hand): the checkpoint
    holds its progress only, so the run is found again from its taskfile and its branch."""

    def __init__(self, path: Path, task_id: str) -> None:
        EnvironmentProblem.__init__(
            self,
            f"run {task_id} has a state file but its manifest {display_path(path)} is gone "
            "(deleted?)",
            hint=f"rebuild it with `coder resume -t {task_id} -f TASKFILE` (the taskfile the "
            f"run started from) from the commits on its branch, or remove the run with "
            f"`coder clean -t {task_id}`",
        )
        self.path = path
        self.task_id = task_id
        self.reason = "its manifest is gone"


class BranchMoved(EnvironmentProblem):
    """The agent branch is not where coder left it (someone committed or reset it)."""


class RemoteBranchMoved(EnvironmentProblem):
    """`coder push`: the branch on the remote is not where coder last pushed it (or exists
    though coder never pushed it); nothing was overwritten."""


class ModelUnavailable(EnvironmentProblem):
    """The model host cannot be reached, or it does not have the model."""


class HostUnreachable(ModelUnavailable):
    """Nothing answers at the model server's address (refused, no route, DNS); with several
    endpoints, the router takes this one out and goes on at another."""

    def __init__(self, message: str, hint: str | None = None, *, endpoint: str = "") -> None:
        super().__init__(message, hint)
        self.endpoint = endpoint


class ModelMissing(ModelUnavailable):
    """The server answers but does not serve the model; the hint says how to get it."""


class ModelStalled(ModelUnavailable):
    """Every attempt of a request timed out (`request_timeout`): the server accepts
    connections and does not answer (hung, overloaded, loading forever). Not the step's doing:
    the run stops as `error`, and resumes once the server answers again."""


class MergeConflict(EnvironmentProblem):
    """The base branch moved since the run started and changed the same lines."""


class CheckoutInTheWay(EnvironmentProblem):
    """The user's uncommitted changes in the checkout of base touch files the merge changes."""


class RunNotStarted(EnvironmentProblem):
    """`coder run` exited before creating the run; the message is its own error line."""


# --- interrupted (130) ------------------------------------------------------------------------


class Interrupted(CoderError):
    """Ctrl-C, SIGTERM or a hang-up ended a command (`coder merge`) part-way; the message says
    what it had done and the hint how to finish."""

    exit_code = EXIT_INTERRUPTED


# --- the work did not succeed (1) -----------------------------------------------------------


class RunFailed(CoderError):
    exit_code = EXIT_FAILED


class ModelError(RunFailed):
    """The model call failed (after retries, or refused outright): the step fails cleanly."""


class PlanFailed(RunFailed):
    """The model did not produce a valid taskfile within the allowed attempts."""

    def __init__(
        self, problems: list[Problem], attempts: int, draft: Path | None, draft_text: str
    ) -> None:
        where = f"; the last draft is in {draft}" if draft else ""
        super().__init__(
            f"the model did not produce a valid taskfile in {attempts} attempt"
            f"{'s' * (attempts != 1)} ({len(problems)} problem{'s' * (len(problems) != 1)} "
            f"left){where}",
            hint="rephrase or narrow the spec, try a larger model (--model), raise plan_attempts"
            " in coder.config.json"
            + (
                f", or fix the draft by hand and check it with `coder validate -f {draft}`"
                if draft
                else ""
            ),
        )
        self.problems = problems
        self.attempts = attempts
        self.draft = draft
        self.draft_text = draft_text


def display_path(path: Path) -> str:
    """`.coder/state/X.json` when under the working directory, else the absolute path."""
    from pathlib import Path

    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


# --- flow control between modules (never shown to the user) ----------------------------------


class StopReply(Exception):  # noqa: N818
    """Raised by a chat's `on_event` callback to cut the reply off: the provider closes the
    stream (the server stops generating) and returns what arrived, done_reason "cut"."""


class Transient(Exception):  # noqa: N818
    """A model-call failure worth retrying that a provider noticed itself (a stream that ended
    early, ...); its message is the reason."""


class Abandoned(Exception):  # noqa: N818
    """A model request given up by the bound it ran in (coder.models.bounds): `stopped` when
    the run was asked to stop, else the step's time ran out. Its connection was closed, so
    the server stopped working on it."""

    def __init__(self, *, stopped: bool) -> None:
        super().__init__("the run was asked to stop" if stopped else "the step's time ran out")
        self.stopped = stopped


# --- OSErrors of coder's own (callers that catch OSError see them as one) ------------------


class LinkInTheWay(OSError):
    """`coder.files.nofollow` met a symlink (or a file) where a path needs a directory; callers say
    what it means for them (the file tools refuse, the merge stops)."""

    def __init__(self, root: Path | str, rel: str) -> None:
        import os

        super().__init__(40, f"{rel} is a symbolic link or not a directory", str(root))  # ELOOP
        self.rel = rel
        try:  # now: a clean-up may remove the link before the message is shown
            self.target: str | None = os.readlink(os.path.join(root, rel))
        except OSError:
            self.target = None

    def problem(self) -> EnvironmentProblem:
        """What it is when it reaches the user: met under `.coder/` (the callers that write
        elsewhere say what it means for them first)."""
        import os

        path = os.path.join(self.filename, self.rel)
        if ".coder" in path.split(os.sep):  # coder.files.nofollow.CODER_DIR (which imports this)
            return not_ours(path, self.target)
        return EnvironmentProblem(
            f"{path} is a symbolic link or not a directory: coder does not follow it",
            hint="move it out of the way, then run the command again",
        )


def not_ours(path: Path | str, target: str | None = None) -> EnvironmentProblem:
    """A link (`target`: what it points to, else read here) or a file at `.coder`, or where
    coder keeps its files under it: refused, never followed."""
    import os

    if target is None:
        try:
            target = os.readlink(path)
        except OSError:
            pass
    what = "not a directory" if target is None else f"a symbolic link (to {target})"
    fix = f"move {path} out of the way" if target is None else f"remove the link (`rm {path}`)"
    return EnvironmentProblem(
        f"{path} is {what}: coder keeps its state, logs and worktrees in real directories "
        "under .coder/ and never follows a link there",
        hint=f"{fix}, then run the command again",
    )


class NotRegular(OSError):
    """coder.files.safeio: the path is not a regular file; `kind` says what it is ("a named pipe
    (FIFO)"), and nothing was read (or, for a device, opened)."""

    def __init__(self, path: Path | str, kind: str) -> None:
        import errno

        super().__init__(errno.EINVAL, f"{kind}, not a regular file", str(path))
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.filename} is {self.kind}, not a regular file"
