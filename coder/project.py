"""The repository as coder keeps it: `.coder/` at its main checkout's root (runs, state, logs,
worktrees, locks and the code index cache live there; `coder init` prepares it, and a run
creates it when it is missing) and the taskfiles in `tasks/`, found by their id.

Below run/ and agent/, which both need it (the agent session puts its code index under
`.coder/cache`); `coder init` itself is coder.services.initialize."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from coder import config as config_mod
from coder.errors import DocumentError, EnvironmentProblem, InvalidInput, LinkInTheWay, not_ours
from coder.files import nofollow

CODER_DIR = nofollow.CODER_DIR
TASKS_DIR = "tasks"  # the repository's taskfiles (`coder plan` writes there)
SUBDIRS = ("tasks", "state", "logs", "artifacts", "worktrees", "locks")


def coder_dir(root: Path) -> Path:
    """`.coder/` at the repository root; EnvironmentProblem if a link (say, one committed or
    planted by a command: coder would write its state through it) or a file stands where it
    belongs. What is under it is reached without following a link (coder.files.nofollow)."""
    path = root / CODER_DIR
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(mode):
        raise not_ours(path)
    if not stat.S_ISDIR(mode):
        raise EnvironmentProblem(
            f"{path} is a file, but coder keeps its runs, logs and worktrees in a {CODER_DIR}/ "
            "directory there",
            hint=f"move that file out of the way (`git mv {CODER_DIR} NEW_NAME` if it is "
            "committed), then run the command again",
        )
    return path


def main_root(cwd: Path) -> Path:
    """The root of the repository's main checkout. A `.git` directory at or above `cwd` is
    one, found without loading libgit2 (a third of `coder status`'s time); from a linked
    worktree (a `.git` file), or outside any repository, libgit2 answers (and names the
    problem)."""
    found = config_mod.find_project_root(cwd)
    if found is not None and (found / ".git").is_dir():
        return found
    from coder.git import repository

    return repository.repo_root(repository.open_repo(cwd))


def ensure_coder_dir(root: Path) -> Path:
    """`.coder/` and its folders, readable by their owner only (0700): it holds logs and
    transcripts of what commands printed. Made before any command runs in the checkout, so the
    sandbox keeps it read-only to them (coder.policy.writes.kept_readonly). Made and chmodded
    through descriptors that never follow a link: a link at `.coder` or at one of its folders
    is refused (EnvironmentProblem), nothing written."""
    base = coder_dir(root)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
        with nofollow.open_dir(base) as fd:
            os.fchmod(fd, 0o700)
            for sub in SUBDIRS:
                with nofollow.open_dir(base, sub, create=True, mode=0o700):
                    pass
    except LinkInTheWay as exc:
        raise exc.problem() from None
    return base


def find_taskfile(root: Path, task_id: str) -> Path:
    """The taskfile in `tasks/` whose `id` is `task_id`, or whose id alone starts with it (a
    file without an `id` matches by its name, `tasks/ID.yaml`). Drafts that `coder plan` left
    (`*.draft.yaml`) are not taskfiles; files that do not parse are passed over."""
    from coder import yamldoc

    folder = root / TASKS_DIR
    files = sorted(
        p
        for p in (folder.iterdir() if folder.is_dir() else ())
        if p.suffix in (".yaml", ".yml") and ".draft." not in p.name and p.is_file()
    )
    ids: dict[Path, str] = {}
    for path in files:
        try:
            data = yamldoc.load(path).data
        except DocumentError:
            continue
        declared = data.get("id") if isinstance(data, dict) else None
        ids[path] = str(declared) if declared is not None else path.stem
    matches = [path for path, found in ids.items() if found == task_id]
    if not matches:  # the start of one id will do, as for a run's -t
        starting = {found for found in ids.values() if found.startswith(task_id)}
        matches = [path for path, found in ids.items() if starting == {found}]
    if len(matches) == 1:
        return matches[0]
    if matches:
        names = ", ".join(str(p.relative_to(root)) for p in matches)
        raise InvalidInput(
            f"several taskfiles in {TASKS_DIR}/ have the id {task_id!r}: {names}",
            hint="give each a unique id, or pass one with -f FILE",
        )
    known = ", ".join(sorted(ids.values())) or "none"
    raise InvalidInput(
        f"no taskfile in {folder} has the id {task_id!r} (ids there: {known})",
        hint="pass the taskfile with -f FILE",
    )
