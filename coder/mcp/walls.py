"""The walls around the calls of `coder mcp serve`, as around a run's step.

A run's commands work in a worktree of their own, where the sandbox keeps the repository's
`.git` read-only; the server's commands (shell_run, tests_run, the linters the file tools run)
work in the user's checkout itself, `.git` included. So around every call of a tool that can
change something (one not marked read-only), task control aside:

* the git guard (`coder.git.guard.GitGuard.take_checkout`): what the call changed in `.git`
  (config, hooks, refs, HEAD, the index, ...) is put back, and the call becomes a tool error
  naming it, with the tool's own output after it. Where the machine has the read-only mount
  wall, the sandbox also keeps `.git` and `.coder` read-only to the commands
  (`coder.policy.sandbox.kept_readonly`), and the guard finds nothing;
* leftovers: whatever a command left running in the server's sandbox (`setsid`, a daemon) is
  ended after the call, as after a run's step (`coder.policy.confine.end_leftovers`).

These calls run one at a time (ending leftovers ends every process in the sandbox, and a guard
must not put back another call's work half-way); read-only tools run beside them. Task control
(task_run, task_stop) takes the same turn but no guard: it starts and stops coder's own runner,
which owns its branches and worktrees (the guard never watches those) and writes
`.git/info/exclude`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from coder.errors import EnvironmentProblem
from coder.git import repository
from coder.git.guard import GitGuard
from coder.policy.confine import end_leftovers
from coder.tools.base import ToolContext, ToolResult
from coder.tools.registry import Registry

_HINT = (
    "commands run by `coder mcp serve` cannot change the repository's .git (config, hooks, "
    "refs, HEAD, the index): commit, stage, tag and configure git yourself. A commit or ref "
    "move of yours made elsewhere while the call ran was put back too: `git reflog` finds it"
)


class Walls:
    """Runs the server's tool calls inside the walls of the module docstring."""

    def __init__(self, registry: Registry, ctx: ToolContext, unguarded: Iterable[str]) -> None:
        self.registry, self.ctx = registry, ctx
        self.unguarded = frozenset(unguarded)
        self._turn = threading.Lock()
        self._take = _guard_for(Path(ctx.root))

    def call(self, name: str, arguments: Any) -> ToolResult:
        tool = self.registry.get(name)
        if tool is None or tool.read_only:
            return self.registry.call(name, arguments, self.ctx)
        with self._turn:
            if name in self.unguarded:
                return self.registry.call(name, arguments, self.ctx)
            return self._guarded(name, arguments)

    def _guarded(self, name: str, arguments: Any) -> ToolResult:
        try:
            guard = self._take()
        except OSError as exc:  # fail closed: nothing runs unwatched
            return ToolResult.error(
                f"cannot watch the repository's .git before running {name}: {exc}; nothing was run",
                hint="check that the repository's .git is a readable directory",
            )
        try:
            result = self.registry.call(name, arguments, self.ctx)
        finally:
            problems = self._after(guard)
        if not problems:
            return result
        return ToolResult.error(
            "\n".join([*problems, "", f"{name} said: {result.as_text()}"]),
            hint=_HINT,
            data={**result.data, "walls": problems},
        )

    def _after(self, guard: GitGuard | None) -> list[str]:
        """End what the call left running, then put `.git` back: the problems found."""
        problems = []
        try:
            end_leftovers(Path(self.ctx.root))
        except EnvironmentProblem as exc:
            problems.append(exc.message)
        if guard is None:
            return problems
        try:
            touched = guard.restore()
            problems += guard.drop_stashes()
        except EnvironmentProblem as exc:
            return [*problems, exc.message]
        except OSError as exc:
            return [*problems, f"cannot put back the repository's .git as it was: {exc}"]
        finally:
            guard.close()
        if touched:
            names = ", ".join(guard.describe(touched))
            problems.insert(0, f"the command changed {names}; it was put back as it was")
        return problems


def _guard_for(root: Path) -> Callable[[], GitGuard | None]:
    """How to take the guard of a call in `root`: the checkout's, when `root` is (in) the main
    checkout; a run's, when it is (in) a linked worktree; none outside git."""
    try:
        repo = repository.open_repo(root)
    except EnvironmentProblem:
        return lambda: None
    common, workdir = repository.common_dir(repo), repository.checkout_root(repo)
    if workdir is None:
        return lambda: None
    if repository.is_main_checkout(repo):
        return lambda: GitGuard.take_checkout(Path(workdir))
    return lambda: GitGuard.take(common, Path(workdir))
