"""A repository prepared for coder: `.coder/` (excluded from git) and `coder.config.json`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from coder import config as config_mod
from coder.durable import write_atomic, write_failed
from coder.errors import EnvironmentProblem

CODER_DIR = ".coder"
TASKS_DIR = "tasks"  # the repository's taskfiles (`coder plan` writes there)
SUBDIRS = ("tasks", "state", "logs", "artifacts", "worktrees", "locks")


def coder_dir(root: Path) -> Path:
    """`.coder/` at the repository root; EnvironmentProblem if a file (say, one committed)
    stands where it belongs."""
    path = root / CODER_DIR
    if os.path.lexists(path) and not path.is_dir():
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


@dataclass
class InitResult:
    root: Path
    config_path: Path
    config_written: bool
    excluded: bool  # True when .git/info/exclude was changed
    config: dict[str, object] = field(default_factory=dict)


def init(cwd: Path, *, force: bool = False) -> InitResult:
    """Create `.coder/` and a `coder.config.json` holding what was detected about this
    project (its test command), and nothing else: defaults stay defaults, so your user config
    (`~/.config/coder/config.json`: the model, the server) keeps applying. Idempotent: an
    existing config is kept unless `force`."""
    from coder.git import repository

    repo = repository.open_repo(cwd)
    root = repository.repo_root(repo)
    ensure_coder_dir(root)
    excluded = repository.ensure_excluded(repo, f"/{CODER_DIR}/")
    path = root / config_mod.PROJECT_FILE
    detected = detected_config(root)
    written = force or not path.exists()
    if written:  # all or nothing: a full disk leaves no empty config behind
        data = (json.dumps(detected, indent=2) + "\n").encode("utf-8")
        try:
            write_atomic(path, data, new_mode=0o644, crash_point=None)
        except OSError as exc:
            raise write_failed(path, exc) from exc
    return InitResult(root, path, written, excluded, detected)


def ensure_coder_dir(root: Path) -> Path:
    """`.coder/` and its folders, readable by their owner only (0700): it holds logs and
    transcripts of what commands printed."""
    base = coder_dir(root)
    base.mkdir(mode=0o700, exist_ok=True)
    base.chmod(0o700)
    for sub in SUBDIRS:
        (base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def detected_config(root: Path) -> dict[str, object]:
    """The settings detected from the project's files (none when nothing was found)."""
    test_command = config_mod.detect_test_command(root)
    return {} if test_command is None else {"test_command": test_command}


# --------------------------------------------------------------------------------------------
# The example taskfiles (`tasks/` of coder's source, shipped in the wheel as `coder/_examples`)


def examples_dir() -> Path:
    package = Path(__file__).parent.parent  # coder/
    packaged = package / "_examples"
    return packaged if packaged.is_dir() else package.resolve().parent / TASKS_DIR


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def write_example(root: Path, name: str, *, force: bool = False) -> Path:
    """Copy the example taskfile `name` into the repository's `tasks/`; InvalidInput naming
    the examples for an unknown one, or when the file exists (unless `force`)."""
    from coder.errors import InvalidInput

    source = examples_dir() / f"{name.removesuffix('.yaml')}.yaml"
    if not source.is_file():
        raise InvalidInput(
            f"no example named {name!r}", hint=f"choose one of: {', '.join(example_names())}"
        )
    target = root / TASKS_DIR / source.name
    if target.exists() and not force:
        raise InvalidInput(
            f"{target} exists; nothing was written", hint="pass --force to overwrite it"
        )
    target.parent.mkdir(exist_ok=True)
    write_atomic(target, source.read_bytes(), new_mode=0o644, crash_point=None)
    return target


def find_taskfile(root: Path, task_id: str) -> Path:
    """The taskfile in `tasks/` whose `id` is `task_id` (a file without an `id` matches by its
    name, `tasks/ID.yaml`). Drafts that `coder plan` left (`*.draft.yaml`) are not taskfiles;
    files that do not parse are passed over."""
    from coder import yamldoc
    from coder.errors import DocumentError, InvalidInput

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
