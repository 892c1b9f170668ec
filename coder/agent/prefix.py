"""The run's cache-stable prefix, and the per-step focus that goes after it.

The prefix is built once per run from the base commit: the rules, the project's instructions
(AGENTS.md ...), the ranked repository map and the taskfile. The map is personalised toward
the WHOLE task (its title, spec, every step's goal and `changes`), not toward one step: a map
per step would change the prefix between steps and throw away the server's KV cache each time,
and a task's steps are about the same part of the code anyway. What is specific to one step
goes after the prefix, in its first message: `step_focus`, the code_search hits for its goal
and the files its `changes` name. So the prefix stays byte-identical for every step of a run
(bench/prompt_cache.py checks it) and each step still starts pointed at its own code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.agent import prompts
from coder.context import instructions, repomap, retrieval
from coder.git import trees
from coder.redact import Redactor, is_env_path
from coder.taskfile.kinds import KINDS
from coder.tools.envfiles import SCAN_DEPTH
from coder.tools.registry import tools_for_kind

if TYPE_CHECKING:
    from coder.config import Config
    from coder.git.repository import Repo
    from coder.taskfile import Step
    from coder.tools.registry import Registry

FOCUS_HITS = 5


@dataclass(frozen=True)
class Prefix:
    system: str
    map_files: int
    map_tokens: int
    map_seconds: float
    map_cached: bool
    instruction_files: tuple[str, ...]


def build(
    repo: Repo,
    base_commit: str,
    task: Mapping[str, Any],
    cfg: Config,
    *,
    num_ctx: int | None,
    cache_dir: Path | None,
    redactor: Redactor,
    kinds: Mapping[str, Sequence[str]] | None = None,
) -> Prefix:
    """The system prompt every request of the run starts with (see the module docstring),
    redacted by the run's `redactor`, which learns the values of the commit's `.env*` files
    first. `kinds`: the task's model step kinds and their tools (`model_kinds`)."""
    focus = repomap.Focus.of_task(task)
    register_env_files(repo, base_commit, redactor)
    found = instructions.read(
        repo,
        base_commit,
        names=tuple(cfg.instruction_files or instructions.DEFAULT_FILES),
        max_chars=int(cfg.instructions_max_chars or instructions.DEFAULT_MAX_CHARS),
        prefer=sorted(focus.files),
        redact=redactor.redact,
    )
    budget = cfg.repo_map_tokens
    budget = repomap.default_budget(num_ctx) if budget is None else int(budget)
    repo_map = repomap.build(
        repo, base_commit, budget=budget, focus=focus, cache_dir=cache_dir, redactor=redactor
    )
    system = prompts.system_prompt(
        repo_map=repo_map.text,
        files=repo_map.files,
        instructions=found.render(),
        task=task,
        kinds=kinds,
    )
    system = redactor.redact(system)
    return Prefix(
        system,
        repo_map.files,
        repo_map.tokens,
        repo_map.seconds,
        repo_map.cached,
        tuple(i.path for i in found.files),
    )


def model_kinds(steps: Iterable[Step], registry: Registry) -> dict[str, list[str]]:
    """The kinds of a task's `steps` (in order) that talk to a model, with the tools they may
    call: a model step's kind its own, a kind with fix cycles (a step with `on_fail:
    fix_and_retry`) the edit tools. What the prefix says about kinds (prompts.kinds_section)."""
    kinds: dict[str, list[str]] = {}
    for step in steps:
        if step.kind in kinds:
            continue
        if KINDS[step.kind].uses_model:
            kinds[step.kind] = tools_for_kind(step.kind, registry)
        elif step.uses_model:  # its fix cycles (coder.run.steps.fix)
            kinds[step.kind] = tools_for_kind("edit", registry)
    return kinds


def register_env_files(repo: Repo, commit: str, redactor: Redactor) -> None:
    """The values of the commit's `.env*` files (at the root and one level down, as the tools
    register them in a worktree) join `redactor`'s known secrets."""
    for path, blob in trees.tree_blobs(repo, trees.tree_id(repo, commit)):
        if is_env_path(path, SCAN_DEPTH):
            text = trees.blob_data(repo, blob).decode("utf-8", errors="replace")
            redactor.add_env_file(text)


def step_focus(
    root: Path, goal: str, changes: list[str], *, redactor: Redactor, cache_dir: Path | None = None
) -> list[str]:
    """Where a step's work likely is, as lines for its first message: the code_search hits
    for its goal, one line per file (`path: lines (definition), ...`, in line order), the files
    its `changes` name first (the message names those as expected to change already)."""
    spans: dict[str, list[tuple[int, str]]] = {path: [] for path in changes}
    if goal.strip() and retrieval.tokenize(goal):
        try:
            hits = retrieval.search(
                root, goal, k=FOCUS_HITS, cache_dir=cache_dir, redactor=redactor
            )
        except Exception:  # noqa: BLE001 - a hint only: a broken index must not stop a step
            hits = []
        for hit in hits:
            c = hit.chunk
            lines = str(c.start) if c.start == c.end else f"{c.start}-{c.end}"
            spans.setdefault(c.path, []).append(
                (c.start, lines + (f" ({c.name})" if c.name else ""))
            )
    return [
        f"{path}: {', '.join(s for _, s in sorted(found))}"
        for path, found in spans.items()
        if found
    ]
