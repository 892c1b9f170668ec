"""A run's settings, decided once: `resolve(task, config, options)` at the start and at each
resume gives the `RunSettings` the executor, the steps and the tools go by.

Which one wins, the one rule for every setting: the command line (`RunOptions`), else the
taskfile's `policies` (coder.taskfile.policies), else the config (coder.config). A taskfile
can narrow what commands may do, never widen it (coder.run.preflight.policy_for). Nothing
after this reads a setting from two places or parses one again.

Adding a per-run setting: one field of `coder.config.PerRun` (its type, default and
option; `RunSettings` and the config are `PerRun`s), a taskfile policy of the same name, and
their two schemas: `resolve` decides every `PerRun` field alike. A setting that combines its
sources otherwise is its field in `RunSettings` and its line in `resolve`. docs/developing.md
says where else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from coder.config import PerRun
from coder.run.approvals import mode_of
from coder.run.preflight import policy_for

if TYPE_CHECKING:
    from coder.config import Config
    from coder.policy.commands import Policy
    from coder.run.approvals import Mode
    from coder.taskfile import Task
    from coder.taskfile.policies import Policies


@dataclass(frozen=True, kw_only=True)
class Chosen:
    """What the command line chose of a run's settings (`coder run`, `coder resume`; None:
    nothing, the taskfile's or the config's applies). coder.run.drive.RunOptions is one, with
    the rest a run is given: a new option is a field here, not copied there."""

    max_parallel: int | None = None
    fail_fast: bool = False
    approvals: str | None = None  # --approvals (--autonomous is "none")
    default_approvals: Mode = "none"  # the command's own: `coder run` per-step
    per_run: Mapping[str, Any] = field(default_factory=dict)  # PerRun's flags given, by name


@dataclass(frozen=True, kw_only=True)
class RunSettings(PerRun):
    """The run's settings: its `PerRun` fields, each the first of the command line, the
    taskfile and the config that sets it, and those below, combined by `resolve` otherwise."""

    config: Config
    policies: Policies  # the taskfile's, for what only a taskfile sets
    policy: Policy  # what the run's commands may do
    approvals: Mode  # per-step, per-edit or none (coder.run.approvals)
    max_parallel: int  # steps of a level at once; 0 until `serving` decides it by the server
    fail_fast: bool  # a failed step stops the run, even where on_fail says skip
    max_step_tokens: int | None  # model tokens per step; None: no limit
    model_timeout: int  # seconds of a model step that sets no `timeout` of its own
    command_timeout: int  # seconds of a step's command when the step sets no `timeout`


def resolve(task: Task, config: Config, options: Chosen) -> RunSettings:
    """The settings of a run of `task` (InvalidInput for an approvals mode that is none)."""
    policies = task.policies
    policy = policy_for(task, config)
    return RunSettings(
        **per_run(options, policies, config),
        config=config,
        policies=policies,
        policy=policy,
        approvals=mode_of(options.approvals, policies.approvals, options.default_approvals),
        max_parallel=options.max_parallel or policies.max_parallel or config.max_parallel or 0,
        fail_fast=options.fail_fast,
        # a policy is never 0 (the schema's minimum is 1): `or` falls back only when unset
        max_step_tokens=policies.max_tokens or config.max_step_tokens,
        model_timeout=policies.timeout or config.step_timeout,
        command_timeout=policies.timeout or policy.command_timeout,
    )


def per_run(options: Chosen, policies: Policies, config: Config) -> dict[str, Any]:
    """Each `PerRun` setting: the command line's, else the taskfile's, else the config's (a
    value is set when it is not None)."""
    return {
        name: next(
            (v for v in (options.per_run.get(name), getattr(policies, name)) if v is not None),
            getattr(config, name),
        )
        for name in (f.name for f in fields(PerRun))
    }


def serving(settings: RunSettings, slots: int | None) -> RunSettings:
    """`settings` with `max_parallel` decided by the model server where neither the command
    line, the taskfile nor the config decided it: as many steps of a level at once as the
    server serves (`slots`, over its endpoints: coder.models.slots), one for a task without
    model steps (no server)."""
    if settings.max_parallel:
        return settings
    return replace(settings, max_parallel=slots or 1)


def budget_exhausted(settings: RunSettings, tokens: int, seconds: float) -> str | None:
    """Why the run-wide budgets (taskfile policies, else config) stop the run after `tokens`
    and `seconds` of step time; None while they do not. Checked between steps."""
    max_tokens, timeout = settings.run_max_tokens, settings.run_timeout
    if max_tokens is not None and tokens >= max_tokens:
        return f"run token budget exhausted ({tokens} of {max_tokens} tokens)"
    if timeout is not None and seconds >= timeout:
        return f"run time budget exhausted ({seconds:.0f}s of {timeout}s)"
    return None
