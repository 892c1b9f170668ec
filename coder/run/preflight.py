"""Preflight: the commands a task's steps would run, checked before anything is created.

`refusals` is the one check: `coder run` refuses a task that has any (changing nothing), and
`coder plan` (and `coder validate`) report them against the taskfile, each at its step. Which
command a step runs is its kind's business (`coder.taskfile.kinds.Kind.command`): a shell step its
`cmd`, a test step the test command (its `cmd`, else its `framework`, else the config's, else
detected), a lint step its linters.
Each command is checked as the sandbox will run it: programs resolved against the checkout
(the worktree holds the same files), in the step's `cwd`, with the scrubbed PATH.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coder.errors import CoderError, InvalidInput, PolicyViolation
from coder.policy.env import env_refusal, scrub_env
from coder.taskfile.kinds import KINDS

if TYPE_CHECKING:
    from coder.config import Config
    from coder.policy.commands import Policy
    from coder.taskfile import Step, Task


@dataclass(frozen=True)
class Refusal:
    step_id: str
    field: str | None  # "cmd" when the step names its command; None: the step as a whole
    message: str
    hint: str | None = None
    refused: bool = True  # the policy refused the command; False: no command is known
    key: str | None = None  # the key of `field` refused (a variable of `env`)

    def __str__(self) -> str:
        return f"step {self.step_id}: {self.message}"


def command_of(step: Step, root: Path, config: Config) -> str | None:
    """The command a step runs (None for a kind that runs none), as its kind finds it
    (`coder.taskfile.kinds.Kind.command`); InvalidInput when a test step has no test command to run,
    or a lint step no linter."""
    command = KINDS[step.kind].command
    return None if command is None else command.find(step, root, config)


def refusals(steps: Iterable[Step], *, root: Path, policy: Policy, config: Config) -> list[Refusal]:
    """Every step whose command the policy refuses, that has no command to run, or whose
    `env:` sets a variable that runs code (`coder.policy.env.runs_code`)."""
    from coder.policy.commands import check_command

    found = []
    base_path = scrub_env(policy.env_passthrough).get("PATH")  # once: a step's env only adds to it
    for index, step in enumerate(steps):
        refused_env = env_refusals([step])
        found += refused_env
        if refused_env:
            continue
        field = "cmd" if step.cmd else None
        command = KINDS[step.kind].command
        detects = command is not None and command.later(step, config)
        try:
            try:
                cmd = command_of(step, root, config)
            except InvalidInput:
                if detects and index > 0:  # the steps before it may write the tests: they
                    continue  # are looked for when it runs (it fails there if none are found)
                raise
            path = step.env.get("PATH", base_path)  # a step's env may set PATH
            if cmd is not None:
                check_command(cmd, policy, root=root, cwd=root / (step.cwd or "."), path=path)
        except CoderError as exc:
            refused = isinstance(exc, PolicyViolation)
            hint = exc.hint
            if refused and getattr(config, "untrusted", None):
                # the fix the policy suggests may already be in the file, waiting for trust
                note = f"this repository's {', '.join(config.untrusted)} apply after `coder trust`"
                hint = f"{hint}; {note}" if hint else note
            found.append(Refusal(step.id, field, exc.message, hint, refused))
    return found


def env_refusals(steps: Iterable[Step]) -> list[Refusal]:
    """Each variable of a step's `env:` that makes a program run code (`runs_code`): refused
    wherever the step would run, so checked without a repository too."""
    found = []
    for step in steps:
        for name in step.env:
            exc = env_refusal(name)
            if exc is not None:
                found.append(Refusal(step.id, "env", exc.message, exc.hint, key=name))
    return found


def policy_for(task: Task, cfg: Config) -> Policy:
    """The run's policy: the config's, narrowed by the taskfile. A taskfile can turn the
    network off but never on; only coder.config.json widens permissions."""
    from dataclasses import replace

    from coder.policy.commands import Policy

    policy = Policy.from_config(cfg.values)
    if task.policies.allow_network is False:
        policy = replace(policy, allow_network=False)
    return policy
