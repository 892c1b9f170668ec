"""Where a plan is written: its task id (unused anywhere), the taskfile and the draft kept
beside it, written atomically."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from coder import taskfile
from coder.files.durable import write_atomic
from coder.plan.overview import ProjectContext

TASKS_DIR = "tasks"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def choose_id(proposed: Any, title: Any, ctx: ProjectContext, out: Path | None) -> str:
    """The model's id if it is valid and unused; else a slug of the title plus the date."""
    if isinstance(proposed, str) and _ID.match(proposed) and not id_in_use(proposed, ctx, out):
        return proposed
    stem = (
        f"{taskfile.slugify(title if isinstance(title, str) else 'plan', 40)}-"
        f"{time.strftime('%Y%m%d')}"
    )
    for n in range(1, 100):
        candidate = stem if n == 1 else f"{stem}-{n}"
        if not id_in_use(candidate, ctx, out):
            return candidate
    return taskfile.generate_id()


def id_in_use(task_id: str, ctx: ProjectContext, out: Path | None) -> bool:
    """Taken by a taskfile in tasks/, a run (manifest or state) or an agent branch."""
    tasks = ctx.root / TASKS_DIR
    coder_dir = ctx.root / ".coder"
    if out is None and (tasks / f"{task_id}.yaml").exists():
        return True
    if (coder_dir / "tasks" / f"{task_id}.json").exists() or (
        coder_dir / "state" / f"{task_id}.json"
    ).exists():
        return True
    if any(b == f"agent/{task_id}" or b.startswith(f"agent/{task_id}-") for b in ctx.branches):
        return True
    declared = re.compile(rf"^id:\s*['\"]?{re.escape(task_id)}['\"]?\s*(#.*)?$", re.MULTILINE)
    for path in list(tasks.glob("*.yaml")) + list(tasks.glob("*.yml")):
        try:
            if declared.search(path.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def target_for(task_id: str, ctx: ProjectContext, out: Path | None) -> Path:
    return out if out is not None else ctx.root / TASKS_DIR / f"{task_id}.yaml"


def draft_path(target: Path) -> Path:
    """`tasks/x.yaml` -> `tasks/x.draft.yaml`, beside the target."""
    stem = target.name[: -len(target.suffix)] if target.suffix else target.name
    return target.with_name(f"{stem}.draft.yaml")


def shown(path: Path, cwd: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


def write_text(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a crash never leaves half a taskfile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"), new_mode=0o644, crash_point=None)
